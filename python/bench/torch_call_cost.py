"""Benchmark (not a test): the host cost of one small torch.distributed call on CPU tensors
through strata's backend against gloo's, in one process (issue 49; docs/python.md).

Under mpirun (``scripts/torch-call-cost``): the default group is strata's, in the form
``STRATA_TORCH_BACKEND`` picks (unset or ``cpp``: the C++ backend; ``python``: the Python one), and a
gloo group spans the same ranks. For each call, blocking ``all_reduce``, ``all_reduce``
with ``async_op=True`` and ``wait()``, and ``all_gather_into_tensor``, of 1 KiB
(``STRATA_CALL_BYTES``), ITERS calls per repetition after a warm-up, the backends
interleaved repetition by repetition; rank 0 prints the median microseconds per call of
each and strata's over gloo's.
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


def calls(group):
    n, p = BYTES // 4, dist.get_world_size()
    x = torch.ones(n)
    out = torch.empty(n * p)

    def blocking():
        dist.all_reduce(x, group=group)

    def async_wait():
        dist.all_reduce(x, group=group, async_op=True).wait()

    def gather():
        dist.all_gather_into_tensor(out, x, group=group)
    return {"all_reduce": blocking, "all_reduce async+wait": async_wait, "all_gather_into_tensor": gather}


def per_call_us(f):
    dist.barrier()
    t = time.perf_counter()
    for _ in range(ITERS):
        f()
    return (time.perf_counter() - t) / ITERS * 1e6


def main():
    dist.init_process_group("strata")
    backends = {"strata": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
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
    if dist.get_rank() == 0:
        print(f"# {dist.get_world_size()} ranks, {BYTES} B, {ITERS} calls x {REPS} repetitions; strata as torch's "
              f"{strata.torch.FORM}; median us per call")
        print(f"{'call':<26} {'strata':>9} {'gloo':>9} {'strata/gloo':>12}")
        for c in table["strata"]:
            s, g = statistics.median(times[("strata", c)]), statistics.median(times[("gloo", c)])
            print(f"{c:<26} {s:>9.1f} {g:>9.1f} {s / g:>12.2f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
