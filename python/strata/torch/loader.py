"""Finding, building and loading the C++ backend (``csrc/torch_backend.cpp``).

A C++ extension must be built against the installed torch (same version, same C++ ABI),
so it is built on the user's machine: by ``pip install --no-build-isolation ./python``
into an environment with torch (``strata._torch_cpp_<torch version>``), else at first use
with ``torch.utils.cpp_extension`` (a C++20 compiler and ninja) into
``$STRATA_TORCH_EXT_DIR`` (default ``~/.cache/strata``), once per torch version, or ahead
with ``python -m strata.torch build``.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

import torch

import strata as _s

_CPP: Any = None
_LOCK = threading.Lock()


class ToolchainMissing(RuntimeError):
    """The C++ backend cannot be built here (no compiler, or no ninja)."""


def _include_dir() -> str:
    """The directory of ``strata.h`` (the generated header the C++ backend includes)."""
    f = getattr(_s, "include_dir", None)
    if f is not None:
        return f()
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))), "include")


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
            _ninja_on_path()
            tag = _torch_tag()
            build = os.path.join(os.environ.get("STRATA_TORCH_EXT_DIR") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata"), f"torch-{tag}")
            os.makedirs(build, exist_ok=True)
            _clear_stale_lock(build)
            src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc",
                               "torch_backend.cpp")
            name = f"strata_torch_{tag}"
            missing = _cpp_toolchain_missing(not os.path.exists(os.path.join(build, name + ".so")))
            if missing:
                raise ToolchainMissing(f"strata backend: the C++ backend for torch {torch.__version__} cannot "
                                       f"be built here: {missing}")
            try:
                _CPP = cpp_extension.load(name=name, sources=[src], build_directory=build,
                                          extra_cflags=["-O2"], extra_include_paths=[_include_dir()],
                                          verbose=False)
            except Exception as e:
                raise RuntimeError(f"strata backend: building the C++ backend for torch {torch.__version__} "
                                   f"failed (it needs a C++20 compiler and ninja: pip install ninja): {e}") from e
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


def _ninja_on_path() -> None:
    """The ninja wheel's binary on PATH, where the environment's bin is not (mpirun)."""
    try:
        import ninja  # type: ignore[import-not-found]
    except ImportError:
        return
    d = getattr(ninja, "BIN_DIR", None)
    if d and d not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")


def _cpp_toolchain_missing(need_compiler: bool) -> Optional[str]:
    """What the C++ backend's build lacks here (``None``: nothing): ninja (which torch
    runs even to find a build up to date), and, with ``need_compiler``, the C++
    compiler torch would call (``$CXX``, else ``c++``)."""
    import shutil
    from torch.utils import cpp_extension
    _ninja_on_path()
    lacks = []
    if not cpp_extension.is_ninja_available():
        lacks.append("ninja is not installed (pip install ninja)")
    cxx = os.environ.get("CXX", "c++")
    if need_compiler and shutil.which(cxx.split()[0] if cxx.strip() else "c++") is None:
        lacks.append(f"no C++ compiler ({cxx!r} is not on PATH; install g++ 10 or later, or set CXX)")
    return "; ".join(lacks) or None
