//! Stand-in for the MPI transport in a build without the `mpi` feature.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::traffic::{Traffic, TrafficMatrix};
use crate::transport::{P2p, Transport, TransportKind};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

fn not_compiled() -> Error {
    crate::transport::gpu::not_compiled("mpi", "mpi")
}

/// The MPI transport. This build has no MPI support: constructing it returns
/// [`Error::NotCompiled`].
pub struct MpiTransport {
    never: Infallible,
}

impl MpiTransport {
    /// Always `Error::NotCompiled` in this build.
    pub fn world(_traffic_topo: Option<Topology>, _timeout: Duration) -> Result<MpiTransport> {
        Err(not_compiled())
    }
    /// Always `Error::NotCompiled` in this build.
    pub fn world_size_hint() -> Result<usize> {
        Err(not_compiled())
    }
    /// Unreachable in this build (no value of the type exists).
    pub fn barrier(&self) -> Result<()> {
        match self.never {}
    }
    /// Unreachable in this build (no value of the type exists).
    pub fn sum_traffic(&self, _m: &TrafficMatrix) -> Result<TrafficMatrix> {
        match self.never {}
    }
}

/// Unreachable like the rest (no value exists); the trait's defaults stand for what is
/// not here.
impl Transport for MpiTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Mpi
    }
    fn world_rank(&self, _r: usize) -> usize {
        match self.never {}
    }
    fn timeout(&self) -> Duration {
        match self.never {}
    }
    fn split(&self, _color: Option<u32>, _key: i32) -> Result<Option<Arc<dyn Transport>>> {
        match self.never {}
    }
    fn traffic(&self) -> Option<Arc<Traffic>> {
        match self.never {}
    }
    fn abort(&self) {
        match self.never {}
    }
}

impl P2p for MpiTransport {
    fn rank(&self) -> usize {
        match self.never {}
    }
    fn size(&self) -> usize {
        match self.never {}
    }
    fn send(&self, _peer: usize, _data: &[u8]) -> Result<()> {
        match self.never {}
    }
    fn recv(&self, _peer: usize, _data: &mut [u8]) -> Result<()> {
        match self.never {}
    }
}

/// Nothing to finalise in a build without MPI.
pub fn finalize() {}

/// No MPI, no peer failures.
pub fn peer_failure() -> Option<String> {
    None
}
