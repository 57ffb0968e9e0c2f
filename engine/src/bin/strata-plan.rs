//! `strata-plan`: rank every sharding strategy for a model on a cluster (AMSP §V-B's
//! planner over the engine's configuration space; see `strata_engine::planner`).

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use strata_engine::planner::{self, memory::gib, KernelRates, ModelShape, Overhead, PlanRequest};

/// One report line to stdout; a closed stdout (`strata-plan ... | head`) ends the tool
/// quietly with status 0, as a Unix filter ends on SIGPIPE, not with `println!`'s panic.
fn line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|_| o.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
    }
}

macro_rules! outln {
    ($($t:tt)*) => {
        line(format_args!($($t)*))
    };
}

/// Rank the sharding strategies (ZeRO-1/2/3, MiCS, ZeRO++, PaRO, Frontier, AMSP's
/// search space) for a model on a cluster by predicted communication time per step,
/// with memory per rank and feasibility.
///
/// Example:
///   strata-plan --model llama-7b --cluster dgx-a100:128 --gpu-mem 80G --seq 4096 \
///     --micro-batch 1 --global-batch-tokens 4194304
#[derive(Parser, Debug)]
#[command(name = "strata-plan", version, verbatim_doc_comment)]
struct Args {
    /// Model preset: llama-7b, llama-13b, llama-30b, llama-65b, gpt-neox-20b, bert-base,
    /// bert-large; or `custom` (default when shape flags are given without --model)
    #[arg(long)]
    model: Option<String>,
    /// Cluster: a strata topology SPEC (dgx-a100:N, dgx-h100:N, p4d:N, p5:N, p3dn:N,
    /// frontier:N, nodes:NxR, nodes:NxPxD, or a topology JSON file), or amsp-a800:N
    /// (AMSP's testbed: 8 A800 per node on NVLink, 4 HDR NICs per node)
    #[arg(long)]
    cluster: String,
    /// Planner model: `strata` (the engine's whole space, collective times from
    /// strata's simulator) or `amsp` (AMSP's own model: its search space, cost
    /// equations T_p/T_g/T_os with NCCL ring effective bandwidth, recomputation per
    /// model, one configuration from 8 GPUs to the cluster; reproduces its Table IV)
    #[arg(long, default_value = "strata")]
    mode: String,
    /// --mode amsp: the smallest scale, in GPUs, at which the one configuration must run
    /// (AMSP §VI-A4: 8); scales double from there to the cluster
    #[arg(long, default_value = "8", value_parser = count)]
    amsp_from_gpus: usize,
    /// Memory per GPU the model does not see, added to every candidate on top of the
    /// overhead (same units as --gpu-mem; e.g. a measured activation excess)
    #[arg(long, default_value = "0", value_parser = strata::units::parse_size_or_zero)]
    extra_memory: u64,
    /// Memory per GPU: bytes, optionally with K, M, G, T (powers of 1024, with or
    /// without i/B): 80G, 80GiB, 1.5T
    #[arg(long, default_value = "80G", value_parser = strata::units::parse_size)]
    gpu_mem: u64,
    /// Framework overhead per GPU: `model` (CUDA context, NCCL buffers, allocator
    /// fragmentation, each modeled; the default) or `off` (the model's tensors only)
    #[arg(long, default_value = "model")]
    overhead: String,
    /// A flat reserve per GPU in place of the modeled overhead (same units as
    /// --gpu-mem; 0 = none, like --overhead off)
    #[arg(long, value_parser = strata::units::parse_size_or_zero, conflicts_with = "overhead")]
    reserve: Option<u64>,
    /// Sequence length (tokens; K/M suffixes are powers of 1024: 4K = 4096)
    #[arg(long, default_value = "4096", value_parser = count)]
    seq: usize,
    /// Sequences per micro-batch per GPU
    #[arg(long, default_value_t = 1)]
    micro_batch: usize,
    /// Tokens per optimizer step over the cluster (sets the accumulation steps):
    /// 4194304 or 4M (K/M/G/T are powers of 1024: 4M = 4,194,304, AMSP's 4 M batch)
    #[arg(long, default_value = "4M", value_parser = strata::units::parse_size)]
    global_batch_tokens: u64,
    /// Working precision of parameters, gradients and activations: bf16 or f32
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Activation recomputation: auto (only where needed to fit), on, off
    #[arg(long, default_value = "auto")]
    recompute: String,
    /// Count attention activations without FlashAttention (the as²b terms)
    #[arg(long)]
    no_flash_attention: bool,
    /// Layers (custom shape, or override the preset's)
    #[arg(long)]
    layers: Option<usize>,
    /// Hidden size
    #[arg(long)]
    hidden: Option<usize>,
    /// Attention heads
    #[arg(long)]
    heads: Option<usize>,
    /// MLP width (default for a custom shape: 4 x hidden)
    #[arg(long)]
    ffn: Option<usize>,
    /// Vocabulary size (default for a custom shape: 32000)
    #[arg(long)]
    vocab: Option<usize>,
    /// Custom shape with a gated (SwiGLU) MLP
    #[arg(long)]
    gated: bool,
    /// Rows to print (all with --top 0)
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Also write {"request": ..., "candidates": [...]} as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
    /// The quantization kernels' measured rates (JSON: strata_engine::planner::KernelRates,
    /// GB/s from strata-gpu-check on the cluster's GPU) for qwZ/qgZ candidates; default:
    /// an H200's; `none` counts no kernel time
    #[arg(long, value_name = "FILE")]
    kernel_rates: Option<String>,
}

/// A positive count with an optional K/M/G/T suffix (strata's one size parser).
fn count(s: &str) -> Result<usize, String> {
    let v = strata::units::parse_size(s)?;
    usize::try_from(v).map_err(|_| format!("'{s}' is too large"))
}

/// The message without the engine's category prefix (`strategy: `).
fn msg(e: strata_engine::Error) -> String {
    match e {
        strata_engine::Error::Config(m) => m,
        e => e.to_string(),
    }
}

fn model_of(a: &Args) -> Result<ModelShape, String> {
    let shape_flags = a.layers.is_some()
        || a.hidden.is_some()
        || a.heads.is_some()
        || a.ffn.is_some()
        || a.vocab.is_some();
    let name = match (&a.model, shape_flags) {
        (Some(n), _) => n.trim().to_ascii_lowercase(),
        (None, true) => "custom".into(),
        (None, false) => {
            return Err(format!(
                "give --model ({}) or a custom shape with --layers, --hidden, --heads",
                planner::MODEL_PRESETS.join(", ")
            ))
        }
    };
    let mut m = if name == "custom" {
        let (Some(l), Some(h), Some(n)) = (a.layers, a.hidden, a.heads) else {
            return Err(
                "a custom shape needs --layers, --hidden and --heads (optional: --ffn, default 4 x hidden; --vocab, default 32000; --gated)"
                    .into(),
            );
        };
        ModelShape::custom(
            l,
            h,
            n,
            a.ffn.unwrap_or(0),
            a.vocab.unwrap_or(32000),
            a.gated,
        )
        .map_err(msg)?
    } else {
        let mut m = ModelShape::preset(&name).map_err(msg)?;
        if shape_flags {
            m.name = format!("{}*", m.name);
        }
        m
    };
    if let Some(v) = a.layers {
        m.layers = v;
    }
    if let Some(v) = a.hidden {
        m.hidden = v;
    }
    if let Some(v) = a.heads {
        m.heads = v;
    }
    if let Some(v) = a.ffn {
        m.ffn = v;
    }
    if let Some(v) = a.vocab {
        m.vocab = v;
    }
    m.validate().map_err(msg)?;
    Ok(m)
}

fn request(a: &Args) -> Result<PlanRequest, String> {
    let model = model_of(a)?;
    let cluster = match planner::amsp::parse_cluster(&a.cluster) {
        Some(t) => t.map_err(|e| format!("--cluster: {}", msg(e)))?,
        None => strata::Topology::parse(&a.cluster).map_err(|e| format!("--cluster: {e}"))?,
    };
    let mut r = PlanRequest::new(model, cluster);
    r.gpu_mem = a.gpu_mem;
    r.overhead = match (a.reserve, a.overhead.trim().to_ascii_lowercase().as_str()) {
        (Some(0), _) => Overhead::Off,
        (Some(v), _) => Overhead::Reserve(v),
        (None, "model" | "on") => Overhead::Modeled,
        (None, "off" | "none") => Overhead::Off,
        (None, v) => return Err(format!("--overhead {v}: model or off")),
    };
    r.seq = a.seq;
    r.micro_batch = a.micro_batch;
    r.global_batch_tokens = a.global_batch_tokens;
    r.dtype_bytes = match a.dtype.trim().to_ascii_lowercase().as_str() {
        "bf16" | "bfloat16" | "fp16" | "f16" => 2,
        "f32" | "fp32" | "float32" => 4,
        d => return Err(format!("--dtype {d}: bf16 or f32")),
    };
    r.recompute = match a.recompute.trim().to_ascii_lowercase().as_str() {
        "auto" => None,
        "on" | "true" | "yes" => Some(true),
        "off" | "false" | "no" => Some(false),
        v => return Err(format!("--recompute {v}: auto, on or off")),
    };
    r.flash_attention = !a.no_flash_attention;
    r.extra_memory = a.extra_memory;
    r.kernel_rates = match a.kernel_rates.as_deref() {
        None => KernelRates::h200(),
        Some("none") => KernelRates::free(),
        Some(f) => {
            let text =
                std::fs::read_to_string(f).map_err(|e| format!("--kernel-rates {f}: {e}"))?;
            let k: KernelRates =
                serde_json::from_str(&text).map_err(|e| format!("--kernel-rates {f}: {e}"))?;
            k.validate()
                .map_err(|e| format!("--kernel-rates {f}: {e}"))?;
            k
        }
    };
    r.validate().map_err(msg)?;
    Ok(r)
}

fn header(a: &Args, req: &PlanRequest) {
    let m = req.accum_steps();
    outln!(
        "# strata-plan {} (mode {})",
        env!("CARGO_PKG_VERSION"),
        a.mode
    );
    outln!("# model   : {}", req.model.summary());
    outln!("# cluster : {}", req.cluster.summary());
    outln!(
        "# run     : seq {}, micro-batch {}, global batch {} tokens -> M = {m} micro-batch(es) per step; {}; {} per GPU{}; recompute {}; {}",
        req.seq,
        req.micro_batch,
        req.global_batch_tokens,
        if req.dtype_bytes == 2 { "bf16" } else { "f32" },
        gib(req.gpu_mem),
        match req.overhead {
            Overhead::Modeled => " (overhead modeled: CUDA context, NCCL buffers, fragmentation)".to_string(),
            Overhead::Reserve(r) => format!(" ({} reserved for overhead)", gib(r)),
            Overhead::Off => " (no framework overhead)".to_string(),
        },
        if a.mode == "amsp" && a.recompute == "auto" {
            format!(
                "{} (AMSP §VI-A4)",
                if planner::amsp::recompute_for(&req.model) { "on" } else { "off" }
            )
        } else {
            a.recompute.clone()
        },
        if req.flash_attention { "FlashAttention" } else { "no FlashAttention" },
    );
    outln!(
        "# kernels : qwZ/qgZ quantization kernels at the rates of {}",
        req.kernel_rates.device
    );
}

fn run_amsp(a: &Args, req: &PlanRequest) -> Result<(), String> {
    let t0 = Instant::now();
    let r = req.mesh().ranks_per_node;
    if a.amsp_from_gpus % r != 0 {
        return Err(format!(
            "--amsp-from-gpus {}: a whole number of {r}-GPU nodes",
            a.amsp_from_gpus
        ));
    }
    let opt = planner::amsp::AmspOptions {
        from_nodes: a.amsp_from_gpus / r,
    };
    let ranked = planner::amsp::plan(req, opt).map_err(msg)?;
    let elapsed = t0.elapsed();
    header(a, req);
    outln!("# comm    : AMSP eq. 1, T_p + T_g + T_os0 + T_os1 (§IV-C) at the cluster's scale, t = v / w with NCCL ring effective bandwidth");
    outln!("# scales  : one configuration from {} GPUs to the cluster (§VI-A4), ranked by the sum of T_comm over those scales (ties within 0.1%: less memory); mem/rank is the largest over them", a.amsp_from_gpus);
    outln!(
        "{:>4}  {:<26} {:>6} {:>6} {:>6} {:>11} {:>9} {:>9} {:>9} {:>9} {:>11}  {:>7}  feasible",
        "rank",
        "strategy",
        "p",
        "g",
        "os",
        "T_comm",
        "T_p",
        "T_g",
        "T_os0",
        "T_os1",
        "mem/rank",
        "sum"
    );
    let shown = rows_shown(a.top, ranked.len());
    let ms = |us: f64| format!("{:.1}", us / 1e3);
    for (i, r) in ranked.iter().take(shown).enumerate() {
        let c = &r.candidate;
        let (p, g, os) = c.strategy.factors();
        outln!(
            "{:>4}  {:<26} {:>6} {:>6} {:>6} {:>8} ms {:>9} {:>9} {:>9} {:>9} {:>11}  {:>7}  {}",
            i + 1,
            c.strategy.name,
            p,
            g,
            os,
            ms(c.comm_time_us),
            ms(r.cost.t_p_gather + r.cost.t_p_reduce),
            ms(r.cost.t_g),
            ms(r.cost.t_os0),
            ms(r.cost.t_os1),
            gib(c.memory_bytes),
            format!("{:.2}s", r.objective_us / 1e6),
            feasible_cell(&c.why)
        );
    }
    print_more(shown, ranked.len());
    outln!(
        "# {} AMSP configurations ({} feasible at every scale) planned in {:.3} s; times in ms",
        ranked.len(),
        ranked.iter().filter(|r| r.candidate.feasible).count(),
        elapsed.as_secs_f64()
    );
    if let Some(path) = &a.json {
        let cands: Vec<serde_json::Value> = ranked
            .iter()
            .map(|r| {
                let mut v = serde_json::to_value(&r.candidate).unwrap_or_default();
                v["amsp"] = serde_json::json!({
                    "t_p_us": r.cost.t_p_gather + r.cost.t_p_reduce,
                    "t_g_us": r.cost.t_g,
                    "t_os0_us": r.cost.t_os0,
                    "t_os1_us": r.cost.t_os1,
                    "objective_us": r.objective_us,
                    "scales": r.scales,
                });
                v
            })
            .collect();
        let doc = serde_json::json!({ "request": req, "mode": "amsp", "candidates": cands });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| format!("JSON: {e}"))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        outln!("# wrote {}", path.display());
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let req = request(a)?;
    match a.mode.as_str() {
        "strata" => {}
        "amsp" => return run_amsp(a, &req),
        m => return Err(format!("--mode {m}: strata or amsp")),
    }
    let t0 = Instant::now();
    let (cands, stats) = planner::plan_with_stats(&req).map_err(msg)?;
    let elapsed = t0.elapsed();
    header(a, &req);
    outln!("# comm    : predicted communication time per step (sum of phases, AMSP eq. 1) from strata's simulator");
    outln!(
        "{:>4}  {:<30} {:>6} {:>6} {:>6} {:>13} {:>12}  {:<6} feasible",
        "rank",
        "strategy",
        "p",
        "g",
        "os",
        "comm/step",
        "mem/rank",
        "recomp"
    );
    let shown = rows_shown(a.top, cands.len());
    for (i, c) in cands.iter().take(shown).enumerate() {
        let (p, g, os) = c.strategy.factors();
        outln!(
            "{:>4}  {:<30} {:>6} {:>6} {:>6} {:>10.2} ms {:>12}  {:<6} {}",
            i + 1,
            c.strategy.name,
            p,
            g,
            os,
            c.comm_time_us / 1e3,
            gib(c.memory_bytes),
            if c.recompute { "yes" } else { "no" },
            feasible_cell(&c.why)
        );
    }
    print_more(shown, cands.len());
    outln!(
        "# {} candidates ({} feasible) planned in {:.3} s ({} collective schedules simulated, {} cache hits)",
        stats.candidates,
        stats.feasible,
        elapsed.as_secs_f64(),
        stats.simulated,
        stats.cache_hits
    );
    if let Some(path) = &a.json {
        let doc = serde_json::json!({ "request": req, "candidates": cands });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| format!("JSON: {e}"))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        outln!("# wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata-plan: {e}");
            ExitCode::from(2)
        }
    }
}

/// Rows a table prints: `--top K` (0: all) of `total`.
fn rows_shown(top: usize, total: usize) -> usize {
    if top == 0 {
        total
    } else {
        top.min(total)
    }
}

/// The footer of a table cut by `--top`.
fn print_more(shown: usize, total: usize) {
    if shown < total {
        outln!("# ... {} more (--top 0 prints all)", total - shown);
    }
}

/// The `feasible` column: `yes`, or `no: <why>`.
fn feasible_cell(why: &Option<String>) -> String {
    match why {
        None => "yes".to_string(),
        Some(w) => format!("no: {w}"),
    }
}
