//! The point-to-point face of a transport, [`P2p`]: what the ring algorithms
//! ([`super::ring`]) are written against. [`P2p`] is a supertrait of
//! [`Transport`](super::Transport), so the ring runs on any transport, generic or `dyn`,
//! with no allocation or indirection of its own; and the transports' default collectives
//! can call the ring without the ring knowing the [`Transport`](super::Transport) trait.

#![forbid(unsafe_code)]

use super::scratch::with_scratch;
use crate::dtype::{reduce_into, reduce_pair, DataType, ReduceOp};
use crate::error::Result;

/// Where [`P2p::sendrecv_reduce`] puts the reduction of the bytes it receives.
/// The operand order is fixed because `Max`/`Min` treat a NaN operand asymmetrically.
#[derive(Debug)]
pub enum Fold<'a> {
    /// `out[i] = op(incoming[i], local[i])`.
    Pair {
        /// Where the result goes (the received message's length).
        out: &'a mut [u8],
        /// This rank's operand.
        local: &'a [u8],
    },
    /// `acc[i] = op(acc[i], incoming[i])`, in place.
    Into(&'a mut [u8]),
    /// `out[i] = op(local[i], incoming[i])`: [`Fold::Into`] with the operand elsewhere
    /// (so an out-of-place call gives the in-place call's bytes).
    After {
        /// Where the result goes (the received message's length).
        out: &'a mut [u8],
        /// This rank's operand.
        local: &'a [u8],
    },
}

/// Blocking point-to-point calls among the `size()` ranks of one communicator: the
/// face of a transport that the ring algorithms need. Every
/// [`Transport`](super::Transport) is one (it is the supertrait), and each transport
/// implements these calls in its own `impl P2p` block; a caller of them on a transport
/// imports this trait.
pub trait P2p {
    /// This rank within the communicator.
    fn rank(&self) -> usize;
    /// Ranks in the communicator.
    fn size(&self) -> usize;
    /// Send `data` to `peer` (may return before the peer receives).
    fn send(&self, peer: usize, data: &[u8]) -> Result<()>;
    /// Receive exactly `data.len()` bytes from `peer`; a message of another length is an
    /// [`Error::InvalidUsage`](crate::error::Error::InvalidUsage) (mismatched counts
    /// across ranks).
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()>;
    /// Send to `dst` and receive from `src` at once.
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
        self.send(dst, send)?;
        self.recv(src, recv)
    }
    /// [`P2p::sendrecv`] whose received bytes are reduced (`op`, never `Avg`) as `fold`
    /// says instead of stored: the ring reduce-scatter's step. Default: receive into the
    /// output (or scratch), then reduce; a transport that can reduce straight from the
    /// wire or the peer's memory (`local`) does it in one pass.
    fn sendrecv_reduce(
        &self,
        dst: usize,
        send: &[u8],
        src: usize,
        fold: Fold<'_>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        match fold {
            Fold::Pair { out, local } => {
                self.sendrecv(dst, send, src, out)?;
                reduce_into(out, local, dtype, op);
            }
            Fold::Into(acc) => with_scratch(acc.len(), |tmp| {
                self.sendrecv(dst, send, src, tmp)?;
                reduce_into(acc, tmp, dtype, op);
                Ok(())
            })?,
            Fold::After { out, local } => with_scratch(out.len(), |tmp| {
                self.sendrecv(dst, send, src, tmp)?;
                reduce_pair(out, local, tmp, dtype, op);
                Ok(())
            })?,
        }
        Ok(())
    }
    /// Point-to-point transfers in flight together (a group's sends and receives): a
    /// ring or all-to-all exchange of any size cannot deadlock, and messages to one peer
    /// keep their order. Default, right for eager transports whose sends never wait for
    /// the receiver: every send, then every receive.
    fn exchange(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()> {
        for (peer, data) in sends {
            self.send(*peer, data)?;
        }
        for (peer, data) in recvs.iter_mut() {
            self.recv(*peer, data)?;
        }
        Ok(())
    }
}
