//! The CPU device's streams as strata sees them ([`CpuStream`], a [`DevStream`] over
//! one lane), the graphs they capture ([`CpuGraph`]) and the count of entries a call
//! makes on a stream ([`entries`]).

use super::capture::Capture;
use super::device::CpuDevice;
use super::lanes::{cpu_event, Lane, Node, Task};
use crate::device::{Api, DevAddr, DevEvent, DevGraph, DevStream, Device, Elementwise, QuantCall};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

/// Entries the host has made on `stream` (a stream of the CPU device) since it was
/// created: operations (copies, kernels, zeroing, delays, graph launches), event records
/// and event waits, each one, as a CUDA stream takes one launch, `cuEventRecord` or
/// `cuStreamWaitEvent` each. How the tests count what a call puts on its caller's
/// stream (NCCL puts its kernel there; `docs/gpu.md`, "Entries per call"). An error for
/// a stream of another device.
pub fn entries(stream: &dyn DevStream) -> Result<u64> {
    let dev = stream.device();
    if dev.api() != Api::Cpu {
        return Err(Error::InvalidArgument(format!(
            "stream entries are counted by the cpu device only, not {}",
            dev.api().name()
        )));
    }
    let cpu = CpuDevice::open(dev.ordinal())?;
    let lane = cpu.lane_of(stream.raw())?;
    let n = lane.lock()?.entries;
    Ok(n)
}

/// A stream of the CPU device: a worker thread and its queue.
pub struct CpuStream {
    pub(super) dev: Arc<CpuDevice>,
    pub(super) lane: Arc<Lane>,
    /// False for a borrowed stream ([`Device::borrow_stream`]): its drop closes nothing.
    pub(super) owned: bool,
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // As cuStreamDestroy: returns at once; queued work still runs, then the worker
        // ends.
        if let Ok(mut q) = self.lane.lock() {
            q.closed = true;
        }
        self.lane.work.notify_all();
        self.lane.cv.notify_all();
    }
}

impl CpuStream {
    fn push(&self, t: Task) -> Result<()> {
        self.lane.push(t)
    }
}

impl DevStream for CpuStream {
    fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }
    fn raw(&self) -> *mut c_void {
        Arc::as_ptr(&self.lane) as *mut c_void
    }
    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.push(Task::Copy { dst, src, bytes })
    }
    fn elementwise(&self, e: Elementwise) -> Result<()> {
        if e.prepare()?.is_none() {
            return Ok(());
        }
        self.push(Task::Elementwise(e))
    }
    fn quant(&self, call: &QuantCall) -> Result<()> {
        self.push(Task::Quant(*call))
    }
    fn query(&self) -> Result<bool> {
        let q = self.lane.lock()?;
        if let Some((cap, _)) = &q.capture {
            let cap = cap.clone();
            drop(q);
            return Err(cap.fail("a capturing stream was queried or synchronized".into()));
        }
        if let Some(e) = &q.error {
            return Err(e.clone());
        }
        Ok(q.done == q.enqueued)
    }
    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()> {
        let lane = self.dev.lane_of(other)?;
        if Arc::ptr_eq(&lane, &self.lane) {
            return Ok(());
        }
        let ev = lane.record()?;
        self.lane.wait_event(&ev)
    }
    fn delay(&self, d: Duration) -> Result<()> {
        self.push(Task::Delay(d))
    }
    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        Ok(Arc::new(self.lane.record()?))
    }
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        self.lane.wait_event(cpu_event(ev)?)
    }
    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.push(Task::Zero { addr, bytes })
    }
    fn begin_capture(&self) -> Result<()> {
        let mut q = self.lane.lock()?;
        if q.capture.is_some() {
            return Err(Error::InvalidUsage(
                "begin_capture: the stream is already capturing".into(),
            ));
        }
        let cap = Arc::new(Capture::new(self.lane.id));
        q.capture = Some((cap.clone(), Vec::new()));
        drop(q);
        self.dev.state()?.captures.push(cap);
        Ok(())
    }
    fn end_capture(&self) -> Result<Arc<dyn DevGraph>> {
        let (cap, front) = {
            let mut q = self.lane.lock()?;
            match q.capture.take() {
                Some((c, f)) if c.origin == self.lane.id => (c, f),
                other => {
                    q.capture = other;
                    return Err(Error::InvalidUsage(
                        "end_capture on a stream that did not begin a capture".into(),
                    ));
                }
            }
        };
        self.dev.state()?.captures.retain(|c| !Arc::ptr_eq(c, &cap));
        let joined = std::mem::take(&mut cap.lock()?.joined);
        let mut fronts = Vec::new();
        for l in joined {
            let mut q = l.lock()?;
            if q.capture
                .as_ref()
                .is_some_and(|(c, _)| Arc::ptr_eq(c, &cap))
            {
                if let Some((_, f)) = q.capture.take() {
                    fronts.push((l.id, f));
                }
            }
        }
        let nodes = cap.graph(front, &fronts)?;
        Ok(Arc::new(CpuGraph {
            dev: self.dev.clone(),
            nodes: Arc::new(nodes),
        }))
    }
}

/// A graph captured on the CPU device: its operations, replayed in a topological order
/// on the stream it is launched on.
pub struct CpuGraph {
    dev: Arc<CpuDevice>,
    nodes: Arc<Vec<Node>>,
}

impl CpuGraph {
    /// Operations in the graph.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    /// True for an empty graph.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

impl DevGraph for CpuGraph {
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        self.dev
            .lane_of(stream.raw())?
            .push(Task::Graph(self.nodes.clone()))
    }
}
