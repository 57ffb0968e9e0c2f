//! Stream capture on the CPU device (`cudaStreamBeginCapture`): the graph a capture
//! records (operations and the nodes each runs after), the streams that joined it, and
//! the checks CUDA makes at its end. Generic over the recorded operation `T` and the
//! joined stream `L`, which the stream lanes ([`super::lanes`]) supply.

#![forbid(unsafe_code)]

use super::memory::dev_err;
use crate::error::{Error, Result};
use std::sync::{Mutex, MutexGuard};

/// A stream capture in progress: the recorded operations and their dependencies, the
/// streams that joined it.
pub(super) struct Capture<T, L> {
    /// The id of the stream that began it (only it ends it).
    pub(super) origin: u64,
    g: Mutex<CapGraph<T, L>>,
}

impl<T, L> std::fmt::Debug for Capture<T, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture(origin {})", self.origin)
    }
}

pub(super) struct CapGraph<T, L> {
    nodes: Vec<Node<T>>,
    /// Why the capture is invalid (as a CUDA capture invalidated by an illegal call).
    failed: Option<Error>,
    pub(super) joined: Vec<L>,
}

/// One recorded operation and the nodes it runs after.
#[derive(Clone)]
pub(super) struct Node<T> {
    pub(super) task: T,
    deps: Vec<usize>,
}

impl<T: Clone, L> Capture<T, L> {
    /// An empty capture begun by stream `origin`.
    pub(super) fn new(origin: u64) -> Self {
        Capture {
            origin,
            g: Mutex::new(CapGraph {
                nodes: Vec::new(),
                failed: None,
                joined: Vec::new(),
            }),
        }
    }

    pub(super) fn lock(&self) -> Result<MutexGuard<'_, CapGraph<T, L>>> {
        self.g
            .lock()
            .map_err(|_| Error::Internal("cpu capture poisoned".into()))
    }

    /// Invalidate the capture with `msg` (the first reason sticks); the error to return.
    pub(super) fn fail(&self, msg: String) -> Error {
        let e = dev_err(msg);
        if let Ok(mut g) = self.lock() {
            g.failed.get_or_insert(e.clone());
        }
        e
    }

    /// Record `task` after the nodes `deps`: its node.
    pub(super) fn add(&self, task: T, deps: Vec<usize>) -> Result<usize> {
        let mut g = self.lock()?;
        g.nodes.push(Node { task, deps });
        Ok(g.nodes.len() - 1)
    }

    /// The graph of a capture that ended with the origin's frontier `front`, after
    /// CUDA's checks: not invalidated, and everything a joined stream recorded (`fronts`:
    /// each stream's id and frontier) an ancestor of the origin's end
    /// (`cudaErrorStreamCaptureUnjoined`).
    pub(super) fn graph(
        &self,
        front: Vec<usize>,
        fronts: &[(u64, Vec<usize>)],
    ) -> Result<Vec<Node<T>>> {
        let g = self.lock()?;
        if let Some(e) = &g.failed {
            return Err(dev_err(format!("the capture was invalidated: {e}")));
        }
        let mut seen = vec![false; g.nodes.len()];
        let mut stack = front;
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                stack.extend(g.nodes[i].deps.iter().copied());
            }
        }
        if let Some((id, _)) = fronts.iter().find(|(_, f)| f.iter().any(|&i| !seen[i])) {
            return Err(dev_err(format!(
                "end_capture: stream {id} joined the capture and was not joined back \
                 (unjoined work)"
            )));
        }
        Ok(g.nodes.clone())
    }
}
