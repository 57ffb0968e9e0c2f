//! Element types and reduction operators, with the byte-level reduction kernels every
//! host transport uses.
//!
//! Reductions on f16/bf16 are computed in f32 and rounded once per step, as NCCL does.
//! `Avg` is the exact mean over the communicator: algorithms reduce with `Sum` and divide
//! once at the end ([`finish_avg`]), so no intermediate is pre-scaled.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

crate::kinds::display_as_name!(DataType, ReduceOp);

/// Element type of a buffer. Numeric values follow `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(i32)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    BF16 = 9,
}

impl DataType {
    /// Every supported type.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// Short name as used on the command line (`f32`, `f16`, `bf16`, `i8`, `u8`, `i32`,
    /// `u32`, `i64`, `u64`, `f64`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::BF16 => "bf16",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F64 => "f64",
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
        matches!(
            self,
            DataType::F16 | DataType::F32 | DataType::BF16 | DataType::F64
        )
    }

    /// Read element `i` of `bytes` as f64 (for references and checks; 64-bit integers
    /// beyond 2^53 in magnitude come back rounded).
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
            DataType::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::I64 => i64::from_le_bytes(le8(b)) as f64,
            DataType::U64 => u64::from_le_bytes(le8(b)) as f64,
            DataType::F64 => f64::from_le_bytes(le8(b)),
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
            // `as` saturates (and maps NaN to 0), as the 8-bit types clamp.
            DataType::U32 => b.copy_from_slice(&(v.round() as u32).to_le_bytes()),
            DataType::I64 => b.copy_from_slice(&(v.round() as i64).to_le_bytes()),
            DataType::U64 => b.copy_from_slice(&(v.round() as u64).to_le_bytes()),
            DataType::F64 => b.copy_from_slice(&v.to_le_bytes()),
        }
    }

    /// Largest acceptable |got - want| when comparing a reduction of `terms` values of
    /// magnitude up to `mag` against an f64 reference (a few ulps of the result).
    pub fn tolerance(self, mag: f64, terms: usize) -> f64 {
        let eps = match self {
            DataType::F32 => f32::EPSILON as f64,
            DataType::F16 => 9.77e-4,
            DataType::BF16 => 7.82e-3,
            DataType::F64 => f64::EPSILON,
            _ => return 0.5,
        };
        eps * mag.max(1.0) * (terms.max(1) as f64).log2().ceil().max(1.0) * 2.0
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
            "u32" | "uint32" => DataType::U32,
            "i64" | "int64" => DataType::I64,
            "u64" | "uint64" => DataType::U64,
            "f64" | "double" | "float64" => DataType::F64,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown dtype '{other}' (f32, f16, bf16, f64, i8, u8, i32, u32, i64, u64)"
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
#[inline]
pub fn f64_to_f32_odd(v: f64) -> f32 {
    // Branch-free (finish_avg runs it per element).
    let f = v as f32;
    let d = f as f64;
    let odd = f32::from_bits((f.to_bits() - u32::from(d.abs() > v.abs())) | 1);
    let sat = if v < 0.0 { -f32::MAX } else { f32::MAX };
    if d == v || v.is_nan() {
        f
    } else if f.is_infinite() {
        sat
    } else {
        odd
    }
}

/// A Rust element type strata can move and reduce.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DataType;
}
macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        })*
    };
}
element!(f32 => F32, f16 => F16, bf16 => BF16, f64 => F64, i8 => I8, u8 => U8, i32 => I32,
         u32 => U32, i64 => I64, u64 => U64);

/// The first 8 bytes of `b` (a 64-bit element).
#[inline(always)]
fn le8(b: &[u8]) -> [u8; 8] {
    b[..8].try_into().unwrap_or([0; 8])
}

// ---------------------------------------------------------------- host reductions
//
// Host buffers are unaligned little-endian bytes. Every loop below walks fixed-size
// chunks (`CHUNK` bytes, as arrays so that every index is in bounds by construction),
// reads each lane with `from_le_bytes`, combines it with a per-element closure chosen
// once per call (no per-element dispatch) and writes it back: loops the compiler unrolls
// and vectorizes with baseline SSE2. The tail goes through one zero-padded chunk. bf16
// lanes are widened to f32 and rounded back inline exactly as `half` does; f16 goes
// through f32 blocks with `half`'s slice conversions (F16C when present, the same
// conversions as `half`'s scalar ones). Results equal the element-by-element definition
// bit for bit (`tests::matches_scalar_reference`).

/// Bytes per chunk of the vectorized loops.
const CHUNK: usize = 64;

/// A lane word: u8, u16, u32 or u64, little-endian in memory.
trait Word: Copy {
    const SIZE: usize;
    fn get(b: &[u8; CHUNK], i: usize) -> Self;
    fn put(self, b: &mut [u8; CHUNK], i: usize);
}
macro_rules! word {
    ($t:ty, $n:literal) => {
        impl Word for $t {
            const SIZE: usize = $n;
            #[inline(always)]
            fn get(b: &[u8; CHUNK], i: usize) -> Self {
                <$t>::from_le_bytes(b[i * $n..i * $n + $n].try_into().unwrap())
            }
            #[inline(always)]
            fn put(self, b: &mut [u8; CHUNK], i: usize) {
                b[i * $n..i * $n + $n].copy_from_slice(&self.to_le_bytes());
            }
        }
    };
}
word!(u8, 1);
word!(u16, 2);
word!(u32, 4);
word!(u64, 8);

/// The chunk of `s` at `c` (always `CHUNK` bytes: callers index whole chunks).
#[inline(always)]
fn chunk(s: &[u8], c: usize) -> &[u8; CHUNK] {
    s[c * CHUNK..(c + 1) * CHUNK].try_into().unwrap()
}
#[inline(always)]
fn chunk_mut(s: &mut [u8], c: usize) -> &mut [u8; CHUNK] {
    (&mut s[c * CHUNK..(c + 1) * CHUNK]).try_into().unwrap()
}

/// `out[i] = k(a[i], b[i])` over words `W`, with `a = out` when `a` is None (in place).
/// Whole words of the common length only.
#[inline(always)]
fn drive<W: Word>(out: &mut [u8], a: Option<&[u8]>, b: &[u8], k: impl Fn(W, W) -> W) {
    let l = CHUNK / W::SIZE;
    let len = out
        .len()
        .min(b.len())
        .min(a.map_or(usize::MAX, <[u8]>::len));
    let len = len - len % W::SIZE;
    let full = len / CHUNK;
    match a {
        None => {
            for c in 0..full {
                let (o, y) = (chunk_mut(out, c), chunk(b, c));
                for i in 0..l {
                    k(W::get(o, i), W::get(y, i)).put(o, i);
                }
            }
        }
        Some(a) => {
            for c in 0..full {
                let (o, x, y) = (chunk_mut(out, c), chunk(a, c), chunk(b, c));
                for i in 0..l {
                    k(W::get(x, i), W::get(y, i)).put(o, i);
                }
            }
        }
    }
    let at = full * CHUNK;
    if at < len {
        let t = len - at;
        let (mut x, mut y, mut o) = ([0u8; CHUNK], [0u8; CHUNK], [0u8; CHUNK]);
        x[..t].copy_from_slice(&a.unwrap_or(out)[at..len]);
        y[..t].copy_from_slice(&b[at..len]);
        for i in 0..l {
            k(W::get(&x, i), W::get(&y, i)).put(&mut o, i);
        }
        out[at..len].copy_from_slice(&o[..t]);
    }
}

/// In place `buf[i] = k(buf[i])` over words `W` (whole words only).
#[inline(always)]
fn map_words<W: Word>(buf: &mut [u8], k: impl Fn(W) -> W) {
    let l = CHUNK / W::SIZE;
    let len = buf.len() - buf.len() % W::SIZE;
    let full = len / CHUNK;
    for c in 0..full {
        let o = chunk_mut(buf, c);
        for i in 0..l {
            k(W::get(o, i)).put(o, i);
        }
    }
    let at = full * CHUNK;
    if at < len {
        let mut o = [0u8; CHUNK];
        o[..len - at].copy_from_slice(&buf[at..len]);
        for i in 0..l {
            k(W::get(&o, i)).put(&mut o, i);
        }
        buf[at..len].copy_from_slice(&o[..len - at]);
    }
}

/// bf16 bits widened to f32. `half` also sets a NaN's quiet bit; that changes no result
/// here: comparisons ignore it, and a sum or product with one NaN operand returns that
/// NaN quieted either way (with two, which one is unspecified anyway).
#[inline(always)]
fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bf16 bits as `half::bf16::from_f32` does: nearest even, a NaN keeps its high
/// bits with the quiet bit set.
#[inline(always)]
fn f32_to_bf16(v: f32) -> u16 {
    let x = v.to_bits();
    let nan = ((x >> 16) | 0x40) as u16;
    let r = (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        r
    }
}

#[inline(always)]
fn add(a: f32, b: f32) -> f32 {
    a + b
}
#[inline(always)]
fn mul(a: f32, b: f32) -> f32 {
    a * b
}
/// Max keeps `b` where `a < b`, min where `b < a`: a NaN never compares, so a NaN
/// accumulator stays and a NaN source is ignored, as the scalar definition does.
#[inline(always)]
fn lt(a: f32, b: f32) -> bool {
    a < b
}
#[inline(always)]
fn gt(a: f32, b: f32) -> bool {
    b < a
}

/// A float reduction on lanes `W` widened by `wide` to f32: `arith` applies `f` and
/// rounds back with `narrow`; `select` keeps the bits of the operand `take` picks.
#[inline(always)]
fn arith<W: Word>(
    out: &mut [u8],
    a: Option<&[u8]>,
    b: &[u8],
    wide: impl Fn(W) -> f32,
    narrow: impl Fn(f32) -> W,
    f: impl Fn(f32, f32) -> f32,
) {
    drive::<W>(out, a, b, |x, y| narrow(f(wide(x), wide(y))))
}
#[inline(always)]
fn select<W: Word>(
    out: &mut [u8],
    a: Option<&[u8]>,
    b: &[u8],
    wide: impl Fn(W) -> f32,
    take: impl Fn(f32, f32) -> bool,
) {
    drive::<W>(out, a, b, |x, y| if take(wide(x), wide(y)) { y } else { x })
}

/// f16 elements per block of the f16 path: `half`'s slice conversions (F16C when
/// present) on blocks this long beat inline integer conversion on baseline SSE2.
const F16_BLOCK: usize = 512;

/// f16 `out = k(a, b)` (`a = out` when None) through f32 blocks: `k` gets the widened
/// values and the bits of both operands and leaves the result in `fa` (then narrowed,
/// `arith`) or in `ha` (bits kept, `select`).
#[inline(always)]
fn f16_drive(
    out: &mut [u8],
    a: Option<&[u8]>,
    b: &[u8],
    narrow: bool,
    k: impl Fn(&mut [f32], &[f32], &mut [u16], &[u16]),
) {
    let n = out
        .len()
        .min(b.len())
        .min(a.map_or(usize::MAX, <[u8]>::len))
        / 2;
    let (mut ha, mut hb) = ([0u16; F16_BLOCK], [0u16; F16_BLOCK]);
    let (mut fa, mut fb) = ([0f32; F16_BLOCK], [0f32; F16_BLOCK]);
    let load = |h: &mut [u16], f: &mut [f32], src: &[u8]| {
        bytemuck::cast_slice_mut::<u16, u8>(h).copy_from_slice(src);
        if cfg!(target_endian = "big") {
            h.iter_mut().for_each(|w| *w = u16::from_le(*w));
        }
        bytemuck::cast_slice::<u16, f16>(h).convert_to_f32_slice(f);
    };
    for s in (0..n).step_by(F16_BLOCK) {
        let m = F16_BLOCK.min(n - s);
        let r = 2 * s..2 * (s + m);
        let (ha, hb, fa, fb) = (&mut ha[..m], &mut hb[..m], &mut fa[..m], &mut fb[..m]);
        load(ha, fa, &a.unwrap_or(out)[r.clone()]);
        load(hb, fb, &b[r.clone()]);
        k(fa, fb, ha, hb);
        if narrow {
            bytemuck::cast_slice_mut::<u16, f16>(ha).convert_from_f32_slice(fa);
        }
        if cfg!(target_endian = "big") {
            ha.iter_mut().for_each(|w| *w = w.to_le());
        }
        out[r].copy_from_slice(bytemuck::cast_slice::<u16, u8>(ha));
    }
}

#[inline(always)]
fn f16_arith(out: &mut [u8], a: Option<&[u8]>, b: &[u8], f: impl Fn(f32, f32) -> f32) {
    f16_drive(out, a, b, true, |fa, fb, _, _| {
        fa.iter_mut().zip(fb).for_each(|(x, &y)| *x = f(*x, y))
    })
}

#[inline(always)]
fn f16_select(out: &mut [u8], a: Option<&[u8]>, b: &[u8], take: impl Fn(f32, f32) -> bool) {
    f16_drive(out, a, b, false, |fa, fb, ha, hb| {
        for (((h, &g), &x), &y) in ha.iter_mut().zip(hb.iter()).zip(fa.iter()).zip(fb.iter()) {
            if take(x, y) {
                *h = g;
            }
        }
    })
}

/// The one dispatch: `out = op(a, b)` (`a = out` when None).
fn reduce(out: &mut [u8], a: Option<&[u8]>, b: &[u8], dtype: DataType, op: ReduceOp) {
    use ReduceOp::*;
    let (o, f32w, f32n) = (out, f32::from_bits, f32::to_bits);
    let (f64w, f64n) = (f64::from_bits, f64::to_bits);
    match (dtype, op.partial()) {
        (DataType::F32, Sum) => arith::<u32>(o, a, b, f32w, f32n, add),
        (DataType::F32, Prod) => arith::<u32>(o, a, b, f32w, f32n, mul),
        (DataType::F32, Max) => select::<u32>(o, a, b, f32w, lt),
        (DataType::F32, Min) => select::<u32>(o, a, b, f32w, gt),
        (DataType::BF16, Sum) => arith::<u16>(o, a, b, bf16_to_f32, f32_to_bf16, add),
        (DataType::BF16, Prod) => arith::<u16>(o, a, b, bf16_to_f32, f32_to_bf16, mul),
        (DataType::BF16, Max) => select::<u16>(o, a, b, bf16_to_f32, lt),
        (DataType::BF16, Min) => select::<u16>(o, a, b, bf16_to_f32, gt),
        (DataType::F16, Sum) => f16_arith(o, a, b, add),
        (DataType::F16, Prod) => f16_arith(o, a, b, mul),
        (DataType::F16, Max) => f16_select(o, a, b, lt),
        (DataType::F16, Min) => f16_select(o, a, b, gt),
        (DataType::I32, Sum) => drive::<u32>(o, a, b, u32::wrapping_add),
        (DataType::I32, Prod) => drive::<u32>(o, a, b, u32::wrapping_mul),
        (DataType::I32, Max) => drive::<u32>(o, a, b, |x, y| (x as i32).max(y as i32) as u32),
        (DataType::I32, Min) => drive::<u32>(o, a, b, |x, y| (x as i32).min(y as i32) as u32),
        (DataType::U32, Sum) => drive::<u32>(o, a, b, u32::wrapping_add),
        (DataType::U32, Prod) => drive::<u32>(o, a, b, u32::wrapping_mul),
        (DataType::U32, Max) => drive::<u32>(o, a, b, u32::max),
        (DataType::U32, Min) => drive::<u32>(o, a, b, u32::min),
        (DataType::I64 | DataType::U64, Sum) => drive::<u64>(o, a, b, u64::wrapping_add),
        (DataType::I64 | DataType::U64, Prod) => drive::<u64>(o, a, b, u64::wrapping_mul),
        (DataType::I64, Max) => drive::<u64>(o, a, b, |x, y| (x as i64).max(y as i64) as u64),
        (DataType::I64, Min) => drive::<u64>(o, a, b, |x, y| (x as i64).min(y as i64) as u64),
        (DataType::U64, Max) => drive::<u64>(o, a, b, u64::max),
        (DataType::U64, Min) => drive::<u64>(o, a, b, u64::min),
        (DataType::F64, Sum) => drive::<u64>(o, a, b, |x, y| f64n(f64w(x) + f64w(y))),
        (DataType::F64, Prod) => drive::<u64>(o, a, b, |x, y| f64n(f64w(x) * f64w(y))),
        (DataType::F64, Max) => drive::<u64>(o, a, b, |x, y| if f64w(x) < f64w(y) { y } else { x }),
        (DataType::F64, Min) => drive::<u64>(o, a, b, |x, y| if f64w(y) < f64w(x) { y } else { x }),
        (DataType::U8 | DataType::I8, Sum) => drive::<u8>(o, a, b, u8::wrapping_add),
        (DataType::U8 | DataType::I8, Prod) => drive::<u8>(o, a, b, u8::wrapping_mul),
        (DataType::U8, Max) => drive::<u8>(o, a, b, u8::max),
        (DataType::U8, Min) => drive::<u8>(o, a, b, u8::min),
        (DataType::I8, Max) => drive::<u8>(o, a, b, |x, y| (x as i8).max(y as i8) as u8),
        (DataType::I8, Min) => drive::<u8>(o, a, b, |x, y| (x as i8).min(y as i8) as u8),
        (_, Avg) => unreachable!("partial() maps Avg to Sum"),
    }
}

/// `acc[i] = op(acc[i], src[i])` over raw little-endian bytes of `dtype` (no alignment
/// needed). `Avg` accumulates like `Sum`; call [`finish_avg`] once on the final result.
/// f16/bf16 are computed in f32 and rounded once per call; integers wrap; `Max` takes
/// `src` where `acc < src` and `Min` where `src < acc` (a NaN accumulator stays, a NaN
/// source is ignored). A sum or product of two NaNs is one of them, quieted (which one
/// is the compiler's choice, as for any Rust float operation). Lengths should match
/// (debug assertion); otherwise the common whole elements are reduced.
pub fn reduce_into(acc: &mut [u8], src: &[u8], dtype: DataType, op: ReduceOp) {
    debug_assert_eq!(acc.len(), src.len());
    reduce(acc, None, src, dtype, op);
}

/// `out[i] = op(a[i], b[i])` in one pass: bitwise the same as copying `a` into `out`
/// and then [`reduce_into`]`(out, b, ..)`, without the copy (e.g. reducing a peer's
/// buffer straight into the output). Lengths should match (debug assertion); otherwise
/// the common whole elements are written.
pub fn reduce_pair(out: &mut [u8], a: &[u8], b: &[u8], dtype: DataType, op: ReduceOp) {
    debug_assert!(out.len() == a.len() && a.len() == b.len());
    reduce(out, Some(a), b, dtype, op);
}

/// Divide every element of a summed buffer by `n` (the exact mean of `Avg`), rounding
/// once: in f64, then to the type (f16/bf16 through [`f64_to_f32_odd`]; integers
/// rounded half away from zero, saturating for i8/u8), as [`DataType::set`] does.
/// 64-bit integers divide exactly in integer arithmetic ([`int_avg`]), the same
/// rounding without f64's 53-bit limit.
pub fn finish_avg(buf: &mut [u8], dtype: DataType, n: usize) {
    let d = n as f64;
    match dtype {
        DataType::F32 => {
            map_words::<u32>(buf, |w| ((f32::from_bits(w) as f64 / d) as f32).to_bits())
        }
        DataType::BF16 => map_words::<u16>(buf, |w| {
            f32_to_bf16(f64_to_f32_odd(bf16_to_f32(w) as f64 / d))
        }),
        DataType::F16 => {
            let n = buf.len() / 2;
            let (mut h, mut f) = ([0u16; F16_BLOCK], [0f32; F16_BLOCK]);
            for s in (0..n).step_by(F16_BLOCK) {
                let m = F16_BLOCK.min(n - s);
                let (h, f, b) = (&mut h[..m], &mut f[..m], &mut buf[2 * s..2 * (s + m)]);
                bytemuck::cast_slice_mut::<u16, u8>(h).copy_from_slice(b);
                if cfg!(target_endian = "big") {
                    h.iter_mut().for_each(|w| *w = u16::from_le(*w));
                }
                bytemuck::cast_slice::<u16, f16>(h).convert_to_f32_slice(f);
                f.iter_mut()
                    .for_each(|v| *v = f64_to_f32_odd(*v as f64 / d));
                let h16 = bytemuck::cast_slice_mut::<u16, f16>(h);
                h16.convert_from_f32_slice(f);
                if cfg!(target_endian = "big") {
                    h.iter_mut().for_each(|w| *w = w.to_le());
                }
                b.copy_from_slice(bytemuck::cast_slice::<u16, u8>(h));
            }
        }
        DataType::I32 => map_words::<u32>(buf, |w| ((w as i32 as f64 / d).round() as i32) as u32),
        DataType::I8 => map_words::<u8>(buf, |w| {
            ((w as i8 as f64 / d).round().clamp(-128.0, 127.0) as i8) as u8
        }),
        DataType::U8 => map_words::<u8>(buf, |w| (w as f64 / d).round().clamp(0.0, 255.0) as u8),
        DataType::U32 => map_words::<u32>(buf, |w| (w as f64 / d).round() as u32),
        DataType::F64 => map_words::<u64>(buf, |w| (f64::from_bits(w) / d).to_bits()),
        DataType::I64 => map_words::<u64>(buf, |w| int_avg(w as i64 as i128, n) as i64 as u64),
        DataType::U64 => map_words::<u64>(buf, |w| int_avg(w as i128, n) as u64),
    }
}

/// `s / n` rounded half away from zero, exactly (the 64-bit integers' `Avg`; the
/// result of a 64-bit sum always fits its type again).
#[inline(always)]
pub fn int_avg(s: i128, n: usize) -> i128 {
    let n = n.max(1) as i128;
    let (q, r) = (s / n, s % n);
    if 2 * r.abs() >= n {
        q + s.signum()
    } else {
        q
    }
}

#[cfg(test)]
mod tests;
