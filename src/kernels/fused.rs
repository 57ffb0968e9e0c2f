//! Fused dequantize-reduce(-quantize) kernels of qgZ (ZeRO++ E.3 2-hop all-to-all, F.2
//! kernel fusion): one pass over the received slices, one f32 accumulator per block.

use super::convert::Scratch;
use super::format::{check_dtype, check_len, check_spec, elem_bytes, packed_bytes, QuantSpec};
use super::quantize::{deq_add, deq_set, quantize_block, store_blocks, Slice};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};

fn check_inputs(what: &str, inputs: &[&[u8]], want: usize) -> Result<()> {
    if inputs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{what}: needs at least one input, got none"
        )));
    }
    for (s, i) in inputs.iter().enumerate() {
        check_len(what, &format!("input {s}"), want, i.len())?;
    }
    Ok(())
}

/// `acc = Σ_s deq(`inputs[s]` block b)` in sender order: `acc = deq(in_0)`, then
/// `acc = acc + deq(in_s)`, one f32 rounding each (the contract's order).
#[inline]
fn accumulate(g: &Slice, inputs: &[&[u8]], base: usize, b: usize, acc: &mut [f32], w: &mut [u16]) {
    let cb = g.code_bytes(b);
    for (s, i) in inputs.iter().enumerate() {
        let one = &i[base..];
        if s == 0 {
            deq_set(g.bits, g.scale(one, b), &one[cb.clone()], acc, w);
        } else {
            deq_add(g.bits, g.scale(one, b), &one[cb.clone()], acc, w);
        }
    }
}

/// qgZ's middle hop (ZeRO++ E.3, fused as in F.2): dequantize, sum and requantize in one
/// pass. `inputs` are k >= 1 buffers in sender order, each `slices` packed slices of `n`
/// elements (`slices · packed_len(n)` bytes). `dst` (same size) receives `slices` packed
/// slices: slice i = quantize(Σ_s deq(`inputs[s]` slice i)), summed in f32 in sender order
/// and quantized from f32 directly, bitwise equal to quantizing the f32 sum of the
/// [`dequantize`](super::dequantize)d inputs.
///
/// InvalidArgument for an invalid spec, no inputs, or any buffer of the wrong size.
pub fn dequant_reduce_quant(
    spec: QuantSpec,
    inputs: &[&[u8]],
    n: usize,
    slices: usize,
    dst: &mut [u8],
) -> Result<()> {
    const W: &str = "dequant_reduce_quant";
    check_spec(W, spec)?;
    let one = packed_bytes(W, spec, n)?;
    let want = one.checked_mul(slices).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{W}: {slices} slices of {one} bytes overflow usize"
        ))
    })?;
    check_inputs(W, inputs, want)?;
    check_len(W, "dst", want, dst.len())?;
    if n == 0 || slices == 0 {
        return Ok(());
    }
    let g = Slice::new(spec, n);
    let qmax = spec.qmax();
    let mut sc = Scratch::new(spec.block.min(n));
    for i in 0..slices {
        let base = i * one;
        let out = &mut dst[base..base + one];
        for b in 0..g.blocks() {
            let acc = &mut sc.f[..g.elems(b).len()];
            accumulate(&g, inputs, base, b, acc, &mut sc.h);
            let scale = quantize_block(spec.bits, qmax, acc, &mut out[g.code_bytes(b)], &mut sc.h);
            out[b * 4..b * 4 + 4].copy_from_slice(&scale.to_le_bytes());
        }
    }
    Ok(())
}

/// qgZ's last step (ZeRO++ B.3.1 / E.3): dequantize the k >= 1 packed slices of `n`
/// elements received from the senders (each `packed_len(n)` bytes, in sender order), sum
/// them in f32 in sender order and write `n` elements of `dtype` to `dst`. `Sum` writes
/// the sum; `Avg` divides it once by `divisor` (the world size, >= 1) as `acc / (f32)d`,
/// with no other scaling (no devices-per-node factor). Other ops are InvalidArgument, as
/// are an invalid spec, a non-float dtype, no inputs and wrong sizes. `divisor` is
/// ignored for `Sum`.
pub fn dequant_reduce(
    spec: QuantSpec,
    inputs: &[&[u8]],
    n: usize,
    op: ReduceOp,
    divisor: usize,
    dtype: DataType,
    dst: &mut [u8],
) -> Result<()> {
    const W: &str = "dequant_reduce";
    check_spec(W, spec)?;
    check_dtype(W, dtype)?;
    let div = match op {
        ReduceOp::Sum => None,
        ReduceOp::Avg if divisor >= 1 => Some(divisor as f32),
        ReduceOp::Avg => {
            return Err(Error::InvalidArgument(format!(
                "{W}: avg needs a divisor >= 1 (the world size), got 0"
            )))
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "{W}: quantized reduction supports sum and avg, got {other}"
            )))
        }
    };
    check_inputs(W, inputs, packed_bytes(W, spec, n)?)?;
    check_len(W, "dst", elem_bytes(W, n, dtype)?, dst.len())?;
    if n == 0 {
        return Ok(());
    }
    store_blocks(spec, n, dtype, dst, |g, b, acc, h| {
        accumulate(g, inputs, 0, b, acc, h);
        if let Some(d) = div {
            acc.iter_mut().for_each(|v| *v /= d);
        }
    });
    Ok(())
}
