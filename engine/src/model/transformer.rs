//! The transformer's tensor math on candle's CPU device, one unit at a time.
//!
//! Every function here works on plain [`Tensor`]s; whether a parameter is a
//! [`candle_core::Var`] (backward pass) or a constant (forward pass) is decided by the
//! caller in [`super`]. Only ops with a backward rule in candle 0.9 are used (matmul,
//! broadcast add/sub/mul/div, exp, log, sqr, sqrt, recip, affine, sum/mean/max
//! reductions, reshape/permute/transpose/narrow/contiguous, index_select, gather and
//! the tanh-approximation GELU); LayerNorm, softmax and cross-entropy are composed from
//! them. The maximum subtracted for numerical stability in softmax and cross-entropy is
//! detached (softmax is shift-invariant, so its exact gradient through the shift is 0).
//!
//! Linear layers store their weight as `[in, out]` (GPT-2 "Conv1D" layout), so a layer
//! is `x.matmul(w) + b` with no transpose.

use candle_core::{DType, Device, Tensor, D};

use crate::error::{Error, Result};

/// LayerNorm epsilon (as in GPT-2).
pub const LN_EPS: f64 = 1e-5;

/// How a parameter tensor is initialized by [`super::TinyLm`]'s `init_unit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamInit {
    /// Independent normal samples with mean 0 and this standard deviation.
    Normal(f32),
    /// All zeros (biases, LayerNorm bias).
    Zeros,
    /// All ones (LayerNorm weight).
    Ones,
}

/// One tensor inside a unit's flat parameter vector.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Dotted name, e.g. `wte`, `ln1.weight`, `attn.qkv.weight`.
    pub name: &'static str,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Offset of the tensor's first element in the unit's flat vector.
    pub offset: usize,
    /// Number of elements (product of `shape`).
    pub len: usize,
    /// Initialization rule.
    pub init: ParamInit,
}

/// The unit kinds of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitKind {
    Embed,
    Block(usize),
    Head,
}

/// Model dimensions the math needs (validated by `TinyLm::new`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub vocab: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub d_ff: usize,
    pub seq: usize,
}

/// GPT-2 initialization standard deviation.
const STD: f32 = 0.02;

/// The ordered list of tensors of a unit, with offsets. `None` if a size overflows.
pub(crate) fn layout(d: &Dims, kind: UnitKind) -> Option<Vec<ParamSpec>> {
    let (dm, ff, v) = (d.d_model, d.d_ff, d.vocab);
    // GPT-2 scales the init of the projections that write into the residual stream.
    let resid_std = (STD as f64 / (2.0 * d.n_layers.max(1) as f64).sqrt()) as f32;
    let list: Vec<(&'static str, Vec<usize>, ParamInit)> = match kind {
        UnitKind::Embed => vec![
            ("wte", vec![v, dm], ParamInit::Normal(STD)),
            ("wpe", vec![d.seq, dm], ParamInit::Normal(STD)),
        ],
        UnitKind::Block(_) => vec![
            ("ln1.weight", vec![dm], ParamInit::Ones),
            ("ln1.bias", vec![dm], ParamInit::Zeros),
            (
                "attn.qkv.weight",
                vec![dm, 3usize.checked_mul(dm)?],
                ParamInit::Normal(STD),
            ),
            (
                "attn.qkv.bias",
                vec![3usize.checked_mul(dm)?],
                ParamInit::Zeros,
            ),
            (
                "attn.proj.weight",
                vec![dm, dm],
                ParamInit::Normal(resid_std),
            ),
            ("attn.proj.bias", vec![dm], ParamInit::Zeros),
            ("ln2.weight", vec![dm], ParamInit::Ones),
            ("ln2.bias", vec![dm], ParamInit::Zeros),
            ("mlp.fc.weight", vec![dm, ff], ParamInit::Normal(STD)),
            ("mlp.fc.bias", vec![ff], ParamInit::Zeros),
            (
                "mlp.proj.weight",
                vec![ff, dm],
                ParamInit::Normal(resid_std),
            ),
            ("mlp.proj.bias", vec![dm], ParamInit::Zeros),
        ],
        UnitKind::Head => vec![
            ("ln_f.weight", vec![dm], ParamInit::Ones),
            ("ln_f.bias", vec![dm], ParamInit::Zeros),
            ("lm_head.weight", vec![dm, v], ParamInit::Normal(STD)),
        ],
    };
    let mut offset = 0usize;
    let mut out = Vec::with_capacity(list.len());
    for (name, shape, init) in list {
        let len = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b))?;
        out.push(ParamSpec {
            name,
            shape,
            offset,
            len,
            init,
        });
        offset = offset.checked_add(len)?;
    }
    Some(out)
}

/// Builds the unit's parameter tensors from its flat slice. With `track`, every tensor
/// is a fresh [`candle_core::Var`] (its gradient can be read back from the
/// `GradStore` with the returned tensor, which shares the variable's id).
pub(crate) fn load(params: &[f32], specs: &[ParamSpec], track: bool) -> Result<Vec<Tensor>> {
    let dev = Device::Cpu;
    specs
        .iter()
        .map(|s| {
            let slice = params.get(s.offset..s.offset + s.len).ok_or_else(|| {
                Error::Model(format!(
                    "parameter {} [{}..{}) is outside the unit's {} values",
                    s.name,
                    s.offset,
                    s.offset + s.len,
                    params.len()
                ))
            })?;
            let t = if track {
                candle_core::Var::from_slice(slice, s.shape.as_slice(), &dev)?
                    .as_tensor()
                    .clone()
            } else {
                Tensor::from_slice(slice, s.shape.as_slice(), &dev)?
            };
            Ok(t)
        })
        .collect()
}

/// The causal mask `[seq, seq]`: 0 on and below the diagonal, -inf above.
pub(crate) fn causal_mask(seq: usize) -> Result<Tensor> {
    let mut m = vec![0f32; seq * seq];
    for i in 0..seq {
        for j in (i + 1)..seq {
            m[i * seq + j] = f32::NEG_INFINITY;
        }
    }
    Ok(Tensor::from_vec(m, (seq, seq), &Device::Cpu)?)
}

/// `x.matmul(w) + b` for `x: [n, in]`, `w: [in, out]`, `b: [out]`.
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(w)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// LayerNorm over the last dimension of `x: [n, d]` with weight and bias `[d]`
/// (biased variance, epsilon [`LN_EPS`] inside the square root).
fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let rstd = (var + LN_EPS)?.sqrt()?.recip()?;
    Ok(xc
        .broadcast_mul(&rstd)?
        .broadcast_mul(w)?
        .broadcast_add(b)?)
}

/// Softmax over the last dimension.
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Unit 0: `wte[tokens] + wpe[0..T]`, shape `[B, T, d_model]`.
/// `p = [wte, wpe]`; `tokens`: u32 `[B*T]` (already validated `< vocab`).
pub(crate) fn embed(p: &[Tensor], tokens: &Tensor, b: usize, t: usize) -> Result<Tensor> {
    let (wte, wpe) = (&p[0], &p[1]);
    let dm = wte.dim(1)?;
    let tok = wte.index_select(tokens, 0)?.reshape((b, t, dm))?;
    let pos = wpe.narrow(0, 0, t)?;
    Ok(tok.broadcast_add(&pos)?)
}

/// A pre-LN transformer block on `x: [B, T, d_model]`:
/// `x += proj(attn(ln1(x)))`, then `x += mlp(ln2(x))` with `mlp = fc -> GELU -> proj`.
/// `mask` is the `[seq, seq]` causal mask (narrowed to `T`).
pub(crate) fn block(p: &[Tensor], x: &Tensor, mask: &Tensor, n_heads: usize) -> Result<Tensor> {
    let (b, t, dm) = x.dims3()?;
    let hd = dm / n_heads;
    let x2 = x.reshape((b * t, dm))?;

    // Causal multi-head self-attention.
    let h = layer_norm(&x2, &p[0], &p[1])?;
    let qkv = linear(&h, &p[2], Some(&p[3]))?; // [B*T, 3*dm]
    let qkv = qkv
        .reshape((b, t, 3, n_heads, hd))?
        .permute((2, 0, 3, 1, 4))? // [3, B, H, T, hd]
        .contiguous()?;
    let q = qkv.get(0)?.reshape((b * n_heads, t, hd))?;
    let k = qkv.get(1)?.reshape((b * n_heads, t, hd))?;
    let v = qkv.get(2)?.reshape((b * n_heads, t, hd))?;
    let scale = 1.0 / (hd as f64).sqrt();
    let att = q.matmul(&k.t()?)?.affine(scale, 0.0)?; // [B*H, T, T]
    let mask = mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
    let att = softmax_last(&att.broadcast_add(&mask)?)?;
    let y = att.matmul(&v)?; // [B*H, T, hd]
    let y = y
        .reshape((b, n_heads, t, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b * t, dm))?;
    let y = linear(&y, &p[4], Some(&p[5]))?;
    let x2 = (x2 + y)?;

    // MLP.
    let h = layer_norm(&x2, &p[6], &p[7])?;
    let h = linear(&h, &p[8], Some(&p[9]))?.gelu()?;
    let h = linear(&h, &p[10], Some(&p[11]))?;
    Ok((x2 + h)?.reshape((b, t, dm))?)
}

/// The last unit: final LayerNorm, LM head (no bias) and the mean cross-entropy over
/// all `B*T` positions. `targets`: u32 `[B*T, 1]` (already validated `< vocab`).
/// Returns a 0-d f32 tensor.
pub(crate) fn head(p: &[Tensor], x: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (b, t, dm) = x.dims3()?;
    let x2 = x.reshape((b * t, dm))?;
    let h = layer_norm(&x2, &p[0], &p[1])?;
    let logits = linear(&h, &p[2], None)?; // [B*T, V]
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?; // [B*T, 1]
    let picked = shifted.gather(targets, 1)?; // [B*T, 1]
    Ok((lse - picked)?.mean_all()?)
}

/// A u32 tensor of shape `shape` from `data`.
pub(crate) fn ids(data: &[u32], shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_slice(data, shape, &Device::Cpu)?)
}

/// Checks that `x` is an f32 `[b, t, d]` tensor.
pub(crate) fn check_act(x: &Tensor, b: usize, t: usize, d: usize, what: &str) -> Result<()> {
    if x.dtype() != DType::F32 {
        return Err(Error::Model(format!(
            "{what} must be f32, got {:?}",
            x.dtype()
        )));
    }
    if x.dims() != [b, t, d] {
        return Err(Error::Model(format!(
            "{what} has shape {:?}, expected [batch {b}, seq {t}, d_model {d}]",
            x.dims()
        )));
    }
    Ok(())
}
