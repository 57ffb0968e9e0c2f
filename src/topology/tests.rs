use super::*;

fn unique_tmp(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "strata-topo-{tag}-{}-{nanos}.json",
        std::process::id()
    ))
}

#[test]
fn link_class_names_and_serde() {
    assert_eq!(
        LinkClass::ALL.map(|c| c.name()),
        ["intra_package", "intra_node", "inter_node"]
    );
    for (i, c) in LinkClass::ALL.into_iter().enumerate() {
        assert_eq!(c.index(), i);
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            format!("\"{}\"", c.name())
        );
    }
    assert!(LinkClass::IntraPackage < LinkClass::InterNode);
}

#[test]
fn parse_grammar_forms() {
    let t = Topology::parse("nodes:4x8").unwrap();
    assert_eq!(
        (t.nodes, t.packages_per_node, t.dies_per_package),
        (4, 8, 1)
    );
    assert_eq!(
        (t.world_size(), t.ranks_per_node(), t.ranks_per_package()),
        (32, 8, 1)
    );
    assert_eq!(t.name, "nodes:4x8");
    assert_eq!(t, Topology::uniform(4, 8));

    let t = Topology::parse("  NODES:2X4X2 ").unwrap();
    assert_eq!(
        (t.nodes, t.packages_per_node, t.dies_per_package),
        (2, 4, 2)
    );
    assert_eq!(t.name, "nodes:2x4x2");

    let t = Topology::parse("nodes:8x8,switch=4").unwrap();
    assert_eq!(
        t.switch_of_node.as_deref(),
        Some(&[0, 0, 0, 0, 1, 1, 1, 1][..])
    );
    assert_eq!(t.name, "nodes:8x8,switch=4");
    assert_eq!(t.num_switches(), 2);
    let t = Topology::parse("frontier:3, switch=2").unwrap();
    assert_eq!(t.switch_of_node.as_deref(), Some(&[0, 0, 1][..]));
    assert_eq!(
        t.summary(),
        "frontier:3,switch=2 = 3 nodes x 4 packages x 2 dies (24 ranks), 2 leaf switches"
    );
    assert_eq!(Topology::flat(5), Topology::uniform(1, 5));
}

#[test]
fn parse_presets() {
    for (spec, p, d, nics) in [
        ("dgx-a100:2", 8, 1, 8),
        ("dgx-h100:2", 8, 1, 8),
        ("frontier:2", 4, 2, 4),
        ("p3dn:2", 8, 1, 1),
        ("p4d:2", 8, 1, 4),
        ("p5:2", 8, 1, 32),
        ("DGX-A100:2", 8, 1, 8),
    ] {
        let t = Topology::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(
            (t.nodes, t.packages_per_node, t.dies_per_package),
            (2, p, d),
            "{spec}"
        );
        assert_eq!(t.links.nics_per_node, nics, "{spec}");
        assert_eq!(t.name, spec.to_ascii_lowercase());
        t.validate().unwrap();
        // the per-rank inter-node share is the node's NIC bandwidth split over its ranks
        let share = t.links.node_egress_gbs() / t.ranks_per_node() as f64;
        assert!(
            (t.links.inter_node.bandwidth_gbs - share).abs() < 1e-9,
            "{spec}"
        );
        // faster classes are not slower
        assert!(
            t.links.intra_node.bandwidth_gbs > t.links.inter_node.bandwidth_gbs,
            "{spec}"
        );
        assert!(
            t.links.intra_package.bandwidth_gbs >= t.links.intra_node.bandwidth_gbs,
            "{spec}"
        );
    }
}

#[test]
fn parse_errors() {
    for bad in [
        "",
        "   ",
        "nodes",
        "nodes:",
        "nodes:4",
        "nodes:4x",
        "nodes:x8",
        "nodes:0x8",
        "nodes:4x0",
        "nodes:2x2x0",
        "nodes:1x2x3x4",
        "nodes:-1x8",
        "nodes:4x8,switch=0",
        "nodes:4x8,switch=",
        "nodes:4x8,rack=2",
        "frontier",
        "frontier:",
        "frontier:0",
        "frontier:two",
        "tpu:4",
        "dgx-a100:1.5",
        "garbage",
        "nodes:99999999999999999999x8",
        "nodes:18446744073709551615x2",
    ] {
        match Topology::parse(bad) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("accepted forms"), "{bad:?}: {m}")
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
    let m = Topology::parse("tpu:4").unwrap_err().to_string();
    assert!(
        m.contains("unknown preset") && m.contains("frontier:N") && m.contains("nodes:NxPxD"),
        "{m}"
    );
    let m = Topology::parse("missing-file.json").unwrap_err();
    assert!(
        matches!(m, Error::InvalidArgument(ref s) if s.contains("missing-file.json")),
        "{m}"
    );
}

#[test]
fn coord_round_trip() {
    for spec in [
        "frontier:3",
        "nodes:3x8",
        "nodes:2x3x5",
        "nodes:1x1",
        "p3dn:2",
    ] {
        let t = Topology::parse(spec).unwrap();
        for r in 0..t.world_size() {
            let c = t.coord(r);
            assert!(
                c.node < t.nodes && c.package < t.packages_per_node && c.die < t.dies_per_package
            );
            assert_eq!(t.rank_of(c), r, "{spec} {r}");
            assert_eq!(t.node_of(r), c.node);
            assert_eq!(t.local_rank(r), c.package * t.dies_per_package + c.die);
        }
        assert!(t.checked_coord(t.world_size()).is_err());
    }
    let t = Topology::parse("frontier:2").unwrap();
    assert_eq!(
        t.coord(13),
        Coord {
            node: 1,
            package: 2,
            die: 1
        }
    );
    // garbage values do not panic
    let z = Topology::uniform(0, 0);
    let _ = (
        z.coord(5),
        z.node_of(5),
        z.local_rank(5),
        z.link_class(1, 2),
        z.levels(),
        z.summary(),
    );
    assert!(z.validate().is_err());
}

#[test]
fn frontier_link_classes() {
    let t = Topology::parse("frontier:2").unwrap();
    assert_eq!(t.link_class(0, 1), LinkClass::IntraPackage);
    assert_eq!(t.link_class(0, 0), LinkClass::IntraPackage);
    assert_eq!(t.link_class(0, 2), LinkClass::IntraNode);
    assert_eq!(t.link_class(1, 7), LinkClass::IntraNode);
    assert_eq!(t.link_class(0, 8), LinkClass::InterNode);
    assert_eq!(t.link_class(7, 8), LinkClass::InterNode);
    assert_eq!(t.link(0, 1), t.links.intra_package);
    // nodes:NxR has no intra_package link between distinct ranks
    let u = Topology::parse("nodes:2x4").unwrap();
    assert_eq!(u.link_class(0, 1), LinkClass::IntraNode);
    assert_eq!(u.link_class(3, 4), LinkClass::InterNode);
}

#[test]
fn levels() {
    use Level::*;
    let l = |s: &str| Topology::parse(s).unwrap().levels();
    assert_eq!(l("frontier:2"), vec![(Network, 2), (Node, 4), (Package, 2)]);
    assert_eq!(l("frontier:1"), vec![(Node, 4), (Package, 2)]);
    assert_eq!(l("nodes:4x8"), vec![(Network, 4), (Node, 8)]);
    assert_eq!(l("nodes:1x8"), vec![(Node, 8)]);
    assert_eq!(l("nodes:4x1"), vec![(Network, 4)]);
    assert_eq!(l("nodes:1x1"), vec![]);
    assert_eq!(l("nodes:3x1x2"), vec![(Network, 3), (Package, 2)]);
    assert_eq!(Level::Package.link_class(), LinkClass::IntraPackage);
}

#[test]
fn check_world_message() {
    let t = Topology::parse("frontier:2").unwrap();
    assert!(t.check_world(16).is_ok());
    let e = t.check_world(12).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidUsage(
            "topology frontier:2 describes 16 ranks (2 nodes x 4 packages x 2 dies) but the world has 12 ranks: \
             give a topology of 12 ranks (e.g. nodes:1x12) or start 16 ranks".into()
        )
    );
    assert_eq!(e.code(), 5);
    let m = Topology::parse("nodes:1x8")
        .unwrap()
        .check_world(4)
        .unwrap_err()
        .to_string();
    assert!(m.contains("(1 node x 8 packages x 1 die)"), "{m}");
    // docs/errors.md: the two fixes, a topology of the world's size or as many ranks.
    assert!(
        m.ends_with("give a topology of 4 ranks (e.g. nodes:1x4) or start 8 ranks"),
        "{m}"
    );
    assert_eq!(
        t.summary(),
        "frontier:2 = 2 nodes x 4 packages x 2 dies (16 ranks)"
    );
}

#[test]
fn json_round_trip_through_file() {
    let t = Topology::parse("frontier:4,switch=3").unwrap();
    let path = unique_tmp("rt");
    t.save(&path).unwrap();
    let back = Topology::load(&path).unwrap();
    assert_eq!(back, t);
    // parse() accepts the path too, and the file takes precedence over the grammar
    assert_eq!(Topology::parse(path.to_str().unwrap()).unwrap(), t);
    assert_eq!(Topology::from_json(&t.to_json()).unwrap(), t);
    let _ = std::fs::remove_file(&path);

    // the JSON carries the contract names
    let j = t.to_json();
    for k in [
        "intra_package",
        "intra_node",
        "inter_node",
        "nics_per_node",
        "switch_of_node",
        "bandwidth_gbs",
    ] {
        assert!(j.contains(k), "{k} missing from {j}");
    }
    // switch_of_node may be omitted, name defaults
    let mut v: serde_json::Value = serde_json::from_str(&j).unwrap();
    v.as_object_mut().unwrap().remove("switch_of_node");
    v.as_object_mut().unwrap().remove("name");
    let u = Topology::from_json(&v.to_string()).unwrap();
    assert_eq!(u.switch_of_node, None);
    assert_eq!(u.name, "custom:4x4x2");
}

#[test]
fn json_validation() {
    let good: serde_json::Value =
        serde_json::from_str(&Topology::parse("nodes:2x4").unwrap().to_json()).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        Topology::from_json(&v.to_string())
    };
    assert!(with(&|_| {}).is_ok());
    for (what, r) in [
        ("zero nodes", with(&|v| v["nodes"] = 0.into())),
        ("zero dies", with(&|v| v["dies_per_package"] = 0.into())),
        (
            "switch len",
            with(&|v| v["switch_of_node"] = serde_json::json!([0, 0, 1])),
        ),
        (
            "zero bw",
            with(&|v| v["links"]["inter_node"]["bandwidth_gbs"] = 0.0.into()),
        ),
        (
            "neg bw",
            with(&|v| v["links"]["intra_node"]["bandwidth_gbs"] = (-1.0).into()),
        ),
        (
            "neg lat",
            with(&|v| v["links"]["intra_node"]["latency_us"] = (-1.0).into()),
        ),
        (
            "zero nics",
            with(&|v| v["links"]["nics_per_node"] = 0.into()),
        ),
        (
            "nic bw",
            with(&|v| v["links"]["nic_bandwidth_gbs"] = 0.0.into()),
        ),
        ("unknown field", with(&|v| v["nodez"] = 3.into())),
        (
            "missing field",
            with(&|v| {
                v.as_object_mut().unwrap().remove("links");
            }),
        ),
    ] {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{what}: {r:?}");
    }
    assert!(with(&|v| v["switch_of_node"] = serde_json::json!([7, 3])).is_ok());
    assert!(matches!(
        Topology::from_json("{not json"),
        Err(Error::InvalidArgument(_))
    ));
    let bad = unique_tmp("bad");
    std::fs::write(&bad, "{\"nodes\": 0}").unwrap();
    let e = Topology::parse(bad.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains(bad.to_str().unwrap()), "{e}");
    let _ = std::fs::remove_file(&bad);
}

#[test]
fn env_value() {
    use std::env::VarError;
    assert_eq!(
        Topology::from_env_value(Err(VarError::NotPresent)).unwrap(),
        None
    );
    assert_eq!(Topology::from_env_value(Ok("  ".into())).unwrap(), None);
    let t = Topology::from_env_value(Ok("p4d:2".into()))
        .unwrap()
        .unwrap();
    assert_eq!(t.world_size(), 16);
    let e = Topology::from_env_value(Ok("p4d".into()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("STRATA_TOPOLOGY") && e.contains("accepted forms"),
        "{e}"
    );
}

#[test]
fn switch_helpers() {
    let t = Topology::parse("nodes:4x2").unwrap();
    assert_eq!((t.num_switches(), t.switch_of(3)), (1, 0));
    let t = t.with_switch_of_node(vec![5, 5, 9, 9]).unwrap();
    assert_eq!((t.num_switches(), t.switch_of(2)), (2, 9));
    assert!(Topology::uniform(4, 2)
        .with_switch_of_node(vec![0])
        .is_err());
    assert!(Topology::uniform(4, 2).with_nodes_per_switch(0).is_err());
}
