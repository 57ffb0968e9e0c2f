//! strata-gpu-check: runs every CUDA quantization kernel against the CPU reference
//! (`strata::kernels`) and times it against a device-to-device copy of the same bytes.
//!
//! Correctness: random inputs (mixed magnitudes, zero / tiny / subnormal blocks, NaN and
//! Inf, exact rounding ties, raw random packed bytes) across sizes, block sizes, bit
//! widths, element types, swizzle shapes and sender counts; device outputs are written
//! into poisoned buffers with guard bytes, at misaligned offsets too, and must equal the
//! CPU bytes exactly (docs/quantization.md lists no exception); guards must stay intact.
//!
//! Timing: CUDA events around each launch after warm-up, the median of `-n` runs, beside
//! the median of a device-to-device copy of the kernel's input bytes in the same run;
//! GB/s count bytes read + written. The table comes last.
//!
//! Run by `scripts/gpu-check` on a GPU machine (prebuilt: `cargo build --release
//! -p strata-tools --features cuda --bin strata-gpu-check`). Exit status 1 when any
//! check fails.
#![forbid(unsafe_code)]

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;
use strata::device::cuda::open_device;
use strata::kernels::{self as cpu, QuantSpec};
use strata::kernels_gpu::{self, GpuQuant};
use strata::{DataType, ReduceOp, Result};

const GUARD: usize = 64;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// n random values of `dtype` as little-endian bytes: runs of mixed profiles so that
/// blocks see ordinary data, zeros, tiny and subnormal magnitudes, ties, NaN and Inf.
fn values(rng: &mut Rng, n: usize, dtype: DataType, special: bool) -> Vec<u8> {
    let mut out = vec![0u8; n * dtype.size()];
    let mut i = 0;
    while i < n {
        let run = (1 + rng.below(3000) as usize).min(n - i);
        let profile = if special { rng.below(8) } else { rng.below(3) };
        let mag = 2f64.powi(rng.below(41) as i32 - 20);
        for e in i..i + run {
            let u = rng.unit() * 2.0 - 1.0;
            let v: f64 = match profile {
                0 | 1 => u * mag,
                2 => (rng.below(509) as f64 - 254.0) / 2.0, // halves: rounding ties
                3 => 0.0,
                4 => u * 2f64.powi(-70 - rng.below(60) as i32), // tiny, f32 subnormal
                5 => u * 1e-30,
                6 => match rng.below(200) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    _ => u * mag,
                },
                _ => u * 3.0e38, // near FLT_MAX (f16/bf16 overflow paths)
            };
            dtype.set(&mut out, e, v);
        }
        i += run;
    }
    out
}

#[derive(Default)]
struct Tally {
    cases: usize,
    failed: usize,
    max_diff: f64,
}

struct Checker {
    stream: Arc<CudaStream>,
    gpu: GpuQuant,
    tally: std::collections::BTreeMap<&'static str, Tally>,
    verbose: bool,
}

/// A device buffer of `len` bytes at byte offset `off` inside `GUARD` poisoned bytes on
/// each side: (buffer, host copy of the whole poisoned allocation).
fn poisoned(
    stream: &Arc<CudaStream>,
    len: usize,
    off: usize,
    poison: u8,
) -> Result<(CudaSlice<u8>, Vec<u8>)> {
    let host = vec![poison; len + off + 2 * GUARD];
    let d = stream.clone_htod(&host).map_err(dev)?;
    Ok((d, host))
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8], off: usize) -> Result<CudaSlice<u8>> {
    let mut host = vec![0x5Au8; bytes.len() + off + GUARD];
    host[off..off + bytes.len()].copy_from_slice(bytes);
    stream.clone_htod(&host).map_err(dev)
}

fn dev(e: cudarc::driver::DriverError) -> strata::Error {
    strata::Error::Device(format!("{e:?}"))
}

/// Largest |a - b| over elements of `dt` (NaN == NaN), for the report.
fn elem_diff(dt: DataType, a: &[u8], b: &[u8]) -> f64 {
    let n = a.len().min(b.len()) / dt.size();
    let mut m = 0f64;
    for i in 0..n {
        let (x, y) = (dt.get(a, i), dt.get(b, i));
        if x.is_nan() && y.is_nan() {
            continue;
        }
        let d = if x == y { 0.0 } else { (x - y).abs() };
        m = m.max(if d.is_nan() { f64::INFINITY } else { d });
    }
    m
}

impl Checker {
    /// Compare the device result (whole poisoned allocation `got`) with the CPU bytes.
    #[allow(clippy::too_many_arguments)]
    fn compare(
        &mut self,
        kernel: &'static str,
        what: &str,
        want: &[u8],
        got: &[u8],
        off: usize,
        poison: u8,
        diff: impl Fn(&[u8], &[u8]) -> f64,
    ) {
        let t = self.tally.entry(kernel).or_default();
        t.cases += 1;
        let body = &got[off + GUARD..off + GUARD + want.len()];
        let guards_ok = got[..off + GUARD].iter().all(|&b| b == poison)
            && got[off + GUARD + want.len()..].iter().all(|&b| b == poison);
        let bad: Vec<usize> = (0..want.len()).filter(|&i| want[i] != body[i]).collect();
        let d = diff(want, body);
        t.max_diff = t.max_diff.max(d);
        if !bad.is_empty() || !guards_ok {
            t.failed += 1;
            eprintln!(
                "MISMATCH {kernel} {what}: {} of {} bytes differ (first at {:?}), max |diff| {d:e}, guards {}",
                bad.len(),
                want.len(),
                bad.first().map(|&i| (i, want[i], body[i])),
                if guards_ok { "intact" } else { "OVERWRITTEN" }
            );
        } else if self.verbose {
            eprintln!("ok {kernel} {what}");
        }
    }

    fn fail(&mut self, kernel: &'static str, what: &str, e: strata::Error) {
        let t = self.tally.entry(kernel).or_default();
        t.cases += 1;
        t.failed += 1;
        eprintln!("ERROR {kernel} {what}: {e}");
    }

    fn quantize(
        &mut self,
        rng: &mut Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        special: bool,
    ) -> Result<()> {
        let src = values(rng, n, dt, special);
        let mut want = vec![0u8; spec.packed_len(n)];
        cpu::quantize(spec, dt, &src, &mut want)?;
        let (soff, doff) = ((rng.below(3) as usize) * dt.size(), rng.below(4) as usize);
        let poison = rng.next() as u8;
        let d_src = upload(&self.stream, &src, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, want.len(), doff, poison)?;
        let what = format!(
            "{dt} q{} block {} n {n} offsets {soff}/{doff}",
            spec.bits, spec.block
        );
        let r = {
            let s = d_src.slice(soff..soff + src.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + want.len());
            self.gpu.quantize(&self.stream, spec, dt, &s, &mut o)
        };
        if let Err(e) = r {
            self.fail("quantize", &what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare("quantize", &what, &want, &got, doff, poison, |a, b| {
            packed_diff(spec, n, 1, a, b)
        });
        Ok(())
    }

    fn dequantize(
        &mut self,
        rng: &mut Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        raw: bool,
    ) -> Result<()> {
        let packed = packed_input(rng, spec, n, raw)?;
        let mut want = vec![0u8; n * dt.size()];
        cpu::dequantize(spec, &packed, n, dt, &mut want)?;
        let (soff, doff) = (rng.below(4) as usize, (rng.below(3) as usize) * dt.size());
        let poison = rng.next() as u8;
        let d_src = upload(&self.stream, &packed, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, want.len(), doff, poison)?;
        let what = format!(
            "{dt} q{} block {} n {n} raw {raw} offsets {soff}/{doff}",
            spec.bits, spec.block
        );
        let r = {
            let s = d_src.slice(soff..soff + packed.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + want.len());
            self.gpu.dequantize(&self.stream, spec, &s, n, dt, &mut o)
        };
        if let Err(e) = r {
            self.fail("dequantize", &what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare("dequantize", &what, &want, &got, doff, poison, |a, b| {
            elem_diff(dt, a, b)
        });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn swizzled(
        &mut self,
        rng: &mut Rng,
        spec: QuantSpec,
        dt: DataType,
        c: usize,
        nodes: usize,
        devices: usize,
        stages: usize,
    ) -> Result<()> {
        let src = values(rng, nodes * devices * c, dt, true);
        let len = cpu::swizzled_len(spec, c, nodes, devices, stages);
        let mut want = vec![0u8; len];
        cpu::swizzled_quantize(spec, dt, &src, c, nodes, devices, stages, &mut want)?;
        let (soff, doff) = ((rng.below(2) as usize) * dt.size(), rng.below(4) as usize);
        let poison = rng.next() as u8;
        let d_src = upload(&self.stream, &src, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, len, doff, poison)?;
        let what = format!(
            "{dt} q{} block {} c {c} nodes {nodes} devices {devices} stages {stages} offsets {soff}/{doff}",
            spec.bits, spec.block
        );
        let r = {
            let s = d_src.slice(soff..soff + src.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + len);
            self.gpu.swizzled_quantize(
                &self.stream,
                spec,
                dt,
                &s,
                c,
                nodes,
                devices,
                stages,
                &mut o,
            )
        };
        if let Err(e) = r {
            self.fail("swizzled_quantize", &what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare(
            "swizzled_quantize",
            &what,
            &want,
            &got,
            doff,
            poison,
            |a, b| {
                if a == b {
                    0.0
                } else {
                    f64::INFINITY
                }
            },
        );
        Ok(())
    }

    fn drq(
        &mut self,
        rng: &mut Rng,
        spec: QuantSpec,
        n: usize,
        slices: usize,
        k: usize,
        raw: bool,
    ) -> Result<()> {
        let per = spec.packed_len(n) * slices;
        let mut all = Vec::with_capacity(per * k);
        for _ in 0..k {
            for _ in 0..slices {
                all.extend(packed_input(rng, spec, n, raw)?);
            }
        }
        let ins: Vec<&[u8]> = if per == 0 {
            vec![&[][..]; k]
        } else {
            all.chunks(per).collect()
        };
        let mut want = vec![0u8; per];
        cpu::dequant_reduce_quant(spec, &ins, n, slices, &mut want)?;
        let (soff, doff) = (rng.below(4) as usize, rng.below(4) as usize);
        let poison = rng.next() as u8;
        let d_src = upload(&self.stream, &all, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, per, doff, poison)?;
        let what = format!(
            "q{} block {} n {n} slices {slices} k {k} raw {raw} offsets {soff}/{doff}",
            spec.bits, spec.block
        );
        let r = {
            let s = d_src.slice(soff..soff + all.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + per);
            self.gpu
                .dequant_reduce_quant(&self.stream, spec, &s, k, n, slices, &mut o)
        };
        if let Err(e) = r {
            self.fail("dequant_reduce_quant", &what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare(
            "dequant_reduce_quant",
            &what,
            &want,
            &got,
            doff,
            poison,
            |a, b| packed_diff(spec, n, slices, a, b),
        );
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn dequant_reduce(
        &mut self,
        rng: &mut Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        k: usize,
        op: ReduceOp,
        divisor: usize,
        raw: bool,
    ) -> Result<()> {
        let one = spec.packed_len(n);
        let mut all = Vec::with_capacity(one * k);
        for _ in 0..k {
            all.extend(packed_input(rng, spec, n, raw)?);
        }
        let ins: Vec<&[u8]> = if one == 0 {
            vec![&[][..]; k]
        } else {
            all.chunks(one).collect()
        };
        let mut want = vec![0u8; n * dt.size()];
        cpu::dequant_reduce(spec, &ins, n, op, divisor, dt, &mut want)?;
        let (soff, doff) = (rng.below(4) as usize, (rng.below(3) as usize) * dt.size());
        let poison = rng.next() as u8;
        let d_src = upload(&self.stream, &all, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, want.len(), doff, poison)?;
        let what = format!(
            "{dt} q{} block {} n {n} k {k} {op} /{divisor} raw {raw} offsets {soff}/{doff}",
            spec.bits, spec.block
        );
        let r = {
            let s = d_src.slice(soff..soff + all.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + want.len());
            self.gpu
                .dequant_reduce(&self.stream, spec, &s, k, n, op, divisor, dt, &mut o)
        };
        if let Err(e) = r {
            self.fail("dequant_reduce", &what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare(
            "dequant_reduce",
            &what,
            &want,
            &got,
            doff,
            poison,
            |a, b| elem_diff(dt, a, b),
        );
        Ok(())
    }
}

/// One packed slice: the CPU quantization of random values, or raw random bytes (any
/// code, any scale bits: decoders take them as they come).
fn packed_input(rng: &mut Rng, spec: QuantSpec, n: usize, raw: bool) -> Result<Vec<u8>> {
    if raw {
        return Ok(rng.bytes(spec.packed_len(n)));
    }
    let src = values(rng, n, DataType::F32, true);
    let mut p = vec![0u8; spec.packed_len(n)];
    cpu::quantize(spec, DataType::F32, &src, &mut p)?;
    Ok(p)
}

/// Largest difference between the dequantized values of two packed buffers.
fn packed_diff(spec: QuantSpec, n: usize, slices: usize, a: &[u8], b: &[u8]) -> f64 {
    let one = spec.packed_len(n);
    let mut m = 0f64;
    for i in 0..slices {
        let (mut x, mut y) = (vec![0u8; n * 4], vec![0u8; n * 4]);
        let ok = cpu::dequantize(spec, &a[i * one..(i + 1) * one], n, DataType::F32, &mut x)
            .is_ok()
            && cpu::dequantize(spec, &b[i * one..(i + 1) * one], n, DataType::F32, &mut y).is_ok();
        if !ok {
            return f64::INFINITY;
        }
        m = m.max(elem_diff(DataType::F32, &x, &y));
    }
    m
}

fn spec(bits: u32, block: usize) -> QuantSpec {
    QuantSpec::new(bits, block).expect("valid spec")
}

fn correctness(ck: &mut Checker, rng: &mut Rng, quick: bool) -> Result<()> {
    let dts = [DataType::F32, DataType::F16, DataType::BF16];
    let blocks: &[usize] = if quick {
        &[2, 32, 130, 2048, 40000]
    } else {
        &[
            1,
            2,
            6,
            7,
            32,
            64,
            130,
            256,
            1000,
            2048,
            4096,
            40000,
            1 << 20,
        ]
    };
    let sizes: &[usize] = if quick {
        &[1, 33, 1000, 70001]
    } else {
        &[1, 2, 15, 33, 1000, 4099, 70001, (1 << 20) + 3, 3 << 20]
    };
    for &bits in &[8u32, 4] {
        for &block in blocks {
            if bits == 4 && block % 2 == 1 {
                continue;
            }
            let s = spec(bits, block);
            for &n in sizes {
                if n > 4 * block + 70001 && n > 100_000 && block < 1000 && bits == 4 {
                    continue; // keep the sweep short: large n with small blocks once (bits 8)
                }
                for &dt in &dts {
                    ck.quantize(rng, s, dt, n, true)?;
                    ck.dequantize(rng, s, dt, n, false)?;
                }
                let dt = dts[rng.below(3) as usize];
                ck.dequantize(rng, s, dt, n, true)?;
            }
        }
    }
    // Zero-length problems and the argument checks (never a silent no-op for bad specs).
    check_errors(ck)?;
    let shapes: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (2, 4, 1),
        (3, 8, 2),
        (4, 8, 3),
        (1, 8, 4),
        (3, 2, 5),
    ];
    let chunks: &[usize] = if quick {
        &[0, 7, 1000]
    } else {
        &[0, 1, 7, 1000, 4097, 100_003]
    };
    for &(nodes, devices, stages) in shapes {
        for &c in chunks {
            for &(bits, block) in &[(8u32, 32usize), (4, 2), (8, 256), (4, 2048), (8, 1000)] {
                let dt = dts[rng.below(3) as usize];
                ck.swizzled(rng, spec(bits, block), dt, c, nodes, devices, stages)?;
            }
        }
    }
    let drq_sizes: &[usize] = if quick {
        &[0, 1, 999, 5000]
    } else {
        &[0, 1, 999, 5000, 65536, 300_001]
    };
    for &(bits, block) in &[
        (8u32, 1usize),
        (8, 32),
        (4, 2),
        (4, 64),
        (8, 2048),
        (4, 2048),
        (8, 40000),
    ] {
        let s = spec(bits, block);
        for &n in drq_sizes {
            for &(k, slices) in &[(1usize, 1usize), (2, 3), (3, 4), (8, 1), (8, 4)] {
                ck.drq(rng, s, n, slices, k, false)?;
            }
            ck.drq(rng, s, n, 2, 3, true)?;
            for &dt in &dts {
                for &(k, op, div) in &[
                    (1usize, ReduceOp::Sum, 1usize),
                    (3, ReduceOp::Avg, 24),
                    (8, ReduceOp::Avg, 32),
                    (4, ReduceOp::Sum, 1),
                    (5, ReduceOp::Avg, 7),
                ] {
                    ck.dequant_reduce(rng, s, dt, n, k, op, div, false)?;
                }
                ck.dequant_reduce(rng, s, dt, n, 3, ReduceOp::Sum, 1, true)?;
            }
        }
    }
    Ok(())
}

/// Invalid specs and sizes are errors on the device path too (InvalidArgument), and
/// valid empty problems succeed without a launch.
fn check_errors(ck: &mut Checker) -> Result<()> {
    let st = ck.stream.clone();
    let buf = st.alloc_zeros::<u8>(64).map_err(dev)?;
    let mut out = st.alloc_zeros::<u8>(64).map_err(dev)?;
    let mut bad = Vec::new();
    for s in [
        QuantSpec { bits: 8, block: 0 },
        QuantSpec { bits: 4, block: 3 },
        QuantSpec { bits: 5, block: 32 },
        QuantSpec {
            bits: 8,
            block: (1 << 20) + 1,
        },
    ] {
        let r = ck.gpu.quantize(
            &st,
            s,
            DataType::F32,
            &buf.slice(0..16),
            &mut out.slice_mut(0..8),
        );
        if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
            bad.push(format!("quantize accepted {s:?}: {r:?}"));
        }
    }
    let s = spec(8, 4);
    let r = ck.gpu.quantize(
        &st,
        s,
        DataType::F32,
        &buf.slice(0..16),
        &mut out.slice_mut(0..9),
    );
    if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
        bad.push(format!("quantize accepted a wrong dst size: {r:?}"));
    }
    let r = ck.gpu.quantize(
        &st,
        s,
        DataType::I32,
        &buf.slice(0..16),
        &mut out.slice_mut(0..8),
    );
    if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
        bad.push(format!("quantize accepted i32: {r:?}"));
    }
    let r = ck.gpu.dequant_reduce(
        &st,
        s,
        &buf.slice(0..8),
        1,
        4,
        ReduceOp::Max,
        1,
        DataType::F32,
        &mut out.slice_mut(0..16),
    );
    if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
        bad.push(format!("dequant_reduce accepted max: {r:?}"));
    }
    let r =
        ck.gpu
            .dequant_reduce_quant(&st, s, &buf.slice(0..0), 0, 4, 1, &mut out.slice_mut(0..8));
    if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
        bad.push(format!("dequant_reduce_quant accepted k = 0: {r:?}"));
    }
    let r = ck.gpu.quantize(
        &st,
        s,
        DataType::F32,
        &buf.slice(0..0),
        &mut out.slice_mut(0..0),
    );
    if r.is_err() {
        bad.push(format!("quantize of n = 0 failed: {r:?}"));
    }
    let t = ck.tally.entry("argument checks").or_default();
    t.cases += 9;
    t.failed += bad.len();
    for b in bad {
        eprintln!("ERROR argument checks: {b}");
    }
    Ok(())
}

struct Row {
    name: String,
    read: usize,
    written: usize,
    kernel_us: f64,
    copy_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median over `iters` launches (after `warm` warm-up launches) of `f`, in microseconds,
/// each timed with its own pair of CUDA events.
fn time(
    stream: &Arc<CudaStream>,
    warm: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    stream.synchronize().map_err(dev)?;
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let a = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(dev)?;
        f()?;
        let b = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(dev)?;
        t.push(a.elapsed_ms(&b).map_err(dev)? as f64 * 1000.0);
    }
    Ok(median(t))
}

fn bench(
    ctx: &Arc<CudaContext>,
    gpu: &GpuQuant,
    rng: &mut Rng,
    n: usize,
    warm: usize,
    iters: usize,
) -> Result<Vec<Row>> {
    let st = ctx.default_stream();
    let mut rows = Vec::new();
    // Random f32 values, then the other types and the packed inputs from them.
    let host = values(rng, n, DataType::F32, false);
    let mut copy_cache: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
    let mut copy_time = |bytes: usize| -> Result<f64> {
        if let Some(t) = copy_cache.get(&bytes) {
            return Ok(*t);
        }
        let a = st.alloc_zeros::<u8>(bytes).map_err(dev)?;
        let mut b = st.alloc_zeros::<u8>(bytes).map_err(dev)?;
        let t = time(&st, warm, iters, || st.memcpy_dtod(&a, &mut b).map_err(dev))?;
        copy_cache.insert(bytes, t);
        Ok(t)
    };
    for &(bits, block) in &[(8u32, 2048usize), (4, 2048), (8, 256)] {
        let s = spec(bits, block);
        let pl = s.packed_len(n);
        for dt in [DataType::F32, DataType::BF16, DataType::F16] {
            let mut src = vec![0u8; n * dt.size()];
            for i in 0..n {
                dt.set(&mut src, i, DataType::F32.get(&host, i));
            }
            let d_src = st.clone_htod(&src).map_err(dev)?;
            let mut d_q = st.alloc_zeros::<u8>(pl).map_err(dev)?;
            let mut d_out = st.alloc_zeros::<u8>(n * dt.size()).map_err(dev)?;
            let t = time(&st, warm, iters, || {
                gpu.quantize(&st, s, dt, &d_src, &mut d_q)
            })?;
            rows.push(Row {
                name: format!("quantize {dt} q{bits} b{block}"),
                read: src.len(),
                written: pl,
                kernel_us: t,
                copy_us: copy_time(src.len())?,
            });
            // qgZ first hop on nodes:4x8 with 2 pipeline stages.
            let sw = cpu::swizzled_len(s, n / 32, 4, 8, 2);
            let mut d_sw = st.alloc_zeros::<u8>(sw).map_err(dev)?;
            let sub = d_src.slice(0..32 * (n / 32) * dt.size());
            let t = time(&st, warm, iters, || {
                gpu.swizzled_quantize(&st, s, dt, &sub, n / 32, 4, 8, 2, &mut d_sw)
            })?;
            rows.push(Row {
                name: format!("swizzled_quantize 4x8x2 {dt} q{bits} b{block}"),
                read: 32 * (n / 32) * dt.size(),
                written: sw,
                kernel_us: t,
                copy_us: copy_time(32 * (n / 32) * dt.size())?,
            });
            let t = time(&st, warm, iters, || {
                gpu.dequantize(&st, s, &d_q, n, dt, &mut d_out)
            })?;
            rows.push(Row {
                name: format!("dequantize {dt} q{bits} b{block}"),
                read: pl,
                written: n * dt.size(),
                kernel_us: t,
                copy_us: copy_time(n * dt.size())?,
            });
            // qgZ last step: k = 4 nodes' slices of n/4 elements, avg.
            let m = n / 4;
            let one = s.packed_len(m);
            let mut ins = st.alloc_zeros::<u8>(4 * one).map_err(dev)?;
            let mut d_red = st.alloc_zeros::<u8>(m * dt.size()).map_err(dev)?;
            {
                // Fill the inputs with real packed data (quantized copies of the source).
                let mut q = vec![0u8; one];
                cpu::quantize(s, dt, &src[..m * dt.size()], &mut q)?;
                let rep: Vec<u8> = q.iter().copied().cycle().take(4 * one).collect();
                st.memcpy_htod(&rep, &mut ins).map_err(dev)?;
                let t = time(&st, warm, iters, || {
                    gpu.dequant_reduce(&st, s, &ins, 4, m, ReduceOp::Avg, 32, dt, &mut d_red)
                })?;
                rows.push(Row {
                    name: format!("dequant_reduce k4 avg {dt} q{bits} b{block}"),
                    read: 4 * one,
                    written: m * dt.size(),
                    kernel_us: t,
                    copy_us: copy_time(4 * one)?,
                });
            }
        }
        // qgZ middle hop: k = 8 local senders, each 4 slices (one per node) of n/32.
        let m = n / 32;
        let per = s.packed_len(m) * 4;
        let mut q = vec![0u8; s.packed_len(m)];
        cpu::quantize(s, DataType::F32, &host[..m * 4], &mut q)?;
        let rep: Vec<u8> = q.iter().copied().cycle().take(8 * per).collect();
        let ins = st.clone_htod(&rep).map_err(dev)?;
        let mut out = st.alloc_zeros::<u8>(per).map_err(dev)?;
        let t = time(&st, warm, iters, || {
            gpu.dequant_reduce_quant(&st, s, &ins, 8, m, 4, &mut out)
        })?;
        rows.push(Row {
            name: format!("dequant_reduce_quant k8 x4 q{bits} b{block}"),
            read: 8 * per,
            written: per,
            kernel_us: t,
            copy_us: copy_time(8 * per)?,
        });
    }
    Ok(rows)
}

fn main() {
    let mut quick = false;
    let mut no_bench = false;
    let mut verbose = false;
    let mut iters = 50usize;
    let mut warm = 5usize;
    let mut seed = 0x5EED_u64;
    let mut bench_n = 1usize << 26;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--quick" => quick = true,
            "--no-bench" => no_bench = true,
            "-v" | "--verbose" => verbose = true,
            "-n" => iters = num("-n").max(1),
            "-w" => warm = num("-w"),
            "--seed" => seed = num("--seed") as u64,
            "--bench-elems" => bench_n = num("--bench-elems").max(1024),
            "-h" | "--help" => {
                println!("strata-gpu-check [--quick] [--no-bench] [-v] [-n ITERS] [-w WARMUP] [--seed S] [--bench-elems N]");
                return;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    match run(quick, no_bench, verbose, iters, warm, seed, bench_n) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("strata-gpu-check: {e}");
            std::process::exit(1);
        }
    }
}

fn run(
    quick: bool,
    no_bench: bool,
    verbose: bool,
    iters: usize,
    warm: usize,
    seed: u64,
    bench_n: usize,
) -> Result<bool> {
    let ctx = open_device(0)?;
    let name = ctx.name().unwrap_or_else(|_| "?".into());
    let t0 = std::time::Instant::now();
    let gpu = GpuQuant::new(&ctx)?;
    println!(
        "device: {name}; kernels compiled by NVRTC for {} in {:.2} s ({} kernels)",
        gpu.arch(),
        t0.elapsed().as_secs_f64(),
        kernels_gpu::kernel_names().len()
    );
    let mut rng = Rng(seed);
    let mut ck = Checker {
        stream: ctx.default_stream(),
        gpu,
        tally: Default::default(),
        verbose,
    };
    let t0 = std::time::Instant::now();
    correctness(&mut ck, &mut rng, quick)?;
    println!(
        "\ncorrectness against the CPU reference ({:.1} s, seed {seed:#x}):",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "{:<24} {:>7} {:>7} {:>14}",
        "kernel", "cases", "failed", "max |diff|"
    );
    let mut ok = true;
    for (k, t) in &ck.tally {
        println!(
            "{:<24} {:>7} {:>7} {:>14e}",
            k, t.cases, t.failed, t.max_diff
        );
        ok &= t.failed == 0;
    }
    println!(
        "{}",
        if ok {
            "all outputs bitwise equal to the CPU reference"
        } else {
            "MISMATCHES: see above"
        }
    );
    if no_bench || quick {
        return Ok(ok);
    }
    let rows = bench(&ctx, &ck.gpu, &mut rng, bench_n, warm, iters)?;
    println!(
        "\nbandwidth ({} elements; median of {iters} runs after {warm} warm-up, CUDA events; GB/s = (read + written) / time; copy = device-to-device copy of the kernel's input bytes):",
        bench_n
    );
    println!(
        "{:<44} {:>9} {:>9} {:>10} {:>8} {:>10} {:>9} {:>6}",
        "kernel", "read MB", "write MB", "time us", "GB/s", "copy us", "copy GB/s", "ratio"
    );
    for r in rows {
        let gbs = (r.read + r.written) as f64 / r.kernel_us / 1e3;
        let copy = 2.0 * r.read as f64 / r.copy_us / 1e3;
        println!(
            "{:<44} {:>9.1} {:>9.1} {:>10.1} {:>8.0} {:>10.1} {:>9.0} {:>6.2}",
            r.name,
            r.read as f64 / 1e6,
            r.written as f64 / 1e6,
            r.kernel_us,
            gbs,
            r.copy_us,
            copy,
            gbs / copy
        );
    }
    Ok(ok)
}
