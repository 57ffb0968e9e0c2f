"""FSDP2's custom collectives on strata's algorithms (``set_custom_all_gather`` /
``set_custom_reduce_scatter``).

A custom collective runs on a communicator of the FSDP group's ranks whose default
algorithm is the one asked for. On CPU it is made from the group's own strata
communicator (``Comm.create_group`` of all its ranks, under that communicator's lock)
when the group is a strata group, else from the MPI world; on CUDA (nccl has no
create_group) it is a communicator of its own whose unique id is published in the
default store under a key naming the group's ranks and the algorithm, so it cannot pair
with another. :func:`set_custom_comms` makes them at once on every rank, in module
order, so first uses from several threads cannot pair different ones.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

import strata as _s

from . import world as _world
from .backend import GROUPS, _done_work, _movable, _redop, _Waiter

try:  # torch >= 2.8
    from torch.distributed.fsdp import AllGather as _FsdpAllGather, ReduceScatter as _FsdpReduceScatter
except ImportError:  # pragma: no cover
    from torch.distributed.fsdp._fully_shard._fsdp_api import (  # type: ignore
        AllGather as _FsdpAllGather, ReduceScatter as _FsdpReduceScatter)

_CUSTOM: dict = {}
_CUSTOM_WAITER: Optional[_Waiter] = None
_LOCK = threading.RLock()


def _custom_comm(group: Any, device: torch.device, algo: str) -> _s.Comm:
    """The strata communicator of ``group``'s ranks with default algorithm ``algo``
    (made on first use by the group's members, then cached)."""
    ranks = tuple(dist.get_process_group_ranks(group))
    name = getattr(group, "group_name", "")
    key = (name, ranks, device.type, algo)
    with _LOCK:
        got = _CUSTOM.get(key)
        if got is not None:
            return got
        if device.type == "cpu":
            own = GROUPS.get(name)
            parent = getattr(own, "_cpu", None)
            members = list(range(len(ranks)))
            if parent is None:
                parent, members = _world.world_cpu(dist.get_world_size()), list(ranks)
            with _world.comm_lock(parent):
                comm = parent.create_group(members, algo=algo)
        elif device.type == "cuda":
            store = dist.distributed_c10d._get_default_store()
            transport = "rccl" if getattr(torch.version, "hip", None) else "nccl"
            uid_key = f"strata/custom/{'-'.join(map(str, ranks))}/{algo}/{device.index}"
            me = ranks.index(dist.get_rank())
            if me == 0:
                store.set(uid_key, bytes(_s.get_unique_id(transport)))
            # A member that never comes is an error after the timeout, not a hang.
            store.wait([uid_key], _world.default_timeout())
            uid = _s.UniqueId.from_bytes(store.get(uid_key))
            topo = _world.group_topology(os.environ.get("STRATA_TOPOLOGY"), dist.get_world_size(), ranks)
            with torch.cuda.device(device):
                comm = _s.init_rank(len(ranks), uid, me, transport=transport, topology=topo, algo=algo)
        else:
            raise RuntimeError(f"strata custom comm: tensors on {device}")
        _CUSTOM[key] = comm
        return comm


def _custom_issue(comm: _s.Comm, device: torch.device, run: Callable[[bool], Any],
                  async_op: bool, result: Any) -> Optional[dist.Work]:
    global _CUSTOM_WAITER
    with _world.comm_lock(comm):
        if device.type != "cpu":
            run(False)  # stream-ordered on the current stream
            return _done_work(result) if async_op else None
        if not async_op:
            run(False)
            return None
        last = run(True)
    with _LOCK:
        if _CUSTOM_WAITER is None:
            _CUSTOM_WAITER = _Waiter()
        waiter = _CUSTOM_WAITER
    return waiter.submit(last, result, None)


class _Custom:
    def __init__(self, algo: str, bits: Optional[int] = None, block: int = 256) -> None:
        self.algo, self.bits, self.block = algo, bits, block

    def comm_algo(self) -> str:
        """The default algorithm of this collective's communicator (the quantized
        collectives run on a ``ring`` one)."""
        return "ring" if self.algo in ("qwz", "qgz") else self.algo

    def allocate(self, size: Sequence[Any], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __repr__(self) -> str:
        q = f", bits={self.bits}" if self.bits else ""
        return f"{type(self).__name__}(algo={self.algo!r}{q})"


class AllGather(_Custom, _FsdpAllGather):
    """FSDP2's parameter all-gather on strata's ``algo`` (``hier``, ``ho-ring``,
    ``ring``, ``auto``; ``qwz`` with ``bits`` 8 or 4: ZeRO++'s quantized all-gather)
    over the FSDP group's ranks, whatever backend the group has. CPU tensors need the
    mpi transport (mpirun), CUDA tensors use nccl."""

    def __init__(self, algo: str = "hier", bits: Optional[int] = None, block: int = 256) -> None:
        if algo == "qwz" and bits is None:
            bits = 8
        super().__init__(algo, bits, block)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, async_op: bool = False) -> Optional[dist.Work]:
        dev = input_tensor.device
        comm = _custom_comm(group, dev, self.comm_algo())
        src, dst = _movable(input_tensor.contiguous()), _movable(output_tensor)

        def run(a: bool) -> Any:
            if self.bits is not None:
                return comm.all_gather_quantized(input_tensor.contiguous(), output_tensor,
                                                 bits=self.bits, block=self.block, async_op=a)
            return comm.all_gather(src, dst, async_op=a)
        return _custom_issue(comm, dev, run, async_op, output_tensor)


class ReduceScatter(_Custom, _FsdpReduceScatter):
    """FSDP2's gradient reduce-scatter on strata's ``algo`` (``hier``, ``ho-ring``,
    ``ring``, ``auto``; ``qgz`` with ``bits`` 4 or 8: ZeRO++'s quantized 2-hop
    reduce-scatter), any reduce op FSDP passes (AVG, SUM, PREMUL_SUM)."""

    def __init__(self, algo: str = "hier", bits: Optional[int] = None, block: int = 256) -> None:
        if algo == "qgz" and bits is None:
            bits = 4
        super().__init__(algo, bits, block)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, op: Any, async_op: bool = False) -> Optional[dist.Work]:
        dev = input_tensor.device
        name, factor = _redop(op, "ReduceScatter")
        comm = _custom_comm(group, dev, self.comm_algo())
        src = input_tensor.contiguous()
        if factor is not None:
            src = src * factor

        def run(a: bool) -> Any:
            if self.bits is not None:
                return comm.reduce_scatter_quantized(src, output_tensor, op=name, bits=self.bits,
                                                     block=self.block, async_op=a)
            return comm.reduce_scatter(src, output_tensor, op=name, async_op=a)
        return _custom_issue(comm, dev, run, async_op, output_tensor)


def _fsdp_groups(module: Any) -> Sequence[Any]:
    """The process groups an FSDP module's collectives run on (its shard group, and its
    post-forward group under hpZ), where this torch shows them."""
    try:
        pg = module._get_fsdp_state()._fsdp_param_group
    except Exception:
        return []
    out = []
    for info in (getattr(pg, "mesh_info", None), getattr(pg, "post_forward_mesh_info", None)):
        g = getattr(info, "shard_process_group", None)
        if g is not None and g not in out:
            out.append(g)
    return out


def set_custom_comms(model: torch.nn.Module, all_gather: Optional["AllGather"] = None,
                     reduce_scatter: Optional["ReduceScatter"] = None) -> int:
    """Put ``all_gather`` / ``reduce_scatter`` under every FSDP module of ``model``
    (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``), making their
    communicators now (collective: call it on every rank, as ``fully_shard``); returns
    how many modules were set."""
    from torch.distributed.fsdp import FSDPModule
    n = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            if all_gather is not None:
                m.set_custom_all_gather(all_gather)
            if reduce_scatter is not None:
                m.set_custom_reduce_scatter(reduce_scatter)
            p = next(m.parameters(), None)
            dev = p.device if p is not None else torch.device("cpu")
            for g in _fsdp_groups(m):
                for c in (all_gather, reduce_scatter):
                    if c is not None:
                        _custom_comm(g, dev, c.comm_algo())
            n += 1
    return n
