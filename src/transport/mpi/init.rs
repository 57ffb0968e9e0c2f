//! Initialising and finalising MPI, and the process's first peer failure.

use super::rc::check;
use crate::error::{Error, Result};
use mpi::environment::{Threading, Universe};
use mpi::ffi;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The universe strata initialised (dropping it finalises MPI).
pub(super) static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
/// Set once strata finalised MPI (it cannot be initialised again).
pub(super) static FINALIZED: AtomicBool = AtomicBool::new(false);
/// The first peer failure this process saw (a transfer or collective that timed out).
pub(super) static PEER_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Remember that a collective failed (the first message wins). From then on
/// [`finalize`] aborts the MPI job instead of waiting in `MPI_Finalize` for the failed
/// peer.
pub(super) fn note_peer_failure(msg: &str) {
    let mut f = PEER_FAILURE.lock().unwrap_or_else(|e| e.into_inner());
    f.get_or_insert_with(|| msg.to_string());
}

/// Set when this process made a communicator after a peer failure (a shrink: it went
/// on with the survivors).
pub(super) static RECOVERED: AtomicBool = AtomicBool::new(false);

/// This process made a communicator after a peer failure ([`finalize`] then finalises,
/// bounded, instead of aborting).
pub(super) fn note_recovered() {
    RECOVERED.store(true, Ordering::SeqCst);
}

/// How long [`finalize`] waits after a failure before aborting the job.
pub(super) const ABORT_GRACE: Duration = Duration::from_secs(2);

/// The first failure of a collective on an MPI communicator of this process, if any
/// ([`Transport::failed`](crate::transport::Transport::failed): a peer that did not answer within the timeout, dead,
/// stalled or calling another collective; or a communicator aborted mid-collective).
pub fn peer_failure() -> Option<String> {
    PEER_FAILURE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

pub(super) fn universe_lock() -> MutexGuard<'static, Option<Universe>> {
    UNIVERSE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn is_finalized() -> bool {
    FINALIZED.load(Ordering::SeqCst) || mpi::environment::is_finalized()
}

/// Initialise MPI (MPI_THREAD_MULTIPLE) unless this process already did; returns the
/// MPI world size.
/// `MPI_Init` waits for every process of the job: a peer frozen or dead before it
/// joins would hold this process there forever. Past the timeout (`STRATA_TIMEOUT`)
/// the watchdog reports it and aborts the process (not `exit`: MPI is mid-call), so
/// mpirun ends the job. Dropping the sender (init returned) stops the watchdog.
pub(super) fn init_watchdog() -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let timeout = crate::config::env()
        .map(|e| e.timeout)
        .unwrap_or(crate::config::DEFAULT_TIMEOUT);
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
            eprintln!(
                "strata: MPI_Init did not complete within {timeout:?}: a peer process is dead or \
                 stalled before joining the job; aborting this process"
            );
            std::process::abort();
        }
    });
    tx
}

pub(super) fn ensure_init() -> Result<usize> {
    let mut u = universe_lock();
    if FINALIZED.load(Ordering::SeqCst) {
        return Err(Error::InvalidUsage(
            "MPI was finalized by strata::transport::mpi::finalize and cannot be initialised again"
                .into(),
        ));
    }
    if u.is_none() {
        let watchdog = init_watchdog();
        let init = mpi::environment::initialize_with_threading(Threading::Multiple);
        drop(watchdog);
        match init {
            Some((universe, provided)) => {
                // Keep it even when unusable: finalize() must still finalise MPI.
                *u = Some(universe);
                if provided < Threading::Multiple {
                    return Err(Error::System(format!(
                        "the MPI library provides only {provided:?} threading; the mpi transport needs MPI_THREAD_MULTIPLE \
                         (rebuild or configure MPI with thread support)"
                    )));
                }
            }
            None => {
                // Initialised by the host program (or finalised by it).
                if mpi::environment::is_finalized() {
                    return Err(Error::InvalidUsage(
                        "MPI was already finalized by the host program".into(),
                    ));
                }
                let mut provided: c_int = 0;
                // SAFETY: MPI is initialised; out-pointer to a local.
                check(
                    unsafe { ffi::MPI_Query_thread(&mut provided) },
                    "MPI_Query_thread",
                )?;
                // SAFETY: reading an MPI predefined constant.
                if provided < unsafe { ffi::RSMPI_THREAD_MULTIPLE } {
                    return Err(Error::System(
                        "the host program initialised MPI without MPI_THREAD_MULTIPLE; the mpi transport needs it \
                         (call MPI_Init_thread with MPI_THREAD_MULTIPLE, or, with Open MPI, have MPI_Init \
                         ask for it: mpirun -x OMPI_MPI_THREAD_LEVEL=3)"
                            .into(),
                    ));
                }
            }
        }
    }
    drop(u);
    let mut n: c_int = 0;
    // SAFETY: MPI is initialised; out-pointer to a local.
    check(
        unsafe { ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut n) },
        "MPI_Comm_size(MPI_COMM_WORLD)",
    )?;
    Ok(n as usize)
}

/// Finalise MPI when strata initialised it: call once at the end of the program, after
/// every communicator's work is done (OpenMPI reports an error for a process that
/// exits without finalising). Idempotent; does nothing when MPI was never initialised
/// or was initialised by the host program (which then finalises it). Transports that
/// outlive this call must not be used again; dropping them is harmless.
///
/// After a peer failure ([`peer_failure`]) this does not return: `MPI_Finalize`
/// would wait for the failed peer forever, so strata aborts the whole MPI job
/// (`MPI_Abort(MPI_COMM_WORLD, 1)`, what NCCL users and PyTorch's watchdog expect)
/// after printing the failure on stderr and a grace of 2 s (so the other live ranks,
/// among them the ones that waited on the failed peer itself, report what they saw).
/// mpirun then kills every rank, stalled ones included, and exits non-zero. This
/// holds whoever initialised MPI.
///
/// After a failure survived (this process made a communicator after it: a shrink of
/// the survivors, under `mpirun --mca orte_enable_recovery 1`, which keeps the job
/// running when a process dies), it finalises, bounded by the timeout: Open MPI
/// 4.1's `MPI_Finalize` waits forever for a lost peer that is stalled (frozen) and
/// still alive, and was seen waiting after four of eight processes were killed
/// (after one of four it returned). Past the timeout strata aborts the job, which
/// ends a stalled peer too (with recovery enabled mpirun then exits 0, measured,
/// whatever the ranks' status).
pub fn finalize() {
    if peer_failure().is_some() && RECOVERED.load(Ordering::SeqCst) {
        if mpi::environment::is_initialized() && !is_finalized() {
            finalize_bounded();
        }
        return;
    }
    if let Some(why) = peer_failure() {
        if mpi::environment::is_initialized() && !is_finalized() {
            // The ranks that waited on the failed peer itself time out about now too:
            // give them a moment to report it before the job is killed.
            std::thread::sleep(ABORT_GRACE);
            eprintln!(
                "strata: a peer failed ({why}); aborting the MPI job instead of finalizing \
                 (MPI_Finalize would wait for the failed peer)"
            );
            abort_job();
        }
    }
    finalize_now();
}

/// `MPI_Abort(MPI_COMM_WORLD, 1)`; never returns. MPI must be initialised and not
/// finalised (or inside `MPI_Finalize` on another thread).
fn abort_job() -> ! {
    // SAFETY: the caller's contract above; MPI_Abort does not return.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
    }
    std::process::exit(1);
}

/// Finalise MPI if strata initialised it and did not yet.
fn finalize_now() {
    let mut u = universe_lock();
    if let Some(universe) = u.take() {
        FINALIZED.store(true, Ordering::SeqCst);
        drop(universe); // MPI_Finalize
    }
}

/// `MPI_Finalize` after a survived failure, bounded by the timeout (see [`finalize`]).
fn finalize_bounded() {
    let timeout = crate::config::env()
        .map(|e| e.timeout)
        .unwrap_or(crate::config::DEFAULT_TIMEOUT);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
            eprintln!(
                "strata: MPI_Finalize did not complete within {timeout:?} after peers were \
                 lost (it waits for a stalled one still alive, and was seen waiting after \
                 killed ones too); aborting the MPI job to end it"
            );
            // The caller is inside MPI_Finalize, which has not returned.
            abort_job();
        }
    });
    finalize_now();
    drop(tx);
}
