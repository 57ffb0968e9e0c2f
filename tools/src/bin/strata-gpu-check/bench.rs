//! Timing: a kernel beside a device-to-device copy of the same bytes, CUDA events.

use crate::check::dev;
use crate::inputs::{spec, typed, values};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata::kernels::{self as cpu, QuantSpec};
use strata::kernels_gpu::GpuQuant;
use strata::{DataType, ReduceOp, Result};

/// One timed kernel beside a device-to-device copy timed in the same run.
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) read: usize,
    pub(crate) written: usize,
    pub(crate) kernel_us: f64,
    /// Bytes of the copy timed beside the kernel (its input; a dequantizer's output).
    pub(crate) copy_bytes: usize,
    pub(crate) copy_us: f64,
}

impl Row {
    /// The kernel's GB/s: (read + written) / time.
    pub(crate) fn gbs(&self) -> f64 {
        (self.read + self.written) as f64 / self.kernel_us / 1e3
    }
    /// The copy's GB/s: it reads and writes `copy_bytes`.
    pub(crate) fn copy_gbs(&self) -> f64 {
        2.0 * self.copy_bytes as f64 / self.copy_us / 1e3
    }
    /// The kernel's bytes at the copy's rate: the time of a kernel at the memory bound.
    pub(crate) fn roofline_us(&self) -> f64 {
        (self.read + self.written) as f64 * self.copy_us / (2.0 * self.copy_bytes as f64)
    }
    /// roofline / time: 1 at the copy's rate.
    pub(crate) fn of_roofline(&self) -> f64 {
        self.roofline_us() / self.kernel_us
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Bytes of each copy that keeps the GPU busy while a timed batch is queued.
pub(crate) const FILL_BYTES: usize = 256 << 20;

/// Times launches on the default stream: `warm` warm-up launches, then `iters` launches
/// each between its own pair of CUDA events, all queued behind a few large copies (so the
/// host's launch time never leaves the GPU idle between the events), the median in
/// microseconds. Copies of a given size are timed once (cached).
pub(crate) struct Timer {
    pub(crate) st: Arc<CudaStream>,
    pub(crate) warm: usize,
    pub(crate) iters: usize,
    pub(crate) fill: (CudaSlice<u8>, CudaSlice<u8>),
    pub(crate) copies: std::collections::HashMap<usize, f64>,
}

impl Timer {
    pub(crate) fn new(ctx: &Arc<CudaContext>, warm: usize, iters: usize) -> Result<Timer> {
        let st = ctx.default_stream();
        let fill = (
            st.alloc_zeros::<u8>(FILL_BYTES).map_err(dev)?,
            st.alloc_zeros::<u8>(FILL_BYTES).map_err(dev)?,
        );
        Ok(Timer {
            st,
            warm,
            iters,
            fill,
            copies: Default::default(),
        })
    }

    pub(crate) fn time(&mut self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let st = self.st.clone();
        for _ in 0..self.warm {
            f()?;
        }
        st.synchronize().map_err(dev)?;
        let ctx = st.context();
        let mut ev = Vec::with_capacity(self.iters);
        for _ in 0..self.iters {
            ev.push((
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(dev)?,
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(dev)?,
            ));
        }
        // About 0.1 ms each on an H100/H200: covers ~12 us of host time per launch.
        for _ in 0..self.iters / 8 + 1 {
            let (a, b) = &mut self.fill;
            st.memcpy_dtod(&*a, b).map_err(dev)?;
        }
        for (a, b) in &ev {
            a.record(&st).map_err(dev)?;
            f()?;
            b.record(&st).map_err(dev)?;
        }
        st.synchronize().map_err(dev)?;
        let mut t = Vec::with_capacity(self.iters);
        for (a, b) in &ev {
            t.push(a.elapsed_ms(b).map_err(dev)? as f64 * 1000.0);
        }
        Ok(median(t))
    }

    /// A bench row: `name` read `read` and wrote `written` bytes in `kernel_us`, beside a
    /// copy of `copy_bytes`.
    pub(crate) fn row(
        &mut self,
        name: String,
        read: usize,
        written: usize,
        kernel_us: f64,
        copy_bytes: usize,
    ) -> Result<Row> {
        Ok(Row {
            name,
            read,
            written,
            kernel_us,
            copy_bytes,
            copy_us: self.copy(copy_bytes)?,
        })
    }

    /// The time of a device-to-device copy of `bytes`.
    pub(crate) fn copy(&mut self, bytes: usize) -> Result<f64> {
        if let Some(t) = self.copies.get(&bytes) {
            return Ok(*t);
        }
        let st = self.st.clone();
        let a = st.alloc_zeros::<u8>(bytes.max(1)).map_err(dev)?;
        let mut b = st.alloc_zeros::<u8>(bytes.max(1)).map_err(dev)?;
        let t = self.time(|| st.memcpy_dtod(&a, &mut b).map_err(dev))?;
        self.copies.insert(bytes, t);
        Ok(t)
    }
}

/// Times quantize of the elements `src` (of `dt`) into packed `d_q` under `s`: the row.
pub(crate) fn bench_quantize(
    st: &Arc<CudaStream>,
    gpu: &GpuQuant,
    tm: &mut Timer,
    s: QuantSpec,
    dt: DataType,
    src: &[u8],
    d_q: &mut CudaSlice<u8>,
) -> Result<Row> {
    let d_src = st.clone_htod(src).map_err(dev)?;
    let t = tm.time(|| gpu.quantize(st, s, dt, &d_src, d_q))?;
    let name = format!("quantize {dt} q{} b{}", s.bits, s.block);
    tm.row(name, src.len(), d_q.len(), t, src.len())
}

/// Times dequantize of the packed `d_q` (n elements) into `dt`: the row.
pub(crate) fn bench_dequantize(
    st: &Arc<CudaStream>,
    gpu: &GpuQuant,
    tm: &mut Timer,
    s: QuantSpec,
    dt: DataType,
    d_q: &CudaSlice<u8>,
    n: usize,
) -> Result<Row> {
    let mut d_out = st.alloc_zeros::<u8>(n * dt.size()).map_err(dev)?;
    let t = tm.time(|| gpu.dequantize(st, s, d_q, n, dt, &mut d_out))?;
    let name = format!("dequantize {dt} q{} b{}", s.bits, s.block);
    tm.row(name, d_q.len(), n * dt.size(), t, n * dt.size())
}

/// qgZ's middle hop as benched: k = 8 local senders, each 4 slices (one per node) of
/// n/32 elements, real packed data. Returns the row (timed).
pub(crate) fn bench_drq(
    st: &Arc<CudaStream>,
    gpu: &GpuQuant,
    tm: &mut Timer,
    s: QuantSpec,
    host: &[u8],
    n: usize,
) -> Result<Row> {
    let m = n / 32;
    let per = s.packed_len(m) * 4;
    let mut q = vec![0u8; s.packed_len(m)];
    cpu::quantize(s, DataType::F32, &host[..m * 4], &mut q)?;
    let rep: Vec<u8> = q.iter().copied().cycle().take(8 * per).collect();
    let ins = st.clone_htod(&rep).map_err(dev)?;
    let mut out = st.alloc_zeros::<u8>(per).map_err(dev)?;
    let t = tm.time(|| gpu.dequant_reduce_quant(st, s, &ins, 8, m, 4, &mut out))?;
    Ok(Row {
        name: format!("dequant_reduce_quant k8 x4 q{} b{}", s.bits, s.block),
        read: 8 * per,
        written: per,
        kernel_us: t,
        copy_bytes: 8 * per,
        copy_us: tm.copy(8 * per)?,
    })
}

/// The main rows: every kernel at n elements. Names are what scripts/kernels-compiled.py
/// prints (keep them in step).
pub(crate) fn bench(
    ctx: &Arc<CudaContext>,
    gpu: &GpuQuant,
    rng: &mut ChaCha8Rng,
    n: usize,
    tm: &mut Timer,
) -> Result<Vec<Row>> {
    let st = ctx.default_stream();
    let mut rows = Vec::new();
    // Random f32 values, then the other types and the packed inputs from them.
    let host = values(rng, n, DataType::F32, false);
    let srcs: Vec<(DataType, Vec<u8>)> = [DataType::F32, DataType::BF16, DataType::F16]
        .into_iter()
        .map(|dt| (dt, typed(&host, n, dt)))
        .collect();
    for &(bits, block) in &[(8u32, 2048usize), (4, 2048), (8, 256)] {
        let s = spec(bits, block);
        let pl = s.packed_len(n);
        for (dt, src) in &srcs {
            let dt = *dt;
            let d_src = st.clone_htod(src).map_err(dev)?;
            let mut d_q = st.alloc_zeros::<u8>(pl).map_err(dev)?;
            rows.push(bench_quantize(&st, gpu, tm, s, dt, src, &mut d_q)?);
            // qgZ first hop on nodes:4x8 with 2 pipeline stages.
            let sw = cpu::swizzled_len(s, n / 32, 4, 8, 2);
            let mut d_sw = st.alloc_zeros::<u8>(sw).map_err(dev)?;
            let sub = d_src.slice(0..32 * (n / 32) * dt.size());
            let t =
                tm.time(|| gpu.swizzled_quantize(&st, s, dt, &sub, n / 32, 4, 8, 2, &mut d_sw))?;
            let bytes = 32 * (n / 32) * dt.size();
            rows.push(tm.row(
                format!("swizzled_quantize 4x8x2 {dt} q{bits} b{block}"),
                bytes,
                sw,
                t,
                bytes,
            )?);
            rows.push(bench_dequantize(&st, gpu, tm, s, dt, &d_q, n)?);
            // qgZ last step: k = 4 nodes' slices of n/4 elements, avg.
            let m = n / 4;
            let one = s.packed_len(m);
            let mut ins = st.alloc_zeros::<u8>(4 * one).map_err(dev)?;
            let mut d_red = st.alloc_zeros::<u8>(m * dt.size()).map_err(dev)?;
            // Fill the inputs with real packed data (quantized copies of the source).
            let mut q = vec![0u8; one];
            cpu::quantize(s, dt, &src[..m * dt.size()], &mut q)?;
            let rep: Vec<u8> = q.iter().copied().cycle().take(4 * one).collect();
            st.memcpy_htod(&rep, &mut ins).map_err(dev)?;
            let t = tm.time(|| {
                gpu.dequant_reduce(&st, s, &ins, 4, m, ReduceOp::Avg, 32, dt, &mut d_red)
            })?;
            rows.push(tm.row(
                format!("dequant_reduce k4 avg {dt} q{bits} b{block}"),
                4 * one,
                m * dt.size(),
                t,
                4 * one,
            )?);
        }
        rows.push(bench_drq(&st, gpu, tm, s, &host, n)?);
    }
    // The device transports' element-wise kernels: acc = acc + src, and Avg's division.
    for (dt, src) in &srcs {
        let (dt, bytes) = (*dt, src.len());
        if dt == DataType::F16 {
            continue; // costs what bf16 does
        }
        let mut acc = st.clone_htod(src).map_err(dev)?;
        let other = st.clone_htod(src).map_err(dev)?;
        let t = tm.time(|| gpu.reduce(&st, &mut acc, &other, n, dt, ReduceOp::Sum))?;
        rows.push(tm.row(format!("reduce sum {dt}"), 2 * bytes, bytes, t, bytes)?);
        // Divided by 1 (a world of one: the same instructions): repeated in place, a
        // larger divisor would walk the values into subnormals, the division's slow path.
        let t = tm.time(|| gpu.divide(&st, &mut acc, n, dt, 1))?;
        rows.push(tm.row(format!("divide avg {dt}"), bytes, bytes, t, bytes)?);
    }
    Ok(rows)
}

/// The launch-bound end: element counts of the small-size table.
pub(crate) const SMALL: [usize; 4] = [1 << 16, 1 << 18, 1 << 20, 1 << 22];

/// quantize f32 and bf16, dequantize bf16 and dequant_reduce_quant k8 x4, int8 block
/// 2048, at each of `SMALL`: (elements, row).
pub(crate) fn bench_small(
    ctx: &Arc<CudaContext>,
    gpu: &GpuQuant,
    rng: &mut ChaCha8Rng,
    tm: &mut Timer,
) -> Result<Vec<(usize, Row)>> {
    let st = ctx.default_stream();
    let s = spec(8, 2048);
    let mut rows = Vec::new();
    for n in SMALL {
        let host = values(rng, n, DataType::F32, false);
        let pl = s.packed_len(n);
        for dt in [DataType::F32, DataType::BF16] {
            let mut d_q = st.alloc_zeros::<u8>(pl).map_err(dev)?;
            let src = typed(&host, n, dt);
            rows.push((n, bench_quantize(&st, gpu, tm, s, dt, &src, &mut d_q)?));
            if dt == DataType::BF16 {
                rows.push((n, bench_dequantize(&st, gpu, tm, s, dt, &d_q, n)?));
            }
        }
        rows.push((n, bench_drq(&st, gpu, tm, s, &host, n)?));
    }
    Ok(rows)
}
