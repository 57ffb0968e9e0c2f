//! Bad input returns a clear error, never a panic or a hang.
mod common;

use std::time::{Duration, Instant};
use strata::{Buffer, Comm, CommConfig, DataType, Error, ReduceOp, Topology};

fn world(n: usize, secs: u64) -> Vec<Comm> {
    Comm::local_world(
        n,
        Some(Topology::parse(&format!("nodes:1x{n}")).unwrap()),
        CommConfig {
            algo: strata::Algo::Auto,
            timeout: Duration::from_secs(secs),
            ho_ring_chunks: None,
            links: strata::config::LinkSource::Preset,
        },
    )
    .unwrap()
}

#[test]
fn topology_must_fit_the_world() {
    let e = Comm::local_world(
        12,
        Some(Topology::parse("frontier:2").unwrap()),
        common::config(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("16") && e.to_string().contains("12"),
        "{e}"
    );
    assert_eq!(e.code(), 5);
    assert!(Comm::local_world(0, None, common::config()).is_err());
}

#[test]
fn bad_specs_and_dtypes() {
    for s in [
        "nodes:0x4",
        "nodes:4",
        "dgx-a100:",
        "frontier:x",
        "what:2",
        "/nonexistent/topo.json",
    ] {
        let e = Topology::parse(s).unwrap_err();
        assert_eq!(e.code(), 4, "{s}: {e}");
    }
    assert!("f8".parse::<DataType>().is_err());
    assert!(DataType::from_raw(10).is_err());
    assert!(ReduceOp::from_raw(17).is_err());
    assert!("bogus".parse::<strata::Algo>().is_err());
}

#[test]
fn argument_checks_fail_synchronously() {
    let c = world(1, 5).remove(0);
    let small = Buffer::zeroed(8);
    let big = Buffer::zeroed(64);
    // Receive buffer too small.
    let e = c.all_gather(&big, &small, 4, DataType::F32).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(!c.last_error().is_empty());
    // count x size overflows.
    assert!(matches!(
        c.all_reduce(&big, &big, usize::MAX / 2, DataType::F32, ReduceOp::Sum)
            .unwrap_err(),
        Error::InvalidArgument(_)
    ));
    // Overlapping buffers that are not the in-place layout.
    let a = big.slice(0..32).unwrap();
    let b = big.slice(16..48).unwrap();
    assert!(matches!(
        c.all_reduce(&a, &b, 8, DataType::F32, ReduceOp::Sum)
            .unwrap_err(),
        Error::InvalidArgument(_)
    ));
    // Peers and roots out of range.
    assert!(matches!(
        c.send(&big, 1, DataType::F32, 3).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        c.broadcast(&big, &big, 1, DataType::F32, 1).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    // Coalesced lists of different lengths.
    assert!(c
        .all_gather_coalesced(&[big.clone()], &[], &[1], DataType::F32)
        .is_err());
    // Group end without start.
    assert!(matches!(
        strata::group_end().unwrap_err(),
        Error::InvalidUsage(_)
    ));
    // Use after destroy.
    c.destroy().unwrap();
    let e = c
        .all_reduce(&big, &big, 1, DataType::F32, ReduceOp::Sum)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
}

#[test]
fn mismatched_counts_across_ranks_error_everywhere_quickly() {
    let t0 = Instant::now();
    let comms = world(4, 30);
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let count = if c.rank() == 2 { 5 } else { 4 };
                let s = Buffer::zeroed(count * 4);
                let r = Buffer::zeroed(count * 4 * 4);
                c.all_gather(&s, &r, count, DataType::F32).unwrap().wait()
            })
        })
        .collect();
    let errs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(errs.iter().all(|r| r.is_err()), "{errs:?}");
    assert!(
        errs.iter().any(
            |r| matches!(r, Err(Error::InvalidUsage(m)) if m.contains("counts or dtypes differ"))
        ),
        "{errs:?}"
    );
    // The failing rank aborts the communicator: nobody waits for the 30 s timeout.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn dead_peer_is_an_error_within_the_timeout() {
    let t0 = Instant::now();
    let mut comms = world(3, 1);
    let dead = comms.pop().unwrap();
    drop(dead); // rank 2 never takes part
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                c.all_reduce(
                    &Buffer::zeroed(40),
                    &Buffer::zeroed(40),
                    10,
                    DataType::F32,
                    ReduceOp::Sum,
                )
                .unwrap()
                .wait()
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
        assert_eq!(e.code(), 6);
    }
    assert!(t0.elapsed() < Duration::from_secs(8));
}

#[test]
fn abort_wakes_a_waiting_peer() {
    let mut comms = world(2, 60);
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let buf = Buffer::zeroed(4);
    let w = c0.recv(&buf, 1, DataType::F32, 1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!w.is_done());
    c1.abort();
    assert!(matches!(w.wait().unwrap_err(), Error::Remote(_)));
}

/// Runs 3 all-reduces on every rank, then `odd` (rank 3) misbehaves while the others
/// try a 4th, destroy and drop their communicators. `odd` gets a receiver that
/// disconnects once the others are done. Returns the others' results and the longest
/// time one of them spent from its 4th call to the end of its drop.
fn one_rank_misbehaves(
    odd: impl FnOnce(Comm, std::sync::mpsc::Receiver<()>) + Send + 'static,
) -> (Vec<strata::Result<()>>, Duration) {
    let comms = world(4, 2);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let mut odd = Some((odd, done_rx));
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let odd = if c.rank() == 3 { odd.take() } else { None };
            std::thread::spawn(move || -> (strata::Result<()>, Duration) {
                let buf = Buffer::from_slice(&[1.0f32; 10]);
                let out = Buffer::zeroed(40);
                for _ in 0..3 {
                    let r = c.all_reduce(&buf, &out, 10, DataType::F32, ReduceOp::Sum);
                    r.and_then(|w| w.wait()).unwrap();
                }
                assert_eq!(out.to_vec::<f32>().unwrap(), vec![4.0; 10]);
                if let Some((odd, rx)) = odd {
                    odd(c, rx);
                    return (Ok(()), Duration::ZERO);
                }
                let t0 = Instant::now();
                let r = c
                    .all_reduce(&buf, &out, 10, DataType::F32, ReduceOp::Sum)
                    .and_then(|w| w.wait());
                // Destroying a communicator whose peer failed returns.
                let _ = c.destroy();
                drop(c);
                (r, t0.elapsed())
            })
        })
        .collect();
    let mut hs = hs.into_iter();
    let mut res = Vec::new();
    let mut took = Duration::ZERO;
    for h in hs.by_ref().take(3) {
        let (r, t) = h.join().unwrap();
        res.push(r);
        took = took.max(t);
    }
    drop(done_tx);
    let odd_result = hs.next().unwrap().join();
    assert!(odd_result.is_ok() || res.iter().all(|r| r.is_err()));
    (res, took)
}

#[test]
fn a_rank_that_stops_calling_leaves_the_others_with_remote_within_the_timeout() {
    let (res, took) = one_rank_misbehaves(|c, others_done| {
        // Stops calling collectives but keeps its communicator until the others are done,
        // then drops it (which returns).
        let _ = others_done.recv();
        drop(c);
    });
    for r in &res {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
        assert!(e.to_string().contains("all-reduce"), "{e}");
    }
    assert!(took < Duration::from_secs(2 + 5), "{took:?}");
}

#[test]
fn a_rank_that_panics_aborts_its_communicator_for_the_others() {
    let (res, took) = one_rank_misbehaves(|_c, _| panic!("rank 3's training step failed"));
    for r in &res {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
    }
    // The panic's unwinding aborted the communicator: the others fail with that, not
    // by waiting out the 2 s timeout.
    assert!(
        res.iter()
            .any(|r| r.as_ref().unwrap_err().to_string().contains("panicked")),
        "{res:?}"
    );
    assert!(took < Duration::from_secs(2 + 5), "{took:?}");
}
