//! Empty calls inside launched groups, on `host-local` (the CPU device standing for a GPU;
//! `cuda-local` and the vendor transports take the same group path): a zero-byte call
//! beside launched ones in one group is completed by the group, the share stays
//! launched (no host wait at the group's end), and the link probe, which measures each
//! link class beside a zero-byte partner class, runs on every multi-class topology.

mod common;

use std::sync::Arc;
use std::time::Duration;
use strata::comm::probe::{self, ProbeOptions};
use strata::device::waits;
use strata::{Buffer, Comm, DataType, Op, Request, Topology};

/// A `host-local` world of `spec` on its own CPU device (tests run in parallel).
fn world(ordinal: usize, spec: &str) -> Vec<Comm> {
    let topo = Topology::parse(spec).expect("topology");
    let n = topo.world_size();
    Comm::host_local_world_on(ordinal, n, Some(topo), common::config()).expect("world")
}

fn send(buf: &Buffer, peer: usize) -> Request {
    Request::new(
        Op::Send {
            buf: buf.clone(),
            count: buf.len(),
            peer,
        },
        DataType::U8,
    )
}

fn recv(buf: &Buffer, peer: usize) -> Request {
    Request::new(
        Op::Recv {
            buf: buf.clone(),
            count: buf.len(),
            peer,
        },
        DataType::U8,
    )
}

/// One group per rank of a ring: a launched send and receive of 1 KiB beside a
/// zero-byte send and receive (the probe's partner class), by `enqueue` on a stream and
/// by `submit`; then an empty call after a launched one it depends on. Every call
/// completes, the bytes arrive, and the group's end makes no host wait.
#[test]
fn an_empty_call_beside_launched_ones_is_completed_by_the_group() {
    waits::set_strict(true);
    let out = common::on_comms(world(41, "nodes:2x2"), |c| {
        let (p, r) = (c.size(), c.rank());
        let (to, from) = ((r + 1) % p, (r + p - 1) % p);
        let stream = c.device().expect("device").new_stream()?;
        let data: Vec<u8> = (0..1024).map(|i| (i * 7 + r * 31) as u8).collect();
        let (s, d) = (c.native_from(&data)?, c.alloc_native(1024)?);
        let (e0, e1) = (c.alloc_native(0)?, c.alloc_native(0)?);
        let mut waited = 0;
        for stream_ordered in [true, false] {
            let before = waits::thread_count();
            strata::group_start();
            let mut ws = Vec::new();
            for req in [send(&s, to), recv(&d, from), send(&e0, to), recv(&e1, from)] {
                ws.push(if stream_ordered {
                    c.enqueue(req, &stream)
                } else {
                    c.submit(req)
                });
            }
            strata::group_end()?;
            waited += waits::thread_count() - before;
            for w in ws {
                w?.wait()?;
            }
            let s: &dyn strata::device::DevStream = stream.as_ref();
            strata::device::finish(s, Duration::from_secs(20), "test", || Ok(()))?;
            let want: Vec<u8> = (0..1024).map(|i| (i * 7 + from * 31) as u8).collect();
            assert_eq!(d.to_bytes()?, want, "rank {r}: received bytes");
        }
        // An empty call depending on a launched one still in the group's share.
        strata::group_start();
        let first = c.enqueue(send(&s, to), &stream);
        let second = c.enqueue(recv(&d, from), &stream);
        let after = first
            .as_ref()
            .ok()
            .map(|w| c.submit(send(&e0, to).after([w.clone()])));
        let empty_recv = c.submit(recv(&e1, from));
        strata::group_end()?;
        for w in [first, second, empty_recv] {
            w?.wait()?;
        }
        after.expect("first call accepted")?.wait()?;
        Ok(waited)
    });
    for (r, o) in out.into_iter().enumerate() {
        let waited = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(waited, 0, "rank {r}: host waits at the group's end");
    }
}

/// The probe on `host-local` worlds of two and three link classes: every rank builds
/// the same measured topology, with each class measured and their overlap.
#[test]
fn the_probe_measures_every_class_on_host_local() {
    for (ordinal, spec) in [(42, "nodes:2x2"), (43, "nodes:2x1x2")] {
        let opts = Arc::new(ProbeOptions {
            fresh: true,
            cache: None,
            noise: 0.0,
            seed: 7,
        });
        let ts: Vec<Topology> =
            common::on_comms(world(ordinal, spec), move |c| probe::probe(&c, &opts))
                .into_iter()
                .enumerate()
                .map(|(r, t)| t.unwrap_or_else(|e| panic!("{spec} rank {r}: {e}")))
                .collect();
        let spanned = probe::spanned(&Topology::parse(spec).unwrap());
        assert!(spanned.len() >= 2, "{spec}: a multi-class topology");
        for t in &ts {
            assert_eq!(*t, ts[0], "{spec}: every rank agrees");
        }
        let m = ts[0].measured.as_ref().expect("measured");
        assert_eq!(m.transport, "host-local");
        assert_eq!(m.classes, spanned, "{spec}: every class measured");
        assert!(ts[0].links.overlap.is_some(), "{spec}: overlap measured");
    }
}
