//! The memory bandwidth of the `bound_us` column, measured at start-up: every rank copies
//! a large buffer at the same time as the others (threads of this process on `local`,
//! processes that left a barrier together on `mpi`), and its rate is the bytes it read
//! and wrote per second, best of [`REPS`]; the figure is the mean over ranks (`local`
//! with more ranks than cores: one thread per core copies, and their total rate is
//! divided among the ranks).

use crate::rank::{all_gather_bytes, comm_barrier, Fence};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::{Comm, Error, Result};

/// Timed copies per rank (the best one counts).
const REPS: usize = 3;

/// Bytes each rank copies: large enough to leave the caches (64 MiB at 1-4 ranks), at
/// most 512 MiB over all ranks of the process, never below 8 MiB.
fn copy_bytes(ranks_here: usize) -> usize {
    ((256usize << 20) / ranks_here.max(1)).clamp(8 << 20, 64 << 20)
}

/// One rank's rate (bytes read + written per second): a warm-up copy (page faults),
/// then [`REPS`] timed copies, each after `meet` (all ranks start together).
fn rate(bytes: usize, mut meet: impl FnMut() -> Result<()>) -> Result<f64> {
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let mut best = Duration::MAX;
    for _ in 0..REPS {
        meet()?;
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed());
    }
    Ok(2.0 * bytes as f64 / best.as_secs_f64().max(1e-9))
}

/// `local`: `ranks` threads copy at once; the mean per-thread rate. With more ranks
/// than cores, one thread per core copies and their total is shared by the ranks (what
/// each gets when all are busy), so the memory used stays bounded.
pub(crate) fn local(ranks: usize, timeout: Duration) -> Result<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = ranks.clamp(1, cores);
    let bytes = copy_bytes(threads);
    let fence = Arc::new(Fence::new(threads, timeout));
    let rates: Vec<Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let fence = fence.clone();
                s.spawn(move || {
                    let r = rate(bytes, || fence.wait());
                    if let Err(e) = &r {
                        fence.abort(&e.to_string());
                    }
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Internal("a copy thread panicked".into())))
            })
            .collect()
    });
    let rates = rates.into_iter().collect::<Result<Vec<f64>>>()?;
    Ok(rates.iter().sum::<f64>() / ranks.max(1) as f64)
}

/// `mpi`: every process copies after a barrier on `comm`; the mean over processes
/// (gathered, so every rank returns the same figure).
pub(crate) fn mpi(comm: &Comm) -> Result<f64> {
    let mine = rate(copy_bytes(comm.size()), || comm_barrier(comm))?;
    let all = all_gather_bytes(comm, &mine.to_le_bytes())?;
    let rates: Vec<f64> = all
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    Ok(rates.iter().sum::<f64>() / rates.len().max(1) as f64)
}
