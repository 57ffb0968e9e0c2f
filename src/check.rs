//! Plain references for every collective, used by `strata-perf -c`, the tests and the
//! self test (`strata_tools::selftest`): deterministic inputs per (rank, index, seed)
//! and the exact expected output computed in f64, element by element, with no
//! communication at all.
//!
//! Inputs are small integers (|v| <= 3, or 0..=6 for u8) so sums over up to 32 ranks are
//! exact in every dtype, including bf16; the reference rounds to the dtype once, as the
//! collectives do (`Avg` divides once at the end), so a correct result matches exactly
//! and [`count_wrong`] uses only a few-ulp tolerance.

#![forbid(unsafe_code)]

use crate::comm::{Comm, Op, Request};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::Algo;

/// The input value of element `i` of `rank`'s send buffer: a small integer, -3 to 3
/// (0 to 6 for the unsigned types), exact in every type and every reduction order.
pub fn value(dtype: DataType, rank: usize, i: usize, seed: u64) -> f64 {
    let h = (rank as u64)
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add((i as u64).wrapping_mul(0x85EB_CA6B))
        .wrapping_add(seed.wrapping_mul(0xC2B2_AE35));
    let h = (h ^ (h >> 13)).wrapping_mul(0x2545_F491);
    let v = ((h >> 7) % 7) as f64;
    if matches!(dtype, DataType::U8 | DataType::U32 | DataType::U64) {
        v
    } else {
        v - 3.0
    }
}

/// `count` input elements of `rank` starting at element `first`, as bytes.
pub fn fill(dtype: DataType, rank: usize, first: usize, count: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; count * dtype.size()];
    for i in 0..count {
        dtype.set(&mut out, i, value(dtype, rank, first + i, seed));
    }
    out
}

/// Reduce the inputs of all `p` ranks at element `i` (rounded to the dtype once).
fn reduced(dtype: DataType, op: ReduceOp, p: usize, i: usize, seed: u64) -> f64 {
    let mut acc = value(dtype, 0, i, seed);
    for r in 1..p {
        acc = op.apply(acc, value(dtype, r, i, seed));
    }
    if op == ReduceOp::Avg {
        acc /= p as f64;
    }
    let mut b = vec![0u8; dtype.size()];
    dtype.set(&mut b, 0, acc);
    dtype.get(&b, 0)
}

pub use crate::kinds::Kind;

/// The references of a collective kind: inputs and expected outputs (its request on
/// prepared buffers: [`Kind::op`]).
impl Kind {
    /// This rank's send buffer contents for `seed` (coalesced tensors use one seed each).
    pub fn input(self, dtype: DataType, rank: usize, count: usize, p: usize, seed: u64) -> Vec<u8> {
        fill(dtype, rank, 0, self.sizes(count, p).0, seed)
    }

    /// The exact expected receive buffer on `rank`.
    pub fn expected(
        self,
        dtype: DataType,
        op: ReduceOp,
        rank: usize,
        count: usize,
        p: usize,
        seed: u64,
    ) -> Vec<f64> {
        match self {
            Kind::AllGather => (0..p * count)
                .map(|j| value(dtype, j / count, j % count, seed))
                .collect(),
            Kind::ReduceScatter => (0..count)
                .map(|i| reduced(dtype, op, p, rank * count + i, seed))
                .collect(),
            Kind::AllReduce => (0..count).map(|i| reduced(dtype, op, p, i, seed)).collect(),
            Kind::AllToAll => (0..p * count)
                .map(|j| value(dtype, j / count, rank * count + j % count, seed))
                .collect(),
            Kind::Broadcast { root } => (0..count).map(|i| value(dtype, root, i, seed)).collect(),
        }
    }
}

/// Elements of `got` farther than a few ulps from `want`.
pub fn count_wrong(dtype: DataType, got: &[u8], want: &[f64], terms: usize) -> usize {
    want.iter()
        .enumerate()
        .filter(|(i, w)| {
            let g = dtype.get(got, *i);
            !((g - **w).abs() <= dtype.tolerance(w.abs(), terms)) // NaN counts as wrong
        })
        .count()
}

/// Run one checked collective on `comm` and return the number of wrong elements on this
/// rank. `in_place` uses NCCL's in-place layout where the op has one.
pub fn run_checked(
    comm: &Comm,
    kind: Kind,
    dtype: DataType,
    redop: ReduceOp,
    count: usize,
    algo: Algo,
    in_place: bool,
    seed: u64,
) -> Result<usize> {
    let (p, r) = (comm.size(), comm.rank());
    let nr = kind.sizes(count, p).1;
    let s = dtype.size();
    let input = kind.input(dtype, r, count, p, seed);
    let (send, recv) = match (in_place, kind) {
        (true, Kind::AllGather) => {
            let recv = comm.alloc_native(nr * s)?;
            let send = recv.slice(r * count * s..(r + 1) * count * s)?;
            send.write_bytes(&input)?;
            (send, recv)
        }
        (true, Kind::ReduceScatter) => {
            let send = comm.native_from(&input)?;
            let recv = send.slice(r * count * s..(r + 1) * count * s)?;
            (send, recv)
        }
        (true, Kind::AllReduce) | (true, Kind::Broadcast { .. }) => {
            let b = comm.native_from(&input)?;
            (b.clone(), b)
        }
        _ => (
            comm.native_from(&input)?,
            comm.native_from(&vec![0xA5; nr * s])?,
        ),
    };
    comm.submit(Request::new(kind.op(send, recv.clone(), count, redop), dtype).with_algo(algo))?
        .wait()?;
    let want = kind.expected(dtype, redop, r, count, p, seed);
    Ok(count_wrong(dtype, &recv.to_bytes()?, &want, p))
}

/// Coalesced variant: `counts` per tensor; returns wrong elements over all tensors.
pub fn run_checked_coalesced(
    comm: &Comm,
    kind: Kind,
    dtype: DataType,
    redop: ReduceOp,
    counts: &[usize],
    algo: Algo,
    seed: u64,
) -> Result<usize> {
    let (p, r) = (comm.size(), comm.rank());
    let s = dtype.size();
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (t, &c) in counts.iter().enumerate() {
        let (_, nr) = kind.sizes(c, p);
        sends.push(comm.native_from(&kind.input(dtype, r, c, p, seed + t as u64))?);
        recvs.push(comm.native_from(&vec![0xA5; nr * s])?);
    }
    let op = match kind {
        Kind::AllGather => Op::AllGatherCoalesced {
            sends,
            recvs: recvs.clone(),
            counts: counts.to_vec(),
        },
        Kind::ReduceScatter => Op::ReduceScatterCoalesced {
            sends,
            recvs: recvs.clone(),
            counts: counts.to_vec(),
            op: redop,
        },
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{} has no coalesced form",
                kind.name()
            )))
        }
    };
    comm.submit(Request::new(op, dtype).with_algo(algo))?
        .wait()?;
    let mut wrong = 0;
    for (t, (&c, b)) in counts.iter().zip(&recvs).enumerate() {
        wrong += count_wrong(
            dtype,
            &b.to_bytes()?,
            &kind.expected(dtype, redop, r, c, p, seed + t as u64),
            p,
        );
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_detects_corruption() {
        for dt in [DataType::F32, DataType::F16, DataType::BF16] {
            let want = Kind::AllReduce.expected(dt, ReduceOp::Avg, 0, 50, 7, 3);
            let mut got = vec![0u8; 50 * dt.size()];
            for (i, w) in want.iter().enumerate() {
                dt.set(&mut got, i, *w);
            }
            assert_eq!(count_wrong(dt, &got, &want, 7), 0);
            dt.set(&mut got, 17, want[17] + 0.5);
            dt.set(&mut got, 3, f64::NAN);
            assert_eq!(count_wrong(dt, &got, &want, 7), 2);
        }
    }

    #[test]
    fn inputs_are_small_exact_integers() {
        for r in 0..32 {
            for i in 0..100 {
                let v = value(DataType::BF16, r, i, 5);
                assert!(v.fract() == 0.0 && v.abs() <= 3.0);
            }
        }
    }
}

/// Outcome of a checked quantized collective on one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuantCheck {
    /// Elements farther from the exact result than `bound`.
    pub wrong: usize,
    /// Largest |got - exact| (exact = f64 reduction of the unquantized inputs).
    pub max_err: f64,
    /// Root mean square of |got - exact|.
    pub rms_err: f64,
    /// The per-element bound the format promises for this call (docs/quantization.md).
    pub bound: f64,
    /// Elements compared.
    pub count: usize,
}

/// Half an ulp of `dtype` at magnitude `v` (the output conversion's rounding).
fn half_ulp(dtype: DataType, v: f64) -> f64 {
    let mant = match dtype {
        DataType::F32 => 23,
        DataType::F16 => 10,
        DataType::BF16 => 7,
        _ => 0,
    };
    let e = if v > 0.0 { v.log2().floor() } else { -14.0 };
    2f64.powf(e - mant as f64 - 1.0)
}

/// The error bound of a quantized collective on inputs with |x| <= `a`: one
/// quantization (`e1 = QuantSpec::step_bound(a)` per value) for every one of the `p` inputs
/// summed, plus, for the 2-hop `qgz` with several devices and several nodes, a second
/// quantization of each node's partial sum (`e2` at magnitude `k·(a + e1)`, summed over
/// `n` nodes), plus f32 summation rounding and the output conversion; `Avg` divides by
/// `p`. All-gather (`qwz`) is `e1` plus the output rounding.
pub fn quant_bound(
    algo: Algo,
    q: crate::kernels::QuantSpec,
    a: f64,
    nodes: usize,
    devices: usize,
    dtype: DataType,
    op: ReduceOp,
) -> f64 {
    // Per value: half a quantization step plus f32 rounding (QuantSpec::step_bound).
    let e = |m: f64| q.step_bound(m as f32) as f64;
    let p = (nodes * devices) as f64;
    let e1 = e(a);
    if algo == Algo::Qwz {
        return e1 + half_ulp(dtype, a + e1);
    }
    let mut err = p * e1;
    if algo == Algo::Qgz && nodes > 1 && devices > 1 {
        err += nodes as f64 * e(devices as f64 * (a + e1));
    }
    let sum = p * a + err;
    err += 2.0 * p * sum * 2f64.powi(-24);
    if op == ReduceOp::Avg {
        err /= p;
        return err + half_ulp(dtype, sum / p) + sum / p * 2f64.powi(-23);
    }
    err + half_ulp(dtype, sum)
}

/// One checked quantized collective (`qgz`, `qgz-1hop` on reduce-scatter; `qwz` on
/// all-gather): `kind` of NCCL's per-call `count` of `dtype` (reduced by `redop`) under
/// `algo` with the format `q`, every rank's input [`fill`]`(dtype, rank, 0, .., seed)`.
#[derive(Debug, Clone, Copy)]
pub struct QuantCase {
    pub kind: Kind,
    pub dtype: DataType,
    pub redop: ReduceOp,
    pub count: usize,
    pub algo: Algo,
    pub q: crate::kernels::QuantSpec,
    pub seed: u64,
}

/// Run `case` on `comm` and compare with the exact f64 result of the unquantized inputs.
pub fn run_checked_quant(comm: &Comm, case: &QuantCase) -> Result<QuantCheck> {
    let QuantCase {
        kind,
        dtype,
        redop,
        count,
        seed,
        ..
    } = *case;
    let (ns, nr) = kind.sizes(count, comm.size());
    let s = dtype.size();
    let input = fill(dtype, comm.rank(), 0, ns, seed);
    let send = comm.native_from(&input)?;
    let recv = comm.native_from(&vec![0xA5; nr * s])?;
    comm.submit(
        Request::new(kind.op(send, recv.clone(), count, redop), dtype)
            .with_algo(case.algo)
            .with_quant(case.q),
    )?
    .wait()?;
    check_quant(comm, case, &recv.to_bytes()?)
}

/// Compare `got`, this rank's receive buffer after `case` ran on `comm`, with the exact
/// f64 result (the comparison [`run_checked_quant`] makes after its call).
pub fn check_quant(comm: &Comm, case: &QuantCase, got: &[u8]) -> Result<QuantCheck> {
    let QuantCase {
        kind,
        dtype,
        redop,
        count,
        algo,
        q,
        seed,
    } = *case;
    let (p, r) = (comm.size(), comm.rank());
    // Exact: reduce in f64 without rounding to the dtype.
    let exact: Vec<f64> = match kind {
        Kind::AllGather => (0..p * count)
            .map(|j| value(dtype, j / count, j % count, seed))
            .collect(),
        Kind::ReduceScatter => (0..count)
            .map(|i| {
                let sum: f64 = (0..p)
                    .map(|src| value(dtype, src, r * count + i, seed))
                    .sum();
                if redop == ReduceOp::Avg {
                    sum / p as f64
                } else {
                    sum
                }
            })
            .collect(),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{} has no quantized form",
                kind.name()
            )))
        }
    };
    let nodes = match comm.hierarchy().and_then(|h| h.levels.first().copied()) {
        Some((crate::topology::Level::Network, n)) => n,
        _ => 1,
    };
    let a = if matches!(dtype, DataType::U8 | DataType::U32 | DataType::U64) {
        6.0
    } else {
        3.0
    };
    let bound = quant_bound(algo, q, a, nodes, p / nodes, dtype, redop);
    if got.len() < exact.len() * dtype.size() {
        return Err(Error::InvalidArgument(format!(
            "{} bytes received, {} expected",
            got.len(),
            exact.len() * dtype.size()
        )));
    }
    let mut out = QuantCheck {
        bound,
        count: exact.len(),
        ..Default::default()
    };
    let mut sq = 0.0;
    for (i, x) in exact.iter().enumerate() {
        let d = (dtype.get(got, i) - x).abs();
        if !(d <= bound) {
            out.wrong += 1;
        }
        out.max_err = out.max_err.max(if d.is_nan() { f64::INFINITY } else { d });
        sq += d * d;
    }
    out.rms_err = if exact.is_empty() {
        0.0
    } else {
        (sq / exact.len() as f64).sqrt()
    };
    Ok(out)
}
