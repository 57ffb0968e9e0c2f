//! Versions, errors, unique ids, communicator creation and release.

use super::*;
use crate::comm::bootstrap::{self, env_transport, require_compiled, TransportKind};
use crate::comm::CommConfig;
use crate::config::LinkSource;
use crate::kinds::Algo;
use crate::topology::Topology;
use std::collections::hash_map::RandomState;
use std::ffi::CStr;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

// ---- settings ----

/// The `strataTransport_t` of a transport.
pub(crate) fn transport_code(k: TransportKind) -> strataTransport_t {
    match k {
        TransportKind::Local => strataTransportLocal,
        TransportKind::Mpi => strataTransportMpi,
        TransportKind::Nccl => strataTransportNccl,
        TransportKind::Rccl => strataTransportRccl,
        TransportKind::CudaLocal => strataTransportCudaLocal,
        TransportKind::HostLocal => strataTransportHostLocal,
    }
}

/// The transport of an explicit `strataTransport_t` (not `strataTransportDefault`).
fn kind_of(t: strataTransport_t) -> Result<TransportKind> {
    match t {
        strataTransportLocal => Ok(TransportKind::Local),
        strataTransportMpi => Ok(TransportKind::Mpi),
        strataTransportNccl => Ok(TransportKind::Nccl),
        strataTransportRccl => Ok(TransportKind::Rccl),
        strataTransportCudaLocal => Ok(TransportKind::CudaLocal),
        strataTransportHostLocal => Ok(TransportKind::HostLocal),
        _ => Err(Error::InvalidArgument(format!(
            "transport {t} is not a strataTransport_t (0 default, 1 local, 2 mpi, 3 nccl, 4 rccl, 5 cuda-local, 6 host-local)"
        ))),
    }
}

struct Settings {
    transport: strataTransport_t,
    topo_spec: Option<String>,
    config: CommConfig,
}

impl Settings {
    /// The transport: the config's, else `STRATA_TRANSPORT`, else local. A GPU transport
    /// this build lacks is `NotCompiled` (the mpi transport reports it when it starts).
    fn kind(&self) -> Result<TransportKind> {
        let k = match self.transport {
            strataTransportDefault => env_transport()?.unwrap_or(TransportKind::Local),
            t => kind_of(t)?,
        };
        if k.is_gpu() {
            require_compiled(k)?;
        }
        Ok(k)
    }

    fn topology(&self) -> Result<Option<Topology>> {
        self.topo_spec.as_deref().map(Topology::parse).transpose()
    }
}

/// A C string argument: NULL or "" is `None`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    let s = s
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{what} is not UTF-8")))?;
    Ok((!s.trim().is_empty()).then(|| s.to_string()))
}

/// The fields of `strataConfig_t` before `links` (a config of an older header).
#[repr(C)]
struct ConfigBeforeLinks {
    size: usize,
    magic: c_uint,
    version: c_uint,
    transport: strataTransport_t,
    topology: *const c_char,
    algo: *const c_char,
    timeout_ms: c_int,
}

/// Validate a config (NULL: the environment's defaults).
///
/// # Safety
/// `cfg` is NULL or points to a `strataConfig_t` of at least `cfg->size` bytes whose
/// strings are NULL or NUL-terminated.
unsafe fn settings(cfg: *const strataConfig_t) -> Result<Settings> {
    let mut config = CommConfig::from_env()?;
    if cfg.is_null() {
        return Ok(Settings {
            transport: strataTransportDefault,
            topo_spec: None,
            config,
        });
    }
    // SAFETY: non-NULL; `size` is the first field of every version of the struct.
    let size = unsafe { std::ptr::addr_of!((*cfg).size).read_unaligned() };
    if size < super::CONFIG_SIZE_BEFORE_LINKS {
        return Err(Error::InvalidArgument(format!(
            "config size is {size}, this library needs at least {} (initialise it with STRATA_CONFIG_INITIALIZER)",
            super::CONFIG_SIZE_BEFORE_LINKS
        )));
    }
    // SAFETY: the caller's struct holds at least the fields before `links` (checked just
    // above); `links` is read below only when `size` covers it.
    let c = unsafe { &*cfg.cast::<ConfigBeforeLinks>() };
    if c.magic != STRATA_CONFIG_MAGIC {
        return Err(Error::InvalidArgument(format!(
            "config magic is {:#x}, expected {STRATA_CONFIG_MAGIC:#x} (initialise it with STRATA_CONFIG_INITIALIZER)",
            c.magic
        )));
    }
    if c.version == 0 {
        return Err(Error::InvalidArgument(
            "config version is 0 (initialise it with STRATA_CONFIG_INITIALIZER)".into(),
        ));
    }
    if c.transport != strataTransportDefault {
        let k = kind_of(c.transport).map_err(|_| {
            Error::InvalidArgument(format!(
                "config transport {} is not a strataTransport_t (0 default, 1 local, 2 mpi, 3 nccl, 4 rccl, 5 cuda-local, 6 host-local)",
                c.transport
            ))
        })?;
        if k.is_gpu() {
            require_compiled(k)?;
        }
    }
    // SAFETY: the caller's contract on the strings.
    let topo_spec = unsafe { opt_str(c.topology, "config topology") }?;
    // SAFETY: as above.
    if let Some(a) = unsafe { opt_str(c.algo, "config algo") }? {
        config.algo = a.parse::<Algo>()?;
    }
    match c.timeout_ms {
        t if t < 0 => {
            return Err(Error::InvalidArgument(format!(
                "config timeout_ms is {t}; use 0 for the default"
            )))
        }
        0 => {}
        t => config.timeout = Duration::from_millis(t as u64),
    }
    if let Some(s) = &topo_spec {
        Topology::parse(s)?;
    }
    if size >= std::mem::size_of::<strataConfig_t>() {
        // SAFETY: `size` covers the whole current layout; the string per the contract.
        let links = unsafe { opt_str((*cfg).links, "config links") }?;
        if let Some(l) = links {
            config.links = LinkSource::parse(&l)
                .map_err(|e| Error::InvalidArgument(format!("config {e}")))?
                .unwrap_or_default();
        }
    }
    Ok(Settings {
        transport: c.transport,
        topo_spec,
        config,
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
        if !matches!(
            kind,
            TransportKind::Local | TransportKind::CudaLocal | TransportKind::HostLocal
        ) {
            return Err(Error::InvalidArgument(format!(
                "strataCommInitLocal builds an in-process world (local, cuda-local, host-local); use strataCommInitRankConfig for the {} transport",
                kind.name()
            )));
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
        let h = lookup(comm)?;
        // SAFETY: the caller's contract on `count`.
        unsafe { write_out(count, h.comm.size() as c_int, "count") }
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
        let h = lookup(comm)?;
        // SAFETY: the caller's contract on `rank`.
        unsafe { write_out(rank, h.comm.rank() as c_int, "rank") }
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
        let h = lookup(comm)?;
        let t = transport_code(h.comm.transport_kind());
        // SAFETY: the caller's contract on `transport`.
        unsafe { write_out(transport, t, "transport") }
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
        let h = lookup(comm)?;
        let code = match h.comm.core().async_error() {
            Some(e) => {
                store_error(Some(&h), &format!("asynchronous error: {e}"));
                e.code()
            }
            None => strataSuccess,
        };
        // SAFETY: the caller's contract on `result`.
        unsafe { write_out(result, code, "result") }
    })
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
mod tests {
    use super::*;
    use crate::comm::bootstrap::parse_transport;
    use std::ptr::{null, null_mut};

    fn last() -> String {
        // SAFETY: strataGetLastError returns a valid C string for any argument.
        unsafe { CStr::from_ptr(strataGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned()
    }

    fn zero_id() -> strataUniqueId {
        strataUniqueId {
            internal: [0; STRATA_UNIQUE_ID_BYTES],
        }
    }

    #[test]
    fn features_name_the_compiled_transports() {
        let mut p: *const c_char = null();
        // SAFETY: a valid out-pointer, then the static string it received.
        assert_eq!(unsafe { strataGetFeatures(&mut p) }, strataSuccess);
        let got = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
        let all = [
            ("mpi", cfg!(feature = "mpi")),
            ("cuda", cfg!(feature = "cuda")),
            ("rocm", cfg!(feature = "rocm")),
        ];
        let want: Vec<&str> = all
            .into_iter()
            .filter(|&(_, on)| on)
            .map(|(f, _)| f)
            .collect();
        assert_eq!(got, want.join(","));
        // The same static string on every call.
        let mut q: *const c_char = null();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { strataGetFeatures(&mut q) }, strataSuccess);
        assert_eq!(p, q);
        // SAFETY: NULL is checked, never written.
        assert_eq!(
            unsafe { strataGetFeatures(null_mut()) },
            strataInvalidArgument
        );
        assert!(
            last().contains("strataGetFeatures") && last().contains("features is NULL"),
            "{}",
            last()
        );
    }

    fn id_for(t: strataTransport_t) -> (strataResult_t, strataUniqueId) {
        let mut id = zero_id();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { strataGetUniqueIdForTransport(t, &mut id) };
        (rc, id)
    }

    fn config(transport: strataTransport_t, timeout_ms: c_int) -> strataConfig_t {
        strataConfig_t {
            size: std::mem::size_of::<strataConfig_t>(),
            magic: STRATA_CONFIG_MAGIC,
            version: STRATA_VERSION_CODE as u32,
            transport,
            topology: null(),
            algo: null(),
            timeout_ms,
            links: null(),
        }
    }

    #[test]
    fn capi_unique_id_layout() {
        assert_eq!(std::mem::size_of::<strataUniqueId>(), 256);
        assert_eq!(STRATA_UNIQUE_ID_VENDOR_OFFSET, 128);
        for t in [strataTransportLocal, strataTransportDefault] {
            if t == strataTransportDefault
                && matches!(
                    env_transport(),
                    Ok(Some(TransportKind::Nccl | TransportKind::Rccl))
                )
            {
                continue; // the environment asks for a vendor id
            }
            let (rc, id) = id_for(t);
            assert_eq!(rc, strataSuccess, "{}", last());
            let b = id_bytes(&id);
            assert_eq!(&b[..8], b"STRATAID");
            assert_eq!(
                u32::from_le_bytes(b[8..12].try_into().unwrap()),
                STRATA_VERSION_CODE as u32
            );
            assert_ne!(&b[KEY], &[0u8; 16]);
            assert_eq!(b[VENDOR_FLAG], ID_VENDOR_NONE);
            assert!(
                b[VENDOR_FLAG..].iter().all(|&x| x == 0),
                "reserved and vendor bytes are zero"
            );
            let p = parse_id(&id).unwrap();
            assert!(p.vendor.is_none());
        }
        // Two ids name two worlds.
        let (_, a) = id_for(strataTransportLocal);
        let (_, b) = id_for(strataTransportLocal);
        assert_ne!(parse_id(&a).unwrap().key, parse_id(&b).unwrap().key);
        // A damaged vendor flag is refused.
        let mut bad = id_bytes(&a);
        bad[VENDOR_FLAG] = 7;
        let bad = strataUniqueId {
            internal: bad.map(|x| x as c_char),
        };
        assert_eq!(parse_id(&bad).err().unwrap().code(), strataInvalidArgument);
    }

    #[test]
    fn capi_unique_id_for_transport_errors() {
        // SAFETY: NULL is checked first.
        let rc = unsafe { strataGetUniqueIdForTransport(strataTransportLocal, null_mut()) };
        assert_eq!(rc, strataInvalidArgument);
        for t in [-1, 7, 99] {
            let (rc, _) = id_for(t);
            assert_eq!(rc, strataInvalidArgument, "{t}");
            assert!(last().contains("not a strataTransport_t"), "{}", last());
        }
        for (t, kind) in [
            (strataTransportMpi, TransportKind::Mpi),
            (strataTransportNccl, TransportKind::Nccl),
            (strataTransportRccl, TransportKind::Rccl),
            (strataTransportCudaLocal, TransportKind::CudaLocal),
        ] {
            if kind.compiled() {
                continue;
            }
            let (rc, _) = id_for(t);
            assert_eq!(rc, strataInvalidUsage, "{}: {}", kind.name(), last());
            let f = kind.feature().unwrap();
            assert!(
                last().contains(&format!("`{f}` feature")) && last().contains(kind.name()),
                "{}",
                last()
            );
        }
        let (rc, id) = id_for(strataTransportCudaLocal);
        if TransportKind::CudaLocal.compiled() {
            assert_eq!(rc, strataSuccess);
            assert!(parse_id(&id).unwrap().vendor.is_none());
        }
        let (rc, id) = id_for(strataTransportHostLocal);
        assert_eq!(rc, strataSuccess, "{}", last());
        assert!(parse_id(&id).unwrap().vendor.is_none());
    }

    #[test]
    fn capi_transport_names() {
        assert_eq!(parse_transport("").unwrap(), None);
        assert_eq!(
            parse_transport(" Local ").unwrap(),
            Some(TransportKind::Local)
        );
        assert_eq!(parse_transport("mpi").unwrap(), Some(TransportKind::Mpi));
        assert_eq!(parse_transport("nccl").unwrap(), Some(TransportKind::Nccl));
        assert_eq!(parse_transport("RCCL").unwrap(), Some(TransportKind::Rccl));
        assert_eq!(
            parse_transport("cuda-local").unwrap(),
            Some(TransportKind::CudaLocal)
        );
        let e = parse_transport("gloo").unwrap_err();
        assert_eq!(e.code(), strataInvalidArgument);
        assert!(e.to_string().contains("cuda-local"), "{e}");
        for k in TransportKind::ALL {
            assert_eq!(kind_of(transport_code(k)).unwrap(), k);
            assert_eq!(parse_transport(k.name()).unwrap(), Some(k));
        }
        assert_eq!(kind_of(strataTransportDefault).unwrap_err().code(), 4);
    }

    #[test]
    fn capi_config_links() {
        std::env::set_var(
            "STRATA_LINKS_CACHE",
            std::env::temp_dir().join("strata-capi-links"),
        );
        let mut comms = [null_mut(); 2];
        let topo = CString::new("nodes:2x1").unwrap();
        let bad = CString::new("measured").unwrap();
        let mut cfg = config(strataTransportLocal, 20_000);
        cfg.topology = topo.as_ptr();
        cfg.links = bad.as_ptr();
        // SAFETY: room for 2 handles, a valid config.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        assert_eq!(rc, strataInvalidArgument);
        assert!(last().contains("preset, probe, reprobe"), "{}", last());
        // A config of the size before `links` is read without it.
        cfg.size = super::super::CONFIG_SIZE_BEFORE_LINKS;
        // SAFETY: as above; `links` lies beyond `size` and is not read.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        assert_eq!(rc, strataSuccess, "{}", last());
        for c in comms {
            assert!(lookup(c).unwrap().comm.topology().measured.is_none());
            // SAFETY: live handle, destroyed once.
            assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
        }
        cfg.size = std::mem::size_of::<strataConfig_t>();
        let probe = CString::new("reprobe").unwrap();
        cfg.links = probe.as_ptr();
        // SAFETY: as above.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        assert_eq!(rc, strataSuccess, "{}", last());
        let t0 = lookup(comms[0]).unwrap().comm.topology().clone();
        let m = t0.measured.as_ref().expect("probed");
        assert_eq!(m.classes, vec![crate::topology::LinkClass::InterNode]);
        for c in comms {
            assert_eq!(*lookup(c).unwrap().comm.topology(), t0);
            // SAFETY: live handle, destroyed once.
            assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
        }
    }

    #[test]
    fn capi_config_transport_validation() {
        let mut comms = [null_mut(); 2];
        // Out of range.
        for t in [7, -1] {
            let cfg = config(t, 0);
            // SAFETY: room for 2 handles, a valid config.
            let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
            assert_eq!(rc, strataInvalidArgument);
            assert!(last().contains("6 host-local"), "{}", last());
        }
        // host-local: always built, an in-process world on the CPU device.
        let cfg = config(strataTransportHostLocal, 0);
        // SAFETY: as above.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        assert_eq!(rc, strataSuccess, "{}", last());
        for c in comms {
            let mut t = 0;
            // SAFETY: live handles, destroyed once.
            unsafe {
                assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
                assert_eq!(t, strataTransportHostLocal);
                assert_eq!(strataCommDestroy(c), strataSuccess);
            }
        }
        // The GPU transports: not compiled, or not an in-process world (nccl, rccl).
        for (t, kind) in [
            (strataTransportNccl, TransportKind::Nccl),
            (strataTransportRccl, TransportKind::Rccl),
        ] {
            let cfg = config(t, 0);
            // SAFETY: as above.
            let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
            if kind.compiled() {
                assert_eq!(rc, strataInvalidArgument, "{}", last());
                assert!(last().contains("strataCommInitRankConfig"), "{}", last());
            } else {
                assert_eq!(rc, strataInvalidUsage, "{}", last());
                assert!(last().contains("feature"), "{}", last());
                // The same through strataCommInitRankConfig and strataCommSplit's check.
                let (_, id) = id_for(strataTransportLocal);
                let mut c = null_mut();
                // SAFETY: valid pointers.
                let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
                assert_eq!(rc, strataInvalidUsage, "{}", last());
                assert!(last().contains(&format!("`{}` feature", kind.feature().unwrap())));
                assert!(c.is_null());
            }
        }
        let cfg = config(strataTransportCudaLocal, 0);
        // SAFETY: as above.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        if !TransportKind::CudaLocal.compiled() {
            assert_eq!(rc, strataInvalidUsage, "{}", last());
            assert!(last().contains("`cuda` feature"), "{}", last());
        } else if crate::device::count(crate::device::Api::Cuda) == 0 {
            assert_ne!(rc, strataSuccess, "cuda-local without a GPU");
            assert!(!last().is_empty());
        } else {
            assert_eq!(rc, strataSuccess, "{}", last());
            for c in comms {
                let mut t = 0;
                // SAFETY: live handles, destroyed once.
                unsafe {
                    assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
                    assert_eq!(t, strataTransportCudaLocal);
                    assert_eq!(strataCommDestroy(c), strataSuccess);
                }
            }
        }
    }

    #[test]
    fn capi_host_comm_reports_its_transport_and_stays_on_the_host() {
        let mut comms = [null_mut(); 1];
        let cfg = config(strataTransportLocal, 5000);
        // SAFETY: room for 1 handle, a valid config.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 1, null(), &cfg) };
        assert_eq!(rc, strataSuccess, "{}", last());
        let c = comms[0];
        let mut t = -1;
        // SAFETY: live handle; valid and NULL out-pointers.
        unsafe {
            assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
            assert_eq!(strataCommGetTransport(c, null_mut()), strataInvalidArgument);
            assert_eq!(
                strataCommGetTransport(null_mut(), &mut t),
                strataInvalidArgument
            );
        }
        assert_eq!(t, strataTransportLocal);
        assert!(lookup(c).unwrap().comm.device().is_none());
        // Host pointers (any pointer, to a host transport) are host memory: no device
        // check (none is possible here), copied in and out as before.
        let x = [1.5f32, -2.0];
        let mut y = [0f32; 2];
        // SAFETY: 2 floats each; live communicator; the stream is ignored.
        let rc = unsafe {
            strataAllReduce(
                x.as_ptr() as *const c_void,
                y.as_mut_ptr() as *mut c_void,
                2,
                strataFloat32,
                strataSum,
                c,
                0x1234 as strataStream_t,
            )
        };
        assert_eq!(rc, strataSuccess, "{}", last());
        assert_eq!(y, x);
        // SAFETY: live handle, destroyed once.
        assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
    }

    #[test]
    fn capi_vendor_transport_needs_a_vendor_id() {
        for (t, kind, what) in [
            (
                strataTransportNccl,
                TransportKind::Nccl,
                "STRATA_TRANSPORT=nccl",
            ),
            (
                strataTransportRccl,
                TransportKind::Rccl,
                "STRATA_TRANSPORT=rccl",
            ),
        ] {
            if !kind.compiled() {
                continue;
            }
            let (_, id) = id_for(strataTransportLocal);
            let cfg = config(t, 2000);
            let mut c = null_mut();
            // SAFETY: valid pointers.
            let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
            assert_eq!(rc, strataInvalidArgument, "{}", last());
            assert!(
                last().contains(what) && last().contains("strataGetUniqueIdForTransport"),
                "{}",
                last()
            );
            assert!(c.is_null());
        }
    }

    /// With `--features cuda` and libnccl loadable (the nvidia-nccl-cu12 wheel through
    /// `STRATA_NCCL_LIB`): the id carries a real NCCL id; without a GPU, joining fails
    /// with an error code (never a crash or a hang); with one, a 1-rank world works.
    #[cfg(feature = "cuda")]
    #[test]
    fn capi_nccl_unique_id_and_init_without_a_gpu() {
        use std::time::Instant;
        if let Err(e) = bootstrap::new_vendor_unique_id(TransportKind::Nccl) {
            if std::env::var_os("STRATA_REQUIRE_NCCL").is_some() {
                panic!("STRATA_REQUIRE_NCCL is set but libnccl does not load: {e}");
            }
            eprintln!("skipped: libnccl does not load ({e})");
            let (rc, _) = id_for(strataTransportNccl);
            assert_ne!(rc, strataSuccess);
            assert!(!last().is_empty());
            return;
        }
        let (rc, id) = id_for(strataTransportNccl);
        assert_eq!(rc, strataSuccess, "{}", last());
        let b = id_bytes(&id);
        assert_eq!(&b[..8], b"STRATAID");
        assert_eq!(b[VENDOR_FLAG], ID_VENDOR_NCCL);
        assert!(
            b[VENDOR_ID].iter().any(|&x| x != 0),
            "the NCCL id is embedded"
        );
        let (_, id2) = id_for(strataTransportNccl);
        assert_ne!(&id_bytes(&id2)[VENDOR_ID], &b[VENDOR_ID], "fresh NCCL ids");
        assert!(matches!(
            parse_id(&id).unwrap().vendor,
            Some((ID_VENDOR_NCCL, _))
        ));

        let cfg = config(strataTransportNccl, 10_000);
        let mut c = null_mut();
        let t0 = Instant::now();
        // SAFETY: valid pointers.
        let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
        if crate::device::count(crate::device::Api::Cuda) == 0 {
            assert_ne!(rc, strataSuccess, "nccl without a GPU");
            assert!(
                [
                    strataUnhandledCudaError,
                    strataSystemError,
                    strataInvalidUsage
                ]
                .contains(&rc),
                "{rc}: {}",
                last()
            );
            assert!(!last().is_empty());
            assert!(c.is_null());
            assert!(t0.elapsed() < Duration::from_secs(30));
        } else {
            assert_eq!(rc, strataSuccess, "{}", last());
            let mut t = 0;
            // SAFETY: live handle, destroyed once.
            unsafe {
                assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
                assert_eq!(strataCommDestroy(c), strataSuccess);
            }
            assert_eq!(t, strataTransportNccl);
        }
        // An NCCL id on the rccl transport (when built) is refused by kind.
        if TransportKind::Rccl.compiled() {
            let cfg = config(strataTransportRccl, 2000);
            let mut c = null_mut();
            // SAFETY: valid pointers.
            let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
            assert_eq!(rc, strataInvalidArgument, "{}", last());
        }
    }
}
