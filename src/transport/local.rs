//! `local`: the ranks of a world are threads of one process (the embedded default and the
//! test bed). Messages travel through per-pair FIFO mailboxes. A plain [`P2p::send`] is
//! eager (the bytes are copied into the mailbox, so a send never waits for its receiver);
//! the steps of collectives ([`P2p::sendrecv`], [`P2p::sendrecv_reduce`],
//! [`P2p::exchange`]) of [`LEND_MIN`] bytes or more lend the sender's slice instead
//! ([`crate::memory::loan`]): the receiver copies or reduces straight from it into its
//! own buffer, so each byte moves once, and the sender returns when its slice was read.
//! Waits spin for a few microseconds before they park.
//! Every transfer is recorded in the world's [`Traffic`] counters, and a receive that
//! outlives the timeout or meets an aborted communicator returns an error instead of
//! hanging. While [`Traffic::start_recording`] is on, every send (before it can be
//! received) and every completed receive is also appended to the traffic's event log
//! (the schedule recording of [`crate::sim`]).

#![forbid(unsafe_code)]

use super::meeting::{Counts, Meetings};
use super::{Fold, P2p, Transport, TransportKind};
use crate::dtype::{reduce_into, reduce_pair, DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::loan::{lend, spin_until, Crowd, Loan, SPIN};
use crate::topology::Topology;
use crate::traffic::{EventKind, Traffic};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a peer of an aborted group sees.
const ABORTED: &str = "communicator was aborted by one of its ranks (abort, a failed collective, \
                       or a thread that panicked holding it)";

/// Collective steps of at least this many bytes lend the sender's slice instead of
/// copying it into the mailbox (below it, the copy is cheaper than waiting for the
/// receiver to take the loan).
pub const LEND_MIN: usize = 32 << 10;

enum Msg {
    /// Bytes copied at send time.
    Eager(Vec<u8>),
    /// The sender's slice, lent until the receiver has read it.
    Lent(Arc<Loan>),
}

impl Msg {
    fn len(&self) -> usize {
        match self {
            Msg::Eager(v) => v.len(),
            Msg::Lent(l) => l.len(),
        }
    }
}

#[derive(Default)]
struct Slots {
    msgs: VecDeque<Msg>,
    /// The receiver is parked on the condvar (senders notify only then).
    parked: bool,
}

#[derive(Default)]
struct Mailbox {
    q: Mutex<Slots>,
    cv: Condvar,
    /// Messages queued (polled without the lock while the receiver spins).
    queued: AtomicUsize,
}

impl Mailbox {
    fn push(&self, m: Msg) -> Result<()> {
        let mut q = self
            .q
            .lock()
            .map_err(|_| Error::Internal("mailbox poisoned".into()))?;
        q.msgs.push_back(m);
        self.queued.fetch_add(1, Ordering::Release);
        let parked = q.parked;
        drop(q);
        if parked {
            self.cv.notify_one();
        }
        Ok(())
    }
}

/// One communicator's worth of mailboxes, shared by its member threads.
struct Group {
    id: u64,
    /// World rank of each member.
    members: Vec<usize>,
    /// `boxes[dst * n + src]`.
    boxes: Vec<Mailbox>,
    aborted: AtomicBool,
}

impl Group {
    fn new(id: u64, members: Vec<usize>) -> Arc<Group> {
        let n = members.len();
        Arc::new(Group {
            id,
            members,
            boxes: (0..n * n).map(|_| Mailbox::default()).collect(),
            aborted: AtomicBool::new(false),
        })
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        for b in &self.boxes {
            let _g = b.q.lock();
            b.cv.notify_all();
        }
    }
}

#[derive(Default)]
struct SplitSlot {
    /// (color, key) per parent rank, filled as ranks arrive.
    entries: Vec<Option<Option<(u32, i32)>>>,
    /// Groups made once everyone arrived, by color.
    made: Option<HashMap<u32, Arc<Group>>>,
    taken: usize,
}

/// State shared by all ranks of one local world.
struct World {
    traffic: Arc<Traffic>,
    next_id: AtomicU64,
    splits: Mutex<HashMap<(u64, u64), SplitSlot>>,
    /// Communicators made by their members alone, and censuses.
    meetings: Meetings<Arc<Group>>,
    split_cv: Condvar,
    /// The world's rank threads, counted while it lives (waits park at once when they
    /// outnumber the cores).
    _crowd: Crowd,
}

/// A rank of an in-process world.
pub struct LocalTransport {
    world: Arc<World>,
    group: Arc<Group>,
    rank: usize,
    splits: AtomicU64,
    /// Member-only creations and censuses taken (their sequences).
    counts: Counts,
    timeout: Duration,
}

impl LocalTransport {
    /// A world of `topo.world_size()` ranks: one transport per rank, to be driven from
    /// one thread each. `timeout` bounds every wait for a peer.
    pub fn world(topo: &Topology, timeout: Duration) -> Vec<LocalTransport> {
        let n = topo.world_size();
        let world = Arc::new(World {
            traffic: Arc::new(Traffic::new(topo.clone())),
            next_id: AtomicU64::new(1),
            splits: Mutex::new(HashMap::new()),
            meetings: Meetings::new(),
            split_cv: Condvar::new(),
            _crowd: Crowd::new(n),
        });
        let group = Group::new(0, (0..n).collect());
        (0..n)
            .map(|rank| LocalTransport {
                world: world.clone(),
                group: group.clone(),
                rank,
                splits: AtomicU64::new(0),
                counts: Counts::default(),
                timeout,
            })
            .collect()
    }

    fn mailbox(&self, dst: usize, src: usize) -> &Mailbox {
        &self.group.boxes[dst * self.group.members.len() + src]
    }

    fn aborted(&self) -> bool {
        self.group.aborted.load(Ordering::SeqCst)
    }

    /// Rank `rank` of the new communicator `g` of this world.
    fn member_of(&self, g: Arc<Group>, rank: usize) -> Arc<dyn Transport> {
        Arc::new(LocalTransport {
            world: self.world.clone(),
            group: g,
            rank,
            splits: AtomicU64::new(0),
            counts: Counts::default(),
            timeout: self.timeout,
        })
    }

    /// Count a send to `peer` (before it can be received: "received" implies "counted").
    fn count_send(&self, peer: usize, bytes: usize) {
        let (me, them) = (self.group.members[self.rank], self.group.members[peer]);
        self.world.traffic.record(me, them, bytes);
        self.world
            .traffic
            .log(EventKind::Send, self.group.id, me, them, bytes);
    }

    /// Post `sends` in order (eager below [`LEND_MIN`], lent from it), run `then` (the
    /// receives), and wait until every peer has read its loan.
    fn post_then(&self, sends: &[(usize, &[u8])], then: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut loans = Vec::new();
        self.lend_rest(sends, &mut loans, then)
    }

    fn lend_rest(
        &self,
        sends: &[(usize, &[u8])],
        loans: &mut Vec<(usize, Arc<Loan>)>,
        then: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some(((peer, data), rest)) = sends.split_first() else {
            then()?;
            let deadline = Instant::now() + self.timeout;
            for (peer, loan) in loans.iter() {
                if !loan.wait_returned(deadline, || self.aborted()) {
                    if self.aborted() {
                        return Err(Error::Remote(ABORTED.into()));
                    }
                    return Err(Error::Remote(format!(
                        "rank {} waited {:?} for rank {peer} to take its message: peer dead, stalled or not calling the same collective",
                        self.rank, self.timeout
                    )));
                }
            }
            return Ok(());
        };
        self.count_send(*peer, data.len());
        if data.len() < LEND_MIN {
            self.mailbox(*peer, self.rank)
                .push(Msg::Eager(data.to_vec()))?;
            return self.lend_rest(rest, loans, then);
        }
        lend(data, |loan| {
            self.mailbox(*peer, self.rank)
                .push(Msg::Lent(loan.clone()))?;
            loans.push((*peer, loan.clone()));
            self.lend_rest(rest, loans, then)
        })
    }

    /// Take the next message from `peer`, which must be `len` bytes, and hand its bytes
    /// to `f` (which must not block).
    fn receive(&self, peer: usize, len: usize, f: impl FnOnce(&[u8])) -> Result<()> {
        let b = self.mailbox(self.rank, peer);
        spin_until(SPIN, || {
            b.queued.load(Ordering::Acquire) > 0 || self.aborted()
        });
        let deadline = Instant::now() + self.timeout;
        let mut q =
            b.q.lock()
                .map_err(|_| Error::Internal("mailbox poisoned".into()))?;
        let msg = loop {
            if let Some(m) = q.msgs.pop_front() {
                b.queued.fetch_sub(1, Ordering::Release);
                break m;
            }
            if self.aborted() {
                return Err(Error::Remote(ABORTED.into()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Remote(format!(
                    "rank {} waited {:?} for rank {peer}: peer dead, stalled or not calling the same collective",
                    self.rank, self.timeout
                )));
            }
            q.parked = true;
            q =
                b.cv.wait_timeout(q, deadline - now)
                    .map_err(|_| Error::Internal("mailbox poisoned".into()))?
                    .0;
            q.parked = false;
        };
        drop(q);
        if msg.len() != len {
            return Err(Error::InvalidUsage(format!(
                "rank {peer} sent {} bytes where rank {} expected {len}: counts or dtypes differ across ranks",
                msg.len(),
                self.rank,
            )));
        }
        match msg {
            Msg::Eager(v) => f(&v),
            Msg::Lent(loan) => loan.take(f).ok_or_else(|| {
                Error::Remote(format!(
                    "rank {peer} withdrew its message to rank {} (it timed out or was aborted)",
                    self.rank
                ))
            })?,
        }
        self.world.traffic.log(
            EventKind::Recv,
            self.group.id,
            self.group.members[peer],
            self.group.members[self.rank],
            len,
        );
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.group.members.len() {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} out of range for {} ranks",
                self.group.members.len()
            )));
        }
        if self.group.aborted.load(Ordering::SeqCst) {
            return Err(Error::Remote(ABORTED.into()));
        }
        Ok(())
    }
}

impl Transport for LocalTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }
    fn world_rank(&self, r: usize) -> usize {
        self.group.members[r]
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>> {
        let seq = self.splits.fetch_add(1, Ordering::SeqCst);
        let slot_key = (self.group.id, seq);
        let n = self.size();
        let deadline = Instant::now() + self.timeout;
        let mut slots = self
            .world
            .splits
            .lock()
            .map_err(|_| Error::Internal("split lock poisoned".into()))?;
        {
            let slot = slots.entry(slot_key).or_default();
            if slot.entries.is_empty() {
                slot.entries = vec![None; n];
            }
            slot.entries[self.rank] = Some(color.map(|c| (c, key)));
            if slot.entries.iter().all(Option::is_some) {
                let mut by_color: HashMap<u32, Vec<(i32, usize)>> = HashMap::new();
                for (r, e) in slot.entries.iter().enumerate() {
                    if let Some(Some((c, k))) = e {
                        by_color.entry(*c).or_default().push((*k, r));
                    }
                }
                let made = by_color
                    .into_iter()
                    .map(|(c, mut v)| {
                        v.sort();
                        let members = v.iter().map(|(_, r)| self.group.members[*r]).collect();
                        (
                            c,
                            Group::new(self.world.next_id.fetch_add(1, Ordering::SeqCst), members),
                        )
                    })
                    .collect();
                slot.made = Some(made);
                self.world.split_cv.notify_all();
            }
        }
        loop {
            if self.group.aborted.load(Ordering::SeqCst) {
                return Err(Error::Remote(
                    "communicator was aborted during split".into(),
                ));
            }
            let slot = slots
                .get_mut(&slot_key)
                .ok_or_else(|| Error::Internal("split slot vanished".into()))?;
            if let Some(made) = &slot.made {
                let out = color.and_then(|c| made.get(&c).cloned());
                slot.taken += 1;
                if slot.taken == n {
                    slots.remove(&slot_key);
                }
                let me = self.group.members[self.rank];
                return Ok(out.map(|g| {
                    let rank = g
                        .members
                        .iter()
                        .position(|m| *m == me)
                        .expect("member of its own group");
                    self.member_of(g, rank)
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Remote(format!(
                    "split timed out after {:?}: not every rank called split",
                    self.timeout
                )));
            }
            slots = self
                .world
                .split_cv
                .wait_timeout(slots, (deadline - now).min(Duration::from_millis(100)))
                .map_err(|_| Error::Internal("split lock poisoned".into()))?
                .0;
        }
    }

    /// The communicator of `members` (ranks of this one, sorted, this rank among them)
    /// made by them alone: each waits, up to the timeout, for the others to arrive.
    /// Independent of this communicator's state: it works after an abort (a shrink).
    fn group(&self, members: &[usize]) -> Result<Arc<dyn Transport>> {
        let Some(rank) = members.iter().position(|&m| m == self.rank) else {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not among the members {members:?}",
                self.rank
            )));
        };
        let key = (
            self.group.id,
            members.to_vec(),
            self.counts.next_made(members),
        );
        let g = self.world.meetings.group(key, self.timeout, || {
            let world: Vec<usize> = members.iter().map(|&m| self.group.members[m]).collect();
            Group::new(self.world.next_id.fetch_add(1, Ordering::SeqCst), world)
        })?;
        Ok(self.member_of(g, rank))
    }

    /// The ranks that take part in this census: every live rank calls it (after a
    /// failure, whatever this communicator's state); it closes when every rank arrived
    /// or one timeout after the first arrival, and every rank that arrived gets the same
    /// list. A rank arriving after it closed was left out: [`Error::Remote`].
    fn survivors(&self) -> Result<Vec<usize>> {
        let key = (self.group.id, self.counts.next_census());
        self.world
            .meetings
            .census(key, self.size(), self.rank, self.timeout)
    }

    fn traffic(&self) -> Option<Arc<Traffic>> {
        Some(self.world.traffic.clone())
    }

    fn abort(&self) {
        self.group.abort();
        self.world.split_cv.notify_all();
    }
}

impl P2p for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.members.len()
    }
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.count_send(peer, data.len());
        self.mailbox(peer, self.rank)
            .push(Msg::Eager(data.to_vec()))
    }
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.receive(peer, data.len(), |b| data.copy_from_slice(b))
    }
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
        self.check_peer(dst)?;
        self.check_peer(src)?;
        self.post_then(&[(dst, send)], || {
            self.receive(src, recv.len(), |b| recv.copy_from_slice(b))
        })
    }
    fn sendrecv_reduce(
        &self,
        dst: usize,
        send: &[u8],
        src: usize,
        fold: Fold<'_>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_peer(dst)?;
        self.check_peer(src)?;
        self.post_then(&[(dst, send)], || match fold {
            Fold::Pair { out, local } => {
                self.receive(src, out.len(), |b| reduce_pair(out, b, local, dtype, op))
            }
            Fold::Into(acc) => self.receive(src, acc.len(), |b| reduce_into(acc, b, dtype, op)),
            Fold::After { out, local } => {
                self.receive(src, out.len(), |b| reduce_pair(out, local, b, dtype, op))
            }
        })
    }
    fn exchange(&self, sends: &[(usize, &[u8])], recvs: &mut [(usize, &mut [u8])]) -> Result<()> {
        for p in sends.iter().map(|s| s.0).chain(recvs.iter().map(|r| r.0)) {
            self.check_peer(p)?;
        }
        self.post_then(sends, || {
            recvs.iter_mut().try_for_each(|(peer, data)| {
                self.receive(*peer, data.len(), |b| data.copy_from_slice(b))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    //! The mailboxes between threads (also run under Miri: scripts/miri).
    use super::*;

    fn pair(timeout_ms: u64) -> Vec<LocalTransport> {
        let topo = Topology::parse("nodes:1x3").unwrap();
        LocalTransport::world(&topo, Duration::from_millis(timeout_ms))
    }

    #[test]
    fn messages_arrive_in_order_between_threads() {
        let mut ts = pair(5_000);
        let t2 = ts.pop().unwrap();
        let t1 = ts.pop().unwrap();
        let t0 = ts.pop().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..4u8 {
                    t0.send(1, &[i; 3]).unwrap();
                }
                let mut b = [0u8; 2];
                t0.recv(2, &mut b).unwrap();
                assert_eq!(b, [9, 9]);
            });
            s.spawn(|| {
                for i in 0..4u8 {
                    let mut b = [0u8; 3];
                    t1.recv(0, &mut b).unwrap();
                    assert_eq!(b, [i; 3]);
                }
            });
            s.spawn(|| t2.send(0, &[9, 9]).unwrap());
        });
        let tr = t0.traffic().unwrap();
        assert_eq!(tr.snapshot().bytes.iter().sum::<u64>(), 4 * 3 + 2);
    }

    #[test]
    fn split_abort_and_timeout() {
        let ts = pair(300);
        let subs: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ts
                .iter()
                .map(|t| s.spawn(move || t.split((t.rank() != 1).then_some(7), 0).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(subs[1].is_none());
        let (a, b) = (subs[0].as_ref().unwrap(), subs[2].as_ref().unwrap());
        assert_eq!(
            (a.size(), a.rank(), b.rank(), b.world_rank(1)),
            (2, 0, 1, 2)
        );
        // A wrong length is a usage error; a missing sender a timeout; abort wakes a waiter.
        a.send(1, &[1, 2, 3]).unwrap();
        let mut two = [0u8; 2];
        assert!(matches!(b.recv(0, &mut two), Err(Error::InvalidUsage(_))));
        assert!(matches!(b.recv(0, &mut two), Err(Error::Remote(_))));
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let mut one = [0u8; 1];
                a.recv(1, &mut one)
            });
            b.abort();
            assert!(matches!(w.join().unwrap(), Err(Error::Remote(m)) if m.contains("aborted")));
        });
        assert!(matches!(a.send(1, &[0]), Err(Error::Remote(_))));
        // The world itself is untouched by the sub-communicator's abort.
        ts[0].send(1, &[5]).unwrap();
        let mut one = [0u8; 1];
        ts[1].recv(0, &mut one).unwrap();
        assert_eq!(one, [5]);
    }

    #[test]
    fn lent_steps_move_once_and_fail_cleanly() {
        let n = LEND_MIN + 3;
        let big = |v: u8| vec![v; n];
        // A ring step in both directions at once: each side reads the other's loan.
        let ts = pair(2_000);
        std::thread::scope(|s| {
            for t in &ts[..2] {
                s.spawn(move || {
                    let other = 1 - t.rank();
                    let mut got = vec![0u8; n];
                    t.sendrecv(other, &big(t.rank() as u8 + 1), other, &mut got)
                        .unwrap();
                    assert_eq!(got, big(other as u8 + 1));
                    let mut acc = big(10);
                    let fold = Fold::Into(&mut acc);
                    t.sendrecv_reduce(other, &big(1), other, fold, DataType::U8, ReduceOp::Sum)
                        .unwrap();
                    assert_eq!(acc, big(11));
                });
            }
        });
        // A lent step nobody takes times out, and the late receiver is told the sender
        // withdrew it; a lent step of the wrong length is a usage error.
        let ts = pair(100);
        let mut one = vec![0u8; n];
        let e = ts[0].sendrecv(1, &big(1), 2, &mut one).unwrap_err();
        assert!(matches!(e, Error::Remote(_)), "{e}");
        assert!(ts[1]
            .recv(0, &mut one)
            .unwrap_err()
            .to_string()
            .contains("withdrew"));
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut short = vec![0u8; n - 1];
                let e = ts[1].recv(0, &mut short).unwrap_err();
                assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
            });
            let e = ts[0].sendrecv(1, &big(2), 2, &mut one).unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e}");
        });
    }
}
