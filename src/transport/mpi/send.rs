//! A send: one message, or a length header and pieces; in a `sendrecv`, the pieces
//! are synchronous sends, at most a window of them in flight.

use super::comm::{byte_type, RawComm};
use super::rc::check;
use super::request::{request_null, retire, Poll, Req};
use super::tags::{is_small, pieces, tag, CLASS_HEADER, CLASS_PIECE, CLASS_SMALL, CLASS_WHOLE};
use crate::error::Result;
use mpi::ffi;
use std::os::raw::{c_int, c_void};

/// Pieces of a `sendrecv`'s send in flight at once: sent with `MPI_Issend`, a piece
/// completes when the peer has matched it, and the next is posted only then. The two
/// directions of an exchange then move in step and at most this many pieces wait in
/// MPI's and the kernel's queues: posted all at once, one direction of a shaped link
/// ran ahead of the other (TCP's two-way unfairness: each direction's acknowledgements
/// queue behind the other's data), and the collective waited for the slow one while
/// the fast one idled, 70-220 ms per 8 MiB exchange on nodes:2x1 at 100 Mbit/s
/// (docs/cluster.md, "One link").
pub(super) const SEND_WINDOW: usize = 2;

/// The window of a `sendrecv`'s send: [`SEND_WINDOW`] unless the hidden knob
/// `STRATA_MPI_SEND_WINDOW` sets another (read once; 0: no window, every piece posted at
/// once as a plain send, as before the window).
pub(super) fn send_window() -> Option<usize> {
    static W: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let w = *W.get_or_init(|| {
        std::env::var("STRATA_MPI_SEND_WINDOW")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(SEND_WINDOW)
    });
    (w > 0).then_some(w)
}

/// `MPI_Isend` and `MPI_Issend` share this signature.
type SendFn = unsafe extern "C" fn(
    *const c_void,
    c_int,
    ffi::MPI_Datatype,
    c_int,
    c_int,
    ffi::MPI_Comm,
    *mut ffi::MPI_Request,
) -> c_int;

/// Pieces of a long message not yet posted (their bytes are the caller's, borrowed for
/// the op's life like the posted ones).
struct Rest {
    ptr: *const u8,
    len: usize,
    piece: usize,
    /// Next piece to post, and how many there are.
    next: usize,
    total: usize,
}

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
    /// Sequence number of the next message to post.
    next_seq: u32,
    /// Sequence number after the last message, posted or not (the peer's next).
    pub(super) end_seq: u32,
    /// Length header of a long message (boxed: MPI reads it until the request completes).
    pub(super) header: Option<Box<[u8; 8]>>,
    rest: Option<Rest>,
    /// Pieces in flight at most (windowed sends: `MPI_Issend`, complete once matched).
    window: Option<usize>,
    /// Requests completed so far (the header's included).
    completed: usize,
}

impl SendOp {
    /// Post the send: the whole message, or the header and the first `window` pieces
    /// (all of them when `None`; [`SendOp::feed`] posts the others).
    pub(super) fn post(
        comm: &RawComm,
        peer: usize,
        data: &[u8],
        seq: u32,
        piece: usize,
        window: Option<usize>,
    ) -> Result<SendOp> {
        let mut op = SendOp {
            peer,
            first: Req(request_null()),
            more: Vec::new(),
            posted: 0,
            next_seq: seq,
            end_seq: seq.wrapping_add(1),
            header: None,
            rest: None,
            window,
            completed: 0,
        };
        let posted = if is_small(data.len(), piece) {
            op.isend(comm, data.as_ptr(), data.len(), CLASS_SMALL)
        } else if data.len() <= piece {
            op.isend(comm, data.as_ptr(), data.len(), CLASS_WHOLE)
        } else {
            let total = pieces(data.len(), piece);
            op.end_seq = seq.wrapping_add(1 + total as u32);
            let header = Box::new((data.len() as u64).to_le_bytes());
            let hp = header.as_ptr();
            op.header = Some(header);
            op.rest = Some(Rest {
                ptr: data.as_ptr(),
                len: data.len(),
                piece,
                next: 0,
                total,
            });
            op.isend(comm, hp, 8, CLASS_HEADER)
                .and_then(|_| op.feed(comm).map(|_| ()))
        };
        if let Err(e) = posted {
            // Retire what was posted before failing (the pieces borrow `data`).
            op.cancel();
            return Err(e);
        }
        Ok(op)
    }

    /// A small message already posted as message `seq` to `peer` (`req`): what
    /// [`SendOp::post`] makes of it, for a caller that polled the request itself first
    /// (the quick step of `MpiTransport::sendrecv`) and hands it over to the driver.
    pub(super) fn posted(peer: usize, req: Req, seq: u32) -> SendOp {
        SendOp {
            peer,
            first: req,
            more: Vec::new(),
            posted: 1,
            next_seq: seq.wrapping_add(1),
            end_seq: seq.wrapping_add(1),
            header: None,
            rest: None,
            window: None,
            completed: 0,
        }
    }

    /// `MPI_Isend` of `len` bytes at `ptr` as the next message.
    fn isend(&mut self, comm: &RawComm, ptr: *const u8, len: usize, class: u32) -> Result<()> {
        let mut r = request_null();
        let (send, name) = if self.window.is_some() && class == CLASS_PIECE {
            (ffi::MPI_Issend as SendFn, "MPI_Issend")
        } else {
            (ffi::MPI_Isend as SendFn, "MPI_Isend")
        };
        check(
            // SAFETY: `ptr..ptr+len` is valid for reads and outlives the request: it is
            // the caller's data (or the boxed header), and the caller drives this op to
            // completion (or retires it) before returning.
            unsafe {
                send(
                    ptr as *const c_void,
                    len as c_int,
                    byte_type(),
                    self.peer as c_int,
                    tag(class, self.next_seq),
                    comm.0,
                    &mut r,
                )
            },
            name,
        )?;
        self.next_seq = self.next_seq.wrapping_add(1);
        if self.posted == 0 {
            self.first = Req(r);
        } else {
            self.more.push(Req(r));
        }
        self.posted += 1;
        Ok(())
    }

    /// Post the pieces the window allows; true when it posted any.
    pub(super) fn feed(&mut self, comm: &RawComm) -> Result<bool> {
        let credit = self
            .window
            .map_or(usize::MAX, |w| self.completed.saturating_sub(1) + w);
        let mut fed = false;
        while let Some(r) = &self.rest {
            if r.next >= r.total || r.next >= credit {
                break;
            }
            let off = r.next * r.piece;
            let len = r.piece.min(r.len - off);
            // SAFETY: off < len of the caller's data (next < total pieces), so the
            // pointer stays inside it.
            let ptr = unsafe { r.ptr.add(off) };
            self.isend(comm, ptr, len, CLASS_PIECE)?;
            if let Some(r) = self.rest.as_mut() {
                r.next += 1;
            }
            fed = true;
        }
        Ok(fed)
    }

    /// True while pieces wait for [`SendOp::feed`].
    pub(super) fn unposted(&self) -> bool {
        self.rest.as_ref().is_some_and(|r| r.next < r.total)
    }

    pub(super) fn reqs_mut(&mut self) -> impl Iterator<Item = &mut Req> {
        std::iter::once(&mut self.first).chain(self.more.iter_mut())
    }

    pub(super) fn poll(&mut self) -> Result<Poll> {
        let mut progress = false;
        let mut completed = 0;
        let mut done = !self.unposted();
        for r in self.reqs_mut() {
            if r.is_null() {
                continue;
            }
            if r.test("MPI_Test (send)")? {
                progress = true;
                completed += 1;
            } else {
                done = false;
            }
        }
        self.completed += completed;
        Ok(if done {
            Poll::Done
        } else if progress {
            Poll::Progress
        } else {
            Poll::Idle
        })
    }

    pub(super) fn cancel(&mut self) -> bool {
        // Pieces never posted need nothing.
        self.rest = None;
        let clean = retire(self.reqs_mut());
        if !clean {
            // MPI may still read it: never free it.
            std::mem::forget(self.header.take());
        }
        clean
    }
}
