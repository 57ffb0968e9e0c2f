//! Bootstrap: the worlds a program starts from (in-process, MPI, NCCL/RCCL ids), shared
//! by the Rust API, the C ABI and (through it) the Python package. Rendezvous, MPI rank
//! checks, vendor unique ids and the `STRATA_TRANSPORT` / `STRATA_DEVICE` choices live
//! here and in [`super::gpu`], not in the C ABI.

#![forbid(unsafe_code)]

use super::{Comm, CommConfig};
#[cfg(any(feature = "cuda", feature = "rocm"))]
use crate::dtype::DataType;
use crate::error::{Error, Result};
#[cfg(any(feature = "cuda", feature = "rocm"))]
use crate::memory::Buffer;
use crate::topology::Topology;
use crate::transport::local::LocalTransport;
#[cfg(feature = "mpi")]
use crate::transport::Transport;
use std::sync::Arc;

impl Comm {
    /// A whole in-process world (`local` transport): one communicator per rank, each to
    /// be driven from its own thread. `topo` defaults to `STRATA_TOPOLOGY`, else one node
    /// of `nranks`; a topology of another size is an `InvalidUsage` error.
    pub fn local_world(
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Vec<Comm>> {
        let topo = Arc::new(Comm::world_topology(nranks, topo)?);
        LocalTransport::world(&topo, config.timeout)
            .into_iter()
            .map(|t| Comm::from_transport(Arc::new(t), topo.clone(), config.clone()))
            .collect()
    }

    /// The topology of an in-process world of `nranks`: `topo`, else `STRATA_TOPOLOGY`,
    /// else one node; checked against `nranks` (at least one).
    pub(crate) fn world_topology(nranks: usize, topo: Option<Topology>) -> Result<Topology> {
        if nranks == 0 {
            return Err(Error::InvalidArgument(
                "a world needs at least one rank".into(),
            ));
        }
        let topo = match topo {
            Some(t) => t,
            None => Topology::from_env()?.unwrap_or_else(|| Topology::flat(nranks)),
        };
        topo.check_world(nranks)?;
        Ok(topo)
    }

    /// The world communicator of an MPI job (feature `mpi`): one rank per process, the
    /// topology applied as a virtual layout over MPI world ranks.
    #[cfg(not(feature = "mpi"))]
    pub fn mpi_world(_topo: Option<Topology>, _config: CommConfig) -> Result<Comm> {
        Err(Error::NotCompiled(
            "the mpi transport needs the `mpi` feature (cargo build --features mpi)".into(),
        ))
    }

    /// The world communicator of an MPI job (feature `mpi`): one rank per process, the
    /// topology applied as a virtual layout over MPI world ranks: `topo`, else
    /// `STRATA_TOPOLOGY`, else the layout of the hosts the ranks run on
    /// ([`crate::topology::detect`]). Call
    /// [`crate::transport::mpi::finalize`] before the program exits.
    #[cfg(feature = "mpi")]
    pub fn mpi_world(topo: Option<Topology>, config: CommConfig) -> Result<Comm> {
        let n = crate::transport::mpi::MpiTransport::world_size_hint()?;
        let topo = match topo {
            Some(t) => t,
            None => match Topology::from_env()? {
                Some(t) => t,
                None => Comm::mpi_detect(n, &config)?,
            },
        };
        topo.check_world(n)?;
        let t = crate::transport::mpi::MpiTransport::world(Some(topo.clone()), config.timeout)?;
        Comm::from_transport(Arc::new(t), Arc::new(topo), config)
    }

    /// The node layout of an MPI world from its ranks' hosts
    /// ([`crate::topology::detect`]): host ids all-gathered over a temporary world.
    #[cfg(feature = "mpi")]
    fn mpi_detect(n: usize, config: &CommConfig) -> Result<Topology> {
        let t =
            crate::transport::mpi::MpiTransport::world(Some(Topology::flat(n)), config.timeout)?;
        let mut buf = vec![0u8; 8 * n];
        let me = t.rank();
        buf[8 * me..8 * me + 8].copy_from_slice(&crate::topology::detect::host_id().to_le_bytes());
        t.all_gather(&mut buf, 8)?;
        let ids: Vec<u64> = buf
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        let topo = crate::topology::detect::from_host_ids(&ids)?;
        tracing::debug!(rank = me, topology = %topo.name, "detected from host ids");
        Ok(topo)
    }

    /// Bootstrap of a vendor communicator (features `cuda` / `rocm`), as nccl-tests does
    /// it under MPI: rank 0 makes the NCCL/RCCL unique id and broadcasts it over this
    /// communicator, so every rank returns the same id for `ncclCommInitRank`.
    /// Collective; on a machine without the library every rank gets the loader's error.
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    pub fn vendor_unique_id(
        &self,
        vendor: crate::transport::vendor::Vendor,
    ) -> Result<crate::transport::vendor::VendorUniqueId> {
        use crate::transport::vendor::{VendorLib, VendorUniqueId, VENDOR_UNIQUE_ID_BYTES};
        let lib = VendorLib::get(vendor)?;
        let buf = Buffer::zeroed(VENDOR_UNIQUE_ID_BYTES);
        if self.rank() == 0 {
            buf.write_bytes(&lib.unique_id()?.bytes())?;
        }
        self.broadcast(&buf, &buf, VENDOR_UNIQUE_ID_BYTES, DataType::U8, 0)?
            .wait()?;
        let mut b = [0u8; VENDOR_UNIQUE_ID_BYTES];
        b.copy_from_slice(&buf.to_bytes()?);
        Ok(VendorUniqueId::from_bytes(&b))
    }
}
