//! Modeling: `--model` (every row also replayed on a model topology), `--dry-run` (the
//! modeled columns only, no transport), `--trace` and `--plot`.

use crate::cli::{dedup, Cli};
use crate::sweep::{build_plan, bus_factor, reduces, Row, RowAlgo, RowName};
use crate::text::{fmt_time, out};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;
use strata::check::Kind;
use strata::sim;
use strata::traffic::TrafficReport;
use strata::{Algo, CommConfig, DataType, Error, ReduceOp, Result, Topology};

/// One row as modeled on the model topology.
#[derive(Debug, Clone)]
pub(crate) struct Modeled {
    /// The algorithm the schedule came from (`auto` resolved, fallbacks applied).
    pub(crate) used: Algo,
    pub(crate) time_us: f64,
    pub(crate) algbw: f64,
    pub(crate) busbw: f64,
    pub(crate) lower_bound_us: f64,
    bandwidth_bound_us: f64,
    pub(crate) traffic: TrafficReport,
}

/// One line of the plot / one trace: (op, algo).
type Series = (Kind, Algo);

/// The modeled topology and what the trace and plot collect over the sweep.
pub(crate) struct Modeler {
    pub(crate) topo: Topology,
    chunks: Option<usize>,
    trace: Option<PathBuf>,
    plot: Option<PathBuf>,
    /// Traces and plots cover the rows of the first dtype and redop.
    dtype: Option<DataType>,
    redop: Option<ReduceOp>,
    /// Per (op, algo): (row index, size) of the largest row, and the plot's points.
    largest: Vec<(Series, usize, u64)>,
    points: Vec<(Series, Vec<(f64, f64)>)>,
    several: bool,
    multi_op: bool,
}

impl Modeler {
    pub(crate) fn new(cli: &Cli, topo: Topology, chunks: Option<usize>, algos: &[Algo]) -> Modeler {
        let ops = dedup(&cli.op);
        Modeler {
            topo,
            chunks,
            trace: cli.trace.clone(),
            plot: cli.plot.clone(),
            dtype: cli.datatype.first().copied(),
            redop: cli.redop.first().copied(),
            largest: Vec::new(),
            points: Vec::new(),
            several: ops.len() * algos.len() > 1,
            multi_op: ops.len() > 1,
        }
    }

    pub(crate) fn modelable(k: Kind) -> bool {
        matches!(k, Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce)
    }

    /// Dry run and replay of `row` (None for ops and quantized algos the simulator does
    /// not model).
    pub(crate) fn model(&self, row: &Row) -> Result<Option<Modeled>> {
        let Some(algo) = row.algo.strata() else {
            return Ok(None); // the MPI baseline: not strata's schedule
        };
        if !Self::modelable(row.kind) || row.quant.is_some() {
            return Ok(None);
        }
        let p = self.topo.world_size();
        let (sched, r) = sim::model(&sim::Call {
            chunks: self.chunks,
            ..sim::Call::new(&self.topo, row.kind, algo, row.count, row.dtype)
        })?;
        let algbw = if r.makespan_us > 0.0 {
            row.bytes as f64 / (r.makespan_us * 1e3)
        } else {
            0.0
        };
        Ok(Some(Modeled {
            used: sched.algo.unwrap_or(algo),
            time_us: r.makespan_us,
            algbw,
            busbw: algbw * bus_factor(row.kind, p),
            lower_bound_us: r.lower_bound_us,
            bandwidth_bound_us: r.bandwidth_bound_us,
            traffic: sched.traffic(&self.topo),
        }))
    }

    /// Remember row `i` for the trace and the plot.
    pub(crate) fn note(&mut self, i: usize, row: &Row, m: &Modeled) {
        if Some(row.dtype) != self.dtype || (row.redop.is_some() && row.redop != self.redop) {
            return;
        }
        let Some(algo) = row.algo.strata() else {
            return;
        };
        let key = (row.kind, algo);
        match self.largest.iter_mut().find(|e| e.0 == key) {
            Some(e) if e.2 < row.bytes => (e.1, e.2) = (i, row.bytes),
            Some(_) => {}
            None => self.largest.push((key, i, row.bytes)),
        }
        if m.time_us > 0.0 {
            match self.points.iter_mut().find(|e| e.0 == key) {
                Some(e) => e.1.push((row.bytes as f64, m.time_us)),
                None => self.points.push((key, vec![(row.bytes as f64, m.time_us)])),
            }
        }
    }

    /// Write the traces and the plot.
    pub(crate) fn finish(&self, rows: &[Row]) -> Result<()> {
        if let Some(path) = &self.trace {
            for &((kind, algo), i, _) in &self.largest {
                let row = &rows[i];
                let (sched, r) = sim::model(&sim::Call {
                    chunks: self.chunks,
                    ..sim::Call::new(&self.topo, kind, algo, row.count, row.dtype)
                })?;
                let path = if self.several {
                    tagged(path, &format!("{}-{}", kind.name(), algo.name()))
                } else {
                    path.clone()
                };
                sim::trace::save_trace(&path, &sched, &r, &self.topo)?;
                out(&format!(
                    "# trace     : {} ({} {}, {} B, {} transfers)",
                    path.display(),
                    kind.name(),
                    algo.name(),
                    row.bytes,
                    sched.len()
                ));
            }
        }
        if let Some(path) = &self.plot {
            let series: Vec<sim::plot::Series> = self
                .points
                .iter()
                .map(|((kind, algo), pts)| sim::plot::Series {
                    name: if self.multi_op {
                        format!("{} {}", kind.name(), algo.name())
                    } else {
                        algo.name().to_string()
                    },
                    points: pts.clone(),
                })
                .collect();
            let title = format!(
                "modeled time, {} ({} ranks), {}",
                self.topo.name,
                self.topo.world_size(),
                self.dtype.map(|d| d.name()).unwrap_or("")
            );
            let svg = sim::plot::svg(
                &title,
                "message size (bytes, nccl-tests size)",
                "modeled time",
                &series,
            );
            std::fs::write(path, svg)
                .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
            out(&format!("# plot      : {}", path.display()));
        }
        Ok(())
    }
}

/// `path` with `-<tag>` inserted before its extension.
fn tagged(path: &std::path::Path, tag: &str) -> PathBuf {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    let name = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{tag}.{ext}"),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(name)
}

/// The model topology of `--model SPEC` for a run of `p` ranks.
pub(crate) fn model_topology(spec: &str, p: usize) -> Result<Topology> {
    let t = Topology::parse(spec)?;
    if t.world_size() != p {
        return Err(Error::InvalidUsage(format!(
            "--model {spec} describes {} ranks but the run has {p}",
            t.world_size()
        )));
    }
    Ok(t)
}

/// One JSON record of a dry run (contract: field names shared with
/// `report::Record`).
#[derive(Debug, Serialize)]
struct DryRecord {
    #[serde(flatten)]
    name: RowName,
    model_time_us: f64,
    model_algbw: f64,
    model_busbw: f64,
    lower_bound_us: f64,
    bandwidth_bound_us: f64,
    traffic: TrafficReport,
    traffic_source: &'static str,
    chunks: Option<usize>,
    coalesce: Option<usize>,
}

fn dry_columns() -> [String; 2] {
    let h1 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7}  {:>7}  {:>10}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}",
        "size", "count", "type", "redop", "algo", "used", "model_us", "algbw", "busbw", "lower_bnd", "ratio", "intra_pkg", "intra_node", "inter_node", "node_egress"
    );
    let h2 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7}  {:>7}  {:>10}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "", "(B)", "(B)", "(B)", "(B)"
    );
    [h1, h2]
}

/// `--dry-run`: model every row (in parallel over the machine's cores), print the
/// modeled columns, write JSON, traces and plot. No transport, no data.
pub(crate) fn run_dry(cli: &Cli, config: &CommConfig, algos: &[Algo]) -> Result<u64> {
    let started = Instant::now();
    let spec = cli
        .model
        .as_deref()
        .or(cli.topology.as_deref())
        .ok_or_else(|| Error::InvalidUsage("--dry-run needs --model or --topology".into()))?;
    let topo = Topology::parse(spec)?;
    let p = topo.world_size();
    if let (Some(_), Some(t)) = (&cli.model, &cli.topology) {
        let run = Topology::parse(t)?;
        if run.world_size() != p {
            return Err(Error::InvalidUsage(format!(
                "--topology {t} has {} ranks but --model {spec} has {p}",
                run.world_size()
            )));
        }
    }
    if let Some(n) = cli.ranks {
        if n as usize != p {
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the modeled topology {spec} has {p} ranks"
            )));
        }
    }
    let rows: Vec<RowAlgo> = algos.iter().map(|&a| RowAlgo::Strata(a)).collect();
    let plan = build_plan(cli, &rows, p)?;
    let mut json = match &cli.json {
        Some(path) => Some((
            path.clone(),
            std::fs::File::create(path)
                .map_err(|e| Error::System(format!("cannot create {}: {e}", path.display())))?,
        )),
        None => None,
    };
    let mut modeler = Modeler::new(cli, topo.clone(), config.ho_ring_chunks, algos);
    let list = |v: Vec<&str>| v.join(",");
    let ops = dedup(&cli.op);
    let redops = if ops.iter().any(|&k| reduces(k)) {
        list(dedup(&cli.redop).iter().map(|o| o.name()).collect())
    } else {
        "none".to_string()
    };
    for l in [
        format!("# strata-perf {} (nccl-tests style), dry run", env!("CARGO_PKG_VERSION")),
        "#  transport : none (dry run: schedules built and replayed, no data moved)".to_string(),
        format!("#  topology  : {} (modeled)", topo.summary()),
        format!("#  ranks     : {p}"),
        format!("#  op        : {}", list(ops.iter().map(|k| k.name()).collect())),
        format!("#  algo      : {}", list(algos.iter().map(|a| a.name()).collect())),
        format!(
            "#  dtype     : {}",
            list(dedup(&cli.datatype).iter().map(|d| d.name()).collect())
        ),
        format!("#  redop     : {redops}"),
        format!(
            "#  minBytes {} maxBytes {} step: {}",
            cli.minbytes,
            cli.maxbytes,
            if cli.stepfactor > 1 {
                format!("{}(factor)", cli.stepfactor)
            } else {
                format!("{}(bytes)", cli.stepbytes)
            }
        ),
        format!(
            "#  chunks    : {}",
            config
                .ho_ring_chunks
                .map(|c| c.to_string())
                .unwrap_or_else(|| "default (by size)".into())
        ),
        "#  model     : per link class latency + bytes/bandwidth, shared NICs, classes busy at once (strata::sim)".to_string(),
        "#  lower_bnd : busiest resource's wire time + one latency, or longest stream of steps; ratio = model_us / lower_bnd".to_string(),
        "#  traffic   : modeled: bytes of the schedule per call".to_string(),
    ] {
        out(&l);
    }
    // Model the rows on every core; each worker holds one schedule at a time.
    let rows = &plan.rows;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Option<Modeled>>>>> =
        Mutex::new((0..rows.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, rows.len().max(1));
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= rows.len() {
                    break;
                }
                let m = modeler.model(&rows[i]);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(m);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut records = Vec::new();
    let mut last_kind = None;
    let mut busbw_sum = 0.0;
    for (i, (row, m)) in rows.iter().zip(results).enumerate() {
        let m = match m {
            Some(Ok(Some(m))) => m,
            Some(Ok(None)) => {
                return Err(Error::InvalidArgument(format!(
                    "--dry-run models all-gather, reduce-scatter and all-reduce, not {}",
                    row.kind.name()
                )))
            }
            Some(Err(e)) => return Err(e),
            None => return Err(Error::Internal(format!("row {i} was not modeled"))),
        };
        if last_kind != Some(row.kind) {
            last_kind = Some(row.kind);
            out("#");
            if ops.len() > 1 {
                out(&format!("# {}", row.kind.name()));
            }
            for h in dry_columns() {
                out(&h);
            }
        }
        let ratio = if m.lower_bound_us > 0.0 {
            m.time_us / m.lower_bound_us
        } else {
            1.0
        };
        out(&format!(
            "{:>12}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7.2}  {:>7.2}  {:>10}  {:>6.3}  {:>12}  {:>12}  {:>12}  {:>12}",
            row.bytes,
            row.count,
            row.dtype.name(),
            row.redop_name(),
            row.algo.name(),
            m.used.name(),
            fmt_time(m.time_us).trim(),
            m.algbw,
            m.busbw,
            fmt_time(m.lower_bound_us).trim(),
            ratio,
            m.traffic.intra_package,
            m.traffic.intra_node,
            m.traffic.inter_node,
            m.traffic.max_node_egress,
        ));
        busbw_sum += m.busbw;
        modeler.note(i, row, &m);
        records.push(DryRecord {
            name: RowName::new(row, m.used.name(), p, &topo, "none"),
            model_time_us: m.time_us,
            model_algbw: m.algbw,
            model_busbw: m.busbw,
            lower_bound_us: m.lower_bound_us,
            bandwidth_bound_us: m.bandwidth_bound_us,
            traffic: m.traffic,
            traffic_source: "modeled",
            chunks: config.ho_ring_chunks,
            coalesce: plan.coalesce,
        });
    }
    out(&format!(
        "# Avg modeled bus bandwidth : {:.4}",
        busbw_sum / records.len().max(1) as f64
    ));
    out(&format!(
        "# Modeled {} rows in {:.2} s ({workers} threads)",
        records.len(),
        started.elapsed().as_secs_f64()
    ));
    out("#");
    if let Some((path, f)) = json.as_mut() {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| Error::Internal(format!("json: {e}")))?;
        f.write_all((text + "\n").as_bytes())
            .and_then(|_| f.flush())
            .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
    }
    modeler.finish(rows)?;
    Ok(0)
}
