//! The launch vocabulary shared by the device layer and the kernels: device addresses,
//! regions, one quantization-kernel call ([`QuantCall`]), the element-wise launch
//! geometry and its alignment check. Data only: the device layer
//! ([`crate::device`]) launches, this layer never opens a device.

#![forbid(unsafe_code)]

use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::QuantSpec;

/// A device address (`CUdeviceptr`, a HIP device pointer).
pub type DevAddr = u64;

/// `len` bytes of device memory at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: DevAddr,
    pub len: usize,
}

/// One element-wise kernel on device memory (`strata_reduce_*`, `strata_divide_*`), as a
/// stream enqueues it (`DevStream::elementwise`).
#[derive(Debug, Clone, Copy)]
pub enum Elementwise {
    /// `acc[i] = op(acc[i], src[i])` over `count` elements (`Avg` sums).
    Reduce {
        /// The accumulator, read and written.
        acc: DevAddr,
        /// The other operand.
        src: DevAddr,
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// The reduction.
        op: ReduceOp,
    },
    /// `buf[i] /= n`, rounded once (the exact mean of `Avg`).
    Divide {
        /// The values, divided in place.
        buf: DevAddr,
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// The divisor (the world size).
        n: usize,
    },
}

/// One launch of a quantization kernel, with the arguments of the CPU reference in
/// [`crate::kernels`] (multi-input kernels take their k inputs as one contiguous region,
/// sender `s` at `s · per_sender` bytes).
#[derive(Debug, Clone, Copy)]
pub enum QuantCall {
    /// [`crate::kernels::quantize`].
    Quantize {
        spec: QuantSpec,
        dtype: DataType,
        src: Region,
        dst: Region,
    },
    /// [`crate::kernels::swizzled_quantize`].
    Swizzled {
        spec: QuantSpec,
        dtype: DataType,
        src: Region,
        c: usize,
        nodes: usize,
        devices: usize,
        stages: usize,
        dst: Region,
    },
    /// [`crate::kernels::dequant_reduce`] (k = 1 and `Sum`: [`crate::kernels::dequantize`]).
    DequantReduce {
        spec: QuantSpec,
        inputs: Region,
        k: usize,
        n: usize,
        op: ReduceOp,
        divisor: usize,
        dtype: DataType,
        dst: Region,
    },
    /// [`crate::kernels::dequant_reduce_quant`].
    DequantReduceQuant {
        spec: QuantSpec,
        inputs: Region,
        k: usize,
        n: usize,
        slices: usize,
        dst: Region,
    },
}

/// Launch geometry of the element-wise kernels: 256 threads, one 16-byte vector of
/// `dtype` a thread per pass (the kernels take 16-byte vectors when the buffers are
/// aligned, element by element otherwise), grid-stride, at most 65535 blocks.
pub fn elementwise_grid(count: usize, dtype: DataType) -> (u32, u32) {
    let threads = 256usize;
    let per_block = threads * (16 / dtype.size());
    let blocks = count.div_ceil(per_block).clamp(1, 65535) as u32;
    (blocks, threads as u32)
}

/// The alignment check of the element-wise kernels (they load whole elements).
pub fn check_aligned(what: &str, addrs: &[DevAddr], dtype: DataType) -> Result<()> {
    let a = dtype.size() as u64;
    if let Some(bad) = addrs.iter().find(|&&p| p % a != 0) {
        return Err(Error::InvalidArgument(format!(
            "{what}: device address {bad:#x} is not aligned to its {dtype} elements ({a} bytes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_counts() {
        assert_eq!(elementwise_grid(0, DataType::F32), (1, 256));
        assert_eq!(elementwise_grid(1024, DataType::F32), (1, 256));
        assert_eq!(elementwise_grid(1025, DataType::F32), (2, 256));
        assert_eq!(elementwise_grid(2049, DataType::BF16), (2, 256));
        assert_eq!(elementwise_grid(513, DataType::F64), (2, 256));
        assert_eq!(elementwise_grid(usize::MAX / 2, DataType::U8).0, 65535);
    }

    #[test]
    fn alignment_is_checked() {
        assert!(check_aligned("t", &[0, 4, 8], DataType::F32).is_ok());
        let e = check_aligned("t", &[0, 6], DataType::F32).unwrap_err();
        assert!(e.to_string().contains("0x6"), "{e}");
        assert!(check_aligned("t", &[1, 3], DataType::U8).is_ok());
    }
}
