//! Criterion benchmarks of the collectives on the local transport (8 ranks as threads,
//! nodes:2x4): ring, hier and ho-ring all-gather and reduce-scatter of 1 MiB and 8 MiB,
//! reported as bytes per second of the gathered / reduced buffer. On the local transport
//! this measures strata's own overhead (copies, reductions, scheduling), not a network.
//! `host-call`: the host path of one blocking call (`Comm::call`) on a communicator of
//! one rank, 8 bytes: the front's check and choice, the stream, the buffers' borrows and
//! the native op, with nothing on a wire (docs/perf.md, "Per-call cost on mpi"), and the
//! same calls through the C ABI (`c-abi`: `strataAllGather` / `strataAllReduce`).
//! `choose`: the hot path's algorithm choice (`choose_algo`) on a 128-rank communicator
//! (`nodes:16x8`, one rank's view) for one shape repeated and for 8 shapes in turn (a
//! training step's layers), beside the rule itself (`choose`: the estimates every call).
//! `cargo bench --bench collectives`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use strata::check::Kind;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, ReduceOp, Request, Topology};

fn run(comms: &[Comm], kind: Kind, algo: Algo, count: usize, iters: u64) -> Duration {
    let bar = Arc::new(Barrier::new(comms.len()));
    let hs: Vec<_> = comms
        .iter()
        .cloned()
        .map(|c| {
            let bar = bar.clone();
            std::thread::spawn(move || {
                let (ns, nr) = kind.sizes(count, c.size());
                let (s, r) = (Buffer::zeroed(ns * 4), Buffer::zeroed(nr * 4));
                let go = || {
                    c.submit(
                        Request::new(
                            kind.op(s.clone(), r.clone(), count, ReduceOp::Sum),
                            DataType::F32,
                        )
                        .with_algo(algo),
                    )
                    .and_then(|w| w.wait())
                    .expect("collective")
                };
                go(); // warm: creates the level communicators
                bar.wait();
                let t0 = Instant::now();
                for _ in 0..iters {
                    go();
                }
                t0.elapsed()
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
}

fn collectives(c: &mut Criterion) {
    let topo = Topology::parse("nodes:2x4").unwrap();
    let comms = Comm::local_world(8, Some(topo), CommConfig::default()).unwrap();
    for kind in [Kind::AllGather, Kind::ReduceScatter] {
        let mut g = c.benchmark_group(format!("local-nodes2x4/{}", kind.name()));
        g.sample_size(10)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_millis(500));
        for mib in [1usize, 8] {
            let total = mib << 20;
            let count = total / 4 / 8;
            g.throughput(Throughput::Bytes(total as u64));
            for algo in [Algo::Ring, Algo::Hier, Algo::HoRing] {
                g.bench_with_input(
                    BenchmarkId::new(algo.name(), format!("{mib}MiB")),
                    &count,
                    |b, &count| b.iter_custom(|iters| run(&comms, kind, algo, count, iters)),
                );
            }
        }
        g.finish();
    }
}

fn host_call(c: &mut Criterion) {
    let comm = Comm::local_world(1, None, CommConfig::default())
        .unwrap()
        .remove(0);
    let mut g = c.benchmark_group("host-call");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    // Named `ring`, and `auto` (the C ABI's default: the selector's estimates each call).
    for kind in [Kind::AllGather, Kind::AllReduce] {
        for algo in [Algo::Ring, Algo::Auto] {
            let (ns, nr) = kind.sizes(2, 1);
            let (s, r) = (Buffer::zeroed(ns * 4), Buffer::zeroed(nr * 4));
            let req = Request::new(kind.op(s, r, 2, ReduceOp::Sum), DataType::F32).with_algo(algo);
            g.bench_function(format!("{}/8B/{}", kind.name(), algo.name()), |b| {
                b.iter(|| comm.call(req.clone()).expect("call"))
            });
        }
    }
    // The same calls through the C ABI (`auto`, its default), as C, Python and the torch
    // backend make them: the boundary's checks and buffers on top of `Comm::call`.
    use strata::capi::*;
    let mut cc: strataComm_t = std::ptr::null_mut();
    // SAFETY: room for one handle; NULL topology and config (the defaults).
    let rc = unsafe { strataCommInitLocal(&mut cc, 1, std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, strataSuccess);
    let (send, mut recv) = ([1f32; 2], [0f32; 2]);
    let (sp, rp) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
    g.bench_function("all-gather/8B/c-abi", |b| {
        // SAFETY: 8 readable / writable bytes each (one rank); live communicator; no stream.
        b.iter(|| unsafe { strataAllGather(sp, rp, 2, strataFloat32, cc, std::ptr::null_mut()) })
    });
    g.bench_function("all-reduce/8B/c-abi", |b| {
        // SAFETY: as above.
        b.iter(|| unsafe {
            strataAllReduce(
                sp,
                rp,
                2,
                strataFloat32,
                strataSum,
                cc,
                std::ptr::null_mut(),
            )
        })
    });
    // SAFETY: a live communicator, destroyed once.
    unsafe { strataCommDestroy(cc) };
    g.finish();
}

fn choose(c: &mut Criterion) {
    // One rank of a 128-rank world seen through its own communicator: the rule reads
    // the topology and members only, so the world's other ranks need not exist.
    let topo = Topology::parse("nodes:16x8").unwrap();
    let comm = Comm::local_world(1, None, CommConfig::default())
        .unwrap()
        .remove(0);
    let big = strata::comm::Comm::local_world(128, Some(topo), CommConfig::default())
        .map(|mut v| v.remove(0));
    let comm = big.unwrap_or(comm);
    let reqs: Vec<Request> = (0..8)
        .map(|i| {
            let n = 1000 + 4096 * i;
            let (s, r) = (Buffer::zeroed(n * 4), Buffer::zeroed(n * 4));
            Request::new(Kind::AllReduce.op(s, r, n, ReduceOp::Sum), DataType::F32)
        })
        .collect();
    let mut g = c.benchmark_group("choose");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    g.bench_function("rule/128", |b| b.iter(|| comm.choose(&reqs[0]).algo));
    g.bench_function("remembered/1-shape/128", |b| {
        b.iter(|| strata::algo::select::choose_algo(comm.core(), &reqs[0]))
    });
    let mut i = 0;
    g.bench_function("remembered/8-shapes/128", |b| {
        b.iter(|| {
            i = (i + 1) % reqs.len();
            strata::algo::select::choose_algo(comm.core(), &reqs[i])
        })
    });
    g.finish();
}

criterion_group!(benches, collectives, host_call, choose);
criterion_main!(benches);
