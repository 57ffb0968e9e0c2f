"""``init_process_group("strata")`` with no ``import strata.torch``: torch (2.15 and
later, pytorch PR 187388) finds the backend through the ``torch.distributed.backends``
entry point of the installed package (``python/pyproject.toml`` ->
``strata.torch.entry:register``). Run it under mpirun with an installed strata (not the
source tree: the entry point is package metadata), e.g.::

    mpirun -np 2 python python/tests/torch_entry_point_check.py

Rank 0 prints ``torch entry point check: OK`` (or, on a torch that does not read the
group, says so and exits 0); any failure raises.
"""

import os
import sys

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29541")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

from importlib.metadata import entry_points  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert "strata.torch" not in sys.modules, "strata.torch was imported before init_process_group"
eps = [ep for ep in entry_points(group="torch.distributed.backends") if ep.name == "strata"]
assert len(eps) == 1 and eps[0].value == "strata.torch.entry:register", eps
if not hasattr(dist.Backend, "_ensure_backend_registered"):
    if rank == 0:
        print(f"torch entry point check: torch {torch.__version__} does not read the "
              "torch.distributed.backends group (import strata.torch first there)")
    sys.exit(0)

dist.init_process_group("strata")
assert "strata.torch" in sys.modules, "the backend came from somewhere else than strata.torch"
assert dist.get_backend() == "strata", dist.get_backend()
t = torch.arange(6, dtype=torch.float32) + rank
dist.all_reduce(t)
want = torch.arange(6, dtype=torch.float32) * world + sum(range(world))
assert torch.equal(t, want), (t, want)
dist.destroy_process_group()
if rank == 0:
    print(f"torch entry point check: OK (torch {torch.__version__}, {world} ranks, "
          "init_process_group('strata') without import strata.torch)")
