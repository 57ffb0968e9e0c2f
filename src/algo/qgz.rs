//! `qgz`: ZeRO++'s quantized gradient reduce-scatter (ZeRO++ §4.3 and Algorithm 2),
//! hierarchical 2-hop all-to-all, and `qgz-1hop`, the flat variant for comparison.
//!
//! 2-hop, on rank (node x, local j) of n nodes x k devices, for each pipeline stage s of
//! the per-rank chunk (stages split the chunk's elements; default 1, `stages` below):
//! 1. swizzled quantization of the whole input: for stage s and local peer j', the
//!    chunks (b, j') of every node b become one contiguous run of packed slices;
//! 2. intra-node all-to-all on the node communicator: one message per peer, carrying
//!    scales and codes together;
//! 3. fused dequantize-reduce-quantize of the k runs received: partial sums over the
//!    node of chunks (b, j) for every node b;
//! 4. inter-node all-to-all on the rail: slice b goes to node b's rank j;
//! 5. final dequantize-reduce of the n slices received, with `Avg` divided once by the
//!    world size in f32 (never by devices-per-node).
//!
//! Stages pipeline the hops: the intra all-to-alls of all stages are queued on the node
//! stream at once, and stage s's inter all-to-all runs on the rail stream while stage
//! s+1 still crosses the node. One node skips the inter hop and one device per node the
//! intra hop (no second quantization where nothing moves). Any element count and any
//! node count work: every slice is quantized on its own, partial blocks included.
//!
//! Traffic (bytes per rank, P(c) = packed_len(c) = 4·ceil(c/block) + c·bits/8):
//! intra `(k-1)·n·P(c)`, inter `(n-1)·P(c)`; so `max_node_egress = k(n-1)·P(c)` against
//! ring's `(p-1)·c·s` for s-byte elements: 0.19x for int4 on fp16 at nodes:4x8.
//! 1-hop: every rank sends its quantized chunk for rank r straight to r:
//! `(p-1)·P(c)` per rank, `k(p-k)·P(c)` out of each node.

use super::shape::{Algorithm, Shape};
use super::Algo;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::{self, QuantSpec};
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request, Work};

/// Default qgZ format: int4, blocks of 256 (ZeRO++ quantizes gradients to int4).
pub const DEFAULT_QGZ: (u32, usize) = (4, 256);

/// Pipeline stages of the 2-hop algorithm (`STRATA_QGZ_STAGES`, default 1 below 1 MiB
/// of chunk, else up to 4).
fn stages(chunk_bytes: usize) -> usize {
    std::env::var("STRATA_QGZ_STAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n >= 1)
        .unwrap_or((chunk_bytes >> 20).clamp(1, 4))
}

pub(crate) fn float_only(s: &Shape, what: &str) -> Option<String> {
    (!matches!(s.dtype, DataType::F32 | DataType::F16 | DataType::BF16))
        .then(|| format!("{what} quantizes f32, f16 and bf16 only, not {}", s.dtype))
}

pub(crate) fn spec(req: &Request, default: (u32, usize)) -> Result<QuantSpec> {
    match req.quant {
        Some(q) => Ok(q),
        None => QuantSpec::new(default.0, default.1),
    }
}

/// The 2-hop quantized reduce-scatter.
pub struct Qgz;
/// The 1-hop (flat all-to-all) quantized reduce-scatter.
pub struct Qgz1;

fn unsupported(s: &Shape, two_hop: bool) -> Option<String> {
    if s.kind != Some(crate::kinds::Kind::ReduceScatter) {
        return Some(format!("qgz is a reduce-scatter, not {}", s.name()));
    }
    if let Some(op) = s
        .redop
        .filter(|op| !matches!(op, ReduceOp::Sum | ReduceOp::Avg))
    {
        return Some(format!("qgz reduces with sum or avg, not {op}"));
    }
    if two_hop && s.hierarchy.is_none() {
        return Some("ranks are not a regular mesh of the topology".into());
    }
    float_only(s, "qgz")
}

impl Algorithm for Qgz {
    fn algo(&self) -> Algo {
        Algo::Qgz
    }
    fn unsupported(&self, s: &Shape) -> Option<String> {
        unsupported(s, true)
    }
    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        two_hop(comm, req)
    }
    fn divides_avg(&self) -> bool {
        true
    }
}

impl Algorithm for Qgz1 {
    fn algo(&self) -> Algo {
        Algo::Qgz1
    }
    fn unsupported(&self, s: &Shape) -> Option<String> {
        unsupported(s, false)
    }
    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        one_hop(comm, req)
    }
    fn divides_avg(&self) -> bool {
        true
    }
}

fn parts(req: &Request) -> Result<(&Buffer, &Buffer, usize, ReduceOp)> {
    match &req.op {
        Op::ReduceScatter {
            send,
            recv,
            count,
            op,
        } => Ok((send, recv, *count, *op)),
        _ => Err(Error::Internal(
            "qgz dispatched a non reduce-scatter".into(),
        )),
    }
}

/// All-to-all of equal `block`-byte pieces over `c` (U8 counts), nonblocking on
/// another communicator, at once on `c`'s own stream.
fn a2a(c: &CommCore, send: &Buffer, recv: &Buffer, block: usize) -> Work {
    c.enqueue(
        Op::AllToAll {
            send: send.clone(),
            recv: recv.clone(),
            count: block,
        },
        DataType::U8,
        Vec::new(),
    )
}

fn two_hop(comm: &CommCore, req: &Request) -> Result<()> {
    let (send, recv, c, op) = parts(req)?;
    let q = spec(req, DEFAULT_QGZ)?;
    let dt = req.dtype;
    let ops = comm.ops();
    let node = comm.node_or_rail(true)?;
    let rail = comm.node_or_rail(false)?;
    let (k, n) = (node.size(), rail.size());
    let st = stages(c * dt.size());
    let ranges = kernels::swizzle_ranges(c, st);
    // 1. swizzled quantization of the whole input.
    let sw = comm.alloc_like(&send, kernels::swizzled_len(q, c, n, k, st))?;
    let input = send.slice(0..n * k * c * dt.size())?;
    ops.swizzled_quantize(q, dt, &input, c, n, k, st, &sw)?;
    // 2. intra-node all-to-alls of every stage, queued at once.
    let mut intra = Vec::new();
    for (s, r) in ranges.iter().enumerate() {
        let run = n * q.packed_len(r.len());
        let first = kernels::swizzled_offset(q, c, n, k, st, s, 0).start;
        let out = sw.slice(first..first + k * run)?;
        if k == 1 {
            intra.push((out, Work::ready(Ok(()))));
        } else {
            let inc = comm.alloc_like(&send, k * run)?;
            intra.push((inc.clone(), a2a(&node, &out, &inc, run)));
        }
    }
    // 3./4. per stage: fused dequant-reduce-quant, then the inter-node all-to-all.
    let mut inter = Vec::new();
    for (s, r) in ranges.iter().enumerate() {
        let (inc, w) = &intra[s];
        w.wait()?;
        let slice = q.packed_len(r.len());
        let run = n * slice;
        if n == 1 {
            inter.push((inc.clone(), k, Work::ready(Ok(()))));
            continue;
        }
        let partial = if k == 1 {
            inc.clone()
        } else {
            let out = comm.alloc_like(&send, run)?;
            ops.dequant_reduce_quant(q, inc, k, r.len(), n, &out)?;
            out
        };
        let got = comm.alloc_like(&send, run)?;
        inter.push((got.clone(), n, a2a(&rail, &partial, &got, slice)));
    }
    // 5. final dequantize-reduce into the output, stage by stage.
    let s_out = dt.size();
    for (s, r) in ranges.iter().enumerate() {
        let (got, senders, w) = &inter[s];
        w.wait()?;
        let out = recv.slice(r.start * s_out..r.end * s_out)?;
        ops.dequant_reduce(q, got, *senders, r.len(), op, comm.size(), dt, &out)?;
    }
    Ok(())
}

fn one_hop(comm: &CommCore, req: &Request) -> Result<()> {
    let (send, recv, c, op) = parts(req)?;
    let q = spec(req, DEFAULT_QGZ)?;
    let (dt, p) = (req.dtype, comm.size());
    let ops = comm.ops();
    let slice = q.packed_len(c);
    let bytes = c * dt.size();
    let packed = comm.alloc_like(&send, p * slice)?;
    for r in 0..p {
        ops.quantize(
            q,
            dt,
            &send.slice(r * bytes..(r + 1) * bytes)?,
            &packed.slice(r * slice..(r + 1) * slice)?,
        )?;
    }
    let got = comm.alloc_like(&send, p * slice)?;
    a2a(comm, &packed, &got, slice).wait()?;
    ops.dequant_reduce(q, &got, p, c, op, p, dt, &recv.slice(0..bytes)?)
}
