//! Element values of the valid collectives, their reference results and the comparison.

#![allow(non_upper_case_globals)] // strata.h's C names, matched on.
//! Inputs are small integers (halves for the quantized calls), so sums, products, minima
//! and maxima are exact in every dtype; `avg` rounds once, as strata documents.

use half::{bf16, f16};
use std::ffi::c_int;
use strata::capi::*;

pub const DTYPES: [c_int; 10] = [
    strataInt8,
    strataUint8,
    strataInt32,
    strataUint32,
    strataInt64,
    strataUint64,
    strataFloat16,
    strataFloat32,
    strataFloat64,
    strataBfloat16,
];
pub const OPS: [c_int; 5] = [strataSum, strataProd, strataMax, strataMin, strataAvg];
pub const FLOATS: [c_int; 4] = [strataFloat16, strataFloat32, strataFloat64, strataBfloat16];
/// The element types of the quantized collectives.
pub const QUANT_FLOATS: [c_int; 3] = [strataFloat16, strataFloat32, strataBfloat16];

pub fn size(dt: c_int) -> usize {
    match dt {
        strataInt8 | strataUint8 => 1,
        strataFloat16 | strataBfloat16 => 2,
        strataInt64 | strataUint64 | strataFloat64 => 8,
        _ => 4,
    }
}

fn is_float(dt: c_int) -> bool {
    FLOATS.contains(&dt)
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d1_11eb_1331_33eb);
    z ^ (z >> 31)
}

/// What the values of one collective look like.
#[derive(Clone, Copy, Debug)]
pub struct Values {
    pub seed: u64,
    pub dt: c_int,
    pub op: c_int,
    pub quant: bool,
}

impl Values {
    /// Element `idx` of rank `rank`'s input.
    pub fn at(&self, rank: usize, idx: usize) -> f64 {
        let h = mix(self.seed ^ ((rank as u64) << 48) ^ idx as u64);
        if self.quant {
            return ((h % 17) as f64 - 8.0) / 2.0;
        }
        let unsigned = matches!(self.dt, strataUint8 | strataUint32 | strataUint64);
        if self.op == strataProd {
            // At most three factors of 2 (|product| <= 8): exact in every dtype.
            return if rank < 3 && h % 3 == 0 {
                2.0
            } else if unsigned || h & 8 == 0 {
                1.0
            } else {
                -1.0
            };
        }
        if unsigned {
            (h % 9) as f64
        } else {
            (h % 9) as f64 - 4.0
        }
    }

    /// `op` over ranks `0..n` of element `idx`, rounded as the dtype stores it.
    pub fn reduced(&self, n: usize, idx: usize) -> f64 {
        let mut acc = self.at(0, idx);
        for q in 1..n {
            let v = self.at(q, idx);
            acc = match self.op {
                strataProd => acc * v,
                strataMax => acc.max(v),
                strataMin => acc.min(v),
                _ => acc + v,
            };
        }
        if self.op == strataAvg {
            let m = acc / n as f64;
            return if is_float(self.dt) {
                round_to(self.dt, m)
            } else {
                m.round()
            };
        }
        acc
    }

    /// Fill `out` (`out.len() / size` elements) with rank `rank`'s elements `first..`.
    pub fn fill(&self, out: &mut [u8], rank: usize, first: usize) {
        let s = size(self.dt);
        for (i, b) in out.chunks_exact_mut(s).enumerate() {
            encode(self.dt, self.at(rank, first + i), b);
        }
    }

    /// How far an element may be from the reference: 0 for exact results, the dtype's
    /// rounding for `avg`, the quantization bound (loosely, for `n` ranks) otherwise.
    pub fn tolerance(&self, n: usize, bits: c_int, reduced: bool, want: f64) -> f64 {
        let eps = match self.dt {
            strataFloat16 => 1e-3,
            strataBfloat16 => 8e-3,
            strataFloat32 => 1e-6,
            strataFloat64 => 1e-15,
            _ => 0.0,
        } * want.abs().max(1.0);
        if !self.quant {
            return eps;
        }
        let step = 8.0 / ((1u64 << bits.clamp(1, 16)) - 1) as f64;
        let hops = if reduced { 2.0 * n as f64 } else { 1.0 };
        let q = step * hops * 1.5;
        let q = if reduced && self.op == strataAvg {
            q / n as f64
        } else {
            q
        };
        q + 2.0 * eps
    }
}

pub fn encode(dt: c_int, v: f64, b: &mut [u8]) {
    match dt {
        strataInt8 => b[0] = v as i8 as u8,
        strataUint8 => b[0] = v as u8,
        strataInt32 => b.copy_from_slice(&(v as i32).to_le_bytes()),
        strataUint32 => b.copy_from_slice(&(v as u32).to_le_bytes()),
        strataInt64 => b.copy_from_slice(&(v as i64).to_le_bytes()),
        strataUint64 => b.copy_from_slice(&(v as u64).to_le_bytes()),
        strataFloat64 => b.copy_from_slice(&v.to_le_bytes()),
        strataFloat16 => b.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        strataBfloat16 => b.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        _ => b.copy_from_slice(&(v as f32).to_le_bytes()),
    }
}

pub fn decode(dt: c_int, b: &[u8]) -> f64 {
    match dt {
        strataInt8 => b[0] as i8 as f64,
        strataUint8 => b[0] as f64,
        strataInt32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        strataUint32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        strataInt64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
        strataUint64 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
        strataFloat64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        strataFloat16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        strataBfloat16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
    }
}

fn round_to(dt: c_int, v: f64) -> f64 {
    let mut b = [0u8; 8];
    let s = size(dt);
    encode(dt, v, &mut b[..s]);
    decode(dt, &b[..s])
}

/// Compare `got` (bytes) element by element with `want(i)`; the first mismatch, if any.
pub fn compare(
    dt: c_int,
    got: &[u8],
    want: impl Fn(usize) -> f64,
    tol: impl Fn(f64) -> f64,
) -> Result<(), String> {
    for (i, b) in got.chunks_exact(size(dt)).enumerate() {
        let (g, w) = (decode(dt, b), want(i));
        if !((g - w).abs() <= tol(w)) {
            return Err(format!("element {i}: got {g}, want {w}"));
        }
    }
    Ok(())
}
