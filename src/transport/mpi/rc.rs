//! MPI return codes: the one place a raw code becomes a `Result`.

use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::c_int;

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
