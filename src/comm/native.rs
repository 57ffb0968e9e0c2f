//! Runs a checked request on the transport's native collective: borrows the buffers
//! (shared for what is read, exclusive for what is written), applies NCCL's in-place
//! rules, and calls the blocking transport on the stream thread. `Avg` is left as a sum:
//! the submit path divides once at the very end.

use super::request::Op;
use crate::dtype::{reduce_into, DataType};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::transport::Transport;
use std::time::Duration;

/// Execute `op` (already checked) with the transport's own algorithm.
pub fn run(t: &dyn Transport, op: &Op, dtype: DataType, timeout: Duration) -> Result<()> {
    let (rank, size) = (t.rank(), t.size());
    match op {
        Op::AllGather { send, recv, count } => {
            let c = count * dtype.size();
            let in_place = send.offset_in(recv) == Some(rank * c);
            let mut out = recv.write_timeout(timeout)?;
            if !in_place {
                out[rank * c..(rank + 1) * c].copy_from_slice(&send.read_timeout(timeout)?);
            }
            t.all_gather(&mut out, c)
        }
        Op::ReduceScatter { send, recv, op, .. } => {
            if recv.offset_in(send).is_some() {
                // In place: the input is the whole buffer, the output one chunk of it.
                let src = send.to_bytes()?;
                let mut out = recv.write_timeout(timeout)?;
                t.reduce_scatter(&src, &mut out, dtype, *op)
            } else {
                let src = send.read_timeout(timeout)?;
                let mut out = recv.write_timeout(timeout)?;
                t.reduce_scatter(&src, &mut out, dtype, *op)
            }
        }
        Op::AllReduce { send, recv, op, .. } => {
            copy_unless_same(send, recv, timeout)?;
            t.all_reduce(&mut recv.write_timeout(timeout)?, dtype, *op)
        }
        Op::AllToAll { send, recv, .. } => t.all_to_all(
            &send.read_timeout(timeout)?,
            &mut recv.write_timeout(timeout)?,
        ),
        Op::Broadcast {
            send, recv, root, ..
        } => {
            if rank == *root {
                copy_unless_same(send, recv, timeout)?;
            }
            t.broadcast(&mut recv.write_timeout(timeout)?, *root)
        }
        Op::Send { buf, peer, .. } => t.send(*peer, &buf.read_timeout(timeout)?),
        Op::Recv { buf, peer, .. } => t.recv(*peer, &mut buf.write_timeout(timeout)?),
        Op::SendRecv {
            send,
            recv,
            dst,
            src,
            reduce,
            ..
        } => {
            let out = send.read_timeout(timeout)?;
            match reduce {
                None => t.sendrecv(*dst, &out, *src, &mut recv.write_timeout(timeout)?),
                Some(op) => {
                    let mut tmp = vec![0u8; recv.len()];
                    t.sendrecv(*dst, &out, *src, &mut tmp)?;
                    reduce_into(&mut recv.write_timeout(timeout)?, &tmp, dtype, op.partial());
                    Ok(())
                }
            }
        }
        Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => {
            Err(Error::Internal(format!(
                "{} reached the native path unpacked (size {size})",
                op.name()
            )))
        }
    }
}

fn copy_unless_same(src: &Buffer, dst: &Buffer, timeout: Duration) -> Result<()> {
    if dst.offset_in(src) == Some(0) && dst.len() == src.len() {
        return Ok(());
    }
    let data = src.read_timeout(timeout)?;
    dst.write_timeout(timeout)?.copy_from_slice(&data);
    Ok(())
}
