//! The kernels the sources define and their `extern "C"` symbols.

#![forbid(unsafe_code)]

/// What a kernel does (one extern "C" entry per op, element type and bit width).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelOp {
    /// Swizzled (and plain) quantization: elements in, packed slices out.
    Quantize,
    /// Dequantization (k = 1) and dequantize-reduce: packed slices in, elements out.
    DequantReduce,
    /// Dequantization of one sender without a division (k = 1, Sum; the arguments of
    /// `DequantReduce`, more elements a lane).
    Dequantize,
    /// Fused dequantize-reduce-quantize: packed slices in and out.
    DequantReduceQuant,
}

/// Every kernel of the sources, as `(op, dtype, bits)`; `dtype` is `None` for the fused
/// packed-to-packed kernel.
pub fn kernels() -> Vec<(KernelOp, Option<crate::DataType>, u32)> {
    use crate::DataType::{BF16, F16, F32};
    let mut v = Vec::new();
    for dt in [F32, F16, BF16] {
        for bits in [8, 4] {
            v.push((KernelOp::Quantize, Some(dt), bits));
            v.push((KernelOp::Dequantize, Some(dt), bits));
            v.push((KernelOp::DequantReduce, Some(dt), bits));
        }
    }
    for bits in [8, 4] {
        v.push((KernelOp::DequantReduceQuant, None, bits));
    }
    v
}

/// The symbol of a kernel, e.g. `strata_quantize_bf16_q4`.
pub fn kernel_name(op: KernelOp, dtype: Option<crate::DataType>, bits: u32) -> String {
    let dt = dtype.map(|d| d.name()).unwrap_or("");
    match op {
        KernelOp::Quantize => format!("strata_quantize_{dt}_q{bits}"),
        KernelOp::DequantReduce => format!("strata_dequant_reduce_{dt}_q{bits}"),
        KernelOp::Dequantize => format!("strata_dequantize_{dt}_q{bits}"),
        KernelOp::DequantReduceQuant => format!("strata_dequant_reduce_quant_q{bits}"),
    }
}

/// The dequantizing kernel: `strata_dequantize_*` for one sender without a division
/// (`one`), `strata_dequant_reduce_*` otherwise (same arguments).
pub fn dequant_kernel_name(dtype: crate::DataType, bits: u32, one: bool) -> String {
    let op = if one {
        KernelOp::Dequantize
    } else {
        KernelOp::DequantReduce
    };
    kernel_name(op, Some(dtype), bits)
}

/// Every kernel symbol (20: 3 element types x 2 widths x 3 ops, plus 2 fused).
pub fn kernel_names() -> Vec<String> {
    kernels()
        .into_iter()
        .map(|(op, dt, bits)| kernel_name(op, dt, bits))
        .collect()
}

/// The reduction kernels: `strata_reduce_{dtype}_{sum|prod|max|min}(acc, src, n)` and
/// `strata_divide_{dtype}(buf, count, n as f64)` for every [`crate::DataType`].
pub fn reduce_kernel_name(dtype: crate::DataType, op: Option<crate::ReduceOp>) -> String {
    use crate::ReduceOp::*;
    match op {
        None => format!("strata_divide_{}", dtype.name()),
        Some(Sum | Avg) => format!("strata_reduce_{}_sum", dtype.name()),
        Some(o) => format!("strata_reduce_{}_{}", dtype.name(), o.name()),
    }
}

/// Every reduction kernel symbol (10 element types x (4 ops + divide)).
pub fn reduce_kernel_names() -> Vec<String> {
    use crate::ReduceOp::*;
    crate::DataType::ALL
        .into_iter()
        .flat_map(|dt| {
            [Some(Sum), Some(Prod), Some(Max), Some(Min), None]
                .into_iter()
                .map(move |op| reduce_kernel_name(dt, op))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels_gpu::source::{CUDA_ENTRY, CUDA_HEADER, CUDA_SOURCE, REDUCE_HEADER};

    #[test]
    fn sources_name_every_kernel_once() {
        let names = kernel_names();
        assert_eq!(names.len(), 20);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 20);
        assert_eq!(
            dequant_kernel_name(crate::DataType::BF16, 4, true),
            "strata_dequantize_bf16_q4"
        );
        assert_eq!(
            dequant_kernel_name(crate::DataType::F32, 8, false),
            "strata_dequant_reduce_f32_q8"
        );
        // The names are built by token pasting in the header's instantiation macro.
        assert!(CUDA_HEADER.contains("strata_quantize_##DTN##_q##BITS"));
        assert!(CUDA_HEADER.contains("strata_dequant_reduce_quant_q8"));
        assert!(CUDA_SOURCE.starts_with(CUDA_HEADER));
        assert!(CUDA_SOURCE.contains(REDUCE_HEADER));
        assert!(CUDA_ENTRY.contains("STRATA_QUANT_KERNELS()"));
        assert!(CUDA_ENTRY.contains("STRATA_REDUCE_KERNELS()"));
        let reduce = reduce_kernel_names();
        assert_eq!(reduce.len(), 50);
        assert!(REDUCE_HEADER.contains("strata_reduce_##DTN##_##OPN"));
        assert!(REDUCE_HEADER.contains("strata_divide_##DTN"));
    }
}
