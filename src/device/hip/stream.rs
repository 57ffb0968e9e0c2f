//! HIP streams as strata sees them ([`HipStream`]), their events ([`HipEvent`]) and the
//! graphs they capture ([`HipGraph`]).

use super::device::HipDevice;
use super::runtime::check;
use crate::device::reuse::HandlePool;
use crate::device::vendor_api;
use crate::device::{DevAddr, DevEvent, DevGraph, DevStream, Device, Elementwise, QuantCall};
use crate::error::Result;
use crate::kernels_gpu::call::{self, ArgBlock};
use hip_sys::hiprt as sys;
use std::ffi::c_void;
use std::sync::Arc;

/// A HIP event (timing disabled), back in its device's pool on drop.
pub struct HipEvent {
    pub(super) ev: sys::hipEvent_t,
    pool: Arc<HandlePool>,
}

// SAFETY: a hipEvent_t handle may be used from any thread of the process.
unsafe impl Send for HipEvent {}
// SAFETY: as above; the runtime serializes calls on one event.
unsafe impl Sync for HipEvent {}

impl HipEvent {
    /// A new event recorded on `stream`.
    ///
    /// # Safety
    /// `stream` is null or a live stream of the current device.
    pub(super) unsafe fn record(
        pool: &Arc<HandlePool>,
        stream: sys::hipStream_t,
    ) -> Result<HipEvent> {
        let ev = match pool.take() {
            Some(h) => h as sys::hipEvent_t,
            None => {
                let mut ev: sys::hipEvent_t = std::ptr::null_mut();
                // SAFETY: FFI creating an event on the current device.
                let r =
                    unsafe { sys::hipEventCreateWithFlags(&mut ev, sys::hipEventDisableTiming) };
                check(r, || "hipEventCreateWithFlags".to_string())?;
                ev
            }
        };
        // From here the event goes back to the pool whatever happens.
        let ev = HipEvent {
            ev,
            pool: pool.clone(),
        };
        // SAFETY: FFI on an event nobody else holds and the caller's stream (a stream
        // that waited for its previous record keeps that wait).
        let r = unsafe { sys::hipEventRecord(ev.ev, stream) };
        check(r, || "hipEventRecord".to_string())?;
        Ok(ev)
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        self.pool.give(self.ev as usize);
    }
}

impl DevEvent for HipEvent {
    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of a live event.
        let r = unsafe { sys::hipEventQuery(self.ev) };
        match r {
            sys::hipError_t::hipSuccess => Ok(true),
            sys::hipError_t::hipErrorNotReady => Ok(false),
            other => check(other, || "hipEventQuery".to_string()).map(|_| false),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A captured HIP graph and its instantiation, both destroyed on drop.
pub type HipGraph = vendor_api::Graph<HipGraphHandles>;

/// The runtime's handles of a [`HipGraph`].
pub struct HipGraphHandles {
    graph: sys::hipGraph_t,
    exec: sys::hipGraphExec_t,
}

// SAFETY: hipGraph_t / hipGraphExec_t handles may be used from any thread of the process.
unsafe impl Send for HipGraphHandles {}
// SAFETY: as above; `&HipGraphHandles` only launches the executable graph (launches on
// one stream are serialized by the stream).
unsafe impl Sync for HipGraphHandles {}

impl vendor_api::GraphHandles for HipGraphHandles {
    type Dev = HipDevice;
    const VENDOR: &'static str = "HIP";
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        // SAFETY: FFI launching our live executable graph on a live stream of its device
        // (checked by the caller, which binds the device).
        let r = unsafe { sys::hipGraphLaunch(self.exec, stream.raw() as sys::hipStream_t) };
        check(r, || {
            format!("hipGraphLaunch on HIP device {}", stream.device().ordinal())
        })
    }
    fn destroy(&mut self) {
        // SAFETY: FFI destroying our own executable graph and graph, once each (on drop).
        unsafe {
            let _ = sys::hipGraphExecDestroy(self.exec);
            let _ = sys::hipGraphDestroy(self.graph);
        }
    }
}

/// The stream callback of [`DevStream::delay`] (`hipStreamAddCallback`, which every HIP
/// has; `hipLaunchHostFunc` is missing from older runtimes): sleeps the microseconds
/// packed into `user` (a value, never dereferenced).
unsafe extern "C" fn sleep_callback(
    _stream: sys::hipStream_t,
    _status: sys::hipError_t,
    user: *mut c_void,
) {
    std::thread::sleep(std::time::Duration::from_micros(user as usize as u64));
}

/// A non-blocking HIP stream of a [`HipDevice`] (destroyed on drop).
pub struct HipStream {
    pub(super) dev: Arc<HipDevice>,
    pub(super) stream: sys::hipStream_t,
    /// False for a caller's stream ([`Device::borrow_stream`]): never destroyed here.
    pub(super) owned: bool,
}

// SAFETY: a HIP stream handle may be used from any thread (the runtime serializes
// enqueues); the device is Send + Sync.
unsafe impl Send for HipStream {}
// SAFETY: as above; every method only passes the handle to the runtime.
unsafe impl Sync for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _bound = self.dev.bind();
        // SAFETY: FFI destroying the stream created in `new_stream`, once. Work still
        // queued completes first (hipStreamDestroy waits for it).
        let _ = unsafe { sys::hipStreamDestroy(self.stream) };
    }
}

impl HipStream {
    /// Launch `name` with `params`: one pointer to each argument, in the kernel's order.
    fn launch(
        &self,
        name: &str,
        grid: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.dev.func(name)?;
        let _bound = self.dev.bind()?;
        // SAFETY: kernel launch on this live stream. `params` points at locals of the
        // caller that match the kernel's C signature (kernels-cuda/strata_reduce.cuh;
        // StrataQuantArgs & co. by value, repr(C) twins in kernels_gpu::plan) and outlive
        // the call (the runtime copies the arguments). The device addresses come from
        // buffers whose ranges the caller holds borrowed until the stream is finished,
        // and whose sizes `call::prepare` / `call::elementwise` checked.
        let r = unsafe {
            sys::hipModuleLaunchKernel(
                f.0,
                grid,
                1,
                1,
                threads,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(r, || {
            format!(
                "launching {name} ({grid} blocks x {threads} threads) on HIP device {}",
                self.dev.ordinal
            )
        })
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

impl DevStream for HipStream {
    fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }

    fn raw(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI async copy on this stream; both ranges are borrowed by the caller
        // until the stream is finished (`crate::device::finish`).
        let r = unsafe {
            sys::hipMemcpyAsync(
                dst as *mut c_void,
                src as *const c_void,
                bytes,
                sys::hipMemcpyKind::hipMemcpyDeviceToDevice,
                self.stream,
            )
        };
        check(r, || {
            format!(
                "hipMemcpyAsync of {bytes} bytes {src:#x} -> {dst:#x} on HIP device {}",
                self.dev.ordinal
            )
        })
    }

    fn elementwise(&self, e: Elementwise) -> Result<()> {
        let Some((name, grid, threads)) = e.prepare()? else {
            return Ok(());
        };
        match e {
            Elementwise::Reduce {
                acc, src, count, ..
            } => {
                let (mut a, mut s, mut n) = (acc, src, count as u64);
                let args = &mut [arg(&mut a), arg(&mut s), arg(&mut n)];
                self.launch(&name, grid, threads, args)
            }
            Elementwise::Divide { buf, count, n, .. } => {
                let (mut b, mut c, mut d) = (buf, count as u64, n as f64);
                let args = &mut [arg(&mut b), arg(&mut c), arg(&mut d)];
                self.launch(&name, grid, threads, args)
            }
        }
    }

    fn quant(&self, c: &QuantCall) -> Result<()> {
        let Some(p) = call::prepare(c)? else {
            return Ok(());
        };
        match p.args {
            ArgBlock::Quant(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
            ArgBlock::Dequant(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
            ArgBlock::Drq(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
        }
    }

    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of this live stream.
        let r = unsafe { sys::hipStreamQuery(self.stream) };
        match r {
            sys::hipError_t::hipSuccess => Ok(true),
            sys::hipError_t::hipErrorNotReady => Ok(false),
            other => check(other, || {
                format!("hipStreamQuery on HIP device {}", self.dev.ordinal)
            })
            .map(|_| false),
        }
    }

    fn delay(&self, d: std::time::Duration) -> Result<()> {
        let _bound = self.dev.bind()?;
        let us = d.as_micros().min(usize::MAX as u128) as usize;
        // SAFETY: FFI on this live stream; the host function only sleeps and reads its
        // argument as an integer.
        let r = unsafe {
            sys::hipStreamAddCallback(self.stream, Some(sleep_callback), us as *mut c_void, 0)
        };
        check(r, || "hipStreamAddCallback".to_string())
    }

    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        let _bound = self.dev.bind()?;
        // SAFETY: this stream is live and of the bound device.
        Ok(Arc::new(unsafe {
            HipEvent::record(&self.dev.events, self.stream)
        }?))
    }

    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        let ev: &HipEvent = vendor_api::event_of(ev, "HIP")?;
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream and a live event.
        let r = unsafe { sys::hipStreamWaitEvent(self.stream, ev.ev, 0) };
        check(r, || "hipStreamWaitEvent".to_string())
    }

    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI memset on this live stream of a range the caller holds borrowed
        // (inside one allocation) until the stream is finished.
        let r = unsafe { sys::hipMemsetAsync(addr as *mut c_void, 0, bytes, self.stream) };
        check(r, || {
            format!(
                "hipMemsetAsync of {bytes} bytes at {addr:#x} on HIP device {}",
                self.dev.ordinal
            )
        })
    }

    fn begin_capture(&self) -> Result<()> {
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream.
        let r = unsafe {
            sys::hipStreamBeginCapture(
                self.stream,
                sys::hipStreamCaptureMode::hipStreamCaptureModeGlobal,
            )
        };
        check(r, || "hipStreamBeginCapture".to_string())
    }

    fn end_capture(&self) -> Result<Arc<dyn DevGraph>> {
        let _bound = self.dev.bind()?;
        let mut graph: sys::hipGraph_t = std::ptr::null_mut();
        // SAFETY: FFI on this live stream, writing one graph handle.
        let r = unsafe { sys::hipStreamEndCapture(self.stream, &mut graph) };
        check(r, || "hipStreamEndCapture".to_string())?;
        let mut exec: sys::hipGraphExec_t = std::ptr::null_mut();
        // SAFETY: FFI instantiating the graph captured above, writing one handle (no
        // error node or log buffer requested).
        let r = unsafe {
            sys::hipGraphInstantiate(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if let Err(e) = check(r, || "hipGraphInstantiate".to_string()) {
            // SAFETY: FFI destroying the graph captured above, once.
            let _ = unsafe { sys::hipGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Arc::new(HipGraph::new(
            self.dev.clone(),
            HipGraphHandles { graph, exec },
        )))
    }

    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()> {
        let _bound = self.dev.bind()?;
        let mut ev: sys::hipEvent_t = std::ptr::null_mut();
        // SAFETY: FFI creating an event on the current device.
        let r = unsafe { sys::hipEventCreateWithFlags(&mut ev, sys::hipEventDisableTiming) };
        check(r, || "hipEventCreateWithFlags".to_string())?;
        // SAFETY: FFI on the fresh event, the caller's live stream (its contract: null or
        // a stream of this device) and this stream. The event is destroyed once the wait
        // is enqueued; the runtime keeps what the wait needs alive.
        let r = unsafe {
            let r = sys::hipEventRecord(ev, other as sys::hipStream_t);
            if r == sys::hipError_t::hipSuccess {
                sys::hipStreamWaitEvent(self.stream, ev, 0)
            } else {
                r
            }
        };
        // SAFETY: FFI destroying the event created above, once.
        let _ = unsafe { sys::hipEventDestroy(ev) };
        check(r, || {
            format!(
                "waiting for the caller's stream {other:p} on HIP device {}",
                self.dev.ordinal
            )
        })
    }
}
