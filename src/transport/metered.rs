//! A transport that also counts what it sends in its own [`Traffic`] meter.
//!
//! Accounting per purpose (the engine's per-phase traffic: forward all-gather, gradient
//! reduce-scatter, ...) cannot come from the world's counters when phases overlap in
//! time. A metered communicator ([`crate::Comm::split_metered`]) is a new context over
//! some ranks whose every send, and every send of its sub-communicators (the level
//! communicators hierarchical algorithms split off it), is added to a meter shared by
//! the communicators of one purpose, besides the inner transport's own counters.
//!
//! The wrapper forwards point-to-point calls and uses the trait's default (ring)
//! collectives written over them, so every byte passes through [`Metered::send`] and
//! [`Metered::sendrecv`]. Like the MPI transport's counters, a meter holds the sends of
//! the ranks of this process; [`crate::Comm::sum_traffic`] adds them up across
//! processes.

use super::{Transport, TransportKind};
use crate::error::Result;
use crate::traffic::{Traffic, TrafficMatrix};
use std::sync::Arc;
use std::time::Duration;

/// `inner` with its sends also counted in `meter` (world ranks).
pub struct Metered {
    inner: Arc<dyn Transport>,
    meter: Arc<Traffic>,
}

impl Metered {
    /// Wrap `inner`; `meter` must be sized for the world (`Traffic::new(world topology)`).
    pub fn new(inner: Arc<dyn Transport>, meter: Arc<Traffic>) -> Metered {
        Metered { inner, meter }
    }

    fn count(&self, peer: usize, bytes: usize) {
        self.meter.record(
            self.inner.world_rank(self.inner.rank()),
            self.inner.world_rank(peer),
            bytes,
        );
    }
}

impl Transport for Metered {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn world_rank(&self, r: usize) -> usize {
        self.inner.world_rank(r)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>> {
        Ok(self
            .inner
            .split(color, key)?
            .map(|t| Arc::new(Metered::new(t, self.meter.clone())) as Arc<dyn Transport>))
    }
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.inner.send(peer, data)?;
        self.count(peer, data.len());
        Ok(())
    }
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
        self.inner.recv(peer, data)
    }
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
        self.inner.sendrecv(dst, send, src, recv)?;
        self.count(dst, send.len());
        Ok(())
    }
    fn traffic(&self) -> Option<Arc<Traffic>> {
        self.inner.traffic()
    }
    fn abort(&self) {
        self.inner.abort()
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
        self.inner.sum_traffic(m)
    }
}
