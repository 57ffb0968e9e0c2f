//! Model shapes: parameter counts, the units the runtime gathers one at a time, and the
//! numbers the activation formula needs.
//!
//! Units follow AMSP §IV-C1 (`T_p = M·L·Σ_{i=0..K} (2·t(AG, 2Φ_i, s_p) + t(RS, 2Φ_i, s_p))`,
//! "at the granularity of a module within a Transformer layer"): every layer is two
//! units, the attention module (with its norm) and the MLP module (with its norm), plus
//! the embedding unit first and the head unit (final norm, pooler, untied output
//! projection) last. Units run in sequence (forward: embed, attn0, mlp0, ..., head).
//!
//! Parameter counts (h = hidden, f = ffn, V = vocab, n = norm parameters per norm:
//! h for RMSNorm, 2h for LayerNorm):
//! - embedding: `V·h + positions·h + token_types·h (+ n with an embedding norm)`;
//! - attention: `4h² (+ 4h biases) + n`;
//! - MLP: `2h·f` (GeLU) or `3h·f` (gated SwiGLU: gate, up, down) `(+ f + h biases) + n`;
//! - head: `n` (final norm, pre-norm models) `+ h² + h` (BERT pooler) `+ V·h` (untied
//!   output projection).
//!
//! Presets use the published shapes: LLaMA (Touvron et al. 2023, Table 2: 7B 32 layers
//! 4096 hidden 32 heads, 13B 40/5120/40, 33B "30B" 60/6656/52, 65B 80/8192/64; SwiGLU
//! with ffn = 11008, 13824, 17920, 22016; RMSNorm; vocab 32000; untied; rotary),
//! GPT-NeoX-20B (Black et al. 2022: 44 layers, 6144 hidden, 64 heads, ffn 4h, vocab
//! 50432 padded, LayerNorm, biases, rotary, untied), BERT base / large (Devlin et al.
//! 2019: 12/768/12 and 24/1024/16, ffn 4h, vocab 30522, 512 learned positions, 2 token
//! types, post-LayerNorm, pooler, tied output). Counts come out at 6.74 B, 13.0 B,
//! 32.5 B, 65.3 B, 20.6 B, 110 M and 335 M (`tests/planner.rs` checks them).

use crate::error::{config_err, Result};
use serde::{Deserialize, Serialize};

/// Normalization layer (its parameters per norm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Norm {
    /// RMSNorm: a scale per hidden unit (`h` parameters).
    RmsNorm,
    /// LayerNorm: scale and bias (`2h` parameters).
    LayerNorm,
}

/// What a unit is (for reports and for the activation formula).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitKind {
    Embed,
    Attention,
    Mlp,
    Head,
}

/// One unit the runtime gathers, computes and reduces as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    pub name: String,
    pub kind: UnitKind,
    pub params: u64,
}

/// A transformer's shape (decoder-only or encoder; see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub name: String,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// MLP inner width.
    pub ffn: usize,
    pub vocab: usize,
    /// Learned position embeddings (0: rotary / none).
    pub positions: usize,
    /// Token-type embeddings (BERT: 2).
    pub token_types: usize,
    pub norm: Norm,
    /// Gated MLP (SwiGLU: three `h·f` matrices) instead of two.
    pub gated_mlp: bool,
    /// Biases on the linear layers.
    pub biases: bool,
    /// A norm after the embedding (BERT).
    pub embed_norm: bool,
    /// A norm before the head (pre-norm models).
    pub final_norm: bool,
    /// A pooler `h x h` dense layer in the head (BERT).
    pub pooler: bool,
    /// Output projection tied to the embedding (no separate `V·h` matrix).
    pub tied_embeddings: bool,
    /// Dropout layers (their 1-byte masks count in the activation formula).
    pub dropout: bool,
}

/// Largest parameter count planned (2^50): byte counts and schedules stay far from
/// overflow.
pub const MAX_PARAMS: u64 = 1 << 50;

/// Preset names, for messages.
pub const MODEL_PRESETS: &[&str] = &[
    "llama-7b",
    "llama-13b",
    "llama-30b",
    "llama-65b",
    "gpt-neox-20b",
    "bert-base",
    "bert-large",
];

impl ModelShape {
    fn llama(name: &str, layers: usize, hidden: usize, heads: usize, ffn: usize) -> ModelShape {
        ModelShape {
            name: name.to_string(),
            layers,
            hidden,
            heads,
            ffn,
            vocab: 32000,
            positions: 0,
            token_types: 0,
            norm: Norm::RmsNorm,
            gated_mlp: true,
            biases: false,
            embed_norm: false,
            final_norm: true,
            pooler: false,
            tied_embeddings: false,
            dropout: false,
        }
    }

    fn bert(name: &str, layers: usize, hidden: usize, heads: usize) -> ModelShape {
        ModelShape {
            name: name.to_string(),
            layers,
            hidden,
            heads,
            ffn: 4 * hidden,
            vocab: 30522,
            positions: 512,
            token_types: 2,
            norm: Norm::LayerNorm,
            gated_mlp: false,
            biases: true,
            embed_norm: true,
            final_norm: false,
            pooler: true,
            tied_embeddings: true,
            dropout: true,
        }
    }

    /// A preset by name (case-insensitive; `llama-33b` is `llama-30b`).
    pub fn preset(name: &str) -> Result<ModelShape> {
        let n = name.trim().to_ascii_lowercase();
        Ok(match n.as_str() {
            "llama-7b" => ModelShape::llama("llama-7b", 32, 4096, 32, 11008),
            "llama-13b" => ModelShape::llama("llama-13b", 40, 5120, 40, 13824),
            "llama-30b" | "llama-33b" => ModelShape::llama("llama-30b", 60, 6656, 52, 17920),
            "llama-65b" => ModelShape::llama("llama-65b", 80, 8192, 64, 22016),
            "gpt-neox-20b" | "neox-20b" => ModelShape {
                name: "gpt-neox-20b".into(),
                layers: 44,
                hidden: 6144,
                heads: 64,
                ffn: 4 * 6144,
                vocab: 50432,
                positions: 0,
                token_types: 0,
                norm: Norm::LayerNorm,
                gated_mlp: false,
                biases: true,
                embed_norm: false,
                final_norm: true,
                pooler: false,
                tied_embeddings: false,
                dropout: false,
            },
            "bert-base" => ModelShape::bert("bert-base", 12, 768, 12),
            "bert-large" => ModelShape::bert("bert-large", 24, 1024, 16),
            _ => {
                return config_err!(
                    "unknown model '{name}'; presets: {} (or give --layers, --hidden, --heads, --ffn, --vocab)",
                    MODEL_PRESETS.join(", ")
                )
            }
        })
    }

    /// A custom decoder-only shape in the LLaMA style (RMSNorm, no biases, untied, no
    /// dropout); `gated_mlp` when the MLP is SwiGLU. `ffn` 0 means `4·hidden`.
    pub fn custom(
        layers: usize,
        hidden: usize,
        heads: usize,
        ffn: usize,
        vocab: usize,
        gated_mlp: bool,
    ) -> Result<ModelShape> {
        let mut m = ModelShape::llama("custom", layers, hidden, heads, ffn);
        if ffn == 0 {
            m.ffn = 4 * hidden;
        }
        m.vocab = vocab;
        m.gated_mlp = gated_mlp;
        m.validate()?;
        Ok(m)
    }

    /// Sizes >= 1, heads dividing hidden, and at most [`MAX_PARAMS`] parameters.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
        ] {
            if v == 0 {
                return config_err!("model {}: {what} must be >= 1", self.name);
            }
        }
        if self.hidden % self.heads != 0 {
            return config_err!(
                "model {}: {} heads do not divide hidden size {}",
                self.name,
                self.heads,
                self.hidden
            );
        }
        match self.checked_params() {
            Some(p) if p <= MAX_PARAMS => {}
            _ => {
                return config_err!(
                    "model {}: more than 2^50 parameters, too large to plan",
                    self.name
                )
            }
        }
        Ok(())
    }

    fn norm_params(&self) -> u64 {
        match self.norm {
            Norm::RmsNorm => self.hidden as u64,
            Norm::LayerNorm => 2 * self.hidden as u64,
        }
    }

    fn checked_units(&self) -> Option<Vec<Unit>> {
        let (h, f, v) = (self.hidden as u64, self.ffn as u64, self.vocab as u64);
        let n = self.norm_params();
        let b = u64::from(self.biases);
        let embed = v
            .checked_mul(h)?
            .checked_add((self.positions as u64 + self.token_types as u64).checked_mul(h)?)?
            .checked_add(if self.embed_norm { n } else { 0 })?;
        let attn = h
            .checked_mul(h)?
            .checked_mul(4)?
            .checked_add(4 * h * b + n)?;
        let mats = if self.gated_mlp { 3 } else { 2 };
        let mlp = h
            .checked_mul(f)?
            .checked_mul(mats)?
            .checked_add((f + h) * b + n)?;
        let mut head = if self.final_norm { n } else { 0 };
        if self.pooler {
            head = head.checked_add(h.checked_mul(h)?.checked_add(h)?)?;
        }
        if !self.tied_embeddings {
            head = head.checked_add(v.checked_mul(h)?)?;
        }
        let mut units = Vec::with_capacity(2 * self.layers + 2);
        units.push(Unit {
            name: "embed".into(),
            kind: UnitKind::Embed,
            params: embed,
        });
        for l in 0..self.layers {
            units.push(Unit {
                name: format!("attn{l}"),
                kind: UnitKind::Attention,
                params: attn,
            });
            units.push(Unit {
                name: format!("mlp{l}"),
                kind: UnitKind::Mlp,
                params: mlp,
            });
        }
        units.push(Unit {
            name: "head".into(),
            kind: UnitKind::Head,
            params: head,
        });
        // The total must fit as well.
        units
            .iter()
            .try_fold(0u64, |a, u| a.checked_add(u.params))?;
        Some(units)
    }

    fn checked_params(&self) -> Option<u64> {
        self.checked_units()?
            .iter()
            .try_fold(0u64, |a, u| a.checked_add(u.params))
    }

    /// The units in execution order (module doc). Empty for an invalid shape.
    pub fn units(&self) -> Vec<Unit> {
        self.checked_units().unwrap_or_default()
    }

    /// Distinct unit sizes with their multiplicity, largest first: what the
    /// communication model needs (every unit of one size costs the same).
    pub fn unit_sizes(&self) -> Vec<(u64, usize)> {
        let mut m: std::collections::BTreeMap<u64, usize> = Default::default();
        for u in self.units() {
            if u.params > 0 {
                *m.entry(u.params).or_default() += 1;
            }
        }
        m.into_iter().rev().collect()
    }

    /// Largest unit (parameters).
    pub fn max_unit(&self) -> u64 {
        self.units().iter().map(|u| u.params).max().unwrap_or(0)
    }

    /// Parameters Φ (0 for an invalid shape).
    pub fn params(&self) -> u64 {
        self.checked_params().unwrap_or(0)
    }

    /// One line: `llama-7b: 6.74 B params, 32 layers, hidden 4096, 32 heads, ffn 11008, vocab 32000`.
    pub fn summary(&self) -> String {
        let p = self.params() as f64;
        let size = if p >= 1e9 {
            format!("{:.2} B", p / 1e9)
        } else {
            format!("{:.1} M", p / 1e6)
        };
        format!(
            "{}: {size} params, {} layers, hidden {}, {} heads, ffn {}{}, vocab {}",
            self.name,
            self.layers,
            self.hidden,
            self.heads,
            self.ffn,
            if self.gated_mlp { " (gated)" } else { "" },
            self.vocab
        )
    }
}
