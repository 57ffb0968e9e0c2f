//! Owned communicator handles and MPI return codes.

use super::init::is_finalized;
use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::c_int;

/// The tag of `MPI_Comm_create_group` (strata's member-only creations).
pub(super) const GROUP_TAG: i32 = 0x5354;

pub(super) fn mpi_error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: buf holds MPI_MAX_ERROR_STRING bytes as MPI_Error_string requires.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {code}");
    }
    buf.truncate(len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
    format!(
        "{} (MPI error {code})",
        String::from_utf8_lossy(&buf).trim_end()
    )
}

/// The one place a raw MPI return code becomes a `Result`.
pub(super) fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::System(format!(
            "{what} failed: {}",
            mpi_error_string(rc)
        )))
    }
}

pub(super) fn byte_type() -> ffi::MPI_Datatype {
    // SAFETY: reading an MPI predefined handle exported by mpi-sys.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// An owned MPI communicator handle, freed on drop while MPI is still alive.
pub(super) struct RawComm(pub(super) ffi::MPI_Comm);

// SAFETY: MPI runs with MPI_THREAD_MULTIPLE, so a communicator handle may be used from
// any thread; strata serialises the calls of one transport itself.
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        if !is_finalized() {
            // SAFETY: we own this handle (a dup or split result) and free it once.
            unsafe {
                ffi::MPI_Comm_free(&mut self.0);
            }
        }
    }
}

impl RawComm {
    /// Take ownership of a new communicator and make its errors return codes.
    pub(super) fn adopt(raw: ffi::MPI_Comm) -> Result<RawComm> {
        let c = RawComm(raw);
        // SAFETY: live communicator; predefined error handler.
        check(
            unsafe { ffi::MPI_Comm_set_errhandler(c.0, ffi::RSMPI_ERRORS_RETURN) },
            "MPI_Comm_set_errhandler",
        )?;
        Ok(c)
    }

    pub(super) fn rank_size(&self) -> Result<(usize, usize)> {
        let (mut r, mut n): (c_int, c_int) = (0, 0);
        // SAFETY: live communicator; out-pointers to locals.
        check(
            unsafe { ffi::MPI_Comm_rank(self.0, &mut r) },
            "MPI_Comm_rank",
        )?;
        check(
            unsafe { ffi::MPI_Comm_size(self.0, &mut n) },
            "MPI_Comm_size",
        )?;
        Ok((r as usize, n as usize))
    }
}
