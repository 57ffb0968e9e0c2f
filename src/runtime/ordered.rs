//! What one communicator's launched collectives share ([`crate::runtime::launch`]): the
//! launch stream every stage of a device collective is enqueued on (forked from the
//! caller's stream with an event, joined back with one), and the scratch arena
//! ([`crate::device::direct::Arena`]) whose blocks a call holds while it is enqueued
//! and the next call reuses, in that stream's order.
//!
//! No completion word, no stream memory operation (`cuStreamWaitValue64`): the caller's
//! stream and the launch stream are joined with events only, which every CUDA and HIP
//! device supports and every graph capture records.

#![forbid(unsafe_code)]

use crate::device::direct::Arena;
use crate::device::{DevEvent, DevStream, Device};
use crate::error::Result;
use std::sync::{Arc, Mutex};

/// One communicator's launch stream and scratch arena.
pub struct Launcher {
    /// Unique in the process (a key for the watcher: this launcher's calls end in
    /// order), never reused as an address could be.
    id: u64,
    stream: Arc<dyn DevStream>,
    arena: Arc<Arena>,
    /// Held while a call is being launched: one launch at a time per communicator
    /// (calls from two threads at once are serialized, never interleaved on the stream).
    busy: Mutex<()>,
    /// The stream of the communicator's latest launched call (a caller's, on the fast
    /// path, or the launch stream) and the event after it: a call on another stream
    /// waits for it first, so a communicator's launched calls run in launch order on
    /// the device whatever streams they name (as NCCL orders a communicator's calls).
    last: Mutex<Option<(usize, Arc<dyn DevEvent>)>>,
}

impl Launcher {
    /// A new launch stream and an empty arena on `dev`.
    pub fn new(dev: &Arc<dyn Device>) -> Result<Launcher> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Launcher {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            stream: dev.new_stream()?,
            arena: Arc::new(Arena::new(dev)),
            busy: Mutex::new(()),
            last: Mutex::new(None),
        })
    }

    /// This launcher's process-unique identity.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The communicator's scratch for launched calls.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// The stream every stage of a launched call goes on.
    pub fn stream(&self) -> &Arc<dyn DevStream> {
        &self.stream
    }

    /// Make `s` wait for the communicator's latest launched call when that ran on
    /// another stream (nothing when it ran on `s`: the stream orders them).
    pub fn follow(&self, s: &Arc<dyn DevStream>) -> Result<()> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match last {
            Some((raw, ev)) if raw != s.raw() as usize => s.wait_event(ev.as_ref()),
            _ => Ok(()),
        }
    }

    /// A launched call on `s` ends at `ev`: the next one on another stream follows it.
    pub fn ended(&self, s: &Arc<dyn DevStream>, ev: &Arc<dyn DevEvent>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((s.raw() as usize, ev.clone()));
    }

    /// Hold the launcher for one call's launch.
    pub fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}
