//! A receive: the state machine that matches, length-checks and lands one transfer.
//!
//! MPI only ever writes transport-owned memory: a small message lands in a landing
//! buffer, a larger one in staging slots of at most one piece each, and the bytes are
//! copied into the caller's buffer once a piece completes. A request that cannot be
//! retired after a timeout or abort takes its landing or staging memory with it (leaked
//! to MPI), never the caller's buffer.

use super::comm::{byte_type, RawComm};
use super::rc::check;
use super::request::{byte_count, empty_status, request_null, retire, Poll, Req};
use super::tags::{
    is_small, pieces, seq_mask, tag, untag, CLASS_HEADER, CLASS_PIECE, CLASS_SMALL, CLASS_WHOLE,
    SMALL,
};
use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::{c_int, c_void};

/// Pieces of one receive in flight at once: the copy-out of one overlaps the transfer of
/// the next.
pub(super) const SLOTS: usize = 2;

pub(super) enum Stage {
    /// A small message: a receive posted into `landing` for the message of sequence
    /// `seq` (class small, any length up to [`SMALL`]).
    Posted(Req),
    /// Waiting for the peer's first message (whole, or a long message's header) to match.
    Probe,
    /// Receiving the length header.
    Header(Req),
    /// Receiving the data messages (the whole message, or the pieces; or, after a
    /// mismatch, the messages to drain) through the staging slots.
    Data,
    Done,
}

/// Transport-owned receive memory, reused between calls; held by the call lock.
#[derive(Default)]
pub(super) struct Buffers {
    /// Landing buffers of small receives ([`SMALL`] bytes each).
    pub(super) landing: Vec<Vec<u8>>,
    /// Staging buffers of larger receives (at most a piece each).
    pub(super) staging: Vec<Vec<u8>>,
}

/// One data message in flight into transport-owned memory.
#[derive(Default)]
pub(super) struct Slot {
    /// Null when the slot is free.
    pub(super) req: Option<Req>,
    /// Staging memory (at most a piece; a drained message gets its own size).
    pub(super) buf: Vec<u8>,
    /// Where its bytes go in the caller's buffer.
    pub(super) off: usize,
    pub(super) len: usize,
    /// A mismatched message being consumed: its bytes are dropped.
    pub(super) drain: bool,
}

/// `peer` sent `sent` bytes where `me` expected `len`.
pub(super) fn mismatch_error(peer: usize, me: usize, sent: usize, len: usize) -> Error {
    Error::InvalidUsage(format!(
        "rank {peer} sent {sent} bytes where rank {me} expected {len}: counts or dtypes differ across ranks"
    ))
}

/// Receives exactly `len` bytes from `peer`, checking the sender's length: a small
/// message (up to [`SMALL`] bytes) lands whole in a landing buffer posted before it
/// arrives (its length read from the status); a larger one is matched first
/// (`MPI_Improbe`), its length compared, then received piece by piece into staging
/// slots. Either way the bytes are copied into the caller's buffer on completion.
pub(super) struct RecvOp {
    pub(super) peer: usize,
    pub(super) me: usize,
    pub(super) buf: *mut u8,
    pub(super) len: usize,
    pub(super) stage: Stage,
    /// Sequence number of the next message to match from the peer.
    pub(super) seq: u32,
    /// Largest message the peer sends whole (its piece size).
    pub(super) piece: usize,
    /// Data messages to receive (1 for a whole message), matched so far, landed so far.
    pub(super) msgs: usize,
    pub(super) matched: usize,
    pub(super) landed: usize,
    /// Length header of a long message (allocated when one is matched).
    pub(super) header: Option<Box<[u8; 8]>>,
    /// Bytes the peer sent, when they differ from `len`: the rest is drained.
    pub(super) mismatch: Option<usize>,
    /// Where a small message lands.
    pub(super) landing: Vec<u8>,
    pub(super) slots: [Slot; SLOTS],
    /// Idle polls of a posted small receive (the sender's message is looked for
    /// among the unmatched ones every few).
    pub(super) idle: u32,
}

impl RecvOp {
    /// Start receiving `buf.len()` bytes from `peer`, whose next message has sequence
    /// number `seq` and who sends at most `piece` bytes per message; small ones get
    /// their receive posted at once. Its landing or staging memory comes from `bufs`
    /// (staging buffers grow on use; [`RecvOp::settle`] gives them back).
    pub(super) fn new(
        comm: &RawComm,
        peer: usize,
        me: usize,
        buf: &mut [u8],
        seq: u32,
        piece: usize,
        bufs: &mut Buffers,
    ) -> Result<RecvOp> {
        let small = is_small(buf.len(), piece);
        let landing = if small {
            bufs.landing.pop().unwrap_or_default()
        } else {
            Vec::new()
        };
        let staging = if small {
            0
        } else {
            pieces(buf.len(), piece).min(SLOTS)
        };
        let keep = bufs.staging.len().saturating_sub(staging);
        let mut op = RecvOp::at(peer, me, buf, seq, piece, landing, Stage::Probe);
        for (s, b) in op.slots.iter_mut().zip(bufs.staging.drain(keep..)) {
            s.buf = b;
        }
        if small {
            if op.landing.len() < SMALL {
                op.landing = vec![0u8; SMALL];
            }
            let mut r = request_null();
            // SAFETY: the landing buffer holds SMALL bytes and is neither moved nor freed
            // while the request is live (the op is retired before it is dropped, or the
            // buffer leaked); live communicator.
            check(
                unsafe {
                    ffi::MPI_Irecv(
                        op.landing.as_mut_ptr() as *mut c_void,
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

    /// A receive into `buf` at `stage`, nothing matched or landed yet. With
    /// `Stage::Posted`: a small receive already posted (into `landing`, for message `seq`
    /// of `peer`), what [`RecvOp::new`] makes of a small receive, for a caller that polled
    /// the request itself first (the quick step of `MpiTransport::sendrecv`) and hands it
    /// over to `MpiTransport::drive`.
    pub(super) fn at(
        peer: usize,
        me: usize,
        buf: &mut [u8],
        seq: u32,
        piece: usize,
        landing: Vec<u8>,
        stage: Stage,
    ) -> RecvOp {
        RecvOp {
            peer,
            me,
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            stage,
            seq,
            piece,
            msgs: 0,
            matched: 0,
            landed: 0,
            header: None,
            mismatch: None,
            landing,
            slots: Default::default(),
            idle: 0,
        }
    }

    /// True while MPI may write memory of this op (a request is live).
    fn live(&self) -> bool {
        match &self.stage {
            Stage::Posted(r) | Stage::Header(r) => !r.is_null(),
            Stage::Data => self.slots.iter().any(|s| s.req.is_some()),
            Stage::Probe | Stage::Done => false,
        }
    }

    /// True while a transfer is posted (not merely waiting for a message to match).
    pub(super) fn transferring(&self) -> bool {
        matches!(self.stage, Stage::Header(_) | Stage::Data)
    }

    /// Give the landing and staging buffers no request writes back to `bufs`, for later
    /// receives (once the op is driven or retired).
    pub(super) fn settle(&mut self, bufs: &mut Buffers) {
        if !self.live() && self.landing.len() >= SMALL {
            bufs.landing.push(std::mem::take(&mut self.landing));
        }
        for s in self.slots.iter_mut() {
            if s.req.is_none() && !s.buf.is_empty() && s.buf.len() <= self.piece {
                bufs.staging.push(std::mem::take(&mut s.buf));
            }
        }
    }

    fn mismatch_error(&self, sent: usize) -> Error {
        mismatch_error(self.peer, self.me, sent, self.len)
    }

    /// Receive a matched message into `ptr..ptr+count`.
    fn imrecv(msg: &mut ffi::MPI_Message, ptr: *mut u8, count: usize) -> Result<Req> {
        let mut r = request_null();
        // SAFETY: `ptr..ptr+count` is transport-owned memory valid for writes that
        // outlives the request (the op is retired before its memory is dropped, or the
        // memory is leaked with the request).
        check(
            unsafe {
                ffi::MPI_Imrecv(ptr as *mut c_void, count as c_int, byte_type(), msg, &mut r)
            },
            "MPI_Imrecv",
        )?;
        Ok(Req(r))
    }

    /// A posted small receive that has not completed: is the peer's message of our
    /// sequence number waiting unmatched (another class: a longer message, so a
    /// length mismatch)? A message of a later sequence number means ours was sent
    /// before it (MPI keeps the order between two ranks) and is on its way.
    fn foreign_head(&self, comm: &RawComm) -> Result<bool> {
        let head = self.probe(comm, None)?;
        Ok(head.is_some_and(|st| untag(st.MPI_TAG).1 == seq_mask(self.seq)))
    }

    /// Match the peer's next message: (message, bytes, class, in sequence), taking its
    /// sequence number; None while none is there.
    fn improbe(&mut self, comm: &RawComm) -> Result<Option<(ffi::MPI_Message, usize, u32, bool)>> {
        // SAFETY: reading an MPI predefined handle.
        let mut msg = unsafe { ffi::RSMPI_MESSAGE_NULL };
        let Some(st) = self.probe(comm, Some(&mut msg))? else {
            return Ok(None);
        };
        let count = byte_count(&st)?;
        let (class, seq) = untag(st.MPI_TAG);
        // An out-of-sequence message (only after an earlier failure) is a mismatch like
        // one of another length.
        let in_seq = seq == seq_mask(self.seq);
        self.seq = self.seq.wrapping_add(1);
        Ok(Some((msg, count, class, in_seq)))
    }

    /// The status of the peer's next message (any tag), None while none is there: with
    /// `msg`, matched into it (`MPI_Improbe`; the peer's messages match in order), else
    /// only looked at (`MPI_Iprobe`).
    fn probe(
        &self,
        comm: &RawComm,
        msg: Option<&mut ffi::MPI_Message>,
    ) -> Result<Option<ffi::MPI_Status>> {
        let mut flag: c_int = 0;
        let mut st = empty_status();
        let peer = self.peer as c_int;
        // SAFETY: live communicator; out-pointers to locals and to the caller's message;
        // reading a predefined constant.
        let (rc, name) = unsafe {
            let any = ffi::RSMPI_ANY_TAG;
            match msg {
                Some(m) => {
                    let rc = ffi::MPI_Improbe(peer, any, comm.0, &mut flag, m, &mut st);
                    (rc, "MPI_Improbe")
                }
                None => {
                    let rc = ffi::MPI_Iprobe(peer, any, comm.0, &mut flag, &mut st);
                    (rc, "MPI_Iprobe")
                }
            }
        };
        check(rc, name)?;
        Ok((flag != 0).then_some(st))
    }

    /// Receive the matched data message `msg` of `count` bytes into the free slot `i`:
    /// into staging when it is the expected one (`ok`) and nothing mismatched before,
    /// else into memory of its own, to be dropped (a truncating receive is not safe:
    /// OpenMPI's single-copy path ignores the receive count).
    fn land(&mut self, i: usize, msg: &mut ffi::MPI_Message, count: usize, ok: bool) -> Result<()> {
        if !ok && self.mismatch.is_none() {
            self.mismatch = Some(count);
        }
        let off = self.matched * self.piece;
        let s = &mut self.slots[i];
        s.drain = self.mismatch.is_some();
        if s.drain {
            // Kept out of the staging pool (its size is the sender's).
            s.buf = vec![0u8; count];
        } else if s.buf.len() < count {
            s.buf.resize(count, 0);
        }
        s.off = off;
        s.len = count;
        s.req = Some(Self::imrecv(msg, s.buf.as_mut_ptr(), count)?);
        self.matched += 1;
        Ok(())
    }

    /// The data message `matched` should be `count` bytes of `class`.
    fn expected(&self, class: u32, in_seq: bool, count: usize) -> bool {
        let off = self.matched * self.piece;
        let class_ok = if self.header.is_some() {
            class == CLASS_PIECE
        } else {
            matches!(class, CLASS_SMALL | CLASS_WHOLE) && self.len <= self.piece
        };
        class_ok && in_seq && off < self.len && count == self.piece.min(self.len - off)
    }

    /// Land completed slots (copying their bytes out), then match the peer's next data
    /// messages into the free ones.
    fn poll_data(&mut self, comm: &RawComm) -> Result<Poll> {
        let mut progress = false;
        for s in self.slots.iter_mut() {
            let Some(r) = s.req.as_mut() else { continue };
            if !r.test("MPI_Test (recv)")? {
                continue;
            }
            s.req = None;
            progress = true;
            self.landed += 1;
            if s.drain {
                s.buf = Vec::new();
            } else if self.mismatch.is_none() {
                // SAFETY: off + len <= self.len (checked when matched): the caller's
                // buffer, valid for writes until this op ends; the staging buffer holds
                // `len` received bytes and does not overlap it.
                let out = unsafe { std::slice::from_raw_parts_mut(self.buf.add(s.off), s.len) };
                out.copy_from_slice(&s.buf[..s.len]);
            }
        }
        if self.landed == self.msgs {
            self.stage = Stage::Done;
            return match self.mismatch {
                Some(sent) => Err(self.mismatch_error(sent)),
                None => Ok(Poll::Done),
            };
        }
        while self.matched < self.msgs {
            let Some(i) = self.slots.iter().position(|s| s.req.is_none()) else {
                break;
            };
            let Some((mut msg, count, class, in_seq)) = self.improbe(comm)? else {
                break;
            };
            // A piece of another size: only if ranks disagree on STRATA_MPI_MAX_MESSAGE.
            let ok = self.expected(class, in_seq, count);
            self.land(i, &mut msg, count, ok)?;
            progress = true;
        }
        Ok(if progress { Poll::Progress } else { Poll::Idle })
    }

    pub(super) fn poll(&mut self, comm: &RawComm) -> Result<Poll> {
        loop {
            match &mut self.stage {
                Stage::Done => return Ok(Poll::Done),
                Stage::Data => return self.poll_data(comm),
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
                            out.copy_from_slice(&self.landing[..self.len]);
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
                                    std::mem::forget(std::mem::take(&mut self.landing));
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
                    let Some((mut msg, count, class, in_seq)) = self.improbe(comm)? else {
                        return Ok(Poll::Idle);
                    };
                    if class == CLASS_HEADER && in_seq && count == 8 {
                        let hp = self
                            .header
                            .get_or_insert_with(|| Box::new([0; 8]))
                            .as_mut_ptr();
                        self.stage = Stage::Header(Self::imrecv(&mut msg, hp, 8)?);
                    } else {
                        // One whole message.
                        self.msgs = 1;
                        let ok = self.expected(class, in_seq, count);
                        self.stage = Stage::Data;
                        self.land(0, &mut msg, count, ok)?;
                    }
                    return Ok(Poll::Progress);
                }
                Stage::Header(r) => {
                    if !r.test("MPI_Test (recv header)")? {
                        return Ok(Poll::Idle);
                    }
                    let sent =
                        self.header.as_deref().map_or(0, |h| u64::from_le_bytes(*h)) as usize;
                    if sent != self.len || is_small(self.len, self.piece) {
                        // Drain the announced pieces.
                        self.mismatch = Some(sent);
                        self.msgs = pieces(sent, self.piece);
                    } else {
                        self.msgs = pieces(self.len, self.piece);
                    }
                    self.stage = Stage::Data;
                    return Ok(Poll::Progress);
                }
            }
        }
    }

    /// Best-effort retire; false when a request had to be released to MPI, which then
    /// owns the memory it writes (leaked here): never the caller's buffer.
    pub(super) fn cancel(&mut self) -> bool {
        let retired = match &mut self.stage {
            Stage::Posted(r) | Stage::Header(r) => retire([r]),
            Stage::Data => {
                let live: Vec<bool> = self.slots.iter().map(|s| s.req.is_some()).collect();
                let clean = retire(self.slots.iter_mut().filter_map(|s| s.req.as_mut()));
                if !clean {
                    for (s, was_live) in self.slots.iter_mut().zip(live) {
                        if was_live {
                            std::mem::forget(std::mem::take(&mut s.buf));
                        }
                    }
                }
                for s in self.slots.iter_mut() {
                    s.req = None;
                }
                clean
            }
            Stage::Probe | Stage::Done => true,
        };
        if !retired {
            // MPI may still write into them: never free them.
            std::mem::forget(std::mem::take(&mut self.landing));
            std::mem::forget(self.header.take());
        }
        retired
    }
}
