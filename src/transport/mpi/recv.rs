//! A receive: the state machine that matches, length-checks and lands one transfer.

use super::comm::{byte_type, check, RawComm};
use super::request::{empty_status, request_null, retire, Poll, Req};
use super::tags::{
    max_piece, pieces, seq_mask, tag, untag, CLASS_HEADER, CLASS_PIECE, CLASS_SMALL, CLASS_WHOLE,
    SMALL,
};
use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::{c_int, c_void};

pub(super) enum Stage {
    /// A small message: a receive posted into `landing` for the message of sequence
    /// `seq` (class small, any length up to [`SMALL`]).
    Posted(Req),
    /// Waiting for the next message from the peer to match.
    Probe,
    /// Receiving the length header.
    Header(Req),
    /// Receiving piece `next_piece` (or the whole message).
    Data(Req),
    /// Consuming a mismatched message (`drain_left` more follow it).
    Drain(Req),
    Done,
}

/// Receives exactly `len` bytes from `peer`, checking the sender's length: a small
/// message (up to [`SMALL`] bytes) lands whole in a landing buffer posted before it
/// arrives (its length read from the status, then copied out); a larger one is
/// matched first (`MPI_Improbe`), its length compared, then received in place.
pub(super) struct RecvOp {
    pub(super) peer: usize,
    pub(super) me: usize,
    pub(super) buf: *mut u8,
    pub(super) len: usize,
    pub(super) stage: Stage,
    /// Sequence number of the next message to match from the peer.
    pub(super) seq: u32,
    /// Next piece to receive (long messages); `None` before the first match.
    pub(super) next_piece: Option<usize>,
    /// Length header of a long message (allocated when one is matched).
    pub(super) header: Option<Box<[u8; 8]>>,
    /// Bytes the peer sent, when they differ from `len`.
    pub(super) mismatch: Option<usize>,
    /// Messages still to drain after a mismatch.
    pub(super) drain_left: usize,
    /// Where a small message lands, or a mismatched message is drained to.
    pub(super) scratch: Vec<u8>,
    /// Idle polls of a posted small receive (the sender's message is looked for
    /// among the unmatched ones every few).
    pub(super) idle: u32,
}

impl RecvOp {
    /// Start receiving `buf.len()` bytes from `peer`, whose next message has sequence
    /// number `seq`; small ones get their receive posted at once. `landing` is a
    /// buffer of at least [`SMALL`] bytes to reuse (or empty).
    pub(super) fn new(
        comm: &RawComm,
        peer: usize,
        me: usize,
        buf: &mut [u8],
        seq: u32,
        landing: Vec<u8>,
    ) -> Result<RecvOp> {
        let mut op = RecvOp {
            peer,
            me,
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            stage: Stage::Probe,
            seq,
            next_piece: None,
            header: None,
            mismatch: None,
            drain_left: 0,
            scratch: landing,
            idle: 0,
        };
        if op.len <= SMALL {
            if op.scratch.len() < SMALL {
                op.scratch = vec![0u8; SMALL];
            }
            let mut r = request_null();
            // SAFETY: scratch holds SMALL bytes and is neither moved nor freed while
            // the request is live (the op is retired before it is dropped); live
            // communicator.
            check(
                unsafe {
                    ffi::MPI_Irecv(
                        op.scratch.as_mut_ptr() as *mut c_void,
                        SMALL as c_int,
                        byte_type(),
                        peer as c_int,
                        tag(CLASS_SMALL, seq),
                        comm.0,
                        &mut r,
                    )
                },
                "MPI_Irecv",
            )?;
            op.stage = Stage::Posted(Req(r));
        }
        Ok(op)
    }

    /// The landing buffer, for the next small receive (None while MPI may write it).
    pub(super) fn take_landing(&mut self) -> Option<Vec<u8>> {
        match self.stage {
            Stage::Done | Stage::Probe if self.scratch.len() >= SMALL => {
                Some(std::mem::take(&mut self.scratch))
            }
            _ => None,
        }
    }

    pub(super) fn mismatch_error(&self, sent: usize) -> Error {
        Error::InvalidUsage(format!(
            "rank {} sent {sent} bytes where rank {} expected {}: counts or dtypes differ across ranks",
            self.peer, self.me, self.len
        ))
    }

    /// Receive a matched message into `ptr..ptr+count`.
    pub(super) fn imrecv(msg: &mut ffi::MPI_Message, ptr: *mut u8, count: usize) -> Result<Req> {
        let mut r = request_null();
        // SAFETY: `ptr..ptr+count` is valid for writes and outlives the request (the
        // caller drives this op to completion or retires it before returning).
        check(
            unsafe {
                ffi::MPI_Imrecv(ptr as *mut c_void, count as c_int, byte_type(), msg, &mut r)
            },
            "MPI_Imrecv",
        )?;
        Ok(Req(r))
    }

    /// Start consuming a mismatched matched message of `count` bytes into scratch
    /// memory (a truncating receive is not safe: OpenMPI's single-copy path ignores
    /// the receive count), with `then` more messages to drain after it.
    pub(super) fn start_drain(
        &mut self,
        msg: &mut ffi::MPI_Message,
        count: usize,
        then: usize,
    ) -> Result<Poll> {
        self.scratch = vec![0u8; count];
        let r = Self::imrecv(msg, self.scratch.as_mut_ptr(), count)?;
        self.drain_left = then;
        self.stage = Stage::Drain(r);
        Ok(Poll::Progress)
    }

    /// A posted small receive that has not completed: is the peer's message of our
    /// sequence number waiting unmatched (another class: a longer message, so a
    /// length mismatch)? A message of a later sequence number means ours was sent
    /// before it (MPI keeps the order between two ranks) and is on its way.
    pub(super) fn foreign_head(&self, comm: &RawComm) -> Result<bool> {
        let mut flag: c_int = 0;
        let mut st = empty_status();
        // SAFETY: live communicator; out-pointers to locals; reading a predefined constant.
        check(
            unsafe {
                ffi::MPI_Iprobe(
                    self.peer as c_int,
                    ffi::RSMPI_ANY_TAG,
                    comm.0,
                    &mut flag,
                    &mut st,
                )
            },
            "MPI_Iprobe",
        )?;
        Ok(flag != 0 && untag(st.MPI_TAG).1 == seq_mask(self.seq))
    }

    pub(super) fn poll(&mut self, comm: &RawComm) -> Result<Poll> {
        let piece = max_piece();
        loop {
            match &mut self.stage {
                Stage::Done => return Ok(Poll::Done),
                Stage::Posted(r) => {
                    let got = r.test_count("MPI_Test (recv)")?;
                    match got {
                        Some(count) => {
                            self.seq = self.seq.wrapping_add(1);
                            self.stage = Stage::Done;
                            if count != self.len {
                                self.mismatch = Some(count);
                                return Err(self.mismatch_error(count));
                            }
                            // SAFETY: buf..buf+len is the caller's receive buffer; the
                            // landing buffer holds at least `len` received bytes.
                            let out = unsafe { std::slice::from_raw_parts_mut(self.buf, self.len) };
                            out.copy_from_slice(&self.scratch[..self.len]);
                            return Ok(Poll::Done);
                        }
                        None => {
                            self.idle = self.idle.wrapping_add(1);
                            if self.idle % 16 != 0 || !self.foreign_head(comm)? {
                                return Ok(Poll::Idle);
                            }
                            // A longer message in our place: withdraw the receive (no
                            // message can match it now) and let Probe drain that one.
                            if let Stage::Posted(r) = &mut self.stage {
                                if !retire([r]) {
                                    // MPI may still write the landing buffer.
                                    std::mem::forget(std::mem::take(&mut self.scratch));
                                    self.stage = Stage::Done;
                                    return Err(Error::Internal(
                                        "a small receive could not be withdrawn".into(),
                                    ));
                                }
                            }
                            self.stage = Stage::Probe;
                            continue;
                        }
                    }
                }
                Stage::Probe => {
                    let draining = self.mismatch.is_some();
                    let mut flag: c_int = 0;
                    // SAFETY: reading an MPI predefined handle.
                    let mut msg = unsafe { ffi::RSMPI_MESSAGE_NULL };
                    let mut st = empty_status();
                    // SAFETY: live communicator; out-pointers to locals; reading a
                    // predefined constant. The peer's messages match in order.
                    check(
                        unsafe {
                            ffi::MPI_Improbe(
                                self.peer as c_int,
                                ffi::RSMPI_ANY_TAG,
                                comm.0,
                                &mut flag,
                                &mut msg,
                                &mut st,
                            )
                        },
                        "MPI_Improbe",
                    )?;
                    if flag == 0 {
                        return Ok(Poll::Idle);
                    }
                    let mut count: c_int = 0;
                    // SAFETY: status filled by MPI_Improbe.
                    check(
                        unsafe { ffi::MPI_Get_count(&st, byte_type(), &mut count) },
                        "MPI_Get_count",
                    )?;
                    let count = count.max(0) as usize;
                    let (class, seq) = untag(st.MPI_TAG);
                    // An out-of-sequence message (only after an earlier failure) is
                    // a mismatch like one of another length.
                    let in_seq = seq == seq_mask(self.seq);
                    self.seq = self.seq.wrapping_add(1);
                    if draining {
                        let left = self.drain_left.saturating_sub(1);
                        return self.start_drain(&mut msg, count, left);
                    }
                    match self.next_piece {
                        None if class == CLASS_HEADER && in_seq && count == 8 => {
                            let hp = self
                                .header
                                .get_or_insert_with(|| Box::new([0; 8]))
                                .as_mut_ptr();
                            self.stage = Stage::Header(Self::imrecv(&mut msg, hp, 8)?);
                        }
                        None => {
                            // One whole message.
                            let whole = matches!(class, CLASS_SMALL | CLASS_WHOLE);
                            if !whole || !in_seq || self.len > piece || count != self.len {
                                self.mismatch = Some(count);
                                return self.start_drain(&mut msg, count, 0);
                            }
                            self.next_piece = Some(0);
                            self.stage = Stage::Data(Self::imrecv(&mut msg, self.buf, count)?);
                        }
                        Some(i) => {
                            let off = i * piece;
                            let want = piece.min(self.len - off);
                            if class != CLASS_PIECE || !in_seq || count != want {
                                // Only if ranks disagree on STRATA_MPI_MAX_MESSAGE.
                                self.mismatch = Some(count);
                                return self.start_drain(&mut msg, count, pieces(self.len) - i - 1);
                            }
                            // SAFETY: off + want <= len.
                            let p = unsafe { self.buf.add(off) };
                            self.stage = Stage::Data(Self::imrecv(&mut msg, p, want)?);
                        }
                    }
                    return Ok(Poll::Progress);
                }
                Stage::Header(r) => {
                    if !r.test("MPI_Test (recv header)")? {
                        return Ok(Poll::Idle);
                    }
                    let sent =
                        self.header.as_deref().map_or(0, |h| u64::from_le_bytes(*h)) as usize;
                    if sent != self.len || self.len <= SMALL {
                        // Drain the announced pieces: each draining Probe consumes one.
                        self.mismatch = Some(sent);
                        self.drain_left = pieces(sent);
                        self.stage = Stage::Probe;
                        return Ok(Poll::Progress);
                    }
                    self.next_piece = Some(0);
                    self.stage = Stage::Probe;
                    return Ok(Poll::Progress);
                }
                Stage::Data(r) => {
                    if !r.test("MPI_Test (recv)")? {
                        return Ok(Poll::Idle);
                    }
                    let i = self.next_piece.unwrap_or(0) + 1;
                    if i * piece >= self.len {
                        self.stage = Stage::Done;
                        return Ok(Poll::Done);
                    }
                    self.next_piece = Some(i);
                    self.stage = Stage::Probe;
                    return Ok(Poll::Progress);
                }
                Stage::Drain(r) => {
                    if !r.test("MPI_Test (drain)")? {
                        return Ok(Poll::Idle);
                    }
                    self.scratch = Vec::new();
                    if self.drain_left == 0 {
                        self.stage = Stage::Done;
                        let sent = self.mismatch.unwrap_or(0);
                        return Err(self.mismatch_error(sent));
                    }
                    self.stage = Stage::Probe;
                    continue;
                }
            }
        }
    }

    pub(super) fn cancel(&mut self) -> bool {
        let retired = match &mut self.stage {
            Stage::Posted(r) | Stage::Header(r) | Stage::Data(r) | Stage::Drain(r) => retire([r]),
            Stage::Probe | Stage::Done => true,
        };
        if !retired {
            // MPI may still write into them: never free them.
            std::mem::forget(std::mem::take(&mut self.scratch));
            std::mem::forget(self.header.take());
        }
        retired
    }
}
