//! `strata-plan`: rank every sharding strategy for a model on a cluster (AMSP §V-B's
//! planner over the engine's configuration space; see `strata_engine::planner`).

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use strata_engine::planner::{self, memory::gib, ModelShape, PlanRequest};

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
    /// frontier:N, nodes:NxR, nodes:NxPxD, or a topology JSON file)
    #[arg(long)]
    cluster: String,
    /// Memory per GPU: bytes, optionally with K, M, G, T (powers of 1024): 80G, 80GiB
    #[arg(long, default_value = "80G")]
    gpu_mem: String,
    /// GPU memory the model may not use (CUDA context, NCCL buffers, fragmentation),
    /// same units as --gpu-mem; 0 by default
    #[arg(long, default_value = "0")]
    reserve: String,
    /// Sequence length (tokens)
    #[arg(long, default_value_t = 4096)]
    seq: usize,
    /// Sequences per micro-batch per GPU
    #[arg(long, default_value_t = 1)]
    micro_batch: usize,
    /// Tokens per optimizer step over the cluster (sets the accumulation steps)
    #[arg(long, default_value_t = 4 << 20)]
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
    let cluster = strata::Topology::parse(&a.cluster).map_err(|e| format!("--cluster: {e}"))?;
    let mut r = PlanRequest::new(model, cluster);
    r.gpu_mem = planner::parse_bytes(&a.gpu_mem).map_err(|e| format!("--gpu-mem: {}", msg(e)))?;
    r.reserve = match a.reserve.trim() {
        "0" => 0,
        v => planner::parse_bytes(v).map_err(|e| format!("--reserve: {}", msg(e)))?,
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
    r.validate().map_err(msg)?;
    Ok(r)
}

fn run(a: &Args) -> Result<(), String> {
    let req = request(a)?;
    let t0 = Instant::now();
    let (cands, stats) = planner::plan_with_stats(&req).map_err(msg)?;
    let elapsed = t0.elapsed();
    let m = req.accum_steps();
    println!("# strata-plan {}", env!("CARGO_PKG_VERSION"));
    println!("# model   : {}", req.model.summary());
    println!("# cluster : {}", req.cluster.summary());
    println!(
        "# run     : seq {}, micro-batch {}, global batch {} tokens -> M = {m} micro-batch(es) per step; {}; {} per GPU{}; recompute {}; {}",
        req.seq,
        req.micro_batch,
        req.global_batch_tokens,
        if req.dtype_bytes == 2 { "bf16" } else { "f32" },
        gib(req.gpu_mem),
        if req.reserve > 0 {
            format!(" ({} reserved)", gib(req.reserve))
        } else {
            String::new()
        },
        a.recompute,
        if req.flash_attention { "FlashAttention" } else { "no FlashAttention" },
    );
    println!("# comm    : predicted communication time per step (sum of phases, AMSP eq. 1) from strata's simulator");
    println!(
        "{:>4}  {:<30} {:>6} {:>6} {:>6} {:>13} {:>12}  {:<6} feasible",
        "rank", "strategy", "p", "g", "os", "comm/step", "mem/rank", "recomp"
    );
    let shown = if a.top == 0 {
        cands.len()
    } else {
        a.top.min(cands.len())
    };
    for (i, c) in cands.iter().take(shown).enumerate() {
        let (p, g, os) = c.strategy.factors();
        println!(
            "{:>4}  {:<30} {:>6} {:>6} {:>6} {:>10.2} ms {:>12}  {:<6} {}",
            i + 1,
            c.strategy.name,
            p,
            g,
            os,
            c.comm_time_us / 1e3,
            gib(c.memory_bytes),
            if c.recompute { "yes" } else { "no" },
            match &c.why {
                None => "yes".to_string(),
                Some(w) => format!("no: {w}"),
            }
        );
    }
    if shown < cands.len() {
        println!("# ... {} more (--top 0 prints all)", cands.len() - shown);
    }
    println!(
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
        println!("# wrote {}", path.display());
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
