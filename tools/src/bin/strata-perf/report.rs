//! Reporting on rank 0: the header, the nccl-tests table (with the traffic, modeled and
//! quantization-error columns), the progress bar, the footer and the JSON records.

use crate::cli::{dedup, Cli};
use crate::model::{model_topology, Modeler};
use crate::rank::ErrStats;
use crate::sweep::{
    bus_factor, mem_traffic, quant_algo, quant_spec, reduces, strata_algos, Plan, Row, RowAlgo,
    RowName,
};
use crate::text::{fmt_time, out};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use strata::check::Kind;
use strata::traffic::{TrafficMatrix, TrafficReport};
use strata::transport::TransportKind;
use strata::{Algo, Buffer, Comm, Error, ReduceOp, Request, Result, Topology};

/// One JSON record (contract: field names).
#[derive(Debug, Serialize)]
struct Record {
    #[serde(flatten)]
    name: RowName,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    /// Wrong elements summed over ranks; null when unchecked (`-c 0`).
    wrong: Option<u64>,
    traffic: Option<TrafficReport>,
    traffic_source: Option<&'static str>,
    /// Tensors per coalesced call; null when not coalesced.
    coalesce: Option<usize>,
    /// Quantized algos (`qgz`, `qgz-1hop`, `qwz`): bits per code; null for exact algos.
    bits: Option<u32>,
    /// Quantized algos: elements per scale; null for exact algos.
    block: Option<usize>,
    /// Quantized algos, checked: the largest |result - exact f64 result| over all ranks'
    /// elements; null for exact algos and unchecked rows (a NaN result: null, and counted
    /// in `wrong`).
    max_err: Option<f64>,
    /// The root mean square of the same errors over all ranks' elements.
    rms_err: Option<f64>,
    /// The per-element bound the format promises for this call (docs/quantization.md,
    /// `strata::check::quant_bound`); `wrong` counts the elements beyond it.
    bound: Option<f64>,
    /// The bound of the call (us): with --model the modeled time (`model_time_us`),
    /// else the bytes this rank must read and write in memory at the bandwidth measured
    /// at start-up (`local`, `mpi`); null where there is none.
    bound_us: Option<f64>,
    /// `100 * bound_us / time_us` (the table's `%bound`).
    pct_bound: Option<f64>,
    /// With --model: the modeled time of one call on the model topology (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_time_us: Option<f64>,
    /// With --model: the modeled bus bandwidth (GB/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_busbw: Option<f64>,
    /// With --model: the lower bound of the modeled schedule (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    lower_bound_us: Option<f64>,
    /// `auto` rows beside other algorithms: the pick against the fastest measured
    /// (`crate::autocheck`).
    #[serde(skip_serializing_if = "Option::is_none")]
    auto_check: Option<crate::autocheck::Checked>,
}

/// One column of the table: (name, unit, width).
type Column = (&'static str, &'static str, usize);

/// The table's columns, (name, unit, width): `bound_us` / `%bound` after busbw, `model`
/// adds `model_us` / `model_busbw` after them (`--model`), `quant` the error columns
/// `max_err` / `rms_err` / `bound` after `#wrong` (a sweep with a quantized algo).
fn table_columns(model: bool, quant: bool) -> Vec<Column> {
    let mut c = vec![
        ("size", "(B)", 12),
        ("count", "(elements)", 12),
        ("type", "", 8),
        ("redop", "", 6),
        ("algo", "", 8),
        ("time", "(us)", 7),
        ("algbw", "(GB/s)", 6),
        ("busbw", "(GB/s)", 6),
        ("bound_us", "(us)", 8),
        ("%bound", "", 6),
    ];
    if model {
        c.extend([("model_us", "(us)", 9), ("model_busbw", "(GB/s)", 11)]);
    }
    c.push(("#wrong", "", 6));
    if quant {
        c.extend([("max_err", "", 9), ("rms_err", "", 9), ("bound", "", 9)]);
    }
    c.extend([
        ("intra_pkg", "(B)", 10),
        ("intra_node", "(B)", 10),
        ("inter_node", "(B)", 10),
        ("node_egress", "(B)", 11),
    ]);
    c
}

/// The two header lines of [`table_columns`].
fn header_lines(cols: &[Column]) -> [String; 2] {
    let line = |f: fn(&Column) -> &'static str| {
        cols.iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("#{:>w$}", f(c), w = c.2 - 1)
                } else {
                    format!("{:>w$}", f(c), w = c.2)
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    [line(|c| c.0), line(|c| c.1)]
}

/// One data line: `cells` right-aligned to [`table_columns`]' widths.
fn table_line(cols: &[Column], cells: &[String]) -> String {
    cols.iter()
        .zip(cells)
        .map(|(c, v)| format!("{v:>w$}", w = c.2))
        .collect::<Vec<_>>()
        .join("  ")
}

/// An error figure: 3 significant digits, C's `%.2e` (`1.95e-02`); "0" for exactly 0.
fn fmt_err(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { "0".into() } else { x.to_string() };
    }
    let s = format!("{x:.2e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

pub(crate) struct Reporter<'a> {
    plan: &'a Plan,
    comm0: Comm,
    transport: TransportKind,
    topo: Arc<Topology>,
    p: usize,
    records: Vec<Record>,
    pub(crate) pb: Option<ProgressBar>,
    next: usize,
    total_wrong: u64,
    busbw_sum: f64,
    last_kind: Option<Kind>,
    multi_op: bool,
    /// The sweep has a quantized algo: the table has the error columns.
    quant: bool,
    /// (op, algo) pairs whose fallback to ring was already noted.
    noted: Vec<(Kind, RowAlgo)>,
    /// Opened (created) before the sweep so a bad path fails at once, written at the end.
    json: Option<(PathBuf, std::fs::File)>,
    /// `--model`: every row is also modeled on this topology.
    modeler: Option<Modeler>,
    /// Memory bandwidth per rank (bytes read + written per second), measured at
    /// start-up: the bound column without `--model`.
    membw: Option<f64>,
}

/// The header line of the quantized formats: per quantized algo of the sweep its bits and
/// block, and what the error columns are; a note when --bits / --block have no algo to
/// apply to.
fn quant_header(cli: &Cli, algos: &[Algo]) -> Option<String> {
    let specs: Vec<String> = algos
        .iter()
        .filter_map(|&a| match quant_spec(cli, a) {
            Some(Ok(q)) => Some(format!("{a} int{}/{}", q.bits, q.block)),
            _ => None,
        })
        .collect();
    if !specs.is_empty() {
        Some(format!(
            "#  quant     : {} (bits/block); max_err, rms_err: largest and RMS |result - exact f64 result| over all ranks' elements; bound: the format's per-element bound; #wrong: elements beyond it",
            specs.join(", ")
        ))
    } else if cli.bits.is_some() || cli.block.is_some() {
        Some("#  quant     : --bits / --block ignored: no quantized algo (qgz, qgz-1hop, qwz) in the sweep".into())
    } else {
        None
    }
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(
        cli: &Cli,
        plan: &'a Plan,
        comm0: Comm,
        algos: &[RowAlgo],
        membw: Option<f64>,
    ) -> Result<Reporter<'a>> {
        let (all, algos) = (algos, &strata_algos(algos)[..]);
        let json = match &cli.json {
            Some(path) => {
                let f = std::fs::File::create(path)
                    .map_err(|e| Error::System(format!("cannot create {}: {e}", path.display())))?;
                Some((path.clone(), f))
            }
            None => None,
        };
        let topo = comm0.topology().clone();
        let p = comm0.size();
        let transport = comm0.transport_kind();
        let modeler = match &cli.model {
            Some(spec) => Some(Modeler::new(
                cli,
                model_topology(spec, p)?,
                comm0.config().ho_ring_chunks,
                algos,
            )),
            None => None,
        };
        // A bar only where someone watches: stdout and stderr (where it is drawn) both a
        // terminal (not `| tee`, where it would mix with tee's copy of the lines).
        let tty = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let pb = (tty && !cli.quiet && plan.rows.len() > 4).then(|| {
            let pb = ProgressBar::with_draw_target(
                Some(plan.rows.len() as u64),
                ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {wide_msg}",
            ) {
                pb.set_style(style);
            }
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        let r = Reporter {
            plan,
            comm0,
            transport,
            topo,
            p,
            records: Vec::new(),
            pb,
            next: 0,
            total_wrong: 0,
            busbw_sum: 0.0,
            last_kind: None,
            multi_op: dedup(&cli.op).len() > 1,
            quant: algos.iter().any(|&a| quant_algo(a).is_some()),
            noted: Vec::new(),
            json,
            modeler,
            membw,
        };
        r.header(cli, all);
        r.progress_msg();
        Ok(r)
    }

    fn print(&self, line: &str) {
        match &self.pb {
            Some(pb) => pb.suspend(|| out(line)),
            None => out(line),
        }
    }

    fn traffic_source(&self) -> &'static str {
        if self.transport.traffic_measured() {
            "measured"
        } else {
            "nominal"
        }
    }

    fn header(&self, cli: &Cli, all: &[RowAlgo]) {
        let algos = &strata_algos(all)[..];
        let list = |v: Vec<&str>| v.join(",");
        let ops = list(dedup(&cli.op).iter().map(|k| k.name()).collect());
        let redops = if dedup(&cli.op).iter().any(|&k| reduces(k)) {
            list(dedup(&cli.redop).iter().map(|o| o.name()).collect())
        } else {
            "none".to_string()
        };
        let step = if cli.stepfactor > 1 {
            format!("{}(factor)", cli.stepfactor)
        } else {
            format!("{}(bytes)", cli.stepbytes)
        };
        let how = if self.transport.traffic_measured() {
            "measured: every transfer the transport made, bytes per call"
        } else {
            "nominal: the sends strata issued, bytes per call"
        };
        let lines = [
            format!(
                "# strata-perf {} (nccl-tests style)",
                env!("CARGO_PKG_VERSION")
            ),
            format!("#  transport : {}", self.transport.name()),
            format!("#  topology  : {}", self.topo.summary()),
            format!("#  ranks     : {}", self.p),
            format!("#  op        : {ops}"),
            format!(
                "#  algo      : {}",
                list(all.iter().map(|a| a.name()).collect())
            ),
            format!(
                "#  dtype     : {}",
                list(dedup(&cli.datatype).iter().map(|d| d.name()).collect())
            ),
            format!("#  redop     : {redops}"),
            format!(
                "#  minBytes {} maxBytes {} step: {step}",
                cli.minbytes, cli.maxbytes
            ),
            format!("#  iters     : {}", self.plan.iters),
            format!("#  warmup    : {}", self.plan.warmup),
            format!("#  check     : {}", u8::from(self.plan.check)),
            format!(
                "#  coalesce  : {}",
                self.plan
                    .coalesce
                    .map(|k| format!("{k} tensors per call (uneven counts)"))
                    .unwrap_or_else(|| "off".into())
            ),
            format!("#  timeout   : {:?}", self.comm0.timeout()),
            format!("#  traffic   : {how}"),
            match (&self.modeler, self.membw) {
                (Some(_), _) => "#  bound     : the modeled time (model_us); %bound = 100 * bound_us / time".into(),
                (None, Some(bw)) => format!(
                    "#  bound     : memory {:.2} GB/s per rank (read+written, every rank copying at once); bound_us = bytes this rank reads and writes / that; %bound = 100 * bound_us / time",
                    bw / 1e9
                ),
                (None, None) => "#  bound     : none on this transport (add --model SPEC for the modeled time)".into(),
            },
        ];
        let model = self.modeler.as_ref().map(|m| {
            format!(
                "#  model     : {} (strata::sim dry run of each row: latency + bytes/bandwidth per link class, shared NICs){}",
                m.topo.summary(),
                if self.quant { "; quantized algos are not modeled: -" } else { "" }
            )
        });
        for l in lines
            .into_iter()
            .chain(model)
            .chain(quant_header(cli, algos))
        {
            self.print(&l);
        }
    }

    fn progress_msg(&self) {
        if let (Some(pb), Some(row)) = (&self.pb, self.plan.rows.get(self.next)) {
            pb.set_message(format!(
                "{} {} {} {} B",
                row.kind.name(),
                row.algo,
                row.dtype,
                row.bytes
            ));
        }
    }

    /// The algorithm the selector runs for `row` (the flat request of a coalesced call),
    /// and the selector's reason.
    fn chosen(&self, row: &Row) -> (RowAlgo, String) {
        let Some(algo) = row.algo.strata() else {
            return (RowAlgo::Mpi, "the MPI library's own collective".into());
        };
        let z = Buffer::zeroed(0);
        let op = row
            .kind
            .op(z.clone(), z, row.count, row.redop.unwrap_or(ReduceOp::Sum));
        let mut req = Request::new(op, row.dtype).with_algo(algo);
        if let Some(q) = row.quant {
            req = req.with_quant(q);
        }
        let c = self.comm0.choose(&req);
        (RowAlgo::Strata(c.algo), c.reason.to_string())
    }

    /// Rank 0's view of row `i`: the max time, the summed wrong counts and the combined
    /// error statistics over ranks, and the whole loop's traffic.
    pub(crate) fn row(
        &mut self,
        i: usize,
        time_us: f64,
        wrong: u64,
        err: Option<ErrStats>,
        traffic: Option<TrafficMatrix>,
    ) {
        let row = &self.plan.rows[i];
        let cols = table_columns(self.modeler.is_some(), self.quant);
        if self.last_kind != Some(row.kind) {
            self.last_kind = Some(row.kind);
            self.print("#");
            if self.multi_op {
                self.print(&format!("# {}", row.kind.name()));
            }
            for h in header_lines(&cols) {
                self.print(&h);
            }
        }
        let (used, why) = self.chosen(row);
        if row.quant.is_some() && used != row.algo && !self.noted.contains(&(row.kind, row.algo)) {
            self.noted.push((row.kind, row.algo));
            self.print(&format!(
                "# note: {} runs {} here ({why}): its rows below measure {}",
                row.algo, used, used
            ));
        }
        let algbw = if time_us > 0.0 {
            row.bytes as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        let busbw = algbw * bus_factor(row.kind, self.p);
        let report = traffic.map(|m| m.report(&self.topo).per_call(self.plan.iters as u64));
        let t = |f: fn(&TrafficReport) -> u64| {
            report
                .as_ref()
                .map(|r| f(r).to_string())
                .unwrap_or_else(|| "-".into())
        };
        let modeled = match self.modeler.as_ref().map(|m| m.model(row)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                self.print(&format!("# model of this row failed: {e}"));
                None
            }
            None => None,
        };
        let bound_us = match (&self.modeler, self.membw) {
            (Some(_), _) => modeled.as_ref().map(|m| m.time_us),
            (None, Some(bw)) if bw > 0.0 => {
                Some(mem_traffic(row.kind, row.bytes as f64, self.p) / bw * 1e6)
            }
            (None, _) => None,
        };
        let pct_bound = bound_us
            .filter(|_| time_us > 0.0)
            .map(|b| 100.0 * b / time_us);
        let mut cells = vec![
            row.bytes.to_string(),
            row.count.to_string(),
            row.dtype.name().to_string(),
            row.redop_name().to_string(),
            row.algo.name().to_string(),
            fmt_time(time_us).trim().to_string(),
            format!("{algbw:.2}"),
            format!("{busbw:.2}"),
            bound_us.map_or("-".into(), |b| fmt_time(b).trim().to_string()),
            pct_bound.map_or("-".into(), |x| format!("{x:.1}")),
        ];
        if self.modeler.is_some() {
            match &modeled {
                Some(m) => cells.extend([
                    fmt_time(m.time_us).trim().to_string(),
                    format!("{:.2}", m.busbw),
                ]),
                None => cells.extend(["-".to_string(), "-".to_string()]),
            }
        }
        cells.push(if self.plan.check {
            wrong.to_string()
        } else {
            "N/A".into()
        });
        if self.quant {
            match (&err, row.quant.is_some()) {
                (Some(e), _) => cells.extend([fmt_err(e.max), fmt_err(e.rms()), fmt_err(e.bound)]),
                // A quantized row, unchecked.
                (None, true) => cells.extend(["N/A", "N/A", "N/A"].map(String::from)),
                // An exact algo: checked to a few ulps above, no error figures.
                (None, false) => cells.extend(["-", "-", "-"].map(String::from)),
            }
        }
        cells.extend([
            t(|r| r.intra_package),
            t(|r| r.intra_node),
            t(|r| r.inter_node),
            t(|r| r.max_node_egress),
        ]);
        let line = table_line(&cols, &cells);
        if let (Some(m), Some(md)) = (self.modeler.as_mut(), &modeled) {
            m.note(i, row, md);
        }
        self.print(&line);
        self.total_wrong += wrong;
        self.busbw_sum += busbw;
        self.records.push(Record {
            name: RowName::new(row, used.name(), self.p, &self.topo, self.transport.name()),
            time_us,
            algbw,
            busbw,
            bound_us,
            pct_bound,
            wrong: self.plan.check.then_some(wrong),
            traffic: report,
            traffic_source: report.map(|_| self.traffic_source()),
            coalesce: self.plan.coalesce,
            bits: row.quant.map(|q| q.bits),
            block: row.quant.map(|q| q.block),
            max_err: err.map(|e| e.max),
            rms_err: err.map(|e| e.rms()),
            bound: err.map(|e| e.bound),
            model_time_us: modeled.as_ref().map(|m| m.time_us),
            model_busbw: modeled.as_ref().map(|m| m.busbw),
            lower_bound_us: modeled.as_ref().map(|m| m.lower_bound_us),
            auto_check: None,
        });
        self.next = i + 1;
        if let Some(pb) = &self.pb {
            pb.inc(1);
        }
        self.progress_msg();
    }

    /// Footer lines and the JSON file; the number of wrong elements over the sweep.
    pub(crate) fn finish(mut self) -> Result<u64> {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
        let n = self.records.len().max(1);
        out(&format!(
            "# Out of bounds values : {} {}",
            self.total_wrong,
            if self.total_wrong == 0 {
                "OK"
            } else {
                "FAILED"
            }
        ));
        out(&format!(
            "# Avg bus bandwidth    : {:.4}",
            self.busbw_sum / n as f64
        ));
        let timed: Vec<crate::autocheck::Timed> = self
            .records
            .iter()
            .map(|r| crate::autocheck::Timed {
                op: r.name.op,
                dtype: r.name.dtype,
                redop: r.name.redop,
                size: r.name.size,
                coalesce: r.coalesce,
                algo: r.name.algo,
                algo_used: r.name.algo_used,
                time_us: r.time_us,
            })
            .collect();
        let checks = crate::autocheck::check(&timed);
        for l in crate::autocheck::lines(&timed, &checks) {
            out(&l);
        }
        drop(timed);
        for c in checks {
            let row = c.auto_row;
            self.records[row].auto_check = Some(c);
        }
        out("#");
        if let Some((path, mut f)) = self.json {
            let text = serde_json::to_string_pretty(&self.records)
                .map_err(|e| Error::Internal(format!("json: {e}")))?;
            f.write_all((text + "\n").as_bytes())
                .and_then(|_| f.flush())
                .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
        }
        if let Some(m) = &self.modeler {
            m.finish(&self.plan.rows)?;
        }
        Ok(self.total_wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_figures_format_like_c() {
        assert_eq!(fmt_err(0.0), "0");
        assert_eq!(fmt_err(0.0195), "1.95e-02");
        assert_eq!(fmt_err(14.5), "1.45e+01");
        assert_eq!(fmt_err(f64::INFINITY), "inf");
        let cols = table_columns(false, true);
        let [h1, h2] = header_lines(&cols);
        assert_eq!(h1.len(), h2.len());
        let cells: Vec<String> = cols.iter().map(|_| "x".to_string()).collect();
        assert_eq!(table_line(&cols, &cells).len(), h1.len());
    }
}
