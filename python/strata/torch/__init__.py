"""strata as a ``torch.distributed`` backend.

``import strata.torch`` registers the backend ``"strata"``::

    import torch.distributed as dist, strata.torch
    dist.init_process_group("strata")            # or "cpu:gloo,cuda:strata", ...

- Forms (``FORM``, chosen by ``STRATA_TORCH_BACKEND``): by default a C++
  ``c10d::Backend`` (``csrc/torch_backend.cpp``, built for the installed torch by
  :func:`cpp_module` at first use, or ahead with ``python -m strata.torch build``; it
  needs a C++20 compiler and ninja, and says which is missing). It serves the common
  CPU calls itself, one C call each, and hands everything else (CUDA tensors, the rarer
  calls and reductions) to its Python half, the same code as the Python forms.
  ``STRATA_TORCH_BACKEND=python`` takes the Python backend instead: where torch's
  ``c10d.Backend`` takes Python subclasses (``PyBackend``, torch 2.15 here), a
  per-device backend (``BackendStrata``), elsewhere a whole ``ProcessGroup``
  (``ProcessGroupStrata``; ``STRATA_TORCH_BACKEND=group`` forces it). The C++ and the
  per-device forms are registered per device: ``"cpu:gloo,cuda:strata"`` keeps gloo
  for CPU tensors, and lookups by device (gather, DTensor, functional collectives) find
  strata.
- CPU tensors run on strata's ``mpi`` transport: launch with ``mpirun`` (the library
  built with ``--features mpi``); torch's rank must be the MPI world rank (set ``RANK``
  from ``OMPI_COMM_WORLD_RANK``). Importing this module under ``mpirun`` joins the MPI
  world (collective: import it on every rank, e.g. at the top of the program). The
  world's topology is ``STRATA_TOPOLOGY`` (or detected from the hosts), so ``auto``
  picks the hierarchical algorithms where a group spans nodes.
- CUDA tensors run on strata's ``nccl`` transport (library built with ``--features
  cuda``), bootstrapped through the store torch hands the backend (the group's rank 0
  publishes the unique id), so ``torchrun`` works; the communicator is made under a
  scoped device guard, never a global ``set_device``.
- ``new_group`` / ``DeviceMesh`` sub-groups are strata communicators made by their
  members alone (``Comm.create_group``), keeping the world topology.
- Implemented (old and new names of torch's ``ProcessGroup`` and ``Backend``):
  ``allreduce``, ``allreduce_coalesced``, ``allgather``, ``_allgather_base`` /
  ``all_gather_single``, ``allgather_into_tensor_coalesced`` /
  ``all_gather_single_coalesced``, ``reduce_scatter``, ``_reduce_scatter_base`` /
  ``reduce_scatter_single``, ``reduce_scatter_tensor_coalesced`` /
  ``reduce_scatter_single_coalesced``, ``broadcast``, ``alltoall``, ``alltoall_base`` /
  ``all_to_all_single``, ``gather``, ``scatter``, ``reduce`` (a reduce-scatter, then the
  reduced chunks to the root; the non-root tensors are left as they were), ``barrier``,
  ``send``, ``recv``, and coalescing.
  Reduce ops SUM, AVG (the exact mean), MAX, MIN, PRODUCT and PREMUL_SUM; reductions on
  float32, float64, float16, bfloat16, int8, uint8, int32, int64 (exact: token and sample
  counts), uint32 and uint64 where torch has them, and bool as ProcessGroupNCCL does it
  (SUM and MAX are a logical or, PRODUCT and MIN a logical and, AVG refused), complex
  as real and imaginary parts (SUM, AVG, PREMUL_SUM); BAND / BOR / BXOR on integers and
  bool (an all-gather, then the reduction in rank order); data movement on any dtype.
  Anything else raises a ``RuntimeError`` naming the method.
- Every call returns a ``Work`` at once. CPU: strata's nonblocking calls on the
  communicator's host stream, completed by a waiter thread; until it completes the
  tensors are strata's; a coalesced block is complete when ``_end_coalescing`` returns.
  CUDA, NCCL's semantics: ``async_op=False`` enqueues on the current stream,
  ``async_op=True`` (and send / recv) on the group's internal stream of the device,
  which first waits for the current one; the Work is the call's end event: ``wait()``
  makes the current stream wait on it (the host blocks only for a finite timeout or a
  barrier), ``is_completed()`` queries it (on the object this module returns: torch's
  wrapper of a per-device backend's Work does not forward it), ``get_future()`` is a
  ``Future(devices=[...])``; the tensors (and the call's scratch) are recorded on the
  internal stream and held by the Work. ``barrier`` runs on ``device_ids``' GPU, else
  the device torch chose, else the group's GPU (the current one under torchrun).
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed import ReduceOp

import strata as _s

__all__ = ["BackendStrata", "ProcessGroupStrata", "FORM", "served", "BACKEND", "AllGather", "ReduceScatter", "set_custom_comms", "traffic", "group_topology"]

BACKEND = "strata"

_REDUCE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                  torch.int32, torch.int64} | {getattr(torch, n) for n in ("uint32", "uint64") if hasattr(torch, n)}
_WORLD: dict = {}
_LOCK = threading.Lock()


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


class _CudaWork(dist.Work):
    """A CUDA call's handle, as ProcessGroupNCCL's: ``wait()`` makes the current stream
    wait for the call's end event (the host blocks only for a finite ``timeout``, or in
    a barrier); ``is_completed()`` queries the event; ``get_future()`` is a
    ``Future(devices=[...])`` completed on the call's stream, so callbacks and waiters
    on other streams are ordered after it. It holds the call's tensors until dropped.
    A call the library saw fail (a device error, a peer gone past the timeout, an abort)
    makes ``wait()`` raise and ``is_success()`` false, as ProcessGroupNCCL's work checks
    its watchdog's exception."""

    def __init__(self, stream: Any, result: Any, hold: Any, comm: Any = None) -> None:
        super().__init__()
        self._stream, self._hold, self._comm = stream, hold, comm
        self._end = torch.cuda.Event()
        self._end.record(stream)
        self._fut: torch.futures.Future = torch.futures.Future(devices=[stream.device])
        with torch.cuda.stream(stream):
            self._fut.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else (timeout or 0)
        if secs > 0:
            import time
            deadline = time.monotonic() + secs
            while not self._end.query():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"strata backend: the CUDA call did not finish within {secs} s")
                time.sleep(1e-4)
        self._raise_failure()
        torch.cuda.current_stream(self._stream.device).wait_event(self._end)
        return True

    def _raise_failure(self) -> None:
        err = self._comm.async_error() if self._comm is not None else None
        if err is not None:
            raise RuntimeError(f"strata backend: the CUDA call failed: {err}") from err

    def is_completed(self) -> bool:
        return self._end.query()

    def is_success(self) -> bool:
        return self._end.query() and (self._comm is None or self._comm.async_error() is None)

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def synchronize(self) -> None:
        self.wait()


class _Ops:
    """The collectives of a group over strata communicators, shared by the two forms
    torch can hold: a per-device ``Backend`` ([`BackendStrata`]) and, where torch has no
    Python ``Backend`` subclasses, a whole ``ProcessGroup`` ([`ProcessGroupStrata`])."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 global_ranks: Optional[Sequence[int]] = None, name: str = "") -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._store = store
        self._timeout = timeout
        self._global = list(global_ranks) if global_ranks else None
        self._name = name
        self._cpu: Optional[_s.Comm] = None
        self._cuda: Optional[_s.Comm] = None
        self._waiter = _Waiter()
        self._coalescing = 0
        self._coalesced: List[Any] = []
        self._coalesced_device: Optional[torch.device] = None
        self._coalesced_hold: List[torch.Tensor] = []
        self._side_streams: dict = {}
        self._aborted = False  # ProcessGroup.abort() (_abort)

    def _shrunk(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0) -> Any:
        """This group without ``ranks_to_exclude`` (``shrink_group``), of this class: its
        communicators shrunk (``Comm.shrink``), the excluded ranks not calling."""
        ex = sorted(set(int(r) for r in ranks_to_exclude))
        keep = [r for r in range(self.size()) if r not in ex]
        if self.rank() not in keep:
            raise ValueError(f"strata backend: rank {self.rank()} is excluded from the shrink "
                             f"{ex}: only the survivors call it")
        glob = self._global or list(range(self.size()))
        new = type(self)(self._store, keep.index(self.rank()), len(keep), self._timeout,
                         [glob[r] for r in keep], f"{self._name}/shrunk")
        abort = bool(shrink_flags & 1)  # SHRINK_ABORT
        # A communicator not made yet is made later by the survivors (create_group).
        if self._cpu is not None:
            new._cpu = self._cpu.shrink(ex, abort=abort)
        if self._cuda is not None:
            new._cuda = self._cuda.shrink(ex, abort=abort)
        return new

    # torch asks whether a group splits (new_group's split path): communicators of a
    # group are made by its members alone (`Comm.create_group`), never split.
    supports_splitting = False

    def getBackendName(self) -> str:
        return BACKEND

    # -- communicators --
    def _comm(self, t: torch.Tensor, method: str) -> _s.Comm:
        if self._aborted:
            raise dist.DistBackendError(f"strata backend: {method}: the group was aborted")
        if t.device.type == "cpu":
            if self._cpu is None:
                self._cpu = self._make_cpu(method)
            return self._cpu
        if t.device.type == "cuda":
            if self._cuda is None:
                self._cuda = self._make_cuda(t, method)
            return self._cuda
        raise _unsupported(method, f"tensors on {t.device} (cpu: mpi transport, cuda: nccl)")

    def _make_cpu(self, method: str) -> _s.Comm:
        world = _world_cpu(self.size() if self._global is None else None)
        if self._global is None:
            comm = world
        else:
            comm = world.create_group(self._global)
        if comm.rank != self.rank() or comm.size != self.size():
            raise _unsupported(method, f"strata rank {comm.rank}/{comm.size} is not torch's "
                               f"{self.rank()}/{self.size()}: torch's ranks must be the MPI "
                               "world ranks (RANK=$OMPI_COMM_WORLD_RANK)")
        return comm

    def _make_cuda(self, t: torch.Tensor, method: str) -> _s.Comm:
        key = "strata/nccl_uid"
        if self.rank() == 0:
            uid = _s.get_unique_id("nccl")
            self._store.set(key, bytes(uid))
        else:
            self._store.wait([key], self._timeout)
            uid = _s.UniqueId.from_bytes(self._store.get(key))
        topo = None
        if self._global is not None and dist.is_initialized():
            topo = group_topology(os.environ.get("STRATA_TOPOLOGY"), dist.get_world_size(), self._global)
        # The communicator's GPU is the device current on this thread: set for the call
        # only (a scoped guard), never the process's default device.
        with torch.cuda.device(t.device):
            return _s.init_rank(self.size(), uid, self.rank(), transport="nccl", topology=topo,
                                timeout=self._timeout.total_seconds())

    # -- issuing --
    def _issue(self, method: str, tensors: Sequence[torch.Tensor],
               run: Callable[[_s.Comm, bool], Any], result: Any,
               post: Optional[Callable[[], None]] = None, opts: Any = None) -> dist.Work:
        """Run ``run(comm, async_op)``; returns the torch Work. CPU: completed by the
        waiter when strata's last work completes. CUDA, as ProcessGroupNCCL: with
        ``opts.asyncOp`` false on the current stream, else (and for send / recv) on this
        group's internal stream of the device, which first waits for the current one;
        the Work is the call's end event ([`_CudaWork`])."""
        first = tensors[0]
        comm = self._comm(first, method)
        _SERVED[first.device.type] = _SERVED.get(first.device.type, 0) + 1
        for t in tensors:
            if t.device != first.device:
                raise _unsupported(method, "tensors on different devices")
        if first.device.type == "cuda":
            return self._issue_cuda(method, first.device, comm, tensors, run, result, post,
                                    bool(getattr(opts, "asyncOp", True)))
        try:
            last = run(comm, True)
        except _s.StrataError as e:
            raise _unsupported(method, str(e)) from e
        if self._coalescing:
            self._coalesced.append((last, post))
            return _done_work(result)
        return self._waiter.submit(last, result, post)

    def _issue_cuda(self, method: str, dev: torch.device, comm: _s.Comm, tensors: Sequence[torch.Tensor],
                    run: Callable[[_s.Comm, bool], Any], result: Any,
                    post: Optional[Callable[[], None]], async_op: bool) -> dist.Work:
        current = torch.cuda.current_stream(dev)
        if self._coalescing:
            # A coalesced block runs on the current stream; its end event is recorded by
            # end_coalescing, after the group launched.
            stream = current
            self._coalesced_device = dev
        elif async_op:
            stream = self._side_streams.get(dev.index)
            if stream is None:
                stream = self._side_streams[dev.index] = torch.cuda.Stream(dev)
            stream.wait_stream(current)
        else:
            stream = current
        try:
            with torch.cuda.device(dev), torch.cuda.stream(stream):
                run(comm, False)
                if post is not None and not self._coalescing:
                    post()
        except _s.StrataError as e:
            raise _unsupported(method, str(e)) from e
        hold = list(tensors) + _closure_tensors(run, post)
        if stream is not current:
            # The caching allocator must not hand these blocks to the current stream
            # before the collective on the internal stream is done with them.
            for t in hold:
                if t.is_cuda:
                    t.record_stream(stream)
        if self._coalescing:
            self._coalesced.append((None, post))
            self._coalesced_hold.extend(hold)
            return _done_work(result)
        return _CudaWork(stream, result, (hold, run, post), comm)

    @staticmethod
    def _grouped(calls: List[Callable[[], Any]]) -> Any:
        """Run ``calls`` as one strata group; the last one's work."""
        last = None
        with _s.group():
            for c in calls:
                w = c()
                last = w if w is not None else last
        return last

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
            return self._grouped([lambda w=w: comm.all_reduce(_reducible(w), op=name, async_op=a)
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
            return self._grouped([lambda s=s, g=g: comm.all_gather(_movable(s), _movable(g), async_op=a)
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
            last = self._grouped(calls)
            gather = []
            for _, pad, q in items:
                if me == root:
                    gather += [lambda pad=pad, q=q, p=p: comm.recv(_movable(pad[p * q:(p + 1) * q]), p, async_op=a)
                               for p in range(n) if p != root]
                else:
                    gather.append(lambda pad=pad, q=q: comm.send(_movable(pad[me * q:(me + 1) * q]), root,
                                                                 async_op=a))
            w = self._grouped(gather)
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
            return self._grouped([lambda o=o, p=p: comm.recv(_movable(o), p, async_op=a)
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
            return self._grouped([lambda i=i, p=p: comm.send(_movable(i), p, async_op=a)
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
            return self._grouped([lambda s=s, r=r: comm.all_gather(s, r, async_op=a) for s, r in pairs])

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
            return self._grouped([lambda s=s, r=r: comm.reduce_scatter(_reducible(s), _reducible(r), op=name,
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
            return self._grouped([lambda w=w: comm.broadcast(w, root=root, async_op=a) for w in items])

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
            return self._grouped(calls)

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
            return self._grouped(calls)

        def post():
            for t, o in zip(output_tensors, outs):
                t.copy_(o.view(t.dtype).reshape(t.shape) if t.dtype not in _REDUCE_DTYPES else o.reshape(t.shape))
        return self._issue(method, list(output_tensors) + list(input_tensors), run, output_tensors, post, opts=opts)

    # -- point-to-point --
    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:
        items = [_movable(t.contiguous()) for t in tensors]

        def run(comm, a):
            return self._grouped([lambda t=t: comm.send(t, dstRank, async_op=a) for t in items])
        return self._issue("send", tensors, run, tensors)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:
        works = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in tensors]

        def run(comm, a):
            return self._grouped([lambda w=w: comm.recv(_movable(w), srcRank, async_op=a) for w in works])

        def post():
            for t, w in zip(tensors, works):
                if w is not t:
                    t.copy_(w)
        return self._issue("recv", tensors, run, tensors, post)

    # -- barrier --
    def barrier(self, opts: Any = None) -> dist.Work:
        # On the GPU of `device_ids`, else the device torch chose (`opts.device`: the
        # group's bound device, or the current one), else of this group's CUDA
        # communicator, else the current GPU when there is no MPI world for CPU tensors
        # (torchrun), else on the CPU.
        ids = list(getattr(opts, "device_ids", None) or [])
        chosen = getattr(opts, "device", None)
        if ids:
            dev = torch.device("cuda", ids[0])
        elif chosen is not None and torch.device(chosen).type in ("cpu", "cuda"):
            dev = torch.device(chosen)
            if dev.type == "cuda" and dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif self._cuda is not None or (_mpi_env() is None and torch.cuda.is_available()):
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cpu")
        t = torch.zeros(1, dtype=torch.int32, device=dev)

        def run(comm, a):
            return comm.all_reduce(t, async_op=a)

        work = self._issue("barrier", [t], run, None, None, opts=_BLOCKING)
        if dev.type == "cuda":
            # A barrier holds the host until every rank reached it, as NCCL's does.
            torch.cuda.current_stream(dev).synchronize()
        return work

    # -- coalescing --
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
        _s.group_end()
        items, self._coalesced = self._coalesced, []
        dev, self._coalesced_device = self._coalesced_device, None
        hold, self._coalesced_hold = self._coalesced_hold, []
        if dev is not None:
            # CUDA: the block ran on the current stream; its copies-out follow there.
            stream = torch.cuda.current_stream(dev)
            with torch.cuda.device(dev), torch.cuda.stream(stream):
                for _, p in items:
                    if p is not None:
                        p()
            return _CudaWork(stream, None, (hold, items))
        works = [w for w, _ in items if w is not None]
        # Complete the block before returning: code written for NCCL's stream order reads a
        # coalesced block's outputs without waiting on its work (DeepSpeed's MiCS waits on
        # torch's _IllegalWork of the block, catches the error and goes on).
        try:
            if works:
                works[-1].wait()
        except _s.StrataError as e:
            raise _unsupported("_end_coalescing", str(e)) from e
        for _, p in items:
            if p is not None:
                p()
        return _done_work(None)

    # The per-device Backend's names of the same two (PyBackend).
    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    def _abort(self) -> None:
        """``ProcessGroup.abort()``: this group's communicators aborted
        (``strataCommAbort``: calls in flight fail, here and on the peers); every later
        call of the group raises. The MPI world's communicator is aborted too when it is
        this group's (the default group's)."""
        self._aborted = True
        for c in (self._cuda, self._cpu):
            if c is not None:
                if c is _WORLD.get("cpu"):
                    del _WORLD["cpu"]
                c.abort()
        self._cuda = self._cpu = None

    def shutdown(self) -> None:
        """Release this group's communicators (the MPI world's stays: other groups and
        the custom comms are made from it)."""
        self._waiter.close()
        world = _WORLD.get("cpu")
        for c in (self._cuda, self._cpu):
            if c is not None and c is not world:
                c.destroy()
        self._cuda = self._cpu = None


class BackendStrata(_Ops, _c10d.Backend):
    """strata as torch's per-device ``Backend`` (torch with Python ``Backend`` subclasses,
    ``PyBackend``: 2.15 here): torch wraps it in the ``ProcessGroup`` of each device it
    serves, so ``"cpu:gloo,cuda:strata"`` keeps gloo for CPU tensors, and C++ lookups by
    device (DTensor, functional collectives, ``_resolve_process_group``) find it."""

    supports_coalescing = True

    # torch.distributed.shrink_group (torch 2.15): the survivors of a group make its
    # communicators anew without the excluded ranks (Comm.shrink, strataCommShrink),
    # the excluded ranks not calling; on the mpi transport also after a peer died.
    supports_shrinking = True

    def shrink(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0,
               opts_override: Any = None) -> "BackendStrata":
        return self._shrunk(ranks_to_exclude, shrink_flags)


class ProcessGroupStrata(_Ops, dist.ProcessGroup):
    """strata as a whole ``ProcessGroup``, for torch without Python ``Backend``
    subclasses (``STRATA_TORCH_BACKEND=group`` forces it). torch's branch for such a
    creator replaces the whole group, so this group composes the other backends of a
    mixed string itself: ``"cpu:gloo,cuda:strata"`` gives it a real gloo backend over the
    same ranks, and every call on CPU tensors goes to it (``others``). C++ lookups by
    device (DTensor, functional collectives) do not find a group of this form."""

    def __init__(self, *args: Any, others: Optional[dict] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: device type -> the torch ``Backend`` serving it (another backend of the string)
        self._others: dict = dict(others or {})
        self._other_works: List[Any] = []

    # -- identity (a Python group has no C++ backend to hold its name) --
    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    # torch asks a group for the backend of a device: init_process_group(device_id=...)
    # (DeepSpeed passes its CUDA device), batch_isend_irecv. This group serves every
    # device itself.
    def _get_backend(self, device: Any) -> "ProcessGroupStrata":
        return self

    def name(self) -> str:
        return BACKEND

    def _other(self, device_type: str) -> Any:
        return self._others.get(device_type)

    def _start_coalescing(self, device: Any = None) -> None:
        other = self._other(torch.device(device).type) if device is not None else None
        if other is not None:
            other._start_coalescing()
            return
        _Ops._start_coalescing(self, device)

    def _end_coalescing(self, device: Any = None) -> dist.Work:
        other = self._other(torch.device(device).type) if device is not None else None
        if other is not None:
            return other._end_coalescing()
        return _Ops._end_coalescing(self, device)

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    def barrier(self, opts: Any = None) -> dist.Work:
        dev = getattr(opts, "device", None)
        other = self._other(torch.device(dev).type) if dev is not None else None
        if other is not None and not list(getattr(opts, "device_ids", None) or []):
            return other.barrier(opts) if opts is not None else other.barrier()
        return _Ops.barrier(self, opts)


# The group form's methods and the name of each on a torch Backend (a composed gloo).
_DELEGATED = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce_coalesced", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter", "all_gather_single": "_allgather_base",
    "_allgather_base": "_allgather_base", "all_gather_single_coalesced": "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_single_coalesced", "allgather": "allgather",
    "reduce_scatter_single": "_reduce_scatter_base", "_reduce_scatter_base": "_reduce_scatter_base",
    "reduce_scatter_single_coalesced": "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced", "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast", "all_to_all_single": "alltoall_base", "alltoall_base": "alltoall_base",
    "alltoall": "alltoall", "send": "send", "recv": "recv",
}  # fmt: skip


def _first_tensor(x: Any) -> Optional[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    return None


def _delegating(name: str, target: str) -> Callable[..., Any]:
    own = getattr(_Ops, name)

    def method(self: ProcessGroupStrata, *args: Any, **kwargs: Any) -> Any:
        t = _first_tensor(list(args))
        other = self._other(t.device.type) if t is not None else None
        if other is not None:
            return getattr(other, target)(*args, **kwargs)
        return own(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = own.__doc__
    return method


for _name, _target in _DELEGATED.items():
    setattr(ProcessGroupStrata, _name, _delegating(_name, _target))


def _device_backends() -> dict:
    """The device -> backend name map of the group torch is making now (its helper's
    ``backend_config``), or {} where this torch does not show it: what the group form
    composes. Read from the caller frames, as no creator argument carries it."""
    import inspect
    frame = inspect.currentframe()
    try:
        while frame is not None:
            cfg = frame.f_locals.get("backend_config")
            if cfg is not None and hasattr(cfg, "get_device_backend_map"):
                return {str(k): str(v) for k, v in cfg.get_device_backend_map().items()}
            frame = frame.f_back
    finally:
        del frame
    return {}


def _compose(opts: Any) -> dict:
    """The other backends of a mixed string for the group form: a gloo backend over the
    same ranks for each device the string gives gloo (its own store prefix). Other
    backends (nccl for CUDA beside strata for CPU) cannot be composed and are refused."""
    others = {}
    for device, name in _device_backends().items():
        if name.lower() == BACKEND:
            continue
        if name.lower() != "gloo":
            raise RuntimeError(f"strata backend: {device}:{name} beside strata needs torch with Python Backend "
                               f"subclasses (this torch {torch.__version__}: strata takes the whole group, "
                               "and composes only gloo)")
        store = dist.PrefixStore(f"strata-compose/{device}/", opts.store)
        others[device] = _c10d.ProcessGroupGloo(store, opts.group_rank, opts.group_size, opts.timeout)
    return others


def _python_backends() -> bool:
    """True when torch's ``Backend`` takes Python subclasses whose overrides C++ calls
    (PyBackend): probed by calling the base binding of ``allreduce`` on a subclass."""
    if os.environ.get("STRATA_TORCH_BACKEND", "").strip().lower() == "group":
        return False

    class Probe(_c10d.Backend):
        def allreduce(self, tensors: Any, opts: Any = None) -> Any:
            return _done_work(tensors)
    try:
        _c10d.Backend.allreduce(Probe(0, 1), [torch.zeros(1)], dist.AllreduceOptions())
        return True
    except Exception:
        return False


class _RankSize:
    """``rank()`` and ``size()`` for [`_Delegate`] (no torch base class)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank_, self._size_ = rank, size

    def rank(self) -> int:
        return self._rank_

    def size(self) -> int:
        return self._size_


class _Delegate(_Ops, _RankSize):
    """The Python half of the C++ backend: it makes the group's communicators and serves
    the calls the C++ half hands it (CUDA tensors, bool / complex / bitwise reductions,
    uneven all-to-all, gather, scatter, reduce, send / recv, coalescing blocks)."""


_CPP: Any = None


def cpp_module() -> Any:
    """The C++ backend's extension module (``csrc/torch_backend.cpp``), built for the
    installed torch at first use with ``torch.utils.cpp_extension`` (needs a C++20
    compiler and ninja) into ``torch-<version>`` under ``$STRATA_TORCH_EXT_DIR``
    (default ``~/.cache/strata``), then loaded from there: one build per torch version,
    shared by the processes of a job (torch's file lock; a lock older than 15 minutes,
    left by a killed build, is removed). The one ``pip install --no-build-isolation``
    built for this very torch (``strata._torch_cpp_<version>``, setup.py) is taken
    instead when it is there."""
    global _CPP
    with _LOCK:
        if _CPP is None:
            _CPP = _installed_cpp()
        if _CPP is None:
            from torch.utils import cpp_extension
            try:  # the ninja wheel's binary, where the environment's bin is not on PATH
                import ninja  # type: ignore[import-not-found]
                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
            except (ImportError, AttributeError):
                pass
            tag = _torch_tag()
            build = os.path.join(os.environ.get("STRATA_TORCH_EXT_DIR") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata"), f"torch-{tag}")
            os.makedirs(build, exist_ok=True)
            _clear_stale_lock(build)
            src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "torch_backend.cpp")
            name = f"strata_torch_{tag}"
            missing = _cpp_toolchain_missing(not os.path.exists(os.path.join(build, name + ".so")))
            if missing:
                raise RuntimeError(f"strata backend: the C++ backend for torch {torch.__version__} cannot be "
                                   f"built here: {missing} (set STRATA_TORCH_BACKEND=python to use the "
                                   f"Python backend instead, at several times the host cost per call)")
            try:
                _CPP = cpp_extension.load(name=name, sources=[src], build_directory=build,
                                          extra_cflags=["-O2"], verbose=False)
            except Exception as e:
                raise RuntimeError(f"strata backend: building the C++ backend for torch {torch.__version__} "
                                   f"failed (it needs a C++20 compiler and ninja: pip install ninja; "
                                   f"STRATA_TORCH_BACKEND=python uses the Python backend instead): {e}") from e
        return _CPP


def _torch_tag() -> str:
    """The torch version as a module-name tag (setup.py's ``torch_tag``)."""
    return "".join(c if c.isalnum() else "_" for c in torch.__version__)


def _installed_cpp() -> Any:
    """The C++ backend the package's install built for the running torch, or ``None``
    (none built, or built for another torch version, whose module name differs, so a
    module of another torch's C++ ABI is never imported)."""
    import importlib
    import importlib.util
    name = f"strata._torch_cpp_{_torch_tag()}"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def _clear_stale_lock(build: str, stale_s: float = 900.0) -> None:
    """Remove the build lock a killed build left behind (``torch.utils.cpp_extension``
    takes it for the length of a build and waits, with no limit, for any it finds): one
    older than ``stale_s`` (a build takes about a minute) belongs to no live build."""
    import time
    lock = os.path.join(build, "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return
    if age > stale_s:
        import warnings
        warnings.warn(f"strata backend: removing {lock}, left {age / 60:.0f} min ago by a build "
                      "that did not finish")
        try:
            os.remove(lock)
        except OSError:
            pass


def _cpp_toolchain_missing(need_compiler: bool) -> Optional[str]:
    """What the C++ backend's build lacks here (``None``: nothing): ninja (which torch
    runs even to find a build up to date), and, with ``need_compiler``, the C++
    compiler torch would call (``$CXX``, else ``c++``)."""
    import shutil
    from torch.utils import cpp_extension
    lacks = []
    if not cpp_extension.is_ninja_available():
        lacks.append("ninja is not installed (pip install ninja)")
    cxx = os.environ.get("CXX", "c++")
    if need_compiler and shutil.which(cxx.split()[0] if cxx.strip() else "c++") is None:
        lacks.append(f"no C++ compiler ({cxx!r} is not on PATH; install g++ 10 or later, or set CXX)")
    return "; ".join(lacks) or None


def _form() -> str:
    """``STRATA_TORCH_BACKEND``: unset or ``cpp`` (the default) the C++ backend;
    ``python`` the Python one (per device where torch takes Python subclasses, else the
    whole group); ``group`` the whole-group form."""
    v = os.environ.get("STRATA_TORCH_BACKEND", "").strip().lower()
    if v in ("", "cpp"):
        return "cpp"
    if v in ("python", "backend"):
        return "backend" if _python_backends() else "group"
    if v == "group":
        return "group"
    raise ValueError(f"STRATA_TORCH_BACKEND={v!r}: expected cpp (the default), python or group")


#: Which form torch holds strata in (``STRATA_TORCH_BACKEND``, :func:`_form`): ``"cpp"``
#: (the C++ backend, the default), ``"backend"`` (the Python one per device) or
#: ``"group"`` (a whole Python group).
FORM = _form()
_SERVED: dict = {}


def served() -> dict:
    """How many calls strata's backend has served in this process, by device type
    (``{"cpu": n, "cuda": m}``): what shows which backend a mixed backend string routed
    a call to. The C++ backend's own calls count under their device, and all of them
    under ``"cpp"`` as well."""
    out = dict(_SERVED)
    if _CPP is not None:
        n = int(_CPP.native_calls())
        m = int(_CPP.native_cuda_calls())
        out["cpu"] = out.get("cpu", 0) + n
        if m:
            out["cuda"] = out.get("cuda", 0) + m
        out["cpp"] = n + m
    return out


# ---- FSDP2 custom collectives ----

try:  # torch >= 2.8
    from torch.distributed.fsdp import AllGather as _FsdpAllGather, ReduceScatter as _FsdpReduceScatter
except ImportError:  # pragma: no cover
    from torch.distributed.fsdp._fully_shard._fsdp_api import (  # type: ignore
        AllGather as _FsdpAllGather, ReduceScatter as _FsdpReduceScatter)

_CUSTOM: dict = {}
_CUSTOM_WAITER: Optional[_Waiter] = None


def _default_timeout() -> timedelta:
    """``STRATA_TIMEOUT`` seconds, else torch's default process-group timeout."""
    v = os.environ.get("STRATA_TIMEOUT", "").strip()
    try:
        if v and float(v) > 0:
            return timedelta(seconds=float(v))
    except ValueError:
        pass
    return dist.default_pg_timeout


def _custom_comm(group: Any, device: torch.device, algo: str) -> _s.Comm:
    """The strata communicator of ``group``'s ranks with default algorithm ``algo``
    (made on first use by the group's members, then cached)."""
    ranks = tuple(dist.get_process_group_ranks(group))
    key = (ranks, device.type, algo)
    with _LOCK:
        got = _CUSTOM.get(key)
    if got is not None:
        return got
    if device.type == "cpu":
        world = _world_cpu(dist.get_world_size())
        comm = world.create_group(list(ranks), algo=algo)
    elif device.type == "cuda":
        store = dist.distributed_c10d._get_default_store()
        name = f"strata/custom/{'-'.join(map(str, ranks))}/{algo}"
        me = ranks.index(dist.get_rank())
        if me == 0:
            store.set(name, bytes(_s.get_unique_id("nccl")))
        # A member that never comes is an error after the timeout, not a hang.
        store.wait([name], _default_timeout())
        uid = _s.UniqueId.from_bytes(store.get(name))
        topo = group_topology(os.environ.get("STRATA_TOPOLOGY"), dist.get_world_size(), ranks)
        with torch.cuda.device(device):
            comm = _s.init_rank(len(ranks), uid, me, transport="nccl", topology=topo, algo=algo)
    else:
        raise RuntimeError(f"strata custom comm: tensors on {device}")
    with _LOCK:
        _CUSTOM[key] = comm
    return comm


def _custom_issue(comm: _s.Comm, device: torch.device, run: Callable[[bool], Any],
                  async_op: bool, result: Any) -> Optional[dist.Work]:
    global _CUSTOM_WAITER
    if device.type != "cpu":
        run(False)  # stream-ordered on the current stream
        return _done_work(result) if async_op else None
    if not async_op:
        run(False)
        return None
    with _LOCK:
        if _CUSTOM_WAITER is None:
            _CUSTOM_WAITER = _Waiter()
        waiter = _CUSTOM_WAITER
    return waiter.submit(run(True), result, None)


class _Custom:
    def __init__(self, algo: str, bits: Optional[int] = None, block: int = 256) -> None:
        self.algo, self.bits, self.block = algo, bits, block

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
        comm = _custom_comm(group, dev, "ring" if self.algo == "qwz" else self.algo)
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
        comm = _custom_comm(group, dev, "ring" if self.algo == "qgz" else self.algo)
        src = input_tensor.contiguous()
        if factor is not None:
            src = src * factor

        def run(a: bool) -> Any:
            if self.bits is not None:
                return comm.reduce_scatter_quantized(src, output_tensor, op=name, bits=self.bits,
                                                     block=self.block, async_op=a)
            return comm.reduce_scatter(src, output_tensor, op=name, async_op=a)
        return _custom_issue(comm, dev, run, async_op, output_tensor)


def set_custom_comms(model: torch.nn.Module, all_gather: Optional[AllGather] = None,
                     reduce_scatter: Optional[ReduceScatter] = None) -> int:
    """Put ``all_gather`` / ``reduce_scatter`` under every FSDP module of ``model``
    (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``); returns how
    many modules were set."""
    from torch.distributed.fsdp import FSDPModule
    n = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            if all_gather is not None:
                m.set_custom_all_gather(all_gather)
            if reduce_scatter is not None:
                m.set_custom_reduce_scatter(reduce_scatter)
            n += 1
    return n


def traffic() -> dict:
    """The bytes strata's CPU communicators (backend ``strata`` groups and the custom
    comms alike) sent since the MPI world was joined, summed over every rank, by link
    class of the world topology (``STRATA_TOPOLOGY`` or detection): ``intra_package``,
    ``intra_node``, ``inter_node``, ``max_node_egress`` (the most bytes out of one node),
    ``measured`` (False on mpi: the sends strata's own algorithms issued). Collective
    over the world: call it on every rank at the same point, after waiting for the works
    to count; subtract two readings for what ran in between (``Comm.traffic``)."""
    return _world_cpu(dist.get_world_size() if dist.is_initialized() else None).traffic(all_members=True)


_PRESET_RANKS_PER_NODE = {"dgx-a100": 8, "dgx-h100": 8, "frontier": 8, "p3dn": 8, "p4d": 8, "p5": 8}


def group_topology(spec: Optional[str], world: int, ranks: Sequence[int]) -> Optional[str]:
    """The topology SPEC of a group of world ``ranks`` under the world's SPEC ``spec``
    (``STRATA_TOPOLOGY``), for a GPU group, which is a communicator of its own: the
    members (in rank order, as torch's ``new_group`` and DeviceMesh list them) keep their
    nodes. Whole nodes of a preset stay that preset (``dgx-h100:4``,
    ranks of 2 whole nodes: ``dgx-h100:2``); whole nodes of ``nodes:NxPxD`` keep P and D;
    m members in each of n nodes otherwise give ``nodes:nxm``; members spread unevenly
    over nodes give one flat node (the hierarchical algorithms need a regular mesh).
    None when ``spec`` is unset (the nccl transport then detects the nodes by host) or
    the group is the whole world. A ``.json`` file SPEC is read for its shape."""
    ranks = list(ranks)
    if not spec or not spec.strip() or len(ranks) == world and sorted(ranks) == list(range(world)):
        return None
    s = spec.strip().lower()
    head = s.split(",")[0]
    kind, _, dims = head.partition(":")
    if s.endswith(".json") or os.path.isfile(spec.strip()):
        import json
        with open(spec.strip()) as f:
            t = json.load(f)
        inner = (int(t["packages_per_node"]), int(t["dies_per_package"]))
    elif kind == "nodes":
        parts = [int(x) for x in dims.split("x")]
        inner = (parts[1], parts[2]) if len(parts) == 3 else (parts[1], 1)
    elif kind in _PRESET_RANKS_PER_NODE:
        inner = None
    else:
        raise RuntimeError(f"strata backend: STRATA_TOPOLOGY={spec!r} is not a SPEC this module "
                           "can restrict to a group (nodes:NxR, nodes:NxPxD, a preset or a .json file)")
    per_node = inner[0] * inner[1] if inner else _PRESET_RANKS_PER_NODE[kind]
    counts: dict = {}
    for r in ranks:
        counts[r // per_node] = counts.get(r // per_node, 0) + 1
    m = set(counts.values())
    if len(m) != 1 or ranks != sorted(ranks):
        return f"nodes:1x{len(ranks)}"
    n, m = len(counts), m.pop()
    if m == per_node:
        if inner is None:
            return f"{kind}:{n}"
        return f"nodes:{n}x{inner[0]}x{inner[1]}" if inner[1] > 1 else f"nodes:{n}x{m}"
    return f"nodes:{n}x{m}"


def _mpi_env() -> Optional[tuple]:
    """(rank, size) from the MPI launcher's environment, if launched by one."""
    for r, n in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ and n in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    return None


def _world_cpu(size: Optional[int] = None) -> _s.Comm:
    """The process's mpi world communicator. Joining it is collective over the MPI
    world, so it is made when this module is imported under mpirun (every rank imports
    it at the same point), or at the first use otherwise."""
    with _LOCK:
        if "cpu" not in _WORLD:
            env = _mpi_env()
            if env is None:
                raise RuntimeError("strata backend: CPU tensors run on the mpi transport: "
                                   "launch with mpirun (OMPI_COMM_WORLD_RANK not set)")
            rank, n = env
            if size is not None and size != n:
                raise RuntimeError(f"strata backend: torch's world has {size} ranks, the MPI "
                                   f"world {n}")
            _WORLD["cpu"] = _s.init_rank(n, _s.get_unique_id("mpi"), rank, transport="mpi")
        return _WORLD["cpu"]


def _create(opts: Any, backend_options: Any) -> _Ops:
    ranks = list(opts.global_ranks_in_group or [])
    args = (opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks if ranks else None,
            str(opts.group_id))
    if FORM == "cpp":
        _s._load()
        d = _Delegate(*args)
        return cpp_module().new_backend(d, opts.group_rank, opts.group_size, _s._lib_path)
    if FORM == "backend":
        return BackendStrata(*args)
    return ProcessGroupStrata(*args, others=_compose(opts))


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])

# Under an MPI launcher, join the MPI world now: every rank imports this module at the
# same point, while a group's first call reaches only its members. A failure (a library
# built without mpi) is reported when CPU tensors are first used.
if _mpi_env() is not None and os.environ.get("STRATA_TORCH_LAZY_MPI") != "1":
    try:
        _world_cpu()
    except _s.StrataError:
        pass


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m strata.torch build   (builds the C++ backend for this torch)")
    m = cpp_module()
    how = "installed with the package" if _installed_cpp() is m else "built"
    print(f"strata: the C++ torch backend is {how} for torch {torch.__version__}: {m.__file__}")
