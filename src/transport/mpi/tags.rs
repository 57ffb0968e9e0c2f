//! Message classes, tags and per-peer sequence numbers.

use mpi::ffi;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Messages up to this many bytes (and no longer than a piece) are small: their
/// receive is posted before they arrive, into a landing buffer of this size that holds
/// any small message whole. 64 KiB: the chunks of latency-bound collectives (a log-step
/// all-gather's last step moves half the result, 32 KiB of a 64 KiB one) match at once
/// instead of through a probe after they arrived (on four one-rank nodes sharing two
/// cores a 64 KiB log-step all-gather took 1.06x Open MPI's time against 1.16x with 16
/// KiB, 2026-11-30); a landing buffer per receive in flight is still small.
pub(super) const SMALL: usize = 64 << 10;

/// True when a message of `len` bytes travels as a small one with pieces of `piece`
/// bytes (the same on every rank, so both sides agree).
pub(super) fn is_small(len: usize, piece: usize) -> bool {
    len <= SMALL.min(piece)
}
/// Message classes, the top two bits of the tag: a small message, a larger whole
/// one, the 8-byte length header of a long message, a piece of a long message.
pub(super) const CLASS_SMALL: u32 = 0;
pub(super) const CLASS_WHOLE: u32 = 1;
pub(super) const CLASS_HEADER: u32 = 2;
pub(super) const CLASS_PIECE: u32 = 3;
/// Default piece limit: 256 KiB. A receive stages at most [`super::recv::SLOTS`] pieces
/// at once, and a `sendrecv`'s send keeps at most [`super::send::SEND_WINDOW`] pieces
/// unmatched by its peer. Measured on the emulated cluster (docs/cluster.md), nodes:2x1
/// at 100 Mbit/s, 16 MiB, against the goodput bound: pieces of 1 MiB all posted at once
/// reached 0.81-0.93 of the link (the two directions drifted apart), 1 MiB pieces in a
/// window of two 0.86-0.88, 256 KiB pieces in a window of two 0.98 (all-gather 715 ms,
/// all-reduce 1428 ms; Open MPI's own 710 and 1431). Before the window, nodes:2x4,
/// 16 MiB, medians of 6: `hier` 1049 ms at 512 KiB, 926 at 1 MiB, 896 at 4 MiB.
pub(super) const DEFAULT_PIECE: usize = 256 << 10;

/// Largest message sent as one MPI message, and the staging size of a receive
/// (`STRATA_MPI_MAX_MESSAGE`, read once; at most `i32::MAX`, MPI's count type).
pub(super) fn max_piece() -> usize {
    static P: OnceLock<usize> = OnceLock::new();
    *P.get_or_init(|| {
        std::env::var("STRATA_MPI_MAX_MESSAGE")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(DEFAULT_PIECE)
            .min(i32::MAX as usize)
    })
}

/// Bits of the sequence number in a tag: what `MPI_TAG_UB` leaves beside the two
/// class bits (28 with OpenMPI; at least 13, as MPI guarantees 32767).
pub(super) fn seq_bits() -> u32 {
    static B: OnceLock<u32> = OnceLock::new();
    *B.get_or_init(|| {
        let mut ptr: *mut c_int = std::ptr::null_mut();
        let mut flag: c_int = 0;
        // SAFETY: MPI is initialised (transports exist only after ensure_init); the
        // attribute value of MPI_TAG_UB is a pointer to an int owned by MPI.
        let ub = unsafe {
            let rc = ffi::MPI_Comm_get_attr(
                ffi::RSMPI_COMM_WORLD,
                ffi::MPI_TAG_UB as c_int,
                (&mut ptr as *mut *mut c_int).cast(),
                &mut flag,
            );
            if rc == ffi::MPI_SUCCESS as c_int && flag != 0 && !ptr.is_null() {
                *ptr
            } else {
                32767
            }
        };
        let bits = 63 - (ub.max(32767) as u64 + 1).leading_zeros();
        (bits - 2).min(28)
    })
}

pub(super) fn seq_mask(seq: u32) -> u32 {
    seq & ((1u32 << seq_bits()) - 1)
}

/// The tag of message `seq` (to or from one peer) of `class`. A receive posted for
/// a tag matches only the one message of that sequence number, and every message
/// from a peer is numbered in order, so no receive can take a later message in
/// place of a mismatched one.
pub(super) fn tag(class: u32, seq: u32) -> c_int {
    ((class << seq_bits()) | seq_mask(seq)) as c_int
}

/// (class, sequence number mod 2^bits) of a tag.
pub(super) fn untag(t: c_int) -> (u32, u32) {
    let t = t.max(0) as u32;
    (t >> seq_bits(), seq_mask(t))
}

/// The sequence numbers of one direction of every peer pair (sends to, or receives
/// from, each member). The calls of a transport are serialised (`busy`), so relaxed
/// counters suffice.
pub(super) struct Seqs(pub(super) Vec<AtomicU32>);

impl Seqs {
    pub(super) fn new(n: usize) -> Seqs {
        Seqs((0..n).map(|_| AtomicU32::new(0)).collect())
    }
    pub(super) fn get(&self, peer: usize) -> u32 {
        self.0[peer].load(Ordering::Relaxed)
    }
    pub(super) fn set(&self, peer: usize, v: u32) {
        self.0[peer].store(v, Ordering::Relaxed);
    }
}

/// Messages of a transfer of `len` bytes sent in pieces of `piece`.
pub(super) fn pieces(len: usize, piece: usize) -> usize {
    len.div_ceil(piece).max(1)
}
