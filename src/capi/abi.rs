//! The C declarations of include/strata.h: result codes, element types, reduction
//! operators, transports, the stream and communicator handles, the unique id, the config
//! and the constants. Declarations only (what cbindgen exports is here and in the
//! exports of the sibling files); the files of this folder all speak this vocabulary.

#![forbid(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// Result of every strata call; the values are `ncclResult_t`'s.
pub type strataResult_t = c_int;
/// The call succeeded.
pub const strataSuccess: strataResult_t = 0;
/// A CUDA / HIP runtime call failed (GPU transports).
pub const strataUnhandledCudaError: strataResult_t = 1;
/// The operating system or an external library (MPI) failed.
pub const strataSystemError: strataResult_t = 2;
/// A bug in strata (a caught panic included).
pub const strataInternalError: strataResult_t = 3;
/// An argument is wrong in itself: NULL pointer, count overflow, unknown dtype or op,
/// rank/root/peer out of range, buffers that alias outside NCCL's in-place layouts.
pub const strataInvalidArgument: strataResult_t = 4;
/// The call is valid alone but not here: a destroyed communicator, mismatched nranks,
/// a topology that does not fit the world, a group end without a start, a transport not
/// compiled into this build.
pub const strataInvalidUsage: strataResult_t = 5;
/// A peer died, went away or did not answer within the timeout.
pub const strataRemoteError: strataResult_t = 6;
/// Not returned by host transports (NCCL's nonblocking-communicator code).
pub const strataInProgress: strataResult_t = 7;
/// Number of result codes.
pub const strataNumResults: strataResult_t = 8;

/// Element type; the values are `ncclDataType_t`'s, every NCCL type but the fp8 ones
/// (rejected with `strataInvalidArgument`). Integers wrap; 64-bit integers reduce and
/// average exactly (no trip through double); f16/bf16 reduce in f32.
pub type strataDataType_t = c_int;
pub const strataInt8: strataDataType_t = 0;
pub const strataChar: strataDataType_t = 0;
pub const strataUint8: strataDataType_t = 1;
pub const strataInt32: strataDataType_t = 2;
pub const strataInt: strataDataType_t = 2;
pub const strataUint32: strataDataType_t = 3;
pub const strataInt64: strataDataType_t = 4;
pub const strataUint64: strataDataType_t = 5;
pub const strataFloat16: strataDataType_t = 6;
pub const strataHalf: strataDataType_t = 6;
pub const strataFloat32: strataDataType_t = 7;
pub const strataFloat: strataDataType_t = 7;
pub const strataFloat64: strataDataType_t = 8;
pub const strataDouble: strataDataType_t = 8;
pub const strataBfloat16: strataDataType_t = 9;

/// Reduction operator; the values are `ncclRedOp_t`'s. f16/bf16 reduce in f32 and round
/// once per step, as NCCL does.
pub type strataRedOp_t = c_int;
pub const strataSum: strataRedOp_t = 0;
pub const strataProd: strataRedOp_t = 1;
pub const strataMax: strataRedOp_t = 2;
pub const strataMin: strataRedOp_t = 3;
/// Mean over the communicator: the exact mean (summed, divided once at the end), except
/// that a one-call collective on `nccl`/`rccl` of 2.10 or later is `ncclAvg`, the
/// library's own mean with its rounding (as PyTorch's `ProcessGroupNCCL`).
pub const strataAvg: strataRedOp_t = 4;

/// Transport of a communicator made by `strataCommInitRankConfig` (or, for `local` and
/// `cuda-local`, `strataCommInitLocal`). A transport not compiled into the library fails
/// with `strataInvalidUsage` and a message naming the cargo feature to turn on.
/// Host transports (local, mpi) take host pointers; GPU transports (nccl, rccl,
/// cuda-local) take device pointers of the communicator's device.
pub type strataTransport_t = c_int;
/// `STRATA_TRANSPORT` (`local`, `mpi`, `nccl`, `rccl` or `cuda-local`) when set, else
/// `local`.
pub const strataTransportDefault: strataTransport_t = 0;
/// Ranks are threads of this process (rendezvous through the unique id).
pub const strataTransportLocal: strataTransport_t = 1;
/// Ranks are the processes of an MPI job (needs a library built with `--features mpi`).
pub const strataTransportMpi: strataTransport_t = 2;
/// NVIDIA NCCL (library built with `--features cuda`; libnccl.so.2 is loaded at run time,
/// `STRATA_NCCL_LIB` overrides its path). One rank per GPU, on the device current on the
/// calling thread (as NCCL; `STRATA_DEVICE` overrides); the unique id must carry an NCCL
/// id (`strataGetUniqueIdForTransport(strataTransportNccl, ...)`, or `strataGetUniqueId`
/// with `STRATA_TRANSPORT=nccl`).
pub const strataTransportNccl: strataTransport_t = 3;
/// AMD RCCL (library built with `--features rocm`; `STRATA_RCCL_LIB` overrides the path
/// of librccl.so.1); otherwise as `strataTransportNccl`, with HIP devices and streams.
pub const strataTransportRccl: strataTransport_t = 4;
/// A world of ranks that are threads of this process sharing ONE CUDA device (library
/// built with `--features cuda`): `strataCommInitLocal`, or `strataCommInitRankConfig`
/// from threads with one unique id. The device is `STRATA_DEVICE`, default 0.
pub const strataTransportCudaLocal: strataTransport_t = 5;
/// N ranks as threads on the CPU device (`host-local`): the device paths without a GPU;
/// buffers come from `strataMemAlloc` on the communicator.
pub const strataTransportHostLocal: strataTransport_t = 6;

/// Stream argument of every collective: an opaque pointer. Host transports: a strata host
/// stream (`strataStreamCreate`) makes the call nonblocking, in that stream's order; any
/// other value (NULL included) is ignored and the call blocks. GPU transports take the
/// caller's `cudaStream_t` / `hipStream_t` (NULL: the legacy default stream) of the
/// communicator's device, as NCCL: the collective runs after the work queued on it
/// before the call and before the work queued on it after the call, and the call
/// returns without waiting for the device.
pub type strataStream_t = *mut c_void;

/// `color` of `strataCommSplit` for ranks that join no new communicator. Declared to C by
/// hand in cbindgen.toml's `after_includes` (parenthesised); not `pub` so that cbindgen
/// does not emit a bare `-1` (the test `header_macros_match` keeps the two in step).
pub(crate) const STRATA_SPLIT_NOCOLOR: c_int = -1;
/// `shrinkFlags` of `strataCommShrink`: shrink the communicator as it is (after a failure
/// it is aborted already), NCCL's `NCCL_SHRINK_DEFAULT`.
pub const STRATA_SHRINK_DEFAULT: c_int = 0;
/// `shrinkFlags` of `strataCommShrink`: abort the communicator's operations in flight
/// first (its calls fail at once, here and on its peers), then shrink; NCCL's
/// `NCCL_SHRINK_ABORT`.
pub const STRATA_SHRINK_ABORT: c_int = 1;
/// Size of `strataUniqueId`: strata's 128 bytes, then room for an `ncclUniqueId`.
pub const STRATA_UNIQUE_ID_BYTES: usize = 256;
/// Offset in `strataUniqueId` of the NCCL/RCCL unique id (`NCCL_UNIQUE_ID_BYTES`, 128
/// bytes) that ids made for the nccl and rccl transports carry; zeros otherwise.
pub const STRATA_UNIQUE_ID_VENDOR_OFFSET: usize = 128;
pub const STRATA_MAJOR: c_int = 0;
pub const STRATA_MINOR: c_int = 1;
pub const STRATA_PATCH: c_int = 0;
/// `STRATA_MAJOR * 10000 + STRATA_MINOR * 100 + STRATA_PATCH` (NCCL's `NCCL_VERSION_CODE`
/// formula); what `strataGetVersion` returns for this header's library.
pub const STRATA_VERSION_CODE: c_int = 100;
/// `strataConfig_t.magic` of a config set up with `STRATA_CONFIG_INITIALIZER`.
pub const STRATA_CONFIG_MAGIC: c_uint = 0x5354_5241;

/// Opaque communicator (never defined: `strataComm_t` values are registry keys).
pub struct strataComm {
    _opaque: [u8; 0],
}

/// A communicator: one rank's handle on a group of ranks. Made by `strataCommInitRank*`,
/// `strataCommInitLocal` or `strataCommSplit`; released by `strataCommDestroy` or
/// `strataCommAbort`, after which every call with it returns `strataInvalidUsage`.
/// One communicator is driven by one thread at a time; different communicators may be
/// driven concurrently from different threads.
pub type strataComm_t = *mut strataComm;

/// The name of a new world (`strataGetUniqueId`, `strataGetUniqueIdForTransport`),
/// passed by value to `strataCommInitRank` on every rank, as NCCL's `ncclUniqueId`
/// (broadcast it from one process to the others for nccl/rccl, as NCCL programs do).
/// Layout: bytes 0..128 are strata's (magic, version, rendezvous key of an in-process
/// world, and which vendor id follows); bytes `STRATA_UNIQUE_ID_VENDOR_OFFSET`..256 hold
/// the NCCL/RCCL unique id of an id made for the nccl/rccl transport, zeros otherwise.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct strataUniqueId {
    pub internal: [c_char; STRATA_UNIQUE_ID_BYTES],
}

/// Settings of a new communicator. Initialise with `STRATA_CONFIG_INITIALIZER` (which sets
/// `size`, `magic` and `version`), then change the fields you need; the library reads it
/// during the call only (strings are copied).
#[repr(C)]
pub struct strataConfig_t {
    /// `sizeof(strataConfig_t)` of the caller's header.
    pub size: usize,
    /// `STRATA_CONFIG_MAGIC`.
    pub magic: c_uint,
    /// `STRATA_VERSION_CODE` of the caller's header.
    pub version: c_uint,
    /// A `strataTransport_t`.
    pub transport: strataTransport_t,
    /// Topology SPEC (`nodes:2x4`, `frontier:2`, `dgx-h100:4`, ... or a JSON file path);
    /// NULL or "" for `STRATA_TOPOLOGY`, else one flat node. Its size must be the world's.
    pub topology: *const c_char,
    /// Algorithm used when a call carries no hint: `ring`, `log-step`, `hier`,
    /// `hier-ring`, `hier-log`, `ho-ring` or `auto` (or a quantized one); NULL or ""
    /// for `STRATA_ALGO`, else `auto`.
    pub algo: *const c_char,
    /// How long to wait for a peer (rendezvous included) before `strataRemoteError`, in
    /// milliseconds; 0 for `STRATA_TIMEOUT` (default 120 s). Negative is invalid.
    pub timeout_ms: c_int,
    /// Where the world's link figures come from (`auto` and the model decide from them):
    /// `preset` (the topology's), `probe` (measured at creation by a short collective
    /// exchange, or read from the cache of an earlier probe of the same hosts) or
    /// `reprobe` (measured afresh); NULL or "" for `STRATA_LINKS`, else `preset`. Read
    /// when a world is made (`strataCommInitRankConfig`, `strataCommInitLocal`), ignored
    /// by splits. Added in 0.1 after `timeout_ms`: a config of the older, smaller
    /// `size` is read without it.
    pub links: *const c_char,
}

/// `size` of a `strataConfig_t` made before `links` was added: still accepted.
pub const CONFIG_SIZE_BEFORE_LINKS: usize = std::mem::offset_of!(strataConfig_t, links);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn version_constants_match_the_crate() {
        let v: Vec<c_int> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(v, [STRATA_MAJOR, STRATA_MINOR, STRATA_PATCH]);
        assert_eq!(
            STRATA_VERSION_CODE,
            STRATA_MAJOR * 10000 + STRATA_MINOR * 100 + STRATA_PATCH
        );
    }

    #[test]
    fn codes_and_types_match_nccl() {
        use crate::{DataType, ReduceOp};
        for (c, e) in [
            (strataInvalidArgument, Error::InvalidArgument(String::new())),
            (strataInvalidUsage, Error::InvalidUsage(String::new())),
            (strataRemoteError, Error::Remote(String::new())),
            (strataInternalError, Error::Internal(String::new())),
            (strataSystemError, Error::System(String::new())),
            (strataUnhandledCudaError, Error::Device(String::new())),
        ] {
            assert_eq!(c, e.code());
        }
        for (c, d) in [
            (strataInt8, DataType::I8),
            (strataUint8, DataType::U8),
            (strataInt32, DataType::I32),
            (strataUint32, DataType::U32),
            (strataInt64, DataType::I64),
            (strataUint64, DataType::U64),
            (strataFloat64, DataType::F64),
            (strataFloat16, DataType::F16),
            (strataFloat32, DataType::F32),
            (strataBfloat16, DataType::BF16),
        ] {
            assert_eq!(DataType::from_raw(c).unwrap(), d);
        }
        for (c, o) in [
            (strataSum, ReduceOp::Sum),
            (strataProd, ReduceOp::Prod),
            (strataMax, ReduceOp::Max),
            (strataMin, ReduceOp::Min),
            (strataAvg, ReduceOp::Avg),
        ] {
            assert_eq!(ReduceOp::from_raw(c).unwrap(), o);
        }
    }

    #[test]
    fn header_macros_match() {
        let h = include_str!("../../include/strata.h");
        assert!(h.contains(&format!(
            "#define STRATA_SPLIT_NOCOLOR ({STRATA_SPLIT_NOCOLOR})"
        )));
        assert!(h.contains(
            "#define STRATA_CONFIG_INITIALIZER { sizeof(strataConfig_t), STRATA_CONFIG_MAGIC, \
             STRATA_VERSION_CODE, strataTransportDefault, NULL, NULL, 0, NULL }"
        ));
    }
}
