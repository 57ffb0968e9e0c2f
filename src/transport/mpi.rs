//! `mpi`: ranks are the processes of an MPI job (rsmpi over the system MPI; host memory).
//!
//! - One MPI communicator per transport: the world transport owns a duplicate of
//!   `MPI_COMM_WORLD`, [`Transport::split`](super::Transport::split) makes children with `MPI_Comm_split`, so the
//!   messages of different strata communicators never meet. Every communicator has
//!   `MPI_ERRORS_RETURN`, so MPI failures become [`Error::System`] rather than aborts.
//! - MPI is initialised once per process with `MPI_THREAD_MULTIPLE` (the stream threads
//!   of several communicators call MPI at once) and finalised by [`finalize`]. When the
//!   host program initialised MPI itself, strata uses it (if it is multi-threaded) and
//!   leaves finalisation to the host.
//! - Point-to-point: bytes (`MPI_UINT8_T`), nonblocking requests polled
//!   with `MPI_Test` until done, so no wait outlives [`Transport::timeout`](super::Transport::timeout) without
//!   progress (the deadline restarts whenever a piece completes). `sendrecv` keeps its
//!   send and receive in flight together, so the ring (every rank sending to `next` and
//!   receiving from `prev` at once) cannot deadlock.
//! - Every message between two ranks of a communicator is numbered in order, and its tag
//!   carries that sequence number and its class (small, whole, length header, piece),
//!   so a receive posted for a tag matches exactly the one message it expects.
//! - A small message (up to 4 KiB) has its receive posted before the peer's message comes
//!   (in `sendrecv` before the send), into a reused 4 KiB landing buffer that holds any
//!   small message whole: the length comes from the status, the bytes are copied out.
//!   Were the peer's message of our number longer (another class), it shows up unmatched
//!   (`MPI_Iprobe` while waiting): the receive is withdrawn and that message drained.
//!   A larger receive first matches the incoming message (`MPI_Improbe`) and compares its
//!   length before receiving in place (a truncating receive is not safe: OpenMPI's
//!   single-copy path ignores the receive count). A mismatch is [`Error::InvalidUsage`]
//!   (the message is consumed and dropped), worded as the local transport words it.
//! - Messages longer than the piece limit (1 GiB; the hidden knob
//!   `STRATA_MPI_MAX_MESSAGE` lowers it for tests) travel as an 8-byte length header
//!   followed by pieces; shorter ones as one message. Counts therefore always fit MPI's
//!   `int`.
//! - Waiting polls with `MPI_Test`: spinning briefly (unless the host runs more ranks than
//!   it has cores), then yielding (while a transfer is posted, every 32 polls: MPI's
//!   progress moves its fragments), then, while only waiting for a message to arrive,
//!   sleeping in growing steps.
//! - Native collectives are the ring defaults of [`crate::transport::ring`] over these
//!   calls, so the traffic recorded here (every `send`, world rank to world rank) is the
//!   nominal ring traffic: MPI may route the bytes differently underneath.
//! - A timeout or an abort cancels pending requests (best effort). When a request
//!   cannot be retired within a short grace period (OpenMPI cannot cancel a send, so a
//!   long send nobody receives ends here) it is released to MPI and the communicator is
//!   marked broken: every later call fails, as after ncclCommAbort. MPI may still touch
//!   that transfer's buffer if the peer matches it later, so end the job after such an
//!   error. A timeout while waiting for a message to arrive leaves nothing in flight and
//!   the communicator usable.
//! - Programs call [`finalize`] before exiting (OpenMPI reports a process that exits
//!   without `MPI_Finalize` as an error).

use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::traffic::TrafficMatrix;

#[cfg(feature = "mpi")]
pub use imp::{finalize, peer_failure, MpiTransport};
#[cfg(not(feature = "mpi"))]
pub use stub::{finalize, peer_failure, MpiTransport};

#[cfg(not(feature = "mpi"))]
mod stub {
    use super::*;
    use crate::traffic::Traffic;
    use crate::transport::{Transport, TransportKind};
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    fn not_compiled() -> Error {
        Error::NotCompiled(
            "the mpi transport is not in this build: rebuild with --features mpi".into(),
        )
    }

    /// The MPI transport. This build has no MPI support: constructing it returns
    /// [`Error::NotCompiled`].
    pub struct MpiTransport {
        never: Infallible,
    }

    impl MpiTransport {
        /// Always `Error::NotCompiled` in this build.
        pub fn world(_traffic_topo: Option<Topology>, _timeout: Duration) -> Result<MpiTransport> {
            Err(not_compiled())
        }
        /// Always `Error::NotCompiled` in this build.
        pub fn world_size_hint() -> Result<usize> {
            Err(not_compiled())
        }
        /// Unreachable in this build (no value of the type exists).
        pub fn barrier(&self) -> Result<()> {
            match self.never {}
        }
        /// Unreachable in this build (no value of the type exists).
        pub fn sum_traffic(&self, _m: &TrafficMatrix) -> Result<TrafficMatrix> {
            match self.never {}
        }
    }

    impl Transport for MpiTransport {
        fn kind(&self) -> TransportKind {
            TransportKind::Mpi
        }
        fn barrier(&self) -> Result<()> {
            MpiTransport::barrier(self)
        }
        fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
            MpiTransport::sum_traffic(self, m)
        }
        fn rank(&self) -> usize {
            match self.never {}
        }
        fn size(&self) -> usize {
            match self.never {}
        }
        fn world_rank(&self, _r: usize) -> usize {
            match self.never {}
        }
        fn timeout(&self) -> Duration {
            match self.never {}
        }
        fn split(&self, _color: Option<u32>, _key: i32) -> Result<Option<Arc<dyn Transport>>> {
            match self.never {}
        }
        fn send(&self, _peer: usize, _data: &[u8]) -> Result<()> {
            match self.never {}
        }
        fn recv(&self, _peer: usize, _data: &mut [u8]) -> Result<()> {
            match self.never {}
        }
        fn traffic(&self) -> Option<Arc<Traffic>> {
            match self.never {}
        }
        fn abort(&self) {
            match self.never {}
        }
    }

    /// Nothing to finalise in a build without MPI.
    pub fn finalize() {}

    /// No MPI, no peer failures.
    pub fn peer_failure() -> Option<String> {
        None
    }
}

#[cfg(feature = "mpi")]
mod imp {
    use super::*;
    use crate::traffic::Traffic;
    use crate::transport::{Transport, TransportKind};
    use mpi::environment::{Threading, Universe};
    use mpi::ffi;
    use std::os::raw::{c_int, c_void};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
    use std::time::{Duration, Instant};

    /// Messages up to this many bytes are small: their receive is posted before they
    /// arrive, into a landing buffer of this size that holds any small message whole.
    const SMALL: usize = 4096;
    /// Message classes, the top two bits of the tag: a small message, a larger whole
    /// one, the 8-byte length header of a long message, a piece of a long message.
    const CLASS_SMALL: u32 = 0;
    const CLASS_WHOLE: u32 = 1;
    const CLASS_HEADER: u32 = 2;
    const CLASS_PIECE: u32 = 3;
    /// Default piece limit: 1 GiB (below `i32::MAX`, MPI's count type).
    const DEFAULT_PIECE: usize = 1 << 30;
    /// The tag of `MPI_Comm_create_group` (strata's member-only creations).
    const GROUP_TAG: i32 = 0x5354;
    /// How long a cancelled request may take to retire before it is released to MPI.
    const CANCEL_GRACE: Duration = Duration::from_millis(50);

    /// The universe strata initialised (dropping it finalises MPI).
    static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
    /// Set once strata finalised MPI (it cannot be initialised again).
    static FINALIZED: AtomicBool = AtomicBool::new(false);
    /// The first peer failure this process saw (a transfer or collective that timed out).
    static PEER_FAILURE: Mutex<Option<String>> = Mutex::new(None);

    /// Remember that a collective failed (the first message wins). From then on
    /// [`finalize`] aborts the MPI job instead of waiting in `MPI_Finalize` for the failed
    /// peer.
    fn note_peer_failure(msg: &str) {
        let mut f = PEER_FAILURE.lock().unwrap_or_else(|e| e.into_inner());
        f.get_or_insert_with(|| msg.to_string());
    }

    /// How long [`finalize`] waits after a failure before aborting the job.
    const ABORT_GRACE: Duration = Duration::from_secs(2);

    /// The first failure of a collective on an MPI communicator of this process, if any
    /// ([`Transport::failed`]: a peer that did not answer within the timeout, dead,
    /// stalled or calling another collective; or a communicator aborted mid-collective).
    pub fn peer_failure() -> Option<String> {
        PEER_FAILURE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn universe_lock() -> MutexGuard<'static, Option<Universe>> {
        UNIVERSE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Largest message sent as one MPI message (`STRATA_MPI_MAX_MESSAGE`, read once).
    fn max_piece() -> usize {
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
    fn seq_bits() -> u32 {
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

    fn seq_mask(seq: u32) -> u32 {
        seq & ((1u32 << seq_bits()) - 1)
    }

    /// The tag of message `seq` (to or from one peer) of `class`. A receive posted for
    /// a tag matches only the one message of that sequence number, and every message
    /// from a peer is numbered in order, so no receive can take a later message in
    /// place of a mismatched one.
    fn tag(class: u32, seq: u32) -> c_int {
        ((class << seq_bits()) | seq_mask(seq)) as c_int
    }

    /// (class, sequence number mod 2^bits) of a tag.
    fn untag(t: c_int) -> (u32, u32) {
        let t = t.max(0) as u32;
        (t >> seq_bits(), seq_mask(t))
    }

    fn mpi_error_string(code: c_int) -> String {
        let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
        let mut len: c_int = 0;
        // SAFETY: buf holds MPI_MAX_ERROR_STRING bytes as MPI_Error_string requires.
        let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
        if rc != ffi::MPI_SUCCESS as c_int {
            return format!("MPI error {code}");
        }
        buf.truncate(len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
        format!(
            "{} (MPI error {code})",
            String::from_utf8_lossy(&buf).trim_end()
        )
    }

    /// The one place a raw MPI return code becomes a `Result`.
    fn check(rc: c_int, what: &str) -> Result<()> {
        if rc == ffi::MPI_SUCCESS as c_int {
            Ok(())
        } else {
            Err(Error::System(format!(
                "{what} failed: {}",
                mpi_error_string(rc)
            )))
        }
    }

    fn byte_type() -> ffi::MPI_Datatype {
        // SAFETY: reading an MPI predefined handle exported by mpi-sys.
        unsafe { ffi::RSMPI_UINT8_T }
    }

    fn request_null() -> ffi::MPI_Request {
        // SAFETY: reading an MPI predefined handle exported by mpi-sys.
        unsafe { ffi::RSMPI_REQUEST_NULL }
    }

    fn empty_status() -> ffi::MPI_Status {
        // SAFETY: MPI_Status is plain C data; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }

    fn is_finalized() -> bool {
        FINALIZED.load(Ordering::SeqCst) || mpi::environment::is_finalized()
    }

    /// Initialise MPI (MPI_THREAD_MULTIPLE) unless this process already did; returns the
    /// MPI world size.
    /// `MPI_Init` waits for every process of the job: a peer frozen or dead before it
    /// joins would hold this process there forever. Past the timeout (`STRATA_TIMEOUT`)
    /// the watchdog reports it and aborts the process (not `exit`: MPI is mid-call), so
    /// mpirun ends the job. Dropping the sender (init returned) stops the watchdog.
    fn init_watchdog() -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let timeout = crate::config::env()
            .map(|e| e.timeout)
            .unwrap_or(crate::config::DEFAULT_TIMEOUT);
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                eprintln!(
                    "strata: MPI_Init did not complete within {timeout:?}: a peer process is dead or \
                     stalled before joining the job; aborting this process"
                );
                std::process::abort();
            }
        });
        tx
    }

    fn ensure_init() -> Result<usize> {
        let mut u = universe_lock();
        if FINALIZED.load(Ordering::SeqCst) {
            return Err(Error::InvalidUsage(
                "MPI was finalized by strata::transport::mpi::finalize and cannot be initialised again".into(),
            ));
        }
        if u.is_none() {
            let watchdog = init_watchdog();
            let init = mpi::environment::initialize_with_threading(Threading::Multiple);
            drop(watchdog);
            match init {
                Some((universe, provided)) => {
                    // Keep it even when unusable: finalize() must still finalise MPI.
                    *u = Some(universe);
                    if provided < Threading::Multiple {
                        return Err(Error::System(format!(
                            "the MPI library provides only {provided:?} threading; the mpi transport needs MPI_THREAD_MULTIPLE \
                             (rebuild or configure MPI with thread support)"
                        )));
                    }
                }
                None => {
                    // Initialised by the host program (or finalised by it).
                    if mpi::environment::is_finalized() {
                        return Err(Error::InvalidUsage(
                            "MPI was already finalized by the host program".into(),
                        ));
                    }
                    let mut provided: c_int = 0;
                    // SAFETY: MPI is initialised; out-pointer to a local.
                    check(
                        unsafe { ffi::MPI_Query_thread(&mut provided) },
                        "MPI_Query_thread",
                    )?;
                    // SAFETY: reading an MPI predefined constant.
                    if provided < unsafe { ffi::RSMPI_THREAD_MULTIPLE } {
                        return Err(Error::System(
                            "the host program initialised MPI without MPI_THREAD_MULTIPLE; the mpi transport needs it \
                             (call MPI_Init_thread with MPI_THREAD_MULTIPLE)"
                                .into(),
                        ));
                    }
                }
            }
        }
        drop(u);
        let mut n: c_int = 0;
        // SAFETY: MPI is initialised; out-pointer to a local.
        check(
            unsafe { ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut n) },
            "MPI_Comm_size(MPI_COMM_WORLD)",
        )?;
        Ok(n as usize)
    }

    /// Finalise MPI when strata initialised it: call once at the end of the program, after
    /// every communicator's work is done (OpenMPI reports an error for a process that
    /// exits without finalising). Idempotent; does nothing when MPI was never initialised
    /// or was initialised by the host program (which then finalises it). Transports that
    /// outlive this call must not be used again; dropping them is harmless.
    ///
    /// After a peer failure ([`peer_failure`]) this does not return: `MPI_Finalize`
    /// would wait for the failed peer forever, so strata aborts the whole MPI job
    /// (`MPI_Abort(MPI_COMM_WORLD, 1)`, what NCCL users and PyTorch's watchdog expect)
    /// after printing the failure on stderr and a grace of 2 s (so the other live ranks,
    /// among them the ones that waited on the failed peer itself, report what they saw).
    /// mpirun then kills every rank, stalled ones included, and exits non-zero. This
    /// holds whoever initialised MPI.
    pub fn finalize() {
        if let Some(why) = peer_failure() {
            if mpi::environment::is_initialized() && !is_finalized() {
                // The ranks that waited on the failed peer itself time out about now too:
                // give them a moment to report it before the job is killed.
                std::thread::sleep(ABORT_GRACE);
                eprintln!(
                    "strata: a peer failed ({why}); aborting the MPI job instead of finalizing \
                     (MPI_Finalize would wait for the failed peer)"
                );
                // SAFETY: MPI is initialised and not finalised; MPI_Abort does not return.
                unsafe {
                    ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
                }
                std::process::exit(1);
            }
        }
        let mut u = universe_lock();
        if let Some(universe) = u.take() {
            FINALIZED.store(true, Ordering::SeqCst);
            drop(universe); // MPI_Finalize
        }
    }

    /// An owned MPI communicator handle, freed on drop while MPI is still alive.
    struct RawComm(ffi::MPI_Comm);

    // SAFETY: MPI runs with MPI_THREAD_MULTIPLE, so a communicator handle may be used from
    // any thread; strata serialises the calls of one transport itself.
    unsafe impl Send for RawComm {}
    unsafe impl Sync for RawComm {}

    impl Drop for RawComm {
        fn drop(&mut self) {
            if !is_finalized() {
                // SAFETY: we own this handle (a dup or split result) and free it once.
                unsafe {
                    ffi::MPI_Comm_free(&mut self.0);
                }
            }
        }
    }

    impl RawComm {
        /// Take ownership of a new communicator and make its errors return codes.
        fn adopt(raw: ffi::MPI_Comm) -> Result<RawComm> {
            let c = RawComm(raw);
            // SAFETY: live communicator; predefined error handler.
            check(
                unsafe { ffi::MPI_Comm_set_errhandler(c.0, ffi::RSMPI_ERRORS_RETURN) },
                "MPI_Comm_set_errhandler",
            )?;
            Ok(c)
        }

        fn rank_size(&self) -> Result<(usize, usize)> {
            let (mut r, mut n): (c_int, c_int) = (0, 0);
            // SAFETY: live communicator; out-pointers to locals.
            check(
                unsafe { ffi::MPI_Comm_rank(self.0, &mut r) },
                "MPI_Comm_rank",
            )?;
            check(
                unsafe { ffi::MPI_Comm_size(self.0, &mut n) },
                "MPI_Comm_size",
            )?;
            Ok((r as usize, n as usize))
        }
    }

    /// One outstanding MPI request (`MPI_REQUEST_NULL` once complete).
    struct Req(ffi::MPI_Request);

    impl Req {
        fn is_null(&self) -> bool {
            self.0 .0 == request_null().0
        }

        /// `MPI_Test`: Ok(true) once complete (the handle becomes null).
        fn test(&mut self, what: &str) -> Result<bool> {
            if self.is_null() {
                return Ok(true);
            }
            let mut flag: c_int = 0;
            let mut st = empty_status();
            // SAFETY: live request handle; out-pointers to locals.
            let rc = unsafe { ffi::MPI_Test(&mut self.0, &mut flag, &mut st) };
            if rc != ffi::MPI_SUCCESS as c_int {
                // A failed request is complete (MPI frees it); make sure we do not test it again.
                self.0 = request_null();
                return check(rc, what).map(|_| true);
            }
            Ok(flag != 0)
        }

        /// `MPI_Test` of a receive: the bytes received once complete.
        fn test_count(&mut self, what: &str) -> Result<Option<usize>> {
            if self.is_null() {
                return Err(Error::Internal(format!("{what}: tested a retired receive")));
            }
            let mut flag: c_int = 0;
            let mut st = empty_status();
            // SAFETY: live request handle; out-pointers to locals.
            let rc = unsafe { ffi::MPI_Test(&mut self.0, &mut flag, &mut st) };
            if rc != ffi::MPI_SUCCESS as c_int {
                self.0 = request_null();
                return check(rc, what).map(|_| None);
            }
            if flag == 0 {
                return Ok(None);
            }
            let mut count: c_int = 0;
            // SAFETY: status filled by MPI_Test for a completed receive.
            check(
                unsafe { ffi::MPI_Get_count(&st, byte_type(), &mut count) },
                "MPI_Get_count",
            )?;
            Ok(Some(count.max(0) as usize))
        }
    }

    /// Best-effort retire of `reqs`: MPI_Cancel each, then test them for one short grace
    /// period. Returns false when some were still active and had to be released to MPI
    /// (their buffers may still be touched by MPI later: the caller must not free them).
    fn retire<'a>(reqs: impl IntoIterator<Item = &'a mut Req>) -> bool {
        let mut live: Vec<&mut Req> = reqs.into_iter().filter(|r| !r.is_null()).collect();
        for r in live.iter_mut() {
            // SAFETY: live request handle.
            unsafe {
                ffi::MPI_Cancel(&mut r.0);
            }
        }
        let end = Instant::now() + CANCEL_GRACE;
        loop {
            // A failed test completes (and frees) the request too.
            live.retain_mut(|r| !r.test("MPI_Test (cancel)").unwrap_or(true));
            if live.is_empty() {
                return true;
            }
            if Instant::now() >= end {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        for r in live {
            // SAFETY: live request handle; MPI completes and frees it in the background.
            unsafe {
                ffi::MPI_Request_free(&mut r.0);
            }
            r.0 = request_null();
        }
        false
    }

    /// What one poll of an operation achieved.
    #[derive(PartialEq, Eq)]
    enum Poll {
        Done,
        Progress,
        Idle,
    }

    /// The sequence numbers of one direction of every peer pair (sends to, or receives
    /// from, each member). The calls of a transport are serialised (`busy`), so relaxed
    /// counters suffice.
    struct Seqs(Vec<AtomicU32>);

    impl Seqs {
        fn new(n: usize) -> Seqs {
            Seqs((0..n).map(|_| AtomicU32::new(0)).collect())
        }
        fn get(&self, peer: usize) -> u32 {
            self.0[peer].load(Ordering::Relaxed)
        }
        fn set(&self, peer: usize, v: u32) {
            self.0[peer].store(v, Ordering::Relaxed);
        }
    }

    /// Sends `data` to `peer` as one message, or as header + pieces; every message takes
    /// the next sequence number to that peer.
    struct SendOp {
        peer: usize,
        /// The first message's request (the only one unless header + pieces).
        first: Req,
        /// The requests of the pieces after the header.
        more: Vec<Req>,
        /// Messages posted.
        posted: usize,
        /// Sequence number after the last message.
        next_seq: u32,
        /// Length header of a long message (boxed: MPI reads it until the request completes).
        header: Option<Box<[u8; 8]>>,
    }

    impl SendOp {
        fn post(comm: &RawComm, peer: usize, data: &[u8], seq: u32) -> Result<SendOp> {
            let piece = max_piece();
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

        fn reqs_mut(&mut self) -> impl Iterator<Item = &mut Req> {
            std::iter::once(&mut self.first).chain(self.more.iter_mut())
        }

        fn poll(&mut self) -> Result<Poll> {
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

        fn cancel(&mut self) -> bool {
            let clean = retire(self.reqs_mut());
            if !clean {
                // MPI may still read it: never free it.
                std::mem::forget(self.header.take());
            }
            clean
        }
    }

    enum Stage {
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
    struct RecvOp {
        peer: usize,
        me: usize,
        buf: *mut u8,
        len: usize,
        stage: Stage,
        /// Sequence number of the next message to match from the peer.
        seq: u32,
        /// Next piece to receive (long messages); `None` before the first match.
        next_piece: Option<usize>,
        /// Length header of a long message (allocated when one is matched).
        header: Option<Box<[u8; 8]>>,
        /// Bytes the peer sent, when they differ from `len`.
        mismatch: Option<usize>,
        /// Messages still to drain after a mismatch.
        drain_left: usize,
        /// Where a small message lands, or a mismatched message is drained to.
        scratch: Vec<u8>,
        /// Idle polls of a posted small receive (the sender's message is looked for
        /// among the unmatched ones every few).
        idle: u32,
    }

    fn pieces(len: usize) -> usize {
        len.div_ceil(max_piece()).max(1)
    }

    impl RecvOp {
        /// Start receiving `buf.len()` bytes from `peer`, whose next message has sequence
        /// number `seq`; small ones get their receive posted at once. `landing` is a
        /// buffer of at least [`SMALL`] bytes to reuse (or empty).
        fn new(
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
        fn take_landing(&mut self) -> Option<Vec<u8>> {
            match self.stage {
                Stage::Done | Stage::Probe if self.scratch.len() >= SMALL => {
                    Some(std::mem::take(&mut self.scratch))
                }
                _ => None,
            }
        }

        fn mismatch_error(&self, sent: usize) -> Error {
            Error::InvalidUsage(format!(
                "rank {} sent {sent} bytes where rank {} expected {}: counts or dtypes differ across ranks",
                self.peer, self.me, self.len
            ))
        }

        /// Receive a matched message into `ptr..ptr+count`.
        fn imrecv(msg: &mut ffi::MPI_Message, ptr: *mut u8, count: usize) -> Result<Req> {
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
        fn start_drain(
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
        fn foreign_head(&self, comm: &RawComm) -> Result<bool> {
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

        fn poll(&mut self, comm: &RawComm) -> Result<Poll> {
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
                                let out =
                                    unsafe { std::slice::from_raw_parts_mut(self.buf, self.len) };
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
                                    return self.start_drain(
                                        &mut msg,
                                        count,
                                        pieces(self.len) - i - 1,
                                    );
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

        fn cancel(&mut self) -> bool {
            let retired = match &mut self.stage {
                Stage::Posted(r) | Stage::Header(r) | Stage::Data(r) | Stage::Drain(r) => {
                    retire([r])
                }
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

    /// One operation in flight.
    enum Op {
        Send(SendOp),
        Recv(RecvOp),
    }

    impl Op {
        fn peer(&self) -> usize {
            match self {
                Op::Send(s) => s.peer,
                Op::Recv(r) => r.peer,
            }
        }

        /// True while a request of this op is posted (not merely waiting to match).
        fn transferring(&self) -> bool {
            match self {
                Op::Send(s) => !s.first.is_null() || s.more.iter().any(|r| !r.is_null()),
                Op::Recv(r) => !matches!(r.stage, Stage::Probe | Stage::Posted(_) | Stage::Done),
            }
        }

        /// Best-effort retire; false when a request had to be abandoned to MPI.
        fn cancel(&mut self) -> bool {
            match self {
                Op::Send(s) => s.cancel(),
                Op::Recv(r) => r.cancel(),
            }
        }
    }

    /// Landing buffers of small receives, reused; held by the call lock.
    type Landings = Vec<Vec<u8>>;

    /// A rank of an MPI communicator.
    pub struct MpiTransport {
        comm: RawComm,
        rank: usize,
        /// World rank of each member.
        members: Vec<usize>,
        timeout: Duration,
        traffic: Arc<Traffic>,
        aborted: AtomicBool,
        /// Why the communicator cannot be used any more (a request had to be abandoned).
        broken: std::sync::OnceLock<String>,
        /// Serialises the calls on this communicator; holds the landing buffers.
        busy: Mutex<Landings>,
        /// Sequence numbers of the messages sent to / received from each member.
        sent: Seqs,
        received: Seqs,
    }

    impl MpiTransport {
        /// Initialise MPI once per process (`MPI_THREAD_MULTIPLE`; an error when the
        /// library cannot provide it) and return this process's rank of the world
        /// communicator (a duplicate of `MPI_COMM_WORLD`). Collective over the world.
        ///
        /// `traffic_topo` is the layout applied over world ranks to classify traffic
        /// (default: one flat node); its world size must equal the MPI world size, else
        /// [`Error::InvalidUsage`]. `timeout` bounds every wait for a peer, this call's
        /// rendezvous included.
        pub fn world(traffic_topo: Option<Topology>, timeout: Duration) -> Result<MpiTransport> {
            let n = ensure_init()?;
            let topo = traffic_topo.unwrap_or_else(|| Topology::flat(n));
            if topo.world_size() != n {
                return Err(Error::InvalidUsage(format!(
                    "the traffic topology has {} ranks but the MPI world has {n} processes",
                    topo.world_size()
                )));
            }
            // SAFETY: reading an MPI predefined handle.
            let world = unsafe { ffi::RSMPI_COMM_WORLD };
            let mut me: c_int = 0;
            // SAFETY: MPI is initialised; out-pointer to a local.
            check(
                unsafe { ffi::MPI_Comm_rank(world, &mut me) },
                "MPI_Comm_rank(MPI_COMM_WORLD)",
            )?;
            // Everyone must arrive before the blocking MPI_Comm_dup: a bounded rendezvous.
            let mut r = request_null();
            // SAFETY: world communicator; out-pointer to a local.
            check(unsafe { ffi::MPI_Ibarrier(world, &mut r) }, "MPI_Ibarrier")?;
            let mut req = Req(r);
            wait_collective(&mut req, timeout, None, || {
                format!(
                    "rank {me} waited {timeout:?} for the other ranks of the MPI world to create the mpi transport: \
                     a process dead, stalled or not calling it"
                )
            })?;
            // SAFETY: reading an MPI predefined handle.
            let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
            // SAFETY: world communicator; every rank passed the barrier above.
            check(
                unsafe { ffi::MPI_Comm_dup(world, &mut raw) },
                "MPI_Comm_dup(MPI_COMM_WORLD)",
            )?;
            let comm = RawComm::adopt(raw)?;
            let (rank, size) = comm.rank_size()?;
            Ok(MpiTransport::over(
                comm,
                rank,
                (0..size).collect(),
                timeout,
                Arc::new(Traffic::new(topo)),
            ))
        }

        /// A transport over `comm`, this process being `rank` of it, whose ranks are the
        /// world ranks `members`.
        fn over(
            comm: RawComm,
            rank: usize,
            members: Vec<usize>,
            timeout: Duration,
            traffic: Arc<Traffic>,
        ) -> MpiTransport {
            let size = members.len();
            MpiTransport {
                comm,
                rank,
                members,
                timeout,
                traffic,
                aborted: AtomicBool::new(false),
                broken: std::sync::OnceLock::new(),
                busy: Mutex::new(Vec::new()),
                sent: Seqs::new(size),
                received: Seqs::new(size),
            }
        }

        /// Initialise MPI if needed and return the MPI world size (to build a default
        /// topology before [`MpiTransport::world`]).
        pub fn world_size_hint() -> Result<usize> {
            ensure_init()
        }

        /// A barrier over this communicator, bounded by the timeout: a ring all-gather of
        /// empty messages over this transport's own point-to-point calls (no rank can
        /// finish it before every rank entered), so a rank that never comes is named in
        /// the timeout message of the rank after it, which `MPI_Ibarrier` could not say.
        pub fn barrier(&self) -> Result<()> {
            crate::transport::ring::all_gather(self, &mut [], 0)
        }

        /// Element-wise sum of every member process's `m` (each MPI process only knows
        /// the traffic its own rank sent: the rows of its world rank), bounded by the
        /// timeout. Collective over this communicator; records no traffic.
        pub fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
            let _g = self.enter()?;
            let count = c_int::try_from(m.bytes.len()).map_err(|_| {
                Error::InvalidArgument(format!(
                    "traffic matrix of {} entries is too large",
                    m.bytes.len()
                ))
            })?;
            let send: Box<[u64]> = m.bytes.clone().into_boxed_slice();
            let mut recv: Box<[u64]> = vec![0u64; m.bytes.len()].into_boxed_slice();
            let mut r = request_null();
            // SAFETY: both boxes hold `count` u64 and outlive the request (leaked below if
            // it cannot complete); live communicator.
            check(
                unsafe {
                    ffi::MPI_Iallreduce(
                        send.as_ptr() as *const c_void,
                        recv.as_mut_ptr() as *mut c_void,
                        count,
                        ffi::RSMPI_UINT64_T,
                        ffi::RSMPI_SUM,
                        self.comm.0,
                        &mut r,
                    )
                },
                "MPI_Iallreduce",
            )?;
            let mut req = Req(r);
            let res = wait_collective(&mut req, self.timeout, Some(&self.aborted), || {
                format!(
                    "rank {} waited {:?} for the other ranks to sum traffic",
                    self.rank, self.timeout
                )
            });
            if res.is_err() {
                // The collective may still write into the buffers: never free them.
                std::mem::forget(send);
                std::mem::forget(recv);
                return self.after_collective(res.map(|_| TrafficMatrix::zero(0)));
            }
            Ok(TrafficMatrix {
                n: m.n,
                bytes: recv.into_vec(),
            })
        }

        /// Refuse work on an aborted or broken communicator; hold the call lock.
        fn enter(&self) -> Result<MutexGuard<'_, Landings>> {
            self.check_alive()?;
            let g = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            self.check_alive()?;
            Ok(g)
        }

        fn check_alive(&self) -> Result<()> {
            if self.aborted.load(Ordering::SeqCst) {
                return Err(Error::Remote("communicator was aborted".into()));
            }
            if let Some(why) = self.broken.get() {
                return Err(Error::Remote(format!("communicator is unusable: {why}")));
            }
            Ok(())
        }

        /// A failed nonblocking collective leaves the communicator's collective sequence
        /// out of step: mark it broken.
        fn after_collective<T>(&self, res: Result<T>) -> Result<T> {
            if let Err(e) = &res {
                self.broken
                    .get_or_init(|| format!("a collective did not complete ({e})"));
                // An MPI collective left pending: MPI_Finalize would wait for it.
                note_peer_failure(&e.to_string());
            }
            res
        }

        /// A transfer could not be retired after `e`: refuse every later call.
        fn mark_broken(&self, e: &Error) {
            let why = match e {
                Error::Remote(m) => m.clone(),
                e => e.to_string(),
            };
            self.broken.get_or_init(|| {
                format!("a transfer could not be cancelled after this error: {why}")
            });
        }

        fn check_peer(&self, peer: usize) -> Result<()> {
            if peer >= self.members.len() {
                return Err(Error::InvalidArgument(format!(
                    "peer {peer} out of range for {} ranks",
                    self.members.len()
                )));
            }
            Ok(())
        }

        fn record(&self, peer: usize, bytes: usize) {
            self.traffic
                .record(self.members[self.rank], self.members[peer], bytes);
        }

        /// Post a send to `peer` (the next sequence numbers to it) and record its traffic.
        fn post_send(&self, peer: usize, data: &[u8]) -> Result<Op> {
            let op = SendOp::post(&self.comm, peer, data, self.sent.get(peer))?;
            self.sent.set(peer, op.next_seq);
            self.record(peer, data.len());
            Ok(Op::Send(op))
        }

        /// Start a receive from `peer` (a small one is posted at once, into a reused
        /// landing buffer). Call [`Self::settle`] once it is driven.
        fn post_recv(&self, landings: &mut Landings, peer: usize, buf: &mut [u8]) -> Result<Op> {
            let landing = if buf.len() <= SMALL {
                landings.pop().unwrap_or_default()
            } else {
                Vec::new()
            };
            let seq = self.received.get(peer);
            RecvOp::new(&self.comm, peer, self.rank, buf, seq, landing).map(Op::Recv)
        }

        /// After driving `ops`: the receives' sequence numbers (every message they
        /// matched, a drained one too) and their landing buffers back.
        fn settle(&self, landings: &mut Landings, ops: &mut [Op]) {
            for op in ops {
                if let Op::Recv(r) = op {
                    self.received.set(r.peer, r.seq);
                    if let Some(l) = r.take_landing() {
                        landings.push(l);
                    }
                }
            }
        }

        /// Retire `ops` after `e` stopped them before they were driven.
        fn withdraw(&self, landings: &mut Landings, ops: &mut [Op], e: &Error) {
            for op in ops.iter_mut() {
                if !op.cancel() {
                    self.mark_broken(e);
                }
            }
            self.settle(landings, ops);
        }

        /// Poll `ops` until all complete. The deadline restarts on progress. On timeout or
        /// abort the pending ones are cancelled; an error of one op lets the others finish.
        fn drive(&self, ops: &mut [Op]) -> Result<()> {
            // Flags of the ops finished (no allocation for the usual one or two).
            let mut few = [false; 4];
            let mut many = Vec::new();
            let done: &mut [bool] = if ops.len() <= few.len() {
                &mut few[..ops.len()]
            } else {
                many.resize(ops.len(), false);
                &mut many
            };
            let mut first_err: Option<Error> = None;
            // Armed at the first idle round (no clock read while everything progresses).
            let mut deadline: Option<Instant> = None;
            let mut idle_rounds: u32 = 0;
            loop {
                let mut progressed = false;
                for (i, op) in ops.iter_mut().enumerate() {
                    if done[i] {
                        continue;
                    }
                    let p = match op {
                        Op::Send(s) => s.poll(),
                        Op::Recv(r) => r.poll(&self.comm),
                    };
                    match p {
                        Ok(Poll::Done) => {
                            done[i] = true;
                            progressed = true;
                        }
                        Ok(Poll::Progress) => progressed = true,
                        Ok(Poll::Idle) => {}
                        Err(e) => {
                            // A mismatch has drained its message; after an MPI error, retire
                            // whatever the op still has in flight.
                            done[i] = true;
                            progressed = true;
                            if !op.cancel() {
                                self.mark_broken(&e);
                            }
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if done.iter().all(|d| *d) {
                    return first_err.map_or(Ok(()), Err);
                }
                let stop = if self.aborted.load(Ordering::SeqCst) {
                    Some(Error::Remote("communicator was aborted".into()))
                } else if !progressed
                    && *deadline.get_or_insert_with(|| Instant::now() + self.timeout)
                        <= Instant::now()
                {
                    let peer = ops
                        .iter()
                        .zip(done.iter())
                        .find(|(_, d)| !**d)
                        .map(|(o, _)| o.peer())
                        .unwrap_or(0);
                    Some(Error::Remote(format!(
                        "rank {} (world rank {}) waited {:?} for rank {peer} (world rank {}): peer dead, stalled or not calling the same collective",
                        self.rank, self.members[self.rank], self.timeout, self.members[peer]
                    )))
                } else {
                    None
                };
                if let Some(e) = stop {
                    let mut clean = true;
                    for (op, d) in ops.iter_mut().zip(done.iter()) {
                        if !*d {
                            clean &= op.cancel();
                        }
                    }
                    if !clean {
                        self.mark_broken(&e);
                    }
                    return Err(first_err.unwrap_or(e));
                }
                if progressed {
                    deadline = None;
                    idle_rounds = 0;
                } else {
                    idle_rounds = idle_rounds.saturating_add(1);
                    let transferring = ops
                        .iter()
                        .zip(done.iter())
                        .any(|(o, d)| !*d && o.transferring());
                    backoff(idle_rounds, transferring);
                }
            }
        }
    }

    /// Polls spun before the first yield: a peer on another core answers within a few
    /// microseconds, and a yield (a system call) costs as much again. None when this
    /// host runs more ranks of the job than it has cores
    /// ([`crate::memory::loan::may_spin`]: the launcher's local size): a spinning rank
    /// would then hold the core its peer needs.
    fn spin_polls() -> u32 {
        if crate::memory::loan::may_spin() {
            64
        } else {
            0
        }
    }

    /// Idle polls of a posted transfer between two yields.
    const TRANSFER_YIELD_EVERY: u32 = 32;

    /// Wait between polls: spin briefly ([`spin_polls`]), then yield (ranks may share
    /// cores). While a transfer is posted, MPI needs frequent progress calls (pipelined
    /// protocols move a fragment per call, and a rendezvous waits for the peer's next
    /// call), so it keeps polling, yielding every [`TRANSFER_YIELD_EVERY`] polls; while only waiting
    /// for a message to arrive, it sleeps after 1024 yields, in steps growing to 1 ms.
    fn backoff(idle_rounds: u32, transferring: bool) {
        let spin = spin_polls();
        if idle_rounds < spin {
            std::hint::spin_loop();
        } else if transferring {
            // A poll that moved fragments of a long message counts as idle here (only
            // completions count), and MPI's progress already yields when nothing moved
            // on an oversubscribed host: yielding on every poll would give the core away
            // in the middle of a transfer.
            if idle_rounds % TRANSFER_YIELD_EVERY == 0 {
                std::thread::yield_now();
            }
        } else if idle_rounds < spin + 1024 {
            std::thread::yield_now();
        } else {
            let us = 1u64 << ((idle_rounds - spin - 1024) / 16).min(10);
            std::thread::sleep(Duration::from_micros(us));
        }
    }

    /// Poll a nonblocking collective's request until done, `timeout` or abort. A request
    /// that cannot complete is leaked (collective requests cannot be cancelled or freed).
    fn wait_collective(
        req: &mut Req,
        timeout: Duration,
        aborted: Option<&AtomicBool>,
        msg: impl Fn() -> String,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut idle: u32 = 0;
        loop {
            if req.test("MPI_Test (collective)")? {
                return Ok(());
            }
            if aborted.is_some_and(|a| a.load(Ordering::SeqCst)) {
                req.0 = request_null();
                return Err(Error::Remote("communicator was aborted".into()));
            }
            if Instant::now() >= deadline {
                req.0 = request_null();
                return Err(Error::Remote(msg()));
            }
            idle = idle.saturating_add(1);
            backoff(idle, true);
        }
    }

    impl Transport for MpiTransport {
        fn kind(&self) -> TransportKind {
            TransportKind::Mpi
        }
        fn barrier(&self) -> Result<()> {
            MpiTransport::barrier(self)
        }
        fn sum_traffic(&self, m: &TrafficMatrix) -> Result<TrafficMatrix> {
            MpiTransport::sum_traffic(self, m)
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.members.len()
        }
        fn world_rank(&self, r: usize) -> usize {
            self.members[r]
        }
        fn timeout(&self) -> Duration {
            self.timeout
        }

        fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>> {
            let _g = self.enter()?;
            let c = match color {
                Some(c) => i32::try_from(c).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "split color {c} exceeds MPI's limit {}",
                        i32::MAX
                    ))
                })?,
                None => -1,
            };
            // Exchange (color, key) with a bounded nonblocking all-gather: once it completes
            // everyone is at this split, so the blocking MPI_Comm_split below cannot hang;
            // and the members' world ranks follow without another exchange.
            let n = self.size();
            let mine: Box<[i32; 2]> = Box::new([c, key]);
            let mut all: Box<[i32]> = vec![0i32; 2 * n].into_boxed_slice();
            let mut r = request_null();
            // SAFETY: `mine` holds 2 ints, `all` 2n; both outlive the request (leaked on
            // failure below); live communicator.
            check(
                unsafe {
                    ffi::MPI_Iallgather(
                        mine.as_ptr() as *const c_void,
                        2,
                        ffi::RSMPI_INT32_T,
                        all.as_mut_ptr() as *mut c_void,
                        2,
                        ffi::RSMPI_INT32_T,
                        self.comm.0,
                        &mut r,
                    )
                },
                "MPI_Iallgather (split)",
            )?;
            let mut req = Req(r);
            let res = wait_collective(&mut req, self.timeout, Some(&self.aborted), || {
                format!(
                    "split timed out after {:?}: not every rank called split",
                    self.timeout
                )
            });
            if res.is_err() {
                std::mem::forget(mine);
                std::mem::forget(all);
                return self.after_collective(res.map(|_| None));
            }
            let mut group: Vec<(i32, usize)> = (0..n)
                .filter(|&r| c >= 0 && all[2 * r] == c)
                .map(|r| (all[2 * r + 1], r))
                .collect();
            group.sort();
            // SAFETY: reading MPI predefined constants / handles.
            let (undefined, mut raw) = unsafe { (ffi::RSMPI_UNDEFINED, ffi::RSMPI_COMM_NULL) };
            let mpi_color = if c >= 0 { c } else { undefined };
            // SAFETY: live communicator; every member reached this call (see above).
            check(
                unsafe { ffi::MPI_Comm_split(self.comm.0, mpi_color, key, &mut raw) },
                "MPI_Comm_split",
            )?;
            if c < 0 {
                return Ok(None);
            }
            let comm = RawComm::adopt(raw)?;
            let (rank, size) = comm.rank_size()?;
            let members: Vec<usize> = group.iter().map(|(_, r)| self.members[*r]).collect();
            if size != members.len() || members.get(rank) != Some(&self.members[self.rank]) {
                return Err(Error::Internal(format!(
                    "MPI_Comm_split gave rank {rank} of {size}, strata expected rank {:?} of {}",
                    members.iter().position(|m| *m == self.members[self.rank]),
                    members.len()
                )));
            }
            Ok(Some(Arc::new(MpiTransport::over(
                comm,
                rank,
                members,
                self.timeout,
                self.traffic.clone(),
            ))))
        }

        fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
            let mut g = self.enter()?;
            // A barrier of the members alone, bounded by the timeout (an empty message
            // between every pair, so no bytes are counted): once it completes every
            // member is at this call, so the blocking MPI_Comm_create_group below cannot
            // hang on a member that never came.
            let peers: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&m| m != self.rank)
                .collect();
            let token = [0u8; 0];
            let mut got = vec![[0u8; 0]; peers.len()];
            let mut ops = Vec::with_capacity(2 * peers.len());
            let mut posted = Ok(());
            for (p, b) in peers.iter().zip(got.iter_mut()) {
                match self.post_recv(&mut g, *p, b) {
                    Ok(op) => ops.push(op),
                    Err(e) => {
                        posted = Err(e);
                        break;
                    }
                }
            }
            if posted.is_ok() {
                for p in &peers {
                    match self.post_send(*p, &token) {
                        Ok(op) => ops.push(op),
                        Err(e) => {
                            posted = Err(e);
                            break;
                        }
                    }
                }
            }
            if let Err(e) = posted {
                self.withdraw(&mut g, &mut ops, &e);
                return Err(e);
            }
            let res = self.drive(&mut ops);
            self.settle(&mut g, &mut ops);
            res.map_err(|e| {
                Error::Remote(format!(
                    "creating a communicator of ranks {members:?}: not every member came ({e})"
                ))
            })?;
            let ranks: Vec<i32> = members
                .iter()
                .map(|&m| i32::try_from(m).map_err(|_| Error::InvalidArgument(format!("rank {m}"))))
                .collect::<Result<_>>()?;
            let n = i32::try_from(ranks.len())
                .map_err(|_| Error::InvalidArgument("too many members".into()))?;
            // SAFETY: reading MPI predefined handles.
            let (mut world_group, mut sub_group, mut raw) = unsafe {
                (
                    ffi::RSMPI_GROUP_NULL,
                    ffi::RSMPI_GROUP_NULL,
                    ffi::RSMPI_COMM_NULL,
                )
            };
            // SAFETY: live communicator; writes one group handle.
            check(
                unsafe { ffi::MPI_Comm_group(self.comm.0, &mut world_group) },
                "MPI_Comm_group",
            )?;
            // SAFETY: a live group and `n` valid ranks of it; writes one group handle.
            let incl = check(
                unsafe { ffi::MPI_Group_incl(world_group, n, ranks.as_ptr(), &mut sub_group) },
                "MPI_Group_incl",
            );
            // SAFETY: every member passed the barrier above and calls this with the same
            // group; the tag keeps it apart from other creations.
            let made = incl.and_then(|_| {
                check(
                    unsafe {
                        ffi::MPI_Comm_create_group(self.comm.0, sub_group, GROUP_TAG, &mut raw)
                    },
                    "MPI_Comm_create_group",
                )
            });
            // SAFETY: freeing the group handles made above (the null handle is skipped).
            unsafe {
                if sub_group != ffi::RSMPI_GROUP_NULL {
                    ffi::MPI_Group_free(&mut sub_group);
                }
                ffi::MPI_Group_free(&mut world_group);
            }
            made?;
            let comm = RawComm::adopt(raw)?;
            let (rank, size) = comm.rank_size()?;
            let world: Vec<usize> = members.iter().map(|&m| self.members[m]).collect();
            if size != world.len() || world.get(rank) != Some(&self.members[self.rank]) {
                return Err(Error::Internal(format!(
                    "MPI_Comm_create_group gave rank {rank} of {size} for members {members:?}"
                )));
            }
            Ok(Arc::new(MpiTransport::over(
                comm,
                rank,
                world,
                self.timeout,
                self.traffic.clone(),
            )))
        }

        fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
            self.check_peer(peer)?;
            let _g = self.enter()?;
            let mut ops = [self.post_send(peer, data)?];
            self.drive(&mut ops)
        }

        fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
            self.check_peer(peer)?;
            let mut g = self.enter()?;
            let mut ops = [self.post_recv(&mut g, peer, data)?];
            let res = self.drive(&mut ops);
            self.settle(&mut g, &mut ops);
            res
        }

        fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
            self.check_peer(dst)?;
            self.check_peer(src)?;
            let mut g = self.enter()?;
            // The receive first: a small one is posted before the peer's message comes.
            let recv_op = self.post_recv(&mut g, src, recv)?;
            let send_op = match self.post_send(dst, send) {
                Ok(op) => op,
                Err(e) => {
                    let mut ops = [recv_op];
                    self.withdraw(&mut g, &mut ops, &e);
                    return Err(e);
                }
            };
            let mut ops = [recv_op, send_op];
            let res = self.drive(&mut ops);
            self.settle(&mut g, &mut ops);
            res
        }

        fn exchange(
            &self,
            sends: &[(usize, &[u8])],
            recvs: &mut [(usize, &mut [u8])],
        ) -> Result<()> {
            for (p, _) in sends {
                self.check_peer(*p)?;
            }
            for (p, _) in recvs.iter() {
                self.check_peer(*p)?;
            }
            let mut g = self.enter()?;
            // Receives from one peer must match in order (and a long message arrives in
            // pieces), so they run in phases of at most one receive per peer; MPI keeps
            // the order of messages between two ranks. The first phase's receives are
            // posted, then every send, before anything waits, so no rank waits for a
            // receive that is not yet posted. The sends are waited for last: a later one
            // may need the peer's later phase (MPI progresses them meanwhile).
            let mut left: Vec<(usize, &mut [u8])> =
                recvs.iter_mut().map(|(p, d)| (*p, &mut **d)).collect();
            let mut sent: Vec<Op> = Vec::with_capacity(sends.len());
            let mut first = true;
            loop {
                let mut phase: Vec<Op> = Vec::with_capacity(left.len());
                let mut later = Vec::new();
                let mut res = Ok(());
                for (p, d) in left {
                    if res.is_err() || phase.iter().any(|o| o.peer() == p) {
                        later.push((p, d));
                        continue;
                    }
                    match self.post_recv(&mut g, p, d) {
                        Ok(op) => phase.push(op),
                        Err(e) => res = Err(e),
                    }
                }
                if std::mem::take(&mut first) {
                    for (p, d) in sends {
                        if res.is_err() {
                            break;
                        }
                        match self.post_send(*p, d) {
                            Ok(op) => sent.push(op),
                            Err(e) => res = Err(e),
                        }
                    }
                }
                let res = res.and_then(|_| {
                    let r = self.drive(&mut phase);
                    self.settle(&mut g, &mut phase);
                    r
                });
                if let Err(e) = res {
                    // What was posted must not outlive its buffers.
                    self.withdraw(&mut g, &mut phase, &e);
                    self.withdraw(&mut g, &mut sent, &e);
                    return Err(e);
                }
                if later.is_empty() {
                    return self.drive(&mut sent);
                }
                left = later;
            }
        }

        fn traffic(&self) -> Option<Arc<Traffic>> {
            Some(self.traffic.clone())
        }

        fn abort(&self) {
            self.aborted.store(true, Ordering::SeqCst);
        }

        fn failed(&self, e: &Error) {
            note_peer_failure(&e.to_string());
        }
    }
}
