//! Checks the `mpi` transport under mpirun (any rank count >= 2):
//!
//!     cargo build --features mpi --example mpi_transport_check
//!     mpirun --oversubscribe -np 3 target/debug/examples/mpi_transport_check
//!
//! Point-to-point, the ring, the trait's ring collectives (f32 and bf16), split, groups made
//! by their members alone, traffic,
//! the size-mismatch and timeout errors, abort, and two communicators driven at once
//! from two threads. `STRATA_MPI_MAX_MESSAGE=4096` in the environment exercises the
//! long-message path (header + pieces). Rank 0 prints `mpi_transport_check OK np=N`;
//! any failure exits non-zero.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::dtype::{DataType, ReduceOp};
use strata::error::Error;
use strata::topology::Topology;
use strata::transport::mpi::{finalize, MpiTransport};
use strata::transport::{P2p, Transport, TransportKind};

type Check = Result<(), String>;

macro_rules! ensure {
    ($c:expr, $($m:tt)*) => {
        if !$c {
            return Err(format!($($m)*));
        }
    };
}

fn ok<T>(r: strata::error::Result<T>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Small integers: every sum below is exact in f32 and bf16.
fn val(rank: usize, i: usize) -> f64 {
    ((rank % 4 + 1) * (i % 3 + 1)) as f64
}

fn fill(dtype: DataType, count: usize, f: impl Fn(usize) -> f64) -> Vec<u8> {
    let mut b = vec![0u8; count * dtype.size()];
    (0..count).for_each(|i| dtype.set(&mut b, i, f(i)));
    b
}

fn expect_values(dtype: DataType, got: &[u8], f: impl Fn(usize) -> f64, what: &str) -> Check {
    for i in 0..got.len() / dtype.size() {
        let (g, w) = (dtype.get(got, i), f(i));
        ensure!(
            g == w,
            "{what} ({}): element {i} is {g}, want {w}",
            dtype.name()
        );
    }
    Ok(())
}

fn p2p(t: &MpiTransport) -> Check {
    let (r, p) = (t.rank(), t.size());
    // Root fan-out and fan-in.
    if r == 0 {
        for q in 1..p {
            let msg: Vec<u8> = (0..1000 + q).map(|i| (i * 7 + q) as u8).collect();
            ok(t.send(q, &msg), "send")?;
        }
        for q in 1..p {
            let mut back = vec![0u8; 64 * 1024 + q];
            ok(t.recv(q, &mut back), "recv")?;
            ensure!(
                back.iter()
                    .enumerate()
                    .all(|(i, b)| *b == (i + q * 3) as u8),
                "rank 0: wrong data from rank {q}"
            );
        }
    } else {
        let mut msg = vec![0u8; 1000 + r];
        ok(t.recv(0, &mut msg), "recv")?;
        ensure!(
            msg.iter().enumerate().all(|(i, b)| *b == (i * 7 + r) as u8),
            "rank {r}: wrong data from rank 0"
        );
        let back: Vec<u8> = (0..64 * 1024 + r).map(|i| (i + r * 3) as u8).collect();
        ok(t.send(0, &back), "send")?;
    }
    // Empty message.
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    ok(t.sendrecv(next, &[], prev, &mut []), "empty sendrecv")?;
    // The ring: everyone sends to next and receives from prev at once (large: rendezvous).
    for len in [13usize, 3 << 20] {
        let out: Vec<u8> = (0..len).map(|i| (i + r) as u8).collect();
        let mut inc = vec![0u8; len];
        ok(t.sendrecv(next, &out, prev, &mut inc), "ring sendrecv")?;
        ensure!(
            inc.iter().enumerate().all(|(i, b)| *b == (i + prev) as u8),
            "rank {r}: wrong ring data ({len} bytes)"
        );
    }
    Ok(())
}

fn collectives(t: &dyn Transport, members: &[usize], tag: &str) -> Check {
    let (r, p) = (t.rank(), t.size());
    ensure!(
        members.len() == p && members[r] == t.world_rank(r),
        "{tag}: world_rank mismatch"
    );
    let wr = |q: usize| members[q];
    for dtype in [DataType::F32, DataType::BF16] {
        // all_gather: chunk of 37 elements.
        let c = 37;
        let cb = c * dtype.size();
        let mut buf = vec![0u8; p * cb];
        let mine = fill(dtype, c, |i| val(wr(r), i));
        buf[r * cb..(r + 1) * cb].copy_from_slice(&mine);
        ok(t.all_gather(&mut buf, cb), "all_gather")?;
        expect_values(
            dtype,
            &buf,
            |i| val(wr(i / c), i % c),
            &format!("{tag} all_gather"),
        )?;

        // reduce_scatter: recv of 29 elements.
        let c = 29;
        let send = fill(dtype, p * c, |j| val(wr(r), j) + (j / c) as f64);
        let mut recv = vec![0u8; c * dtype.size()];
        ok(
            t.reduce_scatter(&send, &mut recv, dtype, ReduceOp::Sum),
            "reduce_scatter",
        )?;
        expect_values(
            dtype,
            &recv,
            |i| (0..p).map(|q| val(wr(q), r * c + i) + r as f64).sum(),
            &format!("{tag} reduce_scatter"),
        )?;

        // all_reduce: sum and max over a count that p does not divide.
        let n = 1001;
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut buf = fill(dtype, n, |i| val(wr(r), i));
            ok(t.all_reduce(&mut buf, dtype, op), "all_reduce")?;
            let want = |i: usize| {
                (0..p)
                    .map(|q| val(wr(q), i))
                    .reduce(|a, b| op.apply(a, b))
                    .unwrap()
            };
            expect_values(
                dtype,
                &buf,
                want,
                &format!("{tag} all_reduce {}", op.name()),
            )?;
        }
    }
    // all_to_all: block j of rank q holds q*16+j.
    let b = 100;
    let send: Vec<u8> = (0..p * b).map(|i| (wr(r) * 16 + i / b) as u8).collect();
    let mut recv = vec![0u8; p * b];
    ok(t.all_to_all(&send, &mut recv), "all_to_all")?;
    ensure!(
        recv.iter()
            .enumerate()
            .all(|(i, v)| *v == (wr(i / b) * 16 + r) as u8),
        "{tag}: wrong all_to_all data"
    );
    // broadcast from the last rank, longer than one pipeline piece (1 MiB).
    let root = p - 1;
    let len = (5 << 20) / 2 + 3;
    let mut buf = if r == root {
        (0..len).map(|i| (i % 251) as u8).collect()
    } else {
        vec![0u8; len]
    };
    ok(t.broadcast(&mut buf, root), "broadcast")?;
    ensure!(
        buf.iter().enumerate().all(|(i, v)| *v == (i % 251) as u8),
        "{tag}: wrong broadcast data"
    );
    Ok(())
}

fn traffic(t: &MpiTransport) -> Check {
    let (r, p) = (t.rank(), t.size());
    let tr = t.traffic().ok_or("no traffic counters")?;
    let before = tr.snapshot();
    let chunk = 1000;
    let mut buf = vec![r as u8; p * chunk];
    ok(t.all_gather(&mut buf, chunk), "all_gather")?;
    let mine = tr.snapshot().since(&before);
    let all = ok(t.sum_traffic(&mine), "sum_traffic")?;
    for s in 0..p {
        for d in 0..p {
            let want = if d == (s + 1) % p {
                ((p - 1) * chunk) as u64
            } else {
                0
            };
            ensure!(
                all.bytes[s * p + d] == want,
                "traffic {s}->{d} is {}, want {want}",
                all.bytes[s * p + d]
            );
        }
    }
    Ok(())
}

fn splits(t: &MpiTransport) -> Check {
    let (r, p) = (t.rank(), t.size());
    // Two colors; key reverses the order inside each.
    let color = (r % 2) as u32;
    let child =
        ok(t.split(Some(color), -(r as i32)), "split")?.ok_or("split returned None for a color")?;
    let members: Vec<usize> = (0..p).rev().filter(|q| q % 2 == r % 2).collect();
    ensure!(
        child.size() == members.len(),
        "child size {} want {}",
        child.size(),
        members.len()
    );
    ensure!(
        child.world_rank(child.rank()) == r,
        "child rank {} maps to world {}",
        child.rank(),
        child.world_rank(child.rank())
    );
    ensure!(
        (0..child.size()).all(|q| child.world_rank(q) == members[q]),
        "child members differ from {members:?}"
    );
    collectives(child.as_ref(), &members, &format!("color {color}"))?;
    // A split where rank 0 stays out; then a grandchild of the others.
    let c = if r == 0 { None } else { Some(7) };
    let part = ok(t.split(c, 0), "split with None")?;
    ensure!(
        part.is_some() == (r != 0),
        "split(None) gave {:?} on rank {r}",
        part.is_some()
    );
    if let Some(part) = part {
        ensure!(
            part.size() == p - 1 && part.rank() == r - 1,
            "partial split rank {} of {}",
            part.rank(),
            part.size()
        );
        let mut buf = fill(DataType::F32, 5, |_| r as f64);
        ok(
            part.all_reduce(&mut buf, DataType::F32, ReduceOp::Sum),
            "all_reduce in partial split",
        )?;
        let want = (1..p).sum::<usize>() as f64;
        expect_values(DataType::F32, &buf, |_| want, "partial split all_reduce")?;
    }
    // The child records into the same traffic counters as its parent.
    ensure!(
        Arc::ptr_eq(&child.traffic().unwrap(), &t.traffic().unwrap()),
        "child traffic is not the parent's"
    );
    Ok(())
}

/// Communicators made by their members alone (`Transport::group`): the odd ranks make
/// one while the even ranks make theirs in reverse list order, then each runs the
/// collectives; a list missing the caller is refused.
fn groups(t: &MpiTransport) -> Check {
    let (r, p) = (t.rank(), t.size());
    let members: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).collect();
    let g = ok(t.group(&members), "group of members")?;
    ensure!(
        g.size() == members.len() && g.world_rank(g.rank()) == r,
        "group rank {} of {}",
        g.rank(),
        g.size()
    );
    ensure!(
        (0..g.size()).all(|q| g.world_rank(q) == members[q]),
        "group members differ from {members:?}"
    );
    collectives(g.as_ref(), &members, &format!("group {}", r % 2))?;
    // Only ranks 0 and p-1 take part; the others go straight on.
    if r == 0 || r == p - 1 {
        let pair = ok(t.group(&[0, p - 1]), "pair group")?;
        let mut buf = fill(DataType::F32, 3, |_| r as f64);
        ok(
            pair.all_reduce(&mut buf, DataType::F32, ReduceOp::Sum),
            "all_reduce in pair group",
        )?;
        expect_values(
            DataType::F32,
            &buf,
            |_| (p - 1) as f64,
            "pair group all_reduce",
        )?;
    }
    ok(t.barrier(), "barrier after groups")?;
    Ok(())
}

fn mismatch(t: &MpiTransport) -> Check {
    let r = t.rank();
    // Small (eager) and large (rendezvous) mismatches; afterwards the stream must be clean.
    for (sent, want) in [(8usize, 16usize), (16, 8), (3 << 20, 2 << 20)] {
        if r == 0 {
            ok(t.send(1, &vec![1u8; sent]), "send (mismatch)")?;
            ok(t.send(1, &[9u8; 24]), "send (after mismatch)")?;
        } else if r == 1 {
            let mut buf = vec![0u8; want];
            match t.recv(0, &mut buf) {
                Err(Error::InvalidUsage(m)) => {
                    let expect = format!(
                        "rank 0 sent {sent} bytes where rank 1 expected {want}: counts or dtypes differ across ranks"
                    );
                    ensure!(m == expect, "mismatch message is '{m}', want '{expect}'");
                }
                other => {
                    return Err(format!(
                        "recv of {want} bytes when {sent} were sent gave {other:?}"
                    ))
                }
            }
            let mut next = [0u8; 24];
            ok(t.recv(0, &mut next), "recv after mismatch")?;
            ensure!(next == [9u8; 24], "the message after a mismatch is wrong");
        }
    }
    ok(t.barrier(), "barrier")
}

fn timeouts_and_abort(t: &MpiTransport) -> Check {
    let r = t.rank();
    let short = ok(
        MpiTransport::world(None, Duration::from_millis(300)),
        "world (300 ms)",
    )?;
    if r == 1 {
        let start = Instant::now();
        let mut buf = [0u8; 4];
        match short.recv(0, &mut buf) {
            Err(Error::Remote(m)) => {
                ensure!(
                    m.contains("waited") && m.contains("rank 0"),
                    "timeout message '{m}'"
                );
            }
            other => return Err(format!("recv from a silent rank gave {other:?}")),
        }
        let took = start.elapsed();
        ensure!(took < Duration::from_secs(3), "timeout took {took:?}");
        // The transport stays usable after a timeout in the matching phase.
        ok(short.send(0, &[5u8; 3]), "send after timeout")?;
    }
    if r == 0 {
        // Rank 1 sends once its own 300 ms wait has failed: be late enough for that.
        std::thread::sleep(Duration::from_millis(1000));
        let mut buf = [0u8; 3];
        ok(short.recv(1, &mut buf), "recv after peer's timeout")?;
        ensure!(buf == [5u8; 3], "wrong data after peer's timeout");
    }
    ok(t.barrier(), "barrier")?;

    // A long send nobody receives times out too (the request may not be cancellable:
    // then the communicator is marked unusable, never left half-working).
    if r == 0 {
        let start = Instant::now();
        let res = short.send(1, &vec![3u8; 8 << 20]);
        ensure!(
            matches!(&res, Err(Error::Remote(m)) if m.contains("waited")),
            "unreceived send gave {res:?}"
        );
        ensure!(
            start.elapsed() < Duration::from_secs(3),
            "send timeout took {:?}",
            start.elapsed()
        );
        // OpenMPI cannot cancel sends: the communicator is then refused; where the library
        // cancels, it stays usable (and the tiny send completes eagerly).
        let again = short.send(1, &[1]);
        ensure!(
            again.is_ok() || matches!(&again, Err(Error::Remote(m)) if m.contains("unusable")),
            "send after a send timeout gave {again:?}"
        );
    }
    ok(t.barrier(), "barrier")?;

    // Abort wakes a waiter on another thread.
    let child: Arc<dyn Transport> =
        ok(t.split(Some(0), 0), "split for abort")?.ok_or("no child")?;
    let waiter = {
        let child = child.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4];
            let peer = (child.rank() + 1) % child.size();
            let start = Instant::now();
            (child.recv(peer, &mut buf), start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    child.abort();
    let (res, took) = waiter.join().map_err(|_| "waiter panicked")?;
    ensure!(
        matches!(&res, Err(Error::Remote(m)) if m.contains("aborted")),
        "recv on an aborted communicator gave {res:?}"
    );
    ensure!(
        took < Duration::from_secs(3),
        "abort took {took:?} to wake the waiter"
    );
    ensure!(
        matches!(child.send(0, &[1]), Err(Error::Remote(_))),
        "send after abort did not fail"
    );
    ok(t.barrier(), "barrier")
}

fn concurrent(t: &MpiTransport) -> Check {
    let (r, p) = (t.rank(), t.size());
    let a = ok(t.split(Some(0), r as i32), "split a")?.ok_or("no a")?;
    let b = ok(t.split(Some(0), r as i32), "split b")?.ok_or("no b")?;
    let run = |x: Arc<dyn Transport>, seed: f64| {
        std::thread::spawn(move || -> Check {
            for _ in 0..20 {
                let mut buf = fill(DataType::F32, 4099, |i| seed + (x.rank() + i % 5) as f64);
                ok(
                    x.all_reduce(&mut buf, DataType::F32, ReduceOp::Sum),
                    "concurrent all_reduce",
                )?;
                let p = x.size();
                expect_values(
                    DataType::F32,
                    &buf,
                    |i| (0..p).map(|q| seed + (q + i % 5) as f64).sum(),
                    "concurrent",
                )?;
            }
            Ok(())
        })
    };
    let (ha, hb) = (run(a, 1.0), run(b, 100.0));
    ha.join().map_err(|_| "thread a panicked")??;
    hb.join().map_err(|_| "thread b panicked")??;
    let _ = p;
    Ok(())
}

fn run() -> Check {
    let n = ok(MpiTransport::world_size_hint(), "world_size_hint")?;
    ensure!(n >= 2, "run under mpirun with at least 2 ranks (got {n})");
    match MpiTransport::world(Some(Topology::flat(n + 1)), Duration::from_secs(5)) {
        Err(Error::InvalidUsage(m)) => {
            ensure!(
                m.contains(&n.to_string()) && m.contains(&(n + 1).to_string()),
                "size message '{m}'"
            )
        }
        Err(e) => return Err(format!("wrong topology size gave {e}")),
        Ok(_) => return Err("wrong topology size accepted".into()),
    }
    let t = ok(
        MpiTransport::world(Some(Topology::flat(n)), Duration::from_secs(30)),
        "world",
    )?;
    ensure!(
        t.kind() == TransportKind::Mpi && t.size() == n,
        "world transport size {}",
        t.size()
    );
    p2p(&t)?;
    let everyone: Vec<usize> = (0..n).collect();
    collectives(&t, &everyone, "world")?;
    traffic(&t)?;
    splits(&t)?;
    groups(&t)?;
    mismatch(&t)?;
    timeouts_and_abort(&t)?;
    concurrent(&t)?;
    ok(t.barrier(), "final barrier")?;
    Ok(())
}

fn main() {
    let res = run();
    let rank = std::env::var("OMPI_COMM_WORLD_RANK")
        .ok()
        .or_else(|| std::env::var("PMI_RANK").ok())
        .unwrap_or_default();
    match res {
        Ok(()) => {
            let n = MpiTransport::world_size_hint().unwrap_or(0);
            finalize();
            finalize(); // idempotent
            if rank == "0" {
                println!("mpi_transport_check OK np={n}");
            }
        }
        Err(e) => {
            eprintln!("mpi_transport_check FAILED on rank {rank}: {e}");
            std::process::exit(1);
        }
    }
}
