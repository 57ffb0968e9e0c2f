//! The correctness sweeps: quantization kernels, the element-wise kernels, the errors.

use crate::check::{dev, upload, Checker};
use crate::inputs::{spec, values};
use rand::Rng as _;
use rand_chacha::ChaCha8Rng;
use strata::kernels::QuantSpec;
use strata::{DataType, ReduceOp, Result};

pub(crate) fn correctness(ck: &mut Checker, rng: &mut ChaCha8Rng, quick: bool) -> Result<()> {
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
                let dt = dts[rng.random_range(0..3u64) as usize];
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
                let dt = dts[rng.random_range(0..3u64) as usize];
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
pub(crate) fn elementwise(ck: &mut Checker, rng: &mut ChaCha8Rng, quick: bool) -> Result<()> {
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
            let off = [0, 16, sz][rng.random_range(0..3u64) as usize];
            let bits = |rng: &mut ChaCha8Rng| -> Vec<u8> {
                let mut v = rng.random_iter().take(count * sz).collect::<Vec<u8>>();
                if dt.is_float() {
                    // Mostly ordinary values (random bits are mostly huge or NaN in f16).
                    let ok = values(rng, count, dt, true);
                    for (i, e) in v.chunks_mut(sz).enumerate() {
                        if rng.random_range(0..8u64) != 0 {
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
            let n = [1usize, 3, 8, 24][rng.random_range(0..4u64) as usize];
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
    pub(crate) fn elementwise_result(
        &mut self,
        what: &'static str,
        dt: DataType,
        got: &[u8],
        want: &[u8],
    ) {
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
pub(crate) fn check_errors(ck: &mut Checker) -> Result<()> {
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
    for (dt, dst, case) in [
        (DataType::F32, 9, "a wrong dst size"),
        (DataType::I32, 8, "i32"),
    ] {
        let r = ck
            .gpu
            .quantize(&st, s, dt, &buf.slice(0..16), &mut out.slice_mut(0..dst));
        if !matches!(r, Err(strata::Error::InvalidArgument(_))) {
            bad.push(format!("quantize accepted {case}: {r:?}"));
        }
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
