//! [`GpuQuant`]: the CUDA kernels compiled by NVRTC, loaded into a context, and launched
//! on cudarc device buffers with the CPU reference's API and checks.

use super::call::{prepare, ArgBlock};
use super::launch::{QuantCall, Region};
use super::names::{kernel_name, kernels, reduce_kernel_names};
use super::plan::{DequantArgs, DrqArgs, QuantArgs};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::QuantSpec;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

// SAFETY: #[repr(C)] structs of u64/u32/f32 fields with the layout of StrataQuantArgs,
// StrataDequantArgs and StrataDrqArgs in kernels-cuda/strata_quant.cuh (checked by
// plan::tests::arg_layouts_match_the_header); passed by value as kernel parameters.
unsafe impl DeviceRepr for QuantArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for DequantArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for DrqArgs {}

fn dev(what: &str, e: DriverError) -> Error {
    Error::Device(format!("{what}: {e:?}"))
}

/// The quantization kernels loaded into one CUDA context. Methods mirror
/// [`crate::kernels`] (same arguments, same size checks, same bytes out) on device
/// buffers of bytes (`CudaSlice<u8>` or views, no alignment requirement), and enqueue
/// one kernel on `stream` without synchronizing: results are ready when the stream is.
/// Multi-input kernels take the k sender buffers as one contiguous device buffer (the
/// receive buffer of an all-to-all), sender s at byte `s · per_sender`.
pub struct GpuQuant {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    arch: String,
}

impl std::fmt::Debug for GpuQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuQuant")
            .field("arch", &self.arch)
            .finish()
    }
}

impl GpuQuant {
    /// Compile the kernels with NVRTC for the compute capability of `ctx`'s device and
    /// load them: a CUBIN for the device (`sm_XY`) first (no JIT, and a driver older
    /// than the NVRTC still loads it), else PTX for `compute_XY` (an NVRTC without CUBIN
    /// output, or one that does not know the device yet). Errors as
    /// [`super::compile_cuda_ptx`], plus `Device` when the driver rejects the module.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<GpuQuant> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev("reading the compute capability", e))?;
        let sm = format!("sm_{major}{minor}");
        let cubin = super::compile::compile_cuda_cubin(&sm)
            .and_then(|c| GpuQuant::load(ctx, Ptx::from_binary(c), &format!("{sm} (cubin)")));
        match cubin {
            Ok(q) => Ok(q),
            Err(e) => {
                tracing::debug!("strata kernels as a {sm} CUBIN: {e}; compiling PTX instead");
                let arch = format!("compute_{major}{minor}");
                let ptx = super::compile::compile_cuda_ptx(&arch)?;
                GpuQuant::from_ptx(ctx, ptx, &arch)
            }
        }
    }

    /// Load kernels already compiled to PTX (by [`super::compile_cuda_ptx`]).
    pub fn from_ptx(ctx: &Arc<CudaContext>, ptx: String, arch: &str) -> Result<GpuQuant> {
        GpuQuant::load(ctx, Ptx::from_src(ptx), &format!("{arch} (ptx)"))
    }

    fn load(ctx: &Arc<CudaContext>, image: Ptx, arch: &str) -> Result<GpuQuant> {
        let module = ctx
            .load_module(image)
            .map_err(|e| dev(&format!("loading the {arch} strata kernels"), e))?;
        let mut funcs = HashMap::new();
        let names = kernels()
            .into_iter()
            .map(|(op, dt, bits)| kernel_name(op, dt, bits))
            .chain(reduce_kernel_names());
        for name in names {
            let f = module
                .load_function(&name)
                .map_err(|e| dev(&format!("kernel {name} missing from the module"), e))?;
            funcs.insert(name, f);
        }
        Ok(GpuQuant {
            ctx: ctx.clone(),
            _module: module,
            funcs,
            arch: arch.to_string(),
        })
    }

    /// What the kernels were compiled to: `sm_XY (cubin)` or `compute_XY (ptx)`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The context the kernels live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Validate and launch `make(src region, dst region)` through
    /// [`super::call::prepare`], the one checking path of every device kernel.
    fn run<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        src: &S,
        dst: &mut D,
        make: impl FnOnce(Region, Region) -> QuantCall,
    ) -> Result<()> {
        let (src_ptr, _src_sync) = src.device_ptr(stream);
        let (src_len, dst_len) = (src.len(), dst.len());
        let (dst_ptr, _dst_sync) = dst.device_ptr_mut(stream);
        let call = make(
            Region {
                addr: src_ptr,
                len: src_len,
            },
            Region {
                addr: dst_ptr,
                len: dst_len,
            },
        );
        let Some(p) = prepare(&call)? else {
            return Ok(()); // a valid empty problem: nothing to write
        };
        // SAFETY: the kernel takes one argument block by value, of the layout pushed
        // (plan::tests check it against the header); `prepare` checked that it reads and
        // writes only the two regions, whose buffers stay borrowed (with their stream
        // sync guards) until the launch is enqueued; `&mut dst` rules out aliasing.
        unsafe { self.launch_prepared(stream, &p) }
    }

    /// Enqueue a launch [`prepare`] returned.
    ///
    /// # Safety
    /// The argument block's addresses are live device memory of the sizes `prepare`
    /// checked, not used by anyone else until the stream has run the kernel.
    pub(crate) unsafe fn launch_prepared(
        &self,
        stream: &Arc<CudaStream>,
        p: &super::call::Prepared,
    ) -> Result<()> {
        // SAFETY: the caller's contract; one argument block by value.
        unsafe {
            self.launch(stream, &p.name, p.grid, p.threads, |b| match &p.args {
                ArgBlock::Quant(a) => {
                    b.arg(a);
                }
                ArgBlock::Dequant(a) => {
                    b.arg(a);
                }
                ArgBlock::Drq(a) => {
                    b.arg(a);
                }
            })
        }
    }

    /// Enqueue kernel `name` (of this module) with the arguments `push` adds.
    ///
    /// # Safety
    /// The pushed arguments match the kernel's C signature and every address in them is
    /// live device memory the kernel may touch until the stream has run it.
    pub(crate) unsafe fn launch<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
        name: &str,
        grid: u32,
        threads: u32,
        push: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| Error::Internal(format!("kernel {name} not loaded")))?;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        push(&mut b);
        // SAFETY: the caller's contract.
        unsafe { b.launch(cfg) }.map_err(|e| dev(name, e))?;
        Ok(())
    }

    /// [`crate::kernels::quantize`] on the device: `src` is n elements of `dtype`, `dst`
    /// exactly `spec.packed_len(n)` bytes.
    pub fn quantize<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        dtype: DataType,
        src: &S,
        dst: &mut D,
    ) -> Result<()> {
        self.run(stream, src, dst, |src, dst| QuantCall::Quantize {
            spec,
            dtype,
            src,
            dst,
        })
    }

    /// [`crate::kernels::swizzled_quantize`] on the device (ZeRO++ B.3.2, Algorithm 2,
    /// fused with quantization as in F.2): `src` holds nodes·devices chunks of `c`
    /// elements, `dst` exactly [`crate::kernels::swizzled_len`] bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn swizzled_quantize<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        dtype: DataType,
        src: &S,
        c: usize,
        nodes: usize,
        devices: usize,
        stages: usize,
        dst: &mut D,
    ) -> Result<()> {
        self.run(stream, src, dst, |src, dst| QuantCall::Swizzled {
            spec,
            dtype,
            src,
            c,
            nodes,
            devices,
            stages,
            dst,
        })
    }

    /// [`crate::kernels::dequantize`] on the device: `src` is one packed slice of `n`
    /// elements, `dst` n elements of `dtype`.
    pub fn dequantize<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        src: &S,
        n: usize,
        dtype: DataType,
        dst: &mut D,
    ) -> Result<()> {
        self.dequant_reduce(stream, spec, src, 1, n, ReduceOp::Sum, 1, dtype, dst)
    }

    /// [`crate::kernels::dequant_reduce`] on the device: `inputs` holds the k >= 1 packed
    /// slices of `n` elements in sender order (k·packed_len(n) bytes); `dst` receives n
    /// elements of `dtype`, the f32 sum in sender order (`Avg`: divided once by
    /// `divisor`, the world size).
    #[allow(clippy::too_many_arguments)]
    pub fn dequant_reduce<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        inputs: &S,
        k: usize,
        n: usize,
        op: ReduceOp,
        divisor: usize,
        dtype: DataType,
        dst: &mut D,
    ) -> Result<()> {
        self.run(stream, inputs, dst, |inputs, dst| {
            QuantCall::DequantReduce {
                spec,
                inputs,
                k,
                n,
                op,
                divisor,
                dtype,
                dst,
            }
        })
    }

    /// [`crate::kernels::dequant_reduce_quant`] on the device (qgZ's middle hop, ZeRO++
    /// E.3 fused as in F.2): `inputs` holds k >= 1 sender buffers in order, each `slices`
    /// packed slices of `n` elements (k·slices·packed_len(n) bytes); `dst` receives
    /// `slices` packed slices of the requantized f32 sums.
    #[allow(clippy::too_many_arguments)]
    pub fn dequant_reduce_quant<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        inputs: &S,
        k: usize,
        n: usize,
        slices: usize,
        dst: &mut D,
    ) -> Result<()> {
        self.run(stream, inputs, dst, |inputs, dst| {
            QuantCall::DequantReduceQuant {
                spec,
                inputs,
                k,
                n,
                slices,
                dst,
            }
        })
    }

    /// `acc = op(acc, src)` element-wise over `count` elements of `dtype` on the device,
    /// the device transports' reduction (`strata_reduce_*`; bit for bit the CPU's
    /// `reduce_into`; `Avg` sums, its division is [`GpuQuant::divide`]). Both buffers hold
    /// at least `count` elements and are aligned to them; 16-byte aligned buffers take
    /// the vectorized path.
    pub fn reduce<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        acc: &mut D,
        src: &S,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let need = count.checked_mul(dtype.size());
        if need.is_none_or(|b| acc.len() < b || src.len() < b) {
            return Err(Error::InvalidArgument(format!(
                "reduce: {count} elements of {dtype} do not fit buffers of {} and {} bytes",
                acc.len(),
                src.len()
            )));
        }
        let (s, _s_sync) = src.device_ptr(stream);
        let (a, _a_sync) = acc.device_ptr_mut(stream);
        let Some((name, grid, threads)) =
            super::call::elementwise("reduce", &[a, s], count, dtype, Some(op))?
        else {
            return Ok(());
        };
        let n = count as u64;
        // SAFETY: `strata_reduce_*(T* acc, const T* src, u64 n)` gets exactly these
        // arguments; both ranges hold `count` aligned elements (checked above and by
        // `elementwise`) and stay borrowed, with their stream guards, until enqueued.
        unsafe {
            self.launch(stream, &name, grid, threads, |l| {
                l.arg(&a);
                l.arg(&s);
                l.arg(&n);
            })
        }
    }

    /// `buf = buf / n` element-wise over `count` elements (the one rounding of `Avg`,
    /// `strata_divide_*`; bit for bit the CPU's `finish_avg`).
    pub fn divide<D: DevicePtrMut<u8>>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut D,
        count: usize,
        dtype: DataType,
        n: usize,
    ) -> Result<()> {
        if count
            .checked_mul(dtype.size())
            .is_none_or(|b| buf.len() < b)
        {
            return Err(Error::InvalidArgument(format!(
                "divide: {count} elements of {dtype} do not fit a buffer of {} bytes",
                buf.len()
            )));
        }
        let (b, _b_sync) = buf.device_ptr_mut(stream);
        let Some((name, grid, threads)) =
            super::call::elementwise("divide", &[b], count, dtype, None)?
        else {
            return Ok(());
        };
        let (c, d) = (count as u64, n as f64);
        // SAFETY: `strata_divide_*(T* buf, u64 count, double n)` gets exactly these
        // arguments; the range holds `count` aligned elements and stays borrowed until
        // enqueued.
        unsafe {
            self.launch(stream, &name, grid, threads, |l| {
                l.arg(&b);
                l.arg(&c);
                l.arg(&d);
            })
        }
    }
}
