//! The link probe (`strata::comm::probe`): figures agreed on every rank (also with
//! injected noise), the cache, `STRATA_LINKS`-style creation on the in-process
//! transports, and `auto` deciding the same on every rank from what was measured.

mod common;

use std::path::PathBuf;
use strata::algo::select::{select, Shape};
use strata::comm::probe::{self, ProbeOptions};
use strata::config::LinkSource;
use strata::kinds::Kind;
use strata::topology::LinkClass;
use strata::{Algo, Comm, CommConfig, DataType, ReduceOp, Topology};

/// A fresh directory under the system's temporary one (the test removes it).
fn tmp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!("strata-probe-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn probe_world(spec: &str, opts: ProbeOptions) -> Vec<Topology> {
    let opts = std::sync::Arc::new(opts);
    common::on_local(spec, move |c| probe::probe(&c, &opts))
        .into_iter()
        .map(|r| r.expect("probe"))
        .collect()
}

/// What `auto` picks on `t` for a sweep of calls.
fn picks(t: &Topology) -> Vec<Algo> {
    let members: Vec<usize> = (0..t.world_size()).collect();
    let h = strata::topology::Hierarchy::detect(t, &members);
    let mut v = Vec::new();
    for kind in [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce] {
        for count in [1usize, 100, 10_000, 1 << 20, 1 << 24] {
            let s = Shape {
                kind: Some(kind),
                redop: Some(ReduceOp::Sum),
                count,
                dtype: DataType::F32,
                topo: t,
                members: &members,
                hierarchy: h.as_ref(),
                chunks: None,
            };
            v.push(select(Algo::Auto, &s).algo);
        }
    }
    v
}

#[test]
fn every_rank_agrees_even_with_noise() {
    for (spec, noise) in [("nodes:2x2", 0.5), ("nodes:3x1", 0.3), ("nodes:1x3", 0.0)] {
        let ts = probe_world(
            spec,
            ProbeOptions {
                fresh: true,
                cache: None,
                noise,
                seed: 7,
            },
        );
        let first = ts[0].to_json();
        for t in &ts {
            assert_eq!(t.to_json(), first, "{spec}: ranks disagree");
            assert_eq!(picks(t), picks(&ts[0]));
        }
        let t = &ts[0];
        let m = t.measured.as_ref().expect("measured");
        let want: Vec<LinkClass> = probe::spanned(t);
        assert_eq!(m.classes, want, "{spec}");
        assert_eq!(m.transport, "local");
        for c in &m.classes {
            let l = t.links.get(*c);
            assert!(
                l.bandwidth_gbs > 0.0 && l.latency_us > 0.0,
                "{spec} {c}: {l:?}"
            );
        }
        let h = t.links.host.expect("host figures on a host transport");
        assert!(h.copy_gbs > 0.0 && h.reduce_gbs > 0.0);
        // ho-ring's handoff where the world has the two levels ho-ring needs.
        let members: Vec<usize> = (0..t.world_size()).collect();
        let levels = strata::topology::Hierarchy::detect(t, &members).map_or(0, |h| h.levels.len());
        assert_eq!(t.links.handoff_us.is_some(), levels >= 2, "{spec}");
        assert!(t.links.handoff_us.is_none_or(|h| h.is_finite() && h >= 0.0));
        // The lone crossing's latency where a node has ranks that can wait.
        let lone = t.nodes > 1 && t.ranks_per_node() > 1;
        assert_eq!(t.links.lone_latency_us.is_some(), lone, "{spec}");
        assert!(t
            .links
            .lone_latency_us
            .is_none_or(|l| l.is_finite() && l > 0.0));
        // A probed topology is a topology file like any other.
        assert_eq!(Topology::from_json(&t.to_json()).unwrap(), *t);
    }
}

#[test]
fn noise_changes_figures_but_not_agreement() {
    // The same world probed with two noise seeds: figures differ (the noise is real),
    // every rank still agrees within each run.
    let run = |seed| {
        probe_world(
            "nodes:2x1",
            ProbeOptions {
                fresh: true,
                cache: None,
                noise: 0.9,
                seed,
            },
        )
    };
    let (a, b) = (run(1), run(2));
    assert_eq!(a[0].to_json(), a[1].to_json());
    assert_eq!(b[0].to_json(), b[1].to_json());
    assert_ne!(a[0].links.inter_node, b[0].links.inter_node);
}

#[test]
fn the_cache_is_read_back_and_reprobe_rewrites_it() {
    let dir = tmp_dir("cache");
    let opts = |fresh| ProbeOptions {
        fresh,
        cache: Some(dir.clone()),
        noise: 0.0,
        seed: 1,
    };
    let first = probe_world("nodes:2x2", opts(false));
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "one cache file");
    let again = probe_world("nodes:2x2", opts(false));
    // Read back: the very same figures and record (a new probe would differ in time).
    assert_eq!(again[0], first[0]);
    assert_eq!(again[1], first[0]);
    let fresh = probe_world("nodes:2x2", opts(true));
    assert_ne!(
        fresh[0].measured.as_ref().unwrap().seconds,
        first[0].measured.as_ref().unwrap().seconds
    );
    // Another layout on the same host is another key.
    probe_world("nodes:1x4", opts(false));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    // A damaged cache file is measured over, not trusted.
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::write(f.unwrap().path(), b"{ not json").unwrap();
    }
    let t = probe_world("nodes:2x2", opts(false));
    assert!(t[0].measured.is_some());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn worlds_created_with_probe_carry_the_figures() {
    let dir = tmp_dir("env");
    std::env::set_var("STRATA_LINKS_CACHE", &dir);
    let cfg = CommConfig {
        links: LinkSource::Reprobe,
        ..common::config()
    };
    for world in [
        Comm::local_world(4, Some(Topology::parse("nodes:2x2").unwrap()), cfg.clone()),
        Comm::host_local_world(3, Some(Topology::parse("nodes:3x1").unwrap()), cfg.clone()),
    ] {
        let world = world.expect("world");
        let t0 = world[0].topology().clone();
        assert!(t0.measured.is_some(), "{}", t0.name);
        for c in &world {
            assert_eq!(**c.topology(), *t0);
        }
        // The world works after the probe, and `auto` runs what it picked.
        let rs = common::on_comms(world, |c| {
            strata::check::run_checked(
                &c,
                strata::check::Kind::AllGather,
                DataType::F32,
                ReduceOp::Sum,
                1000,
                Algo::Auto,
                false,
                3,
            )
        });
        for r in rs {
            assert_eq!(r.unwrap(), 0);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_sub_world_is_refused() {
    let rs = common::on_local("nodes:1x4", |c| {
        let sub = c.split(Some((c.rank() % 2) as u32), 0)?.expect("member");
        Ok(probe::probe(
            &sub,
            &ProbeOptions {
                fresh: true,
                cache: None,
                noise: 0.0,
                seed: 0,
            },
        )
        .unwrap_err()
        .to_string())
    });
    for r in rs {
        assert!(r.unwrap().contains("whole world"));
    }
}
