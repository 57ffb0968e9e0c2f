"""The MPI world of CPU tensors, the locks of shared communicators, and a group's topology.

- CPU tensors run on strata's ``mpi`` transport. Joining its world is collective over
  the MPI world, so it happens when ``strata.torch`` is imported under an MPI launcher
  (every rank imports it at the same point), or at first use otherwise.
- A communicator is driven by one thread at a time (the C ABI's rule). The world's is
  shared by the default group's backend and by the Python operations made on it here
  (making a group's communicator, traffic readings), so both take the same lock:
  :func:`comm_lock`, the C++ backend's where it serves the process (a thread holding the
  GIL only tries that lock and lets the GIL go to wait for it), else a Python lock.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator, Optional, Sequence

import torch.distributed as dist

import strata as _s

_WORLD: dict = {}
_LOCK = threading.Lock()
_PY_LOCKS: dict = {}

#: Set by the package when the C++ backend serves this process: its ``comm_lock``.
cpp_lock: Optional[Any] = None


@contextmanager
def comm_lock(comm: _s.Comm) -> Iterator[None]:
    """Hold ``comm``'s call lock (the one every backend call on it takes) for a Python
    operation on it."""
    if cpp_lock is not None:
        with cpp_lock(comm.handle):
            yield
        return
    with _LOCK:
        lock = _PY_LOCKS.setdefault(comm.handle, threading.Lock())
    with lock:
        yield


def mpi_env() -> Optional[tuple]:
    """(rank, size) from the MPI launcher's environment, if launched by one."""
    for r, n in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ and n in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    return None


def world_cpu(size: Optional[int] = None) -> _s.Comm:
    """The process's mpi world communicator (made at import under mpirun, else at
    first use: collective over the MPI world)."""
    with _LOCK:
        if "cpu" not in _WORLD:
            env = mpi_env()
            if env is None:
                raise RuntimeError("strata backend: CPU tensors run on the mpi transport: "
                                   "launch with mpirun -np <ranks> python <script>, or give CPU tensors to "
                                   "gloo: backend=\"cpu:gloo,cuda:strata\" (OMPI_COMM_WORLD_RANK not set)")
            rank, n = env
            if size is not None and size != n:
                raise RuntimeError(f"strata backend: torch's world has {size} ranks, the MPI "
                                   f"world {n}")
            _WORLD["cpu"] = _s.init_rank(n, _s.get_unique_id("mpi"), rank, transport="mpi")
        return _WORLD["cpu"]


def is_world(handle: int) -> bool:
    w = _WORLD.get("cpu")
    return w is not None and w.handle == handle


def drop_world(handle: int) -> None:
    """Forget the world communicator ``handle`` (aborted with the default group)."""
    with _LOCK:
        w = _WORLD.get("cpu")
        if w is not None and w.handle == handle:
            del _WORLD["cpu"]


def group_cpu(size: int, ranks: Optional[Sequence[int]], rank: int, method: str) -> _s.Comm:
    """The mpi communicator of a torch group: the world for the default group, else
    one of the members alone (``Comm.create_group``). Made when torch makes the group,
    on every member in the order torch requires of ``new_group``, so two groups never
    pair up whichever thread calls first."""
    world = world_cpu(size if ranks is None else None)
    if ranks is None:
        comm = world
    else:
        with comm_lock(world):
            comm = world.create_group(list(ranks))
    if comm.rank != rank or comm.size != size:
        raise RuntimeError(f"strata backend: {method}: strata rank {comm.rank}/{comm.size} is not "
                           f"torch's {rank}/{size}: torch's ranks must be the MPI world ranks "
                           "(RANK=$OMPI_COMM_WORLD_RANK)")
    return comm


def default_timeout() -> timedelta:
    """``STRATA_TIMEOUT`` seconds, else torch's default process-group timeout."""
    v = os.environ.get("STRATA_TIMEOUT", "").strip()
    try:
        if v and float(v) > 0:
            return timedelta(seconds=float(v))
    except ValueError:
        pass
    return dist.default_pg_timeout


def traffic() -> dict:
    """The bytes strata's CPU communicators (backend ``strata`` groups and the custom
    comms alike) sent since the MPI world was joined, summed over every rank, by link
    class of the world topology (``STRATA_TOPOLOGY`` or detection): ``intra_package``,
    ``intra_node``, ``inter_node``, ``max_node_egress`` (the most bytes out of one node),
    ``measured`` (False on mpi: the sends strata's own algorithms issued). Collective
    over the world: call it on every rank at the same point, after waiting for the works
    to count; subtract two readings for what ran in between (``Comm.traffic``)."""
    world = world_cpu(dist.get_world_size() if dist.is_initialized() else None)
    with comm_lock(world):
        return world.traffic(all_members=True)


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


