//! The sweep: the rows (op, algo, dtype, redop, size) a command line asks for, with
//! nccl-tests' counts, sizes and bus-bandwidth factors, and the quantized algos' formats.

pub(crate) use crate::cli::RowAlgo;
use crate::cli::{dedup, raw_sizes, Cli};
use serde::Serialize;
use std::collections::HashSet;
use strata::check::Kind;
use strata::kernels::QuantSpec;
use strata::{Algo, DataType, Error, ReduceOp, Result, Topology};

/// The strata algorithms of a sweep (the MPI baseline left out).
pub(crate) fn strata_algos(algos: &[RowAlgo]) -> Vec<Algo> {
    algos.iter().filter_map(|a| a.strata()).collect()
}

/// One row of the sweep.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) kind: Kind,
    pub(crate) algo: RowAlgo,
    pub(crate) dtype: DataType,
    /// None for ops without a reduction.
    pub(crate) redop: Option<ReduceOp>,
    /// NCCL's per-call count (total over tensors when coalesced).
    pub(crate) count: usize,
    /// The `size` column: bytes of the larger buffer.
    pub(crate) bytes: u64,
    /// Per-tensor counts of a coalesced call.
    pub(crate) counts: Option<Vec<usize>>,
    /// Seed of the checked call's inputs.
    pub(crate) seed: u64,
    /// Wire format of a quantized algo's row (`qgz`, `qgz-1hop`, `qwz`); None when exact.
    pub(crate) quant: Option<QuantSpec>,
}

impl Row {
    pub(crate) fn redop_name(&self) -> &'static str {
        self.redop.map(|o| o.name()).unwrap_or("none")
    }
}

#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) rows: Vec<Row>,
    pub(crate) iters: usize,
    pub(crate) warmup: usize,
    /// Times each row is timed, the rows in turn (`--rounds`); the median is reported.
    pub(crate) rounds: usize,
    /// Each timed call waited before the next (`-z 1`).
    pub(crate) blocking: bool,
    pub(crate) check: bool,
    pub(crate) coalesce: Option<usize>,
}

pub(crate) fn reduces(k: Kind) -> bool {
    matches!(k, Kind::ReduceScatter | Kind::AllReduce)
}

/// Elements per buffer "unit": p for ops whose larger buffer holds p counts.
fn spread(k: Kind, p: usize) -> usize {
    match k {
        Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => p,
        Kind::AllReduce | Kind::Broadcast { .. } => 1,
    }
}

/// Bytes one rank must read and write in memory for one call of `k` whose full
/// (gathered / unreduced) buffer is `m` bytes, `p` ranks: the numerator of the `bound_us`
/// column (docs/perf.md, "The bound column").
pub(crate) fn mem_traffic(k: Kind, m: f64, p: usize) -> f64 {
    let p = p.max(1) as f64;
    match k {
        // Out of place: read the whole output's worth once, write it once.
        Kind::AllGather | Kind::AllToAll | Kind::Broadcast { .. } => 2.0 * m,
        // Read every rank's contribution to its chunk (p * m/p), write the chunk (m/p).
        Kind::ReduceScatter => m * (p + 1.0) / p,
        // Reduce-scatter, then all-gather the reduced chunks: m(p+1)/p + 2m(p-1)/p.
        Kind::AllReduce => m * (3.0 * p - 1.0) / p,
    }
}

pub(crate) fn bus_factor(k: Kind, p: usize) -> f64 {
    let p = p as f64;
    match k {
        Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (p - 1.0) / p,
        Kind::AllReduce => 2.0 * (p - 1.0) / p,
        Kind::Broadcast { .. } => 1.0,
    }
}

/// Split `count` into `k` uneven parts: weights 1, 2, .., k scaled down, the remainder
/// to the last part.
fn split_counts(count: usize, k: usize) -> Vec<usize> {
    let w = (k as u128) * (k as u128 + 1) / 2;
    let mut v: Vec<usize> = (1..k)
        .map(|i| ((count as u128) * (i as u128) / w) as usize)
        .collect();
    let used: usize = v.iter().sum();
    v.push(count - used);
    v
}

/// The op a quantized (lossy) algorithm implements and its default (bits, block); None
/// for the exact algorithms.
pub(crate) fn quant_algo(a: Algo) -> Option<(Kind, (u32, usize))> {
    match a {
        Algo::Qgz | Algo::Qgz1 => Some((Kind::ReduceScatter, strata::algo::qgz::DEFAULT_QGZ)),
        Algo::Qwz => Some((Kind::AllGather, strata::algo::qwz::DEFAULT_QWZ)),
        _ => None,
    }
}

/// The wire format of `a`'s rows: `--bits` / `--block` over the algo's defaults; None
/// for an exact algo.
pub(crate) fn quant_spec(cli: &Cli, a: Algo) -> Option<Result<QuantSpec>> {
    quant_algo(a).map(|(_, (bits, block))| {
        QuantSpec::new(cli.bits.unwrap_or(bits), cli.block.unwrap_or(block))
    })
}

pub(crate) fn build_plan(cli: &Cli, algos: &[RowAlgo], p: usize) -> Result<Plan> {
    let sizes = raw_sizes(cli.minbytes, cli.maxbytes, cli.stepfactor, cli.stepbytes)
        .map_err(Error::InvalidArgument)?;
    let coalesce = cli.coalesce.map(|k| k as usize);
    let mut rows = Vec::new();
    for kind in dedup(&cli.op) {
        for &algo in algos {
            let quant = match algo {
                RowAlgo::Strata(a) => quant_spec(cli, a).transpose()?,
                RowAlgo::Mpi => None,
            };
            for dtype in dedup(&cli.datatype) {
                let redops: Vec<Option<ReduceOp>> = if reduces(kind) {
                    dedup(&cli.redop).into_iter().map(Some).collect()
                } else {
                    vec![None]
                };
                for redop in redops {
                    let mut seen = HashSet::new();
                    for &size in &sizes {
                        let unit = (dtype.size() * spread(kind, p)) as u64;
                        let count = (size / unit).max(1);
                        if !seen.insert(count) {
                            continue;
                        }
                        let bytes = count.checked_mul(unit).ok_or_else(|| {
                            Error::InvalidArgument(format!("size {size} overflows"))
                        })?;
                        let count = usize::try_from(count).map_err(|_| {
                            Error::InvalidArgument(format!("size {size} is too large"))
                        })?;
                        rows.push(Row {
                            kind,
                            algo,
                            dtype,
                            redop,
                            count,
                            bytes,
                            counts: coalesce.map(|k| split_counts(count, k)),
                            seed: rows.len() as u64 + 1,
                            quant,
                        });
                    }
                }
            }
        }
    }
    Ok(Plan {
        rows,
        iters: cli.iters as usize,
        warmup: cli.warmup_iters as usize,
        rounds: cli.rounds as usize,
        blocking: cli.blocking == 1,
        check: cli.check == 1,
        coalesce,
    })
}

/// The median of a row's round times (`--rounds`; the mean of the middle two for an
/// even count).
pub(crate) fn median(times: &[f64]) -> f64 {
    let mut t = times.to_vec();
    t.sort_by(f64::total_cmp);
    match t.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => t[n / 2],
        n => (t[n / 2 - 1] + t[n / 2]) / 2.0,
    }
}

/// The fields that name a row, first in every JSON record, of a run (`crate::report`'s) and of
/// a dry run (`crate::model`'s): one list of names for both (contract: field names).
#[derive(Debug, Serialize)]
pub(crate) struct RowName {
    pub(crate) op: &'static str,
    pub(crate) algo: &'static str,
    /// The algorithm that actually ran (`auto` resolved; `hier` may fall back to `ring`).
    pub(crate) algo_used: &'static str,
    pub(crate) dtype: &'static str,
    pub(crate) redop: &'static str,
    pub(crate) size: u64,
    pub(crate) count: usize,
    pub(crate) ranks: usize,
    pub(crate) topology: String,
    pub(crate) transport: &'static str,
}

impl RowName {
    /// `row`, run as the algorithm named `used`, on `ranks` ranks of `topo` over
    /// `transport`.
    pub(crate) fn new(
        row: &Row,
        used: &'static str,
        ranks: usize,
        topo: &Topology,
        transport: &'static str,
    ) -> RowName {
        RowName {
            op: row.kind.name(),
            algo: row.algo.name(),
            algo_used: used,
            dtype: row.dtype.name(),
            redop: row.redop_name(),
            size: row.bytes,
            count: row.count,
            ranks,
            topology: topo.name.clone(),
            transport,
        }
    }
}
