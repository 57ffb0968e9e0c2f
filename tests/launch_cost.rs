//! What a launched call costs its caller's stream, and how its failures reach the caller,
//! on `host-local` (the CPU device counts every entry the host makes on a stream:
//! [`strata::device::cpu::entries`]). The contract ("launch cost", docs/gpu.md, "Entries
//! per call"): a collective that is one transport call is that call on the caller's
//! stream plus one end event; on `nccl` that is the vendor's kernel and the event, two
//! entries, where NCCL alone puts one and `ProcessGroupNCCL` two.

mod common;

use std::sync::Arc;
use std::time::Duration;
use strata::device::cpu::entries;
use strata::device::DevStream;
use strata::transport::gpu::DevCall;
use strata::{Algo, Buffer, Comm, DataType, Op, ReduceOp, Request, Topology};

fn world(ordinal: usize, spec: &str) -> Vec<Comm> {
    let topo = Topology::parse(spec).expect("topology");
    let n = topo.world_size();
    Comm::host_local_world_on(ordinal, n, Some(topo), common::config()).expect("world")
}

fn sync(s: &Arc<dyn DevStream>) -> strata::Result<()> {
    let s: &dyn DevStream = s.as_ref();
    strata::device::finish(s, Duration::from_secs(20), "test", || Ok(()))
}

/// The calls measured, in place as the transport's own calls below: rank `r`'s
/// all-gather sends its chunk of `recv`, the reduce-scatters reduce `recv` into `send`.
fn call(which: &str, send: &Buffer, recv: &Buffer, n: usize, r: usize) -> Request {
    let dt = DataType::F32;
    let req = match which {
        "all-gather" => Request::new(
            Op::AllGather {
                send: recv.slice(r * 64..(r + 1) * 64).expect("chunk"),
                recv: recv.clone(),
                count: 16,
            },
            dt,
        ),
        "reduce-scatter" | "reduce-scatter avg" => Request::new(
            Op::ReduceScatter {
                send: recv.clone(),
                recv: send.clone(),
                count: 16,
                op: if which.ends_with("avg") {
                    ReduceOp::Avg
                } else {
                    ReduceOp::Sum
                },
            },
            dt,
        ),
        _ => Request::new(
            Op::AllReduce {
                send: recv.clone(),
                recv: recv.clone(),
                count: 16 * n,
                op: ReduceOp::Sum,
            },
            dt,
        ),
    };
    req.with_algo(Algo::Ring)
}

/// The same collective as the transport's own call on `s` (the device face, launched on
/// that stream), what strata's launch is measured against.
fn transport_call(
    c: &Comm,
    on: &Arc<dyn DevStream>,
    which: &str,
    send: &Buffer,
    recv: &Buffer,
) -> strata::Result<()> {
    let g = c.transport().gpu().expect("a device transport");
    let to = Duration::from_secs(20);
    match which {
        "all-gather" => {
            let buf = recv.dev_write_timeout(to)?;
            let c = DevCall::AllGather {
                buf: buf.region(),
                chunk: 64,
            };
            g.call(Some(on), c)
        }
        "all-reduce" => {
            let buf = recv.dev_write_timeout(to)?;
            let (dtype, op) = (DataType::F32, ReduceOp::Sum);
            let c = DevCall::AllReduce {
                buf: buf.region(),
                dtype,
                op,
            };
            g.call(Some(on), c)
        }
        _ => {
            let (i, o) = (recv.dev_read_timeout(to)?, send.dev_write_timeout(to)?);
            let (send, recv) = (i.region(), o.region());
            let (dtype, op) = (DataType::F32, ReduceOp::Sum);
            g.call(
                Some(on),
                DevCall::ReduceScatter {
                    send,
                    recv,
                    dtype,
                    op,
                },
            )
        }
    }
}

/// Per rank and call: the entries strata's launched call put on its caller's stream
/// and those of the transport's own call, in steady state (after a warm-up of each).
#[test]
fn a_one_call_collective_adds_one_entry_to_the_transports_own() {
    for (ordinal, spec) in [(61, "nodes:1x1"), (62, "nodes:1x2"), (63, "nodes:1x3")] {
        let out = common::on_comms(world(ordinal, spec), |c| {
            let n = c.size();
            let dev = c.device().expect("device");
            let s = dev.new_stream()?;
            let send = c.native_from(&vec![1u8; 64])?;
            let recv = c.alloc_native(64 * n)?;
            let mut rows = Vec::new();
            for which in [
                "all-gather",
                "all-reduce",
                "reduce-scatter",
                "reduce-scatter avg",
            ] {
                let mut strata_n = 0;
                let mut own_n = 0;
                for _ in 0..2 {
                    let before = entries(s.as_ref())?;
                    let w = c.enqueue(call(which, &send, &recv, n, c.rank()), &s)?;
                    strata_n = entries(s.as_ref())? - before;
                    w.wait()?;
                    let before = entries(s.as_ref())?;
                    transport_call(&c, &s, which, &send, &recv)?;
                    own_n = entries(s.as_ref())? - before;
                    sync(&s)?;
                }
                rows.push((which, strata_n, own_n));
            }
            Ok(rows)
        });
        for (r, o) in out.into_iter().enumerate() {
            for (which, strata_n, own) in o.unwrap_or_else(|e| panic!("{spec} rank {r}: {e}")) {
                // An Avg on a transport without the library's own mean adds the
                // division kernel (ncclAvg makes it one call on nccl).
                let extra = if which.ends_with("avg") { 2 } else { 1 };
                assert_eq!(
                    strata_n,
                    own + extra,
                    "{spec} rank {r} {which}: strata put {strata_n} entries on the caller's \
                     stream, the transport's own call {own}"
                );
            }
        }
    }
}

/// Grouped one-call collectives on one stream: each is the transport's call on the
/// caller's stream, and the group's calls share one end event.
#[test]
fn grouped_one_call_collectives_share_one_end_event() {
    let out = common::on_comms(world(66, "nodes:1x2"), |c| {
        let n = c.size();
        let dev = c.device().expect("device");
        let s = dev.new_stream()?;
        let send = c.native_from(&vec![1u8; 64])?;
        let recv = c.alloc_native(64 * n)?;
        let bufs: Vec<Buffer> = (0..4)
            .map(|_| c.alloc_native(64 * n))
            .collect::<strata::Result<_>>()?;
        let (mut got, mut own) = (0, 0);
        for _ in 0..2 {
            let before = entries(s.as_ref())?;
            strata::group_start();
            let ws: Vec<_> = bufs
                .iter()
                .map(|b| c.enqueue(call("all-reduce", &send, b, n, c.rank()), &s))
                .collect();
            strata::group_end()?;
            got = entries(s.as_ref())? - before;
            for w in ws {
                w?.wait()?;
            }
            let before = entries(s.as_ref())?;
            transport_call(&c, &s, "all-reduce", &send, &recv)?;
            own = entries(s.as_ref())? - before;
            sync(&s)?;
        }
        Ok((got, own))
    });
    for (r, o) in out.into_iter().enumerate() {
        let (got, own) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(
            got,
            4 * own + 1,
            "rank {r}: 4 grouped calls, the transport's own {own} each"
        );
    }
}

/// A communicator's launched calls run in launch order on the device whatever streams
/// they name (as NCCL orders a communicator's calls): an all-reduce held on one stream,
/// then an all-gather of its result on another, then a multi-stage call and a `submit`
/// without a stream, each seeing the one before.
#[test]
fn launched_calls_on_several_streams_run_in_launch_order() {
    let out = common::on_comms(world(67, "nodes:2x2"), |c| {
        let (n, r) = (c.size(), c.rank());
        let dev = c.device().expect("device");
        let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
        let buf = c.native_from(&1.0f32.to_le_bytes().repeat(16 * n))?;
        let (g1, g2) = (c.alloc_native(64 * n)?, c.alloc_native(64 * n)?);
        let gather = |out: &Buffer| {
            Request::new(
                Op::AllGather {
                    send: buf.slice(r * 64..(r + 1) * 64).expect("chunk"),
                    recv: out.clone(),
                    count: 16,
                },
                DataType::F32,
            )
        };
        s1.delay(Duration::from_millis(100))?;
        c.enqueue(
            call("all-reduce", &buf, &buf, n, r).with_algo(Algo::Ring),
            &s1,
        )?;
        c.enqueue(gather(&g1).with_algo(Algo::Ring), &s2)?;
        c.enqueue(gather(&g2).with_algo(Algo::Hier), &s1)?;
        c.submit(call("all-reduce", &buf, &buf, n, r))?.wait()?;
        sync(&s1)?;
        sync(&s2)?;
        let (a, b, d): (Vec<f32>, Vec<f32>, Vec<f32>) = (g1.to_vec()?, g2.to_vec()?, buf.to_vec()?);
        Ok((a, b, d))
    });
    for (r, o) in out.into_iter().enumerate() {
        let (a, b, d) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(
            a.iter().all(|&v| v == 4.0),
            "rank {r}: the gather on the second stream ran before the all-reduce: {:?}",
            &a[..2]
        );
        assert!(
            b.iter().all(|&v| v == 4.0),
            "rank {r}: hier gather: {:?}",
            &b[..2]
        );
        assert!(
            d.iter().all(|&v| v == 16.0),
            "rank {r}: the last all-reduce: {:?}",
            &d[..2]
        );
    }
}

/// A multi-stage algorithm keeps the general path: the caller's stream gets the fork's
/// event and the join's wait, nothing else (its stages run on strata's streams).
#[test]
fn a_multi_stage_call_puts_two_entries_on_the_callers_stream() {
    let out = common::on_comms(world(64, "nodes:2x2"), |c| {
        let n = c.size();
        let s = c.device().expect("device").new_stream()?;
        let send = c.native_from(&vec![1u8; 64])?;
        let recv = c.alloc_native(64 * n)?;
        let mut got = 0;
        for _ in 0..2 {
            let req = call("all-gather", &send, &recv, n, c.rank()).with_algo(Algo::Hier);
            let before = entries(s.as_ref())?;
            let w = c.enqueue(req, &s)?;
            got = entries(s.as_ref())? - before;
            w.wait()?;
        }
        Ok(got)
    });
    for (r, o) in out.into_iter().enumerate() {
        assert_eq!(o.unwrap_or_else(|e| panic!("rank {r}: {e}")), 2, "rank {r}");
    }
}

/// A launched call whose communicator is aborted before the call was seen complete
/// fails: its `wait()` returns the error (never a success), and the next call fails.
#[test]
fn an_aborted_launched_call_reports_its_failure() {
    let out = common::on_comms(world(65, "nodes:1x1"), |c| {
        let s = c.device().expect("device").new_stream()?;
        let send = c.native_from(&vec![1u8; 64])?;
        let recv = c.alloc_native(64)?;
        // A warm call completes.
        c.enqueue(call("all-reduce", &send, &recv, 1, 0), &s)?
            .wait()?;
        // Then one held behind a delay, aborted while it waits.
        s.delay(Duration::from_millis(300))?;
        let w = c.enqueue(call("all-reduce", &send, &recv, 1, 0), &s)?;
        c.abort();
        let waited = w.wait();
        let next = c.enqueue(call("all-reduce", &send, &recv, 1, 0), &s);
        sync(&s)?;
        Ok((waited.is_err(), next.is_err()))
    });
    let (waited, next) = out.into_iter().next().unwrap().expect("rank 0");
    assert!(waited, "the aborted call's wait() returned success");
    assert!(next, "the call after the abort was accepted");
}
