//! Sharded checkpoints (issue 51): a resumed run repeats the original on the same world,
//! and a checkpoint restores exactly on a smaller one (the way on after a lost rank when
//! the strategy kept no replica of its shards).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata::{Comm, CommConfig, Topology};
use strata_engine::account::Meters;
use strata_engine::checkpoint::{self, read_state};
use strata_engine::model::TinyLm;
use strata_engine::train::{train_local, TrainOptions};
use strata_engine::{Engine, EngineConfig};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(strategy: &str, topo: &str, steps: u64, dir: &Path) -> TrainOptions {
    let mut o = TrainOptions::new(strategy, Topology::parse(topo).unwrap(), steps);
    o.checkpoint = Some(dir.to_path_buf());
    o.checkpoint_every = 3;
    o
}

/// 6 steps with a checkpoint at 3 and 6; the step-6 checkpoint removed, a resumed run
/// takes steps 4-6 again from step 3's and reports the same losses.
#[test]
fn resumed_runs_repeat_the_original() {
    for strategy in ["zero3", "mics:2", "zero1", "paro-iig"] {
        let dir = scratch(&format!("resume-{}", strategy.replace(':', "")));
        let o = opts(strategy, "nodes:2x4", 6, &dir);
        let full = train_local(&o, &mut |_| {}).unwrap();
        assert_eq!(checkpoint::latest(&dir).unwrap(), Some(6));
        std::fs::remove_dir_all(checkpoint::step_dir(&dir, 6)).unwrap();
        let mut again = o.clone();
        again.resume = true;
        let tail = train_local(&again, &mut |_| {}).unwrap();
        let steps: Vec<u64> = tail.iter().map(|r| r.step).collect();
        assert_eq!(steps, [4, 5, 6], "{strategy}");
        for (a, b) in full[3..].iter().zip(&tail) {
            assert_eq!(a.loss, b.loss, "{strategy} step {}", a.step);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Step 3 of zero3 on nodes:2x4 restored on 7 ranks (nodes:1x7): the shards cut for 7
/// ranks reassemble into exactly the checkpoint's state, the master weights gathered
/// from them equal it, and training goes on from step 4.
#[test]
fn a_checkpoint_restores_exactly_on_fewer_ranks() {
    let dir = scratch("fewer");
    train_local(&opts("zero3", "nodes:2x4", 3, &dir), &mut |_| {}).unwrap();
    let state = read_state(&dir, 3).unwrap();
    let small = opts("zero3", "nodes:1x7", 6, &dir);
    let topo = small.topology.clone();
    let comms = Comm::local_world(7, Some(topo.clone()), CommConfig::default()).unwrap();
    let meters = Meters::new(&topo);
    let again = scratch("fewer-again");
    let masters: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let (meters, state, small, again) = (meters.clone(), &state, &small, &again);
                s.spawn(move || {
                    let cfg = EngineConfig {
                        strategy: small.resolve().unwrap(),
                        precision: small.precision,
                        optimizer: small.optimizer,
                        seed: small.seed,
                    };
                    let model = Arc::new(TinyLm::new(small.model.clone()).unwrap());
                    let eng = Engine::restored(c.clone(), model, cfg, meters, Some(state)).unwrap();
                    assert_eq!(eng.steps_taken(), 3);
                    checkpoint::write_shard(again, c.rank(), &eng.shard().unwrap()).unwrap();
                    eng.full_master().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    checkpoint::mark_complete(&again, 3, 7).unwrap();
    assert_eq!(
        read_state(&again, 3).unwrap(),
        state,
        "7 shards reassemble the state"
    );
    let want: Vec<Vec<f32>> = state.units.iter().map(|u| u.master.clone()).collect();
    assert!(masters.iter().all(|m| *m == want));
    let mut resume = small.clone();
    resume.resume = true;
    resume.checkpoint_every = 0;
    let tail = train_local(&resume, &mut |_| {}).unwrap();
    assert_eq!(tail.iter().map(|r| r.step).collect::<Vec<_>>(), [4, 5, 6]);
    assert!(tail.iter().all(|r| r.loss.is_finite() && r.loss > 0.0));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&again).unwrap();
}
