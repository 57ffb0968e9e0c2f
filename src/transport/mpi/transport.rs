//! [`MpiTransport`]: a rank of an MPI communicator.

use super::comm::{byte_type, RawComm};
use super::control::{Control, Who};
use super::init::{ensure_init, note_peer_failure};
use super::progress::{self, spin_polls, wait_collective, Link, Op};
use super::rc::check;
use super::recv::{mismatch_error, Buffers, RecvOp, Stage};
use super::request::{request_null, Req};
use super::send::{send_window, SendOp};
use super::tags::{is_small, max_piece, tag, Seqs, CLASS_SMALL, SMALL};
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::traffic::{Traffic, TrafficMatrix};
use crate::transport::{P2p, Transport, TransportKind};
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A rank of an MPI communicator.
pub struct MpiTransport {
    pub(super) comm: RawComm,
    /// A duplicate of `comm` for member-only creations and the census (`control`).
    pub(super) ctl: Control,
    pub(super) rank: usize,
    /// World rank of each member.
    pub(super) members: Vec<usize>,
    pub(super) timeout: Duration,
    pub(super) traffic: Arc<Traffic>,
    pub(super) aborted: AtomicBool,
    /// Why the communicator cannot be used any more (a request had to be abandoned).
    pub(super) broken: std::sync::OnceLock<String>,
    /// Serialises the calls on this communicator; holds the receive buffers.
    pub(super) busy: Mutex<Buffers>,
    /// Largest message sent whole (longer ones go as header + pieces); the staging
    /// size of a receive. Every rank must use the same.
    pub(super) piece: usize,
    /// Sequence numbers of the messages sent to / received from each member.
    pub(super) sent: Seqs,
    pub(super) received: Seqs,
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
        let ctl = Control::dup(&comm)?;
        let (rank, size) = comm.rank_size()?;
        Ok(MpiTransport::over(
            comm,
            ctl,
            rank,
            (0..size).collect(),
            timeout,
            Arc::new(Traffic::new(topo)),
        ))
    }

    /// A transport over `comm`, this process being `rank` of it, whose ranks are the
    /// world ranks `members`.
    pub(super) fn over(
        comm: RawComm,
        ctl: Control,
        rank: usize,
        members: Vec<usize>,
        timeout: Duration,
        traffic: Arc<Traffic>,
    ) -> MpiTransport {
        let size = members.len();
        MpiTransport {
            comm,
            ctl,
            rank,
            members,
            timeout,
            traffic,
            aborted: AtomicBool::new(false),
            broken: std::sync::OnceLock::new(),
            busy: Mutex::new(Buffers::default()),
            piece: max_piece(),
            sent: Seqs::new(size),
            received: Seqs::new(size),
        }
    }

    /// The same transport sending messages of at most `piece` bytes whole (every rank
    /// must use the same; sub-communicators inherit it).
    pub(super) fn with_piece(mut self, piece: usize) -> MpiTransport {
        self.piece = piece.clamp(1, i32::MAX as usize);
        self
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
        // The bounded barrier first: a rank that stopped before this call is named (the
        // MPI_Iallreduce's timeout below could only say that someone is missing).
        if let Err(e) = self.barrier() {
            return self.after_collective(Err(Error::Remote(format!(
                "rank {} waited for the other ranks to sum traffic: {e}",
                self.rank
            ))));
        }
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
        let recv = self.wait_boxes(r, send, recv, || {
            format!(
                "rank {} waited {:?} for the other ranks to sum traffic",
                self.rank, self.timeout
            )
        })?;
        Ok(TrafficMatrix {
            n: m.n,
            bytes: recv.into_vec(),
        })
    }

    /// Wait, up to the timeout (`late`: the error then), for the nonblocking collective
    /// `r` that reads `send` and writes `recv`; `recv` once it completed. On failure the
    /// collective may still read and write the boxes: they are leaked, never freed, and
    /// the communicator is broken ([`Self::after_collective`]).
    fn wait_boxes<S: ?Sized, R: ?Sized>(
        &self,
        r: ffi::MPI_Request,
        send: Box<S>,
        recv: Box<R>,
        late: impl Fn() -> String,
    ) -> Result<Box<R>> {
        let mut req = Req(r);
        if let Err(e) = wait_collective(&mut req, self.timeout, Some(&self.aborted), late) {
            std::mem::forget(send);
            std::mem::forget(recv);
            return self.after_collective(Err(e));
        }
        Ok(recv)
    }

    /// Refuse work on an aborted or broken communicator; hold the call lock.
    pub(super) fn enter(&self) -> Result<MutexGuard<'_, Buffers>> {
        self.check_alive()?;
        let g = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        self.check_alive()?;
        Ok(g)
    }

    pub(super) fn check_alive(&self) -> Result<()> {
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
    pub(super) fn after_collective<T>(&self, res: Result<T>) -> Result<T> {
        if let Err(e) = &res {
            self.broken
                .get_or_init(|| format!("a collective did not complete ({e})"));
            // An MPI collective left pending: MPI_Finalize would wait for it.
            note_peer_failure(&e.to_string());
        }
        res
    }

    /// Poll `ops` until all complete ([`progress::drive`]).
    pub(super) fn drive(&self, ops: &mut [Op]) -> Result<()> {
        let link = Link {
            comm: &self.comm,
            aborted: &self.aborted,
            timeout: self.timeout,
            rank: self.rank,
            members: &self.members,
        };
        progress::drive(&link, ops, |e| self.mark_broken(e))
    }

    /// A transfer could not be retired after `e`: refuse every later call.
    pub(super) fn mark_broken(&self, e: &Error) {
        let why = match e {
            Error::Remote(m) => m.clone(),
            e => e.to_string(),
        };
        self.broken
            .get_or_init(|| format!("a transfer could not be cancelled after this error: {why}"));
    }

    pub(super) fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.members.len() {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} out of range for {} ranks",
                self.members.len()
            )));
        }
        Ok(())
    }

    pub(super) fn record(&self, peer: usize, bytes: usize) {
        self.traffic
            .record(self.members[self.rank], self.members[peer], bytes);
    }

    /// Post a send to `peer` (the next sequence numbers to it) and record its traffic.
    /// `window`: pieces in flight at most, as synchronous sends, the rest posted as
    /// [`Self::drive`] sees them matched (a `sendrecv`'s send); `None` posts every piece.
    pub(super) fn post_send(&self, peer: usize, data: &[u8], window: Option<usize>) -> Result<Op> {
        let op = SendOp::post(
            &self.comm,
            peer,
            data,
            self.sent.get(peer),
            self.piece,
            window,
        )?;
        self.sent.set(peer, op.end_seq);
        self.record(peer, data.len());
        Ok(Op::Send(op))
    }

    /// Start a receive from `peer` (a small one is posted at once, into a reused
    /// landing buffer; a larger one gets reused staging buffers). Call [`Self::settle`]
    /// once it is driven.
    pub(super) fn post_recv(&self, bufs: &mut Buffers, peer: usize, buf: &mut [u8]) -> Result<Op> {
        let seq = self.received.get(peer);
        RecvOp::new(&self.comm, peer, self.rank, buf, seq, self.piece, bufs).map(Op::Recv)
    }

    /// After driving `ops`: the receives' sequence numbers (every message they
    /// matched, a drained one too) and their landing and staging buffers back.
    pub(super) fn settle(&self, bufs: &mut Buffers, ops: &mut [Op]) {
        for op in ops {
            if let Op::Recv(r) = op {
                self.received.set(r.peer, r.seq);
                r.settle(bufs);
            }
        }
    }

    /// Retire `ops` after `e` stopped them before they were driven.
    pub(super) fn withdraw(&self, bufs: &mut Buffers, ops: &mut [Op], e: &Error) {
        for op in ops.iter_mut() {
            if !op.cancel() {
                self.mark_broken(e);
            }
        }
        self.settle(bufs, ops);
    }
}

impl MpiTransport {
    /// The small receive of message `seq` from `src`, posted into `landing` as `req`, as
    /// a [`RecvOp`] for [`Self::drive`] (or for withdrawing it).
    fn posted_recv(
        &self,
        src: usize,
        recv: &mut [u8],
        seq: u32,
        landing: Vec<u8>,
        req: Req,
    ) -> RecvOp {
        RecvOp::at(
            src,
            self.rank,
            recv,
            seq,
            self.piece,
            landing,
            Stage::Posted(req),
        )
    }

    /// [`P2p::sendrecv`] of two small messages (a latency-bound step): the same
    /// messages and tags as [`Self::post_recv`] + [`Self::post_send`], but the two
    /// requests are posted and polled here, for [`quick_polls`] rounds, with no
    /// transfer state built; a step that is not done by then is handed over, as it
    /// stands, to [`Self::drive`] (the deadline, the abort, a longer message of the
    /// peer in our place: everything the general path does). `bufs`: the call lock's.
    fn sendrecv_small(
        &self,
        bufs: &mut Buffers,
        dst: usize,
        send: &[u8],
        src: usize,
        recv: &mut [u8],
    ) -> Result<()> {
        let rseq = self.received.get(src);
        let mut landing = bufs.landing.pop().unwrap_or_default();
        if landing.len() < SMALL {
            landing = vec![0u8; SMALL];
        }
        let mut r = request_null();
        // SAFETY: the landing buffer holds SMALL bytes and is neither moved nor freed
        // while the request is live (it is completed here, or handed over with the
        // request to a RecvOp, which retires it or leaks the buffer); live communicator.
        let rc = unsafe {
            ffi::MPI_Irecv(
                landing.as_mut_ptr() as *mut c_void,
                SMALL as c_int,
                byte_type(),
                src as c_int,
                tag(CLASS_SMALL, rseq),
                self.comm.0,
                &mut r,
            )
        };
        if let Err(e) = check(rc, "MPI_Irecv") {
            bufs.landing.push(landing);
            return Err(e);
        }
        let mut rreq = Req(r);
        let sseq = self.sent.get(dst);
        let mut s = request_null();
        // SAFETY: `send` is valid for reads and outlives the request: it is completed
        // here or driven to completion (or retired) before this call returns.
        let rc = unsafe {
            ffi::MPI_Isend(
                send.as_ptr() as *const c_void,
                send.len() as c_int,
                byte_type(),
                dst as c_int,
                tag(CLASS_SMALL, sseq),
                self.comm.0,
                &mut s,
            )
        };
        if let Err(e) = check(rc, "MPI_Isend") {
            let op = self.posted_recv(src, recv, rseq, landing, rreq);
            self.withdraw(bufs, &mut [Op::Recv(op)], &e);
            return Err(e);
        }
        self.sent.set(dst, sseq.wrapping_add(1));
        self.record(dst, send.len());
        let mut sreq = Req(s);
        // Quick polls: the receive's outcome (`Some(bytes)`), the send's completion.
        let (mut got, mut sent) = (None, false);
        let mut first_err: Option<Error> = None;
        let mut recv_failed = false;
        for _ in 0..quick_polls() {
            if got.is_none() && !recv_failed {
                match rreq.test_count("MPI_Test (recv)") {
                    Ok(n) => got = n,
                    Err(e) => {
                        // Complete (MPI freed it): nothing writes the landing buffer.
                        recv_failed = true;
                        first_err.get_or_insert(e);
                    }
                }
            }
            // The send is tested once the receive is in: a small send has usually left
            // by then, and each `MPI_Test` runs MPI's progress once more.
            if !sent && (got.is_some() || recv_failed) {
                match sreq.test("MPI_Test (send)") {
                    Ok(done) => sent = done,
                    Err(e) => {
                        sent = true;
                        first_err.get_or_insert(e);
                    }
                }
            }
            if sent && (got.is_some() || recv_failed) {
                break;
            }
            // No pause between polls: `MPI_Test` runs MPI's progress, which is the wait.
        }
        let pending_recv = if let Some(n) = got {
            self.received.set(src, rseq.wrapping_add(1));
            if n == recv.len() {
                recv.copy_from_slice(&landing[..n]);
            } else {
                first_err.get_or_insert(mismatch_error(src, self.rank, n, recv.len()));
            }
            bufs.landing.push(landing);
            None
        } else if recv_failed {
            bufs.landing.push(landing);
            None
        } else {
            Some(Op::Recv(self.posted_recv(src, recv, rseq, landing, rreq)))
        };
        let pending_send = (!sent).then(|| Op::Send(SendOp::posted(dst, sreq, sseq)));
        let res = match (pending_recv, pending_send) {
            (None, None) => Ok(()),
            (Some(r), Some(s)) => {
                let mut ops = [r, s];
                let res = self.drive(&mut ops);
                self.settle(bufs, &mut ops);
                res
            }
            (Some(op), None) | (None, Some(op)) => {
                let mut ops = [op];
                let res = self.drive(&mut ops);
                self.settle(bufs, &mut ops);
                res
            }
        };
        match first_err {
            Some(e) => Err(e),
            None => res,
        }
    }
}

/// Rounds a small `sendrecv` polls its two requests itself before handing them to the
/// driver: the driver's spin ([`spin_polls`]), at least one.
fn quick_polls() -> u32 {
    spin_polls().max(1)
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
                Error::InvalidArgument(format!("split color {c} exceeds MPI's limit {}", i32::MAX))
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
        let all = self.wait_boxes(r, mine, all, || {
            format!(
                "split timed out after {:?}: not every rank called split",
                self.timeout
            )
        })?;
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
        let ctl = Control::dup(&comm)?;
        let (rank, size) = comm.rank_size()?;
        let members: Vec<usize> = group.iter().map(|(_, r)| self.members[*r]).collect();
        if size != members.len() || members.get(rank) != Some(&self.members[self.rank]) {
            return Err(Error::Internal(format!(
                "MPI_Comm_split gave rank {rank} of {size}, strata expected rank {:?} of {}",
                members.iter().position(|m| *m == self.members[self.rank]),
                members.len()
            )));
        }
        Ok(Some(Arc::new(
            MpiTransport::over(comm, ctl, rank, members, self.timeout, self.traffic.clone())
                .with_piece(self.piece),
        )))
    }

    /// Made on the control communicator: it works whatever the state of this one
    /// (after an abort or a failure that broke it: a shrink), and never waits for this
    /// one's calls.
    fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
        if !members.contains(&self.rank) || members.iter().any(|&m| m >= self.members.len()) {
            return Err(Error::InvalidArgument(format!(
                "group members {members:?}: must be ranks of this communicator of {}, rank {} \
                 among them",
                self.members.len(),
                self.rank
            )));
        }
        // Once every member met, the blocking MPI_Comm_create_group cannot hang on a
        // member that never came.
        let who = Who {
            rank: self.rank,
            members: &self.members,
        };
        self.ctl.meet(&who, members, self.timeout).map_err(|e| {
            Error::Remote(format!(
                "creating a communicator of ranks {members:?}: not every member came ({e})"
            ))
        })?;
        let comm = self.ctl.create_group(members)?;
        let ctl = Control::dup(&comm)?;
        let (rank, size) = comm.rank_size()?;
        let world: Vec<usize> = members.iter().map(|&m| self.members[m]).collect();
        if size != world.len() || world.get(rank) != Some(&self.members[self.rank]) {
            return Err(Error::Internal(format!(
                "MPI_Comm_create_group gave rank {rank} of {size} for members {members:?}"
            )));
        }
        if super::init::peer_failure().is_some() {
            // Made after a failure: the survivors went on (finalize then waits for
            // them, not for the lost).
            super::init::note_recovered();
        }
        Ok(Arc::new(
            MpiTransport::over(comm, ctl, rank, world, self.timeout, self.traffic.clone())
                .with_piece(self.piece),
        ))
    }

    /// The census on the control communicator ([`Control::census`]): works after an
    /// abort or a failure; every live rank must call it.
    fn survivors(&self) -> Result<Vec<usize>> {
        let who = Who {
            rank: self.rank,
            members: &self.members,
        };
        let alive = self.ctl.census(&who, self.timeout)?;
        if alive.len() < self.members.len() {
            // Peers are gone: MPI_Finalize must not wait for them (unless the survivors
            // go on: `group` notes that).
            let lost: Vec<usize> = (0..self.members.len())
                .filter(|r| !alive.contains(r))
                .map(|r| self.members[r])
                .collect();
            note_peer_failure(&format!("the census found world ranks {lost:?} lost"));
        }
        Ok(alive)
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

impl P2p for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        let _g = self.enter()?;
        let mut ops = [self.post_send(peer, data, None)?];
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
        if is_small(send.len(), self.piece) && is_small(recv.len(), self.piece) {
            return self.sendrecv_small(&mut g, dst, send, src, recv);
        }
        // The receive first: a small one is posted before the peer's message comes.
        let recv_op = self.post_recv(&mut g, src, recv)?;
        // Its send moves in step with it (send.rs, SEND_WINDOW).
        let send_op = match self.post_send(dst, send, send_window()) {
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
    fn exchange(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()> {
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
        // may need the peer's later phase (MPI progresses them meanwhile). They post every
        // piece at once (no window): a windowed send needs feeding, and the phases drive
        // only their receives.
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
                    match self.post_send(*p, d, None) {
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
}
