use super::*;
use crate::capi::coll::{strataAllGather, strataReduceScatter};
use crate::capi::init::{strataCommDestroy, strataCommInitLocal};
use crate::capi::registry::lookup;
use crate::runtime::request::FULL_CHECKS;
use std::ffi::c_int;
use std::ptr::{null, null_mut};

fn full_checks() -> usize {
    FULL_CHECKS.with(|n| n.get())
}

fn world(n: usize) -> Vec<usize> {
    let mut comms = vec![null_mut(); n];
    // SAFETY: room for n handles; a valid C string; NULL config.
    let r = unsafe {
        strataCommInitLocal(
            comms.as_mut_ptr(),
            n as c_int,
            c"nodes:1x4".as_ptr(),
            null(),
        )
    };
    assert_eq!(r, strataSuccess);
    comms.into_iter().map(|c| c as usize).collect()
}

/// Floats per rank in [`c_calls_are_checked_once_with_the_right_in_place_layout`].
const C: usize = 2;

/// `strataAllGather` of `C` floats, blocking.
///
/// # Safety
/// `send` is readable for `C` floats, `recv` writable for 4·`C`; `c` is live.
unsafe fn all_gather(send: *const f32, recv: *mut f32, c: strataComm_t) -> strataResult_t {
    // SAFETY: the caller's contract.
    unsafe { strataAllGather(send.cast(), recv.cast(), C, strataFloat32, c, null_mut()) }
}

/// `strataReduceScatter` (sum) of 4·`C` floats into `C`, blocking.
///
/// # Safety
/// `send` is readable for 4·`C` floats, `recv` writable for `C`; `c` is live.
unsafe fn reduce_scatter(send: *const f32, recv: *mut f32, c: strataComm_t) -> strataResult_t {
    // SAFETY: the caller's contract.
    unsafe {
        strataReduceScatter(
            send.cast(),
            recv.cast(),
            C,
            strataFloat32,
            strataSum,
            c,
            null_mut(),
        )
    }
}

/// From C, the call's one checked request records the in-place layout NCCL's rule
/// gives on each rank (all-gather `send == recv + rank·count`, reduce-scatter `recv ==
/// send + rank·count`), separate buffers record none, any other overlap is refused,
/// and no full check runs after the boundary's: each call is validated once.
#[test]
fn c_calls_are_checked_once_with_the_right_in_place_layout() {
    let comms = world(4);
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, &c)| {
            std::thread::spawn(move || {
                let c = c as strataComm_t;
                let f = std::mem::size_of::<f32>();
                let before = full_checks();
                // SAFETY: every pointer is valid for the counts passed; live comm.
                unsafe {
                    // All-gather out of place.
                    let x = [r as f32; C];
                    let mut g = [0f32; 4 * C];
                    let gp = g.as_mut_ptr();
                    let rc = all_gather(x.as_ptr(), gp, c);
                    assert_eq!(rc, strataSuccess);
                    assert_eq!(seen::take(), None);
                    assert_eq!(g, [0., 0., 1., 1., 2., 2., 3., 3.]);
                    // All-gather in place: send = recv + rank·count.
                    let mut g = [0f32; 4 * C];
                    g[r * C..(r + 1) * C].fill(10.0 + r as f32);
                    let gp = g.as_mut_ptr();
                    let rc = all_gather(gp.add(r * C), gp, c);
                    assert_eq!(rc, strataSuccess);
                    let offset = r * C * f;
                    assert_eq!(seen::take(), Some(InPlace::SendInRecv { offset }));
                    assert_eq!(g, [10., 10., 11., 11., 12., 12., 13., 13.]);
                    // Reduce-scatter out of place.
                    let s = [1.0 + r as f32; 4 * C];
                    let mut y = [0f32; C];
                    let rc = reduce_scatter(s.as_ptr(), y.as_mut_ptr(), c);
                    assert_eq!(rc, strataSuccess);
                    assert_eq!(seen::take(), None);
                    assert_eq!(y, [10.0; C]);
                    // Reduce-scatter in place: recv = send + rank·count.
                    let mut s = [1.0 + r as f32; 4 * C];
                    let sp = s.as_mut_ptr();
                    let rc = reduce_scatter(sp, sp.add(r * C), c);
                    assert_eq!(rc, strataSuccess);
                    assert_eq!(seen::take(), Some(InPlace::RecvInSend { offset }));
                    assert_eq!(&s[r * C..(r + 1) * C], &[10.0; C]);
                    // Overlap at another rank's block: refused at the boundary, nothing
                    // submitted.
                    let w = (r + 1) % 4;
                    assert_eq!(all_gather(gp.add(w * C), gp, c), strataInvalidArgument);
                    assert_eq!(reduce_scatter(sp, sp.add(w * C), c), strataInvalidArgument);
                    assert!(seen::SEEN.with(|s| s.borrow().is_none()));
                }
                // The boundary's check was each call's only one.
                assert_eq!(full_checks(), before);
                // A request built in Rust is still checked in full.
                let comm = lookup(c).unwrap().comm.clone();
                let b = Buffer::from_slice(&[0f32; 4 * C]);
                let send = b.slice(r * C * 4..(r + 1) * C * 4).unwrap();
                let req = Request::new(
                    crate::comm::Op::AllGather {
                        send,
                        recv: b,
                        count: C,
                    },
                    crate::DataType::F32,
                );
                comm.call(req).unwrap();
                assert_eq!(full_checks(), before + 1);
                // SAFETY: live communicator, destroyed once.
                assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
}

/// A checked request is taken as it is by its own rank and size only: for another
/// rank (in place on rank 1 is an overlap on rank 2) or size it is checked again in
/// full; a request can only become `Checked` through a check (or the boundary's).
#[test]
fn a_checked_request_covers_its_own_rank_only() {
    let dt = crate::DataType::F32;
    let recv = Buffer::from_slice(&[0f32; 8]);
    let send = recv.slice(8..16).unwrap();
    let op = crate::comm::Op::AllGather {
        send,
        recv: recv.clone(),
        count: 2,
    };
    let n = full_checks();
    let checked = Checked::new(Request::new(op.clone(), dt), 1, 4).unwrap();
    assert_eq!(full_checks(), n + 1);
    // Another rank: checked again, and refused.
    let r = checked.on(2, 4);
    assert_eq!(r.unwrap_err().code(), strataInvalidArgument);
    assert_eq!(full_checks(), n + 2);
    // Another size: checked again (in place on rank 1 of 8 is an overlap too).
    let checked = Checked::new(Request::new(op.clone(), dt), 1, 4).unwrap();
    assert!(checked.on(1, 8).is_err());
    assert_eq!(full_checks(), n + 4);
    // Its own rank and size: as it is, no check.
    let checked = Checked::new(Request::new(op, dt), 1, 4).unwrap();
    let checked = checked.on(1, 4).unwrap();
    assert_eq!(full_checks(), n + 5);
    assert!(checked.request().op.layout().is_some());
}
