//! The completion word of stream-ordered collectives ([`crate::comm::Comm::enqueue`]):
//! one 8-byte word of device memory per communicator, and a private stream that writes
//! it. Call `n` on a communicator makes the caller's stream wait (on the device) until
//! the word is >= `n`; the communicator's stream thread writes `n` once call `n` and
//! every earlier call have completed, or failed, or been dropped unrun, so a caller's
//! stream is never left waiting for a call that will not run (a dead peer ends the call
//! with an error after the timeout, and the word is written all the same).

#![forbid(unsafe_code)]

use crate::device::direct::Arena;
use crate::device::{DevAddr, DevStream, Device, DeviceMem};
use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// What one communicator's stream-ordered calls share: the completion word, the
/// scratch arena ([`crate::device::direct::Arena`]) and the stream of the capturable
/// path.
pub struct Signal {
    /// `Some` while alive; never freed (see `Drop`).
    word: Option<DeviceMem>,
    stream: Arc<dyn DevStream>,
    state: Mutex<Progress>,
    arena: Arc<Arena>,
    capture: Arc<dyn DevStream>,
}

#[derive(Default)]
struct Progress {
    next: u64,
    upto: u64,
    done: BTreeSet<u64>,
}

impl Signal {
    /// A word (zero) and its writer stream on `dev`.
    pub fn new(dev: &Arc<dyn Device>) -> Result<Signal> {
        Ok(Signal {
            word: Some(DeviceMem::alloc(dev, 8)?),
            stream: dev.new_stream()?,
            state: Mutex::new(Progress::default()),
            arena: Arc::new(Arena::new(dev)),
            capture: dev.new_stream()?,
        })
    }

    /// The communicator's scratch for stream-ordered calls.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// The stream captured calls run on (forked from the caller's capturing stream and
    /// joined back to it).
    pub fn capture_stream(&self) -> &Arc<dyn DevStream> {
        &self.capture
    }

    /// The word's device address (8-byte aligned).
    pub fn addr(&self) -> DevAddr {
        self.word.as_ref().map_or(0, |w| w.addr())
    }

    /// The next call's number (from 1), and the guard that releases it when dropped.
    pub fn next(self: &Arc<Self>) -> Result<Release> {
        let mut s = self.lock()?;
        s.next += 1;
        Ok(Release {
            signal: self.clone(),
            seq: s.next,
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Progress>> {
        self.state
            .lock()
            .map_err(|_| Error::Internal("signal state poisoned".into()))
    }

    /// Call `seq` is over: advance the word past every finished call in order.
    fn complete(&self, seq: u64) {
        let Ok(mut s) = self.lock() else { return };
        s.done.insert(seq);
        let before = s.upto;
        loop {
            let n = s.upto + 1;
            if !s.done.remove(&n) {
                break;
            }
            s.upto = n;
        }
        if s.upto != before {
            if let Err(e) = self.stream.write_value(self.addr(), s.upto) {
                // Nothing else can release the waiters: say so loudly.
                tracing::error!("writing the completion word of a stream-ordered call: {e}");
            }
        }
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        // A caller's stream may reach its wait only later: the word must keep its last
        // value, so it is never freed or reused (8 bytes per communicator).
        std::mem::forget(self.word.take());
    }
}

/// Releases one call's number when dropped (run, failed or never run).
pub struct Release {
    signal: Arc<Signal>,
    seq: u64,
}

impl Release {
    /// The call's number: the caller's stream waits for the word to reach it.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.signal.complete(self.seq);
    }
}
