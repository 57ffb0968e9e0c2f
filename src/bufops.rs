//! Local operations on buffers wherever they live, for the algorithms: copies,
//! element-wise reductions, the `Avg` division and the quantization kernels. Host
//! buffers use the CPU reference ([`crate::dtype`], [`crate::kernels`]); device buffers
//! the kernels on the communicator's stream ([`crate::device`]), waited for before the
//! call returns, so an algorithm is written once for both. Mixing host and device
//! buffers in one call is an `InvalidArgument`.

use crate::device::QuantCall;
use crate::dtype::{finish_avg, reduce_into, DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::{self, QuantSpec};
use crate::memory::Buffer;
use crate::transport::gpu::GpuTransport;
use crate::transport::Transport;
use std::time::Duration;

/// Buffer operations on behalf of one communicator's transport.
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    t: &'a dyn Transport,
    to: Duration,
}

impl<'a> Ops<'a> {
    /// Operations for `t` (device work on its stream), borrows waiting up to `timeout`.
    pub fn new(t: &'a dyn Transport, timeout: Duration) -> Ops<'a> {
        Ops { t, to: timeout }
    }

    /// For a communicator.
    pub fn of(comm: &'a crate::comm::Comm) -> Ops<'a> {
        Ops::new(comm.transport().as_ref(), comm.timeout())
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

    /// Zeroed scratch of `bytes` next to `like` (host, or its device).
    pub fn scratch(&self, like: &Buffer, bytes: usize) -> Result<Buffer> {
        like.alloc_like(bytes)
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
                g.stream().copy(d.addr(), s.addr(), src.len())?;
                g.finish("copy")
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
                g.stream().reduce(a.addr(), s.addr(), n, dtype, op)?;
                g.finish("reduce")
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
                g.stream().divide(b.addr(), count, dtype, n)?;
                g.finish("avg")
            }
        }
    }

    fn launch(&self, g: &dyn GpuTransport, call: QuantCall, what: &str) -> Result<()> {
        g.stream().quant(&call)?;
        g.finish(what)
    }

    /// [`kernels::quantize`] of `src` into `dst`.
    pub fn quantize(&self, q: QuantSpec, dt: DataType, src: &Buffer, dst: &Buffer) -> Result<()> {
        match self.place("quantize", &[src, dst])? {
            None => kernels::quantize(
                q,
                dt,
                &src.read_timeout(self.to)?,
                &mut dst.write_timeout(self.to)?,
            ),
            Some(g) => {
                let (s, d) = (
                    src.dev_read_timeout(self.to)?,
                    dst.dev_write_timeout(self.to)?,
                );
                self.launch(
                    g,
                    QuantCall::Quantize {
                        spec: q,
                        dtype: dt,
                        src: s.region(),
                        dst: d.region(),
                    },
                    "quantize",
                )
            }
        }
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
        match self.place("swizzled_quantize", &[src, dst])? {
            None => kernels::swizzled_quantize(
                q,
                dt,
                &src.read_timeout(self.to)?,
                c,
                nodes,
                devices,
                stages,
                &mut dst.write_timeout(self.to)?,
            ),
            Some(g) => {
                let (s, d) = (
                    src.dev_read_timeout(self.to)?,
                    dst.dev_write_timeout(self.to)?,
                );
                self.launch(
                    g,
                    QuantCall::Swizzled {
                        spec: q,
                        dtype: dt,
                        src: s.region(),
                        c,
                        nodes,
                        devices,
                        stages,
                        dst: d.region(),
                    },
                    "swizzled_quantize",
                )
            }
        }
    }

    /// [`kernels::dequant_reduce`] of the first `k` packed slices of `n` elements in
    /// `inputs` (contiguous, `per` bytes apart) into `dst`.
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
        let inputs = inputs.slice(0..k * per)?;
        match self.place("dequant_reduce", &[&inputs, dst])? {
            None => {
                let g = inputs.read_timeout(self.to)?;
                let ins: Vec<&[u8]> = if per == 0 {
                    vec![&[][..]; k]
                } else {
                    g.chunks(per).collect()
                };
                kernels::dequant_reduce(
                    q,
                    &ins,
                    n,
                    op,
                    divisor,
                    dt,
                    &mut dst.write_timeout(self.to)?,
                )
            }
            Some(gt) => {
                let (s, d) = (
                    inputs.dev_read_timeout(self.to)?,
                    dst.dev_write_timeout(self.to)?,
                );
                self.launch(
                    gt,
                    QuantCall::DequantReduce {
                        spec: q,
                        inputs: s.region(),
                        k,
                        n,
                        op,
                        divisor,
                        dtype: dt,
                        dst: d.region(),
                    },
                    "dequant_reduce",
                )
            }
        }
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
        if !src.is_device() {
            return kernels::dequantize(
                q,
                &src.read_timeout(self.to)?,
                n,
                dt,
                &mut dst.write_timeout(self.to)?,
            );
        }
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
        match self.place("dequant_reduce_quant", &[inputs, dst])? {
            None => {
                let g = inputs.read_timeout(self.to)?;
                let run = (g.len() / k.max(1)).max(1);
                let ins: Vec<&[u8]> = g.chunks(run).collect();
                kernels::dequant_reduce_quant(q, &ins, n, slices, &mut dst.write_timeout(self.to)?)
            }
            Some(gt) => {
                let (s, d) = (
                    inputs.dev_read_timeout(self.to)?,
                    dst.dev_write_timeout(self.to)?,
                );
                self.launch(
                    gt,
                    QuantCall::DequantReduceQuant {
                        spec: q,
                        inputs: s.region(),
                        k,
                        n,
                        slices,
                        dst: d.region(),
                    },
                    "dequant_reduce_quant",
                )
            }
        }
    }

    /// The transport's native all-to-all of `send` into `recv` (host or device), on the
    /// calling (stream) thread.
    pub fn all_to_all(&self, send: &Buffer, recv: &Buffer) -> Result<()> {
        let op = crate::comm::Op::AllToAll {
            send: send.clone(),
            recv: recv.clone(),
            count: send.len() / self.t.size().max(1),
        };
        crate::comm::native::run(self.t, &op, DataType::U8, self.to)
    }

    /// The transport's native in-place all-gather of `chunk` bytes per rank in `buf`.
    pub fn all_gather_in_place(&self, buf: &Buffer, chunk: usize) -> Result<()> {
        let r = self.t.rank();
        let op = crate::comm::Op::AllGather {
            send: buf.slice(r * chunk..(r + 1) * chunk)?,
            recv: buf.clone(),
            count: chunk,
        };
        crate::comm::native::run(self.t, &op, DataType::U8, self.to)
    }
}
