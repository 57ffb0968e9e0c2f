//! N ranks of one process on ONE device, each rank a thread with its own stream,
//! exchanging through device-to-device copies: `cuda-local` (feature `cuda`) on a CUDA
//! GPU, `host-local` (always built) on the CPU device ([`crate::device::cpu`]). NCCL
//! refuses two ranks on one device; this transport is how every algorithm (hier,
//! ho-ring, qgz with the real kernels) runs end to end on a single GPU, and, on the CPU
//! device, how the device paths of strata run in CI without one.
//!
//! A collective is a rendezvous of the ranks' device addresses (a host-side exchange of
//! `(address, length)` posts), after which each rank pulls what it needs from its peers'
//! memory with copies and reduction kernels on its own stream, waits for its stream,
//! and meets the others once more so no rank reuses memory a peer is still reading.
//! Reductions add contributions in rank order. Point-to-point messages of a collective
//! (send-receive steps, grouped sends) are read in place: the sender publishes its bytes
//! with an event, the receiver's stream waits for it and copies, and the sender's stream
//! waits for the receiver's copy (its ack) before going on; an ungrouped plain send is
//! eager instead (copied into a buffer of its own, never waiting for its receive).
//!
//! On the capturable path ([`crate::device::direct`]) nothing waits on the host for the
//! device: rendezvous posts carry events that the peers' streams wait for, so a graph
//! captured from every rank's stream keeps the exchange's device order.
//!
//! Bytes pulled from a peer are recorded as that peer's sends in the world's traffic
//! counters (measured, as on the `local` transport). A rank that does not arrive within
//! the timeout, or an abort, fails the waiters with `Error::Remote`.

#![forbid(unsafe_code)]

use super::gpu::{self, staged, DevCall, DeviceFace, GpuTransport, On, Scratch};
use super::meeting::{Counts, Meetings};
use super::{P2p, Transport, TransportKind};
use crate::device::{finish, DevAddr, DevEvent, DevStream, Device, Elementwise, Region};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::topology::Topology;
use crate::traffic::Traffic;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a rank contributes to a rendezvous.
#[derive(Clone, Default)]
struct Post {
    addr: DevAddr,
    len: usize,
    color: Option<u32>,
    key: i64,
    group: Option<Arc<Group>>,
    /// On the capturable path: the point of the poster's stream after which its
    /// memory is ready (or no longer read).
    ev: Option<Arc<dyn DevEvent>>,
}

/// An in-place message: the sender's bytes, read in place by the receiver after
/// `ev`; the receiver answers with the event after its copy (`ack`), which the sender's
/// stream waits for before it may touch the bytes again.
struct DirectMsg {
    addr: DevAddr,
    len: usize,
    ev: Arc<dyn DevEvent>,
    ack: Ack,
}

type Ack = Arc<Mutex<Option<Arc<dyn DevEvent>>>>;

#[derive(Default)]
struct Board {
    /// Rendezvous round: posts of this round, how many arrived and left.
    posts: Vec<Option<Post>>,
    arrived: usize,
    result: Option<Arc<Vec<Post>>>,
    left: usize,
    round: u64,
    /// Messages in flight, by (src, dst) in communicator ranks, in send order.
    mail: HashMap<(usize, usize), VecDeque<Msg>>,
}

/// A message: staged through a buffer of its own (eager: the send is over once staged;
/// with the event after the staging copy when it was launched, not waited for), or read
/// in place by the receiver ([`DirectMsg`]).
enum Msg {
    Staged(Buffer, Option<Arc<dyn DevEvent>>),
    InPlace(DirectMsg),
}

/// Which thread is inside a call on one rank's communicators (its world's and every one
/// split from it), as a process's NCCL communicators: NCCL may deadlock when two
/// threads are inside calls on communicators of one process at once, so this model
/// refuses it, naming both calls.
#[derive(Default)]
struct Inside(Mutex<Option<(std::thread::ThreadId, usize, &'static str)>>);

/// One thread's stay inside [`Inside`] (nests on that thread).
struct Entered<'a>(&'a Inside);

impl Inside {
    fn enter(&self, kind: TransportKind, rank: usize, what: &'static str) -> Result<Entered<'_>> {
        let me = std::thread::current().id();
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *g {
            Some((t, n, _)) if *t == me => *n += 1,
            Some((_, _, other)) => {
                return Err(Error::InvalidUsage(format!(
                    "{}: two threads inside calls on communicators of world rank {rank} at \
                     once ({what} while another thread is inside {other}): the vendor calls \
                     of one process must come from one thread at a time (NCCL may deadlock)",
                    kind.name()
                )))
            }
            None => *g = Some((me, 1, what)),
        }
        Ok(Entered(self))
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut g = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n, _)) = &mut *g {
            *n -= 1;
            if *n == 0 {
                *g = None;
            }
        }
    }
}

/// The shared state of one communicator's ranks.
struct Group {
    kind: TransportKind,
    size: usize,
    members: Vec<usize>,
    board: Mutex<Board>,
    cv: Condvar,
    aborted: AtomicBool,
    /// Bumped by every notification: a waiter spins on it briefly before parking.
    gen: AtomicU64,
    /// Waiters parked on `cv` (changed under the board's lock): a notification is a
    /// system call, made only when someone waits.
    parked: std::sync::atomic::AtomicUsize,
    /// Member-only creations and censuses of these ranks: apart from the board, so
    /// they work after an abort (a shrink).
    meetings: Meetings<Arc<Group>>,
}

impl Group {
    fn new(kind: TransportKind, members: Vec<usize>) -> Arc<Group> {
        let size = members.len();
        Arc::new(Group {
            kind,
            size,
            members,
            board: Mutex::new(Board {
                posts: vec![None; size],
                ..Board::default()
            }),
            cv: Condvar::new(),
            aborted: AtomicBool::new(false),
            gen: AtomicU64::new(0),
            parked: std::sync::atomic::AtomicUsize::new(0),
            meetings: Meetings::new(),
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Board>> {
        self.board
            .lock()
            .map_err(|_| Error::Internal("device-local board poisoned".into()))
    }

    fn check_abort(&self) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Remote(format!(
                "the {} communicator was aborted",
                self.kind.name()
            )));
        }
        Ok(())
    }

    /// Wait on the board until `ready`, with the deadline and abort checks.
    fn wait<'a>(
        &'a self,
        mut b: std::sync::MutexGuard<'a, Board>,
        deadline: Instant,
        what: &str,
        mut ready: impl FnMut(&Board) -> bool,
    ) -> Result<std::sync::MutexGuard<'a, Board>> {
        loop {
            self.check_abort()?;
            if ready(&b) {
                return Ok(b);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    (0..self.size).filter(|&r| b.posts[r].is_none()).collect();
                return Err(Error::Remote(format!(
                    "{}: {what} timed out (ranks not arrived: {missing:?})",
                    self.kind.name()
                )));
            }
            // Ranks usually arrive within microseconds of each other: spin a little
            // before parking (a wake-up costs tens of microseconds).
            let seen = self.gen.load(Ordering::Acquire);
            drop(b);
            let spun = Instant::now();
            while self.gen.load(Ordering::Acquire) == seen
                && spun.elapsed() < Duration::from_micros(30)
            {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
            b = self.lock()?;
            if self.gen.load(Ordering::Acquire) != seen || ready(&b) {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                continue;
            }
            self.parked.fetch_add(1, Ordering::SeqCst);
            let r = self.cv.wait_timeout(b, deadline - now);
            self.parked.fetch_sub(1, Ordering::SeqCst);
            b = r
                .map_err(|_| Error::Internal("device-local board poisoned".into()))?
                .0;
        }
    }

    /// Wake every waiter on the board (call with the board's lock held, or after taking
    /// it once since the change).
    fn notify(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
        if self.parked.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Exchange one post per rank (an all-gather of host values, doubling as a barrier).
    fn rendezvous(&self, rank: usize, post: Post, timeout: Duration) -> Result<Arc<Vec<Post>>> {
        let deadline = Instant::now() + timeout;
        let b = self.lock()?;
        // A previous round still being read: wait for it to drain.
        let mut b = self.wait(b, deadline, "rendezvous", |b| {
            b.result.is_none() && b.posts[rank].is_none()
        })?;
        let round = b.round;
        b.posts[rank] = Some(post);
        b.arrived += 1;
        if b.arrived == self.size {
            let all: Vec<Post> = b
                .posts
                .iter()
                .map(|p| p.clone().unwrap_or_default())
                .collect();
            b.result = Some(Arc::new(all));
            self.notify();
        }
        let mut b = self.wait(b, deadline, "rendezvous", |b| {
            b.round != round || b.result.is_some()
        })?;
        let r = b
            .result
            .clone()
            .ok_or_else(|| Error::Internal("device-local round lost".into()))?;
        b.left += 1;
        if b.left == self.size {
            b.posts.iter_mut().for_each(|p| *p = None);
            b.arrived = 0;
            b.left = 0;
            b.result = None;
            b.round += 1;
            self.notify();
        }
        Ok(r)
    }
}

/// One rank of a `cuda-local` or `host-local` world.
pub struct DeviceLocalTransport {
    group: Arc<Group>,
    rank: usize,
    face: DeviceFace,
    work: Scratch,
    /// The stream that last used `work` on the launch path and the event after that
    /// use: a call on another stream (the fast path runs on its caller's stream) waits
    /// for it before reusing the memory.
    work_last: Mutex<Option<(usize, Arc<dyn DevEvent>)>>,
    traffic: Arc<Traffic>,
    timeout: Duration,
    splits: AtomicU64,
    /// Stream-ordered sends whose receivers' copies this rank's stream has not yet
    /// waited for, and the stream to wait on.
    acks: Mutex<Vec<(Ack, Arc<dyn DevStream>)>>,
    /// Inside [`GpuTransport::group`]: sends do not wait for their acks until its end.
    grouped: AtomicU64,
    /// Shared by this rank's communicators: the one thread inside a call on them.
    inside: Arc<Inside>,
    /// Member-only creations and censuses taken (their sequences).
    counts: Counts,
}

impl DeviceLocalTransport {
    /// A whole world of `topo.world_size()` ranks on `dev`, each with its own stream:
    /// `cuda-local` on a CUDA device, `host-local` on the CPU device.
    pub fn world(
        dev: &Arc<dyn Device>,
        topo: &Topology,
        timeout: Duration,
    ) -> Result<Vec<DeviceLocalTransport>> {
        let n = topo.world_size();
        let kind = match dev.api() {
            crate::device::Api::Cpu => TransportKind::HostLocal,
            crate::device::Api::Cuda => TransportKind::CudaLocal,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "no in-process device transport on {} devices (cuda-local: CUDA, \
                     host-local: the CPU device)",
                    other.name()
                )))
            }
        };
        let group = Group::new(kind, (0..n).collect());
        let traffic = Arc::new(Traffic::new(topo.clone()));
        (0..n)
            .map(|r| {
                let inside = Arc::new(Inside::default());
                DeviceLocalTransport::member(&group, r, dev, &traffic, timeout, inside)
            })
            .collect()
    }

    fn member(
        group: &Arc<Group>,
        rank: usize,
        dev: &Arc<dyn Device>,
        traffic: &Arc<Traffic>,
        timeout: Duration,
        inside: Arc<Inside>,
    ) -> Result<DeviceLocalTransport> {
        Ok(DeviceLocalTransport {
            group: group.clone(),
            rank,
            face: DeviceFace::new(dev)?,
            work: Scratch::new(dev),
            work_last: Mutex::new(None),
            traffic: traffic.clone(),
            timeout,
            splits: AtomicU64::new(0),
            acks: Mutex::new(Vec::new()),
            grouped: AtomicU64::new(0),
            inside,
            counts: Counts::default(),
        })
    }

    /// Rank `rank` of `group`, a new communicator of this rank's world (same device,
    /// traffic counters, timeout and calling thread).
    fn sibling(&self, group: &Arc<Group>, rank: usize) -> Result<DeviceLocalTransport> {
        DeviceLocalTransport::member(
            group,
            rank,
            &self.face.dev,
            &self.traffic,
            self.timeout,
            self.inside.clone(),
        )
    }

    /// This thread enters a call on this rank's communicators ([`Inside`]).
    fn enter(&self, what: &'static str) -> Result<Entered<'_>> {
        self.inside
            .enter(self.group.kind, self.group.members[self.rank], what)
    }

    /// The stream this rank's device work goes on ([`gpu::work_stream`]).
    fn s(&self, on: On<'_>) -> Arc<dyn DevStream> {
        gpu::work_stream(self, on).clone()
    }

    /// The work scratch for `bytes` on stream `s`: launched, after the last use of it
    /// on another stream (one wait on `s`, only when the stream changes).
    fn work_on(&self, on: On<'_>, s: &Arc<dyn DevStream>, bytes: usize) -> Result<Buffer> {
        if on.is_some() {
            let last = self
                .work_last
                .lock()
                .map_err(|_| Error::Internal("scratch hand-off lock poisoned".into()))?
                .clone();
            if let Some((raw, ev)) = last {
                if raw != s.raw() as usize {
                    s.wait_event(ev.as_ref())?;
                }
            }
        }
        self.work.get(on, bytes)
    }

    /// The work scratch's use on `s` is enqueued: launched, remember where it ends.
    fn work_done(&self, on: On<'_>, s: &Arc<dyn DevStream>) -> Result<()> {
        if on.is_some() {
            let ev = s.record()?;
            *self
                .work_last
                .lock()
                .map_err(|_| Error::Internal("scratch hand-off lock poisoned".into()))? =
                Some((s.raw() as usize, ev));
        }
        Ok(())
    }

    /// Make this rank's stream wait for the receivers' copies of its stream-ordered
    /// sends (their acks), so it never overwrites bytes a peer is still reading.
    fn settle_acks(&self) -> Result<()> {
        let pending = std::mem::take(
            &mut *self
                .acks
                .lock()
                .map_err(|_| Error::Internal("device-local acks poisoned".into()))?,
        );
        let deadline = Instant::now() + self.timeout;
        for (ack, stream) in pending {
            let b = self.group.lock()?;
            let ready = |_: &Board| ack.lock().map(|a| a.is_some()).unwrap_or(true);
            drop(
                self.group
                    .wait(b, deadline, "send (waiting for the receive)", ready)?,
            );
            let ev = ack
                .lock()
                .map_err(|_| Error::Internal("device-local ack poisoned".into()))?
                .clone()
                .ok_or_else(|| Error::Internal("device-local ack vanished".into()))?;
            stream.wait_event(ev.as_ref())?;
        }
        Ok(())
    }

    /// Stream-ordered send: publish the bytes and the event after which they are ready.
    fn post_direct(&self, on: On<'_>, peer: usize, data: Region) -> Result<()> {
        let s = self.s(on);
        let ack: Ack = Arc::new(Mutex::new(None));
        let msg = DirectMsg {
            addr: data.addr,
            len: data.len,
            ev: s.record()?,
            ack: ack.clone(),
        };
        self.acks
            .lock()
            .map_err(|_| Error::Internal("device-local acks poisoned".into()))?
            .push((ack, s));
        let mut b = self.group.lock()?;
        b.mail
            .entry((self.rank, peer))
            .or_default()
            .push_back(Msg::InPlace(msg));
        self.group.notify();
        Ok(())
    }

    /// The next message from `peer` (waiting for it up to the timeout).
    fn next_msg(&self, peer: usize) -> Result<Msg> {
        let deadline = Instant::now() + self.timeout;
        let key = (peer, self.rank);
        let b = self.group.lock()?;
        let mut b = self.group.wait(b, deadline, "receive", |b| {
            b.mail.get(&key).is_some_and(|q| !q.is_empty())
        })?;
        b.mail
            .get_mut(&key)
            .and_then(|q| q.pop_front())
            .ok_or_else(|| Error::Internal("device-local message vanished".into()))
    }

    fn check_msg_len(&self, peer: usize, sent: usize, want: usize) -> Result<()> {
        if sent != want {
            return Err(Error::InvalidUsage(format!(
                "{}: rank {peer} sent {sent} bytes, rank {} expected {want}",
                self.group.kind.name(),
                self.rank,
            )));
        }
        Ok(())
    }

    /// Receive the next message from `peer` into `data`, in this rank's stream order
    /// (not waited for).
    fn take_into(&self, on: On<'_>, peer: usize, data: Region) -> Result<()> {
        match self.next_msg(peer)? {
            Msg::Staged(msg, ev) => {
                self.check_msg_len(peer, msg.len(), data.len)?;
                gpu::unstage(self, on, self.timeout, (msg, ev), data, "receive")?;
                self.count(peer, data.len);
                Ok(())
            }
            Msg::InPlace(msg) => self.copy_in_place(on, peer, msg, data),
        }
    }

    /// An in-place receive: wait (on the device) for the sender's bytes, copy them,
    /// answer with the event after the copy.
    fn copy_in_place(&self, on: On<'_>, peer: usize, msg: DirectMsg, data: Region) -> Result<()> {
        let s = self.s(on);
        let copied = (|| {
            self.check_msg_len(peer, msg.len, data.len)?;
            s.wait_event(msg.ev.as_ref())?;
            s.copy(data.addr, msg.addr, data.len)?;
            self.count(peer, data.len);
            Ok(())
        })();
        // Answer even on failure (the sender's stream must not wait forever); the event
        // after whatever was enqueued.
        let ev = s.record()?;
        if let Ok(mut a) = msg.ack.lock() {
            *a = Some(ev);
        }
        drop(self.group.lock()?);
        self.group.notify();
        copied
    }

    /// Publish `addr..addr+len` to the peers and get theirs. This rank's stream is
    /// finished first: work queued on it before the call (a non-in-place all-gather's
    /// own-chunk copy, an earlier kernel writing the input) must be complete before the
    /// peers' streams read this memory; a host rendezvous alone orders nothing on the
    /// device.
    ///
    /// On the capturable path nothing waits on the host: the post carries an event of
    /// this rank's stream, and each rank's stream waits for every peer's event (so the
    /// exchange orders the ranks' streams on the device, and a captured graph keeps
    /// that order on replay).
    fn rdv(&self, on: On<'_>, addr: DevAddr, len: usize) -> Result<Arc<Vec<Post>>> {
        let direct = on.is_some();
        let ev = if direct {
            Some(self.s(on).record()?)
        } else {
            self.finish(on, "the work queued before the rendezvous")?;
            None
        };
        let posts = self.group.rendezvous(
            self.rank,
            Post {
                addr,
                len,
                ev,
                ..Post::default()
            },
            self.timeout,
        )?;
        if posts.iter().any(|p| p.ev.is_some() != direct) {
            return Err(Error::InvalidUsage(format!(
                "{}: some ranks' calls are captured into a graph and others are not (capture \
                 the call on every rank, into one graph)",
                self.group.kind.name()
            )));
        }
        if direct {
            let s = self.s(on);
            for (j, p) in posts.iter().enumerate() {
                if let (true, Some(e)) = (j != self.rank, &p.ev) {
                    s.wait_event(e.as_ref())?;
                }
            }
        }
        Ok(posts)
    }

    fn barrier_(&self, on: On<'_>) -> Result<()> {
        self.rdv(on, 0, 0).map(|_| ())
    }

    /// Pulled `bytes` from communicator rank `peer`.
    fn count(&self, peer: usize, bytes: usize) {
        if peer != self.rank && bytes > 0 {
            self.traffic.record(
                self.group.members[peer],
                self.group.members[self.rank],
                bytes,
            );
        }
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.group.size {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} out of range for a communicator of {} ranks",
                self.group.size
            )));
        }
        Ok(())
    }

    fn check_len(&self, what: &str, posts: &[Post], want: usize) -> Result<()> {
        if let Some((r, p)) = posts.iter().enumerate().find(|(_, p)| p.len != want) {
            return Err(Error::InvalidUsage(format!(
                "{} {what}: rank {r} passed {} bytes, rank {} passed {want} (counts differ across ranks)",
                self.group.kind.name(), p.len, self.rank
            )));
        }
        Ok(())
    }

    /// The one body of this transport's collectives: enter, publish `mine` and get every
    /// rank's post ([`Self::rdv`]), check that each passed `mine.len` bytes, run
    /// `peer(s, j, post j, acc)` for every rank j in rank order on this rank's stream `s`
    /// (it returns the bytes it pulled from j, counted as j's sends), finish, and meet the
    /// others once more (also on error, so no peer is left waiting on this round). With
    /// `out` (a reduction) `acc` is the work scratch, `out.len` bytes, copied to `out`
    /// after that meeting (every rank has read every buffer: now each overwrites its
    /// own); without, `acc` is 0.
    fn collective(
        &self,
        on: On<'_>,
        what: &'static str,
        mine: Region,
        out: Option<Region>,
        mut peer: impl FnMut(&Arc<dyn DevStream>, usize, &Post, DevAddr) -> Result<usize>,
    ) -> Result<()> {
        let _in = self.enter(what)?;
        let s = self.s(on);
        let posts = self.rdv(on, mine.addr, mine.len)?;
        let acc = out.map(|o| self.work_on(on, &s, o.len)).transpose()?;
        let g = acc
            .as_ref()
            .map(|a| a.dev_write_timeout(self.timeout))
            .transpose()?;
        let at = g.as_ref().map_or(0, |g| g.addr());
        let r = (|| {
            self.check_len(what, &posts, mine.len)?;
            for (j, p) in posts.iter().enumerate() {
                self.count(j, peer(&s, j, p, at)?);
            }
            self.finish(on, what)
        })();
        let b = self.barrier_(on);
        r.and(b)?;
        let Some(out) = out else {
            return Ok(());
        };
        s.copy(out.addr, at, out.len)?;
        self.work_done(on, &s)?;
        self.finish(on, what)
    }

    /// A reduction of every rank's `send` at `off` (`out.len` bytes each, added in rank
    /// order) into `out`, through the work scratch ([`Self::collective`]).
    fn reduction(
        &self,
        on: On<'_>,
        what: &'static str,
        (send, off): (Region, u64),
        out: Region,
        (dtype, op): (DataType, ReduceOp),
    ) -> Result<()> {
        let c = out.len;
        self.collective(on, what, send, Some(out), |s, j, p, acc| {
            let n = gpu::count_of(c, dtype)?;
            if j == 0 {
                s.copy(acc, p.addr + off, c)?;
            } else {
                let src = p.addr + off;
                s.elementwise(Elementwise::Reduce {
                    acc,
                    src,
                    count: n,
                    dtype,
                    op,
                })?;
            }
            Ok(c)
        })
    }

    fn recv_msg(&self, on: On<'_>, peer: usize, data: Region) -> Result<()> {
        let _in = self.enter("receive")?;
        self.check_peer(peer)?;
        self.take_into(on, peer, data)?;
        self.finish(on, "receive")
    }

    /// In place inside a group of a stream-ordered call (the receivers' copies are
    /// waited for at the group's end) and on the capturable path; otherwise eager, staged
    /// through a buffer of its own, so a send never waits for its receive.
    fn send_msg(&self, on: On<'_>, peer: usize, data: Region) -> Result<()> {
        let _in = self.enter("send")?;
        self.check_peer(peer)?;
        let grouped = self.grouped.load(Ordering::SeqCst) > 0;
        let capturing = on.is_some() && self.s(on).is_capturing()?;
        if capturing || (on.is_some() && grouped) {
            self.post_direct(on, peer, data)?;
            if !grouped {
                self.settle_acks()?;
            }
            return Ok(());
        }
        // Eager: staged through a buffer of its own (never a call's arena block),
        // handed to the receiver.
        let (msg, ev) = gpu::stage(self, on, self.timeout, data, "send")?;
        let mut b = self.group.lock()?;
        b.mail
            .entry((self.rank, peer))
            .or_default()
            .push_back(Msg::Staged(msg, ev));
        self.group.notify();
        Ok(())
    }
}

impl GpuTransport for DeviceLocalTransport {
    fn face(&self) -> &DeviceFace {
        &self.face
    }
    fn finish(&self, on: On<'_>, what: &str) -> Result<()> {
        if on.is_some() {
            return self.group.check_abort();
        }
        finish(self.face.stream.as_ref(), self.timeout, what, || {
            self.group.check_abort()
        })
    }

    fn any_stream(&self) -> bool {
        // The work scratch is handed between streams with an event ([`Self::work_on`]);
        // everything else of a collective is the call's own.
        true
    }

    fn call(&self, on: On<'_>, c: DevCall) -> Result<()> {
        let (what, me) = (c.name(), self.rank);
        match c {
            DevCall::AllGather { buf, chunk } => {
                self.collective(on, what, buf, None, |s, j, p, _| {
                    if j == me {
                        return Ok(0);
                    }
                    let off = (j * chunk) as u64;
                    s.copy(buf.addr + off, p.addr + off, chunk)?;
                    Ok(chunk)
                })
            }
            DevCall::ReduceScatter {
                send,
                recv,
                dtype,
                op,
            } => {
                let off = (me * recv.len) as u64;
                self.reduction(on, what, (send, off), recv, (dtype, op))
            }
            DevCall::AllReduce { buf, dtype, op } => {
                self.reduction(on, what, (buf, 0), buf, (dtype, op))
            }
            DevCall::AllToAll { send, recv } => {
                let b = recv.len / self.group.size.max(1);
                self.collective(on, what, send, None, |s, j, p, _| {
                    s.copy(recv.addr + (j * b) as u64, p.addr + (me * b) as u64, b)?;
                    Ok(b)
                })
            }
            DevCall::Broadcast { buf, root } => {
                if root >= self.group.size {
                    return Err(Error::InvalidArgument(format!(
                        "broadcast root {root} out of range for a communicator of {} ranks",
                        self.group.size
                    )));
                }
                self.collective(on, what, buf, None, |s, j, p, _| {
                    if j != root || me == root {
                        return Ok(0);
                    }
                    s.copy(buf.addr, p.addr, buf.len)?;
                    Ok(buf.len)
                })
            }
            DevCall::Send { peer, data } => self.send_msg(on, peer, data),
            DevCall::Recv { peer, data } => self.recv_msg(on, peer, data),
            // Inside a stream-ordered call: in place, no allocation (the send is
            // published, the receive done, then this rank's stream waits for the peer's
            // copy).
            DevCall::SendRecv {
                dst,
                send,
                src,
                recv,
            } => {
                let _in = self.enter(what)?;
                if on.is_none() {
                    self.send_msg(on, dst, send)?;
                    return self.recv_msg(on, src, recv);
                }
                self.check_peer(dst)?;
                self.check_peer(src)?;
                self.post_direct(on, dst, send)?;
                let r = self.take_into(on, src, recv);
                let a = if self.grouped.load(Ordering::SeqCst) == 0 {
                    self.settle_acks()
                } else {
                    Ok(())
                };
                r.and(a)?;
                self.finish(on, what)
            }
        }
    }
    fn group(&self, on: On<'_>, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.grouped.fetch_add(1, Ordering::SeqCst);
        let r = body();
        self.grouped.fetch_sub(1, Ordering::SeqCst);
        // Pending acks exist only for stream-ordered calls.
        if self.grouped.load(Ordering::SeqCst) != 0 {
            return r;
        }
        let a = self.settle_acks();
        r.and(a)?;
        self.finish(on, "grouped sends")
    }
}

impl Transport for DeviceLocalTransport {
    fn kind(&self) -> TransportKind {
        self.group.kind
    }
    fn world_rank(&self, r: usize) -> usize {
        self.group.members[r]
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn gpu(&self) -> Option<&dyn GpuTransport> {
        Some(self)
    }

    /// The communicator of `members` (ranks of this one, sorted, this rank among them)
    /// made by them alone, meeting apart from this communicator's board: it works after
    /// an abort (a shrink). Each waits up to the timeout for the others.
    fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
        let Some(rank) = members.iter().position(|&m| m == self.rank) else {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not among the members {members:?}",
                self.rank
            )));
        };
        let key = (0, members.to_vec(), self.counts.next_made(members));
        let group = self.group.meetings.group(key, self.timeout, || {
            let world = members.iter().map(|&m| self.group.members[m]).collect();
            Group::new(self.group.kind, world)
        })?;
        let t = self.sibling(&group, rank)?;
        Ok(Arc::new(t))
    }

    /// The census of these ranks (the local transport's rule: it closes when every rank
    /// came or one timeout after the first), whatever this communicator's state.
    fn survivors(&self) -> Result<Vec<usize>> {
        let key = (0, self.counts.next_census());
        self.group
            .meetings
            .census(key, self.group.size, self.rank, self.timeout)
    }

    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>> {
        self.splits.fetch_add(1, Ordering::Relaxed);
        let mine = Post {
            color,
            key: key as i64,
            ..Post::default()
        };
        let posts = self.group.rendezvous(self.rank, mine, self.timeout)?;
        // The lowest rank of each color makes the group and publishes it.
        let mut members: Vec<(i64, usize)> = posts
            .iter()
            .enumerate()
            .filter(|(_, p)| color.is_some() && p.color == color)
            .map(|(r, p)| (p.key, r))
            .collect();
        members.sort();
        let leader = members.iter().map(|&(_, r)| r).min();
        let made = (leader == Some(self.rank)).then(|| {
            Group::new(
                self.group.kind,
                members
                    .iter()
                    .map(|&(_, r)| self.group.members[r])
                    .collect(),
            )
        });
        let published = self.group.rendezvous(
            self.rank,
            Post {
                group: made,
                ..Post::default()
            },
            self.timeout,
        )?;
        let (Some(_), Some(leader)) = (color, leader) else {
            return Ok(None);
        };
        let group = published[leader]
            .group
            .clone()
            .ok_or_else(|| Error::Internal("device-local split lost its group".into()))?;
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .ok_or_else(|| Error::Internal("device-local split lost this rank".into()))?;
        let t = self.sibling(&group, rank)?;
        Ok(Some(Arc::new(t)))
    }

    fn traffic(&self) -> Option<Arc<Traffic>> {
        Some(self.traffic.clone())
    }
    fn abort(&self) {
        self.group.aborted.store(true, Ordering::SeqCst);
        // Through the lock: a waiter that checked the flag before the store is parked
        // (and counted) by the time the lock is free.
        drop(self.group.board.lock());
        self.group.notify();
    }
    fn barrier(&self) -> Result<()> {
        self.barrier_(None)
    }
}

impl P2p for DeviceLocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.size
    }
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        staged::send(self, self.timeout, peer, data)
    }
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
        staged::recv(self, self.timeout, peer, data)
    }
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
        staged::sendrecv(self, self.timeout, dst, send, src, recv)
    }
}
