//! Owned communicator handles.

use super::init::is_finalized;
use super::rc::check;
use crate::error::Result;
use mpi::ffi;
use std::os::raw::c_int;

/// The tag of `MPI_Comm_create_group` (strata's member-only creations).
pub(super) const GROUP_TAG: i32 = 0x5354;

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
