//! NCCL 2.32.3's C types and constants (`nccl.h`), as this library reads and writes
//! them: result codes, the opaque handles, the 128-byte unique id, data types (fp8
//! included), reduce ops (`ncclAvg` and the dynamic PreMulSum range), and the three
//! versioned structs (`ncclConfig_t`, `ncclCollConfig_t`, `ncclSimInfo_t`), each read
//! only as far as the caller's `size` says it reaches.

#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclTimeout: ncclResult_t = 8;
pub const ncclNumResults: ncclResult_t = 9;

/// The opaque `struct ncclComm` (never defined here: on strata's CPU device an
/// `ncclComm_t` is a strata communicator key, with the real library its own handle).
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
/// `ncclComm_t`.
pub type ncclComm_t = *mut ncclComm;

/// The opaque `struct ncclWindow_vidmem`.
#[repr(C)]
pub struct ncclWindow_vidmem {
    _opaque: [u8; 0],
}
/// `ncclWindow_t`.
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// `cudaStream_t` (an opaque pointer; ignored on strata's CPU device).
pub type cudaStream_t = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
pub const ncclInt8: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;
pub const ncclNumTypes: ncclDataType_t = 12;

/// Bytes per element of a valid `ncclDataType_t` (fp8 included), else `None`.
pub fn dtype_size(d: ncclDataType_t) -> Option<usize> {
    Some(match d {
        ncclInt8 | ncclUint8 | ncclFloat8e4m3 | ncclFloat8e5m2 => 1,
        ncclFloat16 | ncclBfloat16 => 2,
        ncclInt32 | ncclUint32 | ncclFloat32 => 4,
        ncclInt64 | ncclUint64 | ncclFloat64 => 8,
        _ => return None,
    })
}

/// NCCL's name of a data type (for messages).
pub fn dtype_name(d: ncclDataType_t) -> &'static str {
    match d {
        ncclInt8 => "ncclInt8",
        ncclUint8 => "ncclUint8",
        ncclInt32 => "ncclInt32",
        ncclUint32 => "ncclUint32",
        ncclInt64 => "ncclInt64",
        ncclUint64 => "ncclUint64",
        ncclFloat16 => "ncclFloat16",
        ncclFloat32 => "ncclFloat32",
        ncclFloat64 => "ncclFloat64",
        ncclBfloat16 => "ncclBfloat16",
        ncclFloat8e4m3 => "ncclFloat8e4m3",
        ncclFloat8e5m2 => "ncclFloat8e5m2",
        _ => "an unknown ncclDataType_t",
    }
}

/// `ncclRedOp_t`: the built-in ops, then the dynamic ones (`ncclNumOps..=ncclMaxRedOp`).
pub type ncclRedOp_t = c_int;
pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;
pub const ncclAvg: ncclRedOp_t = 4;
pub const ncclNumOps: ncclRedOp_t = 5;
/// `0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))` with a 4-byte enum.
pub const ncclMaxRedOp: ncclRedOp_t = 0x7fff_ffff;

/// `ncclScalarResidence_t`.
pub type ncclScalarResidence_t = c_int;
/// The scalar is read each time a collective runs (device memory on a GPU).
pub const ncclScalarDevice: ncclScalarResidence_t = 0;
/// The scalar is read before `ncclRedOpCreatePreMulSum` returns.
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;

/// `NCCL_API_MAGIC`: `magic` of an initialised `ncclConfig_t` / `ncclCollConfig_t`.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `magic` of `NCCL_SIM_INFO_INITIALIZER`.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`.
pub const NCCL_SHRINK_ABORT: c_int = 1;

/// `struct ncclConfig_v23100` (`ncclConfig_t`) of NCCL 2.32.3. Older headers pass a
/// shorter prefix (their `size`): read it with [`read_config`], never whole.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

/// What this library uses of an `ncclConfig_t`: whether the communicator is blocking
/// (`blocking` unset or nonzero) or nonblocking (`blocking == 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommSettings {
    pub blocking: bool,
}

impl Default for CommSettings {
    fn default() -> Self {
        CommSettings { blocking: true }
    }
}

/// Read a caller's `ncclConfig_t` (NULL: the defaults): `size` (at least the header
/// fields) and `magic` must be those of `NCCL_CONFIG_INITIALIZER`; then only the fields
/// `size` covers are read (`blocking` is the only one that changes what this library
/// does; the tuning fields are NCCL's own and ignored).
///
/// # Safety
/// `cfg` is NULL or points to at least `cfg->size` readable bytes.
pub unsafe fn read_config(cfg: *const ncclConfig_t) -> Result<CommSettings, String> {
    if cfg.is_null() {
        return Ok(CommSettings::default());
    }
    // SAFETY: non-NULL; `size` is the first field of every version of the struct.
    let size = unsafe { std::ptr::addr_of!((*cfg).size).read_unaligned() };
    let header = std::mem::offset_of!(ncclConfig_t, blocking);
    if size < header {
        return Err(format!(
            "config size is {size}, less than its header ({header} bytes): initialise it with NCCL_CONFIG_INITIALIZER"
        ));
    }
    // SAFETY: `size` covers the header, read field by field.
    let magic = unsafe { std::ptr::addr_of!((*cfg).magic).read_unaligned() };
    if magic != NCCL_API_MAGIC {
        return Err(format!(
            "config magic is {magic:#x}, not NCCL_API_MAGIC {NCCL_API_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER"
        ));
    }
    let mut s = CommSettings::default();
    if size >= std::mem::offset_of!(ncclConfig_t, cgaClusterSize) {
        // SAFETY: `size` covers `blocking`.
        let b = unsafe { std::ptr::addr_of!((*cfg).blocking).read_unaligned() };
        s.blocking = b != 0;
    }
    Ok(s)
}

/// `struct ncclCollConfig_v23200` (`ncclCollConfig_t`): per-call settings. Only its
/// header is read ([`check_coll_config`]); the tuning fields are NCCL's own.
#[repr(C)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut c_void,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: *mut c_void,
}

/// Check a per-collective config: NULL (the plain call, as NCCL says) or one whose
/// `size` covers its header and whose `magic` is `NCCL_API_MAGIC`.
///
/// # Safety
/// `cfg` is NULL or points to at least `cfg->size` readable bytes.
pub unsafe fn check_coll_config(cfg: *const ncclCollConfig_t) -> Result<(), String> {
    if cfg.is_null() {
        return Ok(());
    }
    // SAFETY: non-NULL; `size` is the first field.
    let size = unsafe { std::ptr::addr_of!((*cfg).size).read_unaligned() };
    let header = std::mem::offset_of!(ncclCollConfig_t, ext);
    if size < header {
        return Err(format!(
            "ncclCollConfig_t size is {size}, less than its header ({header} bytes): initialise it with NCCL_COLLCONFIG_INITIALIZER"
        ));
    }
    // SAFETY: `size` covers the header.
    let magic = unsafe { std::ptr::addr_of!((*cfg).magic).read_unaligned() };
    if magic != NCCL_API_MAGIC {
        return Err(format!(
            "ncclCollConfig_t magic is {magic:#x}, not NCCL_API_MAGIC: initialise it with NCCL_COLLCONFIG_INITIALIZER"
        ));
    }
    Ok(())
}

/// `struct ncclSimInfo_v22200` (`ncclSimInfo_t`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_nccl_2_32_3s() {
        // LP64: the offsets gcc gives for nccl.h 2.32.3 (checked against the header).
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, nvlsHostMode), 112);
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 120);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, algSelection), 40);
        assert_eq!(std::mem::offset_of!(ncclCollConfig_t, userProfilerTag), 56);
        assert_eq!(std::mem::size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(std::mem::size_of::<ncclSimInfo_t>(), 24);
    }

    #[test]
    fn config_reads_only_its_size() {
        let mut c = ncclConfig_t {
            size: 16,
            magic: NCCL_API_MAGIC,
            version: 23203,
            blocking: 0,
            cgaClusterSize: 0,
            minCTAs: 0,
            maxCTAs: 0,
            netName: std::ptr::null(),
            splitShare: 0,
            trafficClass: 0,
            commName: std::ptr::null(),
            collnetEnable: 0,
            CTAPolicy: 0,
            shrinkShare: 0,
            nvlsCTAs: 0,
            nChannelsPerNetPeer: 0,
            nvlinkCentricSched: 0,
            graphUsageMode: 0,
            numRmaCtx: 0,
            maxP2pPeers: 0,
            graphStreamOrdering: 0,
            launchOrderImplicit: 0,
            numRmaSig: 0,
            rmaEagerInit: 0,
            hostCftMode: 0,
            nvlsHostMode: 0,
        };
        // SAFETY: a live struct.
        assert!(unsafe { read_config(&c) }.unwrap().blocking);
        c.size = std::mem::size_of::<ncclConfig_t>();
        // SAFETY: as above.
        assert!(!unsafe { read_config(&c) }.unwrap().blocking);
        c.blocking = NCCL_CONFIG_UNDEF_INT;
        // SAFETY: as above.
        assert!(unsafe { read_config(&c) }.unwrap().blocking);
        c.magic = 0;
        // SAFETY: as above.
        assert!(unsafe { read_config(&c) }.is_err());
        c.magic = NCCL_API_MAGIC;
        c.size = 8;
        // SAFETY: as above.
        assert!(unsafe { read_config(&c) }.is_err());
    }
}
