//! The receive state machine against real MPI (no mocks). Every test but the last runs
//! on any number of ranks, each rank talking to itself, so `cargo test` runs them as a
//! singleton MPI process. The last needs a second rank that stalls mid-transfer:
//!
//!     cargo test -p strata --features mpi --lib transport::mpi
//!     CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER='mpirun --oversubscribe --bind-to none -np 2' \
//!         cargo test -p strata --features mpi --lib transport::mpi -- --test-threads=1
//!
//! (under mpirun every rank runs the same tests in the same order: one thread.)

use super::progress::Op;
use super::recv::Stage;
use super::request::{empty_status, Poll};
use super::send::SEND_WINDOW;
use super::tags::{seq_bits, tag, untag, CLASS_HEADER, CLASS_PIECE, CLASS_WHOLE, SMALL};
use super::transport::MpiTransport;
use crate::error::Error;
use crate::transport::P2p;
use mpi::ffi;
use std::os::raw::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(200);

/// A new communicator over the world (its creation is collective: one at a time),
/// sending at most `piece` bytes per message.
fn world(piece: usize, timeout: Duration) -> MpiTransport {
    static CREATE: Mutex<()> = Mutex::new(());
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    if std::env::var_os("OMPI_MCA_btl_vader_single_copy_mechanism").is_none() {
        // Before MPI_Init (the first call only): a single-copy receive reads the sender's
        // memory without the sender's help, so a stalled sender would not stall it.
        std::env::set_var("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    }
    let t = MpiTransport::world(None, timeout)
        .expect("MPI transport")
        .with_piece(piece);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        extern "C" {
            fn atexit(f: extern "C" fn()) -> c_int;
        }
        extern "C" fn finalize() {
            super::finalize();
        }
        // SAFETY: registers a plain function; the test harness exits through `exit`,
        // after every test, so MPI is finalised once (mpirun counts a process that exits
        // without finalising as failed).
        unsafe {
            atexit(finalize);
        }
    });
    t
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 8) as u8)
        .collect()
}

/// Send `data` to self and receive it into a buffer of `want` bytes.
fn to_self(t: &MpiTransport, data: &[u8], want: usize) -> (crate::error::Result<()>, Vec<u8>) {
    let mut got = vec![0xEEu8; want];
    let me = t.rank();
    let r = t.sendrecv(me, data, me, &mut got);
    (r, got)
}

fn roundtrip(t: &MpiTransport, len: usize, salt: u8) {
    let data = pattern(len, salt);
    let (r, got) = to_self(t, &data, len);
    r.unwrap_or_else(|e| panic!("{len} bytes to self: {e}"));
    assert!(got == data, "{len} bytes to self arrived changed");
}

fn seqs(t: &MpiTransport) -> (u32, u32) {
    let me = t.rank();
    (t.sent.get(me), t.received.get(me))
}

#[test]
fn windowed_send_keeps_two_pieces_in_flight() {
    // A sendrecv's send posts the header and SEND_WINDOW pieces, the next piece only
    // once one is matched (MPI_Issend), and still delivers every byte in order; the
    // sequence numbers account for every piece at once.
    let piece = 4 << 10;
    let t = world(piece, LONG);
    let me = t.rank();
    let len = 10 * piece + 3;
    let data = pattern(len, 9);
    let mut got = vec![0u8; len];
    let before = seqs(&t);
    let mut bufs = t.busy.lock().unwrap();
    let recv = t.post_recv(&mut bufs, me, &mut got).unwrap();
    let send = t.post_send(me, &data, Some(SEND_WINDOW)).unwrap();
    let Op::Send(s) = &send else { unreachable!() };
    assert_eq!(s.posted, 1 + SEND_WINDOW, "header and a window of pieces");
    assert!(s.unposted(), "the other pieces wait");
    assert_eq!(t.sent.get(me), before.0 + 1 + 11, "every piece numbered");
    let mut ops = [recv, send];
    t.drive(&mut ops).unwrap();
    t.settle(&mut bufs, &mut ops);
    let Op::Send(s) = &ops[1] else { unreachable!() };
    assert_eq!(s.posted, 1 + 11, "every piece posted in the end");
    drop(bufs);
    assert!(got == data, "a windowed send arrived changed");
    assert_eq!(seqs(&t), (before.0 + 12, before.1 + 12));
    roundtrip(&t, len, 10);
}

#[test]
fn small_messages_land_whole() {
    let t = world(1 << 20, LONG);
    for len in [0, 1, 100, SMALL - 1, SMALL] {
        let before = seqs(&t);
        roundtrip(&t, len, 1);
        let after = seqs(&t);
        assert_eq!(after.0, before.0 + 1, "one message per small send");
        assert_eq!(after.1, before.1 + 1, "one message per small receive");
    }
    // The landing buffer comes back for the next small receive.
    assert_eq!(t.busy.lock().unwrap().landing.len(), 1);
}

#[test]
fn whole_message_lands_through_staging() {
    let piece = 256 << 10;
    let t = world(piece, LONG);
    for len in [SMALL + 1, 100_000, piece] {
        let before = seqs(&t);
        roundtrip(&t, len, 2);
        assert_eq!(
            seqs(&t),
            (before.0 + 1, before.1 + 1),
            "{len}: one whole message"
        );
    }
    let b = t.busy.lock().unwrap();
    assert_eq!(b.staging.len(), 1, "a whole message stages in one buffer");
    assert!(b.staging[0].len() <= piece);
}

#[test]
fn long_message_travels_as_header_and_pieces() {
    let piece = 5000; // pieces not a power of two, the last one short
    let t = world(piece, LONG);
    for len in [piece + 1, 2 * piece, 100_003] {
        let before = seqs(&t);
        roundtrip(&t, len, 3);
        let n = len.div_ceil(piece) as u32;
        assert_eq!(
            seqs(&t),
            (before.0 + 1 + n, before.1 + 1 + n),
            "{len}: header and {n} pieces"
        );
    }
    let b = t.busy.lock().unwrap();
    assert_eq!(b.staging.len(), 2, "two staging slots, reused");
    assert!(b.staging.iter().all(|s| s.len() <= piece));
}

#[test]
fn long_message_never_lands_in_place() {
    // Whatever state a receive is in, MPI writes only transport memory: a receive
    // retired mid-transfer leaves the caller's buffer as it was. (With pieces, the later
    // ones stay unreceived: the send may then time out, released to MPI.) A piece
    // above SMALL, so the first message is whole, not small.
    let piece = 2 * SMALL;
    for (len, timeout) in [(piece, LONG), (3 * piece + 7, SHORT)] {
        let t = world(piece, timeout);
        let me = t.rank();
        let data: &'static [u8] = Box::leak(pattern(len, 4).into_boxed_slice());
        let mut got = vec![0xA5u8; len];
        let mut bufs = t.busy.lock().unwrap();
        let mut recv = t.post_recv(&mut bufs, me, &mut got).unwrap();
        let mut send = [t.post_send(me, data, None).unwrap()];
        let Op::Recv(r) = &mut recv else {
            unreachable!()
        };
        let end = Instant::now() + LONG;
        // Until the first data message is matched (a staging slot is live).
        while !(matches!(r.stage, Stage::Data) && r.slots.iter().any(|s| s.req.is_some())) {
            assert!(
                r.poll(&t.comm).unwrap() != Poll::Done,
                "{len}: done too early"
            );
            assert!(Instant::now() < end, "{len}: nothing matched");
        }
        r.cancel();
        let sent = t.drive(&mut send);
        drop(bufs);
        assert!(
            got.iter().all(|&b| b == 0xA5),
            "{len}: MPI wrote the caller's buffer"
        );
        if len == piece {
            sent.unwrap();
            t.received.set(me, r.seq);
            roundtrip(&t, len, 5);
        }
    }
}

#[test]
fn length_mismatch_drains_and_the_next_message_matches() {
    let piece = 8192;
    let t = world(piece, LONG);
    // (sent, expected): small/small, long sent for a small receive (found unmatched
    // while the small receive waits), whole/whole, whole for a long receive, long/long
    // (the header differs), small sent for a long receive.
    for (sent, want) in [
        (100, 200),
        (20_000, 100),
        (6000, 7000),
        (7000, 30_000),
        (30_000, 40_000),
        (100, 30_000),
    ] {
        let before = seqs(&t);
        let (r, _) = to_self(&t, &pattern(sent, 6), want);
        match r {
            Err(Error::InvalidUsage(m)) => assert!(
                m.contains(&format!("sent {sent} bytes"))
                    && m.contains(&format!("expected {want}")),
                "{sent} for {want}: {m}"
            ),
            other => panic!("{sent} for {want}: {other:?}"),
        }
        // Every message of the send was consumed.
        let after = seqs(&t);
        assert_eq!(after.0 - before.0, after.1 - before.1, "{sent} for {want}");
        assert!(t.broken.get().is_none());
        roundtrip(&t, want, 7);
    }
}

#[test]
fn tags_and_sequence_numbers_wrap() {
    let bits = seq_bits();
    assert!((13..=28).contains(&bits));
    let top = (1u32 << bits) - 1;
    for class in [CLASS_WHOLE, CLASS_HEADER, CLASS_PIECE] {
        for seq in [0, 1, top, top + 1, u32::MAX] {
            let t = tag(class, seq);
            assert!(t >= 0);
            assert_eq!(untag(t), (class, seq & top));
        }
    }
    // Messages across the wrap of the tag's sequence bits and of the u32 counter.
    let piece = 5000;
    let t = world(piece, LONG);
    let me = t.rank();
    for start in [top - 3, u32::MAX - 3] {
        t.sent.set(me, start);
        t.received.set(me, start);
        for (i, len) in [10, 6000, 12_000, 100, 30_000, 0].into_iter().enumerate() {
            roundtrip(&t, len, i as u8);
        }
        assert_eq!(seqs(&t).0, seqs(&t).1);
        assert!(seqs(&t).0.wrapping_sub(start) > 3, "the wrap was crossed");
    }
}

#[test]
fn timeout_without_sender_leaves_the_communicator_usable() {
    let t = world(8192, SHORT);
    let me = t.rank();
    for len in [100, 10_000, 30_000] {
        let mut buf = vec![0x3Cu8; len];
        let start = Instant::now();
        match t.recv(me, &mut buf) {
            Err(Error::Remote(m)) => assert!(m.contains("waited"), "{len}: {m}"),
            other => panic!("{len}: {other:?}"),
        }
        assert!(start.elapsed() >= SHORT);
        assert!(buf.iter().all(|&b| b == 0x3C), "{len}: buffer written");
        assert!(
            t.broken.get().is_none(),
            "{len}: nothing was left in flight"
        );
        roundtrip(&t, len, 8);
    }
}

#[test]
fn small_step_not_done_at_once_is_driven_to_its_timeout() {
    // A small sendrecv whose receive is not matched in its quick polls (here: it waits
    // for a message number that is never sent) goes on in the driver: it times out,
    // its receive withdrawn, the communicator usable.
    let t = world(8192, SHORT);
    let me = t.rank();
    let (sent, received) = seqs(&t);
    t.received.set(me, received + 1);
    let start = Instant::now();
    let mut got = vec![0x3Cu8; 100];
    match t.sendrecv(me, &pattern(100, 3), me, &mut got) {
        Err(Error::Remote(m)) => assert!(m.contains("waited"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() >= SHORT);
    assert!(got.iter().all(|&b| b == 0x3C), "buffer written");
    assert!(t.broken.get().is_none(), "nothing was left in flight");
    assert_eq!(seqs(&t), (sent + 1, received + 1));
    // The message that was sent is the next one to receive.
    t.received.set(me, received);
    let mut back = vec![0u8; 100];
    t.recv(me, &mut back).expect("the sent message");
    assert_eq!(back, pattern(100, 3));
    roundtrip(&t, 100, 9);
}

/// Wait until a message from `peer` is there to match on `t` (polling MPI).
fn wait_for_message(t: &MpiTransport, peer: usize) {
    let end = Instant::now() + LONG;
    loop {
        let mut flag: c_int = 0;
        let mut st = empty_status();
        // SAFETY: live communicator; out-pointers to locals; a predefined constant.
        let rc = unsafe {
            ffi::MPI_Iprobe(
                peer as c_int,
                ffi::RSMPI_ANY_TAG,
                t.comm.0,
                &mut flag,
                &mut st,
            )
        };
        assert_eq!(rc, ffi::MPI_SUCCESS as c_int);
        if flag != 0 {
            return;
        }
        assert!(Instant::now() < end, "no message from rank {peer}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn timed_out_receive_is_never_written_when_the_message_arrives_later() {
    // Rank 1 posts a send and stalls (calls no MPI) until rank 0's receive, matched but
    // not complete, has timed out and returned; then it lets the send complete while
    // rank 0 keeps MPI progressing. Rank 0's buffer must not change after the return.
    let mut t = world(1 << 20, Duration::from_millis(300));
    let ctl = world(1 << 20, LONG);
    if t.rank() != 0 {
        t.timeout = LONG;
    }
    if t.size() < 2 {
        eprintln!("skipped: needs a second rank (mpirun -np 2, see the module doc)");
        return;
    }
    let len = 512 << 10;
    let flag = |pid: u32| std::env::temp_dir().join(format!("strata-mpi-test-{pid}"));
    match t.rank() {
        0 => {
            ctl.send(1, &std::process::id().to_le_bytes()).unwrap();
            wait_for_message(&t, 1);
            let mut buf = vec![0xA5u8; len];
            match t.recv(1, &mut buf) {
                Err(Error::Remote(m)) => assert!(m.contains("waited"), "{m}"),
                other => panic!("the receive did not time out: {other:?}"),
            }
            assert!(
                t.broken.get().is_some(),
                "the matched receive should have been released to MPI"
            );
            let snapshot = buf.clone();
            std::fs::write(flag(std::process::id()), b"go").unwrap();
            // Rank 1's send completes and it says so; MPI progresses meanwhile.
            let mut done = [0u8; 1];
            ctl.recv(1, &mut done).unwrap();
            ctl.barrier().unwrap();
            let _ = std::fs::remove_file(flag(std::process::id()));
            assert!(
                buf == snapshot,
                "MPI wrote the buffer after the call returned"
            );
            assert!(
                buf.iter().all(|&b| b == 0xA5),
                "MPI wrote the caller's buffer"
            );
        }
        1 => {
            let mut pid = [0u8; 4];
            ctl.recv(0, &mut pid).unwrap();
            let data: &'static [u8] = Box::leak(vec![0x5Cu8; len].into_boxed_slice());
            let mut send = [t.post_send(0, data, None).unwrap()];
            let end = Instant::now() + LONG;
            while !flag(u32::from_le_bytes(pid)).exists() {
                assert!(Instant::now() < end, "rank 0 never timed out");
                std::thread::sleep(Duration::from_millis(5));
            }
            t.drive(&mut send).unwrap();
            ctl.send(0, &[1]).unwrap();
            ctl.barrier().unwrap();
        }
        _ => ctl.barrier().unwrap(),
    }
}
