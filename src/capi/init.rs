//! Versions, errors, unique ids, communicator creation and release.

use super::abi::*;
use super::boundary::{ffi_boundary, write_out};
use super::config::{kind_of, opt_str, settings, transport_code, Settings};
use super::registry::{last_error_ptr, lookup, register, store_error, unregister, Handle};
use crate::comm::bootstrap::{self, env_transport, require_compiled, TransportKind};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::collections::hash_map::RandomState;
use std::ffi::{c_char, c_int, CStr};
use std::hash::{BuildHasher, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Writes the library's version code (`STRATA_VERSION_CODE` of the header it was built
/// with: major * 10000 + minor * 100 + patch) to `*version`.
///
/// Errors: `strataInvalidArgument` when `version` is NULL. Thread-safe.
///
/// # Safety
/// `version` is NULL or valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn strataGetVersion(version: *mut c_int) -> strataResult_t {
    ffi_boundary!("strataGetVersion", std::ptr::null_mut(), {
        // SAFETY: the caller's contract on `version`.
        unsafe { write_out(version, STRATA_VERSION_CODE, "version") }
    })
}

/// The cargo features this library was built with that add transports, as a static,
/// NUL-terminated, comma-separated list in the order `mpi,cuda,rocm` (each present only
/// when compiled in; "" for a build with none). `mpi` brings the mpi transport, `cuda`
/// nccl and cuda-local (CUDA, NVRTC and NCCL are loaded at run time, so a GPU is not
/// needed for the build nor for the report), `rocm` rccl. A transport whose feature is
/// listed may still fail at init where its run-time libraries or devices are missing.
///
/// Ownership: `*features` points at a string that belongs to the library and lives as
/// long as it is loaded; never free it.
///
/// Errors: `strataInvalidArgument` when `features` is NULL. Thread-safe.
///
/// # Safety
/// `features` is NULL or valid for a write of a `const char*`.
#[no_mangle]
pub unsafe extern "C" fn strataGetFeatures(features: *mut *const c_char) -> strataResult_t {
    ffi_boundary!("strataGetFeatures", std::ptr::null_mut(), {
        // SAFETY: the caller's contract on `features`.
        unsafe { write_out(features, compiled_features().as_ptr(), "features") }
    })
}

/// The list `strataGetFeatures` reports (built once from `TransportKind::compiled`).
fn compiled_features() -> &'static CStr {
    static LIST: once_cell::sync::Lazy<std::ffi::CString> = once_cell::sync::Lazy::new(|| {
        let names: Vec<&str> = [TransportKind::Mpi, TransportKind::Nccl, TransportKind::Rccl]
            .into_iter()
            .filter(|k| k.compiled())
            .filter_map(TransportKind::feature)
            .collect();
        std::ffi::CString::new(names.join(",")).expect("feature names hold no NUL")
    });
    LIST.as_c_str()
}

/// A static, NUL-terminated description of a result code (as `ncclGetErrorString`);
/// "unknown result code" for values outside 0..7. Never NULL; do not free. Thread-safe.
///
/// # Safety
/// None: any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn strataGetErrorString(result: strataResult_t) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with STRATA_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with STRATA_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the strata developers",
        4 => c"invalid argument (see strataGetLastError for details)",
        5 => c"invalid usage (see strataGetLastError for details)",
        6 => c"remote process exited, stalled past the timeout, or there was a network error",
        7 => c"strata operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The message of the last failed call on `comm` (`"<function>: <error>"`), or, when
/// `comm` is NULL, destroyed or not a communicator, of the last failed call on this
/// thread. "" when there was none. Never NULL.
///
/// Ownership: the string belongs to strata; it stays valid until the next strata call
/// on that communicator (or, for the thread's message, on this thread), or until the
/// communicator is destroyed. Copy it if you keep it.
///
/// # Safety
/// `comm` is any value; it is never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn strataGetLastError(comm: strataComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| last_error_ptr(comm)));
    r.unwrap_or_else(|_| c"strataGetLastError: internal error".as_ptr())
}

// ---- unique ids ----

const ID_MAGIC: &[u8; 8] = b"STRATAID";
const KEY: std::ops::Range<usize> = 12..28;
/// The byte of strata's part saying which vendor id the id carries.
const VENDOR_FLAG: usize = 28;
const ID_VENDOR_NONE: u8 = 0;
const ID_VENDOR_NCCL: u8 = 1;
const ID_VENDOR_RCCL: u8 = 2;
/// Where the NCCL/RCCL id sits (`ncclUniqueId`: 128 bytes).
const VENDOR_ID: std::ops::Range<usize> = STRATA_UNIQUE_ID_VENDOR_OFFSET..STRATA_UNIQUE_ID_BYTES;
const VENDOR_ID_BYTES: usize = 128;
const _: () = assert!(STRATA_UNIQUE_ID_BYTES - STRATA_UNIQUE_ID_VENDOR_OFFSET == VENDOR_ID_BYTES);
const _: () = assert!(VENDOR_FLAG < STRATA_UNIQUE_ID_VENDOR_OFFSET && KEY.end <= VENDOR_FLAG);
const _: () = assert!(bootstrap::VENDOR_UNIQUE_ID_BYTES == VENDOR_ID_BYTES);

fn fresh_key() -> [u8; 16] {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let mut k = [0u8; 16];
    // The counter makes keys unique within the process (the scope of a local world);
    // the random half keeps ids of different processes apart.
    k[..8].copy_from_slice(&n.to_le_bytes());
    k[8..].copy_from_slice(&h.finish().to_le_bytes());
    k
}

fn id_bytes(id: &strataUniqueId) -> [u8; STRATA_UNIQUE_ID_BYTES] {
    id.internal.map(|c| c as u8)
}

/// What a unique id says: the rendezvous key of an in-process world and, for the nccl
/// and rccl transports, the vendor's id (flag `ID_VENDOR_*`, bytes).
struct IdParts {
    key: [u8; 16],
    vendor: Option<(u8, [u8; VENDOR_ID_BYTES])>,
}

fn parse_id(id: &strataUniqueId) -> Result<IdParts> {
    let b = id_bytes(id);
    if &b[..8] != ID_MAGIC {
        return Err(Error::InvalidArgument(
            "the unique id was not made by strataGetUniqueId".into(),
        ));
    }
    let mut key = [0u8; 16];
    key.copy_from_slice(&b[KEY]);
    let vendor = match b[VENDOR_FLAG] {
        ID_VENDOR_NONE => None,
        f @ (ID_VENDOR_NCCL | ID_VENDOR_RCCL) => {
            let mut v = [0u8; VENDOR_ID_BYTES];
            v.copy_from_slice(&b[VENDOR_ID]);
            Some((f, v))
        }
        f => {
            return Err(Error::InvalidArgument(format!(
                "the unique id is damaged (vendor flag {f})"
            )))
        }
    };
    Ok(IdParts { key, vendor })
}

/// A new unique id for a world of transport `kind`: strata's part, and for nccl/rccl
/// the vendor's id (the transport must be compiled in and its library loadable).
fn new_id(kind: TransportKind) -> Result<strataUniqueId> {
    let mut b = [0u8; STRATA_UNIQUE_ID_BYTES];
    b[..8].copy_from_slice(ID_MAGIC);
    b[8..12].copy_from_slice(&(STRATA_VERSION_CODE as u32).to_le_bytes());
    b[KEY].copy_from_slice(&fresh_key());
    if matches!(kind, TransportKind::Nccl | TransportKind::Rccl) {
        require_compiled(kind)?;
        b[VENDOR_FLAG] = if kind == TransportKind::Rccl {
            ID_VENDOR_RCCL
        } else {
            ID_VENDOR_NCCL
        };
        b[VENDOR_ID].copy_from_slice(&bootstrap::new_vendor_unique_id(kind)?);
    }
    Ok(strataUniqueId {
        internal: b.map(|x| x as c_char),
    })
}

/// Writes a new unique id to `*uniqueId`. Call it once (on one thread, or on one
/// process) and pass the same id to `strataCommInitRank` on every rank of the new world.
///
/// - local, cuda-local: the id names an in-process world.
/// - mpi: `MPI_COMM_WORLD` is the rendezvous and the id is only checked for its format,
///   so broadcasting it (as NCCL programs do) is allowed but not needed.
/// - nccl, rccl (`STRATA_TRANSPORT=nccl` / `rccl`): the id also carries a new NCCL/RCCL
///   unique id (`ncclGetUniqueId`, which loads the library); broadcast it to every
///   process. Programs that choose the transport in the config rather than the
///   environment call `strataGetUniqueIdForTransport`.
///
/// Errors: `strataInvalidArgument` when `uniqueId` is NULL; with `STRATA_TRANSPORT`
/// naming nccl or rccl, `strataInvalidUsage` when the transport is not compiled into this
/// library and the library's error when NCCL/RCCL cannot be loaded. Any other value of
/// `STRATA_TRANSPORT` makes a plain id (the init call reports a bad value).
/// Thread-safe.
///
/// # Safety
/// `uniqueId` is NULL or valid for a write of a `strataUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn strataGetUniqueId(uniqueId: *mut strataUniqueId) -> strataResult_t {
    ffi_boundary!("strataGetUniqueId", std::ptr::null_mut(), {
        if uniqueId.is_null() {
            return Err(Error::InvalidArgument("uniqueId is NULL".into()));
        }
        let kind = match env_transport() {
            Ok(Some(k @ (TransportKind::Nccl | TransportKind::Rccl))) => k,
            _ => TransportKind::Local,
        };
        let id = new_id(kind)?;
        // SAFETY: the caller's contract on `uniqueId`.
        unsafe { write_out(uniqueId, id, "uniqueId") }
    })
}

/// Writes a new unique id for a world of `transport` to `*uniqueId` (as
/// `strataGetUniqueId`, for programs that pick the transport in `strataConfig_t` rather
/// than with `STRATA_TRANSPORT`): for `strataTransportNccl` / `strataTransportRccl` it
/// carries a new NCCL/RCCL unique id; `strataTransportDefault` follows
/// `STRATA_TRANSPORT`.
///
/// Errors: `strataInvalidArgument` for a NULL `uniqueId`, a value that is not a
/// `strataTransport_t` or a bad `STRATA_TRANSPORT`; `strataInvalidUsage` for a transport
/// not compiled into this library (the message names the cargo feature);
/// `strataSystemError` (or the vendor library's code) when NCCL/RCCL cannot be loaded or
/// make an id. Thread-safe.
///
/// # Safety
/// `uniqueId` is NULL or valid for a write of a `strataUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn strataGetUniqueIdForTransport(
    transport: strataTransport_t,
    uniqueId: *mut strataUniqueId,
) -> strataResult_t {
    ffi_boundary!("strataGetUniqueIdForTransport", std::ptr::null_mut(), {
        if uniqueId.is_null() {
            return Err(Error::InvalidArgument("uniqueId is NULL".into()));
        }
        let kind = match transport {
            strataTransportDefault => env_transport()?.unwrap_or(TransportKind::Local),
            t => kind_of(t)?,
        };
        require_compiled(kind)?;
        let id = new_id(kind)?;
        // SAFETY: the caller's contract on `uniqueId`.
        unsafe { write_out(uniqueId, id, "uniqueId") }
    })
}

fn rank_args(nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    if nranks < 1 {
        return Err(Error::InvalidArgument(format!(
            "nranks is {nranks}; a world needs at least one rank"
        )));
    }
    if rank < 0 || rank >= nranks {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    Ok((nranks as usize, rank as usize))
}

// ---- joining ----

/// Join the NCCL/RCCL communicator of the vendor id inside `id` as `rank` of `nranks`
/// ([`Comm::vendor_join_id`]: on this thread's device, `STRATA_DEVICE` else the current
/// one, as NCCL), after checking that the id carries the id of `kind`'s vendor.
fn vendor_rank(
    kind: TransportKind,
    id: &IdParts,
    nranks: usize,
    rank: usize,
    s: &Settings,
) -> Result<Comm> {
    let want = match kind {
        TransportKind::Rccl => ID_VENDOR_RCCL,
        _ => ID_VENDOR_NCCL,
    };
    let name = |f: u8| if f == ID_VENDOR_RCCL { "RCCL" } else { "NCCL" };
    let v = match &id.vendor {
        Some((f, v)) if *f == want => v,
        Some((f, _)) => {
            return Err(Error::InvalidArgument(format!(
                "the unique id carries an {} id but the transport is {}",
                name(*f),
                kind.name()
            )))
        }
        None => {
            return Err(Error::InvalidArgument(format!(
                "the unique id carries no {} id: make the id with STRATA_TRANSPORT={} or \
                 strataGetUniqueIdForTransport({})",
                name(want),
                kind.name(),
                if want == ID_VENDOR_RCCL {
                    "strataTransportRccl"
                } else {
                    "strataTransportNccl"
                }
            )))
        }
    };
    Comm::vendor_join_id(kind, v, rank, nranks, s.topology()?, s.config.clone())
}

/// # Safety
/// As `strataCommInitRankConfig`.
unsafe fn init_rank(
    out: *mut strataComm_t,
    nranks: c_int,
    id: &strataUniqueId,
    rank: c_int,
    cfg: *const strataConfig_t,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::InvalidArgument(
            "comm (the output pointer) is NULL".into(),
        ));
    }
    // SAFETY: caller's contract on `cfg`.
    let s = unsafe { settings(cfg) }?;
    let (n, r) = rank_args(nranks, rank)?;
    let id = parse_id(id)?;
    let comm = match s.kind()? {
        k @ (TransportKind::Local | TransportKind::CudaLocal | TransportKind::HostLocal) => {
            Comm::join_in_process(k, id.key, n, r, s.topo_spec.as_deref(), s.config.clone())?
        }
        TransportKind::Mpi => Comm::mpi_join(n, r, s.topology()?, s.config.clone())?,
        k @ (TransportKind::Nccl | TransportKind::Rccl) => vendor_rank(k, &id, n, r, &s)?,
    };
    let h = register(comm)?;
    // SAFETY: `out` is non-NULL and valid for a write by the caller's contract.
    unsafe { write_out(out, h, "comm") }
}

/// Creates this rank's communicator of a world of `nranks` (NCCL's `ncclCommInitRank`),
/// with the transport of `STRATA_TRANSPORT` (`local`, the default, `mpi`, `nccl`, `rccl`
/// or `cuda-local`). Blocking and collective: returns once all `nranks` ranks have called
/// it with the same id, or fails with `strataRemoteError` after the timeout
/// (`STRATA_TIMEOUT`).
///
/// - local: the ranks are `nranks` threads of this process passing the same `commId`
///   (from one `strataGetUniqueId`), each its own `rank` in `0..nranks`.
/// - mpi: `nranks` must be the MPI world size and `rank` this process's MPI world rank
///   (checked on every rank together: a mismatch fails everywhere with
///   `strataInvalidUsage`). The library initialises MPI with `MPI_THREAD_MULTIPLE` when
///   the program has not (then call `strataFinalize` at the end).
/// - nccl / rccl: as `ncclCommInitRank`: one rank per GPU, any mix of processes and
///   threads, on the device current on the calling thread (`cudaSetDevice` /
///   `hipSetDevice`; `STRATA_DEVICE` overrides). `commId` must carry an NCCL/RCCL id:
///   make it with `strataGetUniqueIdForTransport` (or `strataGetUniqueId` under
///   `STRATA_TRANSPORT=nccl`) on one rank and broadcast it. The node layout is the
///   config's topology, else `STRATA_TOPOLOGY`, else detected from the ranks' hosts.
/// - cuda-local: as local, with every rank on one CUDA device (`STRATA_DEVICE`,
///   default 0) exchanging through device copies.
///
/// Ownership: on success `*comm` is a new communicator owned by the caller; release it
/// with `strataCommDestroy`. On failure `*comm` is not written.
///
/// Errors: `strataInvalidArgument` for a NULL `comm`, `nranks < 1`, `rank` outside
/// `0..nranks`, an id not made by `strataGetUniqueId`, an id without the NCCL/RCCL id
/// the nccl/rccl transport needs, a bad `STRATA_TRANSPORT`; `strataInvalidUsage` for
/// ranks that disagree on `nranks`, the topology or the transport, a rank joining twice,
/// a topology whose size is not `nranks`, a transport not compiled into this library
/// (the message names the cargo feature); `strataUnhandledCudaError` /
/// `strataSystemError` when there is no usable GPU or vendor library;
/// `strataRemoteError` when the other ranks do not arrive within the timeout.
///
/// # Safety
/// `comm` is NULL or valid for a write of a `strataComm_t`.
#[no_mangle]
pub unsafe extern "C" fn strataCommInitRank(
    comm: *mut strataComm_t,
    nranks: c_int,
    commId: strataUniqueId,
    rank: c_int,
) -> strataResult_t {
    ffi_boundary!("strataCommInitRank", std::ptr::null_mut(), {
        // SAFETY: the caller's contract; no config.
        unsafe { init_rank(comm, nranks, &commId, rank, std::ptr::null()) }
    })
}

/// `strataCommInitRank` with settings (NCCL's `ncclCommInitRankConfig`): `config` selects
/// the transport (`strataTransportDefault` reads `STRATA_TRANSPORT`), the topology, the
/// default algorithm and the timeout. `config` may be NULL (as `strataCommInitRank`);
/// otherwise it must be set up with `STRATA_CONFIG_INITIALIZER`, and is read during the
/// call only. On the local and cuda-local transports the settings of the last rank to
/// arrive apply, and every rank must pass the same topology and transport.
///
/// Errors: as `strataCommInitRank`, plus `strataInvalidArgument` for a config with a bad
/// size, magic, version, transport, topology, algorithm or a negative timeout, and
/// `strataInvalidUsage` for a GPU transport (`strataTransportNccl`, `...Rccl`,
/// `...CudaLocal`) not compiled into this library.
///
/// # Safety
/// `comm` as in `strataCommInitRank`; `config` is NULL or points to an initialised
/// `strataConfig_t` whose strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn strataCommInitRankConfig(
    comm: *mut strataComm_t,
    nranks: c_int,
    commId: strataUniqueId,
    rank: c_int,
    config: *const strataConfig_t,
) -> strataResult_t {
    ffi_boundary!("strataCommInitRankConfig", std::ptr::null_mut(), {
        // SAFETY: the caller's contract on `comm` and `config`.
        unsafe { init_rank(comm, nranks, &commId, rank, config) }
    })
}

/// Creates a whole in-process world of `nranks` ranks and writes its communicators to
/// `comms[0..nranks]`, rank i at index i (the C caller's equivalent of
/// `ncclCommInitAll`). Drive each communicator from its own thread (or drive several
/// from one thread inside `strataGroupStart`/`strataGroupEnd`).
///
/// Transport: local (host memory), or cuda-local when the config's transport is
/// `strataTransportCudaLocal` (or it is `strataTransportDefault` and
/// `STRATA_TRANSPORT=cuda-local`): every rank on one CUDA device (`STRATA_DEVICE`,
/// default 0), taking device pointers of it. Any other value of `STRATA_TRANSPORT` is
/// ignored here (local).
///
/// `topology`: a topology SPEC or JSON path (`nodes:2x4`, ...); NULL for the config's,
/// else `STRATA_TOPOLOGY`, else one flat node. Its size must be `nranks`.
/// `config`: NULL or an initialised config (its transport must be default, local or
/// cuda-local).
///
/// Ownership: on success the caller owns the `nranks` communicators (destroy each); on
/// failure `comms` is not written.
///
/// Errors: `strataInvalidArgument` for NULL `comms`, `nranks < 1`, a bad topology SPEC or
/// config, the mpi/nccl/rccl transports; `strataInvalidUsage` when the topology's size is
/// not `nranks` or cuda-local is not compiled into this library; `strataUnhandledCudaError`
/// / `strataSystemError` when the device cannot be opened.
///
/// # Safety
/// `comms` is NULL or valid for writes of `nranks` handles; `topology` is NULL or
/// NUL-terminated; `config` as in `strataCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn strataCommInitLocal(
    comms: *mut strataComm_t,
    nranks: c_int,
    topology: *const c_char,
    config: *const strataConfig_t,
) -> strataResult_t {
    ffi_boundary!("strataCommInitLocal", std::ptr::null_mut(), {
        if comms.is_null() {
            return Err(Error::InvalidArgument("comms is NULL".into()));
        }
        if nranks < 1 {
            return Err(Error::InvalidArgument(format!(
                "nranks is {nranks}; a world needs at least one rank"
            )));
        }
        // SAFETY: the caller's contract on `config`.
        let mut s = unsafe { settings(config) }?;
        let kind = match s.transport {
            strataTransportDefault => match env_transport() {
                Ok(Some(k @ (TransportKind::CudaLocal | TransportKind::HostLocal))) => k,
                _ => TransportKind::Local,
            },
            t => kind_of(t)?,
        };
        match kind {
            TransportKind::Local | TransportKind::CudaLocal | TransportKind::HostLocal => {}
            other => return Err(Error::InvalidArgument(format!(
                "strataCommInitLocal builds an in-process world (local, cuda-local, host-local); use strataCommInitRankConfig for the {} transport",
                other.name()
            ))),
        }
        // SAFETY: the caller's contract on `topology`.
        if let Some(t) = unsafe { opt_str(topology, "topology") }? {
            s.topo_spec = Some(t);
        }
        let world = Comm::in_process_world(kind, nranks as usize, s.topology()?, s.config.clone())?;
        let mut handles = Vec::with_capacity(world.len());
        for c in world {
            match register(c) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    for h in handles {
                        if let Ok(h) = unregister(h) {
                            let _ = h.comm.destroy();
                        }
                    }
                    return Err(e);
                }
            }
        }
        for (i, h) in handles.into_iter().enumerate() {
            // SAFETY: `comms` is valid for `nranks` writes (caller's contract), i < nranks.
            unsafe { comms.add(i).write(h) };
        }
        Ok(())
    })
}

/// Splits `comm` (NCCL's `ncclCommSplit`): collective over `comm`, blocking. Ranks passing
/// the same `color >= 0` form a new communicator, ordered by (`key`, old rank); ranks
/// passing `STRATA_SPLIT_NOCOLOR` get `*newcomm = NULL`. The new communicator inherits
/// `comm`'s transport, topology, algorithm and timeout; `config` (may be NULL) is only
/// validated.
///
/// Ownership: the caller owns `*newcomm` (destroy it; it is independent of `comm`).
///
/// Errors: `strataInvalidArgument` for a NULL/foreign `comm`, NULL `newcomm`,
/// `color < -1`, a bad config; `strataInvalidUsage` for a destroyed `comm`.
///
/// # Safety
/// `newcomm` is NULL or valid for a write of a `strataComm_t`; `config` as in
/// `strataCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn strataCommSplit(
    comm: strataComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut strataComm_t,
    config: *const strataConfig_t,
) -> strataResult_t {
    ffi_boundary!("strataCommSplit", comm, {
        let h = lookup(comm)?;
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        if color < STRATA_SPLIT_NOCOLOR {
            return Err(Error::InvalidArgument(format!(
                "color {color} is negative (use STRATA_SPLIT_NOCOLOR to opt out)"
            )));
        }
        // SAFETY: the caller's contract on `config`.
        unsafe { settings(config) }?;
        let color = (color >= 0).then_some(color as u32);
        let out = match h.comm.split(color, key)? {
            Some(c) => register(c)?,
            None => std::ptr::null_mut(),
        };
        // SAFETY: non-NULL (checked) and valid for a write by the caller's contract.
        unsafe { newcomm.write(out) };
        Ok(())
    })
}

/// Creates a communicator of `nranks` ranks of `comm` (the array `ranks`, in any order,
/// without repeats) called by those ranks alone: ranks not listed do not call (as
/// `MPI_Comm_create_group`; what a framework's `new_group` needs). Every member passes the
/// same list; the new ranks follow its ascending order. The new communicator keeps the
/// world topology, so the hierarchical algorithms apply where its members span nodes.
/// Collective over the members after `comm`'s queued work; members that do not all arrive
/// within the timeout are `strataRemoteError` (no hang). Supported on the mpi and local
/// transports.
///
/// `config` (may be NULL): its `algo`, when set, is the new communicator's default
/// algorithm (else `comm`'s); the other fields are validated.
///
/// Errors: `strataInvalidArgument` for NULL `ranks`/`newcomm` with `nranks > 0`, a rank
/// out of range or repeated, the calling rank missing from the list, a bad config;
/// `strataInvalidUsage` for a destroyed `comm` or a transport other than mpi and local
/// (use `strataCommSplit` there); `strataRemoteError` when members do not arrive.
///
/// # Safety
/// `ranks` is NULL or readable for `nranks` ints; `newcomm` is NULL or valid for a write
/// of a `strataComm_t`; `config` as in `strataCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn strataCommCreateGroup(
    comm: strataComm_t,
    nranks: c_int,
    ranks: *const c_int,
    newcomm: *mut strataComm_t,
    config: *const strataConfig_t,
) -> strataResult_t {
    ffi_boundary!("strataCommCreateGroup", comm, {
        let h = lookup(comm)?;
        let algo = if config.is_null() {
            None
        } else {
            // SAFETY: as above: non-NULL, the caller's struct.
            let s = unsafe { settings(config) }?;
            // SAFETY: `settings` checked the layout; `algo` is NULL or a C string.
            unsafe { opt_str((*config).algo, "config algo") }?.map(|_| s.config.algo)
        };
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        // SAFETY: the caller's contract on `ranks`.
        let list = unsafe { rank_list(ranks, nranks, "ranks", "nranks") }?;
        let out = register(h.comm.create_group_with(&list, algo)?)?;
        // SAFETY: non-NULL (checked) and valid for a write by the caller's contract.
        unsafe { newcomm.write(out) };
        Ok(())
    })
}

/// The `n` ranks at `ptr` (C ints), checked non-negative; `what`/`count` name the
/// arguments in errors.
///
/// # Safety
/// `ptr` is NULL or readable for `n` ints.
unsafe fn rank_list(ptr: *const c_int, n: c_int, what: &str, count: &str) -> Result<Vec<usize>> {
    let n = usize::try_from(n)
        .map_err(|_| Error::InvalidArgument(format!("{count} {n} is negative")))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL (checked) and readable for `n` ints by the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr, n) }
        .iter()
        .map(|&r| {
            usize::try_from(r).map_err(|_| Error::InvalidArgument(format!("rank {r} is negative")))
        })
        .collect()
}

/// Shrinks `comm` (NCCL's `ncclCommShrink`): a new communicator of `comm`'s ranks
/// without the `excludeRanksCount` ranks in `excludeRanksList`, made by the survivors
/// alone (the excluded ranks do not call: they may be dead or frozen), usually after a
/// failure aborted `comm`. Every survivor passes the same list (any order); the new ranks
/// keep the old order. The new communicator keeps `comm`'s transport, topology and
/// configuration (a node that lost ranks becomes a smaller node; the algorithms take the
/// uneven shape or fall back to the ring); `config` (may be NULL) is only validated.
/// `shrinkFlags`: `STRATA_SHRINK_DEFAULT`, or `STRATA_SHRINK_ABORT` to abort `comm`'s
/// operations in flight first. `comm` stays valid (destroy it when done). Survivors that
/// do not all arrive within the timeout are `strataRemoteError` (no hang). Supported on
/// the local, mpi, host-local and cuda-local transports (on mpi also after a process
/// died, when the launcher
/// keeps the survivors: `mpirun --mca orte_enable_recovery 1`).
///
/// Ownership: the caller owns `*newcomm` (destroy it; it is independent of `comm`).
///
/// Errors: `strataInvalidArgument` for a NULL/foreign `comm`, NULL `newcomm`, NULL
/// `excludeRanksList` with a positive count, a negative count, a rank out of range or
/// repeated, the calling rank excluded, unknown flags, a bad config;
/// `strataInvalidUsage` for a destroyed `comm` or a transport that cannot shrink;
/// `strataRemoteError` when survivors do not arrive.
///
/// # Safety
/// `excludeRanksList` is NULL or readable for `excludeRanksCount` ints; `newcomm` is
/// NULL or valid for a write of a `strataComm_t`; `config` as in
/// `strataCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn strataCommShrink(
    comm: strataComm_t,
    excludeRanksList: *const c_int,
    excludeRanksCount: c_int,
    newcomm: *mut strataComm_t,
    config: *const strataConfig_t,
    shrinkFlags: c_int,
) -> strataResult_t {
    ffi_boundary!("strataCommShrink", comm, {
        let h = lookup(comm)?;
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        if shrinkFlags != STRATA_SHRINK_DEFAULT && shrinkFlags != STRATA_SHRINK_ABORT {
            return Err(Error::InvalidArgument(format!(
                "shrinkFlags {shrinkFlags} is neither STRATA_SHRINK_DEFAULT nor STRATA_SHRINK_ABORT"
            )));
        }
        // SAFETY: the caller's contract on `config`.
        unsafe { settings(config) }?;
        // SAFETY: the caller's contract on `excludeRanksList`.
        let list = unsafe {
            rank_list(
                excludeRanksList,
                excludeRanksCount,
                "excludeRanksList",
                "excludeRanksCount",
            )
        }?;
        if shrinkFlags == STRATA_SHRINK_ABORT {
            h.comm.abort();
        }
        let out = register(h.comm.shrink(&list)?)?;
        // SAFETY: non-NULL (checked) and valid for a write by the caller's contract.
        unsafe { newcomm.write(out) };
        Ok(())
    })
}

/// Finishes the work queued on `comm` and releases it (NCCL's `ncclCommDestroy`). The
/// handle is invalid afterwards: calls with it return `strataInvalidUsage`, and strings
/// from `strataGetLastError(comm)` are freed. A NULL `comm` is a no-op returning
/// `strataSuccess` (as NCCL). Not collective on host transports.
///
/// Errors: `strataInvalidUsage` for a destroyed `comm` (double destroy),
/// `strataInvalidArgument` for a foreign value; the handle is released even when
/// draining the queued work reports an error.
///
/// # Safety
/// `comm` is any value; it is never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn strataCommDestroy(comm: strataComm_t) -> strataResult_t {
    ffi_boundary!("strataCommDestroy", comm, {
        if comm.is_null() {
            return Ok(());
        }
        let h = unregister(comm)?;
        h.comm.destroy()
    })
}

/// Aborts `comm` (NCCL's `ncclCommAbort`): wakes every waiter of this communicator, here
/// and on its peers, with an error (peers' calls fail at once instead of waiting for the
/// timeout), and releases the handle as `strataCommDestroy` does. A NULL `comm` is a no-op
/// returning `strataSuccess`. Unlike every other call it may be made from another thread
/// while a call on `comm` is blocked: that call then returns `strataRemoteError`.
///
/// Errors: `strataInvalidUsage` for a destroyed `comm`, `strataInvalidArgument` for a
/// foreign value.
///
/// # Safety
/// `comm` is any value; it is never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn strataCommAbort(comm: strataComm_t) -> strataResult_t {
    ffi_boundary!("strataCommAbort", comm, {
        if comm.is_null() {
            return Ok(());
        }
        let h = unregister(comm)?;
        h.comm.abort();
        Ok(())
    })
}

/// Writes the number of ranks of `comm` to `*count`.
///
/// Errors: `strataInvalidArgument` for a NULL/foreign `comm` or NULL `count`;
/// `strataInvalidUsage` for a destroyed `comm`.
///
/// # Safety
/// `count` is NULL or valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn strataCommCount(comm: strataComm_t, count: *mut c_int) -> strataResult_t {
    ffi_boundary!("strataCommCount", comm, {
        // SAFETY: the caller's contract on `count`.
        unsafe { query(comm, count, "count", |h| h.comm.size() as c_int) }
    })
}

/// Writes this rank's index in `comm` (`0..count`) to `*rank`.
///
/// Errors: as `strataCommCount`.
///
/// # Safety
/// `rank` is NULL or valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn strataCommUserRank(
    comm: strataComm_t,
    rank: *mut c_int,
) -> strataResult_t {
    ffi_boundary!("strataCommUserRank", comm, {
        // SAFETY: the caller's contract on `rank`.
        unsafe { query(comm, rank, "rank", |h| h.comm.rank() as c_int) }
    })
}

/// Writes the transport `comm` runs on (`strataTransportLocal`, `...Mpi`, `...Nccl`,
/// `...Rccl` or `...CudaLocal`, never `strataTransportDefault`) to `*transport`: whether
/// its calls take host pointers (local, mpi) or device pointers (the GPU transports).
///
/// Errors: as `strataCommCount`.
///
/// # Safety
/// `transport` is NULL or valid for a write of a `strataTransport_t`.
#[no_mangle]
pub unsafe extern "C" fn strataCommGetTransport(
    comm: strataComm_t,
    transport: *mut strataTransport_t,
) -> strataResult_t {
    ffi_boundary!("strataCommGetTransport", comm, {
        // SAFETY: the caller's contract on `transport`.
        unsafe {
            query(comm, transport, "transport", |h| {
                transport_code(h.comm.transport_kind())
            })
        }
    })
}

/// Writes to `*result` the failure that aborted `comm` after a call was made (NCCL's
/// `ncclCommGetAsyncError`): a nonblocking call on a strata host stream, or any call
/// whose collective failed while running, leaves its code here (`strataRemoteError` for
/// a dead or stalled peer, `strataInvalidUsage` for counts that differ across ranks, ...),
/// and `strataGetLastError(comm)` says why; `strataSuccess` while nothing failed. The
/// communicator is unusable after a failure: destroy it. Callable from any thread, also
/// while another drives the communicator (a framework's watchdog polls it, as with NCCL).
///
/// Errors: as `strataCommCount` (the function result; the async error goes to `*result`).
///
/// # Safety
/// `result` is NULL or valid for a write of a `strataResult_t`.
#[no_mangle]
pub unsafe extern "C" fn strataCommGetAsyncError(
    comm: strataComm_t,
    result: *mut strataResult_t,
) -> strataResult_t {
    ffi_boundary!("strataCommGetAsyncError", comm, {
        // SAFETY: the caller's contract on `result`.
        unsafe {
            query(comm, result, "result", |h| {
                match h.comm.core().async_error() {
                    Some(e) => {
                        store_error(Some(h), &format!("asynchronous error: {e}"));
                        e.code()
                    }
                    None => strataSuccess,
                }
            })
        }
    })
}

/// The body of the queries of a communicator: look `comm` up and write what `read`
/// says of it to `*out`.
///
/// # Safety
/// `out` is NULL or valid for a write of a `T`.
unsafe fn query<T>(
    comm: strataComm_t,
    out: *mut T,
    what: &str,
    read: impl FnOnce(&Arc<Handle>) -> T,
) -> Result<()> {
    let v = read(&lookup(comm)?);
    // SAFETY: the caller's contract on `out`.
    unsafe { write_out(out, v, what) }
}

/// Finalises MPI when strata initialised it (a program that used the mpi transport
/// without initialising MPI itself calls this once at the end, after destroying its
/// communicators: OpenMPI reports a process that exits without finalising). A no-op when
/// MPI was never used or was initialised by the program (which then finalises it), and
/// in builds without MPI. Communicators of the mpi transport must not be used afterwards.
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn strataFinalize() -> strataResult_t {
    ffi_boundary!("strataFinalize", std::ptr::null_mut(), {
        bootstrap::finalize_mpi();
        Ok(())
    })
}

#[cfg(test)]
mod tests;
