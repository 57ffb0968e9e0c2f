//! The launch context of a stream-ordered call, and its scratch.
//!
//! A launched call ([`crate::runtime::launch`]) carries a [`Scope`] as a value: the
//! runtime hands it to the algorithm with the communicator it runs on (a launched view
//! of `CommCore`), and from there it goes down, as an argument, to every place that
//! enqueues device work or allocates for the call. It holds
//! - the **launch stream**: all device work of the call goes onto it (or onto a
//!   sub-communicator's side stream forked from it and joined back at the end), and
//!   nothing waits on the host for the device (the capturable path: a capture takes the
//!   same route);
//! - the call's **lease on the communicator's [`Arena`]**: every scratch block the call
//!   asks for on its device ([`Scope::alloc`]) is an arena block, cleared in the order of
//!   the stream that uses it and held until the last clone of the scope is dropped (the
//!   call's stages are all enqueued, or the watchdog saw its end); the next call reuses
//!   it, so a repeated call allocates nothing and keeps the addresses a CUDA graph
//!   replays;
//! - the side streams the call used, joined back into the launch stream at its end.
//!
//! Nothing here is per thread: a scope goes wherever the call's work goes (a group's
//! end, a sub-communicator's batch) because it is passed there.

#![forbid(unsafe_code)]

use super::{pool::Pool, DevAddr, DevStream, Device, DeviceMem};
use crate::error::{Error, Result};
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
    fn take(&self, lease: u64, bytes: usize, on: &Arc<dyn DevStream>) -> Result<DevAddr> {
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
        // allocated in the order of the stream that clears it (`on`); where it
        // cannot be (HIP, a capture) it is cleared on the device's private stream, which
        // is waited for: a host wait outside the launch contract, as the contract allows
        // for a block's first allocation, which no steady-state call makes.
        let mem = super::waits::outside(|| DeviceMem::alloc_uninit_on(&self.dev, class, Some(on)))?;
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

/// The launch context of one stream-ordered call (see [`self`]). Cheap to clone; clones
/// go with the call's pieces. When the last one is dropped the call's arena blocks are
/// free for the next call: its device work is ordered before any later call's on the
/// communicator's launch stream.
#[derive(Clone)]
pub struct Scope {
    hold: Arc<Hold>,
    /// The launch stream: the call's own stages go on it, no host waits.
    pub stream: Arc<dyn DevStream>,
    /// The launched call's communicator (an identity, [`Scope::launch`]): its own native
    /// calls go on the launch stream, other communicators' on their own streams.
    top: usize,
}

/// A launched call's work on one stream: the call's [`Scope`] and the stream its device
/// work goes on there (the launch stream, or a sub-communicator's side stream).
#[derive(Clone, Copy)]
pub struct Launched<'a> {
    /// The call.
    pub scope: &'a Scope,
    /// The stream.
    pub stream: &'a Arc<dyn DevStream>,
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
    /// A launched call's scope: scratch from `arena`, stages on `stream`, the call made
    /// on the communicator `top` (any identity the caller keeps for it).
    pub fn launch(arena: &Arc<Arena>, stream: Arc<dyn DevStream>, top: usize) -> Scope {
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
        let main = &self.stream;
        let sides = std::mem::take(&mut *self.hold.sides.lock().unwrap_or_else(|e| e.into_inner()));
        sides
            .iter()
            .try_for_each(|(_, ev)| main.wait_event(ev.as_ref()))
    }

    /// A zeroed block of `bytes` on `dev` for this call: an arena block, cleared on `on`
    /// (the stream the call's work goes on here, the launch stream or a side stream: in
    /// its order, no host wait); not owned by the returned value (the arena keeps it
    /// until the call ends). `None` on another device than the arena's, or for zero
    /// bytes: the caller allocates as usual.
    pub fn alloc(
        &self,
        dev: &Arc<dyn Device>,
        bytes: usize,
        on: &Arc<dyn DevStream>,
    ) -> Option<Result<DeviceMem>> {
        let arena = &self.hold.arena;
        let same = arena.dev.api() == dev.api() && arena.dev.ordinal() == dev.ordinal();
        if !same || bytes == 0 {
            return None;
        }
        Some((|| {
            let addr = arena.take(self.hold.lease, bytes, on)?;
            on.clear(addr, bytes)?;
            Ok(DeviceMem {
                dev: dev.clone(),
                addr,
                len: bytes,
                owned: false,
            })
        })())
    }
}
