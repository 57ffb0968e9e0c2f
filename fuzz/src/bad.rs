//! Bad calls: each names one defect the C ABI must report (with the code it documents)
//! before touching memory, on a rank's live communicator or on no communicator. Every
//! buffer passed is valid for the count passed unless the defect is the buffer itself.

use crate::coll::Region;
use crate::ffi::{Call, Ctx, Expect, ARG, H, OK, USAGE};
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::{null, null_mut};
use strata::capi::*;

/// Which collective a bad call goes to.
pub const COLLS: usize = 12;

#[derive(Clone, Debug)]
pub enum Bad {
    NullComm(usize),
    Foreign(usize, usize),
    Dead(usize, usize),
    Dtype(usize, c_int),
    Op(usize, c_int),
    Root(bool, c_int),
    Peer(bool, c_int),
    NullBuf(usize, bool),
    Overflow(usize, usize),
    WrapPtr(usize),
    Overlap(usize),
    CoalescedOverlap(bool),
    CoalescedArrays(bool, usize),
    Quant(usize, usize),
    GroupEndAlone,
    /// A bad call inside its own (possibly nested) group.
    InGroup(Box<Bad>, bool),
    Query(usize, bool),
    Version(bool),
    Strings(c_int, usize),
    Split(usize),
    Release(bool, usize),
    UniqueId(usize),
    InitRank(usize),
    InitLocal(usize),
}

pub fn foreign(which: usize) -> H {
    // Never issued: below the base, between keys, or far beyond any count of comms made.
    [
        1,
        0x1234,
        0x5354_0008,
        0x5353_fff0,
        0x5354_0000 + 0x10 * (1 << 40),
        usize::MAX,
    ][which % 6]
}

/// Rank-local facts a bad call needs.
pub struct Env<'a> {
    pub h: H,
    pub rank: usize,
    pub n: usize,
    pub dead: &'a [H],
}

fn cfg() -> strataConfig_t {
    strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC,
        version: STRATA_VERSION_CODE as u32,
        transport: strataTransportDefault,
        topology: null(),
        algo: null(),
        timeout_ms: 0,
        links: null(),
    }
}

/// A bad config: which field is wrong; the code it must get.
fn bad_cfg(which: usize, c: &mut strataConfig_t, strs: &[CString; 2]) -> Expect<'static> {
    match which % 9 {
        0 => c.size = 0,
        1 => c.magic ^= 1,
        2 => c.version = 0,
        3 => c.transport = 42,
        4 => c.timeout_ms = -5,
        5 => c.topology = strs[0].as_ptr(),
        6 => c.algo = strs[1].as_ptr(),
        7 => c.links = strs[1].as_ptr(),
        _ => {
            c.transport = strataTransportNccl;
            return USAGE;
        }
    }
    ARG
}

/// A call of collective `which` on `h` with valid buffers (or `sb`/`rb` overriding
/// them), `count` elements of `dt`.
fn coll(
    which: usize,
    sb: *const c_void,
    rb: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    h: H,
) -> Call {
    match which % COLLS {
        0 => Call::AllGather(sb, rb, count, dt, h),
        1 => Call::AllGatherQ(sb, rb, count, dt, 8, 32, h),
        2 => Call::ReduceScatter(sb, rb, count, dt, op, h),
        3 => Call::ReduceScatterQ(sb, rb, count, dt, op, 8, 32, h),
        4 => Call::AllReduce(sb, rb, count, dt, op, h),
        5 => Call::AllToAll(sb, rb, count, dt, h),
        6 => Call::Broadcast(sb, rb, count, dt, root, h),
        7 => Call::Bcast(rb, count, dt, root, h),
        8 => Call::Send(sb, count, dt, root, h),
        9 => Call::Recv(rb, count, dt, root, h),
        10 => Call::AllReduce(sb, rb, count, dt, op, h),
        _ => Call::ReduceScatter(sb, rb, count, dt, op, h),
    }
}

/// Buffers big enough for `count` f32 elements of any collective on `n` ranks.
fn scratch(count: usize, n: usize) -> (Region, Region) {
    let len = 4 * count * n + 64;
    (Region::new(len, 0, 0), Region::new(len, 0, 0))
}

/// Make the bad call(s) of `b` and check their codes.
///
/// `in_group`: the thread is inside a group (group misuse is not made then).
pub fn run(ctx: &Ctx, b: &Bad, e: &Env) {
    let (h, n) = (e.h, e.n);
    let (mut s, mut r) = scratch(8, n);
    let (sp, rp) = (s.ptr(0) as *const c_void, r.ptr(0));
    let f32 = strataFloat32;
    let call = |c: Call, expect: Expect| {
        // SAFETY: `s` and `r` hold 8 * n f32 + 64 bytes, enough for every call below at
        // count <= 8; the defects passed are ones the ABI rejects before any access.
        unsafe { ctx.call(c, expect) }
    };
    match b {
        Bad::NullComm(w) => {
            call(coll(*w, sp, rp, 4, f32, strataSum, 0, 0), ARG);
        }
        Bad::Foreign(w, v) => {
            call(coll(*w, sp, rp, 4, f32, strataSum, 0, foreign(*v)), ARG);
        }
        Bad::Dead(w, i) => {
            if let Some(&d) = e.dead.get(i % e.dead.len().max(1)) {
                call(coll(*w, sp, rp, 4, f32, strataSum, 0, d), USAGE);
            }
        }
        Bad::Dtype(w, dt) => {
            call(coll(*w, sp, rp, 4, *dt, strataSum, 0, h), ARG);
        }
        Bad::Op(w, op) => {
            let w = [2, 3, 4, 11][w % 4];
            call(coll(w, sp, rp, 4, f32, *op, 0, h), ARG);
        }
        Bad::Root(bcast, root) => {
            call(
                coll(if *bcast { 7 } else { 6 }, sp, rp, 4, f32, 0, *root, h),
                ARG,
            );
        }
        Bad::Peer(send, peer) => {
            call(
                coll(if *send { 8 } else { 9 }, sp, rp, 4, f32, 0, *peer, h),
                ARG,
            );
        }
        Bad::NullBuf(w, send_side) => {
            // Broadcast reads sendbuff on the root only: make this rank the root.
            let root = e.rank as c_int;
            let w = *w % COLLS;
            let recv_only = matches!(w, 7 | 9);
            let send_only = w == 8;
            let (a, b) = if (*send_side && !recv_only) || send_only {
                (null(), rp)
            } else {
                (sp, null_mut())
            };
            call(coll(w, a, b, 4, f32, strataSum, root, h), ARG);
        }
        Bad::Overflow(w, v) => {
            let count = [usize::MAX, usize::MAX / 2 + 1, isize::MAX as usize / 4 + 1][v % 3];
            call(coll(*w, sp, rp, count, f32, strataSum, 0, h), ARG);
        }
        Bad::WrapPtr(w) => {
            let top = (usize::MAX - 3) as *mut c_void;
            call(
                coll(*w, top, top, 4, f32, strataSum, e.rank as c_int, h),
                ARG,
            );
        }
        Bad::Overlap(w) => {
            // Ranges that overlap by all but one element, never NCCL's in-place layout.
            let (c, sz, rk) = (4usize, 4usize, e.rank);
            let base = s.ptr(0);
            let (a, b, which) = match w % 5 {
                0 => (base.wrapping_add(rk * c * sz + sz), base, 0),
                1 => (base, base.wrapping_add(rk * c * sz + sz), 2),
                2 => (base, base.wrapping_add(sz), 4),
                3 => (base, base, 5),
                _ => (base, base.wrapping_add(sz), 6),
            };
            call(
                coll(
                    which,
                    a as *const c_void,
                    b,
                    c,
                    f32,
                    strataSum,
                    rk as c_int,
                    h,
                ),
                ARG,
            );
        }
        Bad::CoalescedOverlap(gather) => {
            // Two entries whose receive ranges share bytes.
            let base = r.ptr(0);
            let sends = [sp, sp.wrapping_byte_add(4 * 4 * n)];
            let recvs = [base, base.wrapping_add(4)];
            let counts = [2usize, 2];
            let c = if *gather {
                Call::AgCoalesced(sends.as_ptr(), recvs.as_ptr(), counts.as_ptr(), 2, f32, h)
            } else {
                Call::RsCoalesced(
                    sends.as_ptr(),
                    recvs.as_ptr(),
                    counts.as_ptr(),
                    2,
                    f32,
                    0,
                    h,
                )
            };
            call(c, ARG);
        }
        Bad::CoalescedArrays(gather, v) => {
            let sends = [sp, null()];
            let recvs = [rp, null_mut()];
            let counts = [2usize, 3];
            // NULL arrays, an entry NULL with a nonzero count, an nbuffers that overflows.
            let (a, b, k, nb) = match v % 4 {
                0 => (null(), recvs.as_ptr(), counts.as_ptr(), 2),
                1 => (sends.as_ptr(), recvs.as_ptr(), null(), 2),
                2 => (sends.as_ptr(), recvs.as_ptr(), counts.as_ptr(), 2),
                _ => (
                    sends.as_ptr(),
                    recvs.as_ptr(),
                    counts.as_ptr(),
                    usize::MAX / 2,
                ),
            };
            let c = if *gather {
                Call::AgCoalesced(a, b, k, nb, f32, h)
            } else {
                Call::RsCoalesced(a, b, k, nb, f32, 0, h)
            };
            call(c, ARG);
        }
        Bad::Quant(v, w) => {
            let (bits, block, dt, op) = match v % 7 {
                0 => (3, 32, f32, 0),
                1 => (0, 32, f32, 0),
                2 => (-1, 32, f32, 0),
                3 => (8, 0, f32, 0),
                4 => (4, 33, f32, 0),
                5 => (8, 32, strataInt32, 0),
                _ => (8, 32, f32, strataMax),
            };
            let c = if w % 2 == 0 && op == 0 {
                Call::AllGatherQ(sp, rp, 4, dt, bits, block, h)
            } else {
                Call::ReduceScatterQ(sp, rp, 4, dt, op, bits, block, h)
            };
            call(c, ARG);
        }
        Bad::GroupEndAlone => {
            call(Call::GroupEnd, USAGE);
        }
        Bad::InGroup(inner, nested) => {
            call(Call::GroupStart, OK);
            if *nested {
                call(Call::GroupStart, OK);
            }
            run(ctx, inner, e);
            if *nested {
                call(Call::GroupEnd, OK);
            }
            call(Call::GroupEnd, OK);
        }
        Bad::Query(w, null_out) => {
            let mut out: c_int = -7;
            let o = if *null_out {
                null_mut()
            } else {
                &mut out as *mut c_int
            };
            let (c, want) = match w % 3 {
                0 => (Call::Count(h, o), n as c_int),
                1 => (Call::UserRank(h, o), e.rank as c_int),
                _ => (Call::Transport(h, o), strataTransportLocal),
            };
            call(c, if *null_out { ARG } else { OK });
            if !*null_out && out != want {
                ctx.fail(format!("{} wrote {out}, want {want}", c.name()));
            }
        }
        Bad::Version(null_out) => {
            let mut v: c_int = 0;
            if *null_out {
                call(Call::Version(null_mut()), ARG);
            } else {
                call(Call::Version(&mut v), OK);
                if v != STRATA_VERSION_CODE {
                    ctx.fail(format!("strataGetVersion wrote {v}"));
                }
            }
        }
        Bad::Strings(code, v) => {
            crate::stats::STATS.call();
            // SAFETY: any code is accepted; the result is a static string.
            let t = crate::ffi::text(unsafe { strataGetErrorString(*code) });
            let known = (0..8).contains(code);
            match t {
                Some(t) if !t.is_empty() && (known || t == "unknown result code") => {}
                t => ctx.fail(format!("strataGetErrorString({code}) = {t:?}")),
            }
            crate::stats::STATS.call();
            let any = [0, foreign(*v), e.dead.first().copied().unwrap_or(1)][v % 3];
            // SAFETY: any value is accepted; the handle is never dereferenced.
            if crate::ffi::text(unsafe { strataGetLastError(any as strataComm_t) }).is_none() {
                ctx.fail("strataGetLastError returned NULL".into());
            }
        }
        Bad::Split(v) => {
            let mut out: strataComm_t = null_mut();
            let strs = [
                CString::new("nodes:zz").unwrap(),
                CString::new("bogus").unwrap(),
            ];
            let mut c = cfg();
            let (color, o, cp, expect) = match v % 4 {
                0 => (0, null_mut(), null(), ARG),
                1 => (
                    -2 - (*v as c_int % 1000),
                    &mut out as *mut strataComm_t,
                    null(),
                    ARG,
                ),
                2 => (c_int::MIN, &mut out as *mut _, null(), ARG),
                _ => {
                    // A bad config (the NCCL transport is not compiled in: usage).
                    let x = bad_cfg(v / 4, &mut c, &strs);
                    (0, &mut out as *mut _, &c as *const strataConfig_t, x)
                }
            };
            call(Call::Split(h, color, 0, o, cp), expect);
        }
        Bad::Release(abort, v) => {
            let (target, expect) = match v % 3 {
                0 => (0, OK),
                1 => (foreign(*v / 3), ARG),
                _ => match e.dead.get(v % e.dead.len().max(1)) {
                    Some(&d) => (d, USAGE),
                    None => (0, OK),
                },
            };
            call(
                if *abort {
                    Call::Abort(target)
                } else {
                    Call::Destroy(target)
                },
                expect,
            );
        }
        Bad::UniqueId(v) => {
            let mut id = strataUniqueId {
                internal: [0; STRATA_UNIQUE_ID_BYTES],
            };
            let (c, expect) = match v % 6 {
                0 => (Call::UniqueId(null_mut()), ARG),
                1 => (Call::UniqueIdFor(strataTransportLocal, null_mut()), ARG),
                2 => (Call::UniqueIdFor(-1, &mut id), ARG),
                3 => (Call::UniqueIdFor(6 + (*v as c_int % 100), &mut id), ARG),
                4 => (Call::UniqueIdFor(3 + (*v as c_int / 6) % 3, &mut id), USAGE),
                _ => (Call::UniqueIdFor(strataTransportMpi, &mut id), USAGE),
            };
            call(c, expect);
        }
        Bad::InitRank(v) => {
            let mut id = strataUniqueId {
                internal: [0; STRATA_UNIQUE_ID_BYTES],
            };
            call(Call::UniqueId(&mut id), OK);
            let mut out: strataComm_t = null_mut();
            let o = &mut out as *mut strataComm_t;
            let strs = [
                CString::new("nodes:zz").unwrap(),
                CString::new("bogus").unwrap(),
            ];
            let mut c = cfg();
            let mut cp: *const strataConfig_t = null();
            let (mut nr, mut rk, mut op) = (2, 0, o);
            let mut expect = ARG;
            match v % 8 {
                0 => op = null_mut(),
                1 => id.internal = [0; STRATA_UNIQUE_ID_BYTES],
                2 => id.internal[28] = 7,
                3 => nr = -(*v as c_int % 5),
                4 => rk = 2 + *v as c_int % 3,
                5 => rk = -1,
                6 => id.internal[0] ^= 0x20,
                _ => {
                    expect = bad_cfg(v / 8, &mut c, &strs);
                    cp = &c;
                }
            }
            call(Call::InitRank(op, nr, id, rk, cp), expect);
            if !out.is_null() {
                ctx.fail("a failed strataCommInitRank wrote its output".into());
            }
        }
        Bad::InitLocal(v) => {
            let mut out = [0usize as strataComm_t; 4];
            let strs = [
                CString::new("nodes:zz").unwrap(),
                CString::new("bogus").unwrap(),
            ];
            let mismatch = CString::new("nodes:2x2").unwrap();
            let mut c = cfg();
            let mut cp: *const strataConfig_t = null();
            let (mut o, mut nr, mut topo) = (out.as_mut_ptr(), 3, null::<c_char>());
            let mut expect = ARG;
            match v % 6 {
                0 => o = null_mut(),
                1 => nr = -(*v as c_int % 3),
                2 => {
                    topo = mismatch.as_ptr();
                    expect = USAGE;
                }
                3 => topo = strs[0].as_ptr(),
                4 => {
                    c.transport = strataTransportMpi;
                    cp = &c;
                }
                _ => {
                    expect = bad_cfg(v / 6, &mut c, &strs);
                    cp = &c;
                }
            }
            call(Call::InitLocal(o, nr, topo, cp), expect);
            if out.iter().any(|p| !p.is_null()) {
                ctx.fail("a failed strataCommInitLocal wrote its output".into());
            }
        }
    }
}
