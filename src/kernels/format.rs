//! The block-quantized wire format: [`QuantSpec`], sizes of packed slices, validation.
//!
//! See `docs/quantization.md` (the contract shared with the CUDA and HIP kernels).

use crate::dtype::DataType;
use crate::error::{Error, Result};

/// Largest accepted block (elements per scale).
pub const MAX_BLOCK: usize = 1 << 20;

/// Bytes of one stored scale (an f32, little-endian).
pub const SCALE_BYTES: usize = 4;

/// The canonical quiet NaN every kernel writes for f32 (scales and outputs).
pub const NAN_F32: u32 = 0x7FC0_0000;
/// The canonical quiet NaN written for f16 outputs.
pub const NAN_F16: u16 = 0x7E00;
/// The canonical quiet NaN written for bf16 outputs.
pub const NAN_BF16: u16 = 0x7FC0;

/// Parameters of block-wise symmetric quantization (ZeRO++ E.1): `bits` per code
/// (4 or 8) and `block` elements per f32 scale.
///
/// Codes lie in `-qmax..=qmax` with `qmax = 2^(bits-1) - 1`; `scale = amax / qmax` per
/// block. Build with [`QuantSpec::new`], which enforces the contract of
/// `docs/quantization.md`: `bits` ∈ {4, 8}, `1 <= block <= 2^20`, `block` even for
/// int4 (every block starts on a byte). The fields are public for pattern matching and
/// configuration; every kernel re-validates a spec and rejects an invalid one with
/// [`Error::InvalidArgument`] instead of doing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Elements per scale (the last block of a slice may be shorter).
    pub block: usize,
}

impl QuantSpec {
    /// A validated spec; InvalidArgument naming the offending value otherwise.
    pub fn new(bits: u32, block: usize) -> Result<QuantSpec> {
        let s = QuantSpec { bits, block };
        s.validate()?;
        Ok(s)
    }

    /// Check the spec against the contract (also run by every kernel).
    pub fn validate(&self) -> Result<()> {
        if self.bits != 4 && self.bits != 8 {
            return Err(Error::InvalidArgument(format!(
                "quantization bits must be 4 or 8, got {}",
                self.bits
            )));
        }
        if self.block == 0 || self.block > MAX_BLOCK {
            return Err(Error::InvalidArgument(format!(
                "quantization block must be in 1..={MAX_BLOCK} elements, got {}",
                self.block
            )));
        }
        if self.bits == 4 && self.block % 2 != 0 {
            return Err(Error::InvalidArgument(format!(
                "int4 quantization needs an even block (so every block starts on a byte), got {}",
                self.block
            )));
        }
        Ok(())
    }

    /// `2^(bits-1) - 1`: 7 for int4, 127 for int8 (0 for a spec with bits outside 2..=31).
    pub fn qmax(&self) -> i32 {
        if (2..=31).contains(&self.bits) {
            (1i32 << (self.bits - 1)) - 1
        } else {
            0
        }
    }

    /// Blocks (hence scales) of a slice of `n` elements: `ceil(n / block)`.
    pub fn blocks(&self, n: usize) -> usize {
        n.div_ceil(self.block.max(1))
    }

    /// Code bytes of a slice of `n` elements: `n` for int8, `ceil(n/2)` for int4.
    pub fn code_len(&self, n: usize) -> usize {
        if self.bits == 4 {
            n.div_ceil(2)
        } else {
            n
        }
    }

    /// Bytes of one packed slice of `n` elements: `4·blocks(n) + code_len(n)` (scales
    /// first, then codes). Saturates at `usize::MAX` for absurd `n`.
    pub fn packed_len(&self, n: usize) -> usize {
        self.checked_packed_len(n).unwrap_or(usize::MAX)
    }

    /// [`packed_len`](Self::packed_len), `None` on overflow.
    pub fn checked_packed_len(&self, n: usize) -> Option<usize> {
        self.blocks(n)
            .checked_mul(SCALE_BYTES)?
            .checked_add(self.code_len(n))
    }

    /// The per-element error bound of the format for a finite block with this `amax`
    /// (`docs/quantization.md`, "Error bound"): `|x - x'| <= scale/2 + amax·2^-21 + 2^-142`
    /// in f32 before the output conversion, with `scale = amax/qmax` as the quantizer
    /// computes it. Rounded up to an f32. 0 for amax = 0 (exact); NaN for a non-finite
    /// amax or an invalid spec (the block dequantizes to NaN); +Inf for the documented
    /// exception (int8, amax = FLT_MAX).
    pub fn step_bound(&self, amax: f32) -> f32 {
        let amax = amax.abs();
        if !amax.is_finite() || self.validate().is_err() {
            return f32::NAN;
        }
        if amax == 0.0 {
            return 0.0;
        }
        if self.bits == 8 && amax == f32::MAX {
            return f32::INFINITY;
        }
        let scale = amax / self.qmax() as f32;
        let b = scale as f64 / 2.0 + amax as f64 * 2f64.powi(-21) + 2f64.powi(-142);
        round_up_f32(b)
    }
}

/// The smallest f32 >= `v` (for v > 0 and finite in f32).
fn round_up_f32(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) < v {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f
    }
}

/// InvalidArgument unless `dtype` is f32, f16 or bf16.
pub(crate) fn check_dtype(what: &str, dtype: DataType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what}: quantization supports f32, f16 and bf16, got {dtype}"
        )))
    }
}

/// InvalidArgument unless `got == want`.
pub(crate) fn check_len(what: &str, buf: &str, want: usize, got: usize) -> Result<()> {
    if want == got {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what}: {buf} has {got} bytes, expected {want}"
        )))
    }
}

/// `n · dtype.size()` bytes, InvalidArgument on overflow.
pub(crate) fn elem_bytes(what: &str, n: usize, dtype: DataType) -> Result<usize> {
    n.checked_mul(dtype.size()).ok_or_else(|| {
        Error::InvalidArgument(format!("{what}: {n} elements of {dtype} overflow usize"))
    })
}

/// `spec.packed_len(n)`, InvalidArgument on overflow.
pub(crate) fn packed_bytes(what: &str, spec: QuantSpec, n: usize) -> Result<usize> {
    spec.checked_packed_len(n).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what}: packed size of {n} elements overflows usize"
        ))
    })
}

/// Spec validation with the kernel's name in the message.
pub(crate) fn check_spec(what: &str, spec: QuantSpec) -> Result<()> {
    spec.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        other => other,
    })
}
