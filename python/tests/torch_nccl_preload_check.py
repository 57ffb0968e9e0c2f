"""torch's own ``nccl`` backend with libstrata_nccl.so preloaded (issue 67, "Checks with
a GPU"; docs/nccl.md): for a machine with GPUs, under torchrun (one process per GPU)::

    torchrun --standalone --nproc_per_node=N python/tests/torch_nccl_preload_check.py
    STRATA_NCCL_PRELOAD_EXPECT=1 LD_PRELOAD=/path/to/libstrata_nccl.so \\
        torchrun --standalone --nproc_per_node=N python/tests/torch_nccl_preload_check.py

scripts/gpu-all (check ``torch-nccl-preload``) runs both and requires the two runs to
print the same digest. Nothing of strata's Python package is used: plain torch.

- ``/proc/self/maps``: with ``STRATA_NCCL_PRELOAD_EXPECT=1`` every rank must have
  ``libstrata_nccl.so`` mapped, and without it none may; the libnccl objects mapped are
  printed (the front, and the real library torch's wheel loaded).
- On CUDA tensors of 1003 elements, inputs seeded by rank (small integers, exact in
  every dtype): ``all_reduce`` with SUM, PRODUCT, MAX, MIN (float32, float64, float16,
  bfloat16, int32, int64, int8, uint8), AVG and PREMUL_SUM (``_make_nccl_premul_sum(2.0)``,
  the floats); ``reduce`` to rank 0; ``all_gather_into_tensor``; ``reduce_scatter_tensor``
  (SUM, AVG); ``broadcast`` from the last rank; ``all_to_all_single``; four
  ``all_gather_into_tensor`` coalesced (``dist._coalescing_manager``, else a loop); a
  ring of ``batch_isend_irecv`` with 2 ranks or more; an async all-reduce and its
  ``wait()``. Each result is held to a host reference computed from every rank's inputs
  (float64, rounded once to the dtype; AVG and PREMUL_SUM within 1e-2). Where torch's
  nccl itself differs from the reference on PREMUL_SUM (torch 2.11's nccl gave zeros for
  a one-rank bf16 PREMUL_SUM, python/tests/torch_gpu_check.py) a note is printed, not a
  failure: the digest comparison then says whether the front changed anything.
- Rank 0 prints ``torch nccl preload check OK: ... digest D`` where D hashes every
  result of every rank (gathered to rank 0), so the run with the front and the run
  without it must print the same D.

``STRATA_NCCL_PRELOAD_GLOO=1`` runs the same on CPU tensors over gloo (AVG, PREMUL_SUM,
int8/uint8 reductions and the coalescing manager left out: gloo has none of them): a
self-test of this script where there is no GPU.
"""

import hashlib
import os
import sys

import torch
import torch.distributed as dist

R = dist.ReduceOp
N = 1003
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]


def mapped():
    """The libnccl and libstrata_nccl objects mapped into this process."""
    objs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if name.startswith("libnccl") or name.startswith("libstrata_nccl"):
                objs.add(path)
    return sorted(objs)


def gen(rank, dtype, op=None, n=N, dev=None):
    """Rank `rank`'s input: 1 + (rank + i) % 3; for PRODUCT one factor above 1 per
    element (rank i % world); for AVG the same on every rank."""
    i = torch.arange(n, dtype=torch.int64)
    ws = dist.get_world_size()
    if op == R.PRODUCT:
        v = torch.where(i % ws == rank, 1 + i % 3, torch.ones_like(i))
    elif op == R.AVG:
        v = 1 + i % 3
    else:
        v = 1 + (rank + i) % 3
    return v.to(torch.float64).to(dtype).to(dev or ("cpu" if GLOO else f"cuda:{torch.cuda.current_device()}"))


def reduce_ref(dtype, op, n=N, scale=None):
    ws = dist.get_world_size()
    xs = [gen(r, torch.float64, op, n, "cpu") for r in range(ws)]
    if op == R.PRODUCT:
        out = torch.ones(n, dtype=torch.float64)
        for x in xs:
            out *= x
    elif op == R.MAX:
        out = torch.stack(xs).max(0).values
    elif op == R.MIN:
        out = torch.stack(xs).min(0).values
    else:
        out = sum(xs)
        if op == R.AVG:
            out = out / ws
        if scale is not None:
            out = out * scale
    return out.to(dtype)


results = []  # every result, in call order (hashed on rank 0 over every rank)
checked = 0
notes = []


def hold(name, got, want, approx=False, premul=False):
    global checked
    got_c = got.cpu()
    ok = torch.allclose(got_c.double(), want.double(), rtol=1e-2, atol=0) if approx else torch.equal(got_c, want)
    if not ok:
        bad = (got_c.double() - want.double()).abs().argmax().item()
        msg = f"{name}: rank {dist.get_rank()}: element {bad} is {got_c[bad].item()}, want {want[bad].item()}"
        if premul:
            notes.append(msg)
        else:
            raise AssertionError(msg)
    else:
        checked += 1
    results.append(got_c.contiguous())


GLOO = os.environ.get("STRATA_NCCL_PRELOAD_GLOO") == "1"


def main():
    expect = os.environ.get("STRATA_NCCL_PRELOAD_EXPECT") == "1"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if GLOO:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    rank, ws = dist.get_rank(), dist.get_world_size()
    objs = mapped()
    front = [o for o in objs if "libstrata_nccl" in os.path.basename(o)]
    real = [o for o in objs if os.path.basename(o).startswith("libnccl")]
    if expect and not front:
        raise AssertionError(f"rank {rank}: libstrata_nccl.so is not mapped (LD_PRELOAD={os.environ.get('LD_PRELOAD')}): {objs}")
    if not expect and front:
        raise AssertionError(f"rank {rank}: libstrata_nccl.so is mapped without STRATA_NCCL_PRELOAD_EXPECT=1: {objs}")
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL {'-' if GLOO else torch.cuda.nccl.version()}, {ws} rank(s); "
              f"front: {front[0] if front else 'not loaded'}; real: {', '.join(real) or 'none mapped'}", flush=True)

    # all_reduce: every op, every dtype.
    for dt in FLOATS + (INTS[:2] if GLOO else INTS):
        ops = [R.SUM, R.PRODUCT, R.MAX, R.MIN] + ([R.AVG] if dt in FLOATS and not GLOO else [])
        for op in ops:
            x = gen(rank, dt, op)
            dist.all_reduce(x, op=op)
            hold(f"all_reduce {op} {dt}", x, reduce_ref(dt, op), approx=op == R.AVG and dt in FLOATS)
        if dt in FLOATS and not GLOO:
            x = gen(rank, dt)
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
            hold(f"all_reduce premul_sum(2.0) {dt}", x, reduce_ref(dt, R.SUM, scale=2.0), approx=True, premul=True)
    for dt in [torch.float32, torch.bfloat16, torch.int32]:
        # reduce to rank 0 (the other ranks' tensors are undefined after it)
        x = gen(rank, dt)
        dist.reduce(x, dst=0, op=R.SUM)
        if rank == 0:
            hold(f"reduce {dt}", x, reduce_ref(dt, R.SUM))
        # all_gather_into_tensor
        out = torch.full((ws * N,), -1, dtype=dt, device=dev)
        dist.all_gather_into_tensor(out, gen(rank, dt))
        hold(f"all_gather_into_tensor {dt}", out, torch.cat([gen(r, dt, dev="cpu") for r in range(ws)]))
        # reduce_scatter_tensor (SUM, and AVG on floats)
        for op in [R.SUM] + ([R.AVG] if dt.is_floating_point and not GLOO else []):
            inp = gen(rank, dt, op, n=ws * N)
            out = torch.full((N,), -1, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(out, inp, op=op)
            want = reduce_ref(dt, op, n=ws * N)[rank * N:(rank + 1) * N]
            hold(f"reduce_scatter_tensor {op} {dt}", out, want, approx=op == R.AVG)
        # broadcast from the last rank
        x = gen(rank, dt)
        dist.broadcast(x, src=ws - 1)
        hold(f"broadcast {dt}", x, gen(ws - 1, dt, dev="cpu"))
        # all_to_all_single
        inp = gen(rank, dt, n=ws * N)
        out = torch.full((ws * N,), -1, dtype=dt, device=dev)
        dist.all_to_all_single(out, inp)
        want = torch.cat([gen(r, dt, n=ws * N, dev="cpu")[rank * N:(rank + 1) * N] for r in range(ws)])
        hold(f"all_to_all_single {dt}", out, want)

    # Four all-gathers coalesced.
    outs = [torch.full((ws * N,), -1, dtype=torch.float32, device=dev) for _ in range(4)]
    ins = [gen(rank, torch.float32) * (k + 1) for k in range(4)]
    cm = None if GLOO else getattr(dist, "_coalescing_manager", None)
    if cm is not None:
        with cm(device=dev):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        how = "_coalescing_manager"
    else:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
        how = "a loop"
    for k, o in enumerate(outs):
        hold(f"coalesced all_gather {k}", o, torch.cat([gen(r, torch.float32, dev="cpu") * (k + 1) for r in range(ws)]))

    # A ring of send/recv (torch refuses a send to oneself).
    if ws >= 2:
        x = gen(rank, torch.float32)
        y = torch.full((N,), -1, dtype=torch.float32, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % ws),
                                       dist.P2POp(dist.irecv, y, (rank - 1) % ws)])
        for q in reqs:
            q.wait()
        hold("batch_isend_irecv ring", y, gen((rank - 1) % ws, torch.float32, dev="cpu"))

    # An async all-reduce and its wait.
    x = gen(rank, torch.float16)
    dist.all_reduce(x, async_op=True).wait()
    hold("async all_reduce", x, reduce_ref(torch.float16, R.SUM))
    if not GLOO:
        torch.cuda.synchronize()

    # The digest over every rank's results (rank 0's view).
    h = hashlib.sha256()
    for t in results:
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    mine = h.hexdigest()
    every = [None] * ws
    dist.all_gather_object(every, (mine, checked, notes))
    if rank == 0:
        d = hashlib.sha256("".join(e[0] for e in every).encode()).hexdigest()[:16]
        n = sum(e[1] for e in every)
        for e in every:
            for note in e[2]:
                print(f"note: torch's nccl differs from the reference: {note}")
        print(f"torch nccl preload check OK: {n} results exact over {ws} rank(s) (coalesced by {how}); "
              f"front {'loaded' if front else 'not loaded'}; digest {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
