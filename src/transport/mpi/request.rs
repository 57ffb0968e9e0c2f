//! One MPI request: testing it, and retiring (cancelling) it.

use super::comm::byte_type;
use super::rc::check;
use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

/// How long a cancelled request may take to retire before it is released to MPI.
pub(super) const CANCEL_GRACE: Duration = Duration::from_millis(50);

pub(super) fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading an MPI predefined handle exported by mpi-sys.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

pub(super) fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is plain C data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// One outstanding MPI request (`MPI_REQUEST_NULL` once complete).
pub(super) struct Req(pub(super) ffi::MPI_Request);

impl Req {
    pub(super) fn is_null(&self) -> bool {
        self.0 .0 == request_null().0
    }

    /// `MPI_Test`: Ok(true) once complete (the handle becomes null).
    pub(super) fn test(&mut self, what: &str) -> Result<bool> {
        if self.is_null() {
            return Ok(true);
        }
        self.test_status(what).map(|st| st.is_some())
    }

    /// `MPI_Test` of a receive: the bytes received once complete.
    pub(super) fn test_count(&mut self, what: &str) -> Result<Option<usize>> {
        if self.is_null() {
            return Err(Error::Internal(format!("{what}: tested a retired receive")));
        }
        match self.test_status(what)? {
            Some(st) => byte_count(&st).map(Some),
            None => Ok(None),
        }
    }

    /// `MPI_Test` of a live request: its status once complete, `None` while pending. A
    /// failed request is complete (MPI frees it): the handle becomes null, so it is not
    /// tested again, and the error is returned.
    #[inline]
    fn test_status(&mut self, what: &str) -> Result<Option<ffi::MPI_Status>> {
        let mut flag: c_int = 0;
        let mut st = empty_status();
        // SAFETY: live request handle; out-pointers to locals.
        let rc = unsafe { ffi::MPI_Test(&mut self.0, &mut flag, &mut st) };
        if rc != ffi::MPI_SUCCESS as c_int {
            self.0 = request_null();
            check(rc, what)?;
        }
        Ok((flag != 0).then_some(st))
    }
}

/// Bytes of the message a status describes (filled by MPI for a completed receive or a
/// matched probe).
pub(super) fn byte_count(st: &ffi::MPI_Status) -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: `st` was filled by MPI (the callers' contract); out-pointer to a local.
    check(
        unsafe { ffi::MPI_Get_count(st, byte_type(), &mut count) },
        "MPI_Get_count",
    )?;
    Ok(count.max(0) as usize)
}

/// Best-effort retire of `reqs`: MPI_Cancel each, then test them for one short grace
/// period. Returns false when some were still active and had to be released to MPI
/// (their buffers may still be touched by MPI later: the caller must not free them).
pub(super) fn retire<'a>(reqs: impl IntoIterator<Item = &'a mut Req>) -> bool {
    let mut live: Vec<&mut Req> = reqs.into_iter().filter(|r| !r.is_null()).collect();
    for r in live.iter_mut() {
        // SAFETY: live request handle.
        unsafe {
            ffi::MPI_Cancel(&mut r.0);
        }
    }
    let end = Instant::now() + CANCEL_GRACE;
    loop {
        // A failed test completes (and frees) the request too.
        live.retain_mut(|r| !r.test("MPI_Test (cancel)").unwrap_or(true));
        if live.is_empty() {
            return true;
        }
        if Instant::now() >= end {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    for r in live {
        // SAFETY: live request handle; MPI completes and frees it in the background.
        unsafe {
            ffi::MPI_Request_free(&mut r.0);
        }
        r.0 = request_null();
    }
    false
}

/// What one poll of an operation achieved.
#[derive(PartialEq, Eq)]
pub(super) enum Poll {
    Done,
    Progress,
    Idle,
}
