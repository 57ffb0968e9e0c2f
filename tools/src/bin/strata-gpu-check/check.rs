//! The checker: device buffers inside poisoned guard bytes, the tally per kernel, and
//! the comparison of every quantization kernel's output with the CPU reference.

use crate::inputs::{packed_input, values};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use rand::{Rng as _, RngCore as _};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata::kernels::{self as cpu, QuantSpec};
use strata::kernels_gpu::GpuQuant;
use strata::{DataType, ReduceOp, Result};

pub(crate) const GUARD: usize = 64;

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) cases: usize,
    pub(crate) failed: usize,
    pub(crate) max_diff: f64,
}

pub(crate) struct Checker {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) gpu: GpuQuant,
    pub(crate) tally: std::collections::BTreeMap<&'static str, Tally>,
    pub(crate) verbose: bool,
}

/// A device buffer of `len` bytes at byte offset `off` inside `GUARD` poisoned bytes on
/// each side: (buffer, host copy of the whole poisoned allocation).
pub(crate) fn poisoned(
    stream: &Arc<CudaStream>,
    len: usize,
    off: usize,
    poison: u8,
) -> Result<(CudaSlice<u8>, Vec<u8>)> {
    let host = vec![poison; len + off + 2 * GUARD];
    let d = stream.clone_htod(&host).map_err(dev)?;
    Ok((d, host))
}

pub(crate) fn upload(stream: &Arc<CudaStream>, bytes: &[u8], off: usize) -> Result<CudaSlice<u8>> {
    let mut host = vec![0x5Au8; bytes.len() + off + GUARD];
    host[off..off + bytes.len()].copy_from_slice(bytes);
    stream.clone_htod(&host).map_err(dev)
}

pub(crate) fn dev(e: cudarc::driver::DriverError) -> strata::Error {
    strata::Error::Device(format!("{e:?}"))
}

/// Largest |a - b| over elements of `dt` (NaN == NaN), for the report.
pub(crate) fn elem_diff(dt: DataType, a: &[u8], b: &[u8]) -> f64 {
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
    pub(crate) fn compare(
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

    pub(crate) fn fail(&mut self, kernel: &'static str, what: &str, e: strata::Error) {
        let t = self.tally.entry(kernel).or_default();
        t.cases += 1;
        t.failed += 1;
        eprintln!("ERROR {kernel} {what}: {e}");
    }

    /// One case of a kernel: `src` uploaded at byte offset `soff` (random bytes after it),
    /// an output of `want.len()` bytes at byte offset `doff` inside poisoned guards,
    /// `launch` run on the two views, then the whole output allocation compared with
    /// `want` (a launch error is counted as a failure of `kernel`). From `rng`, in this
    /// order: each offset (`unit` times a draw below `steps`, source first), the poison.
    #[allow(clippy::too_many_arguments)]
    fn case(
        &mut self,
        rng: &mut ChaCha8Rng,
        kernel: &'static str,
        what: &str,
        src: &[u8],
        [(src_steps, src_unit), (dst_steps, dst_unit)]: [(u64, usize); 2],
        want: &[u8],
        launch: impl FnOnce(
            &GpuQuant,
            &Arc<CudaStream>,
            &CudaView<'_, u8>,
            &mut CudaViewMut<'_, u8>,
        ) -> Result<()>,
        diff: impl Fn(&[u8], &[u8]) -> f64,
    ) -> Result<()> {
        let (soff, doff) = (
            (rng.random_range(0..src_steps) as usize) * src_unit,
            (rng.random_range(0..dst_steps) as usize) * dst_unit,
        );
        let what = &format!("{what} offsets {soff}/{doff}");
        let poison = rng.next_u64() as u8;
        let d_src = upload(&self.stream, src, soff)?;
        let (mut d_dst, _) = poisoned(&self.stream, want.len(), doff, poison)?;
        let r = {
            let s = d_src.slice(soff..soff + src.len());
            let mut o = d_dst.slice_mut(GUARD + doff..GUARD + doff + want.len());
            launch(&self.gpu, &self.stream, &s, &mut o)
        };
        if let Err(e) = r {
            self.fail(kernel, what, e);
            return Ok(());
        }
        let got = self.stream.clone_dtoh(&d_dst).map_err(dev)?;
        self.compare(kernel, what, want, &got, doff, poison, diff);
        Ok(())
    }

    pub(crate) fn quantize(
        &mut self,
        rng: &mut ChaCha8Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        special: bool,
    ) -> Result<()> {
        let src = values(rng, n, dt, special);
        let mut want = vec![0u8; spec.packed_len(n)];
        cpu::quantize(spec, dt, &src, &mut want)?;
        self.case(
            rng,
            "quantize",
            &format!("{dt} q{} block {} n {n}", spec.bits, spec.block),
            &src,
            [(3, dt.size()), (4, 1)],
            &want,
            |gpu, st, s, o| gpu.quantize(st, spec, dt, s, o),
            |a, b| packed_diff(spec, n, 1, a, b),
        )
    }

    pub(crate) fn dequantize(
        &mut self,
        rng: &mut ChaCha8Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        raw: bool,
    ) -> Result<()> {
        let packed = packed_input(rng, spec, n, raw)?;
        let mut want = vec![0u8; n * dt.size()];
        cpu::dequantize(spec, &packed, n, dt, &mut want)?;
        self.case(
            rng,
            "dequantize",
            &format!("{dt} q{} block {} n {n} raw {raw}", spec.bits, spec.block),
            &packed,
            [(4, 1), (3, dt.size())],
            &want,
            |gpu, st, s, o| gpu.dequantize(st, spec, s, n, dt, o),
            |a, b| elem_diff(dt, a, b),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn swizzled(
        &mut self,
        rng: &mut ChaCha8Rng,
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
        self.case(
            rng,
            "swizzled_quantize",
            &format!(
                "{dt} q{} block {} c {c} nodes {nodes} devices {devices} stages {stages}",
                spec.bits, spec.block
            ),
            &src,
            [(2, dt.size()), (4, 1)],
            &want,
            |gpu, st, s, o| gpu.swizzled_quantize(st, spec, dt, s, c, nodes, devices, stages, o),
            |a, b| {
                if a == b {
                    0.0
                } else {
                    f64::INFINITY
                }
            },
        )
    }

    pub(crate) fn drq(
        &mut self,
        rng: &mut ChaCha8Rng,
        spec: QuantSpec,
        n: usize,
        slices: usize,
        k: usize,
        raw: bool,
    ) -> Result<()> {
        let per = spec.packed_len(n) * slices;
        let all = packed_inputs(rng, spec, n, raw, k * slices)?;
        let ins = split(&all, per, k);
        let mut want = vec![0u8; per];
        cpu::dequant_reduce_quant(spec, &ins, n, slices, &mut want)?;
        self.case(
            rng,
            "dequant_reduce_quant",
            &format!(
                "q{} block {} n {n} slices {slices} k {k} raw {raw}",
                spec.bits, spec.block
            ),
            &all,
            [(4, 1), (4, 1)],
            &want,
            |gpu, st, s, o| gpu.dequant_reduce_quant(st, spec, s, k, n, slices, o),
            |a, b| packed_diff(spec, n, slices, a, b),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dequant_reduce(
        &mut self,
        rng: &mut ChaCha8Rng,
        spec: QuantSpec,
        dt: DataType,
        n: usize,
        k: usize,
        op: ReduceOp,
        divisor: usize,
        raw: bool,
    ) -> Result<()> {
        let all = packed_inputs(rng, spec, n, raw, k)?;
        let ins = split(&all, spec.packed_len(n), k);
        let mut want = vec![0u8; n * dt.size()];
        cpu::dequant_reduce(spec, &ins, n, op, divisor, dt, &mut want)?;
        self.case(
            rng,
            "dequant_reduce",
            &format!(
                "{dt} q{} block {} n {n} k {k} {op} /{divisor} raw {raw}",
                spec.bits, spec.block
            ),
            &all,
            [(4, 1), (3, dt.size())],
            &want,
            |gpu, st, s, o| gpu.dequant_reduce(st, spec, s, k, n, op, divisor, dt, o),
            |a, b| elem_diff(dt, a, b),
        )
    }
}

/// `count` packed inputs of `n` elements each, one after the other.
fn packed_inputs(
    rng: &mut ChaCha8Rng,
    spec: QuantSpec,
    n: usize,
    raw: bool,
    count: usize,
) -> Result<Vec<u8>> {
    let mut all = Vec::with_capacity(spec.packed_len(n) * count);
    for _ in 0..count {
        all.extend(packed_input(rng, spec, n, raw)?);
    }
    Ok(all)
}

/// The `k` inputs of `per` bytes each in `all` (`k` empty ones when `per` is 0).
fn split(all: &[u8], per: usize, k: usize) -> Vec<&[u8]> {
    if per == 0 {
        vec![&[][..]; k]
    } else {
        all.chunks(per).collect()
    }
}

/// Largest difference between the dequantized values of two packed buffers.
pub(crate) fn packed_diff(spec: QuantSpec, n: usize, slices: usize, a: &[u8], b: &[u8]) -> f64 {
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
