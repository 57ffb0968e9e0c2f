//! `ncclGetVersion`: the real library's version when there is one (a program's version
//! checks then see the NCCL that runs its forwarded calls), else the version of the API
//! this library implements, NCCL 2.32.3.

/// `NCCL_VERSION_CODE` of the header this library implements (2.32.3).
pub const API_VERSION: i32 = 23203;

/// NCCL's `ncclGetVersion`: writes the version code to `*version`.
///
/// # Safety
/// `version` is NULL (an `ncclInvalidArgument`) or valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut i32) -> i32 {
    if version.is_null() {
        return 4;
    }
    let v = match crate::real::real().and_then(|r| r.addr(b"ncclGetVersion\0")) {
        Some(addr) => {
            // SAFETY: the real library's ncclGetVersion, with NCCL's signature.
            let f: unsafe extern "C" fn(*mut i32) -> i32 = unsafe { std::mem::transmute(addr) };
            let mut v = 0;
            // SAFETY: `v` is a live int.
            if unsafe { f(&mut v) } != 0 {
                API_VERSION
            } else {
                v
            }
        }
        None => API_VERSION,
    };
    // SAFETY: checked non-NULL; the caller gives a writable int.
    unsafe { *version = v };
    0
}
