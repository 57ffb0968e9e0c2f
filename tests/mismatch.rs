//! Collective mismatch detection on the local transport: what the end-to-end body
//! (`tools/src/mismatch.rs`, every kind at 3 and 4 ranks, also under mpirun) does not
//! cover: the algorithm, sub-communicators named by world ranks, point-to-point ops left
//! unchecked, checking off, and a rank that never calls (an error, not a hang).
mod common;

use std::time::Duration;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Error, Op, ReduceOp, Request, Result};

fn all_gather(c: &Comm, count: usize, algo: Algo) -> Result<()> {
    let n = c.size();
    c.submit(
        Request::new(
            Op::AllGather {
                send: Buffer::zeroed(4 * count),
                recv: Buffer::zeroed(4 * n * count),
                count,
            },
            DataType::F32,
        )
        .with_algo(algo),
    )?
    .wait()
}

fn errors(rs: Vec<Result<()>>) -> Vec<String> {
    rs.into_iter()
        .map(|r| r.expect_err("mismatch not caught").to_string())
        .collect()
}

#[test]
fn different_algorithms_are_a_mismatch() {
    let rs = common::on_local("nodes:2x2", |c| {
        c.set_check(true);
        let algo = if c.rank() == 2 {
            Algo::Hier
        } else {
            Algo::Ring
        };
        all_gather(&c, 8, algo)
    });
    for e in errors(rs) {
        assert_eq!(
            e,
            "invalid usage: collective mismatch on a communicator of 4 ranks (seq 0): \
             ranks 0,1,3 called all-gather(count=8, f32, ring); rank 2 called all-gather(count=8, f32, hier)"
        );
    }
}

#[test]
fn sub_communicators_name_world_ranks_and_inherit_checking() {
    let rs = common::on_local("nodes:1x5", |c| {
        c.set_check(true);
        let sub = c.split((c.rank() > 0).then_some(1), 0)?;
        c.set_check(false); // the split copied the setting; the sub-communicator keeps it
        let Some(sub) = sub else { return Ok(()) };
        assert!(sub.checks());
        let count = if c.rank() == 3 { 7 } else { 8 };
        all_gather(&sub, count, Algo::Ring)
    });
    assert!(rs[0].is_ok());
    for e in errors(rs.into_iter().skip(1).collect()) {
        assert_eq!(
            e,
            "invalid usage: collective mismatch on a communicator of 4 ranks (seq 0): \
             world ranks 1,2,4 called all-gather(count=8, f32, ring); world rank 3 called all-gather(count=7, f32, ring)"
        );
    }
}

#[test]
fn the_error_is_invalid_usage_on_every_rank_and_the_last_error() {
    let rs = common::on_local("nodes:1x3", |c| {
        c.set_check(true);
        let r = all_gather(&c, 1 + c.rank() % 2, Algo::Ring);
        let e = r.expect_err("not caught");
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert_eq!(e.code(), 5);
        assert_eq!(c.last_error(), e.to_string());
        Ok(())
    });
    rs.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn point_to_point_is_not_checked_and_mixed_groups_check_their_collectives() {
    // Each rank sends to the next and receives from the previous (asymmetric by nature),
    // grouped with an all-reduce every rank calls alike.
    let got = common::all_ok("nodes:1x3", |c| {
        c.set_check(true);
        let (n, r) = (c.size(), c.rank());
        let out = Buffer::from_slice(&[r as f32; 4]);
        let inb = Buffer::zeroed(16);
        let sum_in = Buffer::from_slice(&[1.0f32; 2]);
        let sum_out = Buffer::zeroed(8);
        strata::group_start();
        let ws = vec![
            c.send(&out, 4, DataType::F32, (r + 1) % n)?,
            c.recv(&inb, 4, DataType::F32, (r + n - 1) % n)?,
            c.all_reduce(&sum_in, &sum_out, 2, DataType::F32, ReduceOp::Sum)?,
        ];
        strata::group_end()?;
        ws.iter().try_for_each(|w| w.wait())?;
        Ok((inb.to_vec::<f32>()?, sum_out.to_vec::<f32>()?))
    });
    for (r, (inb, sum)) in got.into_iter().enumerate() {
        assert_eq!(inb, [((r + 2) % 3) as f32; 4]);
        assert_eq!(sum, [3.0; 2]);
    }
}

#[test]
fn checking_off_leaves_the_transport_error() {
    let rs = common::on_local("nodes:1x3", |c| {
        c.set_check(false);
        all_gather(&c, 1 + usize::from(c.rank() == 2), Algo::Ring)
    });
    let es: Vec<String> = rs
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| e.to_string())
        .collect();
    assert!(!es.is_empty());
    assert!(
        es.iter().all(|e| !e.contains("collective mismatch")),
        "{es:?}"
    );
    assert!(
        es.iter().any(|e| e.contains("counts or dtypes differ")),
        "{es:?}"
    );
}

#[test]
fn a_rank_that_never_calls_is_an_error_not_a_hang() {
    let cfg = CommConfig {
        timeout: Duration::from_millis(500),
        ..common::config()
    };
    let t0 = std::time::Instant::now();
    let rs = common::on_local_with("nodes:1x3", cfg, |c| {
        c.set_check(true);
        if c.rank() == 1 {
            return Ok(());
        }
        all_gather(&c, 4, Algo::Ring)
    });
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(rs[1].is_ok());
    for r in [&rs[0], &rs[2]] {
        let e = r.as_ref().expect_err("no error").to_string();
        assert!(
            e.starts_with("remote error: mismatch check of all-gather(count=4, f32, ring) failed"),
            "{e}"
        );
    }
}
