//! strata-gpu-check: runs every CUDA quantization kernel against the CPU reference
//! (`strata::kernels`) and times it against a device-to-device copy of the same bytes.
//!
//! Correctness: random inputs (mixed magnitudes, zero / tiny / subnormal blocks, NaN and
//! Inf, exact rounding ties, raw random packed bytes) across sizes, block sizes, bit
//! widths, element types, swizzle shapes and sender counts; device outputs are written
//! into poisoned buffers with guard bytes, at misaligned offsets too, and must equal the
//! CPU bytes exactly (docs/quantization.md lists no exception); guards must stay intact.
//!
//! Timing: CUDA events around each launch after warm-up, the median of `-n` runs (the
//! launches queued behind large copies, so the host's launch time is not counted), beside
//! a device-to-device copy of the kernel's input bytes in the same run; GB/s count bytes
//! read + written. Per kernel: the roofline (its bytes at the copy's rate) and, where
//! `python3` imports torch with CUDA, the same kernel in PyTorch under `torch.compile`
//! (scripts/kernels-compiled.py, same run), then a summary line `worst: R of roofline
//! (KERNEL); slowest vs torch.compile: C (KERNEL)`; then the launch-bound end, 64 Ki to
//! 4 Mi elements. `--tune` re-runs this executable with `--bench-only` once per
//! `STRATA_KERNEL_GEOMETRY=E,T` and prints the best geometry (docs/gpu.md).
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
    elementwise(ck, rng, quick)?;
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

/// The element-wise kernels of the device transports (`strata_reduce_*`,
/// `strata_divide_*`) against `reduce_into` / `finish_avg`: every type and op, odd counts
/// and offsets (16-byte vectorized and element paths), random bits with specials.
/// Equal bit for bit, except that two NaNs of other payloads count as equal (the GPU's
/// arithmetic NaN is canonical, the CPU's carries an operand's payload).
fn elementwise(ck: &mut Checker, rng: &mut Rng, quick: bool) -> Result<()> {
    use strata::dtype::{finish_avg, reduce_into};
    let st = ck.stream.clone();
    let counts: &[usize] = if quick {
        &[1, 37, 4099]
    } else {
        &[1, 7, 37, 1000, 4099, 100_003]
    };
    for dt in DataType::ALL {
        let sz = dt.size();
        for &count in counts {
            let off = [0, 16, sz][rng.below(3) as usize];
            let bits = |rng: &mut Rng| -> Vec<u8> {
                let mut v = rng.bytes(count * sz);
                if dt.is_float() {
                    // Mostly ordinary values (random bits are mostly huge or NaN in f16).
                    let ok = values(rng, count, dt, true);
                    for (i, e) in v.chunks_mut(sz).enumerate() {
                        if rng.below(8) != 0 {
                            e.copy_from_slice(&ok[i * sz..(i + 1) * sz]);
                        }
                    }
                }
                v
            };
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let (acc, src) = (bits(rng), bits(rng));
                let mut want = acc.clone();
                reduce_into(&mut want, &src, dt, op);
                let mut d_acc = upload(&st, &acc, off)?;
                let d_src = upload(&st, &src, off)?;
                {
                    let mut a = d_acc.slice_mut(off..off + acc.len());
                    ck.gpu.reduce(
                        &st,
                        &mut a,
                        &d_src.slice(off..off + src.len()),
                        count,
                        dt,
                        op,
                    )?;
                }
                let got = st.clone_dtoh(&d_acc).map_err(dev)?;
                ck.elementwise_result("reduce", dt, &got[off..off + acc.len()], &want);
            }
            let n = [1usize, 3, 8, 24][rng.below(4) as usize];
            let buf = bits(rng);
            let mut want = buf.clone();
            finish_avg(&mut want, dt, n);
            let mut d_buf = upload(&st, &buf, off)?;
            {
                let mut b = d_buf.slice_mut(off..off + buf.len());
                ck.gpu.divide(&st, &mut b, count, dt, n)?;
            }
            let got = st.clone_dtoh(&d_buf).map_err(dev)?;
            ck.elementwise_result("divide", dt, &got[off..off + buf.len()], &want);
        }
    }
    Ok(())
}

impl Checker {
    fn elementwise_result(&mut self, what: &'static str, dt: DataType, got: &[u8], want: &[u8]) {
        let sz = dt.size();
        let nan = |e: &[u8]| dt.is_float() && dt.get(e, 0).is_nan();
        let bad = got
            .chunks(sz)
            .zip(want.chunks(sz))
            .filter(|(g, w)| g != w && !(nan(g) && nan(w)))
            .count();
        let t = self.tally.entry(what).or_default();
        t.cases += 1;
        if bad > 0 {
            t.failed += 1;
            eprintln!(
                "ERROR {what} {dt}: {bad} of {} elements differ",
                want.len() / sz
            );
        }
    }
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

/// One timed kernel beside a device-to-device copy timed in the same run.
struct Row {
    name: String,
    read: usize,
    written: usize,
    kernel_us: f64,
    /// Bytes of the copy timed beside the kernel (its input; a dequantizer's output).
    copy_bytes: usize,
    copy_us: f64,
}

impl Row {
    /// The kernel's GB/s: (read + written) / time.
    fn gbs(&self) -> f64 {
        (self.read + self.written) as f64 / self.kernel_us / 1e3
    }
    /// The copy's GB/s: it reads and writes `copy_bytes`.
    fn copy_gbs(&self) -> f64 {
        2.0 * self.copy_bytes as f64 / self.copy_us / 1e3
    }
    /// The kernel's bytes at the copy's rate: the time of a kernel at the memory bound.
    fn roofline_us(&self) -> f64 {
        (self.read + self.written) as f64 * self.copy_us / (2.0 * self.copy_bytes as f64)
    }
    /// roofline / time: 1 at the copy's rate.
    fn of_roofline(&self) -> f64 {
        self.roofline_us() / self.kernel_us
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Bytes of each copy that keeps the GPU busy while a timed batch is queued.
const FILL_BYTES: usize = 256 << 20;

/// Times launches on the default stream: `warm` warm-up launches, then `iters` launches
/// each between its own pair of CUDA events, all queued behind a few large copies (so the
/// host's launch time never leaves the GPU idle between the events), the median in
/// microseconds. Copies of a given size are timed once (cached).
struct Timer {
    st: Arc<CudaStream>,
    warm: usize,
    iters: usize,
    fill: (CudaSlice<u8>, CudaSlice<u8>),
    copies: std::collections::HashMap<usize, f64>,
}

impl Timer {
    fn new(ctx: &Arc<CudaContext>, warm: usize, iters: usize) -> Result<Timer> {
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

    fn time(&mut self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
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
    fn row(
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
    fn copy(&mut self, bytes: usize) -> Result<f64> {
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

/// The f32 values `host` (at least n) converted to `dt`, as bytes.
fn typed(host: &[u8], n: usize, dt: DataType) -> Vec<u8> {
    if dt == DataType::F32 {
        return host[..n * 4].to_vec();
    }
    let mut v = vec![0u8; n * dt.size()];
    for i in 0..n {
        dt.set(&mut v, i, DataType::F32.get(host, i));
    }
    v
}

/// Times quantize of the elements `src` (of `dt`) into packed `d_q` under `s`: the row.
fn bench_quantize(
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
fn bench_dequantize(
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
fn bench_drq(
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
fn bench(
    ctx: &Arc<CudaContext>,
    gpu: &GpuQuant,
    rng: &mut Rng,
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
const SMALL: [usize; 4] = [1 << 16, 1 << 18, 1 << 20, 1 << 22];

/// quantize f32 and bf16, dequantize bf16 and dequant_reduce_quant k8 x4, int8 block
/// 2048, at each of `SMALL`: (elements, row).
fn bench_small(
    ctx: &Arc<CudaContext>,
    gpu: &GpuQuant,
    rng: &mut Rng,
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

// ------------------------------------------------------------------ child processes

/// What a child process did: its exit status (None: killed at the timeout), its stdout,
/// its stderr when captured, and its seconds.
struct Ran {
    status: Option<std::process::ExitStatus>,
    stdout: String,
    stderr: String,
    secs: f64,
}

impl Ran {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    /// Why it failed, in one line: the exit status or the timeout, and stderr's last line.
    fn why(&self) -> String {
        let how = match self.status {
            None => format!("timed out after {:.0} s", self.secs),
            Some(s) => format!("{s}"),
        };
        match self.stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(l) => format!("{how}: {}", l.trim().chars().take(160).collect::<String>()),
            None => how,
        }
    }
}

/// Reads a child's pipe on a thread of its own, chunk by chunk (a grandchild that keeps
/// the pipe open must not hang the check: the caller takes what came by a deadline).
fn drain<R: std::io::Read + Send + 'static>(
    r: Option<R>,
) -> Option<std::sync::mpsc::Receiver<Vec<u8>>> {
    let mut r = r?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 1 << 16];
        while let Ok(k) = r.read(&mut b) {
            if k == 0 || tx.send(b[..k].to_vec()).is_err() {
                break;
            }
        }
    });
    Some(rx)
}

/// What came through a pipe until it closed or until `deadline`.
fn collect(rx: Option<std::sync::mpsc::Receiver<Vec<u8>>>, deadline: std::time::Instant) -> String {
    let mut b = Vec::new();
    if let Some(rx) = rx {
        while let Ok(c) =
            rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        {
            b.extend(c);
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Runs `cmd` (stdin closed, stdout captured, stderr captured or passed through), killing
/// it after `timeout`.
fn run_child(
    mut cmd: std::process::Command,
    timeout: std::time::Duration,
    capture_stderr: bool,
) -> std::io::Result<Ran> {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    cmd.stderr(if capture_stderr {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    let t0 = Instant::now();
    let mut child = cmd.spawn()?;
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if t0.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let secs = t0.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(5);
    Ok(Ran {
        status,
        stdout: collect(out, deadline),
        stderr: collect(err, deadline),
        secs,
    })
}

// ------------------------------------------------------------------ torch.compile

/// The script that writes the kernels in PyTorch and times them compiled: the path in
/// `STRATA_KERNELS_COMPILED`, else `scripts/kernels-compiled.py` under the working
/// directory or under a folder above this executable (target/release/, gpu-bundle/).
fn compiled_script() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_KERNELS_COMPILED") {
        return Some(p.into());
    }
    let rel = std::path::Path::new("scripts/kernels-compiled.py");
    let mut dirs: Vec<std::path::PathBuf> = std::env::current_dir().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.ancestors().skip(1).map(|d| d.to_path_buf()));
    }
    dirs.into_iter().map(|d| d.join(rel)).find(|p| p.is_file())
}

/// The compiled figures, {row name, or "ROW @N" for the small sizes: us}, and a line
/// saying where they came from or why there are none.
fn compiled(o: &Opts) -> (std::collections::HashMap<String, f64>, String) {
    use std::process::Command;
    use std::time::Duration;
    let none = std::collections::HashMap::new();
    if o.no_compiled {
        return (none, "not run (--no-compiled)".into());
    }
    let mut probe = Command::new("python3");
    probe.args(["-c", "import torch; assert torch.cuda.is_available()"]);
    match run_child(probe, Duration::from_secs(120), true) {
        Ok(r) if r.ok() => {}
        Ok(r) => {
            return (
                none,
                format!("skipped: torch with CUDA is not importable ({})", r.why()),
            )
        }
        Err(e) => return (none, format!("skipped: no python3 ({e})")),
    }
    let Some(script) = compiled_script() else {
        return (
            none,
            "skipped: scripts/kernels-compiled.py not found (STRATA_KERNELS_COMPILED=path)".into(),
        );
    };
    let small: Vec<String> = SMALL.iter().map(|n| n.to_string()).collect();
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args([
        "--elems",
        &o.bench_n.to_string(),
        "--small",
        &small.join(","),
        "--iters",
        &o.iters.to_string(),
        "--warmup",
        &o.warm.to_string(),
        "--budget",
        &o.compiled_timeout.saturating_sub(30).max(10).to_string(),
    ]);
    println!(
        "\ntorch.compile: {} (timeout {} s; its diagnostics on stderr) ...",
        script.display(),
        o.compiled_timeout
    );
    let r = match run_child(cmd, Duration::from_secs(o.compiled_timeout), false) {
        Ok(r) => r,
        Err(e) => {
            return (
                none,
                format!("skipped: {} did not start ({e})", script.display()),
            )
        }
    };
    if !r.ok() {
        return (none, format!("failed: {}", r.why()));
    }
    let last = r.stdout.lines().rev().find(|l| !l.trim().is_empty());
    let map: serde_json::Map<String, serde_json::Value> = match last.map(serde_json::from_str) {
        Some(Ok(m)) => m,
        _ => return (none, "failed: its output was not one JSON object".into()),
    };
    let figures: std::collections::HashMap<String, f64> = map
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_f64()?)))
        .collect();
    let why = format!(
        "{} rows from torch.compile in {:.0} s",
        figures.len(),
        r.secs
    );
    (figures, why)
}

fn opt_us(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn opt_ratio(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The main table, then the summary line (its format is what scripts/gpu-all reads):
/// `worst: R of roofline (KERNEL); slowest vs torch.compile: C (KERNEL)`, C = compiled /
/// strata, `-` and the reason in parentheses where there are no compiled figures.
fn print_main(rows: &[Row], comp: &std::collections::HashMap<String, f64>, note: &str) {
    println!(
        "{:<44} {:>8} {:>8} {:>9} {:>6} {:>9} {:>11} {:>11} {:>11} {:>15}",
        "kernel",
        "read MB",
        "write MB",
        "strata us",
        "GB/s",
        "copy GB/s",
        "roofline us",
        "of roofline",
        "compiled us",
        "compiled/strata"
    );
    for r in rows {
        let c = comp.get(&r.name).copied();
        println!(
            "{:<44} {:>8.1} {:>8.1} {:>9.1} {:>6.0} {:>9.0} {:>11.1} {:>11.2} {:>11} {:>15}",
            r.name,
            r.read as f64 / 1e6,
            r.written as f64 / 1e6,
            r.kernel_us,
            r.gbs(),
            r.copy_gbs(),
            r.roofline_us(),
            r.of_roofline(),
            opt_us(c),
            opt_ratio(c.map(|c| c / r.kernel_us)),
        );
    }
    let worst = rows
        .iter()
        .min_by(|a, b| a.of_roofline().total_cmp(&b.of_roofline()));
    let slowest = rows
        .iter()
        .filter_map(|r| Some((comp.get(&r.name)? / r.kernel_us, &r.name)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some(w) = worst {
        println!(
            "worst: {:.2} of roofline ({}); slowest vs torch.compile: {}",
            w.of_roofline(),
            w.name,
            match slowest {
                Some((c, name)) => format!("{c:.2} ({name})"),
                None => format!("- ({note})"),
            }
        );
    }
}

fn print_small(rows: &[(usize, Row)], comp: &std::collections::HashMap<String, f64>) {
    println!(
        "{:>9} {:<36} {:>9} {:>8} {:>11} {:>11} {:>11} {:>15}",
        "elements",
        "kernel",
        "strata us",
        "copy us",
        "roofline us",
        "of roofline",
        "compiled us",
        "compiled/strata"
    );
    for (n, r) in rows {
        let c = comp.get(&format!("{} @{n}", r.name)).copied();
        println!(
            "{:>9} {:<36} {:>9.2} {:>8.2} {:>11.2} {:>11.2} {:>11} {:>15}",
            n,
            r.name,
            r.kernel_us,
            r.copy_us,
            r.roofline_us(),
            r.of_roofline(),
            c.map_or("-".into(), |v| format!("{v:.2}")),
            opt_ratio(c.map(|c| c / r.kernel_us)),
        );
    }
}

// ------------------------------------------------------------------ --tune

/// The variable the library reads once per process: "E,T", E elements per lane and T
/// threads per thread block of its kernels.
const GEOMETRY_VAR: &str = "STRATA_KERNEL_GEOMETRY";

/// (name, strata us) of the main table in a `--bench-only` child's output: the name is
/// the words before the first number, the time the third number.
fn parse_rows(out: &str) -> Vec<(String, f64)> {
    let mut rows = Vec::new();
    let mut table = false;
    for line in out.lines() {
        if line.starts_with("bandwidth (") {
            table = true;
            continue;
        }
        if !table {
            continue;
        }
        if line.trim().is_empty() || line.starts_with("worst:") {
            break;
        }
        let tok: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = tok.iter().position(|t| t.parse::<f64>().is_ok()) else {
            continue; // the header
        };
        if let (true, Some(Ok(us))) = (i > 0, tok.get(i + 2).map(|t| t.parse::<f64>())) {
            rows.push((tok[..i].join(" "), us));
        }
    }
    rows
}

/// Re-runs this executable with `--bench-only` once with the library's own geometry and
/// once per geometry E x T, prints kernel x geometry -> us, the best geometry per kernel,
/// and `best geometry: E,T: X us over K kernels (default Y us)` (the smallest sum of the
/// kernels' times among the geometries that ran every kernel). True when every child ran.
fn tune(o: &Opts) -> bool {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("strata-gpu-check --tune: no path to this executable: {e}");
            return false;
        }
    };
    let mut geoms: Vec<Option<(u32, u32)>> = vec![None];
    for e in [16, 32, 64] {
        for t in [128, 256, 512] {
            geoms.push(Some((e, t)));
        }
    }
    let mut all_ok = true;
    let mut names: Vec<String> = Vec::new();
    let mut cols: Vec<(String, std::collections::HashMap<String, f64>)> = Vec::new();
    let mut device = None;
    for g in geoms {
        let label = g.map_or("default".to_string(), |(e, t)| format!("{e},{t}"));
        let mut cmd = std::process::Command::new(&exe);
        cmd.args([
            "--bench-only",
            "-n",
            &o.iters.to_string(),
            "-w",
            &o.warm.to_string(),
        ])
        .args([
            "--seed",
            &o.seed.to_string(),
            "--bench-elems",
            &o.bench_n.to_string(),
        ]);
        match g {
            None => cmd.env_remove(GEOMETRY_VAR),
            Some(_) => cmd.env(GEOMETRY_VAR, &label),
        };
        let rows = match run_child(cmd, std::time::Duration::from_secs(90), true) {
            Ok(r) if r.ok() => {
                let rows = parse_rows(&r.stdout);
                if device.is_none() {
                    device = r
                        .stdout
                        .lines()
                        .find(|l| l.starts_with("device:"))
                        .map(String::from);
                }
                eprintln!(
                    "tune: geometry {label}: {} rows in {:.1} s",
                    rows.len(),
                    r.secs
                );
                rows
            }
            Ok(r) => {
                eprintln!("tune: geometry {label}: FAILED, {}", r.why());
                Vec::new()
            }
            Err(e) => {
                eprintln!("tune: geometry {label}: did not start: {e}");
                Vec::new()
            }
        };
        all_ok &= !rows.is_empty();
        for (n, _) in &rows {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        cols.push((label, rows.into_iter().collect()));
    }
    if let Some(d) = device {
        println!("{d}");
    }
    println!(
        "\ntune ({GEOMETRY_VAR}=E,T: E elements per lane, T threads per block; {} elements; strata us, median of {} runs; default: the variable unset):",
        o.bench_n, o.iters
    );
    print!("{:<44}", "kernel");
    for (l, _) in &cols {
        print!(" {l:>8}");
    }
    println!("  best");
    for n in &names {
        print!("{n:<44}");
        for (_, c) in &cols {
            print!(" {:>8}", opt_us(c.get(n).copied()));
        }
        let best = cols[1..]
            .iter()
            .filter_map(|(l, c)| Some((l, *c.get(n)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((l, us)) => println!("  {l} {us:.1}"),
            None => println!("  -"),
        }
    }
    let total = |c: &std::collections::HashMap<String, f64>| -> Option<f64> {
        names.iter().map(|n| c.get(n)).sum::<Option<f64>>()
    };
    let default = cols.first().and_then(|(_, c)| total(c));
    let best = cols[1..]
        .iter()
        .filter_map(|(l, c)| Some((l, total(c)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|_| !names.is_empty());
    match best {
        Some((l, t)) => println!(
            "best geometry: {l}: {t:.1} us over {} kernels (default {} us)",
            names.len(),
            opt_us(default)
        ),
        None => println!("best geometry: none (no geometry ran every kernel)"),
    }
    all_ok
}

// ------------------------------------------------------------------ main

struct Opts {
    quick: bool,
    no_bench: bool,
    bench_only: bool,
    tune: bool,
    no_compiled: bool,
    compiled_timeout: u64,
    verbose: bool,
    iters: usize,
    warm: usize,
    seed: u64,
    bench_n: usize,
}

const HELP: &str = "strata-gpu-check [--quick] [--no-bench] [--bench-only] [--tune] [--no-compiled]
                 [--compiled-timeout S] [-v] [-n ITERS] [-w WARMUP] [--seed S] [--bench-elems N]
  (none)         every kernel against the CPU reference, then the bandwidth table (strata,
                 torch.compile where torch with CUDA imports, the roofline of a copy) and
                 the small sizes
  --quick        a shorter correctness sweep, no bench; --no-bench: no bench
  --bench-only   the main bandwidth table only (no correctness, small sizes, compiled)
  --tune         the main table once per STRATA_KERNEL_GEOMETRY=E,T (E 16/32/64, T
                 128/256/512; child processes of this executable), the best geometry
  --no-compiled  no torch.compile column; --compiled-timeout S (default 180) for it
  STRATA_KERNELS_COMPILED=path: the script (default scripts/kernels-compiled.py)";

fn main() {
    let mut o = Opts {
        quick: false,
        no_bench: false,
        bench_only: false,
        tune: false,
        no_compiled: false,
        compiled_timeout: 180,
        verbose: false,
        iters: 50,
        warm: 5,
        seed: 0x5EED,
        bench_n: 1 << 26,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-bench" => o.no_bench = true,
            "--bench-only" => o.bench_only = true,
            "--tune" => o.tune = true,
            "--no-compiled" => o.no_compiled = true,
            "--compiled-timeout" => o.compiled_timeout = num("--compiled-timeout").max(1) as u64,
            "-v" | "--verbose" => o.verbose = true,
            "-n" => o.iters = num("-n").max(1),
            "-w" => o.warm = num("-w"),
            "--seed" => o.seed = num("--seed") as u64,
            "--bench-elems" => o.bench_n = num("--bench-elems").max(1024),
            "-h" | "--help" => {
                println!("{HELP}");
                return;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if o.tune {
        std::process::exit(if tune(&o) { 0 } else { 1 });
    }
    match run(&o) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("strata-gpu-check: {e}");
            std::process::exit(1);
        }
    }
}

fn run(o: &Opts) -> Result<bool> {
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
    let seed = o.seed;
    let mut rng = Rng(seed);
    let mut ck = Checker {
        stream: ctx.default_stream(),
        gpu,
        tally: Default::default(),
        verbose: o.verbose,
    };
    let mut ok = true;
    if !o.bench_only {
        let t0 = std::time::Instant::now();
        correctness(&mut ck, &mut rng, o.quick)?;
        println!(
            "\ncorrectness against the CPU reference ({:.1} s, seed {seed:#x}):",
            t0.elapsed().as_secs_f64()
        );
        println!(
            "{:<24} {:>7} {:>7} {:>14}",
            "kernel", "cases", "failed", "max |diff|"
        );
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
        if o.no_bench || o.quick {
            return Ok(ok);
        }
    }
    let (iters, warm) = (o.iters, o.warm);
    let mut tm = Timer::new(&ctx, warm, iters)?;
    let rows = bench(&ctx, &ck.gpu, &mut rng, o.bench_n, &mut tm)?;
    let small = if o.bench_only {
        Vec::new()
    } else {
        bench_small(&ctx, &ck.gpu, &mut rng, &mut tm)?
    };
    drop(tm); // its buffers: torch.compile's process has the GPU next
    let (comp, note) = if o.bench_only {
        (Default::default(), "not run (--bench-only)".to_string())
    } else {
        compiled(o)
    };
    println!(
        "\nbandwidth ({} elements; median of {iters} runs after {warm} warm-up, CUDA events, queued; GB/s = (read + written) / time; copy GB/s: a device-to-device copy of the kernel's input (a dequantizer's output) in the same run; roofline us = (read + written) / copy GB/s; compiled: the kernel in PyTorch under torch.compile, same bytes, same run ({note}); compiled/strata > 1: strata faster):",
        o.bench_n
    );
    print_main(&rows, &comp, &note);
    if !small.is_empty() {
        println!("\nsmall sizes (int8, block 2048; us; the same timing and copy):");
        print_small(&small, &comp);
    }
    Ok(ok)
}
