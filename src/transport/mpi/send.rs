//! A send: one message, or a length header and pieces.

use super::comm::{byte_type, check, RawComm};
use super::request::{request_null, retire, Poll, Req};
use super::tags::{tag, CLASS_HEADER, CLASS_PIECE, CLASS_SMALL, CLASS_WHOLE, SMALL};
use crate::error::Result;
use mpi::ffi;
use std::os::raw::{c_int, c_void};

/// Sends `data` to `peer` as one message, or as header + pieces; every message takes
/// the next sequence number to that peer.
pub(super) struct SendOp {
    pub(super) peer: usize,
    /// The first message's request (the only one unless header + pieces).
    pub(super) first: Req,
    /// The requests of the pieces after the header.
    pub(super) more: Vec<Req>,
    /// Messages posted.
    pub(super) posted: usize,
    /// Sequence number after the last message.
    pub(super) next_seq: u32,
    /// Length header of a long message (boxed: MPI reads it until the request completes).
    pub(super) header: Option<Box<[u8; 8]>>,
}

impl SendOp {
    pub(super) fn post(
        comm: &RawComm,
        peer: usize,
        data: &[u8],
        seq: u32,
        piece: usize,
    ) -> Result<SendOp> {
        let mut op = SendOp {
            peer,
            first: Req(request_null()),
            more: Vec::new(),
            posted: 0,
            next_seq: seq,
            header: None,
        };
        let isend = |ptr: *const u8, len: usize, class: u32, op: &mut SendOp| -> Result<()> {
            let mut r = request_null();
            // SAFETY: `ptr..ptr+len` is valid for reads and outlives the request: the
            // caller drives this op to completion (or retires it) before returning.
            check(
                unsafe {
                    ffi::MPI_Isend(
                        ptr as *const c_void,
                        len as c_int,
                        byte_type(),
                        peer as c_int,
                        tag(class, op.next_seq),
                        comm.0,
                        &mut r,
                    )
                },
                "MPI_Isend",
            )?;
            op.next_seq = op.next_seq.wrapping_add(1);
            if op.posted == 0 {
                op.first = Req(r);
            } else {
                op.more.push(Req(r));
            }
            op.posted += 1;
            Ok(())
        };
        let posted = if data.len() <= SMALL {
            isend(data.as_ptr(), data.len(), CLASS_SMALL, &mut op)
        } else if data.len() <= piece {
            isend(data.as_ptr(), data.len(), CLASS_WHOLE, &mut op)
        } else {
            let header = Box::new((data.len() as u64).to_le_bytes());
            let hp = header.as_ptr();
            op.header = Some(header);
            isend(hp, 8, CLASS_HEADER, &mut op).and_then(|_| {
                data.chunks(piece)
                    .try_for_each(|c| isend(c.as_ptr(), c.len(), CLASS_PIECE, &mut op))
            })
        };
        if let Err(e) = posted {
            // Retire what was posted before failing (the pieces borrow `data`).
            op.cancel();
            return Err(e);
        }
        Ok(op)
    }

    pub(super) fn reqs_mut(&mut self) -> impl Iterator<Item = &mut Req> {
        std::iter::once(&mut self.first).chain(self.more.iter_mut())
    }

    pub(super) fn poll(&mut self) -> Result<Poll> {
        let mut progress = false;
        let mut done = true;
        for r in self.reqs_mut() {
            if r.is_null() {
                continue;
            }
            if r.test("MPI_Test (send)")? {
                progress = true;
            } else {
                done = false;
            }
        }
        Ok(if done {
            Poll::Done
        } else if progress {
            Poll::Progress
        } else {
            Poll::Idle
        })
    }

    pub(super) fn cancel(&mut self) -> bool {
        let clean = retire(self.reqs_mut());
        if !clean {
            // MPI may still read it: never free it.
            std::mem::forget(self.header.take());
        }
        clean
    }
}
