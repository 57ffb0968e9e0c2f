"""torch's entry point for the backend ``"strata"`` (``python/pyproject.toml``, group
``torch.distributed.backends``).

torch 2.15 and later (pytorch PR 187388) look a backend name they do not know up in that
group (``Backend._ensure_backend_registered``: the entry point named like the backend, case
aside), ``load()`` it, require a callable, call it with no arguments and then require
the backend registered (``dist.Backend.register_backend``), else ``init_process_group``
fails. So ``init_process_group("strata")`` (or ``"cpu:gloo,cuda:strata"``) works without
``import strata.torch``. Older torch never reads the group: import ``strata.torch`` there.

Loading this module imports its package, ``strata.torch``, which registers the backend;
:func:`register` is then what torch calls.
"""

import strata.torch as _backend


def register() -> None:
    """Registers the torch.distributed backend ``"strata"`` (done by importing
    ``strata.torch``; idempotent: a second call registers nothing again)."""
    import torch.distributed as dist

    plugins = getattr(dist.Backend, "_plugins", None)  # torch's table of registered backends
    if plugins is not None and _backend.BACKEND.upper() not in plugins:
        raise RuntimeError(f"importing strata.torch did not register the backend {_backend.BACKEND!r}")
