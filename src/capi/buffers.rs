//! Call buffers: the caller's memory of one C call as strata [`Buffer`]s, the same way
//! for every export, on every transport.
//!
//! - [`UserBuf`]: a validated byte range of user memory (NULL with a nonzero length and
//!   wrap-around are `InvalidArgument`), with its read/write intent.
//! - [`Pair`]: a send and a receive range plus NCCL's in-place layout recognised from
//!   the raw pointers by the one rule, [`Kind::in_place`]; [`disjoint`] refuses every
//!   other overlap across all the pairs of a call (coalesced lists included).
//! - [`CallBuffers`]: given the communicator, turns user ranges into buffers used in
//!   place, with no copies: host memory on host transports
//!   ([`Buffer::from_host_ptr`], through this thread's [`HostSlot`]s, so a call after a
//!   completed one allocates nothing), device memory checked against the communicator's
//!   device ([`Device::check_pointer`]) on GPU transports
//!   ([`Buffer::from_device_ptr`]). An in-place pair becomes one buffer and a view of it.
//! - [`CallBuffers::run`]: the one end of every call: the request, checked here once
//!   (the raw ranges above; [`Checked::assume`]), goes to [`Comm`] as that [`Checked`]
//!   value, not checked again ([`Comm::submit_checked`], [`Comm::call_checked`]):
//!   stream-ordered on GPU transports ([`Comm::enqueue_checked`]). On
//!   a strata host stream ([`super::stream`]) the call is enqueued after that stream's
//!   earlier calls and returns; otherwise, outside a group it is waited for
//!   ([`Comm::call`]), inside a group held for `strataGroupEnd` ([`end_group`]).
//!
//! Ownership: the user's memory is read and written where it is; strata keeps no
//! pointer to it once the call completed (a blocking call: when it returns; inside a
//! group: after `strataGroupEnd`; on a strata host stream: once its completion was
//! observed by a synchronize or query).

use super::abi::*;
use super::registry::{store_error, Handle};
use crate::comm::{Comm, Request, Work};
use crate::device::{DevAddr, Device};
use crate::error::{Error, Result};
use crate::kinds::{InPlace, Kind};
use crate::memory::{Buffer, HostSlot};
use crate::runtime::request::Checked;
use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// A byte range of the caller's memory; `write` when the call stores into it.
#[derive(Clone, Debug)]
pub(super) struct UserBuf {
    addr: usize,
    len: usize,
    write: bool,
    /// The argument's name, for messages (no allocation for a fixed name).
    what: Cow<'static, str>,
}

impl UserBuf {
    /// `len` bytes at `p` (`what` names the argument in messages): NULL is allowed only
    /// for an empty range, and the range must not wrap around the address space.
    pub(super) fn new(
        p: *const c_void,
        len: usize,
        write: bool,
        what: impl Into<Cow<'static, str>>,
    ) -> Result<UserBuf> {
        let what = what.into();
        if p.is_null() && len > 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} is NULL but the call needs {len} bytes"
            )));
        }
        let addr = p as usize;
        addr.checked_add(len)
            .ok_or_else(|| Error::InvalidArgument(format!("{what} + {len} bytes wraps around")))?;
        Ok(UserBuf {
            addr,
            len,
            write,
            what,
        })
    }

    fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

/// A send and a receive range of one collective and NCCL's in-place layout of the two,
/// when the raw pointers form it.
#[derive(Clone, Debug)]
pub(super) struct Pair {
    pub(super) send: UserBuf,
    pub(super) recv: UserBuf,
    pub(super) in_place: Option<InPlace>,
}

impl Pair {
    /// Recognise `kind`'s in-place layout on `rank` with `chunk` bytes per rank
    /// ([`Kind::in_place`], NCCL's rule: all-gather `send == recv + rank·chunk`,
    /// reduce-scatter `recv == send + rank·chunk`, all-reduce and broadcast `send ==
    /// recv`, all-to-all never).
    pub(super) fn new(kind: Kind, rank: usize, chunk: usize, send: UserBuf, recv: UserBuf) -> Pair {
        let d = send.addr as i128 - recv.addr as i128;
        let in_place = kind.in_place(rank, chunk).filter(|ip| ip.matches(d));
        Pair {
            send,
            recv,
            in_place,
        }
    }

    /// The ranges the call touches, as [`disjoint`] checks them: an in-place pair is one
    /// range (the outer one, written).
    fn spans(&self) -> impl Iterator<Item = (usize, usize, bool)> {
        let (s, r) = (&self.send, &self.recv);
        let (a, b) = match self.in_place {
            None => ((s.addr, s.len, s.write), Some((r.addr, r.len, r.write))),
            Some(InPlace::SendInRecv { .. }) => ((r.addr, r.len, true), None),
            Some(InPlace::RecvInSend { .. }) => ((s.addr, s.len, true), None),
            Some(InPlace::Same) => ((r.addr, r.len.max(s.len), true), None),
        };
        std::iter::once(a).chain(b)
    }

    /// [`disjoint`] for a call of this one pair: in place, or the two ranges share no
    /// byte (the receive range is written). No allocation.
    fn alone(&self, name: &str) -> Result<()> {
        let (s, r) = (&self.send, &self.recv);
        let apart =
            s.len == 0 || r.len == 0 || s.addr + s.len <= r.addr || r.addr + r.len <= s.addr;
        if self.in_place.is_some() || apart || !(s.write || r.write) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{name}: send and receive buffers overlap without being NCCL's in-place layout"
        )))
    }
}

/// No byte may be both written by the call and touched by another range of it; NCCL's
/// in-place pairs count as one range. `name` is the export, for the message.
pub(super) fn disjoint<'a>(pairs: impl IntoIterator<Item = &'a Pair>, name: &str) -> Result<()> {
    let mut spans: Vec<_> = pairs.into_iter().flat_map(|p| p.spans()).collect();
    spans.sort_by_key(|s| s.0);
    let (mut end_any, mut end_write) = (0usize, 0usize);
    for (start, len, write) in spans.into_iter().filter(|s| s.1 > 0) {
        if (write && start < end_any) || start < end_write {
            return Err(Error::InvalidArgument(format!(
                "{name}: send and receive buffers overlap without being NCCL's in-place layout"
            )));
        }
        end_any = end_any.max(start + len);
        if write {
            end_write = end_write.max(start + len);
        }
    }
    Ok(())
}

/// The buffers of one call on one communicator and what completing it takes.
pub(super) struct CallBuffers {
    /// The communicator's GPU (GPU transports): user ranges are its memory.
    device: Option<Arc<dyn Device>>,
    /// The in-place layout of each pair, as derived from the raw pointers (for the debug
    /// builds' cross-check in [`Checked::assume`]; never filled in release builds).
    layouts: Vec<Option<InPlace>>,
    /// Host transports: this thread's [`HostSlot`]s, lent by [`SLOTS`] for the call, and
    /// how many the call used.
    slots: Vec<HostSlot>,
    used: usize,
}

thread_local! {
    /// The allocations of this thread's host buffers, reused call after call: a blocking
    /// call's buffers are gone when it returns, so the next call allocates nothing. An
    /// allocation cache (a call takes the slots and gives them back), no call's state.
    static SLOTS: std::cell::Cell<Vec<HostSlot>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Drop for CallBuffers {
    fn drop(&mut self) {
        if self.device.is_none() {
            let slots = std::mem::take(&mut self.slots);
            let _ = SLOTS.try_with(|s| s.set(slots));
        }
    }
}

impl CallBuffers {
    pub(super) fn new(comm: &Comm) -> CallBuffers {
        let device = comm.device();
        let slots = match device {
            None => SLOTS.take(),
            Some(_) => Vec::new(),
        };
        CallBuffers {
            device,
            layouts: Vec::new(),
            slots,
            used: 0,
        }
    }

    /// Note a pair's layout for the debug cross-check (a pair with no send range of its
    /// own, as a broadcast's on a non-root, is `None`).
    pub(super) fn note_layout(&mut self, l: Option<InPlace>) {
        if cfg!(debug_assertions) {
            self.layouts.push(l);
        }
    }

    /// The caller's device range as a buffer, after checking that it is memory of the
    /// communicator's device (a host pointer is a clear `InvalidArgument`).
    ///
    /// # Safety
    /// The range stays allocated, and untouched by anyone else, until the work using
    /// the buffer completes (the device contract of every collective).
    unsafe fn wrap(dev: &Arc<dyn Device>, u: &UserBuf) -> Result<Buffer> {
        if u.len == 0 {
            return Ok(Buffer::zeroed(0));
        }
        let addr = u.addr as DevAddr;
        dev.check_pointer(addr, u.len).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", u.what)),
            other => other,
        })?;
        // SAFETY: `len` bytes at `addr` are memory of `dev` (checked just above); that
        // they stay allocated and unshared while the buffer lives is the caller's
        // contract.
        Ok(unsafe { Buffer::from_device_ptr(dev, addr, u.len) })
    }

    /// A range of the call: the user's memory itself, host or device.
    ///
    /// # Safety
    /// Valid (readable; writable when the call writes it) and untouched by others until
    /// the call completes (see the module's ownership rule); device: as [`Self::wrap`].
    pub(super) unsafe fn user(&mut self, u: &UserBuf) -> Result<Buffer> {
        match &self.device {
            // SAFETY: the caller's contract.
            Some(d) => unsafe { Self::wrap(d, u) },
            None => {
                if self.used == self.slots.len() {
                    self.slots.push(HostSlot::default());
                }
                self.used += 1;
                let slot = &mut self.slots[self.used - 1];
                // SAFETY: the caller's contract: `len` bytes at `ptr` stay valid and
                // unshared while the buffer and the work using it live. Ranges the call
                // only reads are only borrowed shared, so never written.
                Ok(unsafe { slot.view(u.ptr(), u.len) })
            }
        }
    }

    /// A range the call reads ([`Self::user`]).
    ///
    /// # Safety
    /// As [`Self::user`].
    pub(super) unsafe fn input(&mut self, u: &UserBuf) -> Result<Buffer> {
        // SAFETY: the caller's contract.
        unsafe { self.user(u) }
    }

    /// A range the call writes ([`Self::user`]).
    ///
    /// # Safety
    /// As [`Self::user`].
    pub(super) unsafe fn output(&mut self, u: &UserBuf) -> Result<Buffer> {
        // SAFETY: the caller's contract.
        unsafe { self.user(u) }
    }

    /// The (send, recv) buffers of a pair: separate buffers, or, in place, one buffer
    /// and the view of it the layout names.
    ///
    /// # Safety
    /// As [`Self::user`] for both ranges.
    pub(super) unsafe fn pair(&mut self, p: &Pair) -> Result<(Buffer, Buffer)> {
        let (s, r) = (&p.send, &p.recv);
        self.note_layout(p.in_place);
        match p.in_place {
            None => {
                // SAFETY: the caller's contract on both ranges.
                let send = unsafe { self.input(s) }?;
                // SAFETY: as above.
                let recv = unsafe { self.output(r) }?;
                Ok((send, recv))
            }
            Some(InPlace::SendInRecv { offset }) => {
                // SAFETY: the caller's contract on the receive range.
                let recv = unsafe { self.output(r) }?;
                let send = recv.slice(offset..offset + s.len)?;
                Ok((send, recv))
            }
            Some(InPlace::RecvInSend { offset }) => {
                // SAFETY: the caller's contract on the send range.
                let send = unsafe { self.output(s) }?;
                let recv = send.slice(offset..offset + r.len)?;
                Ok((send, recv))
            }
            Some(InPlace::Same) => {
                // SAFETY: the caller's contract on the send range.
                let send = unsafe { self.output(s) }?;
                Ok((send.clone(), send))
            }
        }
    }

    /// Check `p` ([`disjoint`], for one pair) and build its buffers ([`Self::pair`]): a
    /// one-pair call.
    ///
    /// # Safety
    /// As [`Self::pair`].
    pub(super) unsafe fn checked_pair(&mut self, p: &Pair, name: &str) -> Result<(Buffer, Buffer)> {
        p.alone(name)?;
        // SAFETY: the caller's contract.
        unsafe { self.pair(p) }
    }

    /// `req`, built from this call's buffers after every check of the call passed
    /// (arguments, counts, raw ranges, layouts): the one checked request of the call.
    pub(super) fn checked(&self, handle: &Handle, req: Request) -> Checked {
        let (rank, size) = (handle.comm.rank(), handle.comm.size());
        Checked::assume(req, rank, size, &self.layouts)
    }

    /// The one end of every call: the request, checked by the caller's body, becomes the
    /// call's one [`Checked`] request ([`Self::checked`]) and goes to the communicator as
    /// it is: on GPU transports stream-ordered on the caller's `stream`; on a strata host
    /// stream enqueued in its order; otherwise outside a group run and waited for, inside
    /// a group held for `strataGroupEnd`.
    ///
    /// # Safety
    /// `stream` is NULL or a live stream of the communicator's device (GPU transports;
    /// ignored otherwise); the ranges behind the buffers stay valid as [`Self::output`]
    /// says.
    pub(super) unsafe fn run(
        self,
        function: &'static str,
        handle: Arc<Handle>,
        req: Request,
        stream: strataStream_t,
    ) -> Result<()> {
        let req = self.checked(&handle, req);
        #[cfg(test)]
        seen::set(&req);
        let host_stream = super::stream::host_stream(stream)?;
        // host-local (the CPU device) is driven like a host transport from C: blocking,
        // or nonblocking on a strata host stream.
        if let Some(dev) = self
            .device
            .clone()
            .filter(|d| d.api() != crate::device::Api::Cpu)
        {
            if host_stream.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "{function}: a strata host stream was given to a GPU communicator; pass a \
                     cudaStream_t / hipStream_t of its device"
                )));
            }
            // Stream-ordered (NCCL semantics): after `stream`'s earlier work, before its
            // later work, and returning without waiting for the device (grouped calls
            // too: their group runs at strataGroupEnd, `stream` waits for it); recorded
            // into the graph when `stream` is capturing.
            let caller = RawStream {
                dev,
                raw: stream as usize,
            };
            let work = handle.comm.enqueue_checked(req, std::rc::Rc::new(caller))?;
            // A launch that failed before reaching the device (its work already failed
            // at return) is this call's error, not a success; a launched call is never
            // waited for here (is_done does not block).
            if work.is_done() {
                work.wait()?;
            }
            return Ok(());
        }
        if let Some(hs) = host_stream {
            // Nonblocking, in the stream's order; completion is observed on the stream.
            let work = handle.comm.submit_checked(req.after(hs.deps()))?;
            hs.push(work, function, handle);
            return Ok(());
        }
        if !crate::comm::in_group() {
            // Blocking: with nothing queued it runs on this thread (Comm::call).
            return handle.comm.call_checked(req);
        }
        let work = handle.comm.submit_checked(req)?;
        HELD.with(|h| {
            h.borrow_mut().push(Held {
                function,
                handle,
                work,
            })
        });
        Ok(())
    }
}

/// The caller's `cudaStream_t` / `hipStream_t` of a stream-ordered call. Every use is
/// within the call or, inside a group, before `strataGroupEnd` returns, while the
/// caller's contract keeps the stream alive.
struct RawStream {
    dev: Arc<dyn crate::device::Device>,
    raw: usize,
}

impl RawStream {
    fn ptr(&self) -> *mut std::ffi::c_void {
        self.raw as *mut std::ffi::c_void
    }
}

impl crate::runtime::launch::CallerStream for RawStream {
    fn device(&self) -> Arc<dyn crate::device::Device> {
        self.dev.clone()
    }
    fn record(&self) -> Result<Arc<dyn crate::device::DevEvent>> {
        // SAFETY: the caller's contract: null or a live stream of the device.
        unsafe { self.dev.record_on(self.ptr()) }
    }
    fn is_capturing(&self) -> Result<bool> {
        // SAFETY: as above.
        unsafe { self.dev.is_capturing(self.ptr()) }
    }
    fn wait_event(&self, ev: &dyn crate::device::DevEvent) -> Result<()> {
        // SAFETY: as above; `ev` is an event of the same device.
        unsafe { self.dev.wait_event_on(self.ptr(), ev) }
    }
    fn stream(&self) -> Result<Arc<dyn crate::device::DevStream>> {
        // SAFETY: as above: the wrapper is used within the call (or its group), while
        // the caller keeps the stream alive.
        unsafe { self.dev.borrow_stream(self.ptr()) }
    }
}

/// A call of an open group, completed by [`end_group`].
struct Held {
    function: &'static str,
    handle: Arc<Handle>,
    work: Work,
}

thread_local! {
    /// The calls of this thread's open group, completed by [`end_group`]. Per thread
    /// because groups are (NCCL holds a group's calls per thread until `ncclGroupEnd`).
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Complete the calls this thread held in its (now closed, outermost) group: wait for
/// each, record each failure on its communicator as
/// `"strataGroupEnd (<function>): <error>"`, and return the first one.
///
/// # Safety
/// The buffers of the held calls are still valid (the grouped calls' contract).
pub(super) unsafe fn end_group() -> Result<()> {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let mut first = Ok(());
    for hd in held {
        let r = hd.work.wait();
        if let Err(e) = r {
            store_error(
                Some(&hd.handle),
                &format!("strataGroupEnd ({}): {e}", hd.function),
            );
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// The in-place layout of the last checked request this thread's C call built: set by
/// [`CallBuffers::run`], read by the tests (`buffers/tests.rs`).
#[cfg(test)]
mod seen {
    use super::*;

    thread_local! {
        pub(super) static SEEN: RefCell<Option<Option<InPlace>>> = const { RefCell::new(None) };
    }

    pub(super) fn set(c: &Checked) {
        SEEN.with(|s| *s.borrow_mut() = Some(c.request().op.layout()));
    }

    pub(super) fn take() -> Option<InPlace> {
        SEEN.with(|s| s.borrow_mut().take())
            .expect("no checked request was built")
    }
}

// In a file of its own: the tests drive collectives through their exports (`coll.rs`,
// which sits above this file), so they are not part of this file's imports.
#[cfg(test)]
mod tests;
