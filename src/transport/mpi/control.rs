//! The control communicator: a duplicate of each transport's communicator that carries
//! only the member-only creations and the census. Their messages never meet the data
//! messages (numbered per peer, and out of step after a failed collective), so both
//! work on a communicator a failure aborted or broke: what a shrink needs.
//!
//! Tags: a kind (meeting, census hello, census decision) above 12 bits of a round
//! number, within the 32767 MPI guarantees. A meeting's round is per peer (the
//! meetings two ranks both took part in), a census's per communicator (every survivor
//! takes every census).

use super::comm::{byte_type, RawComm, GROUP_TAG};
use super::progress::backoff;
use super::rc::check;
use super::request::{request_null, retire, Req};
use super::tags::Seqs;
use crate::error::{Error, Result};
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const KIND_MEET: i32 = 0;
const KIND_HELLO: i32 = 1;
const KIND_DECISION: i32 = 2;
const ROUND_BITS: u32 = 12;

fn ctl_tag(kind: i32, round: u32) -> i32 {
    (kind << ROUND_BITS) | (round & ((1 << ROUND_BITS) - 1)) as i32
}

/// Who this rank is, for messages: rank of the communicator and the world rank of each.
pub(super) struct Who<'a> {
    pub(super) rank: usize,
    pub(super) members: &'a [usize],
}

/// A transport's control communicator.
pub(super) struct Control {
    comm: RawComm,
    /// Meetings held with each member.
    met: Seqs,
    censuses: AtomicU32,
    /// One control exchange at a time (their rounds are counted in call order).
    lock: Mutex<()>,
}

impl Control {
    /// Duplicate `comm` (collective over its members, who all just created it).
    pub(super) fn dup(comm: &RawComm) -> Result<Control> {
        let (_, n) = comm.rank_size()?;
        // SAFETY: reading an MPI predefined handle.
        let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: live communicator whose members all call this right after creating it.
        check(
            unsafe { ffi::MPI_Comm_dup(comm.0, &mut raw) },
            "MPI_Comm_dup (control)",
        )?;
        Ok(Control {
            comm: RawComm::adopt(raw)?,
            met: Seqs::new(n),
            censuses: AtomicU32::new(0),
            lock: Mutex::new(()),
        })
    }

    /// An empty message to and from each of `members` but this rank, bounded by
    /// `timeout`: once it returns every member is at the same meeting. A member that
    /// never comes is named (world rank) in the error.
    pub(super) fn meet(&self, who: &Who<'_>, members: &[usize], timeout: Duration) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let peers: Vec<usize> = members.iter().copied().filter(|&m| m != who.rank).collect();
        let mut recvs = Vec::with_capacity(peers.len());
        let mut sends = Vec::with_capacity(peers.len());
        let mut res = Ok(());
        for &p in &peers {
            let round = self.met.get(p);
            self.met.set(p, round.wrapping_add(1));
            let t = ctl_tag(KIND_MEET, round);
            match self.irecv(p, &mut [], t).and_then(|r| {
                recvs.push((p, r));
                self.isend(p, &[], t)
            }) {
                Ok(s) => sends.push(s),
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        if res.is_ok() {
            res = self.wait_all(&mut recvs, timeout).map_err(|missing| {
                let w: Vec<usize> = missing.iter().map(|&p| who.members[p]).collect();
                Error::Remote(format!(
                    "rank {} (world rank {}) waited {timeout:?} for ranks {missing:?} (world ranks \
                     {w:?}): peer dead, stalled or not calling the same creation",
                    who.rank, who.members[who.rank]
                ))
            });
        }
        // Empty messages: nothing to keep alive for a send MPI could not cancel.
        retire(recvs.iter_mut().map(|(_, r)| &mut r.req));
        retire(sends.iter_mut());
        res
    }

    /// The census ([`crate::transport::Transport::survivors`]): every live rank of
    /// `n` calls it, whatever the state of the data communicator. Each rank says hello
    /// to every other and listens for one timeout (or until every rank said it); the
    /// lowest rank it heard leads, and the leader's list of the ranks it heard is the
    /// answer everyone takes. A rank the leader did not hear (it came more than a
    /// timeout late), or that hears no decision within a timeout (its leader died or
    /// chose another), gets an error: never a list the others do not share.
    pub(super) fn census(&self, who: &Who<'_>, timeout: Duration) -> Result<Vec<usize>> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let n = who.members.len();
        let round = self.censuses.fetch_add(1, Ordering::SeqCst);
        let hello = ctl_tag(KIND_HELLO, round);
        let mut recvs = Vec::with_capacity(n);
        let mut sends = Vec::with_capacity(n);
        let mut posted = Ok(());
        for p in (0..n).filter(|&p| p != who.rank) {
            // A peer that is gone may refuse a send: it is simply not heard.
            match self.irecv(p, &mut [], hello) {
                Ok(r) => recvs.push((p, r)),
                Err(e) => posted = Err(e),
            }
            if let Ok(s) = self.isend(p, &[], hello) {
                sends.push(s);
            }
        }
        let missing = match posted {
            Ok(()) => self.wait_all(&mut recvs, timeout).err().unwrap_or_default(),
            Err(e) => {
                retire(recvs.iter_mut().map(|(_, r)| &mut r.req));
                retire(sends.iter_mut());
                return Err(e);
            }
        };
        retire(recvs.iter_mut().map(|(_, r)| &mut r.req));
        retire(sends.iter_mut());
        let heard: Vec<usize> = (0..n).filter(|p| !missing.contains(p)).collect();
        let leader = heard[0];
        let decision = ctl_tag(KIND_DECISION, round);
        if leader == who.rank {
            let list: Vec<u32> = heard.iter().map(|&p| p as u32).collect();
            let bytes: &[u8] = bytemuck::cast_slice(&list);
            let mut out = Vec::with_capacity(heard.len());
            let mut unsent = Vec::new();
            for &p in &heard[1..] {
                match self.isend(p, bytes, decision) {
                    Ok(r) => out.push((p, r)),
                    Err(_) => unsent.push(p),
                }
            }
            let mut late = self.wait_all(&mut out, timeout).err().unwrap_or_default();
            late.extend(unsent);
            if !retire(out.iter_mut().map(|(_, r)| r)) {
                // MPI may still read the list: never free it.
                std::mem::forget(list);
            }
            if !late.is_empty() {
                let w: Vec<usize> = late.iter().map(|&p| who.members[p]).collect();
                return Err(Error::Remote(format!(
                    "census: ranks {late:?} (world ranks {w:?}) said hello but did not take \
                     the decision within {timeout:?}"
                )));
            }
            return Ok(heard);
        }
        let mut list = vec![0u32; n];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut list);
        let mut r = [(leader, self.irecv(leader, bytes, decision)?)];
        let got = self.wait_all(&mut r, timeout);
        let count = if got.is_ok() { r[0].1.count } else { None };
        if !retire(r.iter_mut().map(|(_, r)| &mut r.req)) {
            std::mem::forget(list);
            return Err(Error::Remote(
                "census: the decision's receive could not be retired".into(),
            ));
        }
        let Some(len) = count else {
            return Err(Error::Remote(format!(
                "rank {} (world rank {}) heard ranks {heard:?} in the census but no decision \
                 from rank {leader} within {timeout:?}: it died, or left this rank out",
                who.rank, who.members[who.rank]
            )));
        };
        let alive: Vec<usize> = list[..len / 4].iter().map(|&p| p as usize).collect();
        if !alive.contains(&who.rank) || alive.iter().any(|&p| p >= n) {
            return Err(Error::Remote(format!(
                "rank {} came to the census after it closed: the others went on without it \
                 (ranks {alive:?})",
                who.rank
            )));
        }
        Ok(alive)
    }

    /// `MPI_Comm_create_group` of `members` (ranks, ascending) over the control
    /// communicator. Blocking: call it once every member met ([`Control::meet`]).
    pub(super) fn create_group(&self, members: &[usize]) -> Result<RawComm> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let ranks: Vec<i32> = members
            .iter()
            .map(|&m| i32::try_from(m).map_err(|_| Error::InvalidArgument(format!("rank {m}"))))
            .collect::<Result<_>>()?;
        let n = i32::try_from(ranks.len())
            .map_err(|_| Error::InvalidArgument("too many members".into()))?;
        // SAFETY: reading MPI predefined handles.
        let (mut whole, mut sub, mut raw) = unsafe {
            (
                ffi::RSMPI_GROUP_NULL,
                ffi::RSMPI_GROUP_NULL,
                ffi::RSMPI_COMM_NULL,
            )
        };
        // SAFETY: live communicator; writes one group handle.
        check(
            unsafe { ffi::MPI_Comm_group(self.comm.0, &mut whole) },
            "MPI_Comm_group",
        )?;
        // SAFETY: a live group and `n` valid ranks of it; writes one group handle.
        let incl = check(
            unsafe { ffi::MPI_Group_incl(whole, n, ranks.as_ptr(), &mut sub) },
            "MPI_Group_incl",
        );
        // SAFETY: every member met first and calls this with the same group; only the
        // members take part (the excluded may be dead).
        let made = incl.and_then(|_| {
            check(
                unsafe { ffi::MPI_Comm_create_group(self.comm.0, sub, GROUP_TAG, &mut raw) },
                "MPI_Comm_create_group",
            )
        });
        // SAFETY: freeing the group handles made above (the null handle is skipped).
        unsafe {
            if sub != ffi::RSMPI_GROUP_NULL {
                ffi::MPI_Group_free(&mut sub);
            }
            ffi::MPI_Group_free(&mut whole);
        }
        made?;
        RawComm::adopt(raw)
    }

    fn isend(&self, peer: usize, data: &[u8], tag: c_int) -> Result<Req> {
        // SAFETY: MPI_Isend only reads the buffer, which outlives the request (the
        // callers wait for it or leak it).
        unsafe { self.post(true, data.as_ptr() as *mut c_void, data.len(), peer, tag) }
    }

    fn irecv(&self, peer: usize, data: &mut [u8], tag: c_int) -> Result<Counted> {
        // SAFETY: `data` outlives the request (the callers wait for it or leak it).
        let req = unsafe { self.post(false, data.as_mut_ptr().cast(), data.len(), peer, tag) }?;
        Ok(Counted { req, count: None })
    }

    /// Post the `MPI_Isend` (`send`) or the `MPI_Irecv` of the `len` bytes at `buf` with
    /// `peer`, a rank of the control communicator.
    ///
    /// # Safety
    /// `buf..buf+len` is valid (for writes when receiving) until the request completes.
    unsafe fn post(
        &self,
        send: bool,
        buf: *mut c_void,
        len: usize,
        peer: usize,
        tag: c_int,
    ) -> Result<Req> {
        let mut r = request_null();
        let (len, peer, comm) = (len as c_int, peer as c_int, self.comm.0);
        // SAFETY: the caller's buffer; live communicator; `peer` is a rank of it.
        let (rc, name) = unsafe {
            if send {
                let rc = ffi::MPI_Isend(buf, len, byte_type(), peer, tag, comm, &mut r);
                (rc, "MPI_Isend (control)")
            } else {
                let rc = ffi::MPI_Irecv(buf, len, byte_type(), peer, tag, comm, &mut r);
                (rc, "MPI_Irecv (control)")
            }
        };
        check(rc, name)?;
        Ok(Req(r))
    }

    /// Poll `ops` until all are done or `timeout` passes; Err: the peers not done (a
    /// failed request counts as not done).
    fn wait_all<R: Pollable>(
        &self,
        ops: &mut [(usize, R)],
        timeout: Duration,
    ) -> std::result::Result<(), Vec<usize>> {
        let deadline = Instant::now() + timeout;
        let mut failed = vec![false; ops.len()];
        let mut idle = 0u32;
        loop {
            let mut pending = false;
            for (i, (_, op)) in ops.iter_mut().enumerate() {
                if failed[i] {
                    continue;
                }
                match op.poll() {
                    Ok(true) => {}
                    Ok(false) => pending = true,
                    Err(_) => failed[i] = true,
                }
            }
            if !pending || Instant::now() >= deadline {
                let missing: Vec<usize> = ops
                    .iter_mut()
                    .zip(&failed)
                    .filter(|((_, op), f)| **f || !op.done())
                    .map(|((p, _), _)| *p)
                    .collect();
                return if missing.is_empty() {
                    Ok(())
                } else {
                    Err(missing)
                };
            }
            idle = idle.saturating_add(1);
            backoff(idle, false);
        }
    }
}

/// A receive that remembers how many bytes came.
struct Counted {
    req: Req,
    count: Option<usize>,
}

trait Pollable {
    /// Ok(true) once complete.
    fn poll(&mut self) -> Result<bool>;
    fn done(&self) -> bool;
}

impl Pollable for Req {
    fn poll(&mut self) -> Result<bool> {
        self.test("MPI_Test (control)")
    }
    fn done(&self) -> bool {
        self.is_null()
    }
}

impl Pollable for Counted {
    fn poll(&mut self) -> Result<bool> {
        if self.count.is_some() {
            return Ok(true);
        }
        let c = self.req.test_count("MPI_Test (control)")?;
        self.count = c;
        Ok(c.is_some())
    }
    fn done(&self) -> bool {
        self.count.is_some()
    }
}
