//! Widening f32/f16/bf16 bytes into aligned f32 scratch and narrowing back, with the
//! contract's rounding (RNE) and canonical NaNs. Host buffers carry no alignment
//! guarantee, so bytes are memcpy'd into aligned scratch and converted there (f16 with
//! `half`'s slice conversion, which uses F16C / FP16 instructions when present).

use super::format::{NAN_BF16, NAN_F32};
use crate::dtype::DataType;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// Reusable aligned scratch for one kernel call (no per-element or per-block allocation).
pub(crate) struct Scratch {
    /// f32 values of one block (input, or the running sum).
    pub f: Vec<f32>,
    /// 16-bit staging for f16/bf16.
    pub h: Vec<u16>,
}

impl Scratch {
    /// Scratch for blocks of up to `len` elements.
    pub fn new(len: usize) -> Scratch {
        Scratch {
            f: vec![0.0; len],
            h: vec![0; len],
        }
    }
}

fn copy_u16(src: &[u8], h: &mut [u16]) {
    bytemuck::cast_slice_mut::<u16, u8>(h).copy_from_slice(src);
    if cfg!(target_endian = "big") {
        h.iter_mut().for_each(|x| *x = u16::from_le(*x));
    }
}

/// Widen `dst.len()` elements of `dtype` from little-endian `src` into `dst` (exact).
pub(crate) fn load(dtype: DataType, src: &[u8], dst: &mut [f32], h: &mut [u16]) {
    let n = dst.len();
    match dtype {
        DataType::F16 => {
            let h = &mut h[..n];
            copy_u16(src, h);
            bytemuck::cast_slice::<u16, f16>(h).convert_to_f32_slice(dst);
        }
        DataType::BF16 => {
            let h = &mut h[..n];
            copy_u16(src, h);
            // bf16 is the high half of an f32 (never f16 bits).
            dst.iter_mut()
                .zip(h.iter())
                .for_each(|(d, &b)| *d = f32::from_bits((b as u32) << 16));
        }
        _ => {
            bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(src);
            if cfg!(target_endian = "big") {
                dst.iter_mut()
                    .for_each(|x| *x = f32::from_bits(u32::from_le(x.to_bits())));
            }
        }
    }
}

/// f32 -> bf16 with round-to-nearest-even (overflow to ±Inf), canonical NaN.
#[inline(always)]
pub(crate) fn bf16_rne(v: f32) -> u16 {
    let b = v.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        NAN_BF16
    } else {
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// Replace every NaN in `v` by the canonical one (so f16/bf16 narrowing is canonical too).
#[inline]
pub(crate) fn canonicalize(v: &mut [f32]) {
    let nan = f32::from_bits(NAN_F32);
    v.iter_mut().for_each(|x| {
        if x.is_nan() {
            *x = nan
        }
    });
}

/// Narrow `src` (canonicalizing NaNs in place) into `dtype` little-endian bytes `dst`.
pub(crate) fn store(dtype: DataType, src: &mut [f32], dst: &mut [u8], h: &mut [u16]) {
    let n = src.len();
    canonicalize(src);
    match dtype {
        DataType::F16 => {
            let h = &mut h[..n];
            bytemuck::cast_slice_mut::<u16, f16>(h).convert_from_f32_slice(src);
            put_u16(h, dst);
        }
        DataType::BF16 => {
            let h = &mut h[..n];
            h.iter_mut()
                .zip(src.iter())
                .for_each(|(o, &v)| *o = bf16_rne(v));
            put_u16(h, dst);
        }
        _ => {
            if cfg!(target_endian = "big") {
                src.iter_mut()
                    .for_each(|x| *x = f32::from_bits(x.to_bits().to_le()));
            }
            dst.copy_from_slice(bytemuck::cast_slice::<f32, u8>(src));
        }
    }
}

fn put_u16(h: &mut [u16], dst: &mut [u8]) {
    if cfg!(target_endian = "big") {
        h.iter_mut().for_each(|x| *x = x.to_le());
    }
    dst.copy_from_slice(bytemuck::cast_slice::<u16, u8>(h));
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn bits_sample() -> impl Iterator<Item = u32> {
        // Every 2^16-th pattern plus its neighbours around rounding ties (under Miri,
        // every 61st of those: the interpreter is ~10^4 times slower).
        let step = if cfg!(miri) { 61 } else { 1 };
        (0u32..65536).step_by(step).flat_map(|hi| {
            let b = hi << 16;
            [
                b,
                b | 0x7FFF,
                b | 0x8000,
                b | 0x8001,
                b | 0xFFFF,
                b | 0x1234,
            ]
        })
    }

    #[test]
    fn bf16_matches_half_rne() {
        for b in bits_sample() {
            let v = f32::from_bits(b);
            let got = bf16_rne(v);
            if v.is_nan() {
                assert_eq!(got, NAN_BF16);
            } else {
                assert_eq!(got, bf16::from_f32(v).to_bits(), "{b:#x}");
            }
        }
    }

    /// f16 bits of finite `x` rounded to nearest, ties to even, by exact arithmetic
    /// (independent of `half`, whose software f64 path, used under Miri, misrounds
    /// some subnormals: 0x37008001 gives 128 where 129 is right).
    fn f16_rne_reference(x: f32) -> u16 {
        // Exact powers of two from their bits (Miri perturbs `powi`'s result).
        let pow2 = |k: i32| f64::from_bits(((1023 + k) as u64) << 52);
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = x.abs() as f64;
        let rne = |q: f64| {
            let f = q.floor();
            let d = q - f;
            if d > 0.5 || (d == 0.5 && f % 2.0 == 1.0) {
                f + 1.0
            } else {
                f
            }
        };
        if a < pow2(-14) {
            // Subnormal (or zero): units of 2^-24; 1024 of them is the smallest normal.
            return sign | rne(a * pow2(24)) as u16;
        }
        let mut e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
        if e > 15 {
            return sign | 0x7C00;
        }
        let mut m = rne(a * pow2(10 - e));
        if m == 2048.0 {
            m = 1024.0;
            e += 1;
        }
        if e > 15 {
            return sign | 0x7C00;
        }
        sign | (((e + 15) as u16) << 10) | (m as u16 - 1024)
    }

    #[test]
    fn f16_store_is_rne_and_canonical() {
        let vals: Vec<f32> = bits_sample().map(f32::from_bits).collect();
        let mut v = vals.clone();
        let mut out = vec![0u8; v.len() * 2];
        let mut h = vec![0u16; v.len()];
        store(DataType::F16, &mut v, &mut out, &mut h);
        for (i, x) in vals.iter().enumerate() {
            let got = u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
            if x.is_nan() {
                assert_eq!(got, super::super::format::NAN_F16);
            } else {
                let want = f16_rne_reference(*x);
                assert_eq!(got, want, "{:#x}", x.to_bits());
            }
        }
    }

    #[test]
    fn load_widens_exactly() {
        let mut h = vec![0u16; 4];
        let mut f = vec![0f32; 4];
        let src: Vec<u8> = [0x3F80u16, 0xBF00, 0x0001, 0x7F80]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        load(DataType::BF16, &src, &mut f, &mut h);
        assert_eq!(f[..2], [1.0, -0.5]);
        assert_eq!(f[2].to_bits(), 0x0001_0000);
        assert_eq!(f[3], f32::INFINITY);
        load(DataType::F16, &src, &mut f, &mut h);
        assert_eq!(f[0], 1.875);
        assert_eq!(f[2], f16::from_bits(1).to_f32());
    }
}
