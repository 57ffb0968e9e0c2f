//! `nccl` (feature `cuda`) and `rccl` (feature `rocm`): one rank per process and GPU,
//! over the vendor library loaded at run time ([`super::vendor`]). Native collectives
//! are the library's (`ncclAllGather`, `ncclReduceScatter`, ...), enqueued on
//! [`super::gpu::work_stream`]: on the launch path of a stream-ordered call
//! ([`super::gpu::On`], the only path for device buffers) the call's stream, and the
//! transport returns once enqueued, waiting for nothing on the host (a watchdog observes
//! completion and polls [`GpuTransport::probe`], `ncclCommGetAsyncError`); on the host
//! staging path the communicator's own stream, waited for with the communicator's
//! timeout while polling the same error, where a timeout or an error aborts the vendor
//! communicator and fails the call with `Error::Remote`, so a dead peer never hangs a
//! rank. All-to-all is the library's where it has one, else grouped send/receive;
//! sub-communicators come from `ncclCommSplit` (or, on libraries without it, a new
//! unique id per color exchanged over the parent). `ncclCommInitRank` and
//! `ncclCommSplit` run on a helper thread with the same timeout (a rank that never joins
//! is `Remote`). Aborts need no lock and never free a communicator a call is inside:
//! each vendor call, and each communicator enqueued in a group until `ncclGroupEnd`,
//! holds a use guard, and the abort runs when the last one leaves ([`super::vendor`]).
//! Every entry makes the device current and restores the thread's previous one on
//! return ([`Device::bind`]). Host buffers are staged through scratch allocated once per
//! communicator ([`super::gpu::staged`]).
//!
//! A send to itself outside a group is held by strata, as MPI holds a message to self:
//! NCCL refuses one that is not grouped with its receive ("Trying to send to self
//! without a matching recv", `ncclInvalidUsage`, which would abort the communicator).
//! Its bytes are copied on the call's stream into a block of their own, and the next
//! receive from itself outside a group copies them out (in send order; the lengths must
//! match). Inside a group both go to NCCL, which pairs them.
//!
//! NCCL's data types and reduction ops have strata's numbers ([`DataType`] and
//! [`ReduceOp`] are `#[repr]`ed on them); `Avg` is sent as `Sum` (the caller divides).

#![forbid(unsafe_code)]

use super::gpu::{staged, DevCall, DeviceFace, GpuTransport, LibCall, On};
use super::vendor::{
    InUse, Reduction, Vendor, VendorComm, VendorLib, VendorUniqueId, VENDOR_UNIQUE_ID_BYTES,
};
use super::{P2p, Transport, TransportKind};
use crate::device::{finish, DevStream, Device, Region};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::traffic::Traffic;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};
use std::time::Duration;

thread_local! {
    // Per thread because the vendor's group is (`ncclGroupStart`/`End` nest per thread):
    // this mirrors the library's own per-thread group state, no single call's.
    /// Inside a vendor group on this thread: calls enqueue without waiting.
    static DEFER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Use guards of the communicators enqueued in this thread's open group: the library
    /// uses them until `ncclGroupEnd`, so no abort may free them before.
    static HELD: std::cell::RefCell<Vec<InUse<'static>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// One rank of an NCCL or RCCL communicator.
pub struct NcclTransport {
    vendor: Vendor,
    /// The vendor communicator: aborts and the asynchronous-error probe use it from any
    /// thread without `calls` (its use count keeps them safe).
    comm: VendorComm<'static>,
    /// Serializes the vendor calls on `comm` (NCCL's rule for blocking communicators).
    calls: Mutex<()>,
    rank: usize,
    members: Vec<usize>,
    face: DeviceFace,
    /// Sends to itself outside a group, oldest first: the staged bytes and, on the
    /// launch path, the event after their copy (see the module comment).
    to_self: Mutex<VecDeque<super::gpu::Eager>>,
    traffic: Option<Arc<Traffic>>,
    timeout: Duration,
}

fn op_code(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Avg => ReduceOp::Sum as c_int,
        o => o as c_int,
    }
}

/// `ncclAvg` (NCCL >= 2.10, RCCL the same): the sum divided by the communicator's size
/// in the library's own kernel, as PyTorch's `ProcessGroupNCCL` passes `ReduceOp.AVG`.
const NCCL_AVG: c_int = 4;

/// The first library version with `ncclAvg` (2.10.0 as NCCL_VERSION_CODE).
const AVG_SINCE: i32 = 21000;

fn int(v: usize, what: &str) -> Result<c_int> {
    c_int::try_from(v)
        .map_err(|_| Error::InvalidArgument(format!("{what} {v} exceeds the library's int")))
}

impl NcclTransport {
    /// Rank `rank` of `size` joins the vendor communicator of `id` on `dev`
    /// (`ncclCommInitRank`, collective: blocks until every rank has joined).
    /// `members` are the world ranks of the communicator's ranks (identity for a world).
    pub fn init(
        vendor: Vendor,
        dev: &Arc<dyn Device>,
        id: &VendorUniqueId,
        rank: usize,
        size: usize,
        traffic: Option<Arc<Traffic>>,
        timeout: Duration,
    ) -> Result<NcclTransport> {
        let lib = VendorLib::get(vendor)?;
        let d = dev.clone();
        let comm = lib.comm_init_rank_within(size, id, rank, timeout, move || d.bind())?;
        NcclTransport::wrap(
            vendor,
            comm,
            rank,
            (0..size).collect(),
            dev,
            traffic,
            timeout,
        )
    }

    /// Rank `rank` of `size` on a vendor communicator made elsewhere
    /// ([`VendorLib::split_foreign`]), owned from now on.
    pub fn adopt(
        vendor: Vendor,
        comm: VendorComm<'static>,
        rank: usize,
        size: usize,
        dev: &Arc<dyn Device>,
        timeout: Duration,
    ) -> Result<NcclTransport> {
        NcclTransport::wrap(vendor, comm, rank, (0..size).collect(), dev, None, timeout)
    }

    fn wrap(
        vendor: Vendor,
        comm: VendorComm<'static>,
        rank: usize,
        members: Vec<usize>,
        dev: &Arc<dyn Device>,
        traffic: Option<Arc<Traffic>>,
        timeout: Duration,
    ) -> Result<NcclTransport> {
        Ok(NcclTransport {
            vendor,
            comm,
            calls: Mutex::new(()),
            rank,
            members,
            face: DeviceFace::new(dev)?,
            to_self: Mutex::new(VecDeque::new()),
            traffic,
            timeout,
        })
    }

    /// Which library.
    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// Run `f` on the vendor communicator (device bound, restored on return; a use guard
    /// held), then: inside [`GpuTransport::group`] nothing (the guard is kept until the
    /// group ends); else [`GpuTransport::finish`] (on the launch path only the
    /// asynchronous-error probe, never a wait).
    fn run(
        &self,
        on: On<'_>,
        what: &str,
        f: impl FnOnce(&VendorComm<'static>, &dyn DevStream) -> Result<()>,
    ) -> Result<()> {
        let _bound = self.face.dev.bind()?;
        let deferred = DEFER.with(|d| d.get());
        {
            let _calls = self.lock()?;
            let inside = self.comm.enter(what)?;
            let stream = super::gpu::work_stream(self, on);
            let r = f(&self.comm, stream.as_ref());
            if deferred {
                // Whatever `f` enqueued is launched by ncclGroupEnd.
                HELD.with(|h| h.borrow_mut().push(inside));
            }
            r?;
        }
        if deferred {
            return Ok(());
        }
        self.finish(on, what)
    }

    /// A send to itself outside a group: staged in a block of its own on the call's
    /// stream ([`super::gpu::stage`]), queued for the receive.
    fn send_to_self(&self, on: On<'_>, data: Region) -> Result<()> {
        let _bound = self.face.dev.bind()?;
        let msg = super::gpu::stage(self, on, self.timeout, data, "ncclSend (to itself)")?;
        self.to_self
            .lock()
            .map_err(|_| Error::Internal("self-message queue poisoned".into()))?
            .push_back(msg);
        Ok(())
    }

    /// A receive from itself outside a group: the oldest staged send to itself, copied
    /// out on the call's stream. None pending, or another length: `InvalidUsage`, and
    /// the message stays queued.
    fn recv_from_self(&self, on: On<'_>, data: Region) -> Result<()> {
        let _bound = self.face.dev.bind()?;
        let mut q = self
            .to_self
            .lock()
            .map_err(|_| Error::Internal("self-message queue poisoned".into()))?;
        let Some((msg, ev)) = q.pop_front() else {
            return Err(Error::InvalidUsage(format!(
                "{}: rank {} receives from itself outside a group with no send to itself \
                 before it (NCCL would wait forever): send first, or put both in one group",
                self.vendor.name(),
                self.rank
            )));
        };
        if msg.len() != data.len {
            let sent = msg.len();
            q.push_front((msg, ev));
            return Err(Error::InvalidUsage(format!(
                "{}: rank {} sent itself {sent} bytes, its receive expects {}",
                self.vendor.name(),
                self.rank,
                data.len
            )));
        }
        drop(q);
        super::gpu::unstage(
            self,
            on,
            self.timeout,
            (msg, ev),
            data,
            "ncclRecv (from itself)",
        )
    }

    /// `ncclReduceScatter` / `ncclAllReduce` from `send` into `recv` (`recv.len` bytes
    /// of `dtype` per rank) with the library's op `op`.
    fn reduce_call(
        &self,
        on: On<'_>,
        which: Reduction,
        send: u64,
        recv: Region,
        dtype: DataType,
        op: c_int,
    ) -> Result<()> {
        let n = super::gpu::count_of(recv.len, dtype)?;
        let name = match which {
            Reduction::ReduceScatter => "ncclReduceScatter",
            Reduction::AllReduce => "ncclAllReduce",
        };
        self.run(on, name, |c, s| {
            c.reduce(which, send, recv.addr, n, dtype as c_int, op, s)
        })
    }

    /// True when the library averages `dtype` itself (`ncclAvg`): floating types on a
    /// library of version 2.10 or later.
    fn has_avg(&self, dtype: DataType) -> bool {
        dtype.is_float() && VendorLib::get(self.vendor).is_ok_and(|l| l.version() >= AVG_SINCE)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        self.calls
            .lock()
            .map_err(|_| Error::Internal("vendor communicator lock poisoned".into()))
    }

    /// The communicator's asynchronous error as `Error::Remote` naming `what()` (formatted
    /// only then: a probe runs once per launched call).
    fn probe_for(&self, what: impl FnOnce() -> String) -> Result<()> {
        self.comm.async_error().map_err(|e| match e {
            Error::Remote(_) => e,
            other => Error::Remote(format!("{}: {other}", what())),
        })
    }

    fn grouped(&self, c: &VendorComm<'static>, f: impl FnOnce() -> Result<()>) -> Result<()> {
        c.lib().group_start()?;
        let r = f();
        let e = c.lib().group_end();
        r.and(e)
    }

    /// `(color, key, world rank)` of every rank, over the parent (a split's bookkeeping).
    fn gather_colors(
        &self,
        color: Option<u32>,
        key: i32,
    ) -> Result<Vec<(Option<u32>, i32, usize)>> {
        let mut mine = [0u8; 16];
        mine[0] = color.is_some() as u8;
        mine[4..8].copy_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine[8..12].copy_from_slice(&key.to_le_bytes());
        mine[12..16].copy_from_slice(&(self.members[self.rank] as u32).to_le_bytes());
        let p = self.members.len();
        let mut all = vec![0u8; 16 * p];
        all[16 * self.rank..16 * self.rank + 16].copy_from_slice(&mine);
        Transport::all_gather(self, &mut all, 16)?;
        Ok(all
            .chunks_exact(16)
            .map(|c| {
                let col = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
                let key = i32::from_le_bytes([c[8], c[9], c[10], c[11]]);
                let w = u32::from_le_bytes([c[12], c[13], c[14], c[15]]) as usize;
                ((c[0] == 1).then_some(col), key, w)
            })
            .collect())
    }
}

impl GpuTransport for NcclTransport {
    fn face(&self) -> &DeviceFace {
        &self.face
    }
    fn finish(&self, on: On<'_>, what: &str) -> Result<()> {
        if on.is_some() {
            // The launch path: enqueue only. The call's stream orders the work and the
            // watchdog observes it; the asynchronous error is a query, not a wait.
            return self.probe_for(|| what.to_string());
        }
        // The host staging path (host buffers): wait for the communicator's stream.
        let r = finish(self.face.stream.as_ref(), self.timeout, what, || {
            self.probe_for(|| what.to_string())
        });
        if let Err(e) = &r {
            // A stuck or failed collective: abort so the peers' calls fail too and the
            // library's resources are released (when no call is inside any more).
            let _ = self.comm.abort_for(&format!("{what}: {e}"));
        }
        r
    }
    fn probe(&self) -> Result<()> {
        self.probe_for(|| format!("the {} communicator", self.vendor.name()))
    }
    fn call(&self, on: On<'_>, c: DevCall) -> Result<()> {
        match c {
            DevCall::AllGather { buf, chunk } => {
                let mine = buf.addr + (self.rank * chunk) as u64;
                self.run(on, "ncclAllGather", |c, s| {
                    c.all_gather(mine, buf.addr, chunk, s)
                })
            }
            DevCall::ReduceScatter {
                send,
                recv,
                dtype,
                op,
            } => self.reduce_call(
                on,
                Reduction::ReduceScatter,
                send.addr,
                recv,
                dtype,
                op_code(op),
            ),
            DevCall::AllReduce { buf, dtype, op } => {
                self.reduce_call(on, Reduction::AllReduce, buf.addr, buf, dtype, op_code(op))
            }
            DevCall::AllToAll { send, recv } => {
                let p = self.members.len();
                let b = recv.len / p.max(1);
                self.run(on, "all-to-all", |c, s| {
                    if let Some(r) = c.all_to_all(send.addr, recv.addr, b, s) {
                        return r;
                    }
                    self.grouped(c, || {
                        for j in 0..p {
                            let peer = int(j, "peer")?;
                            c.send(send.addr + (j * b) as u64, b, peer, s)?;
                            c.recv(recv.addr + (j * b) as u64, b, peer, s)?;
                        }
                        Ok(())
                    })
                })
            }
            DevCall::Broadcast { buf, root } => {
                let root = int(root, "root")?;
                self.run(on, "ncclBroadcast", |c, s| {
                    c.broadcast(buf.addr, buf.addr, buf.len, root, s)
                })
            }
            DevCall::Send { peer, data } => {
                if peer == self.rank && !DEFER.with(|d| d.get()) {
                    return self.send_to_self(on, data);
                }
                let peer = int(peer, "peer")?;
                self.run(on, "ncclSend", |c, s| c.send(data.addr, data.len, peer, s))
            }
            DevCall::Recv { peer, data } => {
                if peer == self.rank && !DEFER.with(|d| d.get()) {
                    return self.recv_from_self(on, data);
                }
                let peer = int(peer, "peer")?;
                self.run(on, "ncclRecv", |c, s| c.recv(data.addr, data.len, peer, s))
            }
            DevCall::SendRecv {
                dst,
                send,
                src,
                recv,
            } => {
                let (d, r) = (int(dst, "peer")?, int(src, "peer")?);
                self.run(on, "ncclSend/ncclRecv", |c, s| {
                    self.grouped(c, || {
                        c.send(send.addr, send.len, d, s)?;
                        c.recv(recv.addr, recv.len, r, s)
                    })
                })
            }
        }
    }
    fn group(&self, on: On<'_>, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _bound = self.face.dev.bind()?;
        let lib = VendorLib::get(self.vendor)?;
        let inside = self.comm.enter("grouped calls")?;
        lib.group_start()?;
        let outer = DEFER.with(|d| d.replace(true));
        let mark = HELD.with(|h| h.borrow().len());
        let r = body();
        DEFER.with(|d| d.set(outer));
        let e = lib.group_end();
        if outer {
            // A nested group: the outermost ncclGroupEnd launches the work, and releases
            // the guards then.
            HELD.with(|h| h.borrow_mut().push(inside));
        } else {
            // The work is launched (or failed): the communicators may be aborted now.
            let done = HELD.with(|h| {
                let mut h = h.borrow_mut();
                let at = mark.min(h.len());
                h.split_off(at)
            });
            drop(done);
            drop(inside);
        }
        r.and(e)?;
        if outer {
            return Ok(());
        }
        self.finish(on, "grouped calls")
    }
    fn any_stream(&self) -> bool {
        // Each call is the library's own on the stream it is given; strata keeps no
        // per-call state on a stream of its own.
        true
    }
    fn library_call(&self, on: On<'_>, c: LibCall) -> Option<Result<()>> {
        use Reduction::{AllReduce, ReduceScatter};
        Some(match c {
            LibCall::ReduceScatterMean { send, recv, dtype } => {
                if !self.has_avg(dtype) {
                    return None;
                }
                self.reduce_call(on, ReduceScatter, send.addr, recv, dtype, NCCL_AVG)
            }
            LibCall::AllReduceMean { send, recv, dtype } => {
                if !self.has_avg(dtype) {
                    return None;
                }
                self.reduce_call(on, AllReduce, send.addr, recv, dtype, NCCL_AVG)
            }
            LibCall::AllReduceFrom {
                send,
                recv,
                dtype,
                op,
            } => self.reduce_call(on, AllReduce, send.addr, recv, dtype, op_code(op)),
            LibCall::AllGatherFrom { send, recv } => self.run(on, "ncclAllGather", |c, s| {
                c.all_gather(send.addr, recv.addr, send.len, s)
            }),
            LibCall::BroadcastFrom { send, recv, root } => int(root, "root").and_then(|root| {
                self.run(on, "ncclBroadcast", |c, s| {
                    c.broadcast(send.addr, recv.addr, recv.len, root, s)
                })
            }),
        })
    }
}

impl Transport for NcclTransport {
    fn kind(&self) -> TransportKind {
        match self.vendor {
            Vendor::Nccl => TransportKind::Nccl,
            Vendor::Rccl => TransportKind::Rccl,
        }
    }
    fn world_rank(&self, r: usize) -> usize {
        self.members[r]
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn gpu(&self) -> Option<&dyn GpuTransport> {
        Some(self)
    }

    fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Arc<dyn Transport>>> {
        let all = self.gather_colors(color, key)?;
        let mut group: Vec<(i32, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, (c, _, _))| color.is_some() && *c == color)
            .map(|(r, (_, k, _))| (*k, r))
            .collect();
        group.sort();
        let members: Vec<usize> = group.iter().map(|&(_, r)| all[r].2).collect();
        let new_rank = group.iter().position(|&(_, r)| r == self.rank);
        let native = {
            let _bound = self.face.dev.bind()?;
            let _calls = self.lock()?;
            let d = self.face.dev.clone();
            self.comm
                .split_within(color, key, self.timeout, move || d.bind())
        };
        let made = match native {
            Some(r) => r?,
            None => {
                // No ncclCommSplit: the lowest rank of each color makes a unique id; the
                // ids travel over the parent; each group inits its own communicator.
                let lib = VendorLib::get(self.vendor)?;
                let p = self.members.len();
                let leader = group.iter().map(|&(_, r)| r).min();
                let mut ids = vec![0u8; VENDOR_UNIQUE_ID_BYTES * p];
                if leader == Some(self.rank) {
                    let id = lib.unique_id()?.bytes();
                    ids[self.rank * VENDOR_UNIQUE_ID_BYTES
                        ..(self.rank + 1) * VENDOR_UNIQUE_ID_BYTES]
                        .copy_from_slice(&id);
                }
                Transport::all_gather(self, &mut ids, VENDOR_UNIQUE_ID_BYTES)?;
                match (leader, new_rank) {
                    (Some(l), Some(nr)) => {
                        let mut b = [0u8; VENDOR_UNIQUE_ID_BYTES];
                        b.copy_from_slice(
                            &ids[l * VENDOR_UNIQUE_ID_BYTES..(l + 1) * VENDOR_UNIQUE_ID_BYTES],
                        );
                        let d = self.face.dev.clone();
                        Some(lib.comm_init_rank_within(
                            members.len(),
                            &VendorUniqueId::from_bytes(&b),
                            nr,
                            self.timeout,
                            move || d.bind(),
                        )?)
                    }
                    _ => None,
                }
            }
        };
        match (made, new_rank) {
            (Some(c), Some(r)) => Ok(Some(Arc::new(NcclTransport::wrap(
                self.vendor,
                c,
                r,
                members,
                &self.face.dev,
                self.traffic.clone(),
                self.timeout,
            )?))),
            (None, _) if color.is_none() => Ok(None),
            _ => Err(Error::Internal(format!(
                "{} split: color {color:?} gave no communicator",
                self.vendor.name()
            ))),
        }
    }

    fn traffic(&self) -> Option<Arc<Traffic>> {
        self.traffic.clone()
    }
    fn abort(&self) {
        // Without the lock: marks the communicator aborted at once (later calls fail);
        // ncclCommAbort runs when no call is inside it any more.
        let _ = self
            .comm
            .abort_for("an abort of its communicator: a failed call, a timeout or a user's abort");
    }
    fn barrier(&self) -> Result<()> {
        let mut one = [0u8; 4];
        Transport::all_reduce(self, &mut one, DataType::I32, ReduceOp::Sum)
    }
}

impl P2p for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        staged::send(self, self.timeout, peer, data)
    }
    fn recv(&self, peer: usize, data: &mut [u8]) -> Result<()> {
        staged::recv(self, self.timeout, peer, data)
    }
    fn sendrecv(&self, dst: usize, send: &[u8], src: usize, recv: &mut [u8]) -> Result<()> {
        staged::sendrecv(self, self.timeout, dst, send, src, recv)
    }
}
