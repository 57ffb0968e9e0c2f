//! `--algo mpi`: the MPI library's own collectives (`MPI_Allgather`,
//! `MPI_Reduce_scatter_block`, `MPI_Allreduce`, `MPI_Alltoall`, `MPI_Bcast`) run through
//! the same sweep as strata's algorithms, so a table holds both and every comparison is a
//! ratio from one run.
//!
//! - On a duplicate of `MPI_COMM_WORLD` (strata's `mpi` transport initialised MPI with
//!   `MPI_THREAD_MULTIPLE`; it is not initialised again), through rsmpi's safe API.
//! - The same row as strata's: buffers allocated once and filled with the same seeded
//!   pattern, out of place (NCCL's layout: `MPI_Bcast` works on the receive buffer, which
//!   the root first fills from its send buffer), `warmup` calls, a barrier, `iters` calls
//!   back to back, time per call = the max over ranks; then, with `-c 1`, one call on the
//!   seeded inputs compared with [`strata::check`]'s exact reference.
//! - Datatypes: f32, i32, i8, u8 natively; f16 / bf16 travel as 16-bit words (all-gather,
//!   all-to-all, broadcast; MPI has no 16-bit float to reduce, refused by the command
//!   line). `avg` is `MPI_SUM` then a division by the rank count in the dtype, as strata's
//!   kernels divide once at the end (integers round to nearest, as the reference does).
//! - MPI's blocking collectives cannot be cancelled or bounded, so a watchdog thread
//!   stands in for strata's timeout: when no call of a row completes within the timeout
//!   (a peer dead, stalled, or not in the same collective), it prints which collective
//!   waited and ends the job with `MPI_Abort`: never a hang.

#[cfg(feature = "mpi")]
pub(crate) use imp::MpiBaseline;
#[cfg(not(feature = "mpi"))]
pub(crate) use stub::MpiBaseline;

#[cfg(not(feature = "mpi"))]
mod stub {
    use crate::rank::RankRow;
    use crate::sweep::{Plan, Row};
    use std::convert::Infallible;
    use strata::{Comm, Error, Result};

    /// The MPI baseline; this build has no MPI.
    pub(crate) struct MpiBaseline {
        never: Infallible,
    }

    impl MpiBaseline {
        pub(crate) fn new(_comm: &Comm) -> Result<MpiBaseline> {
            Err(Error::NotCompiled(
                "the `mpi` baseline needs a build with --features mpi".into(),
            ))
        }
        pub(crate) fn bench_row(&self, _plan: &Plan, _row: &Row) -> Result<RankRow> {
            match self.never {}
        }
    }
}

#[cfg(feature = "mpi")]
mod imp {
    use crate::rank::RankRow;
    use crate::sweep::{reduces, Plan, Row};
    use mpi::collective::SystemOperation;
    use mpi::datatype::Equivalence;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use strata::check::{self, Kind};
    use strata::{Comm, DataType, Error, ReduceOp, Result};

    /// Elements of the seeded pattern that fills timing buffers (as strata's rows).
    const PATTERN: usize = 4096;

    /// An element type MPI moves (and, where `REDUCES`, reduces) natively.
    trait Elem: Equivalence + Copy + Default {
        /// MPI reduces it (false: a 16-bit float carried as a 16-bit word).
        const REDUCES: bool;
        fn from_le(b: &[u8]) -> Self;
        fn put_le(self, out: &mut Vec<u8>);
        /// `avg`'s final division by the rank count.
        fn div(self, p: usize) -> Self;
    }

    macro_rules! elem {
        ($t:ty, $reduces:expr, |$x:ident, $p:ident| $div:expr) => {
            impl Elem for $t {
                const REDUCES: bool = $reduces;
                fn from_le(b: &[u8]) -> Self {
                    <$t>::from_le_bytes(b.try_into().unwrap_or_default())
                }
                fn put_le(self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                fn div(self, $p: usize) -> Self {
                    let $x = self;
                    $div
                }
            }
        };
    }
    elem!(f32, true, |x, p| x / p as f32);
    elem!(i32, true, |x, p| (x as f64 / p as f64).round() as i32);
    elem!(i8, true, |x, p| (x as f64 / p as f64).round() as i8);
    elem!(u8, true, |x, p| (x as f64 / p as f64).round() as u8);
    elem!(u16, false, |x, p| (x as f64 / p as f64).round() as u16);
    elem!(u32, true, |x, p| (x as f64 / p as f64).round() as u32);
    elem!(f64, true, |x, p| x / p as f64);
    elem!(i64, true, |x, p| strata::dtype::int_avg(x as i128, p)
        as i64);
    elem!(u64, true, |x, p| strata::dtype::int_avg(x as i128, p)
        as u64);

    fn typed<T: Elem>(bytes: &[u8]) -> Vec<T> {
        bytes
            .chunks_exact(std::mem::size_of::<T>())
            .map(T::from_le)
            .collect()
    }

    fn bytes_of<T: Elem>(v: &[T]) -> Vec<u8> {
        let mut out = Vec::with_capacity(std::mem::size_of_val(v));
        v.iter().for_each(|x| x.put_le(&mut out));
        out
    }

    /// Ends the job when a row's MPI calls stop completing for longer than the timeout.
    struct Watchdog {
        state: Arc<DogState>,
    }

    struct DogState {
        /// Calls completed (the watchdog looks for movement).
        ticks: AtomicU64,
        busy: AtomicBool,
        stop: AtomicBool,
        /// The collective being waited on, for the message.
        what: Mutex<String>,
    }

    impl Watchdog {
        fn start(rank: usize, timeout: Duration) -> Watchdog {
            let state = Arc::new(DogState {
                ticks: AtomicU64::new(0),
                busy: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                what: Mutex::new(String::new()),
            });
            let s = state.clone();
            std::thread::spawn(move || {
                let nap = (timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(100));
                let (mut seen, mut since) = (u64::MAX, Instant::now());
                while !s.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(nap);
                    let t = s.ticks.load(Ordering::SeqCst);
                    if !s.busy.load(Ordering::SeqCst) || t != seen {
                        (seen, since) = (t, Instant::now());
                        continue;
                    }
                    if since.elapsed() > timeout {
                        let what = s.what.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        eprintln!(
                            "error: rank {rank}: {what} (the `mpi` baseline) did not complete within {timeout:?}: \
                             a peer is dead, stalled or not calling it; MPI's collectives cannot be cancelled, \
                             aborting the MPI job"
                        );
                        SimpleCommunicator::world().abort(1);
                    }
                }
            });
            Watchdog { state }
        }

        fn arm(&self, what: String) {
            *self.state.what.lock().unwrap_or_else(|e| e.into_inner()) = what;
            self.tick();
            self.state.busy.store(true, Ordering::SeqCst);
        }

        fn tick(&self) {
            self.state.ticks.fetch_add(1, Ordering::Relaxed);
        }

        fn disarm(&self) {
            self.state.busy.store(false, Ordering::SeqCst);
        }
    }

    impl Drop for Watchdog {
        fn drop(&mut self) {
            self.state.stop.store(true, Ordering::SeqCst);
        }
    }

    /// MPI's own collectives on a duplicate of `MPI_COMM_WORLD`.
    pub(crate) struct MpiBaseline {
        world: SimpleCommunicator,
        dog: Watchdog,
        rank: usize,
        size: usize,
    }

    impl MpiBaseline {
        /// Collective over the MPI world (every rank's sweep has the baseline's rows):
        /// duplicates `MPI_COMM_WORLD`, on which `comm` (strata's world) must have the
        /// same ranks.
        pub(crate) fn new(comm: &Comm) -> Result<MpiBaseline> {
            if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
                return Err(Error::InvalidUsage(
                    "the `mpi` baseline runs beside strata's mpi transport, which initialises MPI"
                        .into(),
                ));
            }
            let dog = Watchdog::start(comm.rank(), comm.timeout());
            dog.arm("MPI_Comm_dup".into());
            let world = SimpleCommunicator::world().duplicate();
            dog.disarm();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            if (rank, size) != (comm.rank(), comm.size()) {
                return Err(Error::Internal(format!(
                    "MPI_COMM_WORLD has this process as rank {rank} of {size}, strata's world as rank {} of {}",
                    comm.rank(),
                    comm.size()
                )));
            }
            Ok(MpiBaseline {
                world,
                dog,
                rank,
                size,
            })
        }

        /// One row: timed calls and the checked call, as [`crate::rank::bench_row`].
        pub(crate) fn bench_row(&self, plan: &Plan, row: &Row) -> Result<RankRow> {
            match row.dtype {
                DataType::F32 => self.row::<f32>(plan, row),
                DataType::I32 => self.row::<i32>(plan, row),
                DataType::I8 => self.row::<i8>(plan, row),
                DataType::U8 => self.row::<u8>(plan, row),
                DataType::U32 => self.row::<u32>(plan, row),
                DataType::I64 => self.row::<i64>(plan, row),
                DataType::U64 => self.row::<u64>(plan, row),
                DataType::F64 => self.row::<f64>(plan, row),
                DataType::F16 | DataType::BF16 => self.row::<u16>(plan, row),
            }
        }

        fn row<T: Elem>(&self, plan: &Plan, row: &Row) -> Result<RankRow> {
            let (p, r, dt) = (self.size, self.rank, row.dtype);
            if reduces(row.kind) && !T::REDUCES {
                return Err(Error::InvalidUsage(format!(
                    "the `mpi` baseline cannot reduce {dt}: MPI has no 16-bit float type"
                )));
            }
            let redop = row.redop.unwrap_or(ReduceOp::Sum);
            let (ns, nr) = row.kind.sizes(row.count, p);
            if ns.max(nr) > i32::MAX as usize {
                return Err(Error::InvalidArgument(format!(
                    "{} elements exceed MPI's count type (the `mpi` baseline's rows stop at {} elements)",
                    ns.max(nr),
                    i32::MAX
                )));
            }
            let call = |send: &[T], recv: &mut [T]| self.call(row.kind, redop, send, recv);
            self.dog
                .arm(format!("{} ({dt}, {} B)", mpi_name(row.kind), row.bytes));
            let pat = check::fill(dt, r, 0, ns.min(PATTERN), 0x5eed);
            let pat: Vec<T> = typed(&pat);
            let send: Vec<T> = pat.iter().copied().cycle().take(ns).collect();
            let mut recv = vec![T::default(); nr];
            for _ in 0..plan.warmup {
                call(&send, &mut recv);
                self.dog.tick();
            }
            self.world.barrier();
            self.dog.tick();
            let t0 = Instant::now();
            for _ in 0..plan.iters {
                call(&send, &mut recv);
                self.dog.tick();
            }
            let elapsed = t0.elapsed();
            drop((send, recv));
            let wrong = if plan.check {
                let send: Vec<T> = typed(&row.kind.input(dt, r, row.count, p, row.seed));
                let mut recv: Vec<T> = typed(&vec![0xA5; nr * dt.size()]);
                call(&send, &mut recv);
                let want = row.kind.expected(dt, redop, r, row.count, p, row.seed);
                check::count_wrong(dt, &bytes_of(&recv), &want, p) as u64
            } else {
                0
            };
            self.dog.disarm();
            Ok(RankRow {
                time_us: elapsed.as_secs_f64() * 1e6 / plan.iters as f64,
                wrong,
                err: None,
                traffic: None,
            })
        }

        /// One call of MPI's collective for `kind`, out of place.
        fn call<T: Elem>(&self, kind: Kind, redop: ReduceOp, send: &[T], recv: &mut [T]) {
            let op = match redop {
                ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
                ReduceOp::Max => SystemOperation::max(),
                ReduceOp::Min => SystemOperation::min(),
                ReduceOp::Prod => SystemOperation::product(),
            };
            let w = &self.world;
            match kind {
                Kind::AllGather => w.all_gather_into(send, recv),
                Kind::ReduceScatter => w.reduce_scatter_block_into(send, recv, op),
                Kind::AllReduce => w.all_reduce_into(send, recv, op),
                Kind::AllToAll => w.all_to_all_into(send, recv),
                Kind::Broadcast { root } => {
                    if self.rank == root {
                        recv.copy_from_slice(send);
                    }
                    w.process_at_rank(root as i32).broadcast_into(recv);
                }
            }
            if redop == ReduceOp::Avg {
                let p = self.size;
                recv.iter_mut().for_each(|x| *x = x.div(p));
            }
        }
    }

    fn mpi_name(k: Kind) -> &'static str {
        match k {
            Kind::AllGather => "MPI_Allgather",
            Kind::ReduceScatter => "MPI_Reduce_scatter_block",
            Kind::AllReduce => "MPI_Allreduce",
            Kind::AllToAll => "MPI_Alltoall",
            Kind::Broadcast { .. } => "MPI_Bcast",
        }
    }
}
