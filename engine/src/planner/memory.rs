//! The memory model: bytes per rank of model states, activations and buffers.
//!
//! Model states, AMSP §IV-D (with `w` bytes per working element instead of 2):
//! `D_modelstate = w·Φ/(s_p⁰·s_p¹) + w·Φ/(s_g⁰·s_g¹) + 12·Φ/(s_os⁰·s_os¹)`
//! (12 = f32 master weights, Adam momentum and variance, K = 12 in PaRO Table 1 and
//! ZeRO++ Fig. 12), plus for ZeRO++ hpZ (004 B.2, E.2) the secondary partition
//! `w·Φ/s_hpz`, so that ZeRO++'s P column of PaRO Table 1 is `2Ψ/N + 2Ψ/M`.
//! `D_total = D_modelstate + D_activation + D_tmp` (AMSP §IV-D).
//!
//! Activations, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
//! Transformer Models") §4.1, without tensor or sequence parallelism (t = 1): per layer
//! `s·b·h·(34 + 5·a·s/h)` bytes for 16-bit activations with dropout, which is the sum
//! of attention `11sbh + 5as²b` (QKV input 2sbh, Q and K 4sbh, softmax output 2as²b,
//! its dropout mask as²b, dropout output 2as²b, V 2sbh, output projection input 2sbh,
//! dropout mask sbh), MLP `19sbh` (input 2sbh, GeLU input 8sbh, GeLU output 8sbh,
//! dropout mask sbh) and two norms `4sbh`; the output layer adds `4sbv` (f32
//! cross-entropy logits) and the final norm and projection inputs `2sbh` each. This
//! module writes the same terms with the shape's own choices: `w` bytes per element
//! instead of 2, ffn `f` instead of 4h (GeLU: input `w·sbh`, `2·w·sbf`; gated SwiGLU:
//! `4·w·sbf` for gate output, up output, SiLU output and product), no masks without
//! dropout, and with FlashAttention (AMSP §VI-A1 trains with FlashAttention-v2) no
//! `as²b` terms but the f32 log-sum-exp `4·asb`. For GPT's shape (f = 4h, dropout, no
//! flash, w = 2) the per-layer sum is exactly `sbh(34 + 5as/h)` (tested).
//!
//! With recomputation the runtime keeps each unit's input (`w·sbh` per unit, two per
//! layer: Korthikanti's full recomputation `2sbhL` at module granularity) and
//! recomputes one unit at a time in backward, whose working set is that unit's full
//! activations plus the incoming gradient `w·sbh`. The output layer's `4sbv` counts in
//! both modes.
//!
//! Buffers (`D_tmp`), from what the runtime allocates: two gathered units in flight
//! (`2·w·Φ_u,max`, current and prefetched, only when `s_p > 1`), one unit's full
//! gradient before it is reduce-scattered (`w·Φ_u,max`, when `s_g > 1`), a
//! communication scratch of one unit (`w·Φ_u,max`, whenever the world has more than one
//! rank), and the packed quantized slices of qwZ / qgZ (`Φ_u,max·bits/8` each).
//!
//! Framework overhead, what a real PyTorch + NCCL process holds beyond the tensors
//! above ([`Overhead`]; each term's source is on its constant):
//! - the CUDA/HIP context, [`CUDA_CONTEXT_BYTES`];
//! - NCCL's communication buffers, [`nccl_buffers`]: per communicator, channels x
//!   connections x (Simple + LL128 + LL buffer) at NCCL's defaults, one communicator
//!   per distinct process group the strategy uses ([`communicators`]) plus the world;
//! - allocator fragmentation, [`FRAGMENTATION_PERCENT`] of the dynamic allocations
//!   (activations and buffers, which are allocated and freed every micro-batch; the
//!   model states are long-lived flat buffers).
//!
//! `PlanRequest::overhead` picks the modeled terms (default), a flat reserve in their
//! place, or none.

use super::comm::GroupShape;
use super::models::{ModelShape, UnitKind};
use crate::config::{GradSync, Mesh, Strategy};
use serde::{Deserialize, Serialize};

/// Bytes per rank, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    /// Primary parameter shard `w·Φ/s_p`.
    pub params: u64,
    /// Gradient shard `w·Φ/s_g`.
    pub grads: u64,
    /// Optimizer states `12·Φ/s_os`.
    pub optimizer: u64,
    /// hpZ secondary parameter shard `w·Φ/s_hpz` (0 without hpZ).
    pub secondary: u64,
    /// Activations (Korthikanti §4.1, module doc).
    pub activations: u64,
    /// Gathered units, unit gradient, communication scratch.
    pub buffers: u64,
    /// CUDA/HIP context ([`CUDA_CONTEXT_BYTES`]; 0 unless the overhead is modeled).
    #[serde(default)]
    pub context: u64,
    /// NCCL communication buffers ([`nccl_buffers`]).
    #[serde(default)]
    pub comm_buffers: u64,
    /// Allocator fragmentation ([`FRAGMENTATION_PERCENT`] of activations + buffers).
    #[serde(default)]
    pub fragmentation: u64,
    /// A flat reserve given in place of the three terms above (`--reserve`).
    #[serde(default)]
    pub reserve: u64,
}

impl MemoryBreakdown {
    /// Model states (AMSP's `D_modelstate` plus the hpZ secondary shard).
    pub fn model_states(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.secondary
    }

    /// Framework overhead: context, NCCL buffers, fragmentation, reserve.
    pub fn overhead(&self) -> u64 {
        self.context
            .saturating_add(self.comm_buffers)
            .saturating_add(self.fragmentation)
            .saturating_add(self.reserve)
    }

    /// Everything (`D_total` plus the framework overhead), saturating.
    pub fn total(&self) -> u64 {
        self.model_states()
            .saturating_add(self.activations)
            .saturating_add(self.buffers)
            .saturating_add(self.overhead())
    }
}

/// What a GPU holds beyond the model's tensors (module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overhead {
    /// CUDA context + NCCL buffers + fragmentation, each modeled (the default).
    #[default]
    Modeled,
    /// A flat reserve of this many bytes in place of the modeled terms.
    Reserve(u64),
    /// Nothing: the model's tensors only (the planner before framework overhead).
    Off,
}

/// CUDA/HIP context per process: 768 MiB. The first CUDA call of a PyTorch process
/// creates the context (driver state, the loaded kernels of cuBLAS/cuDNN/PyTorch);
/// PyTorch's maintainers put it at "~700+MB depending on the CUDA version and device"
/// and users measure 723 MiB and ~800 MB for a one-element tensor
/// (discuss.pytorch.org threads 73021 and 81330). CUDA 11.7+ lazy module loading
/// lowers it; 768 MiB stays on the safe side of the measured range.
pub const CUDA_CONTEXT_BYTES: u64 = 768 << 20;

/// NCCL's per-connection buffer of the Simple protocol: `NCCL_BUFFSIZE`, default
/// 4 MiB (`DEFAULT_BUFFSIZE (1 << 22)` in NCCL's init.cc; NCCL docs, NCCL_BUFFSIZE).
pub const NCCL_SIMPLE_BYTES: u64 = 4 << 20;
/// LL128: `NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x
/// NCCL_STEPS (8) x 8` = 4,915,200 bytes (`DEFAULT_LL128_BUFFSIZE`, NCCL init.cc).
pub const NCCL_LL128_BYTES: u64 = 120 * 640 * 8 * 8;
/// LL: `NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS (8) x
/// 16` = 512 KiB (`DEFAULT_LL_BUFFSIZE`, NCCL init.cc).
pub const NCCL_LL_BYTES: u64 = 8 * 512 * 8 * 16;
/// Channels per communicator: 16, what NCCL's topology search typically builds on
/// 8-GPU NVSwitch nodes (A100/H100; `NCCL_MAX_NCHANNELS` caps it, MAXCHANNELS is 32).
pub const NCCL_CHANNELS: u64 = 16;
/// Connections per channel whose buffers a rank holds: 2, its ring's send and receive
/// peers (NCCL places Simple buffers at the sender under P2P read and LL/LL128 at the
/// receiver; counting both sides in full is the conservative bound).
pub const NCCL_PEERS: u64 = 2;

/// Allocator fragmentation: 20% of the dynamic allocations. PyTorch's caching
/// allocator splits cached blocks and cannot merge freed neighbours of different
/// segments, so irregular allocate/free patterns (recomputation, ZeRO gathers)
/// strand memory: GMLake (Guo et al., ASPLOS 2024) measures 15% fragmentation on
/// average and up to 33% over eight LLMs trained on A100-80GB with DeepSpeed ZeRO,
/// recomputation and LoRA; ZeRO (Rajbhandari et al., SC20, on fragmentation) reports OOM "with
/// over 30% of memory still available" in extreme cases. 20% is above the measured
/// average, below the worst case.
pub const FRAGMENTATION_PERCENT: u64 = 20;

/// The distinct process groups `s` communicates over on `mesh`, besides the world
/// (the group shapes of the phases in `comm.rs`; groups of one rank excluded).
pub fn communicators(s: &Strategy, mesh: Mesh) -> Vec<GroupShape> {
    let dp = mesh.dp();
    let (sp, sg, sos) = (s.p.size(), s.g.size(), s.os.size());
    let mut g = Vec::new();
    if sp > 1 {
        g.push(GroupShape::block(s.p));
        g.push(GroupShape::block(s.hpz.unwrap_or(s.p)));
    }
    if sg > sp {
        g.push(GroupShape::sub(s.g, s.p));
    }
    match s.sync {
        GradSync::ReduceScatter => {
            if sos > sg {
                g.push(GroupShape::sub(s.os, s.g));
            }
            if s.os != dp {
                g.push(GroupShape::sub(dp, s.os));
            }
        }
        GradSync::AllReduce => {
            if s.p != dp {
                g.push(GroupShape::sub(dp, s.p));
            }
        }
    }
    if sos > sp {
        g.push(GroupShape::sub(s.os, s.p));
    }
    let world = mesh.world();
    let mut out: Vec<GroupShape> = Vec::new();
    for x in g {
        if x.size() > 1 && x.size() < world && !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// NCCL buffer bytes per rank for `comms` communicators: `comms x NCCL_CHANNELS x
/// NCCL_PEERS x (Simple + LL128 + LL)` = 294 MiB per communicator at the defaults.
pub fn nccl_buffers(comms: u64) -> u64 {
    comms
        .saturating_mul(NCCL_CHANNELS * NCCL_PEERS)
        .saturating_mul(NCCL_SIMPLE_BYTES + NCCL_LL128_BYTES + NCCL_LL_BYTES)
}

/// Fill the overhead fields of `m` for strategy `s` on `mesh` (module doc).
pub fn add_overhead(m: &mut MemoryBreakdown, o: Overhead, s: &Strategy, mesh: Mesh) {
    m.context = 0;
    m.comm_buffers = 0;
    m.fragmentation = 0;
    m.reserve = 0;
    match o {
        Overhead::Off => {}
        Overhead::Reserve(r) => m.reserve = r,
        Overhead::Modeled => {
            m.context = CUDA_CONTEXT_BYTES;
            if mesh.world() > 1 {
                m.comm_buffers = nccl_buffers(1 + communicators(s, mesh).len() as u64);
            }
            m.fragmentation = m.activations.saturating_add(m.buffers) / 100 * FRAGMENTATION_PERCENT;
        }
    }
}

/// Training-run inputs of the activation formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationInputs {
    /// Sequence length `s`.
    pub seq: u64,
    /// Micro-batch size `b` (sequences).
    pub micro_batch: u64,
    /// Bytes per activation element `w`.
    pub w: u64,
    /// Unit-boundary recomputation.
    pub recompute: bool,
    /// FlashAttention (no `as²b` terms).
    pub flash_attention: bool,
}

/// `⌈x / s⌉` with `s = 0` treated as 1.
fn share(x: u64, s: usize) -> u64 {
    x.div_ceil(s.max(1) as u64)
}

/// Model-state bytes per rank: `(params, grads, optimizer, secondary)` =
/// `(w·Φ/s_p, w·Φ/s_g, 12·Φ/s_os, w·Φ/s_hpz)`, each rounded up (AMSP §IV-D; hpZ:
/// ZeRO++ B.2). `phi·w` and `12·phi` saturate.
pub fn model_states(phi: u64, w: u64, s: &Strategy) -> (u64, u64, u64, u64) {
    let wp = phi.saturating_mul(w);
    (
        share(wp, s.p.size()),
        share(wp, s.g.size()),
        share(phi.saturating_mul(12), s.os.size()),
        s.hpz.map(|h| share(wp, h.size())).unwrap_or(0),
    )
}

/// Activation bytes of one unit of `kind` for one micro-batch (module doc; `Embed`:
/// the dropout mask after the embedding, `Head`: final norm and projection inputs and
/// the f32 cross-entropy logits `4sbv`).
pub fn unit_activations(m: &ModelShape, kind: UnitKind, a: &ActivationInputs) -> u64 {
    let (s, b, w) = (a.seq, a.micro_batch, a.w);
    let (h, f, v) = (m.hidden as u64, m.ffn as u64, m.vocab as u64);
    let heads = m.heads as u64;
    let sb = s.saturating_mul(b);
    let sbh = sb.saturating_mul(h);
    let drop = u64::from(m.dropout);
    let sat = |x: u128| x.min(u64::MAX as u128) as u64;
    match kind {
        UnitKind::Attention => {
            // QKV input, Q, K, V, output projection input, norm input: 6 w·sbh.
            let lin = 6u128 * w as u128 * sbh as u128;
            let scores = if a.flash_attention {
                4u128 * heads as u128 * sb as u128
            } else {
                let as2b = heads as u128 * s as u128 * sb as u128;
                // softmax output (w), with dropout also its mask (1) and output (w).
                as2b * (w as u128 + drop as u128 * (1 + w as u128))
            };
            sat(lin + scores + drop as u128 * sbh as u128)
        }
        UnitKind::Mlp => {
            // input and norm input 2 w·sbh; GeLU: 2 w·sbf; SwiGLU: 4 w·sbf; mask sbh.
            let inner = if m.gated_mlp { 4u128 } else { 2 };
            sat(2 * w as u128 * sbh as u128
                + inner * w as u128 * sb as u128 * f as u128
                + drop as u128 * sbh as u128)
        }
        UnitKind::Embed => sat(drop as u128 * sbh as u128),
        UnitKind::Head => {
            let norm = u128::from(m.final_norm);
            sat((1 + norm) * w as u128 * sbh as u128 + 4 * sb as u128 * v as u128)
        }
    }
}

/// Per-layer activation bytes without recomputation (attention + MLP units):
/// `sbh(34 + 5as/h)` for GPT's shape at w = 2 (Korthikanti §4.1).
pub fn layer_activations(m: &ModelShape, a: &ActivationInputs) -> u64 {
    unit_activations(m, UnitKind::Attention, a).saturating_add(unit_activations(
        m,
        UnitKind::Mlp,
        a,
    ))
}

/// Activation bytes per rank (module doc): every unit's activations without
/// recomputation; with it, every unit's input `w·sbh` plus the largest unit's working
/// set plus the incoming gradient `w·sbh`, plus the head's `4sbv` either way.
pub fn activations(m: &ModelShape, a: &ActivationInputs) -> u64 {
    let sbh = a
        .seq
        .saturating_mul(a.micro_batch)
        .saturating_mul(m.hidden as u64);
    let head = unit_activations(m, UnitKind::Head, a);
    let embed = unit_activations(m, UnitKind::Embed, a);
    let layers = m.layers as u64;
    if !a.recompute {
        layer_activations(m, a)
            .saturating_mul(layers)
            .saturating_add(head)
            .saturating_add(embed)
    } else {
        let inputs = a.w.saturating_mul(sbh).saturating_mul(2 * layers + 1);
        let work = unit_activations(m, UnitKind::Attention, a)
            .max(unit_activations(m, UnitKind::Mlp, a))
            .saturating_add(a.w.saturating_mul(sbh));
        inputs
            .saturating_add(work)
            .saturating_add(head)
            .saturating_add(embed)
    }
}

/// Buffer bytes per rank (module doc).
pub fn buffers(m: &ModelShape, s: &Strategy, w: u64, world: usize) -> u64 {
    let u = m.max_unit();
    let wu = u.saturating_mul(w);
    let mut b = 0u64;
    if s.p.size() > 1 {
        b = b.saturating_add(wu.saturating_mul(2));
    }
    if s.g.size() > 1 {
        b = b.saturating_add(wu);
    }
    if world > 1 {
        b = b.saturating_add(wu);
    }
    let quant = |bits: Option<u8>| bits.map(|q| u.saturating_mul(q as u64) / 8).unwrap_or(0);
    if s.p.size() > 1 {
        b = b.saturating_add(quant(s.qwz_bits));
        b = b.saturating_add(quant(s.qgz_bits));
    }
    b
}

/// The whole breakdown for `strategy` on a world of `world` ranks.
pub fn memory(
    m: &ModelShape,
    strategy: &Strategy,
    a: &ActivationInputs,
    world: usize,
) -> MemoryBreakdown {
    let (params, grads, optimizer, secondary) = model_states(m.params(), a.w, strategy);
    MemoryBreakdown {
        params,
        grads,
        optimizer,
        secondary,
        activations: activations(m, a),
        buffers: buffers(m, strategy, a.w, world),
        ..MemoryBreakdown::default()
    }
}

/// `12.34 GiB` (MiB / KiB / B below a GiB, so small models stay readable).
pub fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1u64 << shift {
            return format!("{:.2} {unit}", b / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} B")
}
