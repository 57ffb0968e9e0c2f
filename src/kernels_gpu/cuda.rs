//! [`GpuQuant`]: the CUDA kernels compiled by NVRTC, loaded into a context, and launched
//! on cudarc device buffers with the CPU reference's API and checks.

use super::plan::{dequant_plan, drq_plan, quantize_plan, DequantArgs, DrqArgs, Launch, QuantArgs};
use super::{kernel_name, kernels, KernelOp};
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

/// The shared-library names cudarc tries for the CUDA driver.
pub fn driver_candidates() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect()
}

/// Open device `ordinal` (a primary context). `System` naming the libcuda candidates
/// tried when the driver library is missing; `Device` when the driver fails. Never panics.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>> {
    // SAFETY: `is_culib_present` only dlopens cudarc's candidate names and drops them.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        return Err(Error::System(format!(
            "libcuda (the NVIDIA driver) not found: tried {:?}",
            driver_candidates()
        )));
    }
    match std::panic::catch_unwind(|| CudaContext::new(ordinal)) {
        Ok(r) => r.map_err(|e| dev(&format!("opening CUDA device {ordinal}"), e)),
        Err(p) => Err(Error::System(format!(
            "the CUDA driver panicked: {}",
            super::nvrtc::panic_text(&p)
        ))),
    }
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
    /// Compile the kernels with NVRTC for the compute capability of `ctx`'s device
    /// (`compute_XY`) and load them. Errors as [`super::compile_cuda_ptx`], plus `Device`
    /// when the driver rejects the module.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<GpuQuant> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev("reading the compute capability", e))?;
        let arch = format!("compute_{major}{minor}");
        let ptx = super::compile_cuda_ptx(&arch)?;
        GpuQuant::from_ptx(ctx, ptx, &arch)
    }

    /// Load kernels already compiled to PTX (by [`super::compile_cuda_ptx`]).
    pub fn from_ptx(ctx: &Arc<CudaContext>, ptx: String, arch: &str) -> Result<GpuQuant> {
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| dev(&format!("loading the {arch} PTX of the strata kernels"), e))?;
        let mut funcs = HashMap::new();
        for (op, dt, bits) in kernels() {
            let name = kernel_name(op, dt, bits);
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

    /// The architecture the kernels were compiled for (`compute_XY`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The context the kernels live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn func(&self, op: KernelOp, dt: Option<DataType>, bits: u32) -> Result<&CudaFunction> {
        let name = kernel_name(op, dt, bits);
        self.funcs
            .get(&name)
            .ok_or_else(|| Error::Internal(format!("kernel {name} not loaded")))
    }

    fn config(l: &Launch) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (l.grid, 1, 1),
            block_dim: (l.threads, 1, 1),
            shared_mem_bytes: 0,
        }
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
        const W: &str = "quantize";
        check_spec(W, spec)?;
        check_dtype(W, dtype)?;
        if src.len() % dtype.size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "{W} (GPU): src has {} bytes, not a whole number of {dtype} elements",
                src.len()
            )));
        }
        let n = src.len() / dtype.size();
        self.swizzle(W, stream, spec, dtype, src, n, 1, 1, 1, dst)
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
        const W: &str = "swizzled_quantize";
        crate::kernels::swizzle_check(spec, c, nodes, devices, stages)?;
        check_dtype(W, dtype)?;
        let want = nodes
            .checked_mul(devices)
            .and_then(|p| p.checked_mul(c))
            .and_then(|e| e.checked_mul(dtype.size()))
            .ok_or_else(|| Error::InvalidArgument(format!("{W} (GPU): input size overflows")))?;
        check_len(W, "src", want, src.len())?;
        self.swizzle(W, stream, spec, dtype, src, c, nodes, devices, stages, dst)
    }

    #[allow(clippy::too_many_arguments)]
    fn swizzle<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        what: &str,
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
        let total = crate::kernels::swizzled_len(spec, c, nodes, devices, stages);
        if total == usize::MAX {
            return Err(Error::InvalidArgument(format!(
                "{what} (GPU): output size overflows"
            )));
        }
        check_len(what, "dst", total, dst.len())?;
        let Some((l, mut args)) = quantize_plan(spec, c, nodes, devices, stages) else {
            return Ok(()); // a valid empty problem (c = 0): nothing to write
        };
        let f = self.func(KernelOp::Quantize, Some(dtype), spec.bits)?;
        let (src_ptr, _src_sync) = src.device_ptr(stream);
        let (dst_ptr, _dst_sync) = dst.device_ptr_mut(stream);
        args.input = src_ptr;
        args.out = dst_ptr;
        let mut b = stream.launch_builder(f);
        b.arg(&args);
        // SAFETY: `f` takes one StrataQuantArgs by value (same layout as QuantArgs). The
        // kernel reads nodes·devices·c elements of `dtype` from src_ptr and writes exactly
        // swizzled_len(..) bytes at dst_ptr; both lengths were checked above against the
        // buffers, which stay borrowed (and their stream-sync guards alive) until the
        // launch is enqueued; `&mut dst` rules out aliasing with `src`.
        unsafe { b.launch(Self::config(&l)) }.map_err(|e| dev(what, e))?;
        Ok(())
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
        self.deq("dequantize", stream, spec, src, 1, n, None, dtype, dst)
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
        const W: &str = "dequant_reduce";
        let div = match op {
            ReduceOp::Sum => None,
            ReduceOp::Avg if divisor >= 1 => Some(divisor as f32),
            ReduceOp::Avg => {
                return Err(Error::InvalidArgument(format!(
                    "{W} (GPU): avg needs a divisor >= 1 (the world size), got 0"
                )))
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "{W} (GPU): quantized reduction supports sum and avg, got {other}"
                )))
            }
        };
        self.deq(W, stream, spec, inputs, k, n, div, dtype, dst)
    }

    #[allow(clippy::too_many_arguments)]
    fn deq<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(
        &self,
        what: &str,
        stream: &Arc<CudaStream>,
        spec: QuantSpec,
        inputs: &S,
        k: usize,
        n: usize,
        div: Option<f32>,
        dtype: DataType,
        dst: &mut D,
    ) -> Result<()> {
        check_spec(what, spec)?;
        check_dtype(what, dtype)?;
        if k == 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} (GPU): needs at least one input, got none"
            )));
        }
        let one = spec.checked_packed_len(n).ok_or_else(|| {
            Error::InvalidArgument(format!("{what} (GPU): packed size overflows"))
        })?;
        let all = one
            .checked_mul(k)
            .ok_or_else(|| Error::InvalidArgument(format!("{what} (GPU): input size overflows")))?;
        check_len(what, "inputs", all, inputs.len())?;
        let out = n.checked_mul(dtype.size()).ok_or_else(|| {
            Error::InvalidArgument(format!("{what} (GPU): output size overflows"))
        })?;
        check_len(what, "dst", out, dst.len())?;
        let Some((l, mut args)) = dequant_plan(spec, n, k, div) else {
            return Ok(()); // n = 0
        };
        let f = self.func(KernelOp::DequantReduce, Some(dtype), spec.bits)?;
        let (in_ptr, _in_sync) = inputs.device_ptr(stream);
        let (dst_ptr, _dst_sync) = dst.device_ptr_mut(stream);
        args.input = in_ptr;
        args.out = dst_ptr;
        let mut b = stream.launch_builder(f);
        b.arg(&args);
        // SAFETY: `f` takes one StrataDequantArgs by value (same layout as DequantArgs).
        // It reads k slices of packed_len(n) bytes at in_ptr + s·packed_len(n) (k·one
        // bytes, checked) and writes n elements of `dtype` at dst_ptr (checked); the
        // buffers stay borrowed until the launch is enqueued and cannot alias.
        unsafe { b.launch(Self::config(&l)) }.map_err(|e| dev(what, e))?;
        Ok(())
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
        const W: &str = "dequant_reduce_quant";
        check_spec(W, spec)?;
        if k == 0 {
            return Err(Error::InvalidArgument(format!(
                "{W} (GPU): needs at least one input, got none"
            )));
        }
        let one = spec
            .checked_packed_len(n)
            .ok_or_else(|| Error::InvalidArgument(format!("{W} (GPU): packed size overflows")))?;
        let per = one.checked_mul(slices).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{W} (GPU): {slices} slices of {one} bytes overflow"
            ))
        })?;
        let all = per
            .checked_mul(k)
            .ok_or_else(|| Error::InvalidArgument(format!("{W} (GPU): input size overflows")))?;
        check_len(W, "inputs", all, inputs.len())?;
        check_len(W, "dst", per, dst.len())?;
        let Some((l, mut args)) = drq_plan(spec, n, slices, k) else {
            return Ok(()); // n = 0 or no slices
        };
        let f = self.func(KernelOp::DequantReduceQuant, None, spec.bits)?;
        let (in_ptr, _in_sync) = inputs.device_ptr(stream);
        let (dst_ptr, _dst_sync) = dst.device_ptr_mut(stream);
        args.input = in_ptr;
        args.out = dst_ptr;
        let mut b = stream.launch_builder(f);
        b.arg(&args);
        // SAFETY: `f` takes one StrataDrqArgs by value (same layout as DrqArgs). It reads
        // k buffers of slices·packed_len(n) bytes at in_ptr + s·per (k·per bytes, checked)
        // and writes slices·packed_len(n) bytes at dst_ptr (checked); the buffers stay
        // borrowed until the launch is enqueued and cannot alias.
        unsafe { b.launch(Self::config(&l)) }.map_err(|e| dev(W, e))?;
        Ok(())
    }
}

/// InvalidArgument unless `spec` is valid (the contract's check, with the kernel's name).
fn check_spec(what: &str, spec: QuantSpec) -> Result<()> {
    spec.validate().map_err(|e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what} (GPU): {m}")),
        other => other,
    })
}

fn check_dtype(what: &str, dtype: DataType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} (GPU): quantization supports f32, f16 and bf16, got {dtype}"
        )))
    }
}

fn check_len(what: &str, buf: &str, want: usize, got: usize) -> Result<()> {
    if want == got {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} (GPU): {buf} has {got} bytes, expected {want}"
        )))
    }
}
