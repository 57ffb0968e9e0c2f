//! Communicators on devices: a single-GPU world of `cuda-local` ranks, a `host-local`
//! world on the CPU device, and NCCL/RCCL
//! communicators bootstrapped like nccl-tests (rank 0 makes the vendor's unique id, a
//! host communicator broadcasts it) or from an id the caller distributed (C ABI). Each
//! creates the vendor communicator on this rank's device, learns the node layout
//! (`STRATA_TOPOLOGY`, else the hosts' ids all-gathered over the new communicator),
//! and builds every sub-communicator the algorithms use once, up front.

use super::{Comm, CommConfig};
use crate::device::{Api, Device};
use crate::error::{Error, Result};
use crate::topology::Topology;
use std::sync::Arc;

/// The device a GPU rank uses: `STRATA_DEVICE`, else the device current on the calling
/// thread (as NCCL: the caller's `cudaSetDevice`), else the launcher's local rank
/// (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`, `LOCAL_RANK`)
/// modulo the devices present, else `fallback`.
pub fn select_device(api: Api, fallback: usize) -> Result<Arc<dyn Device>> {
    if let Ok(v) = std::env::var("STRATA_DEVICE") {
        let o: usize = v.trim().parse().map_err(|_| {
            Error::InvalidArgument(format!("STRATA_DEVICE={v:?} is not a device ordinal"))
        })?;
        return crate::device::open(api, o);
    }
    #[cfg(feature = "cuda")]
    if api == Api::Cuda {
        if let Some(o) = crate::device::cuda::current_ordinal() {
            return crate::device::open(api, o);
        }
    }
    let count = crate::device::count(api);
    let local = [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "LOCAL_RANK",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok());
    let o = local.unwrap_or(fallback);
    crate::device::open(api, if count > 0 { o % count } else { o })
}

pub use super::bootstrap::cuda_local_ordinal;

impl Comm {
    /// Join, as `rank` of `nranks`, the NCCL (`kind` nccl, feature `cuda`) or RCCL
    /// (rccl, feature `rocm`) communicator of the vendor unique id `id` (from
    /// [`super::bootstrap::new_vendor_unique_id`] on one rank, distributed by the
    /// caller), on this thread's device ([`select_device`]: `STRATA_DEVICE`, else the
    /// current device, as NCCL). `topo` as [`Comm::vendor_join`]. Collective over the
    /// `nranks` ranks; `NotCompiled` without the feature.
    pub fn vendor_join_id(
        kind: crate::transport::TransportKind,
        id: &[u8; super::bootstrap::VENDOR_UNIQUE_ID_BYTES],
        rank: usize,
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        #[cfg(not(any(feature = "cuda", feature = "rocm")))]
        {
            let _ = (id, rank, nranks, topo, config);
            Err(super::bootstrap::not_compiled(kind))
        }
        #[cfg(any(feature = "cuda", feature = "rocm"))]
        {
            let (_, api) = vendor_of(kind)?;
            let dev = select_device(api, 0)?;
            Comm::vendor_join(
                kind,
                &dev,
                &crate::transport::vendor::VendorUniqueId::from_bytes(id),
                rank,
                nranks,
                topo,
                config,
            )
        }
    }

    /// The GPU this communicator runs on (`None` on host transports).
    pub fn device(&self) -> Option<Arc<dyn Device>> {
        self.transport().gpu().map(|g| g.device().clone())
    }

    /// The device stream this communicator's collectives run on (`None` on host
    /// transports): what a caller's stream is joined to (the C ABI's `stream`).
    pub fn device_stream(&self) -> Option<Arc<dyn crate::device::DevStream>> {
        self.transport().gpu().map(|g| g.stream().clone())
    }

    /// `bytes` zeroed bytes where this communicator's collectives run natively: device
    /// memory on GPU transports, host memory otherwise.
    pub fn alloc_native(&self, bytes: usize) -> Result<crate::memory::Buffer> {
        match self.device() {
            Some(d) => crate::memory::Buffer::on_device(&d, bytes),
            None => Ok(crate::memory::Buffer::zeroed(bytes)),
        }
    }

    /// A copy of `data` in [`Comm::alloc_native`] memory.
    pub fn native_from(&self, data: &[u8]) -> Result<crate::memory::Buffer> {
        let b = self.alloc_native(data.len())?;
        b.write_bytes(data)?;
        Ok(b)
    }

    /// A whole world of `nranks` ranks on ONE GPU (`cuda-local`, feature `cuda`): ranks
    /// are threads with their own streams exchanging through device copies, so every
    /// algorithm runs on device buffers without a second GPU. `topo` as
    /// [`Comm::local_world`]; `ordinal` picks the device.
    pub fn cuda_local_world(
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
        ordinal: usize,
    ) -> Result<Vec<Comm>> {
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (nranks, topo, config, ordinal);
            Err(crate::transport::gpu::not_compiled("cuda-local", "cuda"))
        }
        #[cfg(feature = "cuda")]
        {
            let topo = Comm::world_topology(nranks, topo)?;
            let dev = crate::device::open(Api::Cuda, ordinal)?;
            let topo = Arc::new(topo);
            crate::transport::device_local::DeviceLocalTransport::world(
                &dev,
                &topo,
                config.timeout,
            )?
            .into_iter()
            .map(|t| Comm::from_transport(Arc::new(t), topo.clone(), config.clone()))
            .collect::<Result<Vec<_>>>()
            .and_then(|w| super::probe::world_with_links(w, config.links))
        }
    }

    /// A whole world of `nranks` ranks on the CPU device (`host-local`, always built): the
    /// `cuda-local` transport on [`crate::device::cpu`], ranks as threads each with its
    /// own streams (worker threads), buffers in the CPU device's memory. Every device
    /// path of strata (streams, kernels, scratch, the GPU face of every algorithm) runs
    /// on it exactly as on a GPU, which is how CI tests them. `topo` as
    /// [`Comm::local_world`].
    pub fn host_local_world(
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Vec<Comm>> {
        Comm::host_local_world_on(0, nranks, topo, config)
    }

    /// [`Comm::host_local_world`] on CPU device `ordinal` (devices are separate memory
    /// tables, streams and caches: a test that counts allocations uses its own).
    pub fn host_local_world_on(
        ordinal: usize,
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Vec<Comm>> {
        let topo = Arc::new(Comm::world_topology(nranks, topo)?);
        let dev = crate::device::open(Api::Cpu, ordinal)?;
        crate::transport::device_local::DeviceLocalTransport::world(&dev, &topo, config.timeout)?
            .into_iter()
            .map(|t| Comm::from_transport(Arc::new(t), topo.clone(), config.clone()))
            .collect::<Result<Vec<_>>>()
            .and_then(|w| super::probe::world_with_links(w, config.links))
    }

    /// An NCCL (`TransportKind::Nccl`, feature `cuda`) or RCCL (`Rccl`, feature `rocm`)
    /// communicator of the same ranks as the host communicator `bootstrap` (an MPI world,
    /// typically): rank 0 makes the unique id, `bootstrap` broadcasts it, every rank
    /// joins on its device ([`select_device`], falling back to its index in its node).
    /// The topology is `bootstrap`'s. Collective over `bootstrap`.
    pub fn vendor_world(
        bootstrap: &Comm,
        kind: crate::transport::TransportKind,
        config: CommConfig,
    ) -> Result<Comm> {
        #[cfg(not(any(feature = "cuda", feature = "rocm")))]
        {
            let _ = (bootstrap, config);
            Err(crate::transport::gpu::not_compiled(
                kind.name(),
                kind.feature().unwrap_or("cuda"),
            ))
        }
        #[cfg(any(feature = "cuda", feature = "rocm"))]
        {
            let (vendor, api) = vendor_of(kind)?;
            let id = bootstrap.vendor_unique_id(vendor)?;
            let topo = bootstrap.topology().clone();
            let local = topo.local_rank(bootstrap.world_rank(bootstrap.rank()));
            let dev = select_device(api, local)?;
            Comm::vendor_join(
                kind,
                &dev,
                &id,
                bootstrap.rank(),
                bootstrap.size(),
                Some((*topo).clone()),
                config,
            )
        }
    }

    /// Join the vendor communicator of `id` as `rank` of `nranks` on `dev` (C ABI's
    /// `strataCommInitRank` on the nccl/rccl transports). `topo`: else `STRATA_TOPOLOGY`,
    /// else the hosts' ids all-gathered over the new communicator
    /// ([`crate::topology::detect`]). Collective over the `nranks` ranks.
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    pub fn vendor_join(
        kind: crate::transport::TransportKind,
        dev: &Arc<dyn Device>,
        id: &crate::transport::vendor::VendorUniqueId,
        rank: usize,
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        let (vendor, _) = vendor_of(kind)?;
        let t = crate::transport::nccl::NcclTransport::init(
            vendor,
            dev,
            id,
            rank,
            nranks,
            None,
            config.timeout,
        )?;
        Comm::on_vendor(t, rank, nranks, topo, config)
    }

    /// A communicator of strata on `own`, a vendor communicator made from a program's
    /// own (`VendorLib::split_foreign`: a library in front of NCCL joining the
    /// communicator the program made, with no second bootstrap), owned from now on; its
    /// sub-communicators split from it; the topology as [`Comm::vendor_join`]'s. `dev` is
    /// `own`'s device. Collective over `own`'s ranks.
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    pub fn vendor_adopt(
        own: crate::transport::vendor::VendorComm<'static>,
        dev: &Arc<dyn Device>,
        rank: usize,
        nranks: usize,
        config: CommConfig,
    ) -> Result<Comm> {
        let t = crate::transport::nccl::NcclTransport::adopt(
            own.lib().vendor(),
            own,
            rank,
            nranks,
            dev,
            config.timeout,
        )?;
        Comm::on_vendor(t, rank, nranks, None, config)
    }

    /// The communicator on vendor transport `t`: topology `topo`, else
    /// `STRATA_TOPOLOGY`, else the hosts' ids all-gathered over `t`; every
    /// sub-communicator split now.
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    fn on_vendor(
        t: crate::transport::nccl::NcclTransport,
        rank: usize,
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        use crate::transport::Transport;
        let topo = match topo {
            Some(t) => t,
            None => match Topology::from_env()? {
                Some(t) => t,
                None => {
                    let mut buf = vec![0u8; 8 * nranks];
                    buf[8 * rank..8 * rank + 8]
                        .copy_from_slice(&crate::topology::detect::host_id().to_le_bytes());
                    t.all_gather(&mut buf, 8)?;
                    let ids: Vec<u64> = buf
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect();
                    crate::topology::detect::from_host_ids(&ids)?
                }
            },
        };
        topo.check_world(nranks)?;
        let links = config.links;
        let comm = Comm::from_transport(Arc::new(t), Arc::new(topo), config)?.with_links(links)?;
        comm.prepare_subcomms()?;
        Ok(comm)
    }

    /// Split every sub-communicator the algorithms use (each level's, the node's and the
    /// rail's) now, so no collective pays for it later. Collective.
    pub fn prepare_subcomms(&self) -> Result<()> {
        let Some(h) = self.hierarchy() else {
            return Ok(());
        };
        for i in 0..h.levels.len() {
            self.0.level(i)?;
        }
        if h.levels.len() >= 2 {
            self.0.node_or_rail(true)?;
            self.0.node_or_rail(false)?;
        }
        Ok(())
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
fn vendor_of(
    kind: crate::transport::TransportKind,
) -> Result<(crate::transport::vendor::Vendor, Api)> {
    use crate::transport::vendor::Vendor;
    use crate::transport::TransportKind as K;
    match kind {
        K::Nccl if cfg!(feature = "cuda") => Ok((Vendor::Nccl, Api::Cuda)),
        K::Rccl if cfg!(feature = "rocm") => Ok((Vendor::Rccl, Api::Hip)),
        K::Nccl | K::Rccl => Err(crate::transport::gpu::not_compiled(
            kind.name(),
            kind.feature().unwrap_or("cuda"),
        )),
        other => Err(Error::InvalidArgument(format!(
            "{} is not a vendor transport (nccl, rccl)",
            other.name()
        ))),
    }
}
