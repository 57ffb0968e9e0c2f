//! The C calls of a script as data ([`Call`]), one `unsafe` dispatcher ([`invoke`]) and
//! the checked entry every script step goes through ([`Ctx::call`]): it counts the call,
//! and for a failure checks that the code is one the step expects and that
//! `strataGetLastError` and `strataGetErrorString` give non-empty text, then records the
//! (function, code) pair and the normalised message ([`crate::stats`]).

use crate::stats::{normalise, STATS};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use strata::capi::*;

/// A communicator handle as a plain integer (handles are registry keys, never
/// dereferenced, so passing them between threads as integers is what C programs do).
pub type H = usize;

pub fn comm(h: H) -> strataComm_t {
    h as strataComm_t
}

/// One C call with its raw arguments. Pointers point into buffers owned by the step
/// that built the call, sized for the counts passed, or are deliberately bad in ways
/// the ABI must reject before touching memory (NULL with a nonzero count, an
/// overflowing count, overlapping ranges).
#[derive(Clone, Copy)]
pub enum Call {
    AllGather(*const c_void, *mut c_void, usize, c_int, H),
    AllGatherQ(*const c_void, *mut c_void, usize, c_int, c_int, usize, H),
    ReduceScatter(*const c_void, *mut c_void, usize, c_int, c_int, H),
    ReduceScatterQ(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        usize,
        H,
    ),
    AllReduce(*const c_void, *mut c_void, usize, c_int, c_int, H),
    AllToAll(*const c_void, *mut c_void, usize, c_int, H),
    Broadcast(*const c_void, *mut c_void, usize, c_int, c_int, H),
    Bcast(*mut c_void, usize, c_int, c_int, H),
    Send(*const c_void, usize, c_int, c_int, H),
    Recv(*mut c_void, usize, c_int, c_int, H),
    AgCoalesced(
        *const *const c_void,
        *const *mut c_void,
        *const usize,
        usize,
        c_int,
        H,
    ),
    RsCoalesced(
        *const *const c_void,
        *const *mut c_void,
        *const usize,
        usize,
        c_int,
        c_int,
        H,
    ),
    GroupStart,
    GroupEnd,
    Count(H, *mut c_int),
    UserRank(H, *mut c_int),
    Transport(H, *mut c_int),
    Split(H, c_int, c_int, *mut strataComm_t, *const strataConfig_t),
    Destroy(H),
    Abort(H),
    Version(*mut c_int),
    UniqueId(*mut strataUniqueId),
    UniqueIdFor(c_int, *mut strataUniqueId),
    /// `strataCommInitRankConfig` (`strataCommInitRank` when the config is NULL).
    InitRank(
        *mut strataComm_t,
        c_int,
        strataUniqueId,
        c_int,
        *const strataConfig_t,
    ),
    InitLocal(
        *mut strataComm_t,
        c_int,
        *const c_char,
        *const strataConfig_t,
    ),
}

impl Call {
    pub fn name(&self) -> &'static str {
        match self {
            Call::AllGather(..) => "strataAllGather",
            Call::AllGatherQ(..) => "strataAllGatherQuantized",
            Call::ReduceScatter(..) => "strataReduceScatter",
            Call::ReduceScatterQ(..) => "strataReduceScatterQuantized",
            Call::AllReduce(..) => "strataAllReduce",
            Call::AllToAll(..) => "strataAllToAll",
            Call::Broadcast(..) => "strataBroadcast",
            // strataBcast forwards to strataBroadcast, whose name its messages carry.
            Call::Bcast(..) => "strataBroadcast",
            Call::Send(..) => "strataSend",
            Call::Recv(..) => "strataRecv",
            Call::AgCoalesced(..) => "strataAllGatherCoalesced",
            Call::RsCoalesced(..) => "strataReduceScatterCoalesced",
            Call::GroupStart => "strataGroupStart",
            Call::GroupEnd => "strataGroupEnd",
            Call::Count(..) => "strataCommCount",
            Call::UserRank(..) => "strataCommUserRank",
            Call::Transport(..) => "strataCommGetTransport",
            Call::Split(..) => "strataCommSplit",
            Call::Destroy(..) => "strataCommDestroy",
            Call::Abort(..) => "strataCommAbort",
            Call::Version(..) => "strataGetVersion",
            Call::UniqueId(..) => "strataGetUniqueId",
            Call::UniqueIdFor(..) => "strataGetUniqueIdForTransport",
            Call::InitRank(_, _, _, _, c) if c.is_null() => "strataCommInitRank",
            Call::InitRank(..) => "strataCommInitRankConfig",
            Call::InitLocal(..) => "strataCommInitLocal",
        }
    }

    /// The name the statistics use (strataBcast kept apart from strataBroadcast).
    pub fn export(&self) -> &'static str {
        match self {
            Call::Bcast(..) => "strataBcast",
            c => c.name(),
        }
    }

    /// The communicator the call names, if any.
    pub fn comm(&self) -> Option<H> {
        Some(match *self {
            Call::AllGather(.., h)
            | Call::AllGatherQ(.., h)
            | Call::ReduceScatter(.., h)
            | Call::ReduceScatterQ(.., h)
            | Call::AllReduce(.., h)
            | Call::AllToAll(.., h)
            | Call::Broadcast(.., h)
            | Call::Bcast(.., h)
            | Call::Send(.., h)
            | Call::Recv(.., h)
            | Call::AgCoalesced(.., h)
            | Call::RsCoalesced(.., h)
            | Call::Destroy(h)
            | Call::Abort(h)
            | Call::Count(h, _)
            | Call::UserRank(h, _)
            | Call::Transport(h, _)
            | Call::Split(h, ..) => h,
            _ => return None,
        })
    }
}

/// Make the call.
///
/// # Safety
/// Every pointer of `call` is NULL, or valid for the reads and writes the C API's
/// contract of that function allows for the counts passed (buffers owned by the caller
/// and untouched by other threads until the call, or its group, ends), or a value the
/// function must reject before dereferencing it (see [`Call`]).
pub unsafe fn invoke(call: Call) -> c_int {
    let s = null_mut();
    // SAFETY (every arm): the caller's contract, forwarded to the C API's.
    unsafe {
        match call {
            Call::AllGather(a, b, n, d, h) => strataAllGather(a, b, n, d, comm(h), s),
            Call::AllGatherQ(a, b, n, d, q, k, h) => {
                strataAllGatherQuantized(a, b, n, d, q, k, comm(h), s)
            }
            Call::ReduceScatter(a, b, n, d, o, h) => strataReduceScatter(a, b, n, d, o, comm(h), s),
            Call::ReduceScatterQ(a, b, n, d, o, q, k, h) => {
                strataReduceScatterQuantized(a, b, n, d, o, q, k, comm(h), s)
            }
            Call::AllReduce(a, b, n, d, o, h) => strataAllReduce(a, b, n, d, o, comm(h), s),
            Call::AllToAll(a, b, n, d, h) => strataAllToAll(a, b, n, d, comm(h), s),
            Call::Broadcast(a, b, n, d, r, h) => strataBroadcast(a, b, n, d, r, comm(h), s),
            Call::Bcast(b, n, d, r, h) => strataBcast(b, n, d, r, comm(h), s),
            Call::Send(a, n, d, p, h) => strataSend(a, n, d, p, comm(h), s),
            Call::Recv(b, n, d, p, h) => strataRecv(b, n, d, p, comm(h), s),
            Call::AgCoalesced(a, b, c, n, d, h) => {
                strataAllGatherCoalesced(a, b, c, n, d, comm(h), s)
            }
            Call::RsCoalesced(a, b, c, n, d, o, h) => {
                strataReduceScatterCoalesced(a, b, c, n, d, o, comm(h), s)
            }
            Call::GroupStart => strataGroupStart(),
            Call::GroupEnd => strataGroupEnd(),
            Call::Count(h, o) => strataCommCount(comm(h), o),
            Call::UserRank(h, o) => strataCommUserRank(comm(h), o),
            Call::Transport(h, o) => strataCommGetTransport(comm(h), o),
            Call::Split(h, c, k, o, cfg) => strataCommSplit(comm(h), c, k, o, cfg),
            Call::Destroy(h) => strataCommDestroy(comm(h)),
            Call::Abort(h) => strataCommAbort(comm(h)),
            Call::Version(o) => strataGetVersion(o),
            Call::UniqueId(o) => strataGetUniqueId(o),
            Call::UniqueIdFor(t, o) => strataGetUniqueIdForTransport(t, o),
            Call::InitRank(o, n, id, r, cfg) if cfg.is_null() => strataCommInitRank(o, n, id, r),
            Call::InitRank(o, n, id, r, cfg) => strataCommInitRankConfig(o, n, id, r, cfg),
            Call::InitLocal(o, n, t, cfg) => strataCommInitLocal(o, n, t, cfg),
        }
    }
}

/// A C string returned by strata as text.
pub fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: strata returns NUL-terminated strings that stay valid until the next call
    // on this thread (or communicator); read at once.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// What a script step is running as: where its failures are reported.
pub struct Ctx {
    pub label: String,
}

/// Which codes a step accepts.
pub type Expect<'a> = &'a [c_int];
pub const OK: Expect = &[strataSuccess];
pub const ARG: Expect = &[strataInvalidArgument];
pub const USAGE: Expect = &[strataInvalidUsage];

impl Ctx {
    /// Record a failure of the driver's checks (a wrong code, a wrong result, ...).
    pub fn fail(&self, what: String) {
        STATS.fail(format!("{}: {what}", self.label));
    }

    /// Make `call` (see [`invoke`] for the contract) and check its code against `expect`.
    /// `comm_text`: also read `strataGetLastError(comm)`; false while another thread may
    /// be aborting that communicator (its string is freed with it).
    ///
    /// # Safety
    /// As [`invoke`].
    pub unsafe fn call_with(&self, call: Call, expect: Expect, comm_text: bool) -> c_int {
        STATS.call();
        // SAFETY: the caller's contract.
        let rc = unsafe { invoke(call) };
        let name = call.export();
        if rc != strataSuccess {
            // SAFETY: any value is accepted.
            let thread = text(unsafe { strataGetLastError(null_mut()) }).unwrap_or_default();
            // SAFETY: as above; the comm string is read at once (see `comm_text`).
            let on_comm = match call.comm() {
                Some(h) if comm_text => text(unsafe { strataGetLastError(comm(h)) }),
                _ => Some(thread.clone()),
            };
            // SAFETY: any value is accepted.
            let desc = text(unsafe { strataGetErrorString(rc) }).unwrap_or_default();
            STATS.error(name, rc, &normalise(&thread));
            if !thread.starts_with(call.name()) || thread.len() <= call.name().len() + 2 {
                self.fail(format!(
                    "{name} -> {rc}: thread message {thread:?} does not name the call"
                ));
            }
            if on_comm.as_deref().is_none_or(str::is_empty) {
                self.fail(format!("{name} -> {rc}: strataGetLastError(comm) is empty"));
            }
            if desc.is_empty() || desc == "unknown result code" {
                self.fail(format!(
                    "{name} -> {rc}: strataGetErrorString gives {desc:?}"
                ));
            }
            if rc == strataInternalError {
                STATS.internal();
            }
        }
        if !expect.contains(&rc) {
            // SAFETY: any value is accepted.
            let msg = text(unsafe { strataGetLastError(null_mut()) }).unwrap_or_default();
            self.fail(format!(
                "{name} returned {rc}, expected one of {expect:?} ({msg})"
            ));
        }
        rc
    }

    /// [`Ctx::call_with`], reading the communicator's message too.
    ///
    /// # Safety
    /// As [`invoke`].
    pub unsafe fn call(&self, call: Call, expect: Expect) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { self.call_with(call, expect, true) }
    }
}
