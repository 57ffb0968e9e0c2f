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
//!   ([`Buffer::from_host_ptr`]), device memory checked against the communicator's
//!   device ([`Device::check_pointer`]) on GPU transports
//!   ([`Buffer::from_device_ptr`]). An in-place pair becomes one buffer and a view of it.
//! - [`CallBuffers::run`]: the one end of every call: on GPU transports the
//!   communicator's stream waits for the caller's stream (and the host for that); then
//!   one [`Request`] through [`Comm::submit`]. On a strata host stream
//!   ([`super::stream`]) the call is enqueued after that stream's earlier calls and
//!   returns; otherwise, outside a group it is waited for ([`Comm::call`]), inside a group
//!   held for `strataGroupEnd` ([`end_group`]).
//!
//! Ownership: the user's memory is read and written where it is; strata keeps no
//! pointer to it once the call completed (a blocking call: when it returns; inside a
//! group: after `strataGroupEnd`; on a strata host stream: once its completion was
//! observed by a synchronize or query).

use super::*;
use crate::comm::{Request, Work};
use crate::device::{DevAddr, Device};
use crate::kinds::{InPlace, Kind};
use crate::memory::Buffer;

/// A byte range of the caller's memory; `write` when the call stores into it.
#[derive(Clone, Debug)]
pub(super) struct UserBuf {
    addr: usize,
    len: usize,
    write: bool,
    what: String,
}

impl UserBuf {
    /// `len` bytes at `p` (`what` names the argument in messages): NULL is allowed only
    /// for an empty range, and the range must not wrap around the address space.
    pub(super) fn new(
        p: *const c_void,
        len: usize,
        write: bool,
        what: impl Into<String>,
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
    fn spans(&self) -> Vec<(usize, usize, bool)> {
        let (s, r) = (&self.send, &self.recv);
        match self.in_place {
            None => vec![(s.addr, s.len, s.write), (r.addr, r.len, r.write)],
            Some(InPlace::SendInRecv { .. }) => vec![(r.addr, r.len, true)],
            Some(InPlace::RecvInSend { .. }) => vec![(s.addr, s.len, true)],
            Some(InPlace::Same) => vec![(r.addr, r.len.max(s.len), true)],
        }
    }
}

/// No byte may be both written by the call and touched by another range of it; NCCL's
/// in-place pairs count as one range. `name` is the export, for the message.
pub(super) fn disjoint<'a>(pairs: impl IntoIterator<Item = &'a Pair>, name: &str) -> Result<()> {
    let mut spans: Vec<_> = pairs.into_iter().flat_map(Pair::spans).collect();
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
}

impl CallBuffers {
    pub(super) fn new(comm: &Comm) -> CallBuffers {
        CallBuffers {
            device: comm.device(),
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
            // SAFETY: the caller's contract: `len` bytes at `ptr` stay valid and
            // unshared while the buffer and the work using it live. Ranges the call only
            // reads are only borrowed shared, so never written.
            None => Ok(unsafe { Buffer::from_host_ptr(u.ptr(), u.len) }),
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

    /// Check `p` ([`disjoint`]) and build its buffers ([`Self::pair`]): a one-pair call.
    ///
    /// # Safety
    /// As [`Self::pair`].
    pub(super) unsafe fn checked_pair(&mut self, p: &Pair, name: &str) -> Result<(Buffer, Buffer)> {
        disjoint([p], name)?;
        // SAFETY: the caller's contract.
        unsafe { self.pair(p) }
    }

    /// The one end of every call: on GPU transports make the communicator's stream wait
    /// for the caller's `stream` (and the host for that); submit `req`; then outside a
    /// group wait for it and copy the results out, inside a group hold both for
    /// `strataGroupEnd`.
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
            let _work = handle.comm.enqueue_on(req, std::rc::Rc::new(caller))?;
            return Ok(());
        }
        if let Some(hs) = host_stream {
            // Nonblocking, in the stream's order; completion is observed on the stream.
            let work = handle.comm.submit(req.after(hs.deps()))?;
            hs.push(work, function, handle);
            return Ok(());
        }
        if !crate::comm::in_group() {
            // Blocking: with nothing queued it runs on this thread (Comm::call).
            return handle.comm.call(req);
        }
        let work = handle.comm.submit(req)?;
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

impl crate::comm::ordered::CallerStream for RawStream {
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
    fn wait_value(&self, word: crate::device::DevAddr, n: u64) -> Result<()> {
        // SAFETY: as above; the word is the communicator's completion word, never freed.
        unsafe { self.dev.wait_value_on(self.ptr(), word, n) }
    }
}

/// A call of an open group, completed by [`end_group`].
struct Held {
    function: &'static str,
    handle: Arc<Handle>,
    work: Work,
}

thread_local! {
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
