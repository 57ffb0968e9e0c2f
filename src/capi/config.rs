//! The settings of a new communicator: a `strataConfig_t` (of this header or an older
//! one) checked field by field over the environment's defaults, and the mapping between
//! `strataTransport_t` and the library's transports.

use super::abi::*;
use crate::comm::bootstrap::{env_transport, require_compiled, TransportKind};
use crate::comm::CommConfig;
use crate::config::LinkSource;
use crate::error::{Error, Result};
use crate::kinds::Algo;
use crate::topology::Topology;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::time::Duration;

/// The `strataTransport_t` of a transport.
pub(super) fn transport_code(k: TransportKind) -> strataTransport_t {
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
pub(super) fn kind_of(t: strataTransport_t) -> Result<TransportKind> {
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

pub(super) struct Settings {
    pub(super) transport: strataTransport_t,
    pub(super) topo_spec: Option<String>,
    pub(super) config: CommConfig,
}

impl Settings {
    /// The transport: the config's, else `STRATA_TRANSPORT`, else local. A GPU transport
    /// this build lacks is `NotCompiled` (the mpi transport reports it when it starts).
    pub(super) fn kind(&self) -> Result<TransportKind> {
        let k = match self.transport {
            strataTransportDefault => env_transport()?.unwrap_or(TransportKind::Local),
            t => kind_of(t)?,
        };
        if k.is_gpu() {
            require_compiled(k)?;
        }
        Ok(k)
    }

    pub(super) fn topology(&self) -> Result<Option<Topology>> {
        self.topo_spec.as_deref().map(Topology::parse).transpose()
    }
}

/// A C string argument: NULL or "" is `None`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(super) unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>> {
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
pub(super) unsafe fn settings(cfg: *const strataConfig_t) -> Result<Settings> {
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
