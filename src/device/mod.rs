//! Devices: GPU memory, streams, events and strata's kernels behind one object-safe
//! interface, so buffers, algorithms and the GPU transports are written once for CUDA
//! ([`cuda`], feature `cuda`, through cudarc) and HIP ([`hip`], feature `rocm`, through
//! hip-sys).
//!
//! - Addresses are plain device addresses ([`DevAddr`]); what makes them sound to use is
//!   the borrow table of [`crate::memory::Buffer`], which hands them out only while the
//!   range is borrowed.
//! - A [`DevStream`] is an ordered queue on one device: copies, the reduction kernels
//!   (`kernels-cuda/strata_reduce.cuh`), the quantization kernels
//!   (`kernels-cuda/strata_quant.cuh`), events. Calls enqueue and return; [`finish`]
//!   waits for the queue with a deadline and an error probe (a vendor communicator's
//!   asynchronous error), so a dead peer is an error, never a hang.
//! - Collectives on device memory are stream-ordered ([`crate::comm::ordered`]): a
//!   caller's stream is joined with an event ([`DevStream::record`], recorded at the
//!   call) and released by a completion word (`Device::wait_value_on`,
//!   `DevStream::write_value`); the communicator's own streams run the work, each
//!   stage waited for with [`finish`] on the communicator's stream thread.
//! - Freed memory goes to a per-device cache ([`pool`]); a stream-ordered call's scratch
//!   comes from its communicator's arena ([`direct`]), which is also the capturable path
//!   (streams capture into graphs: [`DevStream::begin_capture`], [`DevGraph`]); the CPU
//!   device ([`cpu`]) runs all of it on the host, which is how CI tests the device paths.

use crate::error::{Error, Result};
pub use crate::kernels_gpu::launch::{
    check_aligned, elementwise_grid, DevAddr, Elementwise, QuantCall, Region,
};
use std::sync::Arc;

mod api;
pub mod at_exit;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod direct;
#[cfg(feature = "rocm")]
pub mod hip;
pub mod pool;
pub mod reuse;
mod vendor_api;
pub mod waits;
pub mod watch;
pub use api::{
    finish, release_cached, wait_event, Api, Bound, DevEvent, DevGraph, DevStream, Device,
};

/// Open device `ordinal` of `api`: [`Error::NotCompiled`] without the feature,
/// [`Error::System`] without the runtime library, [`Error::Device`] without the device.
pub fn open(api: Api, ordinal: usize) -> Result<Arc<dyn Device>> {
    match api {
        #[cfg(feature = "cuda")]
        Api::Cuda => Ok(cuda::CudaDevice::open(ordinal)?),
        #[cfg(feature = "rocm")]
        Api::Hip => Ok(hip::HipDevice::open(ordinal)?),
        Api::Cpu => Ok(cpu::CpuDevice::open(ordinal)?),
        #[allow(unreachable_patterns)]
        other => {
            let _ = ordinal;
            Err(Error::NotCompiled(format!(
                "{} devices need the `{}` feature (cargo build --features {})",
                other.name(),
                feature_of(other),
                feature_of(other)
            )))
        }
    }
}

/// Devices of `api` present (0 without the feature, the runtime or a device).
pub fn count(api: Api) -> usize {
    match api {
        #[cfg(feature = "cuda")]
        Api::Cuda => cuda::CudaDevice::count(),
        #[cfg(feature = "rocm")]
        Api::Hip => hip::HipDevice::count(),
        Api::Cpu => 1,
        #[allow(unreachable_patterns)]
        _ => 0,
    }
}

fn feature_of(api: Api) -> &'static str {
    match api {
        Api::Cuda => "cuda",
        Api::Hip => "rocm",
        Api::Cpu => "none",
    }
}

/// Device memory behind a [`crate::memory::Buffer`]: owned (freed on drop) or a
/// caller's (C ABI, Python: borrowed for the duration of a blocking call).
pub struct DeviceMem {
    dev: Arc<dyn Device>,
    addr: DevAddr,
    len: usize,
    owned: bool,
}

impl DeviceMem {
    /// `bytes` zeroed bytes on `dev`: a cached block of the size class when there is one
    /// ([`pool`]), else a new allocation. Dropping it returns the block to the cache.
    /// (A launched call's scratch comes from its arena instead: [`direct::Scope::alloc`].)
    pub fn alloc(dev: &Arc<dyn Device>, bytes: usize) -> Result<DeviceMem> {
        DeviceMem::cached(dev, bytes, true, None)
    }

    /// `bytes` bytes on `dev` whose contents are unspecified: a cached block of the size
    /// class (not zeroed, so nothing waits for the device) or a new allocation, zeroed on
    /// the private stream. For buffers fully written in stream order before they are read
    /// (an eager message, a scratch or arena block cleared by its user). Never an arena
    /// block. Inside a launch: [`DeviceMem::alloc_uninit_on`].
    pub fn alloc_uninit(dev: &Arc<dyn Device>, bytes: usize) -> Result<DeviceMem> {
        DeviceMem::cached(dev, bytes, false, None)
    }

    /// [`DeviceMem::alloc_uninit`] for work that goes on `on` (a launched call's stream):
    /// a new block is made in that stream's order when `on` is a stream of `dev`
    /// ([`Device::alloc_in_order`]): no host wait, not even on the private stream, whose
    /// work can queue behind other streams' on the device (an H200, driver 580: a first
    /// launched call's `cuStreamSynchronize` of the private stream waited 500 ms for a
    /// delay kernel on another rank's stream, in 3 of 10 runs).
    pub fn alloc_uninit_on(
        dev: &Arc<dyn Device>,
        bytes: usize,
        on: Option<&Arc<dyn DevStream>>,
    ) -> Result<DeviceMem> {
        DeviceMem::cached(dev, bytes, false, on)
    }

    /// A new block of `bytes` in `on`'s order when it is a stream of `dev`.
    fn in_order(
        dev: &Arc<dyn Device>,
        bytes: usize,
        on: Option<&Arc<dyn DevStream>>,
    ) -> Result<Option<DevAddr>> {
        let Some(st) = on else {
            return Ok(None);
        };
        let d = st.device();
        if d.api() != dev.api() || d.ordinal() != dev.ordinal() {
            return Ok(None);
        }
        st.alloc_in_order(bytes)
    }

    /// A cached block of `bytes`' size class (zeroed on the private stream when `zero`),
    /// else a new allocation (zeroed, or in `on`'s order when not `zero`).
    fn cached(
        dev: &Arc<dyn Device>,
        bytes: usize,
        zero: bool,
        on: Option<&Arc<dyn DevStream>>,
    ) -> Result<DeviceMem> {
        let addr = if bytes == 0 {
            0
        } else {
            let class = pool::Pool::class(bytes);
            match dev.pool().take(class) {
                Some(a) => {
                    if zero {
                        if let Err(e) = dev.zero(a, bytes) {
                            dev.pool().put(class, a);
                            return Err(e);
                        }
                    }
                    a
                }
                None if !zero => match DeviceMem::in_order(dev, class, on)? {
                    Some(a) => a,
                    None => dev.alloc_zeroed(class)?,
                },
                None => dev.alloc_zeroed(class)?,
            }
        };
        Ok(DeviceMem {
            dev: dev.clone(),
            addr,
            len: bytes,
            owned: true,
        })
    }

    /// The caller's memory, never freed by strata.
    ///
    /// # Safety
    /// `len` bytes at `addr` are device memory of `dev` and stay allocated, and are not
    /// used by anyone else, for as long as this value (and every buffer over it) lives.
    pub unsafe fn foreign(dev: &Arc<dyn Device>, addr: DevAddr, len: usize) -> DeviceMem {
        DeviceMem {
            dev: dev.clone(),
            addr,
            len,
            owned: false,
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
    /// Address of byte 0.
    pub fn addr(&self) -> DevAddr {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.owned && self.addr != 0 {
            // Back to the cache (freed when the device is dropped): buffers over it are
            // gone (they hold the Arc that owns this value) and the device paths finish
            // their streams before a collective completes.
            self.dev.pool().put(pool::Pool::class(self.len), self.addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_the_feature_is_not_compiled() {
        if !cfg!(feature = "cuda") {
            let e = open(Api::Cuda, 0).unwrap_err();
            assert!(matches!(e, Error::NotCompiled(_)), "{e}");
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
        if !cfg!(feature = "rocm") {
            let e = open(Api::Hip, 0).unwrap_err();
            assert!(matches!(e, Error::NotCompiled(_)), "{e}");
            assert!(e.to_string().contains("rocm"), "{e}");
        }
    }
}
