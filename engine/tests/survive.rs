//! A rank lost mid-run (issue 51): with `survive` the others take a census, shrink the
//! world, restore the last sharded checkpoint on the survivors and train on; their loss
//! curve equals a run started on the smaller world from the same checkpoint.
use std::path::Path;
use strata::Topology;
use strata_engine::checkpoint;
use strata_engine::train::{survivors_layout, survivors_topology, train_local, TrainOptions};
use strata_engine::StepReport;

fn copy_step(from: &Path, to: &Path, step: u64) {
    let (src, dst) = (
        checkpoint::step_dir(from, step),
        checkpoint::step_dir(to, step),
    );
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// `run`'s steps after `from` equal, within 1e-5 relative, a fresh world of `topo`
/// resumed from the step-`from` checkpoint in `dir`.
fn matches_a_fresh_world(strategy: &str, run: &[StepReport], topo: &str, dir: &Path, from: u64) {
    let mut r = TrainOptions::new(strategy, Topology::parse(topo).unwrap(), 8);
    r.checkpoint = Some(dir.to_path_buf());
    r.resume = true;
    let reference = train_local(&r, &mut |_| {}).unwrap();
    assert_eq!(reference.first().map(|x| x.step), Some(from + 1));
    for (a, b) in run[from as usize..].iter().zip(&reference) {
        let rel = ((a.loss - b.loss) / b.loss).abs();
        assert!(
            rel < 1e-5,
            "{strategy} step {}: {} vs {} ({rel:.2e})",
            a.step,
            a.loss,
            b.loss
        );
    }
}

#[test]
fn a_lost_rank_is_survived_from_the_last_checkpoint() {
    // Short waits: the lost rank costs one timeout to notice and one to close the census.
    std::env::set_var("STRATA_TIMEOUT", "2");
    let tmp = std::env::temp_dir().join(format!("strata-survive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (dir, refdir) = (tmp.join("run"), tmp.join("reference"));
    for strategy in ["zero3", "zero1"] {
        let _ = std::fs::remove_dir_all(&tmp);
        let mut o = TrainOptions::new(strategy, Topology::parse("nodes:2x4").unwrap(), 8);
        o.checkpoint = Some(dir.clone());
        o.checkpoint_every = 3;
        o.survive = true;
        o.lose = Some((vec![5], 5)); // world rank 5 stops before step 5
        let t0 = std::time::Instant::now();
        let run = train_local(&o, &mut |_| {}).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        let took = t0.elapsed();
        let steps: Vec<u64> = run.iter().map(|r| r.step).collect();
        assert_eq!(steps, (1..=8).collect::<Vec<_>>(), "{strategy}");
        let rc = run[3].recovery.as_ref().expect("step 4 says it recovered");
        assert_eq!((rc.lost.clone(), rc.world, rc.from_step), (vec![5], 7, 3));
        assert_eq!(rc.source, "checkpoint");
        assert_eq!(run.iter().filter(|r| r.recovery.is_some()).count(), 1);
        // Steps 4-8 on the 7 survivors from step 3's checkpoint (8 ranks wrote it),
        // against a fresh world of 7 resumed from a copy of the same checkpoint.
        copy_step(&dir, &refdir, 3);
        matches_a_fresh_world(strategy, &run, "nodes:1x7", &refdir, 3);
        println!(
            "{strategy}: lost world rank 5 before step 5, went on from step 3 on 7 ranks; \
             run took {took:?}; losses {:?}",
            run.iter()
                .map(|r| format!("{:.5}", r.loss))
                .collect::<Vec<_>>()
        );
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// MiCS keeps a replica of every shard in each partition group: losing a whole node
/// (world ranks 4 and 5 of nodes:3x2, mics:2) costs no checkpoint. The survivors
/// exchange their snapshots (as of step 4, the last every rank completed), restore the
/// lost node's shards from the replicas, go on as the two nodes left (nodes:2x2, MiCS's
/// partition groups still inside nodes), and their steps 5-8 equal a fresh nodes:2x2
/// world started from the step-4 state. `dp` losing one rank of eight goes on as one
/// node of 7; `mics:2` losing one rank of nodes:2x4 cannot tile one node of 7, so node
/// 1's survivors are set aside after the restore and node 0 goes on alone (nodes:1x4),
/// equal to a fresh nodes:1x4 world. Without a checkpoint directory at all: a strategy
/// without replicas would stop with an error.
#[test]
fn a_lost_node_is_survived_from_the_replicas() {
    std::env::set_var("STRATA_TIMEOUT", "2");
    let tmp = std::env::temp_dir().join(format!("strata-replicas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for (strategy, topo, lose, after, aside) in [
        ("mics:2", "nodes:3x2", vec![4, 5], "nodes:2x2", vec![]),
        ("dp", "nodes:2x4", vec![5], "nodes:1x7", vec![]),
        // MiCS's partition groups of 2 cannot tile one node of 7: node 1's survivors
        // are set aside after the restore, and node 0 goes on alone.
        ("mics:2", "nodes:2x4", vec![5], "nodes:1x4", vec![4, 6, 7]),
        // World rank 0's node left partial: node 1 goes on, and its rank 0 (world rank
        // 4) reports the steps after the loss.
        ("mics:2", "nodes:2x4", vec![1], "nodes:1x4", vec![0, 2, 3]),
    ] {
        let mut o = TrainOptions::new(strategy, Topology::parse(topo).unwrap(), 8);
        o.survive = true;
        o.lose = Some((lose, 5));
        let mut seen = Vec::new();
        let run = train_local(&o, &mut |r| seen.push(r.step))
            .unwrap_or_else(|e| panic!("{strategy}: {e}"));
        assert_eq!(
            run.iter().map(|r| r.step).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
        assert_eq!(seen, (1..=8).collect::<Vec<_>>(), "each step reported once");
        let rc = run[4].recovery.as_ref().expect("step 5 says it recovered");
        assert_eq!(rc.after_step, 4, "{strategy} on {topo}");
        assert_eq!(
            (rc.from_step, rc.source.as_str(), rc.layout.as_str()),
            (4, "replicas", after),
            "{strategy}"
        );
        assert_eq!(rc.set_aside, aside, "{strategy} on {topo}");
        let world = Topology::parse(after).unwrap().world_size();
        assert_eq!(rc.world, world, "{strategy} on {topo}");
        // The reference: the step-4 state as a checkpoint, resumed on the survivors' count.
        let dir = tmp.join(format!("{strategy}-{topo}").replace(':', ""));
        let mut first = TrainOptions::new(strategy, Topology::parse(topo).unwrap(), 4);
        first.checkpoint = Some(dir.clone());
        first.checkpoint_every = 4;
        let head = train_local(&first, &mut |_| {}).unwrap();
        for (a, b) in run[..4].iter().zip(&head) {
            assert_eq!(a.loss, b.loss, "{strategy} step {}", a.step);
        }
        matches_a_fresh_world(strategy, &run, after, &dir, 4);
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Only a majority goes on (half of the world with rank 0): on a cut link each side's
/// census finds only itself, and two worlds must never train on at once. Here the half
/// without rank 0 survives (world ranks 0 and 1 lost): it stops with an error saying
/// why, and no step after the loss is reported.
#[test]
fn a_minority_stops() {
    std::env::set_var("STRATA_TIMEOUT", "2");
    let mut o = TrainOptions::new("dp", Topology::parse("nodes:2x2").unwrap(), 6);
    o.survive = true;
    o.lose = Some((vec![0, 1], 3));
    let e = train_local(&o, &mut |_| {}).expect_err("the half without rank 0 went on");
    let msg = e.to_string();
    assert!(
        msg.contains("world ranks [2, 3], 2 of 4: not a majority"),
        "{msg}"
    );
}

/// The survivors' layout: whole nodes lost leave the other nodes as they were (links and
/// leaf switches too); a node left partial makes one node of the survivors.
#[test]
fn the_survivors_keep_whole_nodes() {
    let t = |s: &str| Topology::parse(s).unwrap();
    let after = |s: &str, lost: &[usize]| survivors_topology(&t(s), lost).unwrap();
    assert_eq!(after("nodes:3x2", &[4, 5]), t("nodes:2x2"));
    assert_eq!(after("nodes:3x2", &[0, 1]), t("nodes:2x2"));
    assert_eq!(after("nodes:4x2", &[2, 3, 6, 7]), t("nodes:2x2"));
    assert_eq!(after("nodes:2x4", &[5]), t("nodes:1x7"));
    assert_eq!(after("nodes:3x2", &[1, 4, 5]), t("nodes:1x3"));
    // Where the strategy cannot fit one node of the survivors, the intact nodes go on and
    // the partial nodes' survivors are set aside (world rank 0 too); never when it fits.
    let layout = |strategy: &str, topo: &str, lost: &[usize]| {
        let o = TrainOptions::new(strategy, t(topo), 1);
        let (l, aside) = survivors_layout(&o, lost).unwrap();
        (l.name, aside)
    };
    assert_eq!(
        layout("mics:2", "nodes:2x4", &[5]),
        ("nodes:1x4".into(), vec![4, 6, 7])
    );
    assert_eq!(
        layout("mics:4", "nodes:3x4", &[5, 9]),
        ("nodes:1x4".into(), vec![4, 6, 7, 8, 10, 11])
    );
    assert_eq!(
        layout("zero3", "nodes:2x4", &[5]),
        ("nodes:1x7".into(), vec![])
    );
    assert_eq!(
        layout("mics:2", "nodes:3x4", &[5, 9]),
        ("nodes:1x10".into(), vec![])
    );
    assert_eq!(
        layout("mics:4", "nodes:2x4", &[4, 5, 6, 7]),
        ("nodes:1x4".into(), vec![])
    );
    assert_eq!(
        layout("mics:2", "nodes:2x4", &[1]),
        ("nodes:1x4".into(), vec![0, 2, 3])
    );
    // Every node partial: no whole node to go on with, so every survivor, and the run
    // stops with the strategy's error (mics:4 cannot tile one node of 6).
    assert_eq!(
        layout("mics:4", "nodes:2x4", &[1, 5]),
        ("nodes:1x6".into(), vec![])
    );
    // A preset keeps its nodes' shape and links; its leaf switches follow the nodes kept.
    let f = t("frontier:3,switch=2");
    let g = after("frontier:3,switch=2", &(8..16).collect::<Vec<_>>());
    assert_eq!(
        (g.nodes, g.packages_per_node, g.dies_per_package),
        (2, f.packages_per_node, f.dies_per_package)
    );
    assert_eq!(g.links, f.links);
    assert_eq!(g.switch_of_node, Some(vec![0, 1]));
    assert_eq!(g.name, "frontier:3,switch=2 without nodes [1]");
}
