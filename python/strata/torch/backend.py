"""The Python half of the backend: torch's calls as strata calls.

Every collective torch can ask of a backend is written once here (``_Ops``), as a
function ``run(comm, async_op)`` of a communicator-like object, for two users:

- the C++ backend (``csrc/torch_backend.cpp``), the default form, which hands the rarer
  calls to a ``_Delegate``: ``run`` is given a ``_Recorder``, so the Python half only
  turns torch's arguments into a plan (strata calls in groups, the tensors to hold, a
  ``post`` step) and the C++ half runs that plan on its own communicator, under its own
  lock and on its own streams, as it runs its common calls. The Python half never
  touches a stream or a communicator C++ uses.
- the Python form (``BackendStrata``), kept for machines where the C++ backend cannot
  be built (no compiler): CPU tensors only, ``run`` given the real communicator, works
  completed by a waiter thread.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed import ReduceOp

import strata as _s

from . import world as _world

BACKEND = "strata"
_SERVED: dict = {}
#: group name -> its ``_Delegate`` / ``BackendStrata`` (the FSDP2 custom comms find a
#: group's communicators here).
GROUPS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()

_REDUCE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                  torch.int32, torch.int64} | {getattr(torch, n) for n in ("uint32", "uint64") if hasattr(torch, n)}


def _unsupported(method: str, why: str) -> RuntimeError:
    return RuntimeError(f"strata backend: {method}: {why}")


def _done_work(result: Any = None) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class _Waiter:
    """Completes torch futures from strata works, in submission order, on one thread."""

    def __init__(self) -> None:
        self._q: "queue.Queue" = queue.Queue()
        self._t = threading.Thread(target=self._run, name="strata-torch-waiter", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            work, fut, result, post = item
            try:
                if work is not None:
                    work.wait()
                if post is not None:
                    post()
                fut.set_result(result)
            except BaseException as e:  # surfaced by Work.wait()
                fut.set_exception(e)

    def submit(self, work: Any, result: Any, post: Optional[Callable[[], None]]) -> dist.Work:
        fut: torch.futures.Future = torch.futures.Future()
        self._q.put((work, fut, result, post))
        return _create_work_from_future(fut)

    def close(self) -> None:
        self._q.put(None)


#: torch's bitwise reductions (gloo has them, NCCL does not): integer and bool tensors,
#: an all-gather and the reduction in rank order on every rank (p times the traffic).
_BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def _premul_factor(op: Any) -> Any:
    """PREMUL_SUM's factor (a number or a tensor): ``ReduceOp.factor`` where torch
    exposes it (2.15), else from the op's pickled state ``(PREMUL_SUM, factor)`` (2.11)."""
    f = getattr(op, "factor", None)
    if f is None:
        try:
            state = op.__getstate__()
        except Exception:
            return None
        if isinstance(state, tuple) and len(state) == 2:
            f = state[1]
    return f


def _redop(op: Any, method: str):
    """(strata op name, premultiply factor or None) of a torch ReduceOp."""
    kind = getattr(op, "op", op)
    R = ReduceOp.RedOpType
    table = {R.SUM: "sum", R.AVG: "avg", R.MAX: "max", R.MIN: "min", R.PRODUCT: "prod",
             R.BAND: "band", R.BOR: "bor", R.BXOR: "bxor"}
    if kind in table:
        return table[kind], None
    if kind == R.PREMUL_SUM:
        f = _premul_factor(op)
        if f is None:
            raise _unsupported(method, f"PREMUL_SUM: this torch ({torch.__version__}) gives a Python backend "
                               "no factor; use SUM and scale, or AVG")
        return "sum", f
    raise _unsupported(method, f"reduce op {kind} (supported: SUM, AVG, MAX, MIN, PRODUCT, PREMUL_SUM, BAND, "
                       "BOR, BXOR)")


def _reduction_op(name: str, factor: Any, tensors: Sequence[torch.Tensor], method: str) -> str:
    """The strata op reducing ``tensors`` with torch's op ``name`` (``factor``: PREMUL_SUM's),
    after checking their dtypes. bool tensors (their bytes, 0 or 1, as uint8) as
    ProcessGroupNCCL maps them: SUM and MAX are a logical or, PRODUCT and MIN a logical
    and; AVG and PREMUL_SUM have no meaning. Complex tensors reduce as their real and
    imaginary parts (SUM, AVG, PREMUL_SUM only, as NCCL's)."""
    for t in tensors:
        if t.dtype not in _REDUCE_DTYPES and t.dtype not in (torch.bool, torch.complex64, torch.complex128):
            raise _unsupported(method, f"reductions on {t.dtype} (strata reduces float32, float64, "
                               "float16, bfloat16, int8, uint8, int32, int64, uint32, uint64, bool, complex64, "
                               "complex128)")
        if factor is not None and t.dtype == torch.bool:
            raise _unsupported(method, "PREMUL_SUM on bool tensors")
    if any(t.is_complex() for t in tensors) and name not in ("sum", "avg"):
        raise _unsupported(method, f"{name.upper()} on complex tensors (SUM, AVG and PREMUL_SUM only)")
    if not any(t.dtype == torch.bool for t in tensors):
        return name
    if name == "avg":
        raise _unsupported(method, "AVG on bool tensors")
    return {"sum": "max", "prod": "min"}.get(name, name)


def _reducible(t: torch.Tensor) -> torch.Tensor:
    """What strata reduces for ``t``: itself, a bool tensor's bytes as uint8, a complex
    tensor's real and imaginary parts as floats (interleaved, so chunks stay whole)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex():
        return torch.view_as_real(t).reshape(-1)
    return t


def _movable(t: torch.Tensor) -> torch.Tensor:
    """A tensor strata can move: itself for its dtypes, else a byte view of it."""
    if t.dtype in _REDUCE_DTYPES:
        return t
    return t.reshape(-1).view(torch.uint8)


class _Blocking:
    """Options of a call the backend itself waits for (barrier)."""

    asyncOp = False


_BLOCKING = _Blocking()


def _closure_tensors(*fns: Optional[Callable[..., Any]]) -> List[torch.Tensor]:
    """The tensors a call's closures hold (its scratch and padded copies), one list or
    tuple deep: what must live, and be recorded on the call's stream, until it ends."""
    out: List[torch.Tensor] = []
    for f in fns:
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            for x in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(x, torch.Tensor):
                    out.append(x)
                elif isinstance(x, tuple):
                    out.extend(y for y in x if isinstance(y, torch.Tensor))
    return out


# Recorded op kinds (csrc/torch_backend.cpp's `Kind`).
_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER, _BROADCAST, _ALL_TO_ALL, _SEND, _RECV = range(7)
_DT = {torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64", torch.float16: "f16",
       torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
_DT.update({getattr(torch, n): n[0] + n[-2:] for n in ("uint32", "uint64") if hasattr(torch, n)})


class _Recorder:
    """Stands in for a communicator in ``run(comm, async_op)``: records each call as
    ``(kind, send pointer, recv pointer, count, dtype, op, peer or root)`` in groups
    (one per ``_grouped`` block, one per lone call) for the C++ half to run."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.groups: List[List[tuple]] = []
        self._open: Optional[List[tuple]] = None

    def _add(self, kind: int, send: torch.Tensor, recv: torch.Tensor, count: int, op: str = "sum",
             peer: int = 0) -> None:
        op_tuple = (kind, send.data_ptr(), recv.data_ptr(), count, _s._dtype_code(_DT[send.dtype]),
                    _s._op_code(op), peer)
        if self._open is not None:
            self._open.append(op_tuple)
        else:
            self.groups.append([op_tuple])

    def group(self, calls: List[Callable[[], Any]]) -> None:
        self._open = []
        try:
            for c in calls:
                c()
        finally:
            ops, self._open = self._open, None
        if ops:
            self.groups.append(ops)

    def all_reduce(self, t: torch.Tensor, op: str = "sum", async_op: bool = False) -> None:
        self._add(_ALL_REDUCE, t, t, t.numel(), op)

    def all_gather(self, s: torch.Tensor, r: torch.Tensor, async_op: bool = False) -> None:
        self._add(_ALL_GATHER, s, r, s.numel())

    def reduce_scatter(self, s: torch.Tensor, r: torch.Tensor, op: str = "sum", async_op: bool = False) -> None:
        self._add(_REDUCE_SCATTER, s, r, r.numel(), op)

    def broadcast(self, t: torch.Tensor, root: int = 0, async_op: bool = False) -> None:
        self._add(_BROADCAST, t, t, t.numel(), peer=root)

    def all_to_all(self, s: torch.Tensor, r: torch.Tensor, async_op: bool = False) -> None:
        self._add(_ALL_TO_ALL, s, r, s.numel() // self.size)

    def send(self, t: torch.Tensor, peer: int, async_op: bool = False) -> None:
        self._add(_SEND, t, t, t.numel(), peer=peer)

    def recv(self, t: torch.Tensor, peer: int, async_op: bool = False) -> None:
        self._add(_RECV, t, t, t.numel(), peer=peer)


def _flat_tensors(x: Any) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y)]
    return []


class _Ops:
    """The collectives of a group, written once over a communicator-like ``comm``
    (see the module doc); the two forms supply ``_issue``."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 global_ranks: Optional[Sequence[int]] = None, name: str = "") -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._store = store
        self._timeout = timeout
        self._global = list(global_ranks) if global_ranks else None
        self._name = name
        # The group's mpi communicator, made now (torch makes groups in the same order
        # on every rank), when launched by mpirun.
        self._cpu: Optional[_s.Comm] = None
        if _world.mpi_env() is not None:
            self._cpu = _world.group_cpu(size, self._global, rank, "new_group")
        GROUPS[name] = self

    # torch asks whether a group splits (new_group's split path): communicators of a
    # group are made by its members alone (`Comm.create_group`), never split.
    supports_splitting = False

    def getBackendName(self) -> str:
        return BACKEND

    def _survivors(self, ranks_to_exclude: Sequence[int]) -> tuple:
        """``shrink_group``'s (excluded ranks, surviving ranks), both sorted; only a
        survivor calls it."""
        ex = sorted(set(int(r) for r in ranks_to_exclude))
        keep = [r for r in range(self.size()) if r not in ex]
        if self.rank() not in keep:
            raise ValueError(f"strata backend: rank {self.rank()} is excluded from the shrink "
                             f"{ex}: only the survivors call it")
        return ex, keep

    def _shrunk_fields(self, new: Any, keep: Sequence[int]) -> None:
        """The shrunk group ``new``'s store, timeout, world ranks and name (registered)."""
        glob = self._global or list(range(self.size()))
        new._store, new._timeout, new._global = self._store, self._timeout, [glob[r] for r in keep]
        new._name = f"{self._name}/shrunk"
        GROUPS[new._name] = new

    @staticmethod
    def _grouped(comm: Any, calls: List[Callable[[], Any]]) -> Any:
        """Run ``calls`` as one strata group (one recorded group); the last one's work."""
        if isinstance(comm, _Recorder):
            return comm.group(calls)
        last = None
        with _s.group():
            for c in calls:
                w = c()
                last = w if w is not None else last
        return last

    def _cpu_comm(self, method: str) -> _s.Comm:
        if self._cpu is None:
            raise _unsupported(method, "CPU tensors run on the mpi transport: launch with mpirun "
                               "-np <ranks> python <script>, or give CPU tensors to gloo: "
                               "backend=\"cpu:gloo,cuda:strata\" (OMPI_COMM_WORLD_RANK not set)")
        return self._cpu

    def _check_devices(self, method: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        first = tensors[0]
        for t in tensors:
            if t.device != first.device:
                raise _unsupported(method, "tensors on different devices")
        _SERVED[first.device.type] = _SERVED.get(first.device.type, 0) + 1
        return first


    # -- all-reduce --
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._allreduce("allreduce", tensors, op, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._allreduce("allreduce_coalesced", tensors, op, opts)

    def _allreduce(self, method: str, tensors: List[torch.Tensor], op: Any, opts: Any = None) -> dist.Work:
        name, factor = _redop(op, method)
        if name in _BITWISE:
            def into(t: torch.Tensor, acc: torch.Tensor) -> None:
                t.copy_(acc.reshape(t.shape))
            return self._bitwise(method, tensors, name, [into] * len(tensors), opts)
        name = _reduction_op(name, factor, tensors, method)
        work_ts, posts = [], []
        for t in tensors:
            w = t if t.is_contiguous() else t.contiguous()
            if factor is not None:
                w = w * factor if w is t else w.mul_(factor)
            if w is not t:
                posts.append((t, w))
            work_ts.append(w)

        def run(comm, a):
            return self._grouped(comm, [lambda w=w: comm.all_reduce(_reducible(w), op=name, async_op=a)
                                  for w in work_ts])

        def post():
            for t, w in posts:
                t.copy_(w)
        return self._issue(method, tensors, run, tensors, post if posts else None, opts=opts)

    def _bitwise(self, method: str, tensors: List[torch.Tensor], name: str,
                 finish: List[Callable[[torch.Tensor, torch.Tensor], None]], opts: Any,
                 result: Any = None) -> dist.Work:
        """BAND / BOR / BXOR: all-gather every rank's tensor, then reduce in rank order;
        ``finish[i](tensor, result)`` puts tensor i's flat result where it belongs."""
        n = self.size()
        items = []
        for t in tensors:
            if t.is_floating_point() or t.is_complex():
                raise _unsupported(method, f"{name.upper()} on {t.dtype} (integer and bool tensors)")
            src = t.detach().contiguous().reshape(-1)
            items.append((t, src, torch.empty((n, src.numel()), dtype=t.dtype, device=t.device)))

        def run(comm, a):
            return self._grouped(comm, [lambda s=s, g=g: comm.all_gather(_movable(s), _movable(g), async_op=a)
                                  for _, s, g in items])

        def post():
            f = _BITWISE[name]
            for (t, _, g), fin in zip(items, finish):
                acc = g[0].clone()
                for k in range(1, n):
                    acc = f(acc, g[k])
                fin(t, acc)
        return self._issue(method, tensors, run, tensors if result is None else result, post, opts=opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """``dist.reduce``: the result on the root only, as a reduce-scatter then a gather
        of the reduced chunks to the root (each rank sends (p-1)/p of the tensor into the
        reduce-scatter and its 1/p chunk to the root: half an all-reduce's traffic). Other
        ranks' tensors are left as they were."""
        method = "reduce"
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        name, factor = _redop(op, method)
        n, me = self.size(), self.rank()
        if name in _BITWISE:
            def on_root(t: torch.Tensor, acc: torch.Tensor) -> None:
                if me == root:
                    t.copy_(acc.reshape(t.shape))
            return self._bitwise(method, tensors, name, [on_root] * len(tensors), opts)
        name = _reduction_op(name, factor, tensors, method)
        items = []
        for t in tensors:
            flat = t.detach().reshape(-1)
            q = -(-flat.numel() // n)
            # A padded copy: the reduce-scatter's input, whose own chunk is its output.
            pad = torch.zeros(q * n, dtype=t.dtype, device=t.device)
            pad[:flat.numel()].copy_(flat)
            if factor is not None:
                pad.mul_(factor)
            items.append((t, pad, q))

        def run(comm, a):
            calls = []
            for _, pad, q in items:
                calls.append(lambda pad=pad, q=q: comm.reduce_scatter(
                    _reducible(pad), _reducible(pad[me * q:(me + 1) * q]), op=name, async_op=a))
            last = self._grouped(comm, calls)
            gather = []
            for _, pad, q in items:
                if me == root:
                    gather += [lambda pad=pad, q=q, p=p: comm.recv(_movable(pad[p * q:(p + 1) * q]), p, async_op=a)
                               for p in range(n) if p != root]
                else:
                    gather.append(lambda pad=pad, q=q: comm.send(_movable(pad[me * q:(me + 1) * q]), root,
                                                                 async_op=a))
            w = self._grouped(comm, gather)
            return w if w is not None else last

        def post():
            if me == root:
                for t, pad, _ in items:
                    t.copy_(pad[:t.numel()].reshape(t.shape))
        return self._issue(method, tensors, run, tensors, post, opts=opts)

    # -- gather / scatter --
    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> dist.Work:
        """``dist.gather``: the root receives every rank's tensor (its own copied)."""
        method = "gather"
        root = opts.rootRank if opts is not None else 0
        n, me = self.size(), self.rank()
        if len(input_tensors) != 1:
            raise _unsupported(method, "one input tensor per rank")
        x = input_tensors[0].contiguous()
        outs: List[torch.Tensor] = []
        if me == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != n:
                raise _unsupported(method, f"the root needs one list of {n} output tensors")
            outs = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
                    for o in output_tensors[0]]
            for o in outs:
                if o.numel() != x.numel() or o.dtype != x.dtype:
                    raise _unsupported(method, f"outputs of {x.numel()} {x.dtype} elements")

        def run(comm, a):
            if me != root:
                return comm.send(_movable(x), root, async_op=a)
            return self._grouped(comm, [lambda o=o, p=p: comm.recv(_movable(o), p, async_op=a)
                                  for p, o in enumerate(outs) if p != root])

        def post():
            if me == root:
                outs[root].copy_(x.reshape(outs[root].shape))
                for o, w in zip(output_tensors[0], outs):
                    if w is not o:
                        o.copy_(w)
        return self._issue(method, [x] + outs, run, output_tensors, post, opts=opts)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        """``dist.scatter``: rank ``p`` receives the root's ``p``-th tensor."""
        method = "scatter"
        root = opts.rootRank if opts is not None else 0
        n, me = self.size(), self.rank()
        if len(output_tensors) != 1:
            raise _unsupported(method, "one output tensor per rank")
        o = output_tensors[0]
        w = o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
        ins: List[torch.Tensor] = []
        if me == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != n:
                raise _unsupported(method, f"the root needs one list of {n} input tensors")
            ins = [i.contiguous() for i in input_tensors[0]]
            for i in ins:
                if i.numel() != o.numel() or i.dtype != o.dtype:
                    raise _unsupported(method, f"inputs of {o.numel()} {o.dtype} elements")

        def run(comm, a):
            if me != root:
                return comm.recv(_movable(w), root, async_op=a)
            return self._grouped(comm, [lambda i=i, p=p: comm.send(_movable(i), p, async_op=a)
                                  for p, i in enumerate(ins) if p != root])

        def post():
            if me == root:
                w.copy_(ins[root].reshape(w.shape))
            if w is not o:
                o.copy_(w)
        return self._issue(method, [w] + ins, run, output_tensors, post, opts=opts)

    # -- all-gather --
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._allgather_pairs("all_gather_single", [output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        return self._allgather_pairs("all_gather_single_coalesced", outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _allgather_pairs(self, method: str, outputs: List[torch.Tensor],
                         inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        n = self.size()
        pairs, posts = [], []
        for o, i in zip(outputs, inputs):
            if o.numel() != n * i.numel() or o.dtype != i.dtype:
                raise _unsupported(method, f"output of {o.numel()} {o.dtype} for input of "
                                   f"{i.numel()} {i.dtype} over {n} ranks")
            ic = i.contiguous()
            oc = o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
            if oc is not o:
                posts.append((o, oc))
            pairs.append((_movable(ic), _movable(oc)))

        def run(comm, a):
            return self._grouped(comm, [lambda s=s, r=r: comm.all_gather(s, r, async_op=a) for s, r in pairs])

        def post():
            for o, oc in posts:
                o.copy_(oc)
        return self._issue(method, list(outputs) + list(inputs), run, outputs, post if posts else None, opts=opts)

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        method = "allgather"
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise _unsupported(method, "one input tensor and one output list per rank")
        i, outs = input_tensors[0], output_tensors[0]
        if len(outs) != self.size():
            raise _unsupported(method, f"{len(outs)} outputs for {self.size()} ranks")
        flat = torch.empty((self.size(),) + tuple(i.shape), dtype=i.dtype, device=i.device)
        ic = i.contiguous()

        def run(comm, a):
            return comm.all_gather(_movable(ic), _movable(flat), async_op=a)

        def post():
            for k, o in enumerate(outs):
                o.copy_(flat[k])
        return self._issue(method, [i] + list(outs), run, output_tensors, post, opts=opts)

    # -- reduce-scatter --
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._rs_pairs("reduce_scatter_single", [output], [input], op, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._rs_pairs("reduce_scatter_single_coalesced", outputs, inputs, op, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _rs_pairs(self, method: str, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                  op: Any, opts: Any = None) -> dist.Work:
        name, factor = _redop(op, method)
        n = self.size()
        if name in _BITWISE:
            me = self.rank()

            def chunk(o: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], None]:
                return lambda _, acc: o.copy_(acc[me * o.numel():(me + 1) * o.numel()].reshape(o.shape))
            return self._bitwise(method, list(inputs), name, [chunk(o) for o in outputs], opts, outputs)
        name = _reduction_op(name, factor, inputs, method)
        pairs, posts = [], []
        for o, i in zip(outputs, inputs):
            if i.numel() != n * o.numel() or o.dtype != i.dtype:
                raise _unsupported(method, f"input of {i.numel()} {i.dtype} for output of "
                                   f"{o.numel()} {o.dtype} over {n} ranks")
            ic = i.contiguous()
            if factor is not None:
                ic = ic * factor
            oc = o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
            if oc is not o:
                posts.append((o, oc))
            pairs.append((ic, oc))

        def run(comm, a):
            return self._grouped(comm, [lambda s=s, r=r: comm.reduce_scatter(_reducible(s), _reducible(r), op=name,
                                                                       async_op=a)
                                  for s, r in pairs])

        def post():
            for o, oc in posts:
                o.copy_(oc)
        return self._issue(method, list(outputs) + list(inputs), run, outputs, post if posts else None, opts=opts)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        method = "reduce_scatter"
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise _unsupported(method, "one output tensor and one input list per rank")
        o, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self.size():
            raise _unsupported(method, f"{len(ins)} inputs for {self.size()} ranks")
        flat = torch.cat([t.reshape(-1) for t in ins])
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._rs_pairs(method, [o], [flat], op, opts)

    # -- broadcast --
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        method = "broadcast"
        root = opts.rootRank if opts is not None else 0
        items, posts = [], []
        for t in tensors:
            w = t if t.is_contiguous() else t.contiguous()
            if w is not t:
                posts.append((t, w))
            items.append(_movable(w))

        def run(comm, a):
            return self._grouped(comm, [lambda w=w: comm.broadcast(w, root=root, async_op=a) for w in items])

        def post():
            for t, w in posts:
                t.copy_(w)
        return self._issue(method, tensors, run, tensors, post if posts else None, opts=opts)

    # -- all-to-all --
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                          opts: Any = None) -> dist.Work:
        method = "all_to_all_single"
        n = self.size()
        if output.dtype != input.dtype:
            raise _unsupported(method, "input and output dtypes differ")
        ic = input.contiguous()
        oc = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
        row = ic[0].numel() if ic.dim() > 0 and ic.shape[0] > 0 else 1
        ins = list(input_split_sizes) or [ic.shape[0] // n] * n
        outs = list(output_split_sizes) or [oc.shape[0] // n] * n
        if len(ins) != n or len(outs) != n:
            raise _unsupported(method, f"split sizes for {n} ranks")
        even = len(set(ins)) == 1 and len(set(outs)) == 1 and ins[0] == outs[0]
        src, dst = _movable(ic).reshape(-1), _movable(oc).reshape(-1)
        k = src.numel() // max(ic.numel(), 1) if ic.numel() else 1
        unit = row * k

        def run(comm, a):
            if even and src.numel() == n * ins[0] * unit and dst.numel() == n * outs[0] * unit:
                return comm.all_to_all(src, dst, async_op=a)
            calls = []
            so = ro = 0
            for peer in range(n):
                s = src[so * unit:(so + ins[peer]) * unit]
                r = dst[ro * unit:(ro + outs[peer]) * unit]
                so, ro = so + ins[peer], ro + outs[peer]
                if s.numel():
                    calls.append(lambda s=s, p=peer: comm.send(s, p, async_op=a))
                if r.numel():
                    calls.append(lambda r=r, p=peer: comm.recv(r, p, async_op=a))
            return self._grouped(comm, calls)

        def post():
            if oc is not output:
                output.copy_(oc)
        return self._issue(method, [output, input], run, [output], post, opts=opts)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        method = "alltoall"
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise _unsupported(method, f"{n} input and output tensors")
        ins = [_movable(t.contiguous()).reshape(-1) for t in input_tensors]
        outs = [torch.empty_like(_movable(t.contiguous()).reshape(-1)) for t in output_tensors]

        def run(comm, a):
            calls = []
            for p in range(n):
                if ins[p].numel():
                    calls.append(lambda s=ins[p], p=p: comm.send(s, p, async_op=a))
                if outs[p].numel():
                    calls.append(lambda r=outs[p], p=p: comm.recv(r, p, async_op=a))
            return self._grouped(comm, calls)

        def post():
            for t, o in zip(output_tensors, outs):
                t.copy_(o.view(t.dtype).reshape(t.shape) if t.dtype not in _REDUCE_DTYPES else o.reshape(t.shape))
        return self._issue(method, list(output_tensors) + list(input_tensors), run, output_tensors, post, opts=opts)

    # -- point-to-point --
    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:
        items = [_movable(t.contiguous()) for t in tensors]

        def run(comm, a):
            return self._grouped(comm, [lambda t=t: comm.send(t, dstRank, async_op=a) for t in items])
        return self._issue("send", tensors, run, tensors)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:
        works = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in tensors]

        def run(comm, a):
            return self._grouped(comm, [lambda w=w: comm.recv(_movable(w), srcRank, async_op=a) for w in works])

        def post():
            for t, w in zip(tensors, works):
                if w is not t:
                    t.copy_(w)
        return self._issue("recv", tensors, run, tensors, post)


class _RankSize:
    """``rank()`` and ``size()`` for [`_Delegate`] (no torch base class)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank_, self._size_ = rank, size

    def rank(self) -> int:
        return self._rank_

    def size(self) -> int:
        return self._size_


class _Delegate(_Ops, _RankSize):
    """The Python half of the C++ backend: it makes the group's communicators (the
    CPU one when the group is made, a GPU's at its first call, keyed in the group's own
    store) and turns the calls the C++ half hands it (bool / complex / bitwise
    reductions, uneven all-to-all, gather, scatter, reduce, send / recv, non-contiguous
    tensors, the calls of a coalescing block) into plans the C++ half runs. It owns no
    communicator: each handle goes to the C++ half, which counts its references."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._made_lock = threading.Lock()
        self._gpu: dict = {}  # device index -> handle, made here and handed to C++

    def _issue(self, method: str, tensors: Sequence[torch.Tensor], run: Callable[[Any, bool], Any],
               result: Any, post: Optional[Callable[[], None]] = None, opts: Any = None) -> tuple:
        """The plan of a call: ``(groups, post, hold, outputs, first tensor, async)``."""
        first = self._check_devices(method, tensors)
        if first.device.type not in ("cpu", "cuda"):
            raise _unsupported(method, f"tensors on {first.device} (cpu: mpi transport, cuda: nccl / rccl)")
        rec = _Recorder(self.size())
        run(rec, True)
        hold = list(tensors) + _closure_tensors(run, post)
        return (rec.groups, post, hold, _flat_tensors(result), first, bool(getattr(opts, "asyncOp", True)))

    def _gpu_handle(self, index: int) -> int:
        """The handle of this group's communicator on GPU ``index`` (nccl, or rccl on
        ROCm torch), made at its first use by the members, through the group's own
        store under a key of the device (and of this group: torch prefixes the store
        with the group's name), so no other group's communicator can pair with it."""
        with self._made_lock:
            h = self._gpu.get(index)
            if h is not None:
                return h
            transport = "rccl" if getattr(torch.version, "hip", None) else "nccl"
            key = f"strata/{self._name}/{transport}_uid/{index}"
            if self.rank() == 0:
                self._store.set(key, bytes(_s.get_unique_id(transport)))
            else:
                self._store.wait([key], self._timeout)
            uid = _s.UniqueId.from_bytes(self._store.get(key))
            topo = None
            if self._global is not None and dist.is_initialized():
                topo = _world.group_topology(os.environ.get("STRATA_TOPOLOGY"),
                                             dist.get_world_size(), self._global)
            # The communicator's GPU is the device current on this thread: set for the
            # call only (a scoped guard), never the process's default device.
            with torch.cuda.device(index):
                comm = _s.init_rank(self.size(), uid, self.rank(), transport=transport, topology=topo,
                                    timeout=self._timeout.total_seconds())
            self._gpu[index] = comm.handle
            return comm.handle

    def _cpu_handle(self) -> int:
        return self._cpu.handle if self._cpu is not None else 0

    def _shrunk(self, ranks_to_exclude: Sequence[int], shrink_flags: int, cpu: int, gpus: dict) -> tuple:
        """This group without ``ranks_to_exclude`` (``shrink_group``): ``(delegate, rank,
        size, cpu handle, {device: handle})``: the communicators whose handles the C++ half
        passes, shrunk by the survivors (usually after a failure aborted them)."""
        ex, keep = self._survivors(ranks_to_exclude)
        abort = bool(shrink_flags & _s.SHRINK_ABORT)
        new = object.__new__(type(self))
        _RankSize.__init__(new, keep.index(self.rank()), len(keep))
        self._shrunk_fields(new, keep)
        new._made_lock, new._gpu = threading.Lock(), {}
        new._cpu = _s.Comm(cpu).shrink(ex, abort=abort) if cpu else None
        out = {int(i): _s.Comm(h).shrink(ex, abort=abort).handle for i, h in gpus.items()}
        new._gpu.update(out)
        return new, new.rank(), new.size(), new._cpu_handle(), out

    def _abort(self) -> None:
        """The C++ half aborted this group's communicators: forget the world's."""
        if self._cpu is not None:
            _world.drop_world(self._cpu.handle)

    def shutdown(self) -> None:
        self._cpu = None
        self._gpu = {}


class BackendStrata(_Ops, _c10d.Backend):
    """The Python form: strata as torch's per-device ``Backend`` written in Python, for
    machines where the C++ backend cannot be built (no C++ compiler or ninja), on torch
    with Python ``Backend`` subclasses (``PyBackend``). CPU tensors only (CUDA calls
    need the C++ backend); several times the C++ backend's host cost per call.
    ``STRATA_TORCH_BACKEND=python`` forces it (CI tests it so)."""

    supports_coalescing = True

    # torch.distributed.shrink_group (torch 2.15): the survivors of a group make its
    # communicators anew without the excluded ranks (Comm.shrink, strataCommShrink),
    # the excluded ranks not calling; on the mpi transport also after a peer died.
    supports_shrinking = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._waiter = _Waiter()
        self._coalescing = 0
        self._coalesced: List[Any] = []
        self._aborted = False  # ProcessGroup.abort() (_abort)

    def shrink(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0,
               opts_override: Any = None) -> "BackendStrata":
        ex, keep = self._survivors(ranks_to_exclude)
        new = type(self).__new__(type(self))
        _c10d.Backend.__init__(new, keep.index(self.rank()), len(keep))
        self._shrunk_fields(new, keep)
        new._waiter, new._coalescing, new._coalesced, new._aborted = _Waiter(), 0, [], False
        abort = bool(shrink_flags & _s.SHRINK_ABORT)
        new._cpu = self._cpu.shrink(ex, abort=abort) if self._cpu is not None else None
        return new

    def _issue(self, method: str, tensors: Sequence[torch.Tensor], run: Callable[[Any, bool], Any],
               result: Any, post: Optional[Callable[[], None]] = None, opts: Any = None) -> dist.Work:
        """Run ``run(comm, True)`` under the communicator's lock; the Work completes (by
        the waiter thread) when strata's last work does, ``post`` run first."""
        if self._aborted:
            raise dist.DistBackendError(f"strata backend: {method}: the group was aborted")
        first = self._check_devices(method, tensors)
        if first.device.type != "cpu":
            raise _unsupported(method, f"tensors on {first.device}: the Python form serves CPU tensors; "
                               "CUDA needs the C++ backend (a C++ compiler and ninja: python -m strata.torch build)")
        comm = self._cpu_comm(method)
        try:
            with _world.comm_lock(comm):
                last = run(comm, True)
        except _s.StrataError as e:
            raise dist.DistBackendError(f"strata backend: {method}: {e}") from e
        if self._coalescing:
            self._coalesced.append((last, post))
            return _done_work(result)
        return self._waiter.submit(last, result, post)

    # -- barrier --
    def barrier(self, opts: Any = None) -> dist.Work:
        t = torch.zeros(1, dtype=torch.int32)

        def run(comm, a):
            return comm.all_reduce(t, async_op=a)
        work = self._issue("barrier", [t], run, None, None, opts=_BLOCKING)
        work.wait()
        return work

    # -- coalescing: the block's calls as one strata group, complete when it ends --
    def _start_coalescing(self, device: Any = None) -> None:
        self._coalescing += 1
        if self._coalescing == 1:
            self._coalesced = []
            _s.group_start()

    def _end_coalescing(self, device: Any = None) -> dist.Work:
        if self._coalescing == 0:
            raise _unsupported("_end_coalescing", "no coalescing started")
        self._coalescing -= 1
        if self._coalescing:
            return _done_work(None)
        items, self._coalesced = self._coalesced, []
        try:
            if self._cpu is not None:
                with _world.comm_lock(self._cpu):
                    _s.group_end()
            else:
                _s.group_end()
            works = [w for w, _ in items if w is not None]
            # Complete before returning: code written for NCCL's stream order reads a
            # coalesced block's outputs without waiting on its work.
            if works:
                works[-1].wait()
        except _s.StrataError as e:
            raise dist.DistBackendError(f"strata backend: _end_coalescing: {e}") from e
        for _, p in items:
            if p is not None:
                p()
        return _done_work(None)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    def _abort(self) -> None:
        """``ProcessGroup.abort()``: this group's communicator aborted (calls in flight
        fail, here and on the peers); every later call raises."""
        self._aborted = True
        if self._cpu is not None:
            _world.drop_world(self._cpu.handle)
            self._cpu.abort()
        self._cpu = None

    def shutdown(self) -> None:
        """Release this group's communicator (the MPI world's stays)."""
        self._waiter.close()
        if self._cpu is not None and not _world.is_world(self._cpu.handle):
            self._cpu.destroy()
        self._cpu = None


def python_backends() -> bool:
    """True when torch's ``Backend`` takes Python subclasses whose overrides C++ calls
    (PyBackend): probed by calling the base binding of ``allreduce`` on a subclass."""

    class Probe(_c10d.Backend):
        def allreduce(self, tensors: Any, opts: Any = None) -> Any:
            return _done_work(tensors)
    try:
        _c10d.Backend.allreduce(Probe(0, 1), [torch.zeros(1)], dist.AllreduceOptions())
        return True
    except Exception:
        return False
