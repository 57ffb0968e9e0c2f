//! Per-call scratch of stream-ordered collectives, and the capturable path.
//!
//! A stream-ordered call ([`crate::runtime::launch`]) runs inside a [`Scope`]: every
//! [`super::DeviceMem::alloc`] made for it on its device (by the algorithm, on any
//! sub-communicator's thread: the scope travels with the call's jobs) takes a block of
//! the communicator's [`Arena`] instead of the device cache. The blocks are held until
//! the call ends and then reused by the next call, so a repeated call allocates nothing
//! and uses the same addresses, which is what a CUDA graph replays.
//!
//! A scope with a [`Scope::stream`] is the **capturable path**: all device work of the
//! call goes onto that one stream (the communicator's, forked from and joined back to
//! the caller's capturing stream with events), nothing waits on the host for the
//! device, and blocks are zeroed on that stream. Without one (the ordinary
//! stream-ordered path) blocks are zeroed on the device's private stream, as the cache
//! does.

#![forbid(unsafe_code)]

use super::{pool::Pool, DevAddr, DevStream, Device, DeviceMem};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One communicator's scratch blocks for its stream-ordered calls.
pub struct Arena {
    dev: Arc<dyn Device>,
    blocks: Mutex<Vec<Block>>,
    next_lease: AtomicU64,
}

struct Block {
    class: usize,
    mem: DeviceMem,
    /// The call holding it (0: free).
    lease: u64,
}

impl Arena {
    /// An empty arena on `dev`.
    pub fn new(dev: &Arc<dyn Device>) -> Arena {
        Arena {
            dev: dev.clone(),
            blocks: Mutex::new(Vec::new()),
            next_lease: AtomicU64::new(1),
        }
    }

    /// A new call's lease number.
    fn lease(&self) -> u64 {
        self.next_lease.fetch_add(1, Ordering::Relaxed)
    }

    /// A block of at least `bytes` for call `lease`: a free one of the size class, else
    /// a new allocation (kept for later calls). Not zeroed.
    fn take(&self, lease: u64, bytes: usize) -> Result<DevAddr> {
        let class = Pool::class(bytes);
        let mut b = self
            .blocks
            .lock()
            .map_err(|_| Error::Internal("arena lock poisoned".into()))?;
        if let Some(blk) = b.iter_mut().find(|k| k.lease == 0 && k.class == class) {
            blk.lease = lease;
            return Ok(blk.mem.addr());
        }
        // A plain (cached) allocation owned by the arena, not zeroed here (the caller
        // clears what it takes in its stream's order), so even a call's first
        // allocation waits for no work of the caller's. A new block of a GPU is
        // allocated in the order of the stream that clears it ([`stream`]); where it
        // cannot be (HIP, a capture) it is cleared on the device's private stream, which
        // is waited for: a host wait outside the launch contract, as the contract allows
        // for a block's first allocation, which no steady-state call makes.
        let mem = super::waits::outside(|| DeviceMem::alloc_uninit(&self.dev, class))?;
        let addr = mem.addr();
        b.push(Block { class, mem, lease });
        Ok(addr)
    }

    /// Call `lease` is over: its blocks are free again.
    fn release(&self, lease: u64) {
        if let Ok(mut b) = self.blocks.lock() {
            b.iter_mut()
                .filter(|k| k.lease == lease)
                .for_each(|k| k.lease = 0);
        }
    }

    /// Bytes held by the arena.
    pub fn bytes(&self) -> usize {
        self.blocks
            .lock()
            .map(|b| b.iter().map(|k| k.class).sum())
            .unwrap_or(0)
    }
}

/// The stream-ordered call a thread is working for. Clones travel with the call's jobs;
/// when the last one is dropped (every job of the call has run) the call's blocks are
/// free for the next call: its device work has run (ordinary path) or is ordered before
/// any later call's on the communicator's capture stream (capturable path).
#[derive(Clone)]
pub struct Scope {
    hold: Arc<Hold>,
    /// The launch stream: the call's own stages go on it, no host waits.
    pub stream: Option<Arc<dyn DevStream>>,
    /// The launched call's communicator (an identity, [`Scope::launch`]): its own native
    /// calls go on the launch stream, other communicators' on their own streams.
    top: usize,
}

/// Side streams and the event after their last work for a call.
type Sides = Vec<(Arc<dyn DevStream>, Arc<dyn super::DevEvent>)>;

struct Hold {
    arena: Arc<Arena>,
    lease: u64,
    /// The side streams the call used, with the event after their last work: joined
    /// back into the launch stream when the call is over.
    sides: Mutex<Sides>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.arena.release(self.lease);
    }
}

impl Scope {
    /// A new call's scope on `arena` (`stream`: the capturable path).
    pub fn new(arena: &Arc<Arena>, stream: Option<Arc<dyn DevStream>>) -> Scope {
        Scope::launch(arena, stream, 0)
    }

    /// A launched call's scope: scratch from `arena`, stages on `stream`, the call made
    /// on the communicator `top` (any identity the caller keeps for it).
    pub fn launch(arena: &Arc<Arena>, stream: Option<Arc<dyn DevStream>>, top: usize) -> Scope {
        Scope {
            hold: Arc::new(Hold {
                arena: arena.clone(),
                lease: arena.lease(),
                sides: Mutex::new(Vec::new()),
            }),
            stream,
            top,
        }
    }

    /// The launched call's communicator identity.
    pub fn top(&self) -> usize {
        self.top
    }

    /// `side` (another communicator's stream) did work for the call up to `ev`.
    pub fn note_side(&self, side: &Arc<dyn DevStream>, ev: Arc<dyn super::DevEvent>) {
        let mut s = self.hold.sides.lock().unwrap_or_else(|e| e.into_inner());
        match s.iter_mut().find(|(st, _)| Arc::ptr_eq(st, side)) {
            Some(slot) => slot.1 = ev,
            None => s.push((side.clone(), ev)),
        }
    }

    /// Make the launch stream wait for every side stream's last work (the join: after
    /// it, the launch stream's next event covers the whole call, and a capture has every
    /// stream joined back).
    pub fn join_sides(&self) -> Result<()> {
        let Some(main) = &self.stream else {
            return Ok(());
        };
        let sides = std::mem::take(&mut *self.hold.sides.lock().unwrap_or_else(|e| e.into_inner()));
        sides
            .iter()
            .try_for_each(|(_, ev)| main.wait_event(ev.as_ref()))
    }
}

thread_local! {
    /// The stream-ordered call this thread works for: its arena lease and launch stream
    /// (set by the launch, [`crate::runtime::launch`], for the call's stages; travels
    /// with its jobs, `runtime::in_scope`). Call state in a thread-local, read by
    /// [`alloc`] and the transports' `work_stream`: still to become part of a launch
    /// context passed down as a value.
    static CURRENT: RefCell<Option<Scope>> = const { RefCell::new(None) };
    /// The stream of the communicator whose native call runs now inside a launch (a
    /// side stream), overriding the launch stream.
    static SIDE: RefCell<Option<Arc<dyn DevStream>>> = const { RefCell::new(None) };
}

/// Run `f` with device work going to `side` instead of the launch stream (a
/// sub-communicator's native call inside a launch).
pub fn on_side<T>(side: Arc<dyn DevStream>, f: impl FnOnce() -> T) -> T {
    struct Back(Option<Arc<dyn DevStream>>);
    impl Drop for Back {
        fn drop(&mut self) {
            let prev = self.0.take();
            SIDE.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = SIDE.with(|c| c.borrow_mut().replace(side));
    let _back = Back(prev);
    f()
}

/// The launch stream of the call this thread works for (never a side stream).
pub fn launch_stream() -> Option<Arc<dyn DevStream>> {
    CURRENT.with(|c| c.borrow().as_ref().and_then(|s| s.stream.clone()))
}

/// The scope this thread works in, if any.
pub fn current() -> Option<Scope> {
    CURRENT.with(|c| c.borrow().clone())
}

/// The stream device work goes on inside a launch: a side stream while a
/// sub-communicator's native call runs ([`on_side`]), else the launch stream; `None`
/// outside a launch.
pub fn stream() -> Option<Arc<dyn DevStream>> {
    let main = launch_stream()?;
    Some(SIDE.with(|c| c.borrow().clone()).unwrap_or(main))
}

/// Run `f` in `s` (`None`: outside any scope, and off any side stream), restoring the
/// previous scope after.
pub fn scope<T>(s: Option<Scope>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Scope>, Option<Arc<dyn DevStream>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let (prev, side) = (self.0.take(), self.1.take());
            CURRENT.with(|c| *c.borrow_mut() = prev);
            SIDE.with(|c| *c.borrow_mut() = side);
        }
    }
    let prev = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), s));
    let side = SIDE.with(|c| c.borrow_mut().take());
    let _restore = Restore(prev, side);
    f()
}

/// [`DeviceMem::alloc`] inside a scope on `dev`: an arena block zeroed on the scope's
/// stream (the launch stream: in stream order, no host wait) or, without one, on the
/// device's private stream; not owned by the returned value (the arena keeps it).
/// `None` outside a scope or on another device.
pub(super) fn alloc(dev: &Arc<dyn Device>, bytes: usize) -> Option<Result<DeviceMem>> {
    let s = current()?;
    let arena = &s.hold.arena;
    let same = arena.dev.api() == dev.api() && arena.dev.ordinal() == dev.ordinal();
    if !same || bytes == 0 {
        return None;
    }
    Some((|| {
        let addr = arena.take(s.hold.lease, bytes)?;
        // Cleared on the stream that will use it (a side stream's call, or the launch
        // stream), in its order.
        match stream() {
            Some(st) => st.clear(addr, bytes)?,
            None => dev.zero(addr, bytes)?,
        }
        Ok(DeviceMem {
            dev: dev.clone(),
            addr,
            len: bytes,
            owned: false,
        })
    })())
}
