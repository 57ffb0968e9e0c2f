//! Swizzled quantization: tensor-slice reordering fused with quantization (ZeRO++ B.3.2,
//! F.2, generalized to pipeline stages as Algorithm 2).

use super::convert::Scratch;
use super::format::{check_dtype, check_len, check_spec, elem_bytes, QuantSpec};
use super::quantize::quantize_slice;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use std::ops::Range;

/// The element ranges of the `stages` pipeline stages within one chunk of `c` elements:
/// near-equal, the first `c mod stages` one element longer, range s starting at
/// `s·⌊c/stages⌋ + min(s, c mod stages)`; empty ranges when `stages > c`. No ranges for
/// `stages = 0`.
pub fn swizzle_ranges(c: usize, stages: usize) -> Vec<Range<usize>> {
    if stages == 0 {
        return Vec::new();
    }
    let (q, r) = (c / stages, c % stages);
    (0..stages)
        .map(|s| {
            let start = s * q + s.min(r);
            start..start + q + usize::from(s < r)
        })
        .collect()
}

/// Byte length of stage `s`'s packed slices and the byte offset where each stage starts;
/// `None` on overflow or a zero count.
fn layout(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
) -> Option<(Vec<usize>, Vec<usize>, usize)> {
    if nodes == 0 || devices == 0 || stages == 0 {
        return None;
    }
    let p = nodes.checked_mul(devices)?;
    let mut slice = Vec::with_capacity(stages);
    let mut start = Vec::with_capacity(stages);
    let mut at = 0usize;
    for r in swizzle_ranges(c, stages) {
        let l = spec.checked_packed_len(r.len())?;
        slice.push(l);
        start.push(at);
        at = at.checked_add(l.checked_mul(p)?)?;
    }
    Some((slice, start, at))
}

/// Bytes of the whole swizzled output: `Σ_s p·packed_len(|c_s|)` with `p = nodes·devices`
/// (each of the p chunks yields one packed slice per stage). 0 for a zero count;
/// saturates at `usize::MAX` on overflow.
pub fn swizzled_len(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
) -> usize {
    match layout(spec, c, nodes, devices, stages) {
        Some((_, _, total)) => total,
        None if nodes == 0 || devices == 0 || stages == 0 => 0,
        None => usize::MAX,
    }
}

/// The bytes, within the swizzled output, of the run for local peer `j` in stage `stage`:
/// the `nodes` packed slices of chunks (b, j), b = 0..nodes, over stage range `stage`, one
/// message (data and scales together). Starts at
/// `Σ_{s'<stage} p·packed_len(|c_s'|) + j·nodes·packed_len(|c_stage|)`.
///
/// Never panics: for `stage >= stages`, `j >= devices` or a zero count it returns the
/// empty range at [`swizzled_len`] (callers validate with [`swizzle_check`] or
/// [`swizzled_quantize`] first).
#[allow(clippy::too_many_arguments)]
pub fn swizzled_offset(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
    stage: usize,
    j: usize,
) -> Range<usize> {
    let end = swizzled_len(spec, c, nodes, devices, stages);
    match layout(spec, c, nodes, devices, stages) {
        Some((slice, start, _)) if stage < stages && j < devices => {
            let run = slice[stage] * nodes;
            let a = start[stage] + j * run;
            a..a + run
        }
        _ => end..end,
    }
}

/// InvalidArgument unless spec, counts (all >= 1) and sizes make a valid swizzle layout.
pub fn swizzle_check(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
) -> Result<()> {
    const W: &str = "swizzled_quantize";
    check_spec(W, spec)?;
    if nodes == 0 || devices == 0 || stages == 0 {
        return Err(Error::InvalidArgument(format!(
            "{W}: nodes, devices and stages must be >= 1, got {nodes}, {devices}, {stages}"
        )));
    }
    if layout(spec, c, nodes, devices, stages).is_none() {
        return Err(Error::InvalidArgument(format!(
            "{W}: layout of {nodes}x{devices} chunks of {c} elements overflows usize"
        )));
    }
    Ok(())
}

/// Quantize a reduce-scatter input in the order qgZ's two all-to-alls need (ZeRO++
/// B.3.2 tensor-slice reordering fused with quantization, F.2; Algorithm 2 generalized
/// to any `nodes`, `devices` and `stages`).
///
/// `src` holds `p·c` elements of `dtype`, p = nodes·devices, rank-major: chunk of rank
/// r = (node b, local j) = b·devices + j is elements `[r·c, (r+1)·c)`. Each chunk is cut
/// into the stage ranges of [`swizzle_ranges`]. `dst` (exactly [`swizzled_len`] bytes)
/// receives, for stage s, for local destination j, for node b: the packed slice of chunk
/// (b, j) over range s, each slice with its own blocks. So the bytes for local peer j in
/// stage s are one contiguous run ([`swizzled_offset`]): one message per peer.
///
/// InvalidArgument for an invalid spec, a non-float dtype, a zero count, or wrong sizes.
#[allow(clippy::too_many_arguments)]
pub fn swizzled_quantize(
    spec: QuantSpec,
    dtype: DataType,
    src: &[u8],
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
    dst: &mut [u8],
) -> Result<()> {
    const W: &str = "swizzled_quantize";
    swizzle_check(spec, c, nodes, devices, stages)?;
    check_dtype(W, dtype)?;
    let p = nodes * devices;
    let pc = p.checked_mul(c).ok_or_else(|| {
        Error::InvalidArgument(format!("{W}: {p} chunks of {c} elements overflow usize"))
    })?;
    check_len(W, "src", elem_bytes(W, pc, dtype)?, src.len())?;
    let (slice, _, total) = layout(spec, c, nodes, devices, stages)
        .ok_or_else(|| Error::Internal(format!("{W}: layout vanished")))?;
    check_len(W, "dst", total, dst.len())?;
    if c == 0 {
        return Ok(());
    }
    let es = dtype.size();
    let mut sc = Scratch::new(spec.block.min(c.div_ceil(stages)));
    let mut at = 0;
    for (s, r) in swizzle_ranges(c, stages).into_iter().enumerate() {
        let l = slice[s];
        for j in 0..devices {
            for b in 0..nodes {
                let base = (b * devices + j) * c;
                let from = &src[(base + r.start) * es..(base + r.end) * es];
                if !from.is_empty() {
                    quantize_slice(spec, dtype, from, &mut dst[at..at + l], &mut sc);
                }
                at += l;
            }
        }
    }
    Ok(())
}
