//! Backend-neutral preparation of one device kernel launch: the checks of the CPU
//! reference's API (sizes, specs, element types) on a [`QuantCall`] or an element-wise
//! reduction, then the kernel's symbol, geometry and by-value argument block with the
//! device addresses filled in. The CUDA and HIP devices ([`crate::device`]) only launch
//! what this returns, so both validate identically.

#![forbid(unsafe_code)]

use super::launch::{DevAddr, Elementwise, QuantCall, Region};
use super::names::{kernel_name, reduce_kernel_name, KernelOp};
use super::plan::{
    dequant_plan, drq_plan, quantize_plan, DequantArgs, DrqArgs, Geometry, QuantArgs,
};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::QuantSpec;

/// The argument block of a quantization kernel (passed by value).
#[derive(Debug, Clone, Copy)]
pub enum ArgBlock {
    Quant(QuantArgs),
    Dequant(DequantArgs),
    Drq(DrqArgs),
}

/// A launch ready to enqueue.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Kernel symbol.
    pub name: String,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub threads: u32,
    /// The argument block.
    pub args: ArgBlock,
}

fn bad(what: &str, m: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{what} (GPU): {m}"))
}

fn check_spec(what: &str, spec: QuantSpec) -> Result<()> {
    spec.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => bad(what, m),
        other => other,
    })
}

fn check_float(what: &str, dtype: DataType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(bad(
            what,
            format!("quantization supports f32, f16 and bf16, got {dtype}"),
        ))
    }
}

fn check_len(what: &str, buf: &str, want: usize, r: Region) -> Result<()> {
    if want == r.len {
        Ok(())
    } else {
        Err(bad(
            what,
            format!("{buf} has {} bytes, expected {want}", r.len),
        ))
    }
}

fn overflow(what: &str) -> Error {
    bad(what, "size overflows")
}

/// `per`, the bytes of one sender (`None` where they overflow), after checking that there
/// is at least one sender and that `inputs` holds the `k` senders' bytes.
fn check_senders(what: &str, per: Option<usize>, k: usize, inputs: Region) -> Result<usize> {
    if k == 0 {
        return Err(bad(what, "needs at least one input, got none"));
    }
    let per = per.ok_or_else(|| overflow(what))?;
    let all = per.checked_mul(k).ok_or_else(|| overflow(what))?;
    check_len(what, "inputs", all, inputs)?;
    Ok(per)
}

/// Validate `call` and prepare its launch; `Ok(None)` for a valid empty problem.
pub fn prepare(call: &QuantCall) -> Result<Option<Prepared>> {
    match *call {
        QuantCall::Quantize {
            spec,
            dtype,
            src,
            dst,
        } => {
            const W: &str = "quantize";
            check_spec(W, spec)?;
            check_float(W, dtype)?;
            if src.len % dtype.size() != 0 {
                return Err(bad(
                    W,
                    format!("src has {} bytes, not a whole number of {dtype}", src.len),
                ));
            }
            swizzle(W, spec, dtype, src, src.len / dtype.size(), 1, 1, 1, dst)
        }
        QuantCall::Swizzled {
            spec,
            dtype,
            src,
            c,
            nodes,
            devices,
            stages,
            dst,
        } => {
            const W: &str = "swizzled_quantize";
            crate::kernels::swizzle_check(spec, c, nodes, devices, stages)?;
            check_float(W, dtype)?;
            let want = nodes
                .checked_mul(devices)
                .and_then(|p| p.checked_mul(c))
                .and_then(|e| e.checked_mul(dtype.size()))
                .ok_or_else(|| overflow(W))?;
            check_len(W, "src", want, src)?;
            swizzle(W, spec, dtype, src, c, nodes, devices, stages, dst)
        }
        QuantCall::DequantReduce {
            spec,
            inputs,
            k,
            n,
            op,
            divisor,
            dtype,
            dst,
        } => {
            const W: &str = "dequant_reduce";
            let div = match op {
                ReduceOp::Sum => None,
                ReduceOp::Avg if divisor >= 1 => Some(divisor as f32),
                ReduceOp::Avg => return Err(bad(W, "avg needs a divisor >= 1 (the world size)")),
                other => {
                    return Err(bad(
                        W,
                        format!("quantized reduction supports sum and avg, got {other}"),
                    ))
                }
            };
            check_spec(W, spec)?;
            check_float(W, dtype)?;
            check_senders(W, spec.checked_packed_len(n), k, inputs)?;
            check_len(
                W,
                "dst",
                n.checked_mul(dtype.size()).ok_or_else(|| overflow(W))?,
                dst,
            )?;
            Ok(
                dequant_plan(spec, dtype, n, k, div, Geometry::current()).map(|(l, mut a)| {
                    a.input = inputs.addr;
                    a.out = dst.addr;
                    Prepared {
                        name: super::names::dequant_kernel_name(
                            dtype,
                            spec.bits,
                            super::plan::one_sender(k, div),
                        ),
                        grid: l.grid,
                        threads: l.threads,
                        args: ArgBlock::Dequant(a),
                    }
                }),
            )
        }
        QuantCall::DequantReduceQuant {
            spec,
            inputs,
            k,
            n,
            slices,
            dst,
        } => {
            const W: &str = "dequant_reduce_quant";
            check_spec(W, spec)?;
            let per = spec
                .checked_packed_len(n)
                .and_then(|one| one.checked_mul(slices));
            let per = check_senders(W, per, k, inputs)?;
            check_len(W, "dst", per, dst)?;
            Ok(
                drq_plan(spec, n, slices, k, Geometry::current()).map(|(l, mut a)| {
                    a.input = inputs.addr;
                    a.out = dst.addr;
                    Prepared {
                        name: kernel_name(KernelOp::DequantReduceQuant, None, spec.bits),
                        grid: l.grid,
                        threads: l.threads,
                        args: ArgBlock::Drq(a),
                    }
                }),
            )
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn swizzle(
    what: &str,
    spec: QuantSpec,
    dtype: DataType,
    src: Region,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
    dst: Region,
) -> Result<Option<Prepared>> {
    let total = crate::kernels::swizzled_len(spec, c, nodes, devices, stages);
    if total == usize::MAX {
        return Err(overflow(what));
    }
    check_len(what, "dst", total, dst)?;
    Ok(
        quantize_plan(spec, dtype, c, nodes, devices, stages, Geometry::current()).map(
            |(l, mut a)| {
                a.input = src.addr;
                a.out = dst.addr;
                Prepared {
                    name: kernel_name(KernelOp::Quantize, Some(dtype), spec.bits),
                    grid: l.grid,
                    threads: l.threads,
                    args: ArgBlock::Quant(a),
                }
            },
        ),
    )
}

/// An element-wise launch (`strata_reduce_*` / `strata_divide_*`): symbol and geometry
/// after the alignment check; `None` for zero elements.
pub fn elementwise(
    what: &str,
    addrs: &[DevAddr],
    count: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
) -> Result<Option<(String, u32, u32)>> {
    super::launch::check_aligned(what, addrs, dtype)?;
    if count == 0 {
        return Ok(None);
    }
    let (grid, threads) = super::launch::elementwise_grid(count, dtype);
    Ok(Some((reduce_kernel_name(dtype, op), grid, threads)))
}

impl Elementwise {
    /// The launch of this kernel ([`elementwise`]): symbol and geometry after the
    /// alignment check; `None` for zero elements.
    pub fn prepare(&self) -> Result<Option<(String, u32, u32)>> {
        match *self {
            Elementwise::Reduce {
                acc,
                src,
                count,
                dtype,
                op,
            } => elementwise("reduce", &[acc, src], count, dtype, Some(op)),
            Elementwise::Divide {
                buf, count, dtype, ..
            } => elementwise("divide", &[buf], count, dtype, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(bits: u32, block: usize) -> QuantSpec {
        QuantSpec { bits, block }
    }

    #[test]
    fn prepares_and_checks() {
        let q = spec(8, 256);
        let n = 1000;
        let src = Region {
            addr: 0x1000,
            len: n * 4,
        };
        let dst = Region {
            addr: 0x9000,
            len: q.packed_len(n),
        };
        let p = prepare(&QuantCall::Quantize {
            spec: q,
            dtype: DataType::F32,
            src,
            dst,
        })
        .unwrap()
        .unwrap();
        assert_eq!(p.name, "strata_quantize_f32_q8");
        match p.args {
            ArgBlock::Quant(a) => assert_eq!((a.input, a.out), (0x1000, 0x9000)),
            other => panic!("{other:?}"),
        }
        let short = Region { len: 3, ..dst };
        let e = prepare(&QuantCall::Quantize {
            spec: q,
            dtype: DataType::F32,
            src,
            dst: short,
        })
        .unwrap_err();
        assert!(e.to_string().contains("dst has 3 bytes"), "{e}");
        let e = prepare(&QuantCall::Quantize {
            spec: q,
            dtype: DataType::I32,
            src,
            dst,
        })
        .unwrap_err();
        assert!(e.to_string().contains("f32, f16 and bf16"), "{e}");
        let e = prepare(&QuantCall::DequantReduce {
            spec: q,
            inputs: dst,
            k: 1,
            n,
            op: ReduceOp::Max,
            divisor: 1,
            dtype: DataType::F32,
            dst: src,
        })
        .unwrap_err();
        assert!(e.to_string().contains("sum and avg"), "{e}");
        let empty = Region { addr: 0, len: 0 };
        assert!(prepare(&QuantCall::Quantize {
            spec: q,
            dtype: DataType::F16,
            src: empty,
            dst: empty,
        })
        .unwrap()
        .is_none());
    }

    #[test]
    fn elementwise_launches() {
        let (name, grid, threads) =
            elementwise("t", &[0, 8], 1000, DataType::F32, Some(ReduceOp::Avg))
                .unwrap()
                .unwrap();
        assert_eq!(
            (name.as_str(), grid, threads),
            ("strata_reduce_f32_sum", 1, 256)
        );
        assert!(elementwise("t", &[2], 10, DataType::F32, None).is_err());
        assert!(elementwise("t", &[0], 0, DataType::I8, None)
            .unwrap()
            .is_none());
        assert_eq!(
            elementwise("t", &[0], 1, DataType::BF16, None)
                .unwrap()
                .unwrap()
                .0,
            "strata_divide_bf16"
        );
    }
}
