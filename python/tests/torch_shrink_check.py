"""``torch.distributed.shrink_group`` over backend ``strata`` (torch 2.15), under mpirun
at 3 ranks (CPU tensors, strata's mpi transport)::

    mpirun -np 3 python3 python/tests/torch_shrink_check.py

Every rank runs an all-reduce on the world; then rank 2 stops taking part (it waits,
out of every group call, until the others are done), and ranks 0 and 1 shrink the
default group without it: the new default group has 2 ranks, and its all-reduce,
all_gather_into_tensor and a sub-group made from it are right. Rank 0 prints
``torch shrink check: OK``; any difference raises.
"""

import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29541")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata.torch  # noqa: E402,F401  (registers the backend)

dist.init_process_group("strata", timeout=timedelta(seconds=30))
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 3, "run at 3 ranks"
store = dist.distributed_c10d._get_default_store()
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((5,), 6.0)), t
if rank == 2:
    # The lost rank: out of every group call from here on.
    store.wait(["shrunk-done"], timedelta(seconds=60))
else:
    g = dist.shrink_group([2])
    assert dist.get_world_size() == 2 and dist.get_rank() == rank, (dist.get_world_size(), dist.get_rank())
    assert g.size() == 2
    t = torch.arange(7, dtype=torch.float64) + rank
    dist.all_reduce(t)
    assert torch.equal(t, 2 * torch.arange(7, dtype=torch.float64) + 1), t
    out = torch.empty(6, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.full((3,), rank, dtype=torch.int32))
    assert out.tolist() == [0, 0, 0, 1, 1, 1], out
    sub = dist.new_group([0, 1])
    u = torch.ones(4)
    dist.all_reduce(u, group=sub)
    assert torch.equal(u, torch.full((4,), 2.0)), u
    dist.barrier()
    if rank == 0:
        store.set("shrunk-done", "1")
        print("torch shrink check: OK (3 ranks, rank 2 excluded by shrink_group; all-reduce, "
              "all_gather_into_tensor and a new group on the 2 survivors)")
dist.destroy_process_group()
