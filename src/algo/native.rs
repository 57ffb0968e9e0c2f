//! `ring`: the flat baseline, the request as one native op of the transport.

#![forbid(unsafe_code)]

use super::shape::{Algorithm, Shape};
use super::Algo;
use crate::error::Result;
use crate::runtime::{CommCore, Request};

/// The ring / native baseline: the request as one native op.
pub struct Native;

impl Algorithm for Native {
    fn algo(&self) -> Algo {
        Algo::Ring
    }
    fn unsupported(&self, _: &Shape) -> Option<String> {
        None
    }
    fn run(&self, core: &CommCore, req: &Request) -> Result<()> {
        if core.on_stream() {
            // Already in this communicator's stream order: run it here.
            return core.run_ops(std::slice::from_ref(&req.op), req.dtype);
        }
        core.enqueue(req.op.clone(), req.dtype, Vec::new()).wait()
    }
}
