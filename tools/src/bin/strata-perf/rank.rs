//! Running one rank: the timed loop of one row (warm-up, meet, back-to-back calls,
//! traffic snapshots), the checked call against the exact reference, and how the ranks
//! meet (a process-local fence for threads, a collective barrier for MPI).

use crate::sweep::{Plan, Row};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use strata::check::{self, QuantCheck};
use strata::traffic::TrafficMatrix;
use strata::{Algo, Buffer, Comm, DataType, Error, Op, ReduceOp, Request, Result};

/// Elements of the seeded pattern that fills timing buffers (repeated).
const PATTERN: usize = 4096;

/// What one rank measured for one row.
#[derive(Debug, Clone)]
pub(crate) struct RankRow {
    /// Microseconds per call on this rank.
    pub(crate) time_us: f64,
    /// Wrong elements on this rank (0 when unchecked).
    pub(crate) wrong: u64,
    /// Error statistics of a checked quantized row (None: exact algo or unchecked).
    pub(crate) err: Option<ErrStats>,
    /// Traffic of the timed loop, where this rank accounts for it (local: rank 0's view
    /// of the whole world; mpi: every rank, its own row).
    pub(crate) traffic: Option<TrafficMatrix>,
}

/// Error statistics of a checked quantized call against the exact f64 result, in a form
/// that combines over ranks: the largest error, the SUM of squared errors and the number
/// of elements (so the RMS over all ranks' elements is sqrt(Σ sumsq / Σ n), not an
/// average of per-rank RMS values), and the format's per-element bound.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ErrStats {
    pub(crate) max: f64,
    pub(crate) sumsq: f64,
    pub(crate) n: u64,
    pub(crate) bound: f64,
}

impl ErrStats {
    fn of(q: &QuantCheck) -> ErrStats {
        ErrStats {
            max: q.max_err,
            // QuantCheck's RMS is sqrt(sumsq / count) over this rank's elements.
            sumsq: q.rms_err * q.rms_err * q.count as f64,
            n: q.count as u64,
            bound: q.bound,
        }
    }

    /// Both ranks' elements together (a NaN anywhere stays NaN).
    pub(crate) fn merge(self, o: ErrStats) -> ErrStats {
        let max = |a: f64, b: f64| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        };
        ErrStats {
            max: max(self.max, o.max),
            sumsq: self.sumsq + o.sumsq,
            n: self.n + o.n,
            bound: max(self.bound, o.bound),
        }
    }

    pub(crate) fn rms(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.sumsq / self.n as f64).sqrt()
        }
    }
}

/// How the ranks meet around the timed loop and snapshot traffic.
pub(crate) trait Pace {
    /// After the warm-up: meet, and snapshot the counters before the loop.
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>>;
    /// After the loop's calls were waited: snapshot the counters.
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>>;
}

/// A process-local barrier for the threads of a local world: moves no bytes, gives up
/// after `timeout`, and can be aborted when a rank fails (std's Barrier can do neither).
pub(crate) struct Fence {
    n: usize,
    timeout: Duration,
    state: Mutex<FenceState>,
    cv: Condvar,
}

#[derive(Default)]
struct FenceState {
    arrived: usize,
    generation: u64,
    aborted: Option<String>,
}

impl Fence {
    pub(crate) fn new(n: usize, timeout: Duration) -> Fence {
        Fence {
            n,
            timeout,
            state: Mutex::new(FenceState::default()),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn wait(&self) -> Result<()> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &g.aborted {
            return Err(Error::Remote(format!("another rank failed ({why})")));
        }
        let gen = g.generation;
        g.arrived += 1;
        if g.arrived == self.n {
            g.arrived = 0;
            g.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        while g.generation == gen {
            if let Some(why) = &g.aborted {
                return Err(Error::Remote(format!("another rank failed ({why})")));
            }
            let now = Instant::now();
            if now >= deadline {
                let msg = format!("waited {:?} for the other ranks at a barrier", self.timeout);
                g.aborted.get_or_insert_with(|| msg.clone());
                self.cv.notify_all();
                return Err(Error::Remote(msg));
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    pub(crate) fn abort(&self, why: &str) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.aborted.get_or_insert_with(|| why.to_string());
        self.cv.notify_all();
    }
}

pub(crate) struct LocalPace {
    pub(crate) fence: Arc<Fence>,
}

impl LocalPace {
    fn snapshot(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.fence.wait()?;
        let snap = if comm.rank() == 0 {
            comm.traffic().map(|t| t.snapshot())
        } else {
            None
        };
        self.fence.wait()?;
        Ok(snap)
    }
}

impl Pace for LocalPace {
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.snapshot(comm)
    }
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.snapshot(comm)
    }
}

pub(crate) struct MpiPace;

impl Pace for MpiPace {
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        comm_barrier(comm)?;
        Ok(comm.traffic().map(|t| t.snapshot()))
    }
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        Ok(comm.traffic().map(|t| t.snapshot()))
    }
}

/// A barrier on the communicator: a waited 1-element all-reduce.
pub(crate) fn comm_barrier(comm: &Comm) -> Result<()> {
    let b = Buffer::zeroed(4);
    let op = Op::AllReduce {
        send: b.clone(),
        recv: b,
        count: 1,
        op: ReduceOp::Sum,
    };
    comm.submit(Request::new(op, DataType::F32).with_algo(Algo::Ring))?
        .wait()
}

/// Every rank's `data` (same length everywhere), rank-major.
pub(crate) fn all_gather_bytes(comm: &Comm, data: &[u8]) -> Result<Vec<u8>> {
    let send = Buffer::from_bytes(data);
    let recv = Buffer::zeroed(data.len() * comm.size());
    let op = Op::AllGather {
        send,
        recv: recv.clone(),
        count: data.len(),
    };
    comm.submit(Request::new(op, DataType::U8).with_algo(Algo::Ring))?
        .wait()?;
    recv.to_bytes()
}

/// A buffer of `elems` elements filled with a repeated seeded pattern (realistic values
/// without computing a reference value per element).
/// On GPU transports the buffer is device memory (filled from the host once).
fn patterned(comm: &Comm, dtype: DataType, rank: usize, elems: usize) -> Result<Buffer> {
    let b = Buffer::alloc(dtype, elems)?;
    if elems > 0 {
        let pat = check::fill(dtype, rank, 0, elems.min(PATTERN), 0x5eed);
        let mut w = b.write()?;
        for chunk in w.chunks_mut(pat.len()) {
            chunk.copy_from_slice(&pat[..chunk.len()]);
        }
    }
    match comm.device() {
        None => Ok(b),
        Some(_) => comm.native_from(&b.to_bytes()?),
    }
}

/// The request of one timed call, on buffers allocated once for the row.
fn timed_request(comm: &Comm, row: &Row, algo: Algo, p: usize, rank: usize) -> Result<Request> {
    let s = row.dtype.size();
    let redop = row.redop.unwrap_or(ReduceOp::Sum);
    let (ns, nr) = row.kind.sizes(row.count, p);
    let send = patterned(comm, row.dtype, rank, ns)?;
    let recv_bytes = nr
        .checked_mul(row.dtype.size())
        .ok_or_else(|| Error::InvalidArgument(format!("{nr} x {} overflows", row.dtype)))?;
    let recv = comm.alloc_native(recv_bytes)?;
    let op = match &row.counts {
        None => row.kind.op(send, recv, row.count, redop),
        Some(counts) => {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            let (mut so, mut ro) = (0, 0);
            for &c in counts {
                let (cs, cr) = row.kind.sizes(c, p);
                sends.push(send.slice(so..so + cs * s)?);
                recvs.push(recv.slice(ro..ro + cr * s)?);
                so += cs * s;
                ro += cr * s;
            }
            row.kind.coalesced(sends, recvs, counts.clone(), redop)?
        }
    };
    let req = Request::new(op, row.dtype).with_algo(algo);
    Ok(match row.quant {
        Some(q) => req.with_quant(q),
        None => req,
    })
}

/// Wait for every handle; the first error, if any.
fn wait_all(works: &[strata::Work]) -> Result<()> {
    let mut first = Ok(());
    for w in works {
        let r = w.wait();
        if first.is_ok() {
            first = r;
        }
    }
    first
}

pub(crate) fn bench_row(comm: &Comm, plan: &Plan, row: &Row, pace: &dyn Pace) -> Result<RankRow> {
    let (p, r) = (comm.size(), comm.rank());
    let algo = row.algo.strata().ok_or_else(|| {
        Error::Internal("the mpi baseline's rows run in crate::baseline, not on strata".into())
    })?;
    let req = timed_request(comm, row, algo, p, r)?;
    for _ in 0..plan.warmup {
        comm.call(req.clone())?;
    }
    let before = pace.before(comm)?;
    let t0 = Instant::now();
    let mut works = Vec::with_capacity(if plan.blocking { 0 } else { plan.iters });
    if plan.blocking {
        for _ in 0..plan.iters {
            comm.call(req.clone())?;
        }
    } else {
        for _ in 0..plan.iters {
            works.push(comm.submit(req.clone())?);
        }
        wait_all(&works)?;
    }
    let elapsed = t0.elapsed();
    let after = pace.after(comm)?;
    drop(works);
    drop(req); // free the timing buffers before the checked call allocates its own
    let traffic = match (before, after) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        _ => None,
    };
    let redop = row.redop.unwrap_or(ReduceOp::Sum);
    let (wrong, err) = match (plan.check, row.quant, &row.counts) {
        (false, _, _) => (0, None),
        // Quantized: wrong = elements outside the format's bound of the exact result.
        (true, Some(q), _) => {
            let case = check::QuantCase {
                kind: row.kind,
                dtype: row.dtype,
                redop,
                count: row.count,
                algo,
                q,
                seed: row.seed,
            };
            let c = check::run_checked_quant(comm, &case)?;
            (c.wrong, Some(ErrStats::of(&c)))
        }
        (true, None, None) => (
            check::run_checked(
                comm, row.kind, row.dtype, redop, row.count, algo, false, row.seed,
            )?,
            None,
        ),
        (true, None, Some(counts)) => (
            check::run_checked_coalesced(comm, row.kind, row.dtype, redop, counts, algo, row.seed)?,
            None,
        ),
    };
    Ok(RankRow {
        time_us: elapsed.as_secs_f64() * 1e6 / plan.iters as f64,
        wrong: wrong as u64,
        err,
        traffic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_statistics_combine_sums_of_squares() {
        // Rank a: 1 element with error 1; rank b: 3 elements with errors 3, 3, 3.
        let a = ErrStats::of(&QuantCheck {
            wrong: 0,
            max_err: 1.0,
            rms_err: 1.0,
            bound: 4.0,
            count: 1,
        });
        let b = ErrStats::of(&QuantCheck {
            wrong: 0,
            max_err: 3.0,
            rms_err: 3.0,
            bound: 4.0,
            count: 3,
        });
        let m = a.merge(b);
        assert_eq!((m.max, m.n, m.bound), (3.0, 4, 4.0));
        // sqrt((1 + 27) / 4), not the mean of the per-rank RMS values (2).
        assert!((m.rms() - 7f64.sqrt()).abs() < 1e-12);
        assert_eq!(ErrStats::default().rms(), 0.0);
        let nan = ErrStats { max: f64::NAN, ..a };
        assert!(a.merge(nan).max.is_nan());
    }
}
