"""strata as a ``torch.distributed`` backend.

``import strata.torch`` registers the backend ``"strata"`` (on torches that read the
``torch.distributed.backends`` entry points, installing the package is enough)::

    import torch.distributed as dist, strata.torch
    dist.init_process_group("strata")            # or "cpu:gloo,cuda:strata", ...

- One backend, in C++ (``csrc/torch_backend.cpp``, a ``c10d::Backend`` over the C ABI,
  built for the installed torch: :mod:`strata.torch.loader`), registered per device, so
  ``"cpu:gloo,cuda:strata"`` keeps gloo for CPU tensors and lookups by device (DTensor,
  functional collectives) find strata. It runs every call, on CPU and CUDA tensors,
  itself: the common ones directly, the rarer ones (bool / complex / bitwise reductions,
  uneven all-to-all, gather, scatter, reduce, send / recv, coalescing blocks) from a plan
  its Python half (:mod:`strata.torch.backend`) makes, on the same communicator, under
  the same lock. Where the C++ backend cannot be built (no C++ compiler or ninja), a
  Python form serves CPU tensors, with a warning at first use
  (``STRATA_TORCH_BACKEND=python`` forces it).
- CPU tensors run on strata's ``mpi`` transport: launch with ``mpirun`` (torch's rank
  must be the MPI world rank: ``RANK=$OMPI_COMM_WORLD_RANK``); importing this module
  under mpirun joins the MPI world (collective: import it on every rank). A group's mpi
  communicator is made when torch makes the group (every rank makes groups in the same
  order), so two groups never pair up whichever thread calls first.
- CUDA tensors run on strata's ``nccl`` transport (``rccl`` on ROCm torch), one
  communicator per GPU, made at its first call there through the group's own store under
  a key of the group and the device (ProcessGroupNCCL's way), under a scoped device
  guard. ProcessGroupNCCL's stream semantics: ``async_op=False`` enqueues on the current
  stream, ``async_op=True`` on the group's internal stream of the device after the
  current one; the Work is an end event (``wait()`` makes the current stream wait).
- Threads: any call may come from any thread. A communicator is driven by one thread at
  a time (its lock); the GIL is always taken before strata's locks, and a thread that
  holds the GIL never waits for one of them (it lets the GIL go to wait).
- Timeouts: ``work.wait(timeout)`` raises ``DistBackendError`` when the call has not
  finished by then (it keeps running); the group's timeout is enforced by a watchdog
  that aborts the communicator of a call that outlives it (the call raises, here and on
  the peers), as ProcessGroupNCCL's.
- FSDP2 custom collectives on strata's algorithms: :class:`AllGather`,
  :class:`ReduceScatter`, :func:`set_custom_comms` (:mod:`strata.torch.fsdp`).
- Reduce ops SUM, AVG (the exact mean), MAX, MIN, PRODUCT and PREMUL_SUM on the reducible
  dtypes; bool as ProcessGroupNCCL (SUM and MAX a logical or, PRODUCT and MIN a logical
  and); complex as real and imaginary parts (SUM, AVG, PREMUL_SUM); BAND / BOR / BXOR on
  integers and bool; data movement on any dtype. Anything else raises naming the method.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

import strata as _s

from . import loader as _loader
from . import world as _world
from . import backend  # noqa: F401  (strata.torch.backend: the Python half, for checks)
from .backend import _SERVED, BACKEND, BackendStrata, _Delegate, _premul_factor, python_backends  # noqa: F401
from .fsdp import AllGather, ReduceScatter, set_custom_comms
from .loader import _installed_cpp, cpp_module
from .world import group_topology, traffic

__all__ = ["BackendStrata", "FORM", "served", "BACKEND", "AllGather", "ReduceScatter", "set_custom_comms",
           "traffic", "group_topology", "cpp_module"]


def _form() -> str:
    """``STRATA_TORCH_BACKEND``: unset or ``cpp``: the C++ backend, unless it cannot be
    built here (then the Python form, with a warning at first use); ``python``: the
    Python form."""
    v = os.environ.get("STRATA_TORCH_BACKEND", "").strip().lower()
    if v in ("python", "backend"):
        return "backend"
    if v not in ("", "cpp"):
        raise ValueError(f"STRATA_TORCH_BACKEND={v!r}: expected cpp (the default) or python")
    if _installed_cpp() is not None:
        return "cpp"
    missing = _loader._cpp_toolchain_missing(True)
    return "backend" if missing else "cpp"


#: Which form serves torch here: ``"cpp"`` (the C++ backend) or ``"backend"`` (the
#: Python form, CPU tensors only: where the C++ backend cannot be built, or forced).
FORM = _form()
_WARNED = False


def served() -> dict:
    """How many calls strata's backend has served in this process, by device type
    (``{"cpu": n, "cuda": m}``): what shows which backend a mixed backend string routed
    a call to. The C++ backend's calls count under their device, and all of them under
    ``"cpp"`` as well (``"planned"``: those it ran from its Python half's plans)."""
    out = dict(_SERVED)
    m = _loader._CPP
    if m is not None:
        n, c = int(m.native_calls()), int(m.native_cuda_calls())
        out["cpu"] = out.get("cpu", 0) + n
        if c:
            out["cuda"] = out.get("cuda", 0) + c
        out["planned"] = int(m.planned_calls())
        out["cpp"] = n + c + out["planned"]
    return out


def _python_form_warning() -> None:
    global _WARNED
    if _WARNED:
        return
    _WARNED = True
    forced = os.environ.get("STRATA_TORCH_BACKEND", "").strip().lower() in ("python", "backend")
    why = ("STRATA_TORCH_BACKEND=python" if forced else
           f"the C++ backend cannot be built here: {_loader._cpp_toolchain_missing(True)}")
    warnings.warn(f"strata backend: the Python form serves torch ({why}): CPU tensors only, at several "
                  "times the C++ backend's host cost per call; install a C++ compiler and ninja and run "
                  "python -m strata.torch build", RuntimeWarning, stacklevel=3)


def _create(opts: Any, backend_options: Any) -> Any:
    """torch's creator of a group's backend: called by every member when torch makes
    the group, in the same order on every rank."""
    ranks = list(opts.global_ranks_in_group or []) or None
    args = (opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks, str(opts.group_id))
    if FORM == "cpp":
        _s._load()
        mod = cpp_module()
        mod.load(_s._lib_path)
        _world.cpp_lock = mod.comm_lock
        d = _Delegate(*args)
        cpu = d._cpu_handle()
        owned = bool(cpu) and not _world.is_world(cpu)
        return mod.new_backend(d, opts.group_rank, opts.group_size, _s._lib_path, cpu, owned,
                               int(opts.timeout.total_seconds() * 1000))
    if not python_backends():
        raise RuntimeError(f"strata backend: this torch ({torch.__version__}) takes no Python Backend "
                           "subclasses, and the C++ backend cannot be built here "
                           f"({_loader._cpp_toolchain_missing(True)})")
    _python_form_warning()
    return BackendStrata(*args)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])

# Under an MPI launcher, join the MPI world now: every rank imports this module at the
# same point. A failure (a library built without mpi) is reported when CPU tensors are
# first used.
if _world.mpi_env() is not None and os.environ.get("STRATA_TORCH_LAZY_MPI") != "1":
    try:
        _world.world_cpu()
    except _s.StrataError:
        pass
