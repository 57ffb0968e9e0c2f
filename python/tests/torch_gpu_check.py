"""The torch backend on CUDA tensors (strata's nccl transport), for a machine with GPUs,
under torchrun (one process per GPU; scripts/gpu-transports-check runs it)::

    torchrun --standalone --nproc_per_node=$(nvidia-smi -L | wc -l) python/tests/torch_gpu_check.py

- Every call over ``"cuda:strata,cpu:gloo"`` equals an exact reference computed on the
  host from every rank's inputs (``data()`` is seeded by rank, so each rank regenerates
  all of them; reductions in float64, then rounded once to the dtype; AVG and PREMUL_SUM
  within 1e-2, as rounding order may differ): all-reduce for every reduce op,
  all_gather_into_tensor, reduce_scatter_tensor (SUM, AVG), the list forms, broadcast,
  all_to_all_single, coalesced all-gathers, async handles, on f32/f16/bf16, counts
  divisible by nothing; a sub-group of the even ranks when there are 4 or more. The same
  call also runs over torch's own ``nccl`` backend (a second group over the same ranks)
  and is held to the same reference, but where nccl differs from it (torch 2.11's nccl
  returned all zeros for a one-rank bf16 PREMUL_SUM) a note is printed, not a failure.
- Stream order: the input is written by kernels queued behind a long sleep on the
  current stream, and the result is read by the next kernel, without any synchronize;
  the same on a side stream made current.
- NCCL's stream semantics: ``async_op=False`` and ``async_op=True`` both return to the
  host while the GPU is still busy behind a long sleep; an async call's ``wait()`` on a
  side stream orders that stream's consumer after the collective (checked with only that
  stream synchronized); ``get_future()`` yields the result on the device; in the group
  and C++ forms ``is_completed()`` is False while the GPU sleeps and True after; ``barrier()``
  (no MPI under torchrun) and ``barrier(device_ids=[local])`` run on the GPU.
- A failure injected (C++ form): a group aborted while an async all-reduce on it waits
  behind GPU work (by a peer with 2+ ranks, by the rank itself with one) raises from
  ``wait()``, and the next call on the aborted group raises.
- ``dist.broadcast`` of a parameter that requires grad. In the C++ form (the default),
  the common CUDA calls are asserted to have run in C++ (``strata.torch.served()``).
- FSDP2 on GPU: the small transformer of torch_fsdp_check.py, 20 steps, fp32, with
  strata groups and with nccl groups plus strata's ``hier`` custom comms, against nccl
  groups: losses within 1e-5 relative.

With one GPU the world has one rank (NCCL refuses two ranks on one device): the calls
are then identities, but every path (bootstrap through the store, stream order, FSDP2's
calls) still runs. Rank 0 prints ``torch gpu check OK`` and a table.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import strata.torch as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fsdp_check import Net  # noqa: E402

R = dist.ReduceOp
# Whether strata can read PREMUL_SUM's factor on this torch (ReduceOp.factor, or the op's
# pickled state on torch 2.11).
PREMUL_FACTOR = st._premul_factor(dist._make_nccl_premul_sum(0.5)) is not None
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
calls = 0  # every check passed (compared calls, stream order, semantics, barriers)
compared = 0  # the calls held to the exact reference, on strata and on nccl
nccl_differs = []  # the calls where torch's nccl differed from the exact reference


def host_data(n, salt, rank):
    """Rank ``rank``'s input of ``data(n, ., salt)`` on the host, in float64 (small
    integers, exact in every dtype)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-4, 5, (n,), generator=g).to(torch.float64)


def data(n, dtype, salt):
    return host_data(n, salt, dist.get_rank()).to(dtype).cuda()


def exact(x, dtype):
    """The float64 result ``x`` (or a list of them) rounded once to ``dtype``, on the GPU."""
    if isinstance(x, (list, tuple)):
        return [exact(t, dtype) for t in x]
    return x.to(dtype).cuda()


def same(a, b, want, what, loose=False):
    """strata's ``a`` equals the exact ``want`` (within 1e-2 where ``loose``: AVG and
    PREMUL_SUM, whose rounding order may differ), or fail; nccl's ``b`` is held to the
    same, but a difference there is only noted."""
    global calls, compared
    if isinstance(a, (list, tuple)):
        for i, (x, y, z) in enumerate(zip(a, b, want, strict=True)):
            same(x, y, z, f"{what} [{i}]", loose)
        return
    calls += 1
    compared += 1
    torch.cuda.synchronize()

    def agrees(t):
        return torch.equal(t, want) or (loose and torch.allclose(t.float(), want.float(), 1e-2, 1e-2))

    if not agrees(a):
        raise AssertionError(f"rank {dist.get_rank()}: {what}: strata {a} != exact {want} (nccl gave {b})")
    if not agrees(b):
        nccl_differs.append(what)
        print(f"note: rank {dist.get_rank()}: {what}: torch's nccl differs from the exact reference "
              f"(strata equals it): nccl {b[:8].tolist()} vs exact {want[:8].tolist()}", flush=True)


def calls_equal(sg, ng, tag):
    """Every call on strata group ``sg`` equals the exact reference; the same call on nccl
    group ``ng`` is held to it too, a difference there only noted (see ``same``)."""
    p = dist.get_world_size(sg)
    me = dist.get_rank(sg)
    ranks = [dist.get_global_rank(sg, i) if sg is not None else i for i in range(p)]  # group order

    def every(n, salt):
        """Every rank's input of ``data(n, ., salt)`` (float64, group order)."""
        return [host_data(n, salt, rk) for rk in ranks]

    def reduced(xs, name):
        t = torch.stack(xs)
        if name == "max":
            return t.max(0).values
        if name == "min":
            return t.min(0).values
        if name == "premul":
            return (0.5 * t).sum(0)
        return t.sum(0) / p if name == "avg" else t.sum(0)

    for dtype in FLOATS:
        n = 37
        for name, op in (("sum", R.SUM), ("max", R.MAX), ("min", R.MIN), ("avg", R.AVG),
                         ("premul", dist._make_nccl_premul_sum(0.5))):
            a, b = data(n, dtype, 1), data(n, dtype, 1)
            if name == "premul" and not PREMUL_FACTOR:
                # This torch keeps the factor from Python backends: a clear error.
                try:
                    dist.all_reduce(a, op=op, group=sg)
                except RuntimeError as e:
                    if "PREMUL_SUM" not in str(e):
                        raise
                    continue
                raise AssertionError("PREMUL_SUM without ReduceOp.factor did not fail")
            dist.all_reduce(a, op=op, group=sg)
            dist.all_reduce(b, op=op, group=ng)
            same(a, b, exact(reduced(every(n, 1), name), dtype), f"{tag} all_reduce {dtype} {name}",
                 loose=name in ("avg", "premul"))
        x = data(n, dtype, 2)
        a, b = torch.empty(p * n, dtype=dtype, device="cuda"), torch.empty(p * n, dtype=dtype, device="cuda")
        w = dist.all_gather_into_tensor(a, x, group=sg, async_op=True)
        dist.all_gather_into_tensor(b, x, group=ng)
        w.wait()
        same(a, b, exact(torch.cat(every(n, 2)), dtype), f"{tag} all_gather_into_tensor {dtype}")
        for name, op in (("sum", R.SUM), ("avg", R.AVG)):
            x = data(p * n, dtype, 3)
            a, b = torch.empty(n, dtype=dtype, device="cuda"), torch.empty(n, dtype=dtype, device="cuda")
            dist.reduce_scatter_tensor(a, x, op=op, group=sg)
            dist.reduce_scatter_tensor(b, x, op=op, group=ng)
            want = reduced(every(p * n, 3), name)[me * n:(me + 1) * n]
            same(a, b, exact(want, dtype), f"{tag} reduce_scatter_tensor {dtype} {name}", loose=name == "avg")
        x = data(n, dtype, 4)
        la = [torch.empty_like(x) for _ in range(p)]
        lb = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(la, x, group=sg)
        dist.all_gather(lb, x, group=ng)
        same(la, lb, exact(every(n, 4), dtype), f"{tag} all_gather list {dtype}")
        a, b = data(n, dtype, 5), data(n, dtype, 5)
        root = dist.get_global_rank(sg, p - 1) if sg is not None else p - 1
        dist.broadcast(a, src=root, group=sg)
        dist.broadcast(b, src=root, group=ng)
        same(a, b, exact(host_data(n, 5, root), dtype), f"{tag} broadcast {dtype}")
        x = data(p * 5, dtype, 6)
        a, b = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(a, x, group=sg)
        dist.all_to_all_single(b, x, group=ng)
        want = torch.cat([v[me * 5:(me + 1) * 5] for v in every(p * 5, 6)])
        same(a, b, exact(want, dtype), f"{tag} all_to_all_single {dtype}")
    xs = [data(k, torch.float32, 7 + k) for k in (3, 11, 1)]
    outs_a = [torch.empty(p * x.numel(), device="cuda") for x in xs]
    outs_b = [torch.empty(p * x.numel(), device="cuda") for x in xs]
    with dist._coalescing_manager(group=sg, device=torch.device("cuda")):
        for o, x in zip(outs_a, xs):
            dist.all_gather_into_tensor(o, x, group=sg)
    for o, x in zip(outs_b, xs):
        dist.all_gather_into_tensor(o, x, group=ng)
    want = [torch.cat(every(k, 7 + k)) for k in (3, 11, 1)]
    same(outs_a, outs_b, exact(want, torch.float32), f"{tag} coalesced all_gather_into_tensor")


def stream_order(sg):
    """Inputs written behind a long sleep, results read by the next kernel, no sync."""
    p = dist.get_world_size(sg)
    for side in (False, True):
        s = torch.cuda.Stream() if side else torch.cuda.current_stream()
        with torch.cuda.stream(s):
            x = torch.empty(1 << 20, device="cuda")
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
            x.fill_(dist.get_rank() + 1)
            dist.all_reduce(x, group=sg)
            y = x * 2
        s.synchronize()
        want = 2.0 * p * (p + 1) / 2
        if not torch.all(y == want):
            raise AssertionError(f"stream order ({'side' if side else 'current'} stream): {y[:4]} != {want}")
        global calls
        calls += 1


def cuda_semantics(sg):
    """NCCL's stream semantics of the CUDA path (see the module)."""
    import time
    global calls
    p = dist.get_world_size(sg)
    want = float(p * (p + 1) // 2)
    for async_op in (False, True):
        x = torch.empty(1 << 20, device="cuda")
        torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU time on the current stream
        x.fill_(dist.get_rank() + 1)
        t0 = time.monotonic()
        w = dist.all_reduce(x, group=sg, async_op=async_op)
        host = time.monotonic() - t0
        if host > 0.1:
            raise AssertionError(f"all_reduce(async_op={async_op}) held the host {host:.3f} s behind the GPU")
        if async_op:
            if st.FORM in ("group", "cpp") and w.is_completed():
                raise AssertionError("is_completed() is True while the GPU still sleeps before the call")
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                w.wait()
                y = x * 2
            side.synchronize()  # that stream only: its wait() ordered it after the call
            if not torch.all(y == 2 * want):
                raise AssertionError(f"consumer on a side stream after wait(): {y[:4]} != {2 * want}")
            fut = w.get_future()
            got = fut.wait()
            t = got[0] if isinstance(got, (list, tuple)) else got
            torch.cuda.synchronize()
            if not torch.all(t == want):
                raise AssertionError(f"get_future(): {t[:4]} != {want}")
            if st.FORM in ("group", "cpp") and not w.is_completed():
                raise AssertionError("is_completed() is False after the device synchronized")
        else:
            y = x * 2  # the current stream: ordered after the call without any wait
            torch.cuda.synchronize()
            if not torch.all(y == 2 * want):
                raise AssertionError(f"async_op=False result on the current stream: {y[:4]} != {2 * want}")
        calls += 1
    dist.barrier(group=sg)
    dist.barrier(group=sg, device_ids=[torch.cuda.current_device()])
    calls += 2


def requires_grad_broadcast(sg):
    """``dist.broadcast`` of a parameter (a leaf that requires grad), as DDP and model
    initialisation do: rank 0's values everywhere, the parameter still requiring grad."""
    global calls
    w = torch.nn.Parameter(torch.full((1000,), float(dist.get_rank() + 7), device="cuda"))
    dist.broadcast(w, src=0, group=sg)
    torch.cuda.synchronize()
    if not (w.requires_grad and torch.all(w == 7.0)):
        raise AssertionError(f"broadcast of a requires-grad parameter: {w[:4]}, requires_grad={w.requires_grad}")
    calls += 1


def abort_raises():
    """A failure injected: a group's communicator aborted while an async all-reduce on
    it waits behind 0.2 s of GPU work (with 2+ ranks rank 1, a peer, aborts instead of
    joining; with one rank the rank itself aborts after the call): ``wait()`` raises
    ``DistBackendError``, and the aborting rank's next call on the group raises."""
    from datetime import timedelta
    global calls
    g = dist.new_group(backend="strata", timeout=timedelta(seconds=15))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    p, r = dist.get_world_size(), dist.get_rank()
    if p >= 2 and r == 1:
        g.abort()
    else:
        torch.cuda._sleep(400_000_000)
        w = dist.all_reduce(x, group=g, async_op=True)
        if p == 1:
            g.abort()
        try:
            w.wait()
        except dist.DistBackendError:
            pass
        else:
            raise AssertionError("wait() returned for an all-reduce whose communicator was aborted")
    if p == 1 or r == 1:
        try:
            dist.all_reduce(torch.ones(4, device="cuda"), group=g)
        except RuntimeError:
            pass
        else:
            raise AssertionError("a call on the aborted group succeeded")
    torch.cuda.synchronize()
    calls += 1


def fsdp(variant, loss_group):
    """20 FSDP2 steps on GPU; the mean loss per step (averaged over ``loss_group``)."""
    group = dist.new_group(backend="strata" if variant == "strata" else "nccl")
    mesh = DeviceMesh.from_group(group, "cuda")
    torch.manual_seed(0)
    model = Net().cuda()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if variant == "hier":
        st.set_custom_comms(model, st.AllGather("hier"), st.ReduceScatter("hier"))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(20):
        x = torch.randint(0, 64, (4, 12), generator=g).cuda()
        y = torch.roll(x, 1, dims=1)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=loss_group)
        losses.append(total.item() / dist.get_world_size())
    return losses


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("cuda:strata,cpu:gloo")
    p, r = dist.get_world_size(), dist.get_rank()
    nccl_world = dist.new_group(backend="nccl")
    calls_equal(None, nccl_world, "world")
    if p >= 4:
        evens = list(range(0, p, 2))
        sg, ng = dist.new_group(evens, backend="strata"), dist.new_group(evens, backend="nccl")
        if r in evens:
            calls_equal(sg, ng, "evens")
    stream_order(None)
    cuda_semantics(None)
    requires_grad_broadcast(None)
    # The C++ backend runs the common CUDA calls directly (the rest from its Python half's plans).
    if st.FORM == "cpp":
        ran = st.served().get("cuda", 0) - st._SERVED.get("cuda", 0)
        if ran <= 0:
            raise AssertionError(f"the C++ backend ran no CUDA call itself: served {st.served()}")
    ref = fsdp("nccl", nccl_world)
    rows = []
    for variant in ("strata", "hier"):
        got = fsdp(variant, nccl_world)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        rows.append((variant, ref[-1], got[-1], worst))
        if worst > 1e-5:
            raise AssertionError(f"FSDP2 on GPU, {variant}: worst relative loss difference {worst:.3g} > 1e-5")
    if st.FORM == "cpp":  # ProcessGroup.abort() reaches the C++ backend's abort()
        print(f"rank {r}: FSDP2 done; the abort check next", flush=True)
        abort_raises()
    dist.barrier()
    if r == 0:
        print(f"{'fsdp variant':12} {'nccl20':>9} {'this20':>9} {'worst rel':>10}")
        for v, a, b, w in rows:
            print(f"{v:12} {a:9.5f} {b:9.5f} {w:10.2e}")
        if not PREMUL_FACTOR:
            print(f"PREMUL_SUM: torch {torch.__version__} gives no factor: refused with a clear error")
        if nccl_differs:
            print(f"torch's nccl differed from the exact reference on {len(nccl_differs)} of rank 0's calls: "
                  + ", ".join(nccl_differs))
        print(f"torch gpu check OK (world {p}, {calls} checks; {compared} calls equal to the exact reference, "
              f"nccl's equal to it on {compared - len(nccl_differs)}; strata as torch's {st.FORM})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
