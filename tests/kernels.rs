//! Property tests of the CPU reference quantization kernels against a literal reading of
//! docs/quantization.md (format, rounding, nibble order, swizzle layout, fused kernels,
//! error bound).

use half::{bf16, f16};
use proptest::prelude::*;
use strata::kernels::{
    self, dequant_reduce, dequant_reduce_quant, dequantize, quantize, swizzle_ranges, swizzled_len,
    swizzled_offset, swizzled_quantize, QuantSpec,
};
use strata::{DataType, Error, ReduceOp};

const FLOATS: [DataType; 3] = [DataType::F32, DataType::F16, DataType::BF16];
const CANON: u32 = 0x7FC0_0000;

// ---------------------------------------------------------------- helpers

/// `v` as `dtype` bytes (finite values saturate to the type's range, so generated inputs
/// stay finite).
fn encode(dtype: DataType, v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match dtype {
            DataType::F32 => x.to_le_bytes().to_vec(),
            DataType::F16 => f16::from_f32(if x.is_finite() {
                x.clamp(-65504.0, 65504.0)
            } else {
                x
            })
            .to_le_bytes()
            .to_vec(),
            DataType::BF16 => {
                let h = bf16::from_f32(x);
                let h = if x.is_finite() && h.is_infinite() {
                    bf16::MAX.copysign(h)
                } else {
                    h
                };
                h.to_le_bytes().to_vec()
            }
            _ => unreachable!(),
        })
        .collect()
}

/// `dtype` bytes as exact f32 values.
fn decode(dtype: DataType, b: &[u8]) -> Vec<f32> {
    match dtype {
        DataType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DataType::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DataType::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => unreachable!(),
    }
}

/// f32 narrowed to `dtype` bytes with RNE and canonical NaNs (the contract's output rule).
fn narrow(dtype: DataType, v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match dtype {
            DataType::F32 => {
                let x = if x.is_nan() { f32::from_bits(CANON) } else { x };
                x.to_le_bytes().to_vec()
            }
            DataType::F16 => narrow_half(x, 0x7E00, |x| f16::from_f32(x).to_bits()),
            DataType::BF16 => narrow_half(x, 0x7FC0, |x| bf16::from_f32(x).to_bits()),
            _ => unreachable!(),
        })
        .collect()
}

/// `x` as the bytes of a 16-bit float: its canonical NaN `nan`, else `bits(x)` (RNE).
fn narrow_half(x: f32, nan: u16, bits: impl Fn(f32) -> u16) -> Vec<u8> {
    let h = if x.is_nan() { nan } else { bits(x) };
    h.to_le_bytes().to_vec()
}

/// `v` as `dt` (`encode`), its exact f32 values and their quantization, checked equal
/// to the reference's (into a buffer of 0xEE bytes: every byte must be written).
fn quantized(spec: QuantSpec, dt: DataType, v: &[f32]) -> (Vec<f32>, Vec<u8>) {
    let src = encode(dt, v);
    let x = decode(dt, &src);
    let mut packed = vec![0xEEu8; spec.packed_len(x.len())];
    quantize(spec, dt, &src, &mut packed).unwrap();
    assert_eq!(packed, ref_quantize(spec, &x));
    (x, packed)
}

/// The quantizer exactly as docs/quantization.md words it, with no tricks.
fn ref_quantize(spec: QuantSpec, x: &[f32]) -> Vec<u8> {
    let qmax = spec.qmax();
    let qf = qmax as f32;
    let mut scales = Vec::new();
    let mut codes = Vec::new();
    for blk in x.chunks(spec.block) {
        if blk.iter().any(|v| !v.is_finite()) {
            scales.push(f32::from_bits(CANON));
            codes.extend(std::iter::repeat(0i32).take(blk.len()));
            continue;
        }
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            scales.push(0.0);
            codes.extend(std::iter::repeat(0i32).take(blk.len()));
            continue;
        }
        scales.push(amax / qf);
        let (k, inv) = if amax < 2f32.powi(-64) {
            let up = 2f32.powi(64);
            (up, qf / (amax * up))
        } else {
            (1.0, qf / amax)
        };
        codes.extend(
            blk.iter()
                .map(|&v| ((v * k) * inv).round_ties_even().clamp(-qf, qf) as i32),
        );
    }
    let mut out: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    if spec.bits == 8 {
        out.extend(codes.iter().map(|&q| q as i8 as u8));
    } else {
        out.extend(codes.chunks(2).map(|p| {
            let lo = (p[0] & 0xF) as u8;
            let hi = p.get(1).map_or(0, |&q| (q & 0xF) as u8);
            lo | (hi << 4)
        }));
    }
    out
}

/// Codes of a packed slice, sign-extended.
fn codes_of(spec: QuantSpec, packed: &[u8], n: usize) -> Vec<i32> {
    let c = &packed[4 * spec.blocks(n)..];
    if spec.bits == 8 {
        c.iter().map(|&b| b as i8 as i32).collect()
    } else {
        (0..n)
            .map(|i| {
                let b = c[i / 2];
                let nib = if i % 2 == 0 { b & 0xF } else { b >> 4 };
                ((nib << 4) as i8 >> 4) as i32
            })
            .collect()
    }
}

fn scales_of(spec: QuantSpec, packed: &[u8], n: usize) -> Vec<f32> {
    packed[..4 * spec.blocks(n)]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn deq_f32(spec: QuantSpec, packed: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0u8; 4 * n];
    dequantize(spec, packed, n, DataType::F32, &mut out).unwrap();
    decode(DataType::F32, &out)
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

// ---------------------------------------------------------------- strategies

fn spec_strategy() -> impl Strategy<Value = QuantSpec> {
    (prop_oneof![Just(4u32), Just(8u32)], 1usize..=40).prop_map(|(bits, b)| {
        let block = if bits == 4 { 2 * b } else { b };
        QuantSpec::new(bits, block).unwrap()
    })
}

/// One element: ordinary, any magnitude (tiny to huge), subnormal, or a zero.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -1.0f32..1.0,
        3 => (-1.0f64..1.0, -150i32..=128).prop_map(|(m, e)| (m * 2f64.powi(e)) as f32),
        1 => any::<u32>().prop_map(|b| f32::from_bits(b & 0x807F_FFFF)),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
    ]
}

/// Values of a slice: elements times a common 2^e, so whole blocks can be tiny or huge.
fn values(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec(value(), len), -140i32..=100).prop_map(|(v, e)| {
        v.into_iter()
            .map(|x| {
                let y = (x as f64 * 2f64.powi(e)) as f32;
                if y.is_finite() {
                    y
                } else {
                    x
                }
            })
            .collect()
    })
}

fn dtype_strategy() -> impl Strategy<Value = DataType> {
    prop::sample::select(FLOATS.to_vec())
}

// ---------------------------------------------------------------- properties

proptest! {
    // 160 cases each keeps the debug run around a second; PROPTEST_CASES overrides.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(160),
        ..ProptestConfig::default()
    })]

    /// Quantize equals the literal reference; dequantize is within the documented bound;
    /// output conversion is RNE of the f32 value; codes never reach -2^(bits-1).
    #[test]
    fn round_trip_within_bound(spec in spec_strategy(), dt in dtype_strategy(),
                               out_dt in dtype_strategy(), v in values(0..300)) {
        let (x, packed) = quantized(spec, dt, &v);
        let n = x.len();

        let min_code = -(1 << (spec.bits - 1));
        prop_assert!(codes_of(spec, &packed, n).iter().all(|&q| q != min_code));
        if spec.bits == 4 && n % 2 == 1 {
            prop_assert_eq!(packed.last().unwrap() >> 4, 0, "padding nibble");
        }

        let xq = deq_f32(spec, &packed, n);
        let scales = scales_of(spec, &packed, n);
        for (b, blk) in x.chunks(spec.block).enumerate() {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bound = spec.step_bound(amax) as f64;
            for (i, &xi) in blk.iter().enumerate() {
                let got = xq[b * spec.block + i];
                if amax == 0.0 {
                    prop_assert_eq!(scales[b].to_bits(), 0);
                    prop_assert_eq!(got.to_bits(), 0, "zero block must give +0");
                } else {
                    let err = (xi as f64 - got as f64).abs();
                    prop_assert!(err <= bound,
                        "block {} elem {}: x {:e} x' {:e} err {:e} > bound {:e} (amax {:e})",
                        b, i, xi, got, err, bound, amax);
                }
            }
        }

        let mut out = vec![0u8; n * out_dt.size()];
        dequantize(spec, &packed, n, out_dt, &mut out).unwrap();
        prop_assert_eq!(out, narrow(out_dt, &xq));
    }

    /// A NaN or Inf poisons exactly its block: canonical NaN scale, codes 0, NaN outputs;
    /// other blocks are untouched.
    #[test]
    fn non_finite_poisons_exactly_its_block(spec in spec_strategy(), dt in dtype_strategy(),
                                           out_dt in dtype_strategy(), v in values(1..200),
                                           hits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3), 1..4)) {
        let mut v = v;
        for (at, kind) in &hits {
            let i = at.index(v.len());
            v[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][*kind as usize];
        }
        let (x, packed) = quantized(spec, dt, &v);
        let n = x.len();
        let scales = scales_of(spec, &packed, n);
        let codes = codes_of(spec, &packed, n);
        let mut out = vec![0u8; n * out_dt.size()];
        dequantize(spec, &packed, n, out_dt, &mut out).unwrap();
        let back = decode(out_dt, &out);
        for (b, blk) in x.chunks(spec.block).enumerate() {
            let poisoned = blk.iter().any(|v| !v.is_finite());
            prop_assert_eq!(scales[b].to_bits() == CANON, poisoned);
            for i in 0..blk.len() {
                let e = b * spec.block + i;
                prop_assert_eq!(back[e].is_nan(), poisoned);
                if poisoned {
                    prop_assert_eq!(codes[e], 0);
                }
            }
        }
        let canon_out = narrow(out_dt, &[f32::NAN]);
        for (e, c) in out.chunks(out_dt.size()).enumerate() {
            if back[e].is_nan() {
                prop_assert_eq!(c, &canon_out[..]);
            }
        }
    }

    /// The swizzled output is the naive concatenation (stage, local j, node b) of the
    /// packed slices of chunk (b, j) over each stage range; offsets name each run.
    #[test]
    fn swizzle_matches_naive(spec in spec_strategy(), dt in dtype_strategy(),
                             nodes in 1usize..4, devices in 1usize..4, stages in 1usize..5,
                             c in 0usize..40, seed in prop::collection::vec(value(), 1..8)) {
        let p = nodes * devices;
        let v: Vec<f32> = (0..p * c).map(|i| seed[i % seed.len()] * (1.0 + i as f32 / 7.0)).collect();
        let src = encode(dt, &v);
        let es = dt.size();
        let mut dst = vec![0xEEu8; swizzled_len(spec, c, nodes, devices, stages)];
        swizzled_quantize(spec, dt, &src, c, nodes, devices, stages, &mut dst).unwrap();
        let ranges = swizzle_ranges(c, stages);
        let mut naive = Vec::new();
        for (s, r) in ranges.iter().enumerate() {
            for j in 0..devices {
                let mut run = Vec::new();
                for b in 0..nodes {
                    let base = (b * devices + j) * c;
                    let chunk = &src[(base + r.start) * es..(base + r.end) * es];
                    let mut out = vec![0u8; spec.packed_len(r.len())];
                    quantize(spec, dt, chunk, &mut out).unwrap();
                    run.extend(out);
                }
                let off = swizzled_offset(spec, c, nodes, devices, stages, s, j);
                prop_assert_eq!(off.start, naive.len());
                prop_assert_eq!(&dst[off], &run[..]);
                naive.extend(run);
            }
        }
        prop_assert_eq!(dst, naive);
    }

    /// Fused dequant-reduce-quant == quantize(f32 sum of the dequantized inputs, in
    /// sender order), bitwise; also on arbitrary (corrupt) input bytes.
    #[test]
    fn fused_dequant_reduce_quant_is_bitwise(spec in spec_strategy(), k in 1usize..6,
                                            slices in 0usize..4, n in 0usize..120,
                                            vals in prop::collection::vec(value(), 1..64),
                                            raw in any::<bool>(), salt in any::<u64>()) {
        let one = spec.packed_len(n);
        let inputs: Vec<Vec<u8>> = (0..k).map(|s| {
            if raw {
                (0..slices * one).map(|i| (salt.wrapping_mul(i as u64 * 31 + s as u64 + 7) >> 29) as u8).collect()
            } else {
                (0..slices).flat_map(|i| {
                    let x: Vec<f32> = (0..n).map(|e| vals[(e + 3 * s + 5 * i) % vals.len()] * (s + 1) as f32).collect();
                    let mut out = vec![0u8; one];
                    quantize(spec, DataType::F32, &encode(DataType::F32, &x), &mut out).unwrap();
                    out
                }).collect()
            }
        }).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
        let mut dst = vec![0xEEu8; slices * one];
        dequant_reduce_quant(spec, &refs, n, slices, &mut dst).unwrap();
        for i in 0..slices {
            let mut acc = deq_f32(spec, &inputs[0][i * one..(i + 1) * one], n);
            for inp in &inputs[1..] {
                let d = deq_f32(spec, &inp[i * one..(i + 1) * one], n);
                acc.iter_mut().zip(d).for_each(|(a, b)| *a += b);
            }
            let mut want = vec![0u8; one];
            quantize(spec, DataType::F32, &encode(DataType::F32, &acc), &mut want).unwrap();
            prop_assert_eq!(&dst[i * one..(i + 1) * one], &want[..], "slice {}", i);
        }
    }

    /// dequant_reduce: Sum is the f32 sender-order sum narrowed once; Avg is exactly that
    /// sum divided once by the divisor; bf16/f16 outputs are the RNE of the f32 result.
    #[test]
    fn dequant_reduce_sum_and_exact_avg(spec in spec_strategy(), k in 1usize..6,
                                        dt in dtype_strategy(), d in 1usize..40,
                                        v in values(0..150), raw in any::<bool>(), salt in any::<u64>()) {
        let n = v.len();
        let one = spec.packed_len(n);
        let inputs: Vec<Vec<u8>> = (0..k).map(|s| {
            if raw {
                (0..one).map(|i| (salt.wrapping_mul(i as u64 * 131 + s as u64 + 1) >> 37) as u8).collect()
            } else {
                let x: Vec<f32> = v.iter().enumerate().map(|(e, x)| x * ((e + s) % 5) as f32).collect();
                let mut out = vec![0u8; one];
                quantize(spec, DataType::F32, &encode(DataType::F32, &x), &mut out).unwrap();
                out
            }
        }).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
        let mut acc = deq_f32(spec, &inputs[0], n);
        for inp in &inputs[1..] {
            acc.iter_mut().zip(deq_f32(spec, inp, n)).for_each(|(a, b)| *a += b);
        }
        let mut sum = vec![0u8; n * dt.size()];
        dequant_reduce(spec, &refs, n, ReduceOp::Sum, d, dt, &mut sum).unwrap();
        prop_assert_eq!(&sum, &narrow(dt, &acc));
        let mut avg = vec![0u8; n * dt.size()];
        dequant_reduce(spec, &refs, n, ReduceOp::Avg, d, dt, &mut avg).unwrap();
        let want: Vec<f32> = acc.iter().map(|a| a / d as f32).collect();
        prop_assert_eq!(&avg, &narrow(dt, &want));
    }
}

// ---------------------------------------------------------------- examples

#[test]
fn int4_nibble_order_by_hand() {
    // amax 7 -> scale 1, inv 1: codes are the values themselves.
    let spec = QuantSpec::new(4, 8).unwrap();
    let v = [1.0f32, -1.0, 7.0, -7.0, 0.0];
    let mut out = vec![0u8; spec.packed_len(5)];
    assert_eq!(out.len(), 4 + 3);
    quantize(spec, DataType::F32, &encode(DataType::F32, &v), &mut out).unwrap();
    assert_eq!(&out[..4], &1.0f32.to_le_bytes());
    // element 2i low nibble, 2i+1 high nibble, two's complement; odd n: last high nibble 0.
    assert_eq!(&out[4..], &[0xF1, 0x97, 0x00]);
    assert_eq!(deq_f32(spec, &out, 5), v);
}

#[test]
fn int8_layout_by_hand() {
    let spec = QuantSpec::new(8, 2).unwrap();
    let v = [127.0f32, -63.5, 0.0, 0.0, -2.0];
    let mut out = vec![0u8; spec.packed_len(5)];
    assert_eq!(out.len(), 3 * 4 + 5);
    quantize(spec, DataType::F32, &encode(DataType::F32, &v), &mut out).unwrap();
    assert_eq!(scales_of(spec, &out, 5), [1.0, 0.0, 2.0 / 127.0]);
    // -63.5 -> round half to even -> -64; -2 in a block of amax 2 -> -127.
    assert_eq!(&out[12..], &[127, (-64i8) as u8, 0, 0, (-127i8) as u8]);
}

#[test]
fn bf16_is_read_as_bf16() {
    // 0x3F80 is 1.0 in bf16 but 1.875 in f16.
    let spec = QuantSpec::new(8, 4).unwrap();
    let src: Vec<u8> = [0x3F80u16, 0xBF00]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let mut out = vec![0u8; spec.packed_len(2)];
    quantize(spec, DataType::BF16, &src, &mut out).unwrap();
    assert_eq!(scales_of(spec, &out, 2), [1.0 / 127.0]);
    assert_eq!(codes_of(spec, &out, 2), [127, -64]);
    let mut back = vec![0u8; 4];
    dequantize(spec, &out, 2, DataType::BF16, &mut back).unwrap();
    assert_eq!(decode(DataType::BF16, &back), [1.0, -0.50390625]);
}

#[test]
fn all_zero_blocks_are_exact_zeros() {
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 4).unwrap();
        for dt in FLOATS {
            let v = [0.0f32, -0.0, 0.0, -0.0, -0.0, 0.0];
            let mut out = vec![0xEEu8; spec.packed_len(6)];
            quantize(spec, dt, &encode(dt, &v), &mut out).unwrap();
            assert!(out.iter().all(|&b| b == 0), "{bits} {dt}: {out:?}");
            let mut back = vec![0xEEu8; 6 * dt.size()];
            dequantize(spec, &out, 6, dt, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0), "+0 expected");
        }
    }
}

#[test]
fn tiny_blocks_are_prescaled_not_lost() {
    // qmax/amax overflows f32 here; the 2^64 prescale keeps codes meaningful.
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 4).unwrap();
        let v = [1e-38f32, -5e-39, f32::from_bits(1), 0.0];
        let mut out = vec![0u8; spec.packed_len(4)];
        quantize(spec, DataType::F32, &encode(DataType::F32, &v), &mut out).unwrap();
        let qmax = spec.qmax();
        let codes = codes_of(spec, &out, 4);
        assert_eq!(codes[0], qmax);
        assert_eq!(codes[3], 0);
        let back = deq_f32(spec, &out, 4);
        let bound = spec.step_bound(1e-38) as f64;
        for (a, b) in v.iter().zip(&back) {
            assert!((*a as f64 - *b as f64).abs() <= bound, "{a:e} vs {b:e}");
        }
        // The smallest subnormal alone: scale rounds to 0, within the absolute term.
        let w = [f32::from_bits(1), 0.0];
        let mut o = vec![0u8; spec.packed_len(2)];
        quantize(spec, DataType::F32, &encode(DataType::F32, &w), &mut o).unwrap();
        let back = deq_f32(spec, &o, 2);
        assert!(((w[0] - back[0]).abs() as f64) <= spec.step_bound(w[0]) as f64);
    }
}

#[test]
fn flt_max_is_the_documented_exception() {
    let v = [f32::MAX, -1.0];
    let s8 = QuantSpec::new(8, 2).unwrap();
    let mut out = vec![0u8; s8.packed_len(2)];
    quantize(s8, DataType::F32, &encode(DataType::F32, &v), &mut out).unwrap();
    assert_eq!(deq_f32(s8, &out, 2)[0], f32::INFINITY);
    assert_eq!(s8.step_bound(f32::MAX), f32::INFINITY);
    let s4 = QuantSpec::new(4, 2).unwrap();
    let mut out = vec![0u8; s4.packed_len(2)];
    quantize(s4, DataType::F32, &encode(DataType::F32, &v), &mut out).unwrap();
    let back = deq_f32(s4, &out, 2);
    assert!(back[0].is_finite());
    assert!(((f32::MAX as f64) - back[0] as f64).abs() <= s4.step_bound(f32::MAX) as f64);
}

#[test]
fn step_bound_values() {
    let s = QuantSpec::new(8, 256).unwrap();
    assert_eq!(s.step_bound(0.0), 0.0);
    assert!(s.step_bound(f32::NAN).is_nan());
    assert!(s.step_bound(f32::INFINITY).is_nan());
    let b = s.step_bound(127.0) as f64;
    assert!(b >= 0.5 + 127.0 * 2f64.powi(-21) && b < 0.5 + 127.0 * 2f64.powi(-20));
}

#[test]
fn sizes() {
    let s = QuantSpec::new(4, 256).unwrap();
    assert_eq!(s.qmax(), 7);
    assert_eq!(s.blocks(0), 0);
    assert_eq!(s.blocks(257), 2);
    assert_eq!(s.packed_len(257), 8 + 129);
    let s = QuantSpec::new(8, 1).unwrap();
    assert_eq!(s.qmax(), 127);
    assert_eq!(s.packed_len(3), 12 + 3);
    assert_eq!(QuantSpec { bits: 8, block: 0 }.packed_len(10), 4 * 10 + 10);
    assert_eq!(swizzle_ranges(10, 3), vec![0..4, 4..7, 7..10]);
    assert_eq!(swizzle_ranges(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
    assert!(swizzle_ranges(5, 0).is_empty());
    let s = QuantSpec::new(8, 4).unwrap();
    // 2 nodes x 3 devices, c = 10 in 3 stages: slices of 4, 3, 3 elements.
    let (l4, l3) = (s.packed_len(4), s.packed_len(3));
    assert_eq!(swizzled_len(s, 10, 2, 3, 3), 6 * (l4 + 2 * l3));
    assert_eq!(
        swizzled_offset(s, 10, 2, 3, 3, 1, 2),
        6 * l4 + 4 * l3..6 * l4 + 6 * l3
    );
    let end = swizzled_len(s, 10, 2, 3, 3);
    assert_eq!(swizzled_offset(s, 10, 2, 3, 3, 3, 0), end..end);
    assert_eq!(swizzled_offset(s, 10, 2, 3, 3, 0, 3), end..end);
    assert_eq!(swizzled_len(s, 10, 0, 3, 3), 0);
}

#[test]
fn invalid_specs_rejected() {
    for (bits, block) in [
        (3, 8),
        (0, 8),
        (16, 8),
        (8, 0),
        (4, 0),
        (4, 7),
        (4, 1),
        (8, kernels::MAX_BLOCK + 1),
        (4, kernels::MAX_BLOCK + 2),
    ] {
        let r = QuantSpec::new(bits, block);
        assert!(is_invalid(r), "bits {bits} block {block} accepted");
        // A hand-built invalid spec is rejected by every kernel, never a silent no-op.
        let bad = QuantSpec { bits, block };
        let mut d = vec![0u8; 64];
        assert!(is_invalid(quantize(bad, DataType::F32, &[0; 16], &mut d)));
        assert!(is_invalid(dequantize(
            bad,
            &[0; 8],
            1,
            DataType::F32,
            &mut d[..4]
        )));
        assert!(is_invalid(swizzled_quantize(
            bad,
            DataType::F32,
            &[0; 16],
            4,
            1,
            1,
            1,
            &mut d
        )));
        assert!(is_invalid(dequant_reduce_quant(
            bad,
            &[&[0u8; 8][..]],
            1,
            1,
            &mut d[..8]
        )));
        assert!(is_invalid(dequant_reduce(
            bad,
            &[&[0u8; 8][..]],
            1,
            ReduceOp::Sum,
            1,
            DataType::F32,
            &mut d[..4]
        )));
    }
    for (bits, block) in [
        (4, 2),
        (8, 1),
        (8, kernels::MAX_BLOCK),
        (4, kernels::MAX_BLOCK),
    ] {
        assert!(QuantSpec::new(bits, block).is_ok());
    }
    let msg = QuantSpec::new(4, 7).unwrap_err().to_string();
    assert!(msg.contains("even") && msg.contains('7'), "{msg}");
}

#[test]
fn wrong_lengths_and_arguments_rejected() {
    let s = QuantSpec::new(8, 4).unwrap();
    let f = DataType::F32;
    let src = encode(f, &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let pl = s.packed_len(5);
    let mut p = vec![0u8; pl];
    // quantize
    assert!(is_invalid(quantize(s, f, &src, &mut vec![0u8; pl + 1])));
    assert!(is_invalid(quantize(s, f, &src, &mut vec![0u8; pl - 1])));
    assert!(is_invalid(quantize(s, f, &src[..19], &mut p)));
    assert!(is_invalid(quantize(s, DataType::I8, &src, &mut p)));
    assert!(is_invalid(quantize(s, DataType::I32, &src, &mut p)));
    let e = quantize(s, f, &src, &mut [0u8; 3]).unwrap_err().to_string();
    assert!(e.contains(&pl.to_string()) && e.contains('3'), "{e}");
    quantize(s, f, &src, &mut p).unwrap();
    // dequantize
    let mut o = vec![0u8; 20];
    assert!(is_invalid(dequantize(s, &p[1..], 5, f, &mut o)));
    assert!(is_invalid(dequantize(s, &p, 5, f, &mut o[1..])));
    assert!(is_invalid(dequantize(s, &p, 5, DataType::U8, &mut o[..5])));
    assert!(is_invalid(dequantize(s, &p, usize::MAX, f, &mut o)));
    // swizzle
    let mut d = vec![0u8; swizzled_len(s, 5, 1, 1, 2)];
    assert!(is_invalid(swizzled_quantize(
        s, f, &src, 5, 0, 1, 2, &mut d
    )));
    assert!(is_invalid(swizzled_quantize(
        s, f, &src, 5, 1, 0, 2, &mut d
    )));
    assert!(is_invalid(swizzled_quantize(
        s, f, &src, 5, 1, 1, 0, &mut d
    )));
    assert!(is_invalid(swizzled_quantize(
        s, f, &src, 4, 1, 1, 2, &mut d
    )));
    assert!(is_invalid(swizzled_quantize(
        s,
        f,
        &src,
        5,
        1,
        1,
        2,
        &mut d[1..]
    )));
    assert!(is_invalid(swizzled_quantize(
        s,
        DataType::U8,
        &src,
        5,
        1,
        1,
        2,
        &mut d
    )));
    assert!(is_invalid(swizzled_quantize(
        s,
        f,
        &src,
        usize::MAX,
        2,
        1,
        2,
        &mut d
    )));
    swizzled_quantize(s, f, &src, 5, 1, 1, 2, &mut d).unwrap();
    // fused
    let mut q = vec![0u8; 2 * pl];
    let two: Vec<u8> = [p.clone(), p.clone()].concat();
    assert!(is_invalid(dequant_reduce_quant(s, &[], 5, 2, &mut q)));
    assert!(is_invalid(dequant_reduce_quant(
        s,
        &[&two, &two[1..]],
        5,
        2,
        &mut q
    )));
    assert!(is_invalid(dequant_reduce_quant(
        s,
        &[&two],
        5,
        2,
        &mut q[1..]
    )));
    assert!(is_invalid(dequant_reduce_quant(s, &[&two], 5, 3, &mut q)));
    dequant_reduce_quant(s, &[&two, &two], 5, 2, &mut q).unwrap();
    // final
    assert!(is_invalid(dequant_reduce(
        s,
        &[],
        5,
        ReduceOp::Sum,
        1,
        f,
        &mut o
    )));
    assert!(is_invalid(dequant_reduce(
        s,
        &[&p, &p[1..]],
        5,
        ReduceOp::Sum,
        1,
        f,
        &mut o
    )));
    assert!(is_invalid(dequant_reduce(
        s,
        &[&p],
        5,
        ReduceOp::Sum,
        1,
        f,
        &mut o[1..]
    )));
    assert!(is_invalid(dequant_reduce(
        s,
        &[&p],
        5,
        ReduceOp::Avg,
        0,
        f,
        &mut o
    )));
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        assert!(is_invalid(dequant_reduce(s, &[&p], 5, op, 1, f, &mut o)));
    }
    assert!(is_invalid(dequant_reduce(
        s,
        &[&p],
        5,
        ReduceOp::Sum,
        1,
        DataType::I32,
        &mut o
    )));
    dequant_reduce(s, &[&p, &p], 5, ReduceOp::Avg, 2, f, &mut o).unwrap();
    assert_eq!(decode(f, &o), deq_f32(s, &p, 5));
}

#[test]
fn empty_inputs_are_no_ops() {
    for bits in [4, 8] {
        let s = QuantSpec::new(bits, 2).unwrap();
        for dt in FLOATS {
            quantize(s, dt, &[], &mut []).unwrap();
            dequantize(s, &[], 0, dt, &mut []).unwrap();
            swizzled_quantize(s, dt, &[], 0, 2, 3, 4, &mut []).unwrap();
            dequant_reduce(s, &[&[], &[]], 0, ReduceOp::Avg, 2, dt, &mut []).unwrap();
        }
        dequant_reduce_quant(s, &[&[], &[]], 0, 3, &mut []).unwrap();
        dequant_reduce_quant(s, &[&[]], 5, 0, &mut []).unwrap();
    }
}

#[test]
fn avg_times_world_equals_sum_on_exact_values() {
    // Values exactly representable through quantization: the average times the world
    // size is the sum (no devices-per-node factor anywhere).
    let s = QuantSpec::new(8, 4).unwrap();
    let k = 6;
    let x: Vec<f32> = vec![127.0, -64.0, 3.0, 0.0, 12.0, -127.0, 1.0, 2.0];
    let mut p = vec![0u8; s.packed_len(8)];
    quantize(s, DataType::F32, &encode(DataType::F32, &x), &mut p).unwrap();
    let refs: Vec<&[u8]> = (0..k).map(|_| &p[..]).collect();
    let (mut sum, mut avg) = (vec![0u8; 32], vec![0u8; 32]);
    dequant_reduce(s, &refs, 8, ReduceOp::Sum, k, DataType::F32, &mut sum).unwrap();
    dequant_reduce(s, &refs, 8, ReduceOp::Avg, k, DataType::F32, &mut avg).unwrap();
    let (sum, avg) = (decode(DataType::F32, &sum), decode(DataType::F32, &avg));
    let xq = deq_f32(s, &p, 8);
    for i in 0..8 {
        assert_eq!(sum[i], xq[i] * k as f32);
        assert_eq!(avg[i] * k as f32, sum[i]);
    }
}

#[test]
fn corrupt_codes_decode_as_twos_complement() {
    // -128 (int8) and nibble 0x8 (int4) are never produced but decode deterministically.
    let s8 = QuantSpec::new(8, 2).unwrap();
    let p = [&1.0f32.to_le_bytes()[..], &[0x80, 0x7F]].concat();
    assert_eq!(deq_f32(s8, &p, 2), [-128.0, 127.0]);
    let s4 = QuantSpec::new(4, 2).unwrap();
    let p = [&1.0f32.to_le_bytes()[..], &[0x78]].concat();
    assert_eq!(deq_f32(s4, &p, 2), [-8.0, 7.0]);
    // An Inf scale: q·Inf, with 0·Inf = NaN written canonical.
    let p = [&f32::INFINITY.to_le_bytes()[..], &[0x01]].concat();
    let back = deq_f32(s4, &p, 2);
    assert_eq!(back[0], f32::INFINITY);
    assert_eq!(back[1].to_bits(), CANON);
}
