//! Bootstrap: the worlds a program starts from (in-process, MPI, NCCL/RCCL ids), shared
//! by the Rust API, the C ABI and (through it) the Python package. Rendezvous, MPI rank
//! checks, vendor unique ids and the `STRATA_TRANSPORT` / `STRATA_DEVICE` choices live
//! here and in [`super::gpu`], not in the C ABI.

#![forbid(unsafe_code)]

use super::{Comm, CommConfig};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::topology::Topology;
use crate::transport::local::LocalTransport;
#[cfg(feature = "mpi")]
use crate::transport::{P2p, Transport};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Which transport moves a communicator's bytes (re-exported here so that bootstrap
/// callers, the C ABI included, need not reach into the transports).
pub use crate::transport::TransportKind;

/// Size of an NCCL/RCCL unique id (`NCCL_UNIQUE_ID_BYTES`), as
/// [`new_vendor_unique_id`] returns it and [`Comm::vendor_join_id`] takes it.
pub const VENDOR_UNIQUE_ID_BYTES: usize = 128;
#[cfg(any(feature = "cuda", feature = "rocm"))]
const _: () = assert!(crate::transport::vendor::VENDOR_UNIQUE_ID_BYTES == VENDOR_UNIQUE_ID_BYTES);

// ---- transport choice ----

/// The `NotCompiled` error (`strataInvalidUsage` in C) of a transport this build lacks,
/// naming the cargo feature to turn on.
pub fn not_compiled(kind: TransportKind) -> Error {
    crate::transport::gpu::not_compiled(kind.name(), kind.feature().unwrap_or("default"))
}

/// `e` (a usage error of an MPI world of `processes` where `want` ranks were asked for)
/// with the next step when the world is one process: a program started without mpirun
/// is an MPI world of its own.
pub(crate) fn mpirun_hint(e: Error, processes: usize, want: usize) -> Error {
    match e {
        Error::InvalidUsage(m) if processes == 1 && want > 1 => Error::InvalidUsage(format!(
            "{m} (an MPI world of 1 process: started without mpirun? start it with mpirun -np {want})"
        )),
        e => e,
    }
}

/// `Ok` when this build has `kind`, else [`not_compiled`].
pub fn require_compiled(kind: TransportKind) -> Result<()> {
    if kind.compiled() {
        Ok(())
    } else {
        Err(not_compiled(kind))
    }
}

/// The device of a cuda-local world ([`Comm::in_process_world`]): `STRATA_DEVICE`,
/// else 0.
pub fn cuda_local_ordinal() -> Result<usize> {
    match std::env::var("STRATA_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            Error::InvalidArgument(format!("STRATA_DEVICE={v:?} is not a device ordinal"))
        }),
        _ => Ok(0),
    }
}

/// A `STRATA_TRANSPORT` value (`local`, `mpi`, `nccl`, `rccl`, `cuda-local`, `host-local`; case and
/// surrounding blanks ignored): `None` when empty, `InvalidArgument` for anything else.
pub fn parse_transport(v: &str) -> Result<Option<TransportKind>> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "local" => Ok(Some(TransportKind::Local)),
        "mpi" => Ok(Some(TransportKind::Mpi)),
        "nccl" => Ok(Some(TransportKind::Nccl)),
        "rccl" => Ok(Some(TransportKind::Rccl)),
        "cuda-local" | "cuda_local" => Ok(Some(TransportKind::CudaLocal)),
        "host-local" | "host_local" => Ok(Some(TransportKind::HostLocal)),
        _ => Err(Error::InvalidArgument(format!(
            "STRATA_TRANSPORT={v:?} is not a transport (local, mpi, nccl, rccl, cuda-local, host-local)"
        ))),
    }
}

/// `STRATA_TRANSPORT`, parsed ([`parse_transport`]; `None` when unset or empty).
pub fn env_transport() -> Result<Option<TransportKind>> {
    parse_transport(&std::env::var("STRATA_TRANSPORT").unwrap_or_default())
}

/// A new NCCL (`kind` nccl, feature `cuda`) or RCCL (rccl, feature `rocm`) unique id
/// (`ncclGetUniqueId`, which loads the vendor library), for a program that distributes
/// it itself (the C ABI's 256-byte ids carry it) and joins with
/// [`Comm::vendor_join_id`]. `NotCompiled` without the feature; the loader's error when
/// the library cannot be loaded; `Internal` for a transport without vendor ids.
pub fn new_vendor_unique_id(kind: TransportKind) -> Result<[u8; VENDOR_UNIQUE_ID_BYTES]> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        use crate::transport::vendor::{Vendor, VendorLib};
        let vendor = match kind {
            TransportKind::Nccl => Vendor::Nccl,
            TransportKind::Rccl => Vendor::Rccl,
            other => {
                return Err(Error::Internal(format!(
                    "{} has no vendor unique id",
                    other.name()
                )))
            }
        };
        require_compiled(kind)?;
        Ok(VendorLib::get(vendor)?.unique_id()?.bytes())
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        Err(not_compiled(kind))
    }
}

/// Finalise MPI when strata initialised it (the mpi transport, when the program had not
/// initialised MPI itself): call once at the end, after destroying the communicators.
/// A no-op when MPI was never used or belongs to the program, and in builds without
/// MPI.
pub fn finalize_mpi() {
    crate::transport::mpi::finalize();
}

// ---- in-process rendezvous ----

/// One in-process world being assembled from its ranks' calls.
struct Rendezvous {
    kind: TransportKind,
    nranks: usize,
    topo_spec: Option<String>,
    arrived: Vec<bool>,
    world: Option<Result<Vec<Option<Comm>>>>,
    taken: usize,
}

type RendezvousMap = Mutex<HashMap<[u8; 16], Rendezvous>>;

static RENDEZVOUS: Lazy<(RendezvousMap, Condvar)> =
    Lazy::new(|| (Mutex::new(HashMap::new()), Condvar::new()));

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
        let world = LocalTransport::world(&topo, config.timeout)
            .into_iter()
            .map(|t| Comm::from_transport(Arc::new(t), topo.clone(), config.clone()))
            .collect::<Result<Vec<_>>>()?;
        super::probe::world_with_links(world, config.links)
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
        Err(not_compiled(TransportKind::Mpi))
    }

    /// The world communicator of an MPI job (feature `mpi`): one rank per process, the
    /// topology applied as a virtual layout over MPI world ranks: `topo`, else
    /// `STRATA_TOPOLOGY`, else the layout of the hosts the ranks run on
    /// ([`crate::topology::detect`]). Call [`finalize_mpi`] before the program exits.
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
        topo.check_world(n)
            .map_err(|e| mpirun_hint(e, n, topo.world_size()))?;
        let t = crate::transport::mpi::MpiTransport::world(Some(topo.clone()), config.timeout)?;
        let links = config.links;
        Comm::from_transport(Arc::new(t), Arc::new(topo), config)?.with_links(links)
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

    /// A whole in-process world of `kind`: [`Comm::local_world`] for `local`,
    /// [`Comm::cuda_local_world`] on [`cuda_local_ordinal`] for
    /// `cuda-local`, [`Comm::host_local_world`] for `host-local`; any other kind is
    /// `InvalidArgument`.
    pub fn in_process_world(
        kind: TransportKind,
        nranks: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Vec<Comm>> {
        match kind {
            TransportKind::Local => Comm::local_world(nranks, topo, config),
            TransportKind::CudaLocal => {
                Comm::cuda_local_world(nranks, topo, config, cuda_local_ordinal()?)
            }
            TransportKind::HostLocal => Comm::host_local_world(nranks, topo, config),
            other => Err(Error::InvalidArgument(format!(
                "{} is not an in-process transport (local, cuda-local, host-local)",
                other.name()
            ))),
        }
    }

    /// Join, as `rank` of `nranks`, the in-process world of `kind` (local, cuda-local or
    /// host-local) named by `key` (the rendezvous key of a unique id): each rank calls
    /// this from its own thread; the last to arrive builds the world
    /// ([`Comm::in_process_world`], topology `topo_spec` parsed, else as there) with its
    /// `config`, and every rank takes its communicator. Ranks that disagree on `nranks`,
    /// `kind` or `topo_spec`, or a rank joining twice, are `InvalidUsage`; ranks still
    /// missing after `config.timeout` make the waiting ones fail with `Remote`.
    pub fn join_in_process(
        kind: TransportKind,
        key: [u8; 16],
        nranks: usize,
        rank: usize,
        topo_spec: Option<&str>,
        config: CommConfig,
    ) -> Result<Comm> {
        if rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range for {nranks} ranks"
            )));
        }
        let (lock, cv) = &*RENDEZVOUS;
        let mut map = lock.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(key).or_insert_with(|| Rendezvous {
            kind,
            nranks,
            topo_spec: topo_spec.map(str::to_string),
            arrived: vec![false; nranks],
            world: None,
            taken: 0,
        });
        if e.nranks != nranks {
            return Err(Error::InvalidUsage(format!(
                "nranks mismatch for this unique id: rank {rank} passed {nranks}, an earlier rank passed {}",
                e.nranks
            )));
        }
        if e.kind != kind {
            return Err(Error::InvalidUsage(format!(
                "transport mismatch for this unique id: rank {rank} asked for {}, an earlier rank for {}",
                kind.name(),
                e.kind.name()
            )));
        }
        if e.arrived[rank] {
            return Err(Error::InvalidUsage(format!(
                "rank {rank} joined this unique id's world twice"
            )));
        }
        if e.topo_spec.as_deref() != topo_spec {
            return Err(Error::InvalidUsage(format!(
                "topology mismatch for this unique id: rank {rank} passed {topo_spec:?}, an earlier rank passed {:?}",
                e.topo_spec
            )));
        }
        e.arrived[rank] = true;
        if e.arrived.iter().all(|&a| a) {
            let world = topo_spec
                .map(Topology::parse)
                .transpose()
                .and_then(|t| Comm::in_process_world(kind, nranks, t, config.clone()))
                .map(|v| v.into_iter().map(Some).collect());
            e.world = Some(world);
            cv.notify_all();
        }
        let deadline = Instant::now() + config.timeout;
        loop {
            let e = map
                .get_mut(&key)
                .ok_or_else(|| Error::Internal("rendezvous entry vanished".into()))?;
            if let Some(w) = e.world.as_mut() {
                let r = match w {
                    Ok(v) => v[rank]
                        .take()
                        .ok_or_else(|| Error::Internal("rank taken twice".into())),
                    Err(err) => Err(err.clone()),
                };
                e.taken += 1;
                if e.taken == e.nranks {
                    map.remove(&key);
                }
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                e.arrived[rank] = false;
                let joined = e.arrived.iter().filter(|&&a| a).count();
                if joined == 0 {
                    map.remove(&key);
                }
                return Err(Error::Remote(format!(
                    "rank {rank} waited {:?} for the other ranks of this unique id: {} of {nranks} joined",
                    config.timeout,
                    joined + 1
                )));
            }
            map = cv
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Join the MPI world ([`Comm::mpi_world`]) as a caller who claims to be `rank` of
    /// `nranks`, checking every rank's claims collectively (all-gathered), so that all
    /// ranks fail together with `InvalidUsage` when `nranks` is not the MPI world size
    /// or a `rank` is not its MPI world rank. Collective over `MPI_COMM_WORLD`.
    pub fn mpi_join(
        nranks: usize,
        rank: usize,
        topo: Option<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        let comm = Comm::mpi_world(topo, config)?;
        let check = || -> Result<()> {
            let n = comm.size();
            let mine: Vec<u8> =
                [(rank as u32).to_le_bytes(), (nranks as u32).to_le_bytes()].concat();
            let all = Buffer::zeroed(8 * n);
            comm.all_gather(&Buffer::from_bytes(&mine), &all, 8, DataType::U8)?
                .wait()?;
            let all = all.to_bytes()?;
            for (r, c) in all.chunks_exact(8).enumerate() {
                let claimed = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                let nr = u32::from_le_bytes([c[4], c[5], c[6], c[7]]) as usize;
                if nr != n {
                    return Err(mpirun_hint(
                        Error::InvalidUsage(format!(
                            "nranks mismatch: MPI rank {r} passed nranks {nr}, the MPI world has {n} processes"
                        )),
                        n,
                        nr,
                    ));
                }
                if claimed != r {
                    return Err(Error::InvalidUsage(format!(
                        "MPI rank {r} passed rank {claimed}: under the mpi transport rank must be the MPI world rank"
                    )));
                }
            }
            Ok(())
        };
        match check() {
            Ok(()) => Ok(comm),
            Err(e) => {
                let _ = comm.destroy();
                Err(e)
            }
        }
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

#[cfg(test)]
mod hint_tests {
    use super::*;

    /// docs/errors.md: a transport not compiled in names the cargo feature and the
    /// command that turns it on; the fronts find the feature with `missing_feature`.
    #[test]
    fn not_compiled_names_the_feature_and_the_build() {
        for (k, f) in [
            (TransportKind::Mpi, "mpi"),
            (TransportKind::Nccl, "cuda"),
            (TransportKind::CudaLocal, "cuda"),
            (TransportKind::Rccl, "rocm"),
        ] {
            let e = not_compiled(k);
            let m = e.to_string();
            assert!(
                m.starts_with("not compiled: ")
                    && m.contains(&format!("(cargo build --features {f})")),
                "{m}"
            );
            assert_eq!(e.missing_feature(), Some(f), "{m}");
            assert_eq!(e.code(), 5);
        }
        assert_eq!(
            crate::error::Error::InvalidUsage("`mpi` feature".into()).missing_feature(),
            None
        );
    }

    /// docs/errors.md: an MPI world of one process that wanted more says to use mpirun.
    #[test]
    fn one_process_mpi_world_says_mpirun() {
        let e = Topology::parse("nodes:2x4")
            .unwrap()
            .check_world(1)
            .unwrap_err();
        let m = mpirun_hint(e, 1, 8).to_string();
        assert!(m.starts_with("invalid usage: topology nodes:2x4"), "{m}");
        assert!(
            m.ends_with("started without mpirun? start it with mpirun -np 8)"),
            "{m}"
        );
        let e = Error::InvalidUsage("x".into());
        assert_eq!(mpirun_hint(e.clone(), 2, 8), e);
        assert_eq!(mpirun_hint(e.clone(), 1, 1), e);
    }
}
