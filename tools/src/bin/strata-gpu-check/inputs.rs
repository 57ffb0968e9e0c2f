//! Random inputs: values of every element type with specials, packed slices, specs.

use rand::Rng as _;
use rand_chacha::ChaCha8Rng;
use strata::kernels::{self as cpu, QuantSpec};
use strata::{DataType, Result};

/// n random values of `dtype` as little-endian bytes: runs of mixed profiles so that
/// blocks see ordinary data, zeros, tiny and subnormal magnitudes, ties, NaN and Inf.
pub(crate) fn values(rng: &mut ChaCha8Rng, n: usize, dtype: DataType, special: bool) -> Vec<u8> {
    let mut out = vec![0u8; n * dtype.size()];
    let mut i = 0;
    while i < n {
        let run = (1 + rng.random_range(0..3000u64) as usize).min(n - i);
        let profile = if special {
            rng.random_range(0..8u64)
        } else {
            rng.random_range(0..3u64)
        };
        let mag = 2f64.powi(rng.random_range(0..41u64) as i32 - 20);
        for e in i..i + run {
            let u = rng.random::<f64>() * 2.0 - 1.0;
            let v: f64 = match profile {
                0 | 1 => u * mag,
                2 => (rng.random_range(0..509u64) as f64 - 254.0) / 2.0, // halves: rounding ties
                3 => 0.0,
                4 => u * 2f64.powi(-70 - rng.random_range(0..60u64) as i32), // tiny, f32 subnormal
                5 => u * 1e-30,
                6 => match rng.random_range(0..200u64) {
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

/// One packed slice: the CPU quantization of random values, or raw random bytes (any
/// code, any scale bits: decoders take them as they come).
pub(crate) fn packed_input(
    rng: &mut ChaCha8Rng,
    spec: QuantSpec,
    n: usize,
    raw: bool,
) -> Result<Vec<u8>> {
    if raw {
        return Ok(rng.random_iter().take(spec.packed_len(n)).collect());
    }
    let src = values(rng, n, DataType::F32, true);
    let mut p = vec![0u8; spec.packed_len(n)];
    cpu::quantize(spec, DataType::F32, &src, &mut p)?;
    Ok(p)
}

pub(crate) fn spec(bits: u32, block: usize) -> QuantSpec {
    QuantSpec::new(bits, block).expect("valid spec")
}

/// The f32 values `host` (at least n) converted to `dt`, as bytes.
pub(crate) fn typed(host: &[u8], n: usize, dt: DataType) -> Vec<u8> {
    if dt == DataType::F32 {
        return host[..n * 4].to_vec();
    }
    let mut v = vec![0u8; n * dt.size()];
    for i in 0..n {
        dt.set(&mut v, i, DataType::F32.get(host, i));
    }
    v
}
