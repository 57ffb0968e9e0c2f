//! Traffic counters (`strataCommGetTraffic`): the bytes strata's own transfers sent, by
//! link class of the world topology ([`Comm::traffic_report`](crate::Comm::traffic_report)).

use super::abi::*;
use super::boundary::{ffi_boundary, write_out};
use super::registry::lookup;
use crate::error::Error;
use std::ffi::c_int;

/// Bytes sent, by link class of the world topology (`STRATA_TOPOLOGY` or detection),
/// as counted by strata (`strataCommGetTraffic`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct strataTraffic_t {
    /// Between the two dies of one package (Frontier's GCD pairs).
    pub intra_package: u64,
    /// Between packages of one node.
    pub intra_node: u64,
    /// Between nodes.
    pub inter_node: u64,
    /// The most bytes the counted senders sent out of any one node.
    pub max_node_egress: u64,
    /// 1: every transfer the transport made (local, host-local, cuda-local); 0: nominal,
    /// the sends strata's own algorithms issued (mpi; MPI may route them differently, and
    /// calls with `algo=mpi` are not counted).
    pub measured: c_int,
}

/// Writes to `*traffic` the bytes strata sent since `comm`'s world was created: this
/// rank's sends (`allMembers == 0`; not collective) or the sends of every rank of `comm`
/// (`allMembers != 0`; collective over `comm`: every rank calls it, after its queued
/// work; the reading falls after every member's earlier calls and before any member's
/// later ones; on mpi it sums the members' counters). Counters belong to the world, so the
/// figures include every communicator of the world the counted ranks sent on: subtract
/// two readings to get what ran in between. Communicators of one world share one
/// topology, so a sub-communicator's inter-node bytes are the world's classification
/// (MiCS §3.3: a hierarchical all-gather of M bytes over p ranks, k per node, sends
/// (p-k)/p·M out of each node).
///
/// Errors: `strataInvalidArgument` for a NULL/foreign `comm` or NULL `traffic`;
/// `strataInvalidUsage` for a destroyed `comm` and on nccl/rccl (NCCL moves the bytes;
/// strata counts none); `strataRemoteError` when a member does not join the collective
/// form within the timeout.
///
/// # Safety
/// `traffic` is NULL or valid for a write of a `strataTraffic_t`.
#[no_mangle]
pub unsafe extern "C" fn strataCommGetTraffic(
    comm: strataComm_t,
    allMembers: c_int,
    traffic: *mut strataTraffic_t,
) -> strataResult_t {
    ffi_boundary!("strataCommGetTraffic", comm, {
        if traffic.is_null() {
            return Err(Error::InvalidArgument("traffic is NULL".into()));
        }
        let h = lookup(comm)?;
        let (r, measured) = h.comm.traffic_report(allMembers != 0)?;
        let out = strataTraffic_t {
            intra_package: r.intra_package,
            intra_node: r.intra_node,
            inter_node: r.inter_node,
            max_node_egress: r.max_node_egress,
            measured: measured as c_int,
        };
        // SAFETY: the caller's contract on `traffic` (checked non-NULL).
        unsafe { write_out(traffic, out, "traffic") }
    })
}
