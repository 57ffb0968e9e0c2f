"""Builds the strata shared library from the Rust crate one directory up and bundles it
in the package (setuptools-rust), so ``pip install ./python`` gives an ``import strata``
that needs no ``STRATA_LIB``.

``STRATA_FEATURES`` picks the cargo features (comma-separated, e.g. ``mpi,cuda``); the
default ``auto`` adds ``mpi`` when OpenMPI's headers are installed (the torch backend's
CPU tensors need it) and nothing else.
"""

import os
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


setup(
    rust_extensions=[
        RustExtension(
            "strata.libstrata",
            path=str(Path(__file__).resolve().parent.parent / "Cargo.toml"),
            binding=Binding.NoBinding,
            features=features(),
        )
    ],
    zip_safe=False,
)
