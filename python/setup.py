"""Builds the strata shared library from the Rust crate one directory up and bundles it
in the package (setuptools-rust), so ``pip install ./python`` gives an ``import strata``
that needs no ``STRATA_LIB``.

``STRATA_FEATURES`` picks the cargo features (comma-separated, e.g. ``mpi,cuda``); the
default ``auto`` adds ``mpi`` when OpenMPI's headers are installed (the torch backend's
CPU tensors need it) and nothing else.

The C++ torch backend (``strata/csrc/torch_backend.cpp``) is built here too when torch
can be imported by this build, that is with ``pip install --no-build-isolation`` into an
environment that has torch (its C++ ABI is the installed torch's, so it is built against
that one): the module ``strata._torch_cpp_<torch version>``, which ``strata.torch`` loads
when the running torch is that version (else it builds one at first use, as without
it). ``STRATA_TORCH_BUILD``: ``auto`` (the default) builds it when torch is there,
``1`` requires it (the install fails without torch), ``0`` never builds it.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools_rust import Binding, RustExtension


def features():
    v = os.environ.get("STRATA_FEATURES", "auto")
    if v != "auto":
        return [f for f in v.split(",") if f]
    heads = ["/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h", "/usr/include/mpi.h",
             "/usr/lib/aarch64-linux-gnu/openmpi/include/mpi.h"]
    return ["mpi"] if any(Path(h).exists() for h in heads) else []


def torch_tag(version):
    """The module-name tag of a torch version (``strata.torch`` computes the same)."""
    return "".join(c if c.isalnum() else "_" for c in version)


def torch_backend():
    """The C++ torch backend's extension and build command, or none (``STRATA_TORCH_BUILD``)."""
    want = os.environ.get("STRATA_TORCH_BUILD", "auto").strip().lower()
    if want not in ("auto", "1", "0"):
        sys.exit(f"STRATA_TORCH_BUILD={want!r}: expected auto, 1 or 0")
    if want == "0":
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        if want == "1":
            sys.exit("STRATA_TORCH_BUILD=1: torch cannot be imported by this build; install torch "
                     "first and run pip with --no-build-isolation")
        print("strata: torch is not importable here, so the C++ torch backend is not built now "
              "(strata.torch builds it at first use; pip install --no-build-isolation builds it "
              "at install)", file=sys.stderr)
        return [], {}
    ext = cpp_extension.CppExtension(
        f"strata._torch_cpp_{torch_tag(torch.__version__)}",
        ["strata/csrc/torch_backend.cpp"],
        # No debug info (Python's CFLAGS carry -g): a 0.5 MB module, not 13, built in a
        # third less time.
        extra_compile_args=["-O2", "-g0"],
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension}


def drop_stale_builds(keep):
    """Remove the C++ backends an earlier build left in ``build/`` (another torch's, or any
    when this build makes none, ``keep`` empty): setuptools packages what is there, so an
    install for one torch would otherwise also ship the module built for the last."""
    for old in (Path(__file__).resolve().parent / "build").glob("lib*/strata/_torch_cpp_*"):
        if not keep or not old.name.startswith(keep + "."):
            old.unlink()


exts, cmds = torch_backend()
drop_stale_builds(exts[0].name.rsplit(".", 1)[1] if exts else "")
setup(
    rust_extensions=[
        RustExtension(
            "strata.libstrata",
            path=str(Path(__file__).resolve().parent.parent / "Cargo.toml"),
            binding=Binding.NoBinding,
            features=features(),
        )
    ],
    ext_modules=exts,
    cmdclass=cmds,
    zip_safe=False,
)
