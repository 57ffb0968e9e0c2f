//! Block quantization and dequantization of one packed slice (ZeRO++ B.1, E.1).

use super::convert::{load, store, Scratch};
use super::format::{
    check_dtype, check_len, check_spec, elem_bytes, packed_bytes, QuantSpec, NAN_F32, SCALE_BYTES,
};
use crate::dtype::DataType;
use crate::error::{Error, Result};

/// 1.5·2^23: `(y + MAGIC).to_bits() - MAGIC_BITS` is `round_ties_even(y)` for |y| < 2^22
/// (the sum lands in [2^23, 2^24) where the f32 ulp is 1, rounded to nearest even).
/// Baseline x86-64 has no vector roundps; this keeps the code loop vectorized.
const MAGIC: f32 = 12_582_912.0;
const MAGIC_BITS: i32 = 0x4B40_0000;
/// Blocks with amax below 2^-64 are prescaled by 2^64 (exact) so `qmax/amax` is finite.
const UP: f32 = 18_446_744_073_709_551_616.0; // 2^64
const TINY: f32 = 1.0 / UP; // 2^-64

/// `clamp(round_ties_even(y), -qmax, qmax)` for finite y. Clamped in f32 first (SSE2
/// `minps`/`maxps`; baseline x86-64 has no 32-bit integer min/max), which is the same:
/// rounding is monotonic and ±qmax are integers.
#[inline(always)]
fn code(y: f32, qmax: i32) -> i32 {
    let q = qmax as f32;
    let y = if q < y { q } else { y };
    let y = if y < -q { -q } else { y };
    (y + MAGIC).to_bits() as i32 - MAGIC_BITS
}

/// Quantize one block held in f32 `x` (clobbered: it may be prescaled) into `codes`
/// (`len` bytes for int8, `ceil(len/2)` for int4) and return its scale. `w` is staging
/// of at least `ceil(len/2)` words (int4 only).
pub(crate) fn quantize_block(
    bits: u32,
    qmax: i32,
    x: &mut [f32],
    codes: &mut [u8],
    w: &mut [u16],
) -> f32 {
    // amax and the finiteness test in one integer pass: |x| bit patterns order like |x|,
    // and every NaN/Inf pattern is >= 0x7F800000.
    let amax_bits = x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
    if amax_bits >= 0x7F80_0000 {
        codes.fill(0);
        return f32::from_bits(NAN_F32);
    }
    if amax_bits == 0 {
        codes.fill(0);
        return 0.0;
    }
    let amax = f32::from_bits(amax_bits);
    let qf = qmax as f32;
    let scale = amax / qf;
    let inv = if amax < TINY {
        x.iter_mut().for_each(|v| *v *= UP);
        qf / (amax * UP)
    } else {
        qf / amax
    };
    let q8 = |q: &mut [u8]| {
        q.iter_mut()
            .zip(x.iter())
            .for_each(|(c, &v)| *c = code(v * inv, qmax) as i8 as u8)
    };
    if bits == 8 {
        q8(codes);
    } else {
        // i8 codes into the staging words (element 2i in the low byte), then each word
        // folds to one byte: a 1:1 map that vectorizes, unlike a nibble interleave.
        let w = &mut w[..codes.len()];
        let bytes = bytemuck::cast_slice_mut::<u16, u8>(w);
        let n = x.len();
        q8(&mut bytes[..n]);
        if n % 2 == 1 {
            bytes[n] = 0;
        }
        codes.iter_mut().zip(w.iter()).for_each(|(c, &w)| {
            let w = u16::from_le(w);
            *c = ((w & 0x0F) | ((w >> 4) & 0xF0)) as u8;
        });
    }
    scale
}

/// Sign-extended int4 nibbles as i8 pairs in little-endian words (a 1:1 map that
/// vectorizes); returns the `n` i8 codes as bytes.
#[inline(always)]
fn unpack4<'a>(codes: &[u8], n: usize, w: &'a mut [u16]) -> &'a [u8] {
    let w = &mut w[..codes.len()];
    w.iter_mut().zip(codes).for_each(|(w, &c)| {
        let lo = ((((c << 4) as i8) >> 4) as u8) as u16;
        let hi = ((((c as i8) >> 4) as u8) as u16) << 8;
        *w = (lo | hi).to_le();
    });
    &bytemuck::cast_slice::<u16, u8>(w)[..n]
}

/// `f(out[i], q_i · scale)` over the codes; `w` is staging of at least `ceil(len/2)`
/// words (int4 only).
fn deq_each(
    bits: u32,
    scale: f32,
    codes: &[u8],
    out: &mut [f32],
    w: &mut [u16],
    f: impl Fn(&mut f32, f32),
) {
    let q = if bits == 8 {
        codes
    } else {
        unpack4(codes, out.len(), w)
    };
    out.iter_mut()
        .zip(q)
        .for_each(|(o, &c)| f(o, (c as i8) as f32 * scale));
}

/// `out[i] = q_i · scale`; `w` is staging of at least `ceil(len/2)` words (int4 only).
pub(crate) fn deq_set(bits: u32, scale: f32, codes: &[u8], out: &mut [f32], w: &mut [u16]) {
    deq_each(bits, scale, codes, out, w, |o, v| *o = v);
}

/// `out[i] = out[i] + q_i · scale` (two roundings, no FMA: Rust never contracts).
pub(crate) fn deq_add(bits: u32, scale: f32, codes: &[u8], out: &mut [f32], w: &mut [u16]) {
    deq_each(bits, scale, codes, out, w, |o, v| *o += v);
}

/// Geometry of one packed slice: where block `b`'s scale and codes live.
#[derive(Clone, Copy)]
pub(crate) struct Slice {
    pub bits: u32,
    pub block: usize,
    pub n: usize,
    /// Byte offset of the codes (= 4 · blocks).
    pub codes_at: usize,
}

impl Slice {
    pub fn new(spec: QuantSpec, n: usize) -> Slice {
        Slice {
            bits: spec.bits,
            block: spec.block,
            n,
            codes_at: spec.blocks(n) * SCALE_BYTES,
        }
    }
    pub fn blocks(&self) -> usize {
        self.codes_at / SCALE_BYTES
    }
    /// Elements of block `b`.
    pub fn elems(&self, b: usize) -> std::ops::Range<usize> {
        b * self.block..((b + 1) * self.block).min(self.n)
    }
    /// Bytes (within the slice) of block `b`'s codes.
    pub fn code_bytes(&self, b: usize) -> std::ops::Range<usize> {
        let e = self.elems(b);
        if self.bits == 8 {
            self.codes_at + e.start..self.codes_at + e.end
        } else {
            self.codes_at + e.start / 2..self.codes_at + e.end.div_ceil(2)
        }
    }
    /// The stored scale of block `b`.
    pub fn scale(&self, packed: &[u8], b: usize) -> f32 {
        let s = &packed[b * SCALE_BYTES..(b + 1) * SCALE_BYTES];
        f32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
}

/// Quantize `src` (n elements of `dtype`, lengths already checked) into `dst`.
pub(crate) fn quantize_slice(
    spec: QuantSpec,
    dtype: DataType,
    src: &[u8],
    dst: &mut [u8],
    sc: &mut Scratch,
) {
    let n = src.len() / dtype.size();
    let g = Slice::new(spec, n);
    let qmax = spec.qmax();
    for b in 0..g.blocks() {
        let e = g.elems(b);
        let x = &mut sc.f[..e.len()];
        load(
            dtype,
            &src[e.start * dtype.size()..e.end * dtype.size()],
            x,
            &mut sc.h,
        );
        let cb = g.code_bytes(b);
        let scale = quantize_block(spec.bits, qmax, x, &mut dst[cb], &mut sc.h);
        dst[b * SCALE_BYTES..(b + 1) * SCALE_BYTES].copy_from_slice(&scale.to_le_bytes());
    }
}

/// Quantize `src` — n elements of `dtype` (f32/f16/bf16, little-endian) — into one packed
/// slice `dst` of exactly `spec.packed_len(n)` bytes: `ceil(n/block)` f32 scales, then
/// the codes (ZeRO++ E.1 block-based symmetric quantization; qwZ, B.1, quantizes its
/// shard with it). Per block: `scale = amax/qmax`, `q = clamp(rne(x·qmax/amax), ±qmax)`;
/// a NaN/Inf poisons its block (scale NaN, codes 0), an all-zero block stores scale 0.
/// Exact rules, int4 nibble order and the error bound: `docs/quantization.md`.
///
/// InvalidArgument for an invalid spec, a non-float dtype, a `src` that is not a whole
/// number of elements, or a `dst` of the wrong size. n = 0 writes nothing.
pub fn quantize(spec: QuantSpec, dtype: DataType, src: &[u8], dst: &mut [u8]) -> Result<()> {
    const W: &str = "quantize";
    check_spec(W, spec)?;
    check_dtype(W, dtype)?;
    if src.len() % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{W}: src has {} bytes, not a whole number of {dtype} elements",
            src.len()
        )));
    }
    let n = src.len() / dtype.size();
    check_len(W, "dst", packed_bytes(W, spec, n)?, dst.len())?;
    if n == 0 {
        return Ok(());
    }
    let mut sc = Scratch::new(spec.block.min(n));
    quantize_slice(spec, dtype, src, dst, &mut sc);
    Ok(())
}

/// Dequantize one packed slice `src` (`spec.packed_len(n)` bytes) of `n` elements into
/// `dst` (`n` elements of `dtype`): `x' = q · scale` in f32, narrowed with
/// round-to-nearest-even; a poisoned block (NaN scale) yields canonical NaNs. qwZ's
/// receive side (ZeRO++ B.1).
///
/// InvalidArgument for an invalid spec, a non-float dtype, or wrong `src`/`dst` sizes.
pub fn dequantize(
    spec: QuantSpec,
    src: &[u8],
    n: usize,
    dtype: DataType,
    dst: &mut [u8],
) -> Result<()> {
    const W: &str = "dequantize";
    check_spec(W, spec)?;
    check_dtype(W, dtype)?;
    check_len(W, "src", packed_bytes(W, spec, n)?, src.len())?;
    check_len(W, "dst", elem_bytes(W, n, dtype)?, dst.len())?;
    if n == 0 {
        return Ok(());
    }
    store_blocks(spec, n, dtype, dst, |g, b, x, h| {
        deq_set(spec.bits, g.scale(src, b), &src[g.code_bytes(b)], x, h)
    });
    Ok(())
}

/// The dequantizing kernels' output loop: for each block `b` of `n` elements, `fill(g, b,
/// x, h)` sets `x` to the block's f32 values (`h`: 16-bit scratch of the block's size),
/// which are then stored in `dst` as `dtype` (`n` elements, length already checked).
pub(crate) fn store_blocks(
    spec: QuantSpec,
    n: usize,
    dtype: DataType,
    dst: &mut [u8],
    mut fill: impl FnMut(&Slice, usize, &mut [f32], &mut [u16]),
) {
    let g = Slice::new(spec, n);
    let mut sc = Scratch::new(spec.block.min(n));
    let s = dtype.size();
    for b in 0..g.blocks() {
        let e = g.elems(b);
        let x = &mut sc.f[..e.len()];
        fill(&g, b, x, &mut sc.h);
        store(dtype, x, &mut dst[e.start * s..e.end * s], &mut sc.h);
    }
}
