"""``python -m strata.torch build``: build the C++ backend for the installed torch."""

import sys

import torch

from .loader import _installed_cpp, cpp_module

if sys.argv[1:] != ["build"]:
    sys.exit("usage: python -m strata.torch build   (builds the C++ backend for this torch)")
m = cpp_module()
how = "installed with the package" if _installed_cpp() is m else "built"
print(f"strata: the C++ torch backend is {how} for torch {torch.__version__}: {m.__file__}")
