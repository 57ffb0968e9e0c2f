//! Local operations on buffers wherever they live, for the algorithms: copies,
//! element-wise reductions, the `Avg` division and the quantization kernels. Host
//! buffers use the CPU reference ([`crate::dtype`], [`crate::kernels`]); device buffers
//! the kernels on the communicator's stream ([`crate::device`]), waited for before the
//! call returns, so an algorithm is written once for both. Mixing host and device
//! buffers in one call is an `InvalidArgument`. Nothing here communicates: collectives
//! go through the runtime ([`crate::runtime::CommCore::enqueue`]).

#![forbid(unsafe_code)]

use crate::device::direct::Launched;
use crate::device::{DevStream, Elementwise, QuantCall, Region};
use crate::dtype::{finish_avg, reduce_into, DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::{self, QuantSpec};
use crate::memory::Buffer;
use crate::transport::gpu::GpuTransport;
use crate::transport::Transport;
use std::sync::Arc;
use std::time::Duration;

/// Buffer operations on behalf of one communicator's transport.
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    t: &'a dyn Transport,
    to: Duration,
    /// Inside a launched call: its context and the stream its device work goes on.
    at: Option<Launched<'a>>,
}

impl<'a> Ops<'a> {
    /// Operations for `t`, borrows waiting up to `timeout`; device work on `at`'s stream
    /// inside a launched call (enqueued only), else on `t`'s own (waited for).
    pub fn new(t: &'a dyn Transport, timeout: Duration, at: Option<Launched<'a>>) -> Ops<'a> {
        Ops { t, to: timeout, at }
    }

    /// Where device work goes ([`crate::transport::gpu::On`]).
    #[inline]
    fn on(&self) -> Option<&'a Arc<dyn DevStream>> {
        self.at.map(|a| a.stream)
    }

    /// `Some(gpu)` when every buffer is device memory, `None` when all are host memory.
    fn place(&self, what: &str, bufs: &[&Buffer]) -> Result<Option<&'a dyn GpuTransport>> {
        let dev = bufs.iter().filter(|b| b.is_device()).count();
        if dev == 0 {
            return Ok(None);
        }
        if dev != bufs.len() {
            return Err(Error::InvalidArgument(format!(
                "{what}: host and device buffers mixed"
            )));
        }
        self.t.gpu().map(Some).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "{what} on device buffers needs a GPU transport (this one is {})",
                self.t.kind().name()
            ))
        })
    }

    /// Zeroed scratch of `bytes` next to `like` (host, or its device; inside a launched
    /// call a block of its arena, [`Buffer::alloc_like_in`]).
    pub fn scratch(&self, like: &Buffer, bytes: usize) -> Result<Buffer> {
        match self.at {
            Some(a) => like.alloc_like_in(bytes, a.scope, a.stream),
            None => like.alloc_like(bytes),
        }
    }

    /// `dst = src` (same length; a no-op when they are the same bytes).
    pub fn copy(&self, dst: &Buffer, src: &Buffer) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::Internal(format!(
                "copy of {} bytes into {}",
                src.len(),
                dst.len()
            )));
        }
        if dst.offset_in(src) == Some(0) || src.is_empty() {
            return Ok(());
        }
        match self.place("copy", &[dst, src])? {
            None => {
                let data = src.read_timeout(self.to)?;
                dst.write_timeout(self.to)?.copy_from_slice(&data);
                Ok(())
            }
            Some(g) => {
                let s = src.dev_read_timeout(self.to)?;
                let d = dst.dev_write_timeout(self.to)?;
                crate::transport::gpu::work_stream(g, self.on()).copy(
                    d.addr(),
                    s.addr(),
                    src.len(),
                )?;
                g.finish(self.on(), "copy")
            }
        }
    }

    /// `acc = op(acc, src)` element-wise (`Avg` sums).
    pub fn reduce(&self, acc: &Buffer, src: &Buffer, dtype: DataType, op: ReduceOp) -> Result<()> {
        match self.place("reduce", &[acc, src])? {
            None => {
                let s = src.read_timeout(self.to)?;
                reduce_into(&mut acc.write_timeout(self.to)?, &s, dtype, op);
                Ok(())
            }
            Some(g) => {
                let s = src.dev_read_timeout(self.to)?;
                let a = acc.dev_write_timeout(self.to)?;
                let n = crate::transport::gpu::count_of(acc.len(), dtype)?;
                let e = Elementwise::Reduce {
                    acc: a.addr(),
                    src: s.addr(),
                    count: n,
                    dtype,
                    op,
                };
                crate::transport::gpu::work_stream(g, self.on()).elementwise(e)?;
                g.finish(self.on(), "reduce")
            }
        }
    }

    /// `buf /= n` element-wise, rounded once (the mean of `Avg`).
    pub fn divide(&self, buf: &Buffer, dtype: DataType, n: usize) -> Result<()> {
        match self.place("avg", &[buf])? {
            None => {
                finish_avg(&mut buf.write_timeout(self.to)?, dtype, n);
                Ok(())
            }
            Some(g) => {
                let b = buf.dev_write_timeout(self.to)?;
                let count = crate::transport::gpu::count_of(buf.len(), dtype)?;
                let e = Elementwise::Divide {
                    buf: b.addr(),
                    count,
                    dtype,
                    n,
                };
                crate::transport::gpu::work_stream(g, self.on()).elementwise(e)?;
                g.finish(self.on(), "avg")
            }
        }
    }

    /// One kernel from `src` into `dst`: `host` on host bytes (the CPU reference), else
    /// the device kernel `call(src region, dst region)` on the communicator's stream.
    fn kernel(
        &self,
        what: &str,
        src: &Buffer,
        dst: &Buffer,
        host: impl FnOnce(&[u8], &mut [u8]) -> Result<()>,
        call: impl FnOnce(Region, Region) -> QuantCall,
    ) -> Result<()> {
        match self.place(what, &[src, dst])? {
            None => host(
                &src.read_timeout(self.to)?,
                &mut dst.write_timeout(self.to)?,
            ),
            Some(g) => {
                let s = src.dev_read_timeout(self.to)?;
                let d = dst.dev_write_timeout(self.to)?;
                crate::transport::gpu::work_stream(g, self.on())
                    .quant(&call(s.region(), d.region()))?;
                g.finish(self.on(), what)
            }
        }
    }

    /// [`kernels::quantize`] of `src` into `dst`.
    pub fn quantize(&self, q: QuantSpec, dt: DataType, src: &Buffer, dst: &Buffer) -> Result<()> {
        self.kernel(
            "quantize",
            src,
            dst,
            |s, d| kernels::quantize(q, dt, s, d),
            |src, dst| QuantCall::Quantize {
                spec: q,
                dtype: dt,
                src,
                dst,
            },
        )
    }

    /// [`kernels::swizzled_quantize`].
    #[allow(clippy::too_many_arguments)]
    pub fn swizzled_quantize(
        &self,
        q: QuantSpec,
        dt: DataType,
        src: &Buffer,
        c: usize,
        nodes: usize,
        devices: usize,
        stages: usize,
        dst: &Buffer,
    ) -> Result<()> {
        self.kernel(
            "swizzled_quantize",
            src,
            dst,
            |s, d| kernels::swizzled_quantize(q, dt, s, c, nodes, devices, stages, d),
            |src, dst| QuantCall::Swizzled {
                spec: q,
                dtype: dt,
                src,
                c,
                nodes,
                devices,
                stages,
                dst,
            },
        )
    }

    /// [`kernels::dequant_reduce`] of the first `k` packed slices of `n` elements in
    /// `inputs` (contiguous, `packed_len(n)` bytes apart) into `dst`.
    #[allow(clippy::too_many_arguments)]
    pub fn dequant_reduce(
        &self,
        q: QuantSpec,
        inputs: &Buffer,
        k: usize,
        n: usize,
        op: ReduceOp,
        divisor: usize,
        dt: DataType,
        dst: &Buffer,
    ) -> Result<()> {
        let per = q.packed_len(n);
        self.kernel(
            "dequant_reduce",
            &inputs.slice(0..k * per)?,
            dst,
            |s, d| kernels::dequant_reduce(q, &split(s, k, per), n, op, divisor, dt, d),
            |inputs, dst| QuantCall::DequantReduce {
                spec: q,
                inputs,
                k,
                n,
                op,
                divisor,
                dtype: dt,
                dst,
            },
        )
    }

    /// [`kernels::dequantize`] (a dequant-reduce of one input).
    pub fn dequantize(
        &self,
        q: QuantSpec,
        src: &Buffer,
        n: usize,
        dt: DataType,
        dst: &Buffer,
    ) -> Result<()> {
        self.dequant_reduce(q, src, 1, n, ReduceOp::Sum, 1, dt, dst)
    }

    /// [`kernels::dequant_reduce_quant`] of `k` contiguous inputs of `slices` packed
    /// slices of `n` elements into `dst`.
    pub fn dequant_reduce_quant(
        &self,
        q: QuantSpec,
        inputs: &Buffer,
        k: usize,
        n: usize,
        slices: usize,
        dst: &Buffer,
    ) -> Result<()> {
        let per = q.packed_len(n) * slices;
        self.kernel(
            "dequant_reduce_quant",
            &inputs.slice(0..k * per)?,
            dst,
            |s, d| kernels::dequant_reduce_quant(q, &split(s, k, per), n, slices, d),
            |inputs, dst| QuantCall::DequantReduceQuant {
                spec: q,
                inputs,
                k,
                n,
                slices,
                dst,
            },
        )
    }
}

/// `k` consecutive inputs of `per` bytes (empty ones when `per` is 0).
fn split(bytes: &[u8], k: usize, per: usize) -> Vec<&[u8]> {
    (0..k).map(|i| &bytes[i * per..(i + 1) * per]).collect()
}
