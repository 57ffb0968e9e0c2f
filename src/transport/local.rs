//! `local`: the ranks of a world are threads of one process (the embedded default and the
//! test bed). Point-to-point messages are copied into per-pair FIFO mailboxes (eager: a
//! send never waits for its receiver), every transfer is recorded in the world's
//! [`Traffic`] counters, and a receive that outlives the timeout or meets an aborted
//! communicator returns an error instead of hanging. While [`Traffic::start_recording`]
//! is on, every send (before it can be received) and every completed receive is also
//! appended to the traffic's event log (the schedule recording of [`crate::sim`]).

#![forbid(unsafe_code)]

use super::{Transport, TransportKind};
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::traffic::{EventKind, Traffic};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a peer of an aborted group sees.
const ABORTED: &str = "communicator was aborted by one of its ranks (abort, a failed collective, \
                       or a thread that panicked holding it)";

#[derive(Default)]
struct Mailbox {
    q: Mutex<VecDeque<Vec<u8>>>,
    cv: Condvar,
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
    split_cv: Condvar,
}

/// A rank of an in-process world.
pub struct LocalTransport {
    world: Arc<World>,
    group: Arc<Group>,
    rank: usize,
    splits: AtomicU64,
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
            split_cv: Condvar::new(),
        });
        let group = Group::new(0, (0..n).collect());
        (0..n)
            .map(|rank| LocalTransport {
                world: world.clone(),
                group: group.clone(),
                rank,
                splits: AtomicU64::new(0),
                timeout,
            })
            .collect()
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
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.members.len()
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
                    Arc::new(LocalTransport {
                        world: self.world.clone(),
                        group: g,
                        rank,
                        splits: AtomicU64::new(0),
                        timeout: self.timeout,
                    }) as Arc<dyn Transport>
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

    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        let n = self.size();
        let b = &self.group.boxes[peer * n + self.rank];
        // Counted before it can be received: "received" implies "counted".
        self.world.traffic.record(
            self.group.members[self.rank],
            self.group.members[peer],
            data.len(),
        );
        self.world.traffic.log(
            EventKind::Send,
            self.group.id,
            self.group.members[self.rank],
            self.group.members[peer],
            data.len(),
        );
        b.q.lock()
            .map_err(|_| Error::Internal("mailbox poisoned".into()))?
            .push_back(data.to_vec());
        b.cv.notify_one();
        Ok(())
    }

    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
        self.check_peer(peer)?;
        let n = self.size();
        let b = &self.group.boxes[self.rank * n + peer];
        let deadline = Instant::now() + self.timeout;
        let mut q =
            b.q.lock()
                .map_err(|_| Error::Internal("mailbox poisoned".into()))?;
        loop {
            if let Some(msg) = q.pop_front() {
                if msg.len() != data.len() {
                    return Err(Error::InvalidUsage(format!(
                        "rank {peer} sent {} bytes where rank {} expected {}: counts or dtypes differ across ranks",
                        msg.len(),
                        self.rank,
                        data.len()
                    )));
                }
                data.copy_from_slice(&msg);
                self.world.traffic.log(
                    EventKind::Recv,
                    self.group.id,
                    self.group.members[peer],
                    self.group.members[self.rank],
                    msg.len(),
                );
                return Ok(());
            }
            if self.group.aborted.load(Ordering::SeqCst) {
                return Err(Error::Remote(ABORTED.into()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Remote(format!(
                    "rank {} waited {:?} for rank {peer}: peer dead, stalled or not calling the same collective",
                    self.rank, self.timeout
                )));
            }
            q =
                b.cv.wait_timeout(q, deadline - now)
                    .map_err(|_| Error::Internal("mailbox poisoned".into()))?
                    .0;
        }
    }

    fn traffic(&self) -> Option<Arc<Traffic>> {
        Some(self.world.traffic.clone())
    }

    fn abort(&self) {
        self.group.abort();
        self.world.split_cv.notify_all();
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
}
