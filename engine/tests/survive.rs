//! A rank lost mid-run (issue 51): with `survive` the others take a census, shrink the
//! world, restore the last sharded checkpoint on the survivors and train on; their loss
//! curve equals a run started on the smaller world from the same checkpoint.
use std::path::Path;
use strata::Topology;
use strata_engine::checkpoint;
use strata_engine::train::{train_local, TrainOptions};

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
        o.lose = Some((5, 5)); // world rank 5 stops before step 5
        let t0 = std::time::Instant::now();
        let run = train_local(&o, &mut |_| {}).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        let took = t0.elapsed();
        let steps: Vec<u64> = run.iter().map(|r| r.step).collect();
        assert_eq!(steps, (1..=8).collect::<Vec<_>>(), "{strategy}");
        // Steps 4-8 on the 7 survivors from step 3's checkpoint (8 ranks wrote it),
        // against a fresh world of 7 resumed from a copy of the same checkpoint.
        copy_step(&dir, &refdir, 3);
        let mut r = TrainOptions::new(strategy, Topology::parse("nodes:1x7").unwrap(), 8);
        r.checkpoint = Some(refdir.clone());
        r.resume = true;
        let reference = train_local(&r, &mut |_| {}).unwrap();
        assert_eq!(reference.first().map(|x| x.step), Some(4));
        for (a, b) in run[3..].iter().zip(&reference) {
            let rel = ((a.loss - b.loss) / b.loss).abs();
            assert!(
                rel < 1e-5,
                "{strategy} step {}: {} vs {} ({rel:.2e})",
                a.step,
                a.loss,
                b.loss
            );
        }
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
