//! Throughput of the CPU reference quantization kernels (bytes read + written per
//! second), 16 Mi elements, block 256, int4 and int8, f16/bf16/f32.
//!
//! `cargo bench --bench kernels -- --warm-up-time 1 --measurement-time 2`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};
use std::hint::black_box;
use strata::kernels::{
    dequant_reduce, dequant_reduce_quant, dequantize, quantize, swizzled_len, swizzled_quantize,
    QuantSpec,
};
use strata::{DataType, ReduceOp};

const N: usize = 16 << 20;
const BLOCK: usize = 256;
const K: usize = 8;
const DTYPES: [DataType; 3] = [DataType::F16, DataType::BF16, DataType::F32];
const BITS: [u32; 2] = [4, 8];

/// `n` pseudo-random values in [-1, 1) as `dtype` bytes.
fn input(dtype: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        match dtype {
            DataType::F16 => out.extend(f16::from_f32(v).to_le_bytes()),
            DataType::BF16 => out.extend(bf16::from_f32(v).to_le_bytes()),
            _ => out.extend(v.to_le_bytes()),
        }
    }
    out
}

fn packed(spec: QuantSpec, n: usize, seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; spec.packed_len(n)];
    quantize(spec, DataType::F32, &input(DataType::F32, n, seed), &mut p).unwrap();
    p
}

fn id(bits: u32, dt: Option<DataType>) -> BenchmarkId {
    match dt {
        Some(d) => BenchmarkId::from_parameter(format!("int{bits}/{d}")),
        None => BenchmarkId::from_parameter(format!("int{bits}")),
    }
}

fn bench(c: &mut Criterion) {
    let specs: Vec<QuantSpec> = BITS
        .iter()
        .map(|&b| QuantSpec::new(b, BLOCK).unwrap())
        .collect();

    let mut g = c.benchmark_group("quantize");
    g.sample_size(10);
    for dt in DTYPES {
        let src = input(dt, N, 1);
        for &q in &specs {
            let mut dst = vec![0u8; q.packed_len(N)];
            g.throughput(Throughput::Bytes((src.len() + dst.len()) as u64));
            g.bench_function(id(q.bits, Some(dt)), |b| {
                b.iter(|| quantize(q, dt, black_box(&src), &mut dst).unwrap())
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("dequantize");
    g.sample_size(10);
    for &q in &specs {
        let src = packed(q, N, 2);
        for dt in DTYPES {
            let mut dst = vec![0u8; N * dt.size()];
            g.throughput(Throughput::Bytes((src.len() + dst.len()) as u64));
            g.bench_function(id(q.bits, Some(dt)), |b| {
                b.iter(|| dequantize(q, black_box(&src), N, dt, &mut dst).unwrap())
            });
        }
    }
    g.finish();

    // qgZ's first hop on nodes:4x8 with 2 pipeline stages.
    let (nodes, devices, stages) = (4, 8, 2);
    let chunk = N / (nodes * devices);
    let mut g = c.benchmark_group("swizzled_quantize");
    g.sample_size(10);
    for dt in DTYPES {
        let src = input(dt, N, 3);
        for &q in &specs {
            let mut dst = vec![0u8; swizzled_len(q, chunk, nodes, devices, stages)];
            g.throughput(Throughput::Bytes((src.len() + dst.len()) as u64));
            g.bench_function(id(q.bits, Some(dt)), |b| {
                b.iter(|| {
                    swizzled_quantize(
                        q,
                        dt,
                        black_box(&src),
                        chunk,
                        nodes,
                        devices,
                        stages,
                        &mut dst,
                    )
                    .unwrap()
                })
            });
        }
    }
    g.finish();

    // qgZ's middle hop: K = 8 senders, each `nodes` slices of N/nodes elements.
    let mut g = c.benchmark_group("dequant_reduce_quant_k8");
    g.sample_size(10);
    for &q in &specs {
        let m = N / nodes;
        let ins: Vec<Vec<u8>> = (0..K)
            .map(|s| {
                (0..nodes)
                    .flat_map(|i| packed(q, m, 10 + (s * nodes + i) as u64))
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
        let mut dst = vec![0u8; ins[0].len()];
        g.throughput(Throughput::Bytes((K * ins[0].len() + dst.len()) as u64));
        g.bench_function(id(q.bits, None), |b| {
            b.iter(|| dequant_reduce_quant(q, black_box(&refs), m, nodes, &mut dst).unwrap())
        });
    }
    g.finish();

    // qgZ's last step: K = 8 packed slices of N elements into one output (avg).
    let mut g = c.benchmark_group("dequant_reduce_k8");
    g.sample_size(10);
    for &q in &specs {
        let ins: Vec<Vec<u8>> = (0..K).map(|s| packed(q, N, 100 + s as u64)).collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
        for dt in DTYPES {
            let mut dst = vec![0u8; N * dt.size()];
            g.throughput(Throughput::Bytes((K * ins[0].len() + dst.len()) as u64));
            g.bench_function(id(q.bits, Some(dt)), |b| {
                b.iter(|| {
                    dequant_reduce(q, black_box(&refs), N, ReduceOp::Avg, 32, dt, &mut dst).unwrap()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
