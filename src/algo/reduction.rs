//! What a reduce-scatter reduces on every rank: `count` elements of `dt` under `op`
//! (the argument the log-step, recursive-halving and hierarchical techniques pass on).

#![forbid(unsafe_code)]

use crate::dtype::{DataType, ReduceOp};

/// `count` elements of `dt` a rank, reduced with `op`.
#[derive(Debug, Clone, Copy)]
pub struct Reduction {
    /// Elements a rank receives.
    pub count: usize,
    /// Their type.
    pub dt: DataType,
    /// The operator (`Avg` sums where a technique says so).
    pub op: ReduceOp,
}

impl Reduction {
    /// `count` elements of `dt` under `op`.
    pub fn new(count: usize, dt: DataType, op: ReduceOp) -> Self {
        Reduction { count, dt, op }
    }
}
