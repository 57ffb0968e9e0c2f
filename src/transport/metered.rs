//! A transport that also counts what it sends in its own [`Traffic`] meter.
//!
//! Accounting per purpose (the engine's per-phase traffic: forward all-gather, gradient
//! reduce-scatter, ...) cannot come from the world's counters when phases overlap in
//! time. A metered communicator ([`crate::Comm::split_metered`]) is a new context over
//! some ranks whose every send, and every send of its sub-communicators (the level
//! communicators hierarchical algorithms split off it), is added to a meter shared by
//! the communicators of one purpose, besides the inner transport's own counters.
//!
//! On host transports the wrapper forwards point-to-point calls and uses the trait's
//! default (ring) collectives written over them, so every byte passes through
//! [`Metered::send`] and [`Metered::sendrecv`]. On GPU transports it forwards the device
//! face ([`Transport::gpu`]) too, so the device paths stay device paths, and counts each
//! device call's nominal ring traffic (the bytes NCCL's ring sends to the next rank,
//! the same figures the GPU transports report). Like the MPI transport's counters, a meter holds the sends of
//! the ranks of this process; [`crate::Comm::sum_traffic`] adds them up across
//! processes.

#![forbid(unsafe_code)]

use super::gpu::{DevCall, DeviceFace, GpuTransport, On};
use super::{Fold, P2p, Transport, TransportKind};
use crate::dtype::{DataType, ReduceOp};
use crate::error::Error;
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

    fn inner_gpu(&self) -> Result<&dyn GpuTransport> {
        self.inner
            .gpu()
            .ok_or_else(|| Error::Internal("metered device call on a host transport".into()))
    }

    /// Nominal ring traffic: `bytes` to the next rank (nothing on one rank).
    fn to_next(&self, bytes: usize) {
        let (r, p) = (self.inner.rank(), self.inner.size());
        if p > 1 {
            self.count((r + 1) % p, bytes);
        }
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
    fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
        let t = self.inner.group(members)?;
        Ok(Arc::new(Metered::new(t, self.meter.clone())))
    }
    fn survivors(&self) -> Result<Vec<usize>> {
        self.inner.survivors()
    }
    fn gpu(&self) -> Option<&dyn GpuTransport> {
        self.inner.gpu().map(|_| self as &dyn GpuTransport)
    }
    fn traffic(&self) -> Option<Arc<Traffic>> {
        self.inner.traffic()
    }
    fn abort(&self) {
        self.inner.abort()
    }
    fn failed(&self, e: &Error) {
        self.inner.failed(e)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
        self.inner.sum_traffic(m)
    }
}

impl P2p for Metered {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
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
    fn sendrecv_reduce(
        &self,
        dst: usize,
        send: &[u8],
        src: usize,
        fold: Fold<'_>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.inner
            .sendrecv_reduce(dst, send, src, fold, dtype, op)?;
        self.count(dst, send.len());
        Ok(())
    }
    fn exchange(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()> {
        self.inner.exchange(sends, recvs)?;
        sends.iter().for_each(|(p, d)| self.count(*p, d.len()));
        Ok(())
    }
}

/// The device face, forwarded; every call also counts its nominal ring traffic.
impl GpuTransport for Metered {
    fn face(&self) -> &DeviceFace {
        self.inner
            .gpu()
            .map(|g| g.face())
            .expect("gpu() is Some only over a GPU transport")
    }
    fn finish(&self, on: On<'_>, what: &str) -> Result<()> {
        self.inner_gpu()?.finish(on, what)
    }
    fn call(&self, on: On<'_>, c: DevCall) -> Result<()> {
        self.inner_gpu()?.call(on, c)?;
        let (r, p) = (self.inner.rank(), self.inner.size());
        match c {
            DevCall::AllGather { chunk, .. } => self.to_next(p.saturating_sub(1) * chunk),
            DevCall::ReduceScatter { recv, .. } => self.to_next(p.saturating_sub(1) * recv.len),
            DevCall::AllReduce { buf, .. } => self.to_next(2 * (p - 1) * buf.len / p.max(1)),
            DevCall::AllToAll { send, .. } => (0..p)
                .filter(|&j| j != r)
                .for_each(|j| self.count(j, send.len / p)),
            DevCall::Broadcast { buf, root } => {
                if (r + p - root) % p + 1 < p {
                    self.to_next(buf.len);
                }
            }
            DevCall::Send { peer, data } => self.count(peer, data.len),
            DevCall::Recv { .. } => {}
            DevCall::SendRecv { dst, send, .. } => self.count(dst, send.len),
        }
        Ok(())
    }
    fn group(&self, on: On<'_>, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.inner_gpu()?.group(on, body)
    }
}
