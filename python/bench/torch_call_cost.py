"""Benchmark (not a test): the host cost of one small torch.distributed call on CPU tensors
through strata's backend against gloo's, in one process (issue 49; docs/python.md).

Under mpirun (``scripts/torch-call-cost``): the default group is strata's, in the form
``STRATA_TORCH_BACKEND`` picks (unset or ``cpp``: the C++ backend; ``python``: the Python one), and a
gloo group spans the same ranks. For each call, blocking ``all_reduce``, ``all_reduce``
with ``async_op=True`` and ``wait()``, and ``all_gather_into_tensor``, of 1 KiB
(``STRATA_CALL_BYTES``), ITERS calls per repetition after a warm-up, the backends
interleaved repetition by repetition; rank 0 prints the median microseconds per call of
each and strata's over gloo's.

``STRATA_CALL_DEVICE=cuda`` (on a GPU machine, under ``torchrun``, one process per GPU):
CUDA tensors, the default group ``"cuda:strata,cpu:gloo"`` against a ``nccl`` group of
the same ranks (ProcessGroupNCCL): the host time per call, each repetition started on an
idle GPU (the calls themselves are not waited for, as a training step does not); rank 0
also prints ``torch call cost: worst strata/nccl R (bar B: PASS|FAIL)`` against
``STRATA_CALL_BAR`` (1.5, issue 49).
"""

import os
import statistics
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29591")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata.torch  # noqa: E402  (registers the backend)

ITERS = int(os.environ.get("STRATA_CALL_ITERS", "2000"))
REPS = int(os.environ.get("STRATA_CALL_REPS", "5"))
BYTES = int(os.environ.get("STRATA_CALL_BYTES", "1024"))
CUDA = os.environ.get("STRATA_CALL_DEVICE", "cpu") == "cuda"
BAR = float(os.environ.get("STRATA_CALL_BAR", "1.5"))


def calls(group):
    n, p = BYTES // 4, dist.get_world_size()
    dev = "cuda" if CUDA else "cpu"
    x = torch.ones(n, device=dev)
    out = torch.empty(n * p, device=dev)

    def blocking():
        dist.all_reduce(x, group=group)

    def async_wait():
        dist.all_reduce(x, group=group, async_op=True).wait()

    def gather():
        dist.all_gather_into_tensor(out, x, group=group)
    return {"all_reduce": blocking, "all_reduce async+wait": async_wait, "all_gather_into_tensor": gather}


def per_call_us(f):
    dist.barrier()
    if CUDA:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(ITERS):
        f()
    return (time.perf_counter() - t) / ITERS * 1e6


def main():
    if CUDA:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cuda:strata,cpu:gloo")
        base = "nccl"
    else:
        dist.init_process_group("strata")
        base = "gloo"
    backends = {"strata": dist.group.WORLD, base: dist.new_group(backend=base)}
    table = {b: calls(g) for b, g in backends.items()}
    for fs in table.values():
        for f in fs.values():
            for _ in range(max(ITERS // 10, 10)):
                f()
    times = {(b, c): [] for b in table for c in table[b]}
    for _ in range(REPS):
        for c in table["strata"]:
            for b in table:
                times[(b, c)].append(per_call_us(table[b][c]))
    dist_rank, worst = dist.get_rank(), 0.0
    if dist_rank == 0:
        print(f"# {dist.get_world_size()} ranks, {BYTES} B, {'cuda' if CUDA else 'cpu'} tensors, {ITERS} calls x "
              f"{REPS} repetitions; strata as torch's {strata.torch.FORM}; median us per call")
        print(f"{'call':<26} {'strata':>9} {base:>9} {'strata/' + base:>12}")
        for c in table["strata"]:
            s, g = statistics.median(times[("strata", c)]), statistics.median(times[(base, c)])
            worst = max(worst, s / g)
            print(f"{c:<26} {s:>9.1f} {g:>9.1f} {s / g:>12.2f}")
        if CUDA:
            print(f"torch call cost: worst strata/nccl {worst:.2f} (bar {BAR}: {'PASS' if worst <= BAR else 'FAIL'}); "
                  f"served {strata.torch.served()}")
    dist.barrier()
    dist.destroy_process_group()
    if CUDA and dist_rank == 0 and worst > BAR:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
