//! What the CPU device's operations do: copies, reductions, zeroing and the
//! quantization kernels run on the CPU reference ([`crate::kernels`],
//! [`crate::dtype`]) after the same argument checks as the GPU launches
//! ([`crate::kernels_gpu::call`]), so results are bitwise those the GPU kernels are
//! tested against; each through the race check ([`super::races`]).

#![forbid(unsafe_code)]

use super::lanes::{Lane, Task};
use super::races::Memory;
use crate::device::{Elementwise, QuantCall, Region};
use crate::dtype::{finish_avg, reduce_into, ReduceOp};
use crate::error::Result;
use crate::kernels;
use std::time::{Duration, Instant};

/// Run one operation of stream `lane` (a lane's executor).
pub(super) fn exec(dev: &Memory, lane: &Lane, task: Task) -> Result<()> {
    let reg = |addr, len| Region { addr, len };
    match task {
        Task::Copy { dst, src, bytes } => {
            dev.run_op(lane.id, &[reg(src, bytes)], &[reg(dst, bytes)], |r, w| {
                w[0].copy_from_slice(r[0]);
                Ok(())
            })
        }
        Task::Elementwise(Elementwise::Reduce {
            acc,
            src,
            count,
            dtype,
            op,
        }) => {
            let b = count * dtype.size();
            dev.run_op(lane.id, &[reg(src, b)], &[reg(acc, b)], |r, w| {
                reduce_into(w[0], r[0], dtype, op);
                Ok(())
            })
        }
        Task::Elementwise(Elementwise::Divide {
            buf,
            count,
            dtype,
            n,
        }) => {
            let b = count * dtype.size();
            dev.run_op(lane.id, &[], &[reg(buf, b)], |_, w| {
                finish_avg(w[0], dtype, n);
                Ok(())
            })
        }
        Task::Quant(c) => quant(dev, lane.id, &c),
        Task::Wait { lane: other, seq } => {
            // Bounded only by the other stream: a stream waiting on work that never
            // completes stalls, as on a GPU; `finish` on the host reports it.
            while !other.wait_done(seq, Instant::now() + Duration::from_secs(3600))? {}
            Ok(())
        }
        Task::Delay(d) => {
            std::thread::sleep(d);
            Ok(())
        }
        Task::Zero { addr, bytes } => dev.run_op(lane.id, &[], &[reg(addr, bytes)], |_, w| {
            w[0].fill(0);
            Ok(())
        }),
        Task::Graph(nodes) => nodes
            .iter()
            .try_for_each(|n| exec(dev, lane, n.task.clone())),
    }
}

/// Split `inputs` into `k` equal sender slices.
fn senders(inputs: &[u8], k: usize) -> Vec<&[u8]> {
    let per = inputs.len() / k.max(1);
    (0..k).map(|s| &inputs[s * per..(s + 1) * per]).collect()
}

/// A quantization kernel on the CPU reference, after the GPU launch's checks.
fn quant(dev: &Memory, lane: u64, c: &QuantCall) -> Result<()> {
    if crate::kernels_gpu::call::prepare(c)?.is_none() {
        return Ok(());
    }
    match *c {
        QuantCall::Quantize {
            spec,
            dtype,
            src,
            dst,
        } => dev.run_op(lane, &[src], &[dst], |r, w| {
            kernels::quantize(spec, dtype, r[0], w[0])
        }),
        QuantCall::Swizzled {
            spec,
            dtype,
            src,
            c,
            nodes,
            devices,
            stages,
            dst,
        } => dev.run_op(lane, &[src], &[dst], |r, w| {
            kernels::swizzled_quantize(spec, dtype, r[0], c, nodes, devices, stages, w[0])
        }),
        QuantCall::DequantReduce {
            spec,
            inputs,
            k,
            n,
            op,
            divisor,
            dtype,
            dst,
        } => dev.run_op(lane, &[inputs], &[dst], |r, w| {
            if k == 1 && op == ReduceOp::Sum {
                kernels::dequantize(spec, r[0], n, dtype, w[0])
            } else {
                kernels::dequant_reduce(spec, &senders(r[0], k), n, op, divisor, dtype, w[0])
            }
        }),
        QuantCall::DequantReduceQuant {
            spec,
            inputs,
            k,
            n,
            slices,
            dst,
        } => dev.run_op(lane, &[inputs], &[dst], |r, w| {
            kernels::dequant_reduce_quant(spec, &senders(r[0], k), n, slices, w[0])
        }),
    }
}
