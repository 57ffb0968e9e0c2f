//! A small decoder-only transformer language model (GPT-2 style, byte-level) on
//! candle's CPU device, split into units for the engine.
//!
//! # Units
//!
//! With `L = n_layers`, the model has `L + 2` units, in forward order:
//!
//! | unit | name | computes |
//! |------|------|----------|
//! | `0` | `embed` | token embedding + learned positional embedding |
//! | `1..=L` | `block0` .. `block{L-1}` | pre-LN transformer block |
//! | `L + 1` | `head` | final LayerNorm, LM head, mean cross-entropy |
//!
//! Activations between units are f32 tensors `[batch, seq, d_model]`; the head returns
//! the mean loss as a 0-d f32 tensor.
//!
//! # Parameter layout
//!
//! Each unit's parameters are one flat f32 vector: the tensors below, concatenated in
//! this order, each row-major. Linear weights are stored `[in, out]` (the layer
//! computes `x @ W + b`). `D = d_model`, `F = d_ff`, `V = vocab`, `S = seq`.
//!
//! - `embed`: `wte [V, D]`, `wpe [S, D]` → `V·D + S·D` values.
//! - `block`: `ln1.weight [D]`, `ln1.bias [D]`, `attn.qkv.weight [D, 3D]`,
//!   `attn.qkv.bias [3D]`, `attn.proj.weight [D, D]`, `attn.proj.bias [D]`,
//!   `ln2.weight [D]`, `ln2.bias [D]`, `mlp.fc.weight [D, F]`, `mlp.fc.bias [F]`,
//!   `mlp.proj.weight [F, D]`, `mlp.proj.bias [D]` → `4D² + 2DF + 9D + F` values.
//!   The `3D` outputs of `qkv` are `q | k | v`, each split into `n_heads` consecutive
//!   heads of `D / n_heads`.
//! - `head`: `ln_f.weight [D]`, `ln_f.bias [D]`, `lm_head.weight [D, V]` (untied from
//!   `wte`, no bias) → `2D + D·V` values.
//!
//! [`TinyLm::layout`] returns the same list with offsets.
//!
//! # Math
//!
//! LayerNorm uses the biased variance and `eps = 1e-5`; attention is causal, scaled by
//! `1/sqrt(D / n_heads)`; the MLP's activation is GELU with the **tanh approximation**
//! (GPT-2's `gelu_new`, candle's `Tensor::gelu`). The loss is the mean over all
//! `batch * seq` positions of `-log softmax(logits)[target]`.
//!
//! # Initialization
//!
//! GPT-2 style, from [`SplitMix64`] seeded by `(seed, unit)`: weights and embeddings
//! normal(0, 0.02), the two residual-stream projections (`attn.proj.weight`,
//! `mlp.proj.weight`) normal(0, 0.02 / sqrt(2·L)), biases 0, LayerNorm weights 1 and
//! biases 0. The values depend only on the configuration, `seed` and `u`.
//!
//! # Determinism
//!
//! Every op runs on candle's CPU backend, whose element-wise ops and reductions are
//! sequential loops. Matmuls go through `gemm`, which may use rayon threads for large
//! products (over `48·48·256` multiply-adds per block); it splits only the output rows
//! and columns among threads, while the reduction (`k`) dimension is blocked by a size
//! that does not depend on the thread count, so every output element is summed in the
//! same order whatever the number of threads. The same inputs therefore give
//! bit-identical outputs across calls and threads on one machine (the tests check it).
//! The default configuration's matmuls are all below the threading threshold anyway.

mod rng;
mod transformer;

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::compute::{Batch, UnitModel};
use crate::error::{Error, Result};

pub use rng::{mix64, SplitMix64};
pub use transformer::{ParamInit, ParamSpec, LN_EPS};

use transformer::{Dims, UnitKind};

/// Dimensions of a [`TinyLm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LmConfig {
    /// Vocabulary size; 256 for byte-level text (every token must be `< vocab`).
    pub vocab: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks (units `1..=n_layers`).
    pub n_layers: usize,
    /// Attention heads per block; must divide `d_model`.
    pub n_heads: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Maximum sequence length (rows of the positional embedding); batches may use
    /// any `seq` from 1 to this.
    pub seq: usize,
}

impl Default for LmConfig {
    /// A tiny model: vocab 256, d_model 32, 2 layers, 4 heads, d_ff 64, seq 32
    /// (`params() == 34_560`).
    fn default() -> LmConfig {
        LmConfig {
            vocab: 256,
            d_model: 32,
            n_layers: 2,
            n_heads: 4,
            d_ff: 64,
            seq: 32,
        }
    }
}

impl LmConfig {
    /// Total parameter count over all units (saturating at `usize::MAX` for absurd
    /// configurations, which [`TinyLm::new`] rejects).
    pub fn params(&self) -> usize {
        self.params_checked().unwrap_or(usize::MAX)
    }

    fn dims(&self) -> Dims {
        Dims {
            vocab: self.vocab,
            d_model: self.d_model,
            n_layers: self.n_layers,
            d_ff: self.d_ff,
            seq: self.seq,
        }
    }

    fn kind(&self, u: usize) -> Option<UnitKind> {
        if u == 0 {
            Some(UnitKind::Embed)
        } else if u <= self.n_layers {
            Some(UnitKind::Block(u - 1))
        } else if u == self.n_layers.checked_add(1)? {
            Some(UnitKind::Head)
        } else {
            None
        }
    }

    /// `(embed, block, head)` unit sizes, `None` on overflow.
    fn unit_sizes3(&self) -> Option<(usize, usize, usize)> {
        let d = self.dims();
        let size = |k| {
            let l = transformer::layout(&d, k)?;
            l.last().map(|s| s.offset + s.len)
        };
        Some((
            size(UnitKind::Embed)?,
            size(UnitKind::Block(0))?,
            size(UnitKind::Head)?,
        ))
    }

    /// Total parameters, `None` on overflow.
    fn params_checked(&self) -> Option<usize> {
        let (e, b, h) = self.unit_sizes3()?;
        e.checked_add(b.checked_mul(self.n_layers)?)?.checked_add(h)
    }
}

/// Upper bound on any one dimension accepted by [`TinyLm::new`].
const MAX_DIM: usize = 1 << 20;
/// Largest `seq` whose `[seq, seq]` causal mask is built once in [`TinyLm::new`]
/// (longer ones are built per call at the batch's length).
const MASK_CACHE_SEQ: usize = 1024;
/// Upper bound on the total parameter count accepted by [`TinyLm::new`].
const MAX_PARAMS: usize = 1 << 32;

/// The decoder-only transformer LM, as a chain of `n_layers + 2` units (see the
/// [module documentation](self) for the units, the parameter layout and the math).
///
/// It holds no parameters: the engine owns them as one flat f32 vector per unit and
/// passes them to every call. Cheap to share between threads (`Send + Sync`).
#[derive(Debug, Clone)]
pub struct TinyLm {
    cfg: LmConfig,
    layouts: Vec<Vec<ParamSpec>>, // embed, block, head
    sizes: Vec<usize>,
    /// The causal mask for `cfg.seq`, kept when small (`seq <= MASK_CACHE_SEQ`).
    mask: Option<Tensor>,
}

impl TinyLm {
    /// Validates `cfg` and builds the model.
    ///
    /// Errors ([`Error::Model`]) when a dimension is 0 (except `n_layers`, which may be
    /// 0), `n_heads` does not divide `d_model`, a dimension exceeds 2^20, `n_layers`
    /// exceeds 4096, or the model would have more than 2^32 parameters.
    pub fn new(cfg: LmConfig) -> Result<TinyLm> {
        let named = [
            ("vocab", cfg.vocab),
            ("d_model", cfg.d_model),
            ("n_heads", cfg.n_heads),
            ("d_ff", cfg.d_ff),
            ("seq", cfg.seq),
        ];
        for (name, v) in named {
            if v == 0 {
                return Err(Error::Model(format!(
                    "LmConfig.{name} must be at least 1, got 0"
                )));
            }
            if v > MAX_DIM {
                return Err(Error::Model(format!(
                    "LmConfig.{name} = {v} is too large (at most {MAX_DIM})"
                )));
            }
        }
        if cfg.n_layers > 4096 {
            return Err(Error::Model(format!(
                "LmConfig.n_layers = {} is too large (at most 4096)",
                cfg.n_layers
            )));
        }
        let head_dim = cfg.d_model / cfg.n_heads;
        if head_dim * cfg.n_heads != cfg.d_model {
            return Err(Error::Model(format!(
                "LmConfig.d_model ({}) must be divisible by n_heads ({})",
                cfg.d_model, cfg.n_heads
            )));
        }
        let too_big = || {
            Error::Model(format!(
                "LmConfig {cfg:?} has more than {MAX_PARAMS} parameters; choose smaller dimensions"
            ))
        };
        let total = cfg.params_checked().ok_or_else(too_big)?;
        if total > MAX_PARAMS {
            return Err(too_big());
        }
        let (embed, block, head) = cfg.unit_sizes3().ok_or_else(too_big)?;
        let mut sizes = vec![embed];
        sizes.resize(1 + cfg.n_layers, block);
        sizes.push(head);
        let d = cfg.dims();
        let layouts = [UnitKind::Embed, UnitKind::Block(0), UnitKind::Head]
            .into_iter()
            .map(|k| transformer::layout(&d, k).ok_or_else(too_big))
            .collect::<Result<Vec<_>>>()?;
        let mask = if cfg.seq <= MASK_CACHE_SEQ {
            Some(transformer::causal_mask(cfg.seq)?)
        } else {
            None
        };
        Ok(TinyLm {
            cfg,
            layouts,
            sizes,
            mask,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// Number of units, `n_layers + 2`.
    pub fn n_units(&self) -> usize {
        self.sizes.len()
    }

    /// The tensors inside unit `u`'s flat parameter vector, in order, with offsets,
    /// shapes and initialization rules. Errors if `u >= n_units()`.
    pub fn layout(&self, u: usize) -> Result<Vec<ParamSpec>> {
        Ok(self.specs(self.kind(u)?).to_vec())
    }

    fn kind(&self, u: usize) -> Result<UnitKind> {
        self.cfg.kind(u).ok_or_else(|| {
            Error::Model(format!(
                "unit {u} does not exist (the model has {} units)",
                self.n_units()
            ))
        })
    }

    fn specs(&self, k: UnitKind) -> &[ParamSpec] {
        match k {
            UnitKind::Embed => &self.layouts[0],
            UnitKind::Block(_) => &self.layouts[1],
            UnitKind::Head => &self.layouts[2],
        }
    }

    /// Checks the batch against the configuration (and the tokens or targets that unit
    /// kind `kind` reads) and returns `(batch, seq)`.
    fn check_batch(&self, batch: &Batch, kind: UnitKind) -> Result<(usize, usize)> {
        let (b, t) = (batch.batch, batch.seq);
        if b == 0 || t == 0 {
            return Err(Error::Model(format!("empty batch: batch {b} x seq {t}")));
        }
        if t > self.cfg.seq {
            return Err(Error::Model(format!(
                "batch seq {t} exceeds the model's maximum seq {}",
                self.cfg.seq
            )));
        }
        let n = b
            .checked_mul(t)
            .ok_or_else(|| Error::Model("batch * seq overflows".into()))?;
        let check = |name: &str, v: &[u32]| -> Result<()> {
            if v.len() != n {
                return Err(Error::Model(format!(
                    "batch.{name} has {} entries, expected batch {b} x seq {t} = {n}",
                    v.len()
                )));
            }
            if let Some((i, &tok)) = v
                .iter()
                .enumerate()
                .find(|(_, &x)| x as usize >= self.cfg.vocab)
            {
                return Err(Error::Model(format!(
                    "batch.{name}[{i}] = {tok} is out of the vocabulary (vocab {})",
                    self.cfg.vocab
                )));
            }
            Ok(())
        };
        match kind {
            UnitKind::Embed => check("tokens", &batch.tokens)?,
            UnitKind::Head => check("targets", &batch.targets)?,
            UnitKind::Block(_) => {}
        }
        Ok((b, t))
    }

    fn check_params(&self, u: usize, params: &[f32]) -> Result<()> {
        if params.len() != self.sizes[u] {
            return Err(Error::Model(format!(
                "unit {u} ({}) takes {} parameters, got {}",
                self.unit_name(u),
                self.sizes[u],
                params.len()
            )));
        }
        Ok(())
    }

    fn unit_name(&self, u: usize) -> String {
        match self.cfg.kind(u) {
            Some(UnitKind::Embed) => "embed".into(),
            Some(UnitKind::Block(i)) => format!("block{i}"),
            Some(UnitKind::Head) => "head".into(),
            None => format!("unit{u}"),
        }
    }

    /// Validates the inputs of unit `u` and returns its kind and the batch dims.
    fn check_call(
        &self,
        u: usize,
        params: &[f32],
        x: Option<&Tensor>,
        batch: &Batch,
    ) -> Result<(UnitKind, usize, usize)> {
        let kind = self.kind(u)?;
        self.check_params(u, params)?;
        let (b, t) = self.check_batch(batch, kind)?;
        if kind != UnitKind::Embed {
            let x = x.ok_or_else(|| {
                Error::Model(format!(
                    "unit {u} ({}) needs an input activation",
                    self.unit_name(u)
                ))
            })?;
            transformer::check_act(x, b, t, self.cfg.d_model, "the input activation")?;
        }
        Ok((kind, b, t))
    }

    /// The unit's computation on already-built parameter tensors.
    fn run(
        &self,
        kind: UnitKind,
        p: &[Tensor],
        x: Option<&Tensor>,
        batch: &Batch,
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        let need_x = || Error::Model("missing input activation".into());
        match kind {
            UnitKind::Embed => {
                let tokens = transformer::ids(&batch.tokens, &[b * t])?;
                transformer::embed(p, &tokens, b, t)
            }
            UnitKind::Block(_) => {
                let x = x.ok_or_else(need_x)?;
                match &self.mask {
                    Some(mask) => transformer::block(p, x, mask, self.cfg.n_heads),
                    None => {
                        let mask = transformer::causal_mask(t)?;
                        transformer::block(p, x, &mask, self.cfg.n_heads)
                    }
                }
            }
            UnitKind::Head => {
                let targets = transformer::ids(&batch.targets, &[b * t, 1])?;
                transformer::head(p, x.ok_or_else(need_x)?, &targets)
            }
        }
    }

    /// The mean loss of the whole chain on `batch`, with `params[u]` the flat parameters
    /// of unit `u` (a convenience for evaluation: unit-by-unit [`UnitModel::forward`]).
    pub fn loss<P: AsRef<[f32]>>(&self, params: &[P], batch: &Batch) -> Result<f32> {
        self.check_all(params)?;
        let mut x: Option<Tensor> = None;
        for (u, p) in params.iter().enumerate() {
            x = Some(self.forward(u, p.as_ref(), x.as_ref(), batch)?);
        }
        let out = x.ok_or_else(|| Error::Model("no units".into()))?;
        self.loss_value(&out)
    }

    fn check_all<P: AsRef<[f32]>>(&self, params: &[P]) -> Result<()> {
        if params.len() != self.n_units() {
            return Err(Error::Model(format!(
                "expected parameters for {} units, got {}",
                self.n_units(),
                params.len()
            )));
        }
        for (u, p) in params.iter().enumerate() {
            self.check_params(u, p.as_ref())?;
        }
        Ok(())
    }

    /// Reference gradients: the whole model built as **one** candle autograd graph (no
    /// unit boundaries, no recomputation), differentiated once. Returns the mean loss
    /// and the flat gradient of every unit, in the same layout as the parameters.
    ///
    /// The engine does not need this; it is the ground truth that unit-by-unit
    /// [`UnitModel::backward`] with recomputation must reproduce.
    pub fn reference_grads<P: AsRef<[f32]>>(
        &self,
        params: &[P],
        batch: &Batch,
    ) -> Result<(f32, Vec<Vec<f32>>)> {
        self.check_all(params)?;
        let mut vars = Vec::with_capacity(params.len());
        let mut x: Option<Tensor> = None;
        for (u, p) in params.iter().enumerate() {
            let (kind, b, t) = self.check_call(u, p.as_ref(), x.as_ref(), batch)?;
            let pt = transformer::load(p.as_ref(), self.specs(kind), true)?;
            x = Some(self.run(kind, &pt, x.as_ref(), batch, b, t)?);
            vars.push(pt);
        }
        let loss = x.ok_or_else(|| Error::Model("no units".into()))?;
        let grads = loss.backward()?;
        let flat = vars
            .iter()
            .zip(&self.sizes)
            .map(|(pt, &n)| flatten_grads(&grads, pt, n))
            .collect::<Result<Vec<_>>>()?;
        Ok((self.loss_value(&loss)?, flat))
    }
}

/// Concatenates the gradients of `pt` (zeros for a tensor without one) into a flat
/// vector of length `n`.
fn flatten_grads(
    grads: &candle_core::backprop::GradStore,
    pt: &[Tensor],
    n: usize,
) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(n);
    for t in pt {
        match grads.get(t) {
            Some(g) => out.extend(g.flatten_all()?.to_vec1::<f32>()?),
            None => out.resize(out.len() + t.elem_count(), 0.0),
        }
    }
    if out.len() != n {
        return Err(Error::Model(format!(
            "internal: gradient has {} values, expected {n}",
            out.len()
        )));
    }
    Ok(out)
}

impl UnitModel for TinyLm {
    type Act = Tensor;

    /// `[V·D + S·D, (4D² + 2DF + 9D + F) × n_layers, 2D + D·V]`.
    fn unit_sizes(&self) -> Vec<usize> {
        self.sizes.clone()
    }

    /// `["embed", "block0", ..., "head"]`.
    fn unit_names(&self) -> Vec<String> {
        (0..self.n_units()).map(|u| self.unit_name(u)).collect()
    }

    /// GPT-2-style initial parameters of unit `u` (see the module documentation),
    /// deterministic in `(seed, u)` and the configuration. An empty vector for a unit
    /// that does not exist.
    fn init_unit(&self, u: usize, seed: u64) -> Vec<f32> {
        let Ok(kind) = self.kind(u) else {
            return Vec::new();
        };
        let mut rng = SplitMix64::new(mix64(seed) ^ mix64((u as u64).wrapping_add(0x5EED_0F17)));
        let mut out = Vec::with_capacity(self.sizes[u]);
        for s in self.specs(kind) {
            match s.init {
                ParamInit::Zeros => out.resize(out.len() + s.len, 0.0),
                ParamInit::Ones => out.resize(out.len() + s.len, 1.0),
                ParamInit::Normal(std) => {
                    let std = std as f64;
                    out.extend((0..s.len).map(|_| (rng.next_normal() * std) as f32));
                }
            }
        }
        out
    }

    /// Unit 0 reads `batch.tokens` and ignores `x`; blocks need `x: [batch, seq,
    /// d_model]`; the head also reads `batch.targets` and returns the 0-d mean loss.
    /// Errors on a wrong parameter count, a missing or mis-shaped `x`, an empty batch,
    /// `seq > cfg.seq`, token/target lists of the wrong length or with ids `>= vocab`.
    fn forward(
        &self,
        u: usize,
        params: &[f32],
        x: Option<&Tensor>,
        batch: &Batch,
    ) -> Result<Tensor> {
        let (kind, b, t) = self.check_call(u, params, x, batch)?;
        let p = transformer::load(params, self.specs(kind), false)?;
        self.run(kind, &p, x, batch, b, t)
    }

    /// The f32 value of a 0-d (or one-element) loss tensor.
    fn loss_value(&self, out: &Tensor) -> Result<f32> {
        if out.elem_count() != 1 {
            return Err(Error::Model(format!(
                "the loss must be a single value, got a tensor of shape {:?}",
                out.dims()
            )));
        }
        Ok(out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?[0])
    }

    /// Recomputes unit `u`'s forward with its parameters (and `x`) as candle `Var`s and
    /// back-propagates `sum(out * grad_out)` (for the head: the loss, times `grad_out`
    /// if one is given as a one-element tensor). Returns the gradient wrt `x` (`None`
    /// for unit 0; a tensor detached from the graph) and the flat parameter gradient in
    /// the parameter layout. `grad_out` must have the output's shape for non-head units.
    fn backward(
        &self,
        u: usize,
        params: &[f32],
        x: Option<&Tensor>,
        grad_out: Option<&Tensor>,
        batch: &Batch,
    ) -> Result<(Option<Tensor>, Vec<f32>)> {
        let (kind, b, t) = self.check_call(u, params, x, batch)?;
        let p = transformer::load(params, self.specs(kind), true)?;
        let xv = match (kind, x) {
            (UnitKind::Embed, _) | (_, None) => None,
            (_, Some(x)) => Some(candle_core::Var::from_tensor(x)?.as_tensor().clone()),
        };
        let out = self.run(kind, &p, xv.as_ref(), batch, b, t)?;
        let root = match (kind, grad_out) {
            (UnitKind::Head, None) => out,
            (UnitKind::Head, Some(g)) => {
                if g.elem_count() != 1 {
                    return Err(Error::Model(format!(
                        "grad_out of the head must be a single value, got shape {:?}",
                        g.dims()
                    )));
                }
                let g = g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?[0];
                out.affine(g as f64, 0.0)?
            }
            (_, None) => {
                return Err(Error::Model(format!(
                    "unit {u} ({}) needs grad_out (the gradient of its output)",
                    self.unit_name(u)
                )))
            }
            (_, Some(g)) => {
                transformer::check_act(g, b, t, self.cfg.d_model, "grad_out")?;
                (out * g)?.sum_all()?
            }
        };
        let grads = root.backward()?;
        let gx = match &xv {
            Some(xv) => Some(match grads.get(xv) {
                Some(g) => g.detach(),
                None => xv.zeros_like()?.detach(),
            }),
            None => None,
        };
        let gp = flatten_grads(&grads, &p, self.sizes[u])?;
        Ok((gx, gp))
    }
}
