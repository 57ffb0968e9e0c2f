//! Transports move bytes between the ranks of a communicator.
//!
//! One trait, [`Transport`], with native collectives over its supertrait [`P2p`], the
//! blocking point-to-point primitives; a transport's native collectives default to the
//! ring algorithms of [`ring`], written over those point-to-point calls, so the `local`
//! transport's traffic mirrors NCCL's ring. Transports are driven from a
//! communicator's stream thread ([`crate::comm`]), which is what makes collectives
//! nonblocking for the caller. Every transport exists as a type in every build; with
//! its feature off, constructing it returns [`Error::NotCompiled`].

pub mod device_local;
pub mod gpu;
pub mod local;
pub(crate) mod meeting;
pub mod metered;
pub mod mpi;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod nccl;
mod p2p;
pub mod ring;
mod scratch;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod vendor;

pub use p2p::{Fold, P2p};
pub(crate) use scratch::with_scratch;

use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::traffic::{Traffic, TrafficMatrix};
use std::sync::Arc;
use std::time::Duration;

/// The transports strata knows, in order of preference when none is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Local,
    Mpi,
    Nccl,
    Rccl,
    CudaLocal,
    /// N ranks as threads on the CPU device ([`crate::device::cpu`]), every rank with its
    /// own streams: the device paths without a GPU.
    HostLocal,
}

impl TransportKind {
    /// Registry order: the embedded default first.
    pub const ALL: [TransportKind; 6] = [
        TransportKind::Local,
        TransportKind::Mpi,
        TransportKind::Nccl,
        TransportKind::Rccl,
        TransportKind::CudaLocal,
        TransportKind::HostLocal,
    ];

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Local => "local",
            TransportKind::Mpi => "mpi",
            TransportKind::Nccl => "nccl",
            TransportKind::Rccl => "rccl",
            TransportKind::CudaLocal => "cuda-local",
            TransportKind::HostLocal => "host-local",
        }
    }

    /// True when this build can construct the transport.
    pub fn compiled(self) -> bool {
        match self {
            TransportKind::Local | TransportKind::HostLocal => true,
            TransportKind::Mpi => cfg!(feature = "mpi"),
            TransportKind::Nccl | TransportKind::CudaLocal => cfg!(feature = "cuda"),
            TransportKind::Rccl => cfg!(feature = "rocm"),
        }
    }

    /// True when traffic figures are measured transfers rather than nominal ones.
    pub fn traffic_measured(self) -> bool {
        matches!(
            self,
            TransportKind::Local | TransportKind::CudaLocal | TransportKind::HostLocal
        )
    }

    /// True for the transports that move device memory (the CPU device's included).
    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            TransportKind::Nccl
                | TransportKind::Rccl
                | TransportKind::CudaLocal
                | TransportKind::HostLocal
        )
    }

    /// The cargo feature a transport needs (`None`: always built).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            TransportKind::Local | TransportKind::HostLocal => None,
            TransportKind::Mpi => Some("mpi"),
            TransportKind::Nccl | TransportKind::CudaLocal => Some("cuda"),
            TransportKind::Rccl => Some("rocm"),
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        TransportKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown transport '{s}' (local, mpi, nccl, rccl, cuda-local, host-local)"
                ))
            })
    }
}

/// Moves bytes among the `size()` ranks of one communicator: the point-to-point calls of
/// [`P2p`] (implemented in each transport's own `impl P2p` block) and the collectives
/// below. Calls block the calling
/// (stream) thread; a peer that does not answer within `timeout()` is an
/// [`Error::Remote`]. Implementations must be usable from several threads, one
/// communicator's calls at a time.
pub trait Transport: P2p + Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;
    /// World rank of communicator rank `r` (for traffic classification).
    fn world_rank(&self, r: usize) -> usize;
    /// How long to wait for a peer.
    fn timeout(&self) -> Duration;
    /// Collective: ranks passing the same `Some(color)` form a new communicator ordered
    /// by (key, rank); `None` takes part without joining (returns `Ok(None)`).
    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>>;
    /// A communicator of `members` (ranks of this one, ascending, this rank among them),
    /// created by those ranks alone (`MPI_Comm_create_group`): what a framework's
    /// `new_group` needs, where non-members never call, and what a shrink makes of the
    /// survivors. `mpi`, `local`, `host-local` and `cuda-local` have it; elsewhere an [`Error::InvalidUsage`]
    /// pointing to [`Transport::split`].
    fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
        let _ = members;
        Err(Error::InvalidUsage(format!(
            "creating a communicator from its members alone is supported on the mpi, local, \
             host-local and cuda-local transports; on {} use split (collective over every rank)",
            self.kind().name()
        )))
    }
    /// The ranks of this communicator alive to call this now, the same list on each
    /// ([`crate::Comm::survivors`]). Default: [`Error::InvalidUsage`] (`local`, `mpi` and the in-process device transports
    /// take a census).
    fn survivors(&self) -> Result<Vec<usize>> {
        Err(Error::InvalidUsage(format!(
            "a census of the live ranks is supported on the local, mpi, host-local and cuda-local transports, not on {}",
            self.kind().name()
        )))
    }
    /// The device face of a GPU transport (`None` for host transports): collectives on
    /// device memory, which the runtime's native execution uses for device buffers.
    fn gpu(&self) -> Option<&dyn gpu::GpuTransport> {
        None
    }
    /// Shared traffic counters, where the transport records them.
    fn traffic(&self) -> Option<Arc<Traffic>>;
    /// Wake every waiter with an error and refuse further work (ncclCommAbort).
    fn abort(&self);
    /// A collective on this communicator failed with `e` (the runtime aborts the
    /// communicator next). Transports whose teardown would wait for the failed peers
    /// remember it: on `mpi`, [`mpi::finalize`] then aborts the MPI job instead of
    /// hanging in `MPI_Finalize`. Default: nothing.
    fn failed(&self, _e: &Error) {}
    /// Wait until every rank arrived, recording no traffic (default: a ring all-gather
    /// of empty messages, which no rank can finish before every rank has entered).
    fn barrier(&self) -> Result<()> {
        ring::all_gather(self, &mut [], 0)
    }
    /// Add up the traffic matrices of all ranks (collective). Where ranks share one set
    /// of counters (local) this is the identity; on MPI each process records only its
    /// own sends, so the matrices are summed across processes.
    fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
        Ok(m.clone())
    }

    /// Native all-gather, in place: `buf` holds `size()` chunks of `chunk` bytes and this
    /// rank's own chunk is already at `rank()*chunk`. Default: the device face staged
    /// through scratch where the transport has one ([`gpu::staged`]), else the ring.
    fn all_gather(&self, buf: &mut [u8], chunk: usize) -> Result<()> {
        match self.gpu() {
            Some(g) => gpu::staged::all_gather(g, self.timeout(), buf, chunk),
            None => ring::all_gather(self, buf, chunk),
        }
    }
    /// Native reduce-scatter: `send` holds `size()` chunks of `recv.len()` bytes; `recv`
    /// gets the reduction of everyone's chunk `rank()` (with `Avg`: the sum; the caller divides).
    fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        match self.gpu() {
            Some(g) => gpu::staged::reduce_scatter(g, self.timeout(), send, recv, dtype, op),
            None => ring::reduce_scatter(self, send, recv, dtype, op),
        }
    }
    /// Native reduce-scatter in place: `buf` holds `size()` chunks of `chunk` bytes and
    /// chunk `rank()` gets the reduction of everyone's (with `Avg`: the sum); the other
    /// chunks are left as they were. Default: the ring folding into the own chunk on
    /// host transports; GPU transports copy the input aside and run the out-of-place call.
    fn reduce_scatter_in_place(
        &self,
        buf: &mut [u8],
        chunk: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        match self.gpu() {
            Some(_) => {
                let src = buf.to_vec();
                let r = self.rank();
                self.reduce_scatter(&src, &mut buf[r * chunk..(r + 1) * chunk], dtype, op)
            }
            None => ring::reduce_scatter_in_place(self, buf, chunk, dtype, op),
        }
    }
    /// Native all-reduce out of place: `recv` gets the reduction of everyone's `send`
    /// (the same length; with `Avg`: the sum), with the in-place call's bytes. Default:
    /// the ring reading `send` where it is (no copy first) on host transports; GPU
    /// transports copy into `recv` and reduce in place.
    fn all_reduce_from(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        match self.gpu() {
            Some(_) => {
                recv.copy_from_slice(send);
                self.all_reduce(recv, dtype, op)
            }
            None => ring::all_reduce_from(self, send, recv, dtype, op),
        }
    }
    /// Native all-reduce in place (with `Avg`: the sum; the caller divides).
    fn all_reduce(&self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        match self.gpu() {
            Some(g) => gpu::staged::all_reduce(g, self.timeout(), buf, dtype, op),
            None => ring::all_reduce(self, buf, dtype, op),
        }
    }
    /// Native all-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from rank `i`.
    fn all_to_all(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        match self.gpu() {
            Some(g) => gpu::staged::all_to_all(g, self.timeout(), send, recv),
            None => ring::all_to_all(self, send, recv),
        }
    }
    /// Native broadcast in place from `root`.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<()> {
        match self.gpu() {
            Some(g) => gpu::staged::broadcast(g, self.timeout(), buf, root),
            None => ring::broadcast(self, buf, root),
        }
    }
}
