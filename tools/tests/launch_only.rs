//! The launch-only contract (architecture: "Launch-only"), on `host-local` worlds where the
//! CPU device is a stricter CUDA: for every algorithm x op x group form, a stream-ordered
//! call makes no host wait for the device between its entry and its return (strict mode
//! refuses one, and the count stays 0), not even a first call for its set-up (new blocks
//! are allocated in stream order; `waits::thread_outside_count` stays 0), no two threads
//! are inside calls on one rank's communicators at once (the device-local transport
//! refuses it), the caller's current device is the same after the call, and the results
//! equal the plain reference. Then each check is shown to fire when its property is
//! broken on purpose, and a call with a 500 ms delay queued ahead on its stream returns at
//! once: 100 back-to-back calls all return before the first completes.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::check::{self, Kind};
use strata::device::{cpu, waits, DevStream};
use strata::kernels::QuantSpec;
use strata::{Algo, Buffer, Comm, DataType, Error, Op, ReduceOp, Request, Topology};

/// A world of `topo` on its own CPU device (`ordinal`: tests run in parallel processes,
/// but keep devices apart anyway).
fn world(ordinal: usize, topo: &str, timeout: Duration) -> Vec<Comm> {
    let topo = Topology::parse(topo).expect("topology");
    let n = topo.world_size();
    let cfg = strata::CommConfig {
        timeout,
        ..common::config()
    };
    Comm::host_local_world_on(ordinal, n, Some(topo), cfg).expect("world")
}

#[derive(Clone, Copy, Debug)]
enum Form {
    /// `enqueue` on the caller's stream.
    Alone,
    /// Inside `group_start` / `group_end`.
    Grouped,
    /// Two calls (the case and the same again on other buffers) in one group.
    Pair,
    /// `submit` without a stream: complete when the watchdog sees its end event.
    Submit,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    algo: Algo,
    kind: Kind,
    redop: ReduceOp,
    quant: Option<(u32, usize)>,
    coalesced: bool,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let plain = |algo, kind, redop| Case {
        algo,
        kind,
        redop,
        quant: None,
        coalesced: false,
    };
    for algo in Algo::LOSSLESS {
        v.push(plain(algo, Kind::AllGather, ReduceOp::Sum));
        v.push(plain(algo, Kind::ReduceScatter, ReduceOp::Avg));
        v.push(plain(algo, Kind::AllReduce, ReduceOp::Sum));
    }
    for algo in [Algo::Ring, Algo::Hier] {
        for (kind, redop) in [
            (Kind::AllGather, ReduceOp::Sum),
            (Kind::ReduceScatter, ReduceOp::Max),
        ] {
            v.push(Case {
                coalesced: true,
                ..plain(algo, kind, redop)
            });
        }
    }
    for (algo, kind) in [
        (Algo::Qgz, Kind::ReduceScatter),
        (Algo::Qgz1, Kind::ReduceScatter),
        (Algo::Qwz, Kind::AllGather),
    ] {
        v.push(Case {
            quant: Some((8, 64)),
            ..plain(algo, kind, ReduceOp::Avg)
        });
    }
    v.push(plain(Algo::Ring, Kind::AllToAll, ReduceOp::Sum));
    v.push(plain(
        Algo::Ring,
        Kind::Broadcast { root: 1 },
        ReduceOp::Sum,
    ));
    v
}

const COUNT: usize = 37;
const COUNTS: [usize; 3] = [COUNT, 3, 9];

/// One call's buffers and how to check them.
struct Call {
    req: Request,
    recvs: Vec<Buffer>,
    seeds: Vec<u64>,
}

fn build(c: &Comm, case: &Case, seed: u64) -> strata::Result<Call> {
    let (p, r, dt) = (c.size(), c.rank(), DataType::F32);
    let s = dt.size();
    if case.coalesced {
        let (mut sends, mut recvs, mut seeds) = (Vec::new(), Vec::new(), Vec::new());
        for (t, &n) in COUNTS.iter().enumerate() {
            let sd = seed + t as u64;
            sends.push(c.native_from(&case.kind.input(dt, r, n, p, sd))?);
            recvs.push(c.native_from(&vec![0xA5; case.kind.sizes(n, p).1 * s])?);
            seeds.push(sd);
        }
        let op = case
            .kind
            .coalesced(sends, recvs.clone(), COUNTS.to_vec(), case.redop)?;
        let req = Request::new(op, dt).with_algo(case.algo);
        return Ok(Call { req, recvs, seeds });
    }
    let (ns, nr) = case.kind.sizes(COUNT, p);
    let input = match case.quant {
        Some(_) => check::fill(dt, r, 0, ns, seed),
        None => case.kind.input(dt, r, COUNT, p, seed),
    };
    let send = c.native_from(&input)?;
    let recv = c.native_from(&vec![0xA5; nr * s])?;
    let mut req =
        Request::new(case.kind.op(send, recv.clone(), COUNT, case.redop), dt).with_algo(case.algo);
    if let Some((bits, block)) = case.quant {
        req = req.with_quant(QuantSpec::new(bits, block)?);
    }
    Ok(Call {
        req,
        recvs: vec![recv],
        seeds: vec![seed],
    })
}

/// Wrong elements of `call`'s results (after its stream was synchronized).
fn wrong(c: &Comm, case: &Case, call: &Call) -> strata::Result<usize> {
    let (p, r, dt) = (c.size(), c.rank(), DataType::F32);
    if let Some((bits, block)) = case.quant {
        let got = call.recvs[0].to_bytes()?;
        let q = QuantSpec::new(bits, block)?;
        let quant = check::QuantCase {
            kind: case.kind,
            dtype: dt,
            redop: case.redop,
            count: COUNT,
            algo: case.algo,
            q,
            seed: call.seeds[0],
        };
        return Ok(check::check_quant(c, &quant, &got)?.wrong);
    }
    let counts: &[usize] = if case.coalesced { &COUNTS } else { &[COUNT] };
    let mut w = 0;
    for ((recv, &n), &sd) in call.recvs.iter().zip(counts).zip(&call.seeds) {
        let want = case.kind.expected(dt, case.redop, r, n, p, sd);
        w += check::count_wrong(dt, &recv.to_bytes()?, &want, p);
    }
    Ok(w)
}

/// Run `calls` in `form` on `stream`; the works.
fn run(
    c: &Comm,
    form: Form,
    stream: &Arc<dyn DevStream>,
    calls: Vec<Request>,
) -> strata::Result<Vec<strata::Work>> {
    let grouped = matches!(form, Form::Grouped | Form::Pair);
    if grouped {
        strata::group_start();
    }
    let ws: strata::Result<Vec<_>> = calls
        .into_iter()
        .map(|req| match form {
            Form::Submit => c.submit(req),
            _ => c.enqueue(req, stream),
        })
        .collect();
    if grouped {
        strata::group_end()?;
    }
    ws
}

/// Every case in every form on every rank of `topo`: (case, form, wrong elements).
fn launch_matrix(ordinal: usize, topo: &str) {
    waits::set_strict(true);
    let comms = world(ordinal, topo, Duration::from_secs(60));
    let out = common::on_comms(comms, |c| {
        let stream = c.device().expect("device").new_stream()?;
        let mut bad = Vec::new();
        let mut checked = 0;
        // Launches run on their calling thread: this rank's host waits are this thread's.
        let before = waits::thread_count();
        let set_up_before = waits::thread_outside_count();
        let mut seed = 100;
        for case in cases() {
            for form in [Form::Alone, Form::Grouped, Form::Pair, Form::Submit] {
                // Warm-up (the first call of a shape allocates its arena blocks), then
                // the checked round.
                for round in 0..2 {
                    seed += 3;
                    let n = if matches!(form, Form::Pair) { 2 } else { 1 };
                    let calls: Vec<Call> = (0..n)
                        .map(|k| build(&c, &case, seed + 50 * k))
                        .collect::<strata::Result<_>>()?;
                    let reqs = calls.iter().map(|k| k.req.clone()).collect();
                    cpu::set_current_device(Some(9));
                    let ws = run(&c, form, &stream, reqs)
                        .map_err(|e| e.in_collective(|| format!("{case:?} {form:?}")))?;
                    let current = cpu::current_device();
                    cpu::set_current_device(None);
                    // Host waits from here on are the test's own.
                    let s: &dyn DevStream = stream.as_ref();
                    strata::device::finish(s, Duration::from_secs(60), "test", || Ok(()))?;
                    for w in &ws {
                        w.wait()
                            .map_err(|e| e.in_collective(|| format!("{case:?} {form:?}")))?;
                    }
                    if current != Some(9) {
                        bad.push(format!("{case:?} {form:?}: current device {current:?}"));
                    }
                    if round == 1 {
                        checked += calls.len();
                        for k in &calls {
                            let w = wrong(&c, &case, k)?;
                            if w != 0 {
                                bad.push(format!("{case:?} {form:?}: {w} wrong"));
                            }
                        }
                    }
                }
            }
        }
        let waited = waits::thread_count() - before;
        let set_up = waits::thread_outside_count() - set_up_before;
        Ok((bad, checked, waited, set_up, waits::last()))
    });
    let calls = cases().len() * 5;
    for (r, o) in out.into_iter().enumerate() {
        let (bad, checked, waited, set_up, last) =
            o.unwrap_or_else(|e| panic!("{topo} rank {r}: {e}"));
        assert!(bad.is_empty(), "{topo} rank {r}: {bad:#?}");
        assert_eq!(checked, calls, "{topo} rank {r}: calls checked");
        assert_eq!(
            waited, 0,
            "{topo} rank {r}: host waits inside launched calls"
        );
        assert_eq!(
            set_up, 0,
            "{topo} rank {r}: host waits for the first calls' set-up (last: {last:?})"
        );
    }
}

/// An f32 all-gather of `count` elements per rank.
fn all_gather_f32(send: Buffer, recv: Buffer, count: usize) -> Request {
    Request::new(Op::AllGather { send, recv, count }, DataType::F32)
}

#[test]
fn every_algorithm_and_form_launches_without_host_waits_two_nodes() {
    launch_matrix(21, "nodes:2x2");
}

#[test]
fn every_algorithm_and_form_launches_without_host_waits_odd_nodes() {
    launch_matrix(22, "nodes:3x2");
}

/// Broken on purpose: a host wait for the device made while a call is being launched is
/// refused in strict mode and counted.
#[test]
fn a_host_wait_inside_a_launch_is_caught() {
    waits::set_strict(true);
    let comms = world(23, "nodes:1x1", Duration::from_secs(10));
    let b = comms[0].native_from(&[1, 2, 3, 4]).unwrap();
    let before = waits::thread_count();
    let e = {
        let _l = waits::launching();
        b.to_bytes().unwrap_err()
    };
    assert!(e.to_string().contains("host wait"), "{e}");
    assert_eq!(waits::thread_count(), before + 1);
    assert_eq!(
        b.to_bytes().unwrap(),
        vec![1, 2, 3, 4],
        "outside a launch it works"
    );
}

/// Broken on purpose: two threads inside calls on one rank's communicators at once (its
/// world's and its node's) are refused, naming both calls.
#[test]
fn two_threads_inside_one_ranks_communicators_are_caught() {
    let comms = world(24, "nodes:1x2", Duration::from_secs(3));
    let nodes: Vec<Comm> = common::on_comms(comms.clone(), |c| c.node_comm())
        .into_iter()
        .map(|n| n.expect("node communicator"))
        .collect();
    let (c0, node) = (comms[0].clone(), nodes[0].clone());
    let buf = c0.native_from(&[0u8; 16]).unwrap();
    let b2 = node.native_from(&[0u8; 16]).unwrap();
    let blocked = {
        let (c0, buf) = (c0.clone(), buf.clone());
        // Rank 1 never calls: this all-reduce stays inside its rendezvous.
        std::thread::spawn(move || c0.all_reduce(&buf, &buf, 4, DataType::F32, ReduceOp::Sum))
    };
    std::thread::sleep(Duration::from_millis(300));
    let e = node
        .all_reduce(&b2, &b2, 4, DataType::F32, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("two threads"),
        "{e}"
    );
    let r = blocked.join().unwrap().and_then(|w| w.wait());
    assert!(
        r.is_err(),
        "rank 1 never called, so the blocked call must fail"
    );
}

/// Broken on purpose: a bind whose guard is leaked leaves the thread on another device,
/// which is what the matrix's current-device check sees.
#[test]
fn a_device_left_current_is_caught() {
    let dev = strata::device::open(strata::device::Api::Cpu, 25).unwrap();
    cpu::set_current_device(Some(9));
    let g = dev.bind().unwrap();
    std::mem::forget(g);
    assert_eq!(cpu::current_device(), Some(25));
    cpu::set_current_device(None);
    {
        let _g = dev.bind().unwrap();
        assert_eq!(cpu::current_device(), Some(25));
    }
    assert_eq!(cpu::current_device(), None);
}

/// A call with a 2 s delay queued ahead on its stream returns at once: 100
/// back-to-back calls all return before the first one completes, and all are right.
/// (The delay was 500 ms: on a loaded 2-core machine the 100 calls once took 1.56 s.)
#[test]
fn back_to_back_calls_return_before_the_first_completes() {
    waits::set_strict(true);
    let comms = world(26, "nodes:1x2", Duration::from_secs(60));
    let out = common::on_comms(comms, |c| {
        let (p, r) = (c.size(), c.rank());
        let s = c.device().expect("device").new_stream()?;
        let sends: Vec<Buffer> = (0..100)
            .map(|i| c.native_from(&((r * 1000 + i) as f32).to_le_bytes()))
            .collect::<strata::Result<_>>()?;
        let recvs: Vec<Buffer> = (0..100)
            .map(|_| c.alloc_native(p * 4))
            .collect::<strata::Result<_>>()?;
        // One warm-up call of the shape.
        let warm = c.enqueue(all_gather_f32(sends[0].clone(), recvs[0].clone(), 1), &s)?;
        warm.wait()?;
        s.delay(Duration::from_secs(2))?;
        let t = Instant::now();
        let mut ws = Vec::new();
        for i in 0..100 {
            let req = all_gather_f32(sends[i].clone(), recvs[i].clone(), 1);
            ws.push(c.enqueue(req, &s)?);
        }
        let returned = t.elapsed();
        let first_done = ws[0].is_done();
        for w in &ws {
            w.wait()?;
        }
        let mut right = true;
        for (i, b) in recvs.iter().enumerate() {
            let want: Vec<u8> = (0..p)
                .flat_map(|j| ((j * 1000 + i) as f32).to_le_bytes())
                .collect();
            right &= b.to_bytes()? == want;
        }
        Ok((returned, first_done, right))
    });
    for (r, o) in out.into_iter().enumerate() {
        let (returned, first_done, right) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(
            !first_done,
            "rank {r}: the first call completed before the 100th returned ({returned:?})"
        );
        assert!(right, "rank {r}: wrong results");
    }
}

/// The all-gather of every rank's `fill(F32, rank, 0, n, seed)` over `p` ranks.
fn gathered(p: usize, n: usize, seed: u64) -> Vec<u8> {
    (0..p)
        .flat_map(|j| check::fill(DataType::F32, j, 0, n, seed))
        .collect()
}

/// Every rank returned `Ok(true)`.
fn all_right(out: Vec<strata::Result<bool>>) {
    for (r, o) in out.into_iter().enumerate() {
        assert!(
            o.unwrap_or_else(|e| panic!("rank {r}: {e}")),
            "rank {r}: wrong"
        );
    }
}

/// Memory mapped in pieces (as PyTorch's `expandable_segments` allocator maps one range
/// with several cuMemMap calls): the device accepts a range across mappings, and a
/// launched all-gather whose input and output straddle mapping boundaries is right.
#[test]
fn buffers_over_several_mappings_are_accepted() {
    let ordinal = 27;
    let comms = world(ordinal, "nodes:1x2", Duration::from_secs(30));
    let dev = comms[0].device().expect("device");
    let (p, n) = (2usize, 3000usize);
    // Each rank's [send | recv] lies in one range of three mappings; both straddle a
    // boundary (at 4 KiB and at 12 KiB).
    let pieces = [4096, 8192, 32768];
    let bases: Vec<u64> = (0..p)
        .map(|_| cpu::alloc_mapped(ordinal, &pieces).expect("mapped memory"))
        .collect();
    for &b in &bases {
        dev.check_pointer(b, pieces.iter().sum())
            .expect("the whole range");
        dev.check_pointer(b + 4000, 200)
            .expect("across the first boundary");
        let e = dev.check_pointer(b + 40_000, 10_000).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
    }
    let shared = bases.clone();
    let out = common::on_comms(comms, move |c| {
        let r = c.rank();
        let base = shared[r];
        let dev = c.device().expect("device");
        // SAFETY: the range is live mapped memory of this device for the whole test and
        // nothing else uses it.
        let (send, recv) = unsafe {
            (
                Buffer::from_device_ptr(&dev, base + 100, n * 4),
                Buffer::from_device_ptr(&dev, base + 12_000, p * n * 4),
            )
        };
        send.write_bytes(&check::fill(DataType::F32, r, 0, n, 5))?;
        let s = dev.new_stream()?;
        let req = all_gather_f32(send, recv.clone(), n).with_algo(Algo::Ring);
        c.enqueue(req, &s)?.wait()?;
        Ok(recv.to_bytes()? == gathered(p, n, 5))
    });
    all_right(out);
    for b in bases {
        cpu::free_mapped(ordinal, b).expect("free");
    }
}

/// A launched call owns its buffers until the device has run it: the request held the
/// only handle on its input, the call returned long before its stream reached it (a
/// 300 ms delay ahead), and the same size allocated and overwritten meanwhile must not
/// get that memory (it would while the call still reads it).
#[test]
fn buffers_given_away_live_until_the_call_ends() {
    waits::set_strict(true);
    let comms = world(28, "nodes:1x2", Duration::from_secs(30));
    let out = common::on_comms(comms, |c| {
        let (p, r, n) = (c.size(), c.rank(), 4096usize);
        let s = c.device().expect("device").new_stream()?;
        let recv = c.alloc_native(p * n * 4)?;
        s.delay(Duration::from_millis(300))?;
        let send = c.native_from(&check::fill(DataType::F32, r, 0, n, 9))?;
        let req = all_gather_f32(send, recv.clone(), n);
        let w = c.enqueue(req, &s)?;
        // Churn the device cache with the same size class while the call waits.
        let churn: Vec<Buffer> = (0..4)
            .map(|_| c.native_from(&vec![0x5A; n * 4]))
            .collect::<strata::Result<_>>()?;
        w.wait()?;
        drop(churn);
        Ok(recv.to_bytes()? == gathered(p, n, 9))
    });
    all_right(out);
}
