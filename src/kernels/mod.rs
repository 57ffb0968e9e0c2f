//! CPU reference kernels of strata's block-quantized wire format: the oracle the CUDA
//! (`kernels-cuda/`) and HIP (`kernels-hip/`) kernels must match bit for bit.
//!
//! The format and every rounding rule are specified in `docs/quantization.md`:
//! block-wise symmetric quantization to int8/int4 with one f32 scale per `block`
//! elements (ZeRO++ E.1), scales first in each packed slice so data and scales travel in
//! one message; NaN/Inf poison their block; all-zero blocks are exact.
//!
//! | kernel | ZeRO++ | used by |
//! |---|---|---|
//! | [`quantize`], [`dequantize`] | B.1, E.1 | `qwz` all-gather, `qgz` 1-hop |
//! | [`swizzled_quantize`] (+ [`swizzle_ranges`], [`swizzled_len`], [`swizzled_offset`]) | B.3.2, Algorithm 2, F.2 | `qgz` first hop |
//! | [`dequant_reduce_quant`] | E.3, F.2 | `qgz` middle hop |
//! | [`dequant_reduce`] | B.3.1, E.3 | `qgz` last step |
//!
//! Inputs and outputs are little-endian byte slices with no alignment requirement;
//! element types are f32, f16 and bf16 (bf16 read as bf16). Every function checks
//! every size and returns [`InvalidArgument`](crate::Error::InvalidArgument) naming the
//! expected and given sizes; none panics on bad input, and n = 0 is a valid no-op.
//! Single-threaded; no `unsafe` (f16 conversion uses `half`, with F16C when present).

#![forbid(unsafe_code)]

mod convert;
mod format;
mod fused;
mod quantize;
mod swizzle;

pub use format::{QuantSpec, MAX_BLOCK, NAN_BF16, NAN_F16, NAN_F32, SCALE_BYTES};
pub use fused::{dequant_reduce, dequant_reduce_quant};
pub use quantize::{dequantize, quantize};
pub use swizzle::{
    swizzle_check, swizzle_ranges, swizzled_len, swizzled_offset, swizzled_quantize,
};
