//! What the CUDA and HIP devices share above their runtime calls: NCCL's check of a
//! buffer (its first and last byte, each asked of the runtime once per allocation
//! range), the errors that name a byte that is not memory of the device, a captured
//! graph (launched only on a stream of its own device, destroyed with the device bound)
//! and the downcast of an event. Each
//! backend keeps only its FFI (the queries themselves) and what its runtime says
//! differently.

#![forbid(unsafe_code)]
// Only `event_of` serves the CPU device; the rest the GPU backends.
#![cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]

use super::reuse::CheckedRanges;
use super::{Api, DevAddr, DevEvent, DevGraph, DevStream, Device};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, Weak};

/// The first and last byte of `len` bytes at `addr`: `None` for 0 bytes, else a clear
/// `InvalidArgument` for a null address or a range past the end of the address space
/// (what `check_pointer` checks on CUDA and HIP: the first and the last byte).
fn span_ends(addr: DevAddr, len: usize) -> Result<Option<(DevAddr, DevAddr)>> {
    if len == 0 {
        return Ok(None);
    }
    if addr == 0 {
        return Err(Error::InvalidArgument(format!(
            "a null device pointer for {len} bytes"
        )));
    }
    match addr.checked_add(len as u64 - 1) {
        Some(last) => Ok(Some((addr, last))),
        None => Err(Error::InvalidArgument(format!(
            "{len} bytes at {addr:#x} run past the end of the address space"
        ))),
    }
}

/// The runtime queries behind a GPU device's `check_pointer` ([`check_span`]).
pub(super) trait PointerQueries: Device {
    /// Allocation ranges already found to be memory of this device.
    fn ranges(&self) -> &CheckedRanges;
    /// `Ok` when the byte at `p` (the `which` byte of `len` bytes at `addr`) is device
    /// memory of this device, else an `InvalidArgument` ([`byte_error`]) saying which
    /// byte and why. The device is bound.
    fn check_byte(&self, p: DevAddr, addr: DevAddr, len: usize, which: &str) -> Result<()>;
    /// Record the allocation range holding `p` (checked just before; the device is
    /// bound) in [`PointerQueries::ranges`], as the runtime reports it.
    fn remember(&self, p: DevAddr);
}

/// `check_pointer` of a GPU device: the first and the last byte, as NCCL checks a
/// buffer (a tensor may span several mappings, PyTorch's expandable_segments maps memory
/// in pieces, which the runtime reports one at a time; the interior is the vendor
/// library's to check). A byte inside a range seen before is not queried again (NCCL
/// queries nothing by default); a range strata frees leaves the cache, one the caller
/// frees and the runtime hands to another device is the vendor library's to refuse.
pub(super) fn check_span(dev: &impl PointerQueries, addr: DevAddr, len: usize) -> Result<()> {
    let Some((first, last)) = span_ends(addr, len)? else {
        return Ok(());
    };
    if dev.ranges().known(first) && dev.ranges().known(last) {
        return Ok(());
    }
    let _bound = dev.bind()?;
    dev.check_byte(first, addr, len, "first")?;
    if last != first {
        dev.check_byte(last, addr, len, "last")?;
    }
    dev.remember(first);
    if last != first {
        dev.remember(last);
    }
    Ok(())
}

/// Why one byte a call passes is not memory of the device, as its runtime says.
pub(super) enum Fault {
    /// The runtime does not know the address: `by` (`the driver`, `HIP`) says `why`.
    Unknown { by: &'static str, why: String },
    /// Memory of another type (host, managed) as the runtime numbers it.
    MemoryType(i64),
    /// The runtime cannot tell the device of the memory: why (CUDA's second query).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    NoDevice(String),
    /// Memory of another device (its ordinal).
    OtherDevice(i64),
}

/// The `InvalidArgument` for the byte at `p`, the `which` byte of `len` bytes at `addr`,
/// on device `ordinal` of `vendor` (`CUDA`, `HIP`); `hint` says which transports take
/// device pointers.
pub(super) fn byte_error(
    vendor: &str,
    hint: &str,
    ordinal: usize,
    (p, addr, len, which): (DevAddr, DevAddr, usize, &str),
    fault: Fault,
) -> Error {
    let what = if len == 1 {
        format!("the byte at {addr:#x}")
    } else {
        format!("the {which} byte ({p:#x}) of {len} bytes at {addr:#x}")
    };
    Error::InvalidArgument(match fault {
        Fault::Unknown { by, why } => {
            format!("{what} is not {vendor} device memory (unknown to {by}: {why}): {hint}")
        }
        Fault::MemoryType(kind) => {
            format!("{what} is not {vendor} device memory (memory type {kind}): {hint}")
        }
        Fault::NoDevice(why) => format!("{what}: {vendor} cannot tell its device ({why}): {hint}"),
        Fault::OtherDevice(o) => format!(
            "{what} is memory of {vendor} device {o}, the communicator runs on device {ordinal}"
        ),
    })
}

/// The handles of a captured graph and of its instantiation as one GPU runtime holds
/// them ([`Graph`] launches and destroys them with their device bound).
pub trait GraphHandles: Send + Sync + 'static {
    /// The device that captured the graph.
    type Dev: Device;
    /// The runtime's name in errors (`CUDA`, `HIP`).
    const VENDOR: &'static str;
    /// Launch the executable graph on `stream`, a stream of the graph's device.
    fn launch(&self, stream: &dyn DevStream) -> Result<()>;
    /// Destroy the executable graph and the graph (called once, on drop); launches
    /// already enqueued keep what they need.
    fn destroy(&mut self);
}

/// A captured graph of a CUDA or HIP device and its instantiation, both destroyed on
/// drop.
pub struct Graph<H: GraphHandles> {
    dev: Arc<H::Dev>,
    handles: H,
}

impl<H: GraphHandles> Graph<H> {
    /// The graph `handles` captured on `dev`.
    pub(super) fn new(dev: Arc<H::Dev>, handles: H) -> Self {
        Graph { dev, handles }
    }
}

impl<H: GraphHandles> Drop for Graph<H> {
    fn drop(&mut self) {
        let _bound = self.dev.bind();
        self.handles.destroy();
    }
}

impl<H: GraphHandles> DevGraph for Graph<H> {
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        graph_stream(self.dev.api(), H::VENDOR, self.dev.ordinal(), stream)?;
        let _bound = self.dev.bind()?;
        self.handles.launch(stream)
    }
}

/// `Ok` when `stream` is a stream of device `ordinal` of `api` (whose runtime is
/// `vendor`), where a graph of that device may be launched.
fn graph_stream(api: Api, vendor: &str, ordinal: usize, stream: &dyn DevStream) -> Result<()> {
    let d = stream.device();
    if d.api() != api || d.ordinal() != ordinal {
        return Err(Error::InvalidArgument(format!(
            "a graph of {vendor} device {ordinal} launched on a stream of {} device {}",
            d.api().name(),
            d.ordinal()
        )));
    }
    Ok(())
}

/// `ev` as an event of the device whose streams `vendor` names (`CUDA`, `HIP`, `cpu`).
pub(super) fn event_of<'a, E: 'static>(ev: &'a dyn DevEvent, vendor: &str) -> Result<&'a E> {
    ev.as_any().downcast_ref::<E>().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "an event of another device given to a {vendor} stream"
        ))
    })
}

/// The devices of one backend open in this process, by ordinal: opening an ordinal that
/// is open returns the same device (its kernels loaded once while it is in use).
pub(super) struct Opened<T>(Mutex<Vec<(usize, Weak<T>)>>);

impl<T> Opened<T> {
    pub(super) const fn new() -> Self {
        Opened(Mutex::new(Vec::new()))
    }

    /// The open device `ordinal`, else the one `make` opens (recorded; the table is held
    /// meanwhile, so an ordinal is opened once however many threads ask).
    pub(super) fn get_or_open(
        &self,
        ordinal: usize,
        make: impl FnOnce() -> Result<Arc<T>>,
    ) -> Result<Arc<T>> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = open
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(d);
        }
        let d = make()?;
        open.retain(|(_, w)| w.strong_count() > 0);
        open.push((ordinal, Arc::downgrade(&d)));
        Ok(d)
    }
}
