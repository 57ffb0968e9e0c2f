//! Throughput of the CPU kernels (bytes read + written per second) beside `memcpy` of
//! the same bytes (half of them read, half written) in the same run: the host reduction
//! (`reduce_into`, `reduce_pair`, `finish_avg`) and the block-quantization kernels
//! (16 Mi elements, block 256, int4 and int8, f16/bf16/f32).
//!
//! `cargo bench --bench kernels -- --warm-up-time 1 --measurement-time 2`
//!
//! After criterion's own report it prints a markdown table (GB/s and % of the memcpy of
//! the same byte count) of the benchmarks this run measured: docs/kernels.md.

use criterion::{BatchSize, Bencher, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};
use std::cell::RefCell;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::SystemTime;
use strata::dtype::{finish_avg, reduce_into, reduce_pair};
use strata::kernels::{
    dequant_reduce, dequant_reduce_quant, dequantize, quantize, swizzled_len, swizzled_quantize,
    QuantSpec,
};
use strata::{DataType, ReduceOp};

/// Elements per buffer: 16 Mi (out of cache) unless `KERNELS_N` says otherwise (a small
/// `KERNELS_N`, e.g. 32768, measures the in-cache compute rate).
fn n() -> usize {
    std::env::var("KERNELS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20)
}
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

fn id(bits: u32, dt: Option<DataType>) -> String {
    match dt {
        Some(d) => format!("int{bits}/{d}"),
        None => format!("int{bits}"),
    }
}

/// One measured kernel: criterion group and id, bytes read + written per call.
struct Row {
    group: &'static str,
    id: String,
    bytes: usize,
}

thread_local! {
    static ROWS: RefCell<Vec<Row>> = const { RefCell::new(Vec::new()) };
}

fn memcpy_id(bytes: usize) -> String {
    format!("memcpy/{bytes}")
}

/// A benchmark group that measures each kernel's reference `memcpy` (of the same bytes
/// read + written) right before the kernel, once per distinct byte count.
struct Group<'a> {
    g: criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>,
    name: &'static str,
    copied: Vec<usize>,
}

impl<'a> Group<'a> {
    fn new(c: &'a mut Criterion, name: &'static str) -> Group<'a> {
        let mut g = c.benchmark_group(name);
        g.sample_size(10);
        Group {
            g,
            name,
            copied: Vec::new(),
        }
    }

    /// Benchmark `f`, which reads and writes `bytes` in all.
    fn bench(&mut self, id: String, bytes: usize, mut f: impl FnMut()) {
        self.bench_with(id, bytes, |b| b.iter(&mut f))
    }

    /// [`bench`](Self::bench) with criterion's `Bencher` (batched setup).
    fn bench_with(&mut self, id: String, bytes: usize, mut f: impl FnMut(&mut Bencher)) {
        self.g.throughput(Throughput::Bytes(bytes as u64));
        if !self.copied.contains(&bytes) {
            self.copied.push(bytes);
            let src = vec![1u8; bytes / 2];
            let mut dst = vec![0u8; bytes / 2];
            self.g
                .bench_function(BenchmarkId::from_parameter(memcpy_id(bytes)), |b| {
                    b.iter(|| dst.copy_from_slice(black_box(&src)))
                });
        }
        self.g
            .bench_function(BenchmarkId::from_parameter(&id), |b| f(b));
        ROWS.with(|r| {
            r.borrow_mut().push(Row {
                group: self.name,
                id,
                bytes,
            })
        });
    }
}

fn bench_reduce(c: &mut Criterion) {
    let n = n();
    let mut g = Group::new(c, "reduce");
    for dt in [DataType::F32, DataType::BF16, DataType::F16] {
        let a = input(dt, n, 1);
        let b = input(dt, n, 2);
        let mut acc = a.clone();
        let mut out = vec![0u8; a.len()];
        let bytes = 3 * a.len();
        g.bench(format!("reduce_into/sum/{dt}"), bytes, || {
            reduce_into(&mut acc, black_box(&b), dt, ReduceOp::Sum)
        });
        g.bench(format!("reduce_pair/sum/{dt}"), bytes, || {
            reduce_pair(&mut out, black_box(&a), black_box(&b), dt, ReduceOp::Sum)
        });
    }
    let a = input(DataType::F32, n, 1);
    let b = input(DataType::F32, n, 2);
    let mut acc = a.clone();
    g.bench("reduce_into/max/f32".into(), 3 * a.len(), || {
        reduce_into(&mut acc, black_box(&b), DataType::F32, ReduceOp::Max)
    });
    // finish_avg on a fresh copy each time (dividing in place again and again would
    // run into subnormals and zeros).
    for dt in [DataType::F32, DataType::BF16, DataType::F16] {
        let buf = input(dt, n, 3);
        let bytes = 2 * buf.len();
        g.bench_with(format!("finish_avg/{dt}"), bytes, |b| {
            b.iter_batched_ref(
                || buf.clone(),
                |x| finish_avg(x, dt, 3),
                BatchSize::PerIteration,
            )
        });
    }
}

fn bench_quant(c: &mut Criterion) {
    let n = n();
    let specs: Vec<QuantSpec> = BITS
        .iter()
        .map(|&b| QuantSpec::new(b, BLOCK).unwrap())
        .collect();

    let mut g = Group::new(c, "quantize");
    for dt in DTYPES {
        let src = input(dt, n, 1);
        for &q in &specs {
            let mut dst = vec![0u8; q.packed_len(n)];
            let bytes = src.len() + dst.len();
            g.bench(id(q.bits, Some(dt)), bytes, || {
                quantize(q, dt, black_box(&src), &mut dst).unwrap()
            });
        }
    }
    drop(g);

    let mut g = Group::new(c, "dequantize");
    for &q in &specs {
        let src = packed(q, n, 2);
        for dt in DTYPES {
            let mut dst = vec![0u8; n * dt.size()];
            let bytes = src.len() + dst.len();
            g.bench(id(q.bits, Some(dt)), bytes, || {
                dequantize(q, black_box(&src), n, dt, &mut dst).unwrap()
            });
        }
    }
    drop(g);

    // qgZ's first hop on nodes:4x8 with 2 pipeline stages.
    let (nodes, devices, stages) = (4, 8, 2);
    let chunk = n / (nodes * devices);
    let mut g = Group::new(c, "swizzled_quantize");
    for dt in DTYPES {
        let src = input(dt, n, 3);
        for &q in &specs {
            let mut dst = vec![0u8; swizzled_len(q, chunk, nodes, devices, stages)];
            let bytes = src.len() + dst.len();
            g.bench(id(q.bits, Some(dt)), bytes, || {
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
            });
        }
    }
    drop(g);

    // qgZ's middle hop: K = 8 senders, each `nodes` slices of n/nodes elements.
    let mut g = Group::new(c, "dequant_reduce_quant_k8");
    for &q in &specs {
        let m = n / nodes;
        let ins: Vec<Vec<u8>> = (0..K)
            .map(|s| {
                (0..nodes)
                    .flat_map(|i| packed(q, m, 10 + (s * nodes + i) as u64))
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
        let mut dst = vec![0u8; ins[0].len()];
        let bytes = K * ins[0].len() + dst.len();
        g.bench(id(q.bits, None), bytes, || {
            dequant_reduce_quant(q, black_box(&refs), m, nodes, &mut dst).unwrap()
        });
    }
    drop(g);

    // qgZ's last step: K = 8 packed slices of n elements into one output (avg).
    let mut g = Group::new(c, "dequant_reduce_k8");
    for &q in &specs {
        let ins: Vec<Vec<u8>> = (0..K).map(|s| packed(q, n, 100 + s as u64)).collect();
        let refs: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
        for dt in DTYPES {
            let mut dst = vec![0u8; n * dt.size()];
            let bytes = K * ins[0].len() + dst.len();
            g.bench(id(q.bits, Some(dt)), bytes, || {
                dequant_reduce(q, black_box(&refs), n, ReduceOp::Avg, 32, dt, &mut dst).unwrap()
            });
        }
    }
}

/// Criterion's output directory (as criterion finds it).
fn criterion_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return h.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    PathBuf::from(target).join("criterion")
}

/// Mean time (ns) of one benchmark measured by this run (None if not run now).
fn mean_ns(group: &str, id: &str, since: SystemTime) -> Option<f64> {
    let dir = criterion_dir()
        .join(group)
        .join(id.replace('/', "_"))
        .join("new");
    let f = dir.join("estimates.json");
    if std::fs::metadata(&f).ok()?.modified().ok()? < since {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).ok()?).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn main() {
    let since = SystemTime::now();
    let mut c = Criterion::default().configure_from_args();
    bench_reduce(&mut c);
    bench_quant(&mut c);
    c.final_summary();

    let rows = ROWS.with(|r| std::mem::take(&mut *r.borrow_mut()));
    let mut out = String::from(
        "| group | kernel | MiB moved | GB/s | memcpy GB/s | % of memcpy |\n|---|---|---|---|---|---|\n",
    );
    let mut any = false;
    for r in &rows {
        let (Some(k), Some(m)) = (
            mean_ns(r.group, &r.id, since),
            mean_ns(r.group, &memcpy_id(r.bytes), since),
        ) else {
            continue;
        };
        any = true;
        let gbs = |ns: f64| r.bytes as f64 / ns;
        out += &format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0}% |\n",
            r.group,
            r.id,
            r.bytes as f64 / (1 << 20) as f64,
            gbs(k),
            gbs(m),
            100.0 * m / k
        );
    }
    if any {
        println!("\n{out}");
    }
}
