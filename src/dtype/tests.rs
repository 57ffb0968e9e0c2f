use super::*;

/// The element-by-element definition (the implementation before vectorization):
/// `half`'s scalar conversions and comparisons, one element at a time.
fn scalar_reduce(acc: &mut [u8], src: &[u8], dt: DataType, op: ReduceOp) {
    fn one<T: bytemuck::Pod>(
        acc: &mut [u8],
        src: &[u8],
        op: ReduceOp,
        add: impl Fn(T, T) -> T,
        mul: impl Fn(T, T) -> T,
        lt: impl Fn(T, T) -> bool,
    ) {
        let s = std::mem::size_of::<T>();
        for (a, b) in acc.chunks_exact_mut(s).zip(src.chunks_exact(s)) {
            let (x, y): (T, T) = (
                bytemuck::pod_read_unaligned(a),
                bytemuck::pod_read_unaligned(b),
            );
            let r = match op {
                ReduceOp::Sum | ReduceOp::Avg => add(x, y),
                ReduceOp::Prod => mul(x, y),
                ReduceOp::Max => {
                    if lt(x, y) {
                        y
                    } else {
                        x
                    }
                }
                ReduceOp::Min => {
                    if lt(y, x) {
                        y
                    } else {
                        x
                    }
                }
            };
            a.copy_from_slice(bytemuck::bytes_of(&r));
        }
    }
    // Half floats compute in f32 and round once.
    macro_rules! half {
        ($t:ty) => {
            one::<$t>(
                acc,
                src,
                op,
                |a, b| <$t>::from_f32(a.to_f32() + b.to_f32()),
                |a, b| <$t>::from_f32(a.to_f32() * b.to_f32()),
                |a, b| a < b,
            )
        };
    }
    // Integers wrap.
    macro_rules! int {
        ($t:ty) => {
            one::<$t>(
                acc,
                src,
                op,
                <$t>::wrapping_add,
                <$t>::wrapping_mul,
                |a, b| a < b,
            )
        };
    }
    match dt {
        DataType::F32 => one::<f32>(acc, src, op, |a, b| a + b, |a, b| a * b, |a, b| a < b),
        DataType::F16 => half!(f16),
        DataType::BF16 => half!(bf16),
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        DataType::I64 => int!(i64),
        DataType::U64 => int!(u64),
        DataType::F64 => one::<f64>(acc, src, op, |a, b| a + b, |a, b| a * b, |a, b| a < b),
    }
}

/// The element-by-element `finish_avg` (through `get`/`set`; 64-bit integers by the
/// definition of rounding half away from zero, on i128).
fn scalar_avg(buf: &mut [u8], dt: DataType, n: usize) {
    if matches!(dt, DataType::I64 | DataType::U64) {
        for c in buf.chunks_exact_mut(8) {
            let v = u64::from_le_bytes(c.try_into().unwrap());
            let s = if dt == DataType::I64 {
                v as i64 as i128
            } else {
                v as i128
            };
            let (q, twice_r) = (s.div_euclid(n as i128), 2 * s.rem_euclid(n as i128));
            // floor, then up where the remainder is over half, or half and positive
            let up = twice_r > n as i128 || (twice_r == n as i128 && s >= 0);
            let r = q + i128::from(up);
            c.copy_from_slice(&(r as u64).to_le_bytes());
        }
        return;
    }
    for i in 0..buf.len() / dt.size() {
        let v = dt.get(buf, i) / n as f64;
        dt.set(buf, i, v);
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Every pair of the elements `sp` (little-endian bytes), appended to `a` and `b`.
fn every_pair<const N: usize>(sp: &[[u8; N]], a: &mut Vec<u8>, b: &mut Vec<u8>) {
    for p in sp {
        for q in sp {
            a.extend(p);
            b.extend(q);
        }
    }
}

/// Operand pairs as bytes: for 16-bit types every pattern against specials (zeros,
/// ones, infinities, quiet and signalling NaNs of both signs, extremes, subnormals)
/// and random patterns; for 8-bit types every pair; for 32-bit types specials
/// against random patterns with random exponents near the extremes.
fn operands(dt: DataType) -> (Vec<u8>, Vec<u8>) {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    match dt.size() {
        1 => {
            for x in 0..=255u8 {
                for y in 0..=255u8 {
                    a.push(x);
                    b.push(y);
                }
            }
        }
        2 => {
            let sp: [u16; 16] = [
                0, 0x8000, 0x3C00, 0x3F80, 0xBF80, 0x7C00, 0xFC00, 0x7F80, 0xFF80, 0x7E00, 0x7C01,
                0x7F81, 0xFFC1, 0x7BFF, 0x0001, 0x7F7F,
            ];
            // Every pattern in optimized builds; every 4th unoptimized (as `x`; all
            // specials still meet every `x` as `y`, in both orders).
            let step = if cfg!(miri) {
                97
            } else if cfg!(debug_assertions) {
                4
            } else {
                1
            };
            for x in (0..=u16::MAX).step_by(step) {
                for y in sp
                    .iter()
                    .copied()
                    .chain([xorshift(&mut s) as u16, (xorshift(&mut s) as u16) & 0x83FF])
                {
                    a.extend(x.to_le_bytes());
                    b.extend(y.to_le_bytes());
                    // and the other way round
                    a.extend(y.to_le_bytes());
                    b.extend(x.to_le_bytes());
                }
            }
        }
        8 => {
            // f64 specials (zeros, one, infinities, NaNs, extremes, subnormals) that
            // are also i64/u64 extremes and signs.
            let sp: [u64; 12] = [
                0,
                1 << 63,
                0x3FF0_0000_0000_0000,
                0x7FF0_0000_0000_0000,
                0xFFF0_0000_0000_0000,
                0x7FF8_0000_0000_0000,
                0x7FF0_0000_0000_0001,
                0xFFF8_0000_0000_1234,
                0x7FEF_FFFF_FFFF_FFFF,
                1,
                u64::MAX,
                0x7FFF_FFFF_FFFF_FFFF,
            ];
            let n = if cfg!(miri) { 50 } else { 20_000 };
            for _ in 0..n {
                let (x, y) = (xorshift(&mut s), xorshift(&mut s));
                for (p, q) in [
                    (x, y),
                    (x, sp[(y % 12) as usize]),
                    (sp[(x >> 8) as usize % 12], y),
                    // small integers (products and sums that do not wrap)
                    (x % 1000, (y % 2001).wrapping_sub(1000)),
                ] {
                    a.extend(p.to_le_bytes());
                    b.extend(q.to_le_bytes());
                }
            }
            every_pair(&sp.map(|x| x.to_le_bytes()), &mut a, &mut b);
        }
        _ => {
            let sp: [u32; 14] = [
                0,
                0x8000_0000,
                0x3F80_0000,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0x7F80_0001,
                0xFFC0_1234,
                0x7F7F_FFFF,
                0x0000_0001,
                0x8000_0001,
                0x7FFF_FFFF,
                0x8000_0000 | 0x7F7F_FFFF,
                0x0080_0000,
            ];
            let n = if cfg!(miri) { 50 } else { 20_000 };
            for _ in 0..n {
                let r = xorshift(&mut s);
                let x = r as u32;
                let y = (r >> 32) as u32;
                for (p, q) in [
                    (x, y),
                    (x, sp[(r % 14) as usize]),
                    (sp[(r >> 8) as usize % 14], y),
                ] {
                    a.extend(p.to_le_bytes());
                    b.extend(q.to_le_bytes());
                }
            }
            every_pair(&sp.map(|x| x.to_le_bytes()), &mut a, &mut b);
        }
    }
    (a, b)
}

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

#[test]
fn matches_scalar_reference() {
    for dt in DataType::ALL {
        let (a, b) = operands(dt);
        for op in OPS {
            let mut want = a.clone();
            scalar_reduce(&mut want, &b, dt, op);
            let mut got = a.clone();
            reduce_into(&mut got, &b, dt, op);
            let mut pair = vec![0u8; a.len()];
            reduce_pair(&mut pair, &a, &b, dt, op);
            // Sum/prod of two NaNs: Rust leaves open which operand's payload the
            // result carries (LLVM may commute the operation), so the reference with
            // the operands swapped is accepted there and only there.
            let mut swapped = b.clone();
            scalar_reduce(&mut swapped, &a, dt, op);
            let s = dt.size();
            for i in 0..a.len() / s {
                let r = i * s..(i + 1) * s;
                let both_nan = dt.get(&a, i).is_nan() && dt.get(&b, i).is_nan();
                let arith = matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Avg);
                for g in [&got[r.clone()], &pair[r.clone()]] {
                    assert!(
                        g == &want[r.clone()] || (both_nan && arith && g == &swapped[r.clone()]),
                        "{dt} {op}: {:02x?} op {:02x?} gave {g:02x?}, want {:02x?}",
                        &a[r.clone()],
                        &b[r.clone()],
                        &want[r.clone()]
                    );
                }
            }
        }
    }
}

#[test]
fn unaligned_and_tails() {
    // Offsets 0..3 into the buffers, every length up to a few chunks, tails included.
    let mut s = 7u64;
    let raw: Vec<u8> = (0..3 * CHUNK + 64)
        .map(|_| xorshift(&mut s) as u8)
        .collect();
    let raw2: Vec<u8> = (0..3 * CHUNK + 64)
        .map(|_| xorshift(&mut s) as u8)
        .collect();
    for dt in DataType::ALL {
        let es = dt.size();
        for off in 0..4 {
            for n in (0..(2 * CHUNK + 40) / es).step_by(if cfg!(miri) { 37 } else { 1 }) {
                let (a, b) = (&raw[off..off + n * es], &raw2[off + 1..off + 1 + n * es]);
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let mut want = a.to_vec();
                    scalar_reduce(&mut want, b, dt, op);
                    let mut buf = raw.clone();
                    reduce_into(&mut buf[off..off + n * es], b, dt, op);
                    assert_eq!(
                        &buf[off..off + n * es],
                        &want[..],
                        "{dt} {op} off {off} n {n}"
                    );
                    assert_eq!(buf[..off], raw[..off]);
                    assert_eq!(buf[off + n * es..], raw[off + n * es..]);
                    let mut out = vec![0xAAu8; n * es + 3];
                    reduce_pair(&mut out[3..], a, b, dt, op);
                    assert_eq!(&out[3..], &want[..]);
                    assert_eq!(out[..3], [0xAA; 3]);
                }
                let mut want = a.to_vec();
                scalar_avg(&mut want, dt, 3);
                let mut got = a.to_vec();
                finish_avg(&mut got, dt, 3);
                assert_eq!(got, want, "avg {dt} n {n}");
            }
        }
    }
}

#[test]
fn finish_avg_matches_scalar_reference() {
    for dt in DataType::ALL {
        let (a, _) = operands(dt);
        for n in [1, 3, 8, 4111, 1 << 20] {
            let mut want = a.clone();
            scalar_avg(&mut want, dt, n);
            let mut got = a.clone();
            finish_avg(&mut got, dt, n);
            let s = dt.size();
            for i in 0..a.len() / s {
                let r = i * s..(i + 1) * s;
                assert_eq!(
                    got[r.clone()],
                    want[r.clone()],
                    "{dt} / {n}: {:02x?}",
                    &a[r]
                );
            }
        }
    }
}

#[test]
fn halves_from_f64_round_once() {
    // bf16 0x0689 / 4111: the f64 quotient sits just above a bf16 halfway point that
    // dropping its low bits would miss.
    let v = bf16::from_bits(0x0689).to_f64() / 4111.0;
    let mut b = [0u8; 2];
    DataType::BF16.set(&mut b, 0, v);
    assert_eq!(u16::from_le_bytes(b), 0x0089);
    assert_eq!(f64_to_f32_odd(1.0), 1.0);
    assert_eq!(f64_to_f32_odd(f64::MAX), f32::MAX);
    assert!(f64_to_f32_odd(f64::NAN).is_nan());
    let x = 1.0 + 2f64.powi(-40);
    assert_eq!(f64_to_f32_odd(x).to_bits(), 1.0f32.to_bits() | 1);
}

#[test]
fn reduce_all_types() {
    for dt in DataType::ALL {
        let n = 2500;
        let mut a = vec![0u8; n * dt.size()];
        let mut b = vec![0u8; n * dt.size()];
        for i in 0..n {
            dt.set(&mut a, i, (i % 7) as f64);
            dt.set(&mut b, i, (i % 5) as f64);
        }
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
            let mut acc = a.clone();
            reduce_into(&mut acc, &b, dt, op);
            for i in 0..n {
                let want = op.apply((i % 7) as f64, (i % 5) as f64);
                assert_eq!(dt.get(&acc, i), want, "{dt} {op} at {i}");
            }
        }
    }
}

#[test]
fn avg_divides_once() {
    let dt = DataType::BF16;
    let mut a = vec![0u8; 4];
    dt.set(&mut a, 0, 9.0);
    dt.set(&mut a, 1, -3.0);
    finish_avg(&mut a, dt, 3);
    assert_eq!(dt.get(&a, 0), 3.0);
    assert_eq!(dt.get(&a, 1), -1.0);
}

#[test]
fn parse_names() {
    assert_eq!("bf16".parse::<DataType>().unwrap(), DataType::BF16);
    assert_eq!("f64".parse::<DataType>().unwrap(), DataType::F64);
    assert_eq!("int64".parse::<DataType>().unwrap(), DataType::I64);
    assert!("f8".parse::<DataType>().is_err());
    assert_eq!(DataType::from_raw(4).unwrap(), DataType::I64);
    assert_eq!(DataType::from_raw(9).unwrap(), DataType::BF16);
    assert!(DataType::from_raw(42).is_err());
    assert_eq!("avg".parse::<ReduceOp>().unwrap(), ReduceOp::Avg);
}
