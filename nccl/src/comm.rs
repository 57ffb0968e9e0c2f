//! The communicator handle on strata's CPU device, the transport, and strata's config.
//!
//! An `ncclComm_t` here IS a `strataComm_t`: strata's handles are registry keys that
//! strata never dereferences, so a NULL, destroyed or foreign handle passed to any
//! served function is detected by strata (`ncclInvalidArgument` / `ncclInvalidUsage`)
//! instead of touching freed memory, and a collective costs one strata call with no
//! lookup of this library's own. What this library keeps per communicator beside
//! strata's (PreMulSum ops, `redop.rs`; last messages, `errors.rs`) lives in maps keyed
//! by the handle's value, touched only off the common path.
//!
//! Transport (decided once, at the first `ncclGetUniqueId` or init of the process, the
//! same way on every rank): `STRATA_TRANSPORT` when set (`local` or `mpi`; the GPU
//! transports take device memory and are refused on the CPU device), else `mpi` when
//! the process was started by an MPI launcher (`OMPI_COMM_WORLD_SIZE` or `PMI_SIZE` set),
//! else `local` (ranks are threads of this process). Topology: strata's
//! (`STRATA_TOPOLOGY`, else from the ranks' hosts).

use crate::abi::*;
use crate::serve::{serve, Serve};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use strata::capi::{
    strataComm_t, strataConfig_t, strataTransportLocal, strataTransportMpi, strataTransport_t,
    STRATA_CONFIG_MAGIC, STRATA_VERSION_CODE,
};

/// The strata communicator an `ncclComm_t` is (CPU device).
#[inline(always)]
pub fn sc(comm: ncclComm_t) -> strataComm_t {
    comm.cast()
}

/// The `ncclComm_t` of a strata communicator (CPU device).
#[inline(always)]
pub fn nc(comm: strataComm_t) -> ncclComm_t {
    comm.cast()
}

/// The transport of this process's communicators and its name, or why none.
pub fn transport() -> &'static Result<(strataTransport_t, &'static str), String> {
    static T: OnceLock<Result<(strataTransport_t, &'static str), String>> = OnceLock::new();
    T.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        match env("STRATA_TRANSPORT").map(|v| v.trim().to_ascii_lowercase()) {
            Some(v) if v == "local" => Ok((strataTransportLocal, "local")),
            Some(v) if v == "mpi" => Ok((strataTransportMpi, "mpi")),
            Some(v) => Err(format!(
                "STRATA_TRANSPORT={v} is not served on strata's CPU device (host memory): use local or mpi, or run where the real libnccl.so.2 is"
            )),
            None if env("OMPI_COMM_WORLD_SIZE").is_some() || env("PMI_SIZE").is_some() => {
                Ok((strataTransportMpi, "mpi"))
            }
            None => Ok((strataTransportLocal, "local")),
        }
    })
}

/// The strata config of a new communicator: the transport above; algorithm, topology,
/// timeout and links strata's defaults (environment). Fails when the transport or
/// `STRATA_NCCL` is bad, or `STRATA_NCCL=off` (no real library here).
pub fn strata_config() -> Result<strataConfig_t, (ncclResult_t, String)> {
    let (t, _) = *transport()
        .as_ref()
        .map_err(|e| (ncclInvalidUsage, e.clone()))?;
    let s = serve()
        .as_ref()
        .map_err(|e| (ncclInvalidArgument, e.clone()))?;
    if *s == Serve::Off {
        let why = crate::real::why_none()
            .map(|w| format!("no real libnccl.so.2 was found (tried: {w})"))
            .unwrap_or_else(|| "STRATA_NCCL_DEVICE=cpu chose strata's CPU device".into());
        return Err((
            ncclInvalidUsage,
            format!("STRATA_NCCL=off passes every call to the real library, but {why}; unset STRATA_NCCL to run on strata's CPU device"),
        ));
    }
    Ok(strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC as _,
        version: STRATA_VERSION_CODE as _,
        transport: t,
        topology: std::ptr::null(),
        // Lists apply per call (`collectives.rs`); the rest is strata's own choice.
        algo: std::ptr::null(),
        timeout_ms: 0,
        links: std::ptr::null(),
    })
}

/// The size and topology of the first communicator strata joined (`join.rs`).
static JOINED_ON: OnceLock<(c_int, String)> = OnceLock::new();

/// strata joined a communicator of `n` ranks on `topo` (for the startup line).
pub fn joined_on(n: c_int, topo: String) {
    let _ = JOINED_ON.set((n, topo));
}

/// Print the one startup line (stderr), once per process, when `rank` is 0.
pub fn announce(rank: c_int) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if rank != 0 || DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let serving = match serve() {
        Ok(s) => s.describe(!crate::real::cpu_device()),
        Err(e) => format!("nothing ({e})"),
    };
    let mode = if crate::real::cpu_device() {
        let t = transport().as_ref().map_or("?", |t| t.1);
        format!("strata's CPU device on {t}")
    } else {
        let path = crate::real::real().map_or("?", |r| r.path.as_str());
        let mut v = 0;
        // SAFETY: a live int.
        unsafe { crate::ncclGetVersion(&mut v) };
        let off = matches!(serve(), Ok(Serve::Off) | Err(_));
        let on = match JOINED_ON.get() {
            _ if off => String::new(),
            Some((n, t)) => format!(" on the joined communicators (first: {n} ranks, {t})"),
            None if !cfg!(feature = "cuda") => {
                " nothing: this libstrata_nccl.so was built without --features cuda".into()
            }
            None => " on the blocking communicators it joins (none yet)".into(),
        };
        eprintln!(
            "strata-nccl: NCCL {}.{}.{} at {path}; serving: {serving}{on}; everything else: NCCL",
            v / 10000,
            v / 100 % 100,
            v % 100
        );
        return;
    };
    eprintln!("strata-nccl: {mode}; serving: {serving}");
}
