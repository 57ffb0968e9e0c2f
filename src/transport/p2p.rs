//! The point-to-point face of a transport, [`P2p`]: what the ring algorithms
//! ([`super::ring`]) are written against. Every [`Transport`](super::Transport) is a
//! [`P2p`] (a blanket impl in `mod.rs` forwards to its methods), so the ring runs on any
//! transport, generic or `dyn`, with no allocation or indirection of its own; and the
//! transports' default collectives can call the ring without the ring knowing the
//! [`Transport`](super::Transport) trait.

#![forbid(unsafe_code)]

use crate::dtype::{DataType, ReduceOp};
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
/// methods of the same names of [`Transport`](super::Transport), which implements this
/// trait for every transport (so no transport implements it by hand). Import it only
/// where `Transport` is not in scope: with both, a call such as `t.rank()` on a concrete
/// transport is ambiguous.
pub trait P2p {
    /// This rank within the communicator.
    fn rank(&self) -> usize;
    /// Ranks in the communicator.
    fn size(&self) -> usize;
    /// Send `data` to `peer` (may return before the peer receives).
    fn send(&self, peer: usize, data: &[u8]) -> Result<()>;
    /// Receive exactly `data.len()` bytes from `peer`.
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()>;
    /// Send to `dst` and receive from `src` at once.
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()>;
    /// [`P2p::sendrecv`] whose received bytes are reduced (`op`, never `Avg`) as `fold`
    /// says instead of stored.
    fn sendrecv_reduce(
        &self,
        dst: usize,
        send: &[u8],
        src: usize,
        fold: Fold<'_>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Point-to-point transfers in flight together; messages to one peer keep their
    /// order.
    fn exchange(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()>;
}
