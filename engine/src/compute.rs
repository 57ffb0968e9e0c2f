//! The compute the engine drives, one unit at a time.
//!
//! A model is a chain of units (a layer or a module group) whose parameters the engine
//! owns as one flat f32 vector per unit. The engine gathers a unit's parameters, calls
//! [`UnitModel::forward`], and releases them; in the backward pass it gathers them
//! again and calls [`UnitModel::backward`], which recomputes the unit's forward from its
//! saved input (activation checkpointing at unit boundaries, AMSP §V-C Fig. 9(c)) and
//! returns the gradients of the unit's input and of its parameters. The engine never
//! looks inside an activation: it only keeps each unit's input until that unit's
//! backward has run.

use crate::error::Result;

/// One micro-batch for one rank: `batch` sequences of `seq` tokens, row-major, and the
/// next-token targets at the same positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub targets: Vec<u32>,
    pub batch: usize,
    pub seq: usize,
}

/// A model split into units for sharded execution.
///
/// Contract: unit 0 reads the batch's tokens (its input `x` is `None`); the last unit
/// returns the micro-batch's mean loss as its output (a scalar activation); every
/// method is deterministic given its arguments (the loss-curve comparison across
/// strategies relies on it).
pub trait UnitModel: Send + Sync {
    /// What flows between units (a tensor).
    type Act: Clone + Send;
    /// Parameter count of each unit, in forward order.
    fn unit_sizes(&self) -> Vec<usize>;
    /// Short name of each unit (`embed`, `block0`, ..., `head`), for reports.
    fn unit_names(&self) -> Vec<String>;
    /// Initial flat parameters of unit `u`, deterministic in `seed`.
    fn init_unit(&self, u: usize, seed: u64) -> Vec<f32>;
    /// Forward of unit `u` with its flat parameters `params` on input `x` (`None` for
    /// unit 0). The last unit returns the scalar mean loss over the batch's tokens.
    fn forward(
        &self,
        u: usize,
        params: &[f32],
        x: Option<&Self::Act>,
        batch: &Batch,
    ) -> Result<Self::Act>;
    /// The loss value of the last unit's output.
    fn loss_value(&self, out: &Self::Act) -> Result<f32>;
    /// Backward of unit `u` with recomputation: runs the unit's forward again from `x`
    /// and back-propagates `grad_out` (the gradient of the loss with respect to the
    /// unit's output; `None` for the last unit, whose output is the loss). Returns the
    /// gradient with respect to `x` (`None` for unit 0) and the flat gradient of the
    /// unit's parameters (same length and order as `params`).
    fn backward(
        &self,
        u: usize,
        params: &[f32],
        x: Option<&Self::Act>,
        grad_out: Option<&Self::Act>,
        batch: &Batch,
    ) -> Result<(Option<Self::Act>, Vec<f32>)>;
}
