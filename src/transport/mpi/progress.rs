//! Driving transfers to completion: polling, backoff, the timeout.

#![forbid(unsafe_code)]

use super::comm::RawComm;
use super::recv::RecvOp;
use super::request::{request_null, Poll, Req};
use super::send::SendOp;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One operation in flight.
pub(super) enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

impl Op {
    pub(super) fn peer(&self) -> usize {
        match self {
            Op::Send(s) => s.peer,
            Op::Recv(r) => r.peer,
        }
    }

    /// True while a request of this op is posted (not merely waiting to match).
    pub(super) fn transferring(&self) -> bool {
        match self {
            Op::Send(s) => {
                !s.first.is_null() || s.more.iter().any(|r| !r.is_null()) || s.unposted()
            }
            Op::Recv(r) => r.transferring(),
        }
    }

    /// Best-effort retire; false when a request had to be abandoned to MPI.
    pub(super) fn cancel(&mut self) -> bool {
        match self {
            Op::Send(s) => s.cancel(),
            Op::Recv(r) => r.cancel(),
        }
    }
}

/// What [`drive`] needs of a transport: its communicator and abort flag, the timeout,
/// and who is who (for the timeout's message).
pub(super) struct Link<'a> {
    pub comm: &'a RawComm,
    pub aborted: &'a AtomicBool,
    pub timeout: Duration,
    pub rank: usize,
    pub members: &'a [usize],
}

/// Poll `ops` until all complete. The deadline restarts on progress. On timeout or
/// abort the pending ones are cancelled (`mark_broken` when one cannot be); an error of
/// one op lets the others finish.
pub(super) fn drive(link: &Link, ops: &mut [Op], mark_broken: impl Fn(&Error)) -> Result<()> {
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
                Op::Send(s) => s.feed(&link.comm).and_then(|fed| {
                    s.poll().map(|p| match p {
                        Poll::Idle if fed => Poll::Progress,
                        p => p,
                    })
                }),
                Op::Recv(r) => r.poll(&link.comm),
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
                        mark_broken(&e);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        if done.iter().all(|d| *d) {
            return first_err.map_or(Ok(()), Err);
        }
        let stop = if link.aborted.load(Ordering::SeqCst) {
            Some(Error::Remote("communicator was aborted".into()))
        } else if !progressed
            && *deadline.get_or_insert_with(|| Instant::now() + link.timeout) <= Instant::now()
        {
            let peer = ops
                .iter()
                .zip(done.iter())
                .find(|(_, d)| !**d)
                .map(|(o, _)| o.peer())
                .unwrap_or(0);
            Some(Error::Remote(format!(
                "rank {} (world rank {}) waited {:?} for rank {peer} (world rank {}): peer dead, stalled or not calling the same collective",
                link.rank, link.members[link.rank], link.timeout, link.members[peer]
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
                mark_broken(&e);
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

/// Polls spun before the first yield: a peer on another core answers within a few
/// microseconds, and a yield (a system call) costs as much again. None when this
/// host runs more ranks of the job than it has cores
/// ([`crate::memory::loan::may_spin`]: the launcher's local size): a spinning rank
/// would then hold the core its peer needs.
pub(super) fn spin_polls() -> u32 {
    if crate::memory::loan::may_spin() {
        64
    } else {
        0
    }
}

/// Idle polls of a posted transfer between two yields.
pub(super) const TRANSFER_YIELD_EVERY: u32 = 32;

/// Wait between polls: spin briefly ([`spin_polls`]), then yield (ranks may share
/// cores). While a transfer is posted, MPI needs frequent progress calls (pipelined
/// protocols move a fragment per call, and a rendezvous waits for the peer's next
/// call), so it keeps polling, yielding every [`TRANSFER_YIELD_EVERY`] polls; while only waiting
/// for a message to arrive, it sleeps after 1024 yields, in steps growing to 1 ms.
pub(super) fn backoff(idle_rounds: u32, transferring: bool) {
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
pub(super) fn wait_collective(
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
