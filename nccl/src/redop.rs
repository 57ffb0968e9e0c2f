//! `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy`, and what a collective with such an
//! op does on strata's CPU device: multiply this rank's input by the op's scalar into a
//! scratch buffer (the product in the element type, as NCCL: integers wrap, floating
//! types round once), then sum with strata.
//!
//! Op ids are unique in the process (from `ncclNumOps` = 5 up, never reused), each
//! bound to the communicator and data type it was created for, so an op used with
//! another communicator, another data type, or after `ncclRedOpDestroy` is
//! `ncclInvalidArgument` (NCCL's ids are per communicator and would let such a call
//! through). A scalar of `ncclScalarHostImmediate` is read at creation; one of
//! `ncclScalarDevice` (on the CPU device, host memory too) is read each time a
//! collective using the op runs, as NCCL dereferences it while the collective runs.

use crate::abi::*;
use crate::errors::{fail, guard, strata_result};
use crate::passthrough::pass;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

#[derive(Clone, Copy)]
enum Scalar {
    /// Read at creation (little-endian bytes of one element).
    Value([u8; 8]),
    /// Read at each use.
    At(usize),
}

#[derive(Clone, Copy)]
struct PreMul {
    comm: usize,
    dtype: ncclDataType_t,
    scalar: Scalar,
}

static OPS: Mutex<BTreeMap<ncclRedOp_t, PreMul>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicI32 = AtomicI32::new(ncclNumOps);

fn ops() -> std::sync::MutexGuard<'static, BTreeMap<ncclRedOp_t, PreMul>> {
    OPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The scalar (one element's bytes) of PreMulSum op `op` for a call on `comm` with
/// `dtype`, or why the op cannot be used there.
pub fn scalar_of(
    op: ncclRedOp_t,
    dtype: ncclDataType_t,
    comm: ncclComm_t,
) -> Result<[u8; 8], String> {
    let p = match ops().get(&op) {
        Some(p) => *p,
        None => {
            return Err(format!(
                "op {op} is neither a built-in op (0..4) nor a live op of ncclRedOpCreatePreMulSum (destroyed, or never made)"
            ))
        }
    };
    if p.comm != comm as usize {
        return Err(format!("op {op} was created on another communicator"));
    }
    if p.dtype != dtype {
        return Err(format!(
            "op {op} was created for {}, not {}",
            dtype_name(p.dtype),
            dtype_name(dtype)
        ));
    }
    Ok(match p.scalar {
        Scalar::Value(v) => v,
        Scalar::At(ptr) => read_scalar(ptr as *const u8, dtype),
    })
}

fn read_scalar(p: *const u8, dtype: ncclDataType_t) -> [u8; 8] {
    let mut v = [0u8; 8];
    let n = dtype_size(dtype).unwrap_or(0).min(8);
    // SAFETY: the creator's contract: `p` is readable for one element of `dtype` for as
    // long as the op is used.
    unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), n) };
    v
}

/// Forget the ops of a destroyed communicator.
pub fn forget_comm(comm: ncclComm_t) {
    ops().retain(|_, p| p.comm != comm as usize);
}

/// `dst[i] = src[i] * scalar` for `count` elements of `dtype` (not fp8), in the element
/// type.
///
/// # Safety
/// `src` readable for `count` elements; `dst` 8-byte aligned, writable for as many, and
/// not overlapping `src`.
pub unsafe fn scale(
    src: *const c_void,
    dst: *mut u8,
    count: usize,
    dtype: ncclDataType_t,
    s: [u8; 8],
) {
    macro_rules! ints {
        ($t:ty, $n:literal) => {{
            let k = <$t>::from_le_bytes(s[..$n].try_into().unwrap_or([0; $n]));
            // SAFETY: the caller's contract; unaligned reads of the user's buffer.
            for i in 0..count {
                let x = unsafe { src.cast::<$t>().add(i).read_unaligned() };
                unsafe { dst.cast::<$t>().add(i).write_unaligned(x.wrapping_mul(k)) };
            }
        }};
    }
    macro_rules! floats {
        ($t:ty, $n:literal) => {{
            let k = <$t>::from_le_bytes(s[..$n].try_into().unwrap_or([0; $n]));
            for i in 0..count {
                // SAFETY: as above.
                let x = unsafe { src.cast::<$t>().add(i).read_unaligned() };
                unsafe { dst.cast::<$t>().add(i).write_unaligned(x * k) };
            }
        }};
    }
    match dtype {
        ncclInt8 => ints!(i8, 1),
        ncclUint8 => ints!(u8, 1),
        ncclInt32 => ints!(i32, 4),
        ncclUint32 => ints!(u32, 4),
        ncclInt64 => ints!(i64, 8),
        ncclUint64 => ints!(u64, 8),
        ncclFloat32 => floats!(f32, 4),
        ncclFloat64 => floats!(f64, 8),
        ncclFloat16 | ncclBfloat16 => {
            // The exact product of two 16-bit floats fits an f64; strata's `set` rounds
            // it once to the type (round-to-odd through f32, then nearest).
            let t = if dtype == ncclFloat16 {
                strata::DataType::F16
            } else {
                strata::DataType::BF16
            };
            let k = t.get(&s[..2], 0);
            // SAFETY: the caller's contract: `count` 2-byte elements each side.
            let (src, dst) = unsafe {
                (
                    std::slice::from_raw_parts(src.cast::<u8>(), count * 2),
                    std::slice::from_raw_parts_mut(dst, count * 2),
                )
            };
            for i in 0..count {
                t.set(dst, i, t.get(src, i) * k);
            }
        }
        _ => {}
    }
}

/// NCCL's `ncclRedOpCreatePreMulSum`: a new op for collectives on `comm` with
/// `datatype` that multiplies each rank's input by `*scalar` and sums; its id goes to
/// `*op`. On strata's CPU device both residences are host memory (see the module doc
/// for when each is read); fp8 is refused as by the collectives.
///
/// # Safety
/// `op` writable for an op id; `scalar` readable for one element of `datatype` (for as
/// long as the op is used, when `residence` is `ncclScalarDevice`).
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("RedOpCreatePreMulSum", (op: *mut ncclRedOp_t, scalar: *mut c_void, datatype: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t));
    }
    const F: &str = "ncclRedOpCreatePreMulSum";
    guard(F, comm, || {
        if op.is_null() || scalar.is_null() {
            return fail(F, comm, ncclInvalidArgument, "op or scalar is NULL");
        }
        if let Err((c, m)) = crate::collectives::check_dtype(datatype) {
            return fail(F, comm, c, m);
        }
        let mut n = 0;
        // SAFETY: checks `comm` (a NULL, destroyed or foreign one fails); `n` is live.
        let r = unsafe { strata::capi::strataCommCount(crate::comm::sc(comm), &mut n) };
        if r != ncclSuccess {
            return strata_result(F, comm, r);
        }
        let s = match residence {
            ncclScalarHostImmediate => Scalar::Value(read_scalar(scalar.cast::<u8>(), datatype)),
            ncclScalarDevice => Scalar::At(scalar as usize),
            r => {
                return fail(
                    F,
                    comm,
                    ncclInvalidArgument,
                    format!(
                    "residence {r} is not an ncclScalarResidence_t (0 device, 1 host immediate)"
                ),
                )
            }
        };
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if id < ncclNumOps {
            return fail(F, comm, ncclInternalError, "no op ids left (2^31 made)");
        }
        ops().insert(
            id,
            PreMul {
                comm: comm as usize,
                dtype: datatype,
                scalar: s,
            },
        );
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { *op = id };
        ncclSuccess
    })
}

/// NCCL's `ncclRedOpDestroy`: frees `op`, made by `ncclRedOpCreatePreMulSum` on `comm`.
/// A built-in op, an unknown or destroyed one, or one of another communicator is
/// `ncclInvalidArgument`.
///
/// # Safety
/// None beyond passing values.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("RedOpDestroy", (op: ncclRedOp_t, comm: ncclComm_t));
    }
    const F: &str = "ncclRedOpDestroy";
    guard(F, comm, || {
        if (0..ncclNumOps).contains(&op) {
            return fail(
                F,
                comm,
                ncclInvalidArgument,
                format!("op {op} is a built-in op"),
            );
        }
        let mut m = ops();
        match m.get(&op) {
            Some(p) if p.comm == comm as usize => {
                m.remove(&op);
                ncclSuccess
            }
            Some(_) => {
                drop(m);
                fail(
                    F,
                    comm,
                    ncclInvalidArgument,
                    format!("op {op} was created on another communicator"),
                )
            }
            None => {
                drop(m);
                fail(
                    F,
                    comm,
                    ncclInvalidArgument,
                    format!("op {op} is not a live PreMulSum op (destroyed, or never made)"),
                )
            }
        }
    })
}
