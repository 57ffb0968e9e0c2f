//! A lost rank (issue 51): the survivors of a failed communicator shrink it and go on.
//! On the local transport (and `host-local`); every lossless algorithm on the uneven shapes a loss leaves,
//! against the plain reference.
mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;
use strata::check::{run_checked, Kind};
use strata::transport::TransportKind;
use strata::{Algo, Comm, CommConfig, DataType, Error, ReduceOp, Topology};

fn world(topo: &str, timeout: Duration) -> Vec<Comm> {
    world_of(TransportKind::Local, topo, timeout)
}

fn world_of(kind: TransportKind, topo: &str, timeout: Duration) -> Vec<Comm> {
    let topo = Topology::parse(topo).unwrap();
    let cfg = CommConfig {
        timeout,
        ..common::config()
    };
    let n = topo.world_size();
    match kind {
        TransportKind::Local => Comm::local_world(n, Some(topo), cfg).unwrap(),
        _ => Comm::in_process_world(kind, n, Some(topo), cfg).unwrap(),
    }
}

/// Wrong elements of every lossless algorithm, every collective, three dtypes, an odd
/// count, in place and not, on `c`.
fn wrong_everywhere(c: &Comm, seed: u64) -> strata::Result<usize> {
    let mut w = 0;
    for algo in Algo::LOSSLESS {
        for kind in [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce] {
            for (dt, op) in [
                (DataType::F32, ReduceOp::Sum),
                (DataType::BF16, ReduceOp::Avg),
                (DataType::I32, ReduceOp::Max),
            ] {
                for in_place in [false, true] {
                    w += run_checked(c, kind, dt, op, 7, algo, in_place, seed)?;
                }
            }
        }
    }
    Ok(w)
}

/// nodes:3x4, rank 5 frozen (it never calls again): the survivors' next collective times
/// out and aborts the communicator, they shrink it (node 1 keeps 3 ranks: nodes 4,3,4),
/// and every algorithm is right on the 11 survivors; then a whole node is lost too.
#[test]
fn survivors_shrink_and_go_on() {
    survivors_shrink_and_go_on_over(TransportKind::Local);
}

/// The same on `host-local` (device buffers on the CPU device; what `cuda-local` runs
/// on a GPU): its ranks meet apart from the aborted communicator's board.
#[test]
fn survivors_shrink_and_go_on_host_local() {
    survivors_shrink_and_go_on_over(TransportKind::HostLocal);
}

fn survivors_shrink_and_go_on_over(kind: TransportKind) {
    let comms = world_of(kind, "nodes:3x4", Duration::from_millis(600));
    let done = Arc::new(Barrier::new(comms.len()));
    let out = common::on_comms(comms, move |c| {
        let lost = 5;
        if c.rank() == lost {
            done.wait(); // frozen until the survivors are done
            return Ok(None);
        }
        let failed = run_checked(
            &c,
            Kind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            4,
            Algo::Ring,
            false,
            1,
        );
        assert!(matches!(failed, Err(Error::Remote(_))), "{failed:?}");
        // The failure aborted it: the next call fails at once.
        assert!(c.barrier().is_err());
        // The survivors agree on who is left (rank 5 never comes to the census).
        let alive = c.survivors()?;
        assert_eq!(alive, (0..12).filter(|&r| r != lost).collect::<Vec<_>>());
        let s = c.shrink(&[lost])?;
        assert_eq!(s.size(), 11);
        assert_eq!(s.rank(), c.rank() - usize::from(c.rank() > lost));
        assert!(!s.members().contains(&lost));
        let w1 = wrong_everywhere(&s, 3)?;
        // Node 2 (world ranks 8..12, new ranks 7..11) goes too: nodes 4,3.
        let node2: Vec<usize> = (7..11).collect();
        let w2 = if node2.contains(&s.rank()) {
            0
        } else {
            let t = s.shrink(&node2)?;
            assert_eq!(
                (t.size(), t.members().to_vec()),
                (7, vec![0, 1, 2, 3, 4, 6, 7])
            );
            wrong_everywhere(&t, 4)?
        };
        done.wait();
        Ok(Some(w1 + w2))
    });
    for (r, x) in out.into_iter().enumerate() {
        let w = x.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(w.is_none_or(|w| w == 0), "rank {r}: {w:?} wrong");
    }
}

/// Bad lists are refused before anything is made; a survivor that never calls makes the
/// others fail within the timeout (no hang); an empty list copies the communicator.
#[test]
fn shrink_refuses_bad_lists_and_missing_survivors() {
    let comms = world("nodes:2x2", Duration::from_millis(400));
    let out = common::on_comms(comms, |c| {
        let me = c.rank();
        for bad in [vec![me], vec![4], vec![(me + 1) % 4, (me + 1) % 4]] {
            assert!(
                matches!(c.shrink(&bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        let all = c.shrink(&[])?;
        assert_eq!((all.size(), all.rank()), (4, me));
        assert_eq!(wrong_everywhere(&all, 1)?, 0);
        // Ranks 0 and 1 drop rank 2, but survivor 3 never comes: they time out.
        if me < 2 {
            let late = c.shrink(&[2]);
            assert!(matches!(late, Err(Error::Remote(_))), "{late:?}");
        }
        Ok(())
    });
    for (r, x) in out.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// A census closes one timeout after its first caller when a rank never comes; a rank
/// coming after it closed learns it was left out.
#[test]
fn a_census_closes_without_the_absent_and_refuses_the_late() {
    let comms = world("nodes:1x3", Duration::from_millis(300));
    let out = common::on_comms(comms, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(900));
        }
        c.survivors()
    });
    assert_eq!(out[0].as_ref().unwrap(), &[0, 1]);
    assert_eq!(out[1].as_ref().unwrap(), &[0, 1]);
    assert!(matches!(out[2], Err(Error::Remote(_))), "{:?}", out[2]);
}
