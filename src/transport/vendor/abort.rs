//! The abort protocol: the use count that defers `ncclCommAbort` / `ncclCommDestroy`
//! until no call is inside the communicator ([`UseCount`], generic and tested without a
//! library), the communicator's guards ([`InUse`], [`AbortHandle`]), and the helper
//! thread with a timeout that calls which may block forever run on ([`within`]).

use super::loader::{RawComm, VendorLib};
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How a [`UseCount`]ed value ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Stop everything in flight (`ncclCommAbort`).
    Abort,
    /// Release it normally (`ncclCommDestroy`), when its owner is dropped.
    Destroy,
}

/// What ends a [`UseCount`]ed value, called exactly once, with no guard alive.
pub trait Teardown<T>: Send + Sync {
    /// End `value` the way `how` says.
    fn teardown(&self, value: T, how: Ending) -> Result<()>;
}

impl<T, F: Fn(T, Ending) -> Result<()> + Send + Sync> Teardown<T> for F {
    fn teardown(&self, value: T, how: Ending) -> Result<()> {
        self(value, how)
    }
}

/// A value (a vendor communicator handle) shared by threads that use it and threads
/// that may end it: [`UseCount::enter`] hands out guards; [`UseCount::end`] refuses new
/// guards at once and runs the teardown when the last guard is dropped (at once when
/// none is alive). The teardown runs exactly once, never while a guard is alive.
pub struct UseCount<T, C> {
    state: Mutex<UseState<T>>,
    teardown: C,
}

struct UseState<T> {
    /// `None` once torn down.
    value: Option<T>,
    /// Guards alive.
    users: usize,
    /// The requested ending and why (the first request; an abort overrides a pending
    /// destroy).
    ending: Option<(Ending, String)>,
}

impl<T: Copy, C: Teardown<T>> UseCount<T, C> {
    /// `value`, to be ended by `teardown`.
    pub fn new(value: T, teardown: C) -> Arc<UseCount<T, C>> {
        Arc::new(UseCount {
            state: Mutex::new(UseState {
                value: Some(value),
                users: 0,
                ending: None,
            }),
            teardown,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UseState<T>> {
        // The state is updated in single statements, never across a panic: a poisoned
        // lock still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A guard for one use of the value, or, once an ending was requested, why not.
    pub fn enter(self: &Arc<Self>) -> std::result::Result<Use<T, C>, String> {
        let mut s = self.lock();
        if let Some((_, why)) = &s.ending {
            return Err(why.clone());
        }
        let Some(value) = s.value else {
            return Err("already released".into());
        };
        s.users += 1;
        Ok(Use {
            owner: self.clone(),
            value,
        })
    }

    /// Request the ending `how` because of `why`: later [`UseCount::enter`]s fail with
    /// `why`. `Some` with the teardown's result when it ran now (no guard alive); `None`
    /// when it is deferred to the last guard's drop, or an ending was already requested
    /// (an abort still replaces a pending destroy).
    pub fn end(&self, how: Ending, why: &str) -> Option<Result<()>> {
        let mut s = self.lock();
        match &s.ending {
            None => s.ending = Some((how, why.to_string())),
            Some((Ending::Destroy, _)) if how == Ending::Abort && s.value.is_some() => {
                s.ending = Some((how, why.to_string()))
            }
            Some(_) => return None,
        }
        if s.users > 0 {
            return None;
        }
        let value = s.value.take()?;
        drop(s);
        Some(self.teardown.teardown(value, how))
    }

    /// Guards alive now.
    pub fn users(&self) -> usize {
        self.lock().users
    }

    /// Why an ending was requested, once one was.
    pub fn ended(&self) -> Option<String> {
        self.lock().ending.as_ref().map(|(_, w)| w.clone())
    }

    /// True once the teardown has run.
    pub fn torn_down(&self) -> bool {
        self.lock().value.is_none()
    }

    fn leave(&self) {
        let mut s = self.lock();
        s.users -= 1;
        if s.users > 0 {
            return;
        }
        let Some((how, _)) = s.ending else {
            return;
        };
        let Some(value) = s.value.take() else {
            return;
        };
        drop(s);
        if let Err(e) = self.teardown.teardown(value, how) {
            tracing::warn!("deferred {how:?} after the last call left: {e}");
        }
    }
}

/// One use of a [`UseCount`]ed value: the value cannot be torn down while this lives.
pub struct Use<T: Copy, C: Teardown<T>> {
    owner: Arc<UseCount<T, C>>,
    value: T,
}

impl<T: Copy, C: Teardown<T>> Use<T, C> {
    /// The value.
    pub fn get(&self) -> T {
        self.value
    }
}

impl<T: Copy, C: Teardown<T>> Drop for Use<T, C> {
    fn drop(&mut self) {
        self.owner.leave()
    }
}

/// An `ncclComm_t` that may move between threads.
#[derive(Clone, Copy)]
pub(super) struct CommPtr(RawComm);

// SAFETY: an ncclComm_t is a handle the library lets any thread use; who may use it when
// is what `UseCount` and the callers' guards decide.
unsafe impl Send for CommPtr {}
// SAFETY: as above; `&CommPtr` only copies the handle.
unsafe impl Sync for CommPtr {}

/// `ncclCommAbort` / `ncclCommDestroy` of a communicator of the library.
pub(super) struct Ender<'a>(&'a VendorLib);

impl Teardown<CommPtr> for Ender<'_> {
    fn teardown(&self, c: CommPtr, how: Ending) -> Result<()> {
        let lib = self.0;
        // SAFETY: `UseCount` calls this once, with the live handle, when no guard is
        // alive: no call of strata is inside the library on it, and nothing uses it
        // afterwards (later calls fail at `enter`). NCCL makes the communicator's device
        // current itself and restores the caller's.
        match how {
            Ending::Abort => lib.check(unsafe { (lib.sys.ncclCommAbort)(c.0) }, "ncclCommAbort"),
            Ending::Destroy => {
                lib.check(unsafe { (lib.sys.ncclCommDestroy)(c.0) }, "ncclCommDestroy")
            }
        }
    }
}

pub(super) type Shared<'a> = UseCount<CommPtr, Ender<'a>>;

/// The use count of the communicator `raw` of `lib`, ended by its abort or destroy.
pub(super) fn shared(lib: &VendorLib, raw: RawComm) -> Arc<Shared<'_>> {
    UseCount::new(CommPtr(raw), Ender(lib))
}

/// A use guard of a [`VendorComm`](super::VendorComm)
/// ([`VendorComm::enter`](super::VendorComm::enter)): while it lives, the communicator
/// is not aborted nor destroyed (an abort requested meanwhile runs when the last guard
/// drops). Hold one across `ncclGroupStart` .. `ncclGroupEnd` for every communicator a
/// group enqueues on.
pub struct InUse<'a>(pub(super) Use<CommPtr, Ender<'a>>);

impl InUse<'_> {
    pub(super) fn raw(&self) -> RawComm {
        self.0.get().0
    }
}

/// Aborts a [`VendorComm`](super::VendorComm) from any thread, without its lock: marks
/// it aborted at once and runs `ncclCommAbort` when no call is inside it.
#[derive(Clone)]
pub struct AbortHandle<'a> {
    pub(super) shared: Arc<Shared<'a>>,
}

impl AbortHandle<'_> {
    /// [`AbortHandle::abort_for`] with a generic reason.
    pub fn abort(&self) -> Result<()> {
        self.abort_for("ncclCommAbort was requested")
    }

    /// Mark the communicator aborted because of `why` (later calls fail with an
    /// `Error::Remote` naming it) and `ncclCommAbort` it: now when no call is inside
    /// (its result is returned), else when the last call leaves (`Ok` now). Once: later
    /// aborts, and the communicator's drop, do nothing.
    pub fn abort_for(&self, why: &str) -> Result<()> {
        self.shared.end(Ending::Abort, why).unwrap_or(Ok(()))
    }

    /// True once an abort (or the drop) was requested.
    pub fn is_aborted(&self) -> bool {
        self.shared.ended().is_some()
    }
}

/// A helper's result slot for [`within`].
struct Slot<T> {
    value: Option<T>,
    /// The helper returned (`value` set) or panicked (`value` left empty).
    done: bool,
    /// The caller stopped waiting: the helper hands its late result to `late`.
    gone: bool,
}

/// Run `f` on a helper thread and wait for it at most `timeout`: `None` past it. The
/// helper is then left to finish on its own and hands what it returns to `late` (a
/// communicator the library completes after its caller gave up is aborted there).
pub(super) fn within<T: Send + 'static>(
    timeout: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<Option<T>> {
    let slot = Arc::new((
        Mutex::new(Slot {
            value: None,
            done: false,
            gone: false,
        }),
        Condvar::new(),
    ));
    let theirs = slot.clone();
    std::thread::Builder::new()
        .name(format!("strata-{what}"))
        .spawn(move || {
            let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
            let (m, cv) = &*theirs;
            let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
            if s.gone {
                drop(s);
                if let Some(v) = v {
                    late(v);
                }
                return;
            }
            s.value = v;
            s.done = true;
            cv.notify_all();
        })
        .map_err(|e| Error::System(format!("{what}: spawning a helper thread: {e}")))?;
    let (m, cv) = &*slot;
    let s = m.lock().unwrap_or_else(|e| e.into_inner());
    let (mut s, _) = cv
        .wait_timeout_while(s, timeout, |s| !s.done)
        .unwrap_or_else(|e| e.into_inner());
    if !s.done {
        s.gone = true;
        return Ok(None);
    }
    match s.value.take() {
        Some(v) => Ok(Some(v)),
        None => Err(Error::Internal(format!(
            "{what}: the helper thread panicked without a result"
        ))),
    }
}
