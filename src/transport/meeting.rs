//! Member-only creations and censuses among the rank threads of one process (`local`,
//! `host-local`, `cuda-local`): ranks meet in a shared table, apart from their
//! communicator's messages, so both work after an abort (what a shrink needs).

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// (communicator id, the members' ranks in it, how many such communicators the members
/// made before): the same key on every member of one creation.
pub(crate) type MeetKey = (u64, Vec<usize>, u64);

/// A communicator being made by its members alone: members arrived so far, then the
/// one made, handed to each member once.
struct Made<G> {
    arrived: usize,
    made: Option<G>,
    taken: usize,
}

/// A census of a communicator's live ranks: who arrived before its deadline (one
/// timeout from the first arrival) or until every rank did.
struct Census {
    arrived: Vec<usize>,
    deadline: Instant,
    /// The survivors, once closed (kept: a rank arriving later learns it was left out).
    closed: Option<Vec<usize>>,
}

/// The meeting table of a world (or of one communicator's ranks).
pub(crate) struct Meetings<G> {
    made: Mutex<HashMap<MeetKey, Made<G>>>,
    made_cv: Condvar,
    censuses: Mutex<HashMap<(u64, u64), Census>>,
    census_cv: Condvar,
}

impl<G: Clone> Meetings<G> {
    pub(crate) fn new() -> Meetings<G> {
        Meetings {
            made: Mutex::new(HashMap::new()),
            made_cv: Condvar::new(),
            censuses: Mutex::new(HashMap::new()),
            census_cv: Condvar::new(),
        }
    }

    /// The communicator of `key.1` (`n` members), made by `make` on the last member to
    /// arrive and handed to every member; each waits up to `timeout` for the others.
    /// A member that gives up leaves as if never come (a later attempt starts over).
    pub(crate) fn group(
        &self,
        key: MeetKey,
        timeout: Duration,
        make: impl FnOnce() -> G,
    ) -> Result<G> {
        let n = key.1.len();
        let deadline = Instant::now() + timeout;
        let poisoned = || Error::Internal("group lock poisoned".into());
        let mut slots = self.made.lock().map_err(|_| poisoned())?;
        {
            let slot = slots.entry(key.clone()).or_insert(Made {
                arrived: 0,
                made: None,
                taken: 0,
            });
            slot.arrived += 1;
            if slot.arrived == n {
                slot.made = Some(make());
                self.made_cv.notify_all();
            }
        }
        loop {
            let slot = slots
                .get_mut(&key)
                .ok_or_else(|| Error::Internal("group slot vanished".into()))?;
            if let Some(g) = slot.made.clone() {
                slot.taken += 1;
                if slot.taken == n {
                    slots.remove(&key);
                }
                return Ok(g);
            }
            let now = Instant::now();
            if now >= deadline {
                slot.arrived -= 1;
                if slot.arrived == 0 {
                    slots.remove(&key);
                }
                return Err(Error::Remote(format!(
                    "creating a communicator of ranks {:?}: not every member came within \
                     {timeout:?}",
                    key.1
                )));
            }
            slots = self
                .made_cv
                .wait_timeout(slots, (deadline - now).min(Duration::from_millis(100)))
                .map_err(|_| poisoned())?
                .0;
        }
    }

    /// Census `key` of a communicator of `n` ranks, this being `rank`: it closes when
    /// every rank arrived or one `timeout` after the first arrival, and every rank that
    /// arrived gets the same sorted list. A rank arriving after it closed was left out:
    /// [`Error::Remote`].
    pub(crate) fn census(
        &self,
        key: (u64, u64),
        n: usize,
        rank: usize,
        timeout: Duration,
    ) -> Result<Vec<usize>> {
        let poisoned = || Error::Internal("census lock poisoned".into());
        let mut slots = self.censuses.lock().map_err(|_| poisoned())?;
        let slot = slots.entry(key).or_insert_with(|| Census {
            arrived: Vec::new(),
            deadline: Instant::now() + timeout,
            closed: None,
        });
        if slot.closed.is_some() {
            return Err(Error::Remote(format!(
                "rank {rank} came to the census after it closed: the others went on without it"
            )));
        }
        slot.arrived.push(rank);
        loop {
            let slot = slots
                .get_mut(&key)
                .ok_or_else(|| Error::Internal("census slot vanished".into()))?;
            let now = Instant::now();
            if slot.closed.is_none() && (slot.arrived.len() == n || now >= slot.deadline) {
                let mut alive = slot.arrived.clone();
                alive.sort_unstable();
                slot.closed = Some(alive);
                self.census_cv.notify_all();
            }
            if let Some(alive) = &slot.closed {
                return Ok(alive.clone());
            }
            let wait = (slot.deadline - now).min(Duration::from_millis(100));
            slots = self
                .census_cv
                .wait_timeout(slots, wait)
                .map_err(|_| poisoned())?
                .0;
        }
    }
}

/// Per rank: how many communicators of each member set it made (the third part of a
/// [`MeetKey`]), and how many censuses it took.
#[derive(Default)]
pub(crate) struct Counts {
    made: Mutex<HashMap<Vec<usize>, u64>>,
    censuses: std::sync::atomic::AtomicU64,
}

impl Counts {
    /// The sequence number of this rank's next creation of `members`.
    pub(crate) fn next_made(&self, members: &[usize]) -> u64 {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let n = made.entry(members.to_vec()).or_default();
        *n += 1;
        *n - 1
    }

    /// The sequence number of this rank's next census.
    pub(crate) fn next_census(&self) -> u64 {
        self.censuses
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }
}
