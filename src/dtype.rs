//! Element types and reduction operators, with the byte-level reduction kernels every
//! host transport uses.
//!
//! Reductions on f16/bf16 are computed in f32 and rounded once per step, as NCCL does.
//! `Avg` is the exact mean over the communicator: algorithms reduce with `Sum` and divide
//! once at the end ([`finish_avg`]), so no intermediate is pre-scaled.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of a buffer. Numeric values follow `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(i32)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    F16 = 6,
    F32 = 7,
    BF16 = 9,
}

impl DataType {
    /// Every supported type.
    pub const ALL: [DataType; 6] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F32 | DataType::I32 => 4,
        }
    }

    /// Short name as used on the command line (`f32`, `f16`, `bf16`, `i8`, `u8`, `i32`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::BF16 => "bf16",
        }
    }

    /// From the NCCL numeric value (C ABI).
    pub fn from_raw(v: i32) -> Result<DataType> {
        DataType::ALL
            .into_iter()
            .find(|d| *d as i32 == v)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown datatype {v}")))
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DataType::F16 | DataType::F32 | DataType::BF16)
    }

    /// Read element `i` of `bytes` as f64 (for references and checks).
    pub fn get(self, bytes: &[u8], i: usize) -> f64 {
        let s = self.size();
        let b = &bytes[i * s..(i + 1) * s];
        match self {
            DataType::I8 => b[0] as i8 as f64,
            DataType::U8 => b[0] as f64,
            DataType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        }
    }

    /// Write `v` (rounded to nearest, saturating for integers) as element `i` of `bytes`.
    pub fn set(self, bytes: &mut [u8], i: usize, v: f64) {
        let s = self.size();
        let b = &mut bytes[i * s..(i + 1) * s];
        match self {
            DataType::I8 => b[0] = (v.round().clamp(-128.0, 127.0) as i8) as u8,
            DataType::U8 => b[0] = v.round().clamp(0.0, 255.0) as u8,
            DataType::I32 => b.copy_from_slice(&(v.round() as i32).to_le_bytes()),
            DataType::F16 => b.copy_from_slice(&f16::from_f32(f64_to_f32_odd(v)).to_le_bytes()),
            DataType::BF16 => b.copy_from_slice(&bf16::from_f32(f64_to_f32_odd(v)).to_le_bytes()),
            DataType::F32 => b.copy_from_slice(&(v as f32).to_le_bytes()),
        }
    }

    /// Largest acceptable |got - want| when comparing a reduction of `terms` values of
    /// magnitude up to `mag` against an f64 reference (a few ulps of the result).
    pub fn tolerance(self, mag: f64, terms: usize) -> f64 {
        let eps = match self {
            DataType::F32 => f32::EPSILON as f64,
            DataType::F16 => 9.77e-4,
            DataType::BF16 => 7.82e-3,
            _ => return 0.5,
        };
        eps * mag.max(1.0) * (terms.max(1) as f64).log2().ceil().max(1.0) * 2.0
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => DataType::F32,
            "f16" | "half" | "float16" => DataType::F16,
            "bf16" | "bfloat16" => DataType::BF16,
            "i8" | "int8" => DataType::I8,
            "u8" | "uint8" => DataType::U8,
            "i32" | "int32" => DataType::I32,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown dtype '{other}' (f32, f16, bf16, i8, u8, i32)"
                )))
            }
        })
    }
}

/// Reduction operator. Numeric values follow `ncclRedOp_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(i32)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    /// Exact mean over the communicator.
    Avg = 4,
}

impl ReduceOp {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// From the NCCL numeric value (C ABI).
    pub fn from_raw(v: i32) -> Result<ReduceOp> {
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ]
        .into_iter()
        .find(|o| *o as i32 == v)
        .ok_or_else(|| Error::InvalidArgument(format!("unknown reduction op {v}")))
    }

    /// The op used for partial (per-step) reductions: `Avg` sums and divides at the end.
    pub fn partial(self) -> ReduceOp {
        if self == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            self
        }
    }

    /// Combine two f64 values (reference semantics).
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" | "mean" => ReduceOp::Avg,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown reduction op '{other}' (sum, prod, max, min, avg)"
                )))
            }
        })
    }
}

/// f64 to f32 rounding to odd: exact where f32 holds the value, else truncated with the
/// last bit set. Rounding that to f16/bf16 (nearest even) equals one correct rounding of
/// the f64, since f32 keeps at least two more bits than either; `half`'s own `from_f64`
/// drops low bits (bf16) or rounds twice (f16 with F16C). The device kernels do the same
/// (`kernels-cuda/strata_reduce.cuh`).
pub fn f64_to_f32_odd(v: f64) -> f32 {
    let f = v as f32;
    let d = f as f64;
    if d == v || v.is_nan() {
        return f;
    }
    if f.is_infinite() {
        return if v < 0.0 { -f32::MAX } else { f32::MAX };
    }
    let mut u = f.to_bits();
    if d.abs() > v.abs() {
        u -= 1;
    }
    f32::from_bits(u | 1)
}

/// A Rust element type strata can move and reduce.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DataType;
}
impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
}
impl Element for f16 {
    const DTYPE: DataType = DataType::F16;
}
impl Element for bf16 {
    const DTYPE: DataType = DataType::BF16;
}
impl Element for i8 {
    const DTYPE: DataType = DataType::I8;
}
impl Element for u8 {
    const DTYPE: DataType = DataType::U8;
}
impl Element for i32 {
    const DTYPE: DataType = DataType::I32;
}

fn combine<T: Copy>(
    acc: &mut [T],
    src: &[T],
    op: ReduceOp,
    add: impl Fn(T, T) -> T,
    mul: impl Fn(T, T) -> T,
    lt: impl Fn(T, T) -> bool,
) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            acc.iter_mut().zip(src).for_each(|(a, b)| *a = add(*a, *b))
        }
        ReduceOp::Prod => acc.iter_mut().zip(src).for_each(|(a, b)| *a = mul(*a, *b)),
        ReduceOp::Max => acc.iter_mut().zip(src).for_each(|(a, b)| {
            if lt(*a, *b) {
                *a = *b
            }
        }),
        ReduceOp::Min => acc.iter_mut().zip(src).for_each(|(a, b)| {
            if lt(*b, *a) {
                *a = *b
            }
        }),
    }
}

fn reduce_typed<T: bytemuck::Pod>(
    acc: &mut [u8],
    src: &[u8],
    op: ReduceOp,
    add: impl Fn(T, T) -> T,
    mul: impl Fn(T, T) -> T,
    lt: impl Fn(T, T) -> bool,
) {
    // Host buffers are byte vectors without alignment guarantees: work in aligned blocks.
    const BLK: usize = 1024;
    let s = std::mem::size_of::<T>();
    let mut a = [T::zeroed(); BLK];
    let mut b = [T::zeroed(); BLK];
    for (ac, sc) in acc.chunks_mut(BLK * s).zip(src.chunks(BLK * s)) {
        let n = ac.len() / s;
        bytemuck::cast_slice_mut::<T, u8>(&mut a[..n]).copy_from_slice(ac);
        bytemuck::cast_slice_mut::<T, u8>(&mut b[..n]).copy_from_slice(sc);
        combine(&mut a[..n], &b[..n], op, &add, &mul, &lt);
        ac.copy_from_slice(bytemuck::cast_slice(&a[..n]));
    }
}

/// `acc[i] = op(acc[i], src[i])` over raw little-endian bytes of `dtype`.
/// `Avg` accumulates like `Sum`; call [`finish_avg`] once on the final result.
pub fn reduce_into(acc: &mut [u8], src: &[u8], dtype: DataType, op: ReduceOp) {
    debug_assert_eq!(acc.len(), src.len());
    match dtype {
        DataType::F32 => {
            reduce_typed::<f32>(acc, src, op, |a, b| a + b, |a, b| a * b, |a, b| a < b)
        }
        DataType::F16 => reduce_typed::<f16>(
            acc,
            src,
            op,
            |a, b| f16::from_f32(a.to_f32() + b.to_f32()),
            |a, b| f16::from_f32(a.to_f32() * b.to_f32()),
            |a, b| a < b,
        ),
        DataType::BF16 => reduce_typed::<bf16>(
            acc,
            src,
            op,
            |a, b| bf16::from_f32(a.to_f32() + b.to_f32()),
            |a, b| bf16::from_f32(a.to_f32() * b.to_f32()),
            |a, b| a < b,
        ),
        DataType::I32 => reduce_typed::<i32>(
            acc,
            src,
            op,
            |a, b| a.wrapping_add(b),
            |a, b| a.wrapping_mul(b),
            |a, b| a < b,
        ),
        DataType::I8 => reduce_typed::<i8>(
            acc,
            src,
            op,
            |a, b| a.wrapping_add(b),
            |a, b| a.wrapping_mul(b),
            |a, b| a < b,
        ),
        DataType::U8 => reduce_typed::<u8>(
            acc,
            src,
            op,
            |a, b| a.wrapping_add(b),
            |a, b| a.wrapping_mul(b),
            |a, b| a < b,
        ),
    }
}

/// Divide every element of a summed buffer by `n` (the exact mean of `Avg`), rounding once.
pub fn finish_avg(buf: &mut [u8], dtype: DataType, n: usize) {
    let count = buf.len() / dtype.size();
    let inv = n as f64;
    for i in 0..count {
        let v = dtype.get(buf, i) / inv;
        dtype.set(buf, i, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_from_f64_round_once() {
        // bf16 0x0689 / 4111: the f64 quotient sits just above a bf16 halfway point that
        // dropping its low bits would miss.
        let v = bf16::from_bits(0x0689).to_f64() / 4111.0;
        let mut b = [0u8; 2];
        DataType::BF16.set(&mut b, 0, v);
        assert_eq!(u16::from_le_bytes(b), 0x0089);
        assert_eq!(f64_to_f32_odd(1.0), 1.0);
        assert_eq!(f64_to_f32_odd(f64::MAX), f32::MAX);
        assert!(f64_to_f32_odd(f64::NAN).is_nan());
        let x = 1.0 + 2f64.powi(-40);
        assert_eq!(f64_to_f32_odd(x).to_bits(), 1.0f32.to_bits() | 1);
    }

    #[test]
    fn reduce_all_types() {
        for dt in DataType::ALL {
            let n = 2500;
            let mut a = vec![0u8; n * dt.size()];
            let mut b = vec![0u8; n * dt.size()];
            for i in 0..n {
                dt.set(&mut a, i, (i % 7) as f64);
                dt.set(&mut b, i, (i % 5) as f64);
            }
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                let mut acc = a.clone();
                reduce_into(&mut acc, &b, dt, op);
                for i in 0..n {
                    let want = op.apply((i % 7) as f64, (i % 5) as f64);
                    assert_eq!(dt.get(&acc, i), want, "{dt} {op} at {i}");
                }
            }
        }
    }

    #[test]
    fn avg_divides_once() {
        let dt = DataType::BF16;
        let mut a = vec![0u8; 4];
        dt.set(&mut a, 0, 9.0);
        dt.set(&mut a, 1, -3.0);
        finish_avg(&mut a, dt, 3);
        assert_eq!(dt.get(&a, 0), 3.0);
        assert_eq!(dt.get(&a, 1), -1.0);
    }

    #[test]
    fn parse_names() {
        assert_eq!("bf16".parse::<DataType>().unwrap(), DataType::BF16);
        assert!("f64".parse::<DataType>().is_err());
        assert_eq!(DataType::from_raw(9).unwrap(), DataType::BF16);
        assert!(DataType::from_raw(42).is_err());
        assert_eq!("avg".parse::<ReduceOp>().unwrap(), ReduceOp::Avg);
    }
}
