"""The errors a new user meets first, as the Python package words them (docs/errors.md):
each names the next step in pip / Python terms, not cargo's. Each test fails if its
message loses the fix."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import strata

PYTHON_DIR = str(Path(__file__).resolve().parent.parent)
NCCL_MSG = ("strataGetUniqueIdForTransport: not compiled: the nccl transport needs the `cuda` "
            "feature (cargo build --features cuda)")


def test_not_compiled_from_the_bundled_library_names_the_pip_reinstall():
    bundled = str(Path(strata.__file__).resolve().parent / "libstrata.cpython-311-x86_64-linux-gnu.so")
    m = strata._not_compiled_step(NCCL_MSG, bundled, frozenset({"mpi"}), False)
    assert "STRATA_FEATURES=mpi,cuda pip install --force-reinstall ./python" in m, m
    assert "cargo" not in m, m
    assert "strata.features(): mpi" in m, m
    mpi = NCCL_MSG.replace("nccl transport", "mpi transport").replace("cuda", "mpi")
    m = strata._not_compiled_step(mpi, bundled, frozenset({"cuda"}), False)
    assert "STRATA_FEATURES=mpi,cuda pip install --force-reinstall ./python" in m, m
    assert "apt install libopenmpi-dev" in m, m


def test_not_compiled_from_strata_lib_says_unset_or_rebuild():
    m = strata._not_compiled_step(NCCL_MSG, "/x/target/debug/libstrata.so", frozenset(), True)
    assert "unset STRATA_LIB" in m, m
    assert "`cargo build --release --features cuda`" in m, m
    assert "(cargo build --features cuda)" not in m, m


def test_not_compiled_from_a_checkout_build_names_pip_install():
    m = strata._not_compiled_step(NCCL_MSG, "/x/target/release/libstrata.so", frozenset({"mpi"}), False)
    assert "`pip install ./python`" in m, m
    assert "`cargo build --release --features mpi,cuda`" in m, m


def test_other_messages_are_left_alone():
    m = "strataCommInitRank: invalid argument: rank 9 out of range"
    assert strata._not_compiled_step(m, "/x/libstrata.so", frozenset(), True) == m


def test_a_missing_transport_raises_the_python_step():
    """Through the library: the nccl id of a library built without cuda (the debug
    library of scripts/capi-test, through STRATA_LIB)."""
    if "cuda" in strata.features():
        pytest.skip("this library has the cuda feature")
    with pytest.raises(strata.StrataError) as e:
        strata.get_unique_id("nccl")
    assert e.value.code == strata.INVALID_USAGE
    m = e.value.message
    assert "the nccl transport needs the `cuda` feature" in m, m
    assert "(cargo build --features cuda)" not in m, m
    assert "pip install" in m or "unset STRATA_LIB" in m, m


def test_topology_of_another_size_names_both_fixes():
    with pytest.raises(strata.StrataError) as e:
        strata.init_local(4, topology="nodes:2x3")
    assert e.value.code == strata.INVALID_USAGE
    assert "give a topology of 4 ranks (e.g. nodes:1x4) or start 6 ranks" in e.value.message


def _load_in_child(env_lib, patch_candidates=False):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("STRATA_LIB", None)
    if env_lib:
        env["STRATA_LIB"] = env_lib
    code = "import strata\n"
    if patch_candidates:
        code += "strata._candidates = lambda: ['/nonexistent/libstrata.so']\n"
    code += ("try:\n    strata.version()\nexcept strata.LibraryNotFound as e:\n    print(e)\n"
             "else:\n    print('loaded')\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60).stdout


def test_library_not_found_names_pip_install():
    out = _load_in_child(None, patch_candidates=True)
    assert "cannot load the strata shared library" in out, out
    assert "`pip install ./python`" in out and "STRATA_LIB" in out, out


def test_library_not_found_through_strata_lib_says_fix_or_unset():
    out = _load_in_child("/nonexistent/libstrata.so")
    assert "/nonexistent/libstrata.so (no such file)" in out, out
    assert "unset it" in out and "cargo build --release" in out, out


def test_torch_cpu_tensors_without_mpirun_name_the_launch(monkeypatch):
    pytest.importorskip("torch")
    from strata.torch import world
    for k in list(os.environ):
        if k.startswith(("OMPI_", "PMIX_", "PMI_")):
            monkeypatch.delenv(k)
    monkeypatch.setattr(world, "_WORLD", {})
    with pytest.raises(RuntimeError) as e:
        world.world_cpu()
    assert "mpirun -np <ranks> python <script>" in str(e.value), e.value
    assert "cpu:gloo,cuda:strata" in str(e.value), e.value


def test_torch_cpp_backend_without_a_compiler_names_the_install(monkeypatch):
    pytest.importorskip("torch")
    from strata.torch import loader
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    missing = loader._cpp_toolchain_missing(True) or ""
    assert "install g++ 10 or later, or set CXX" in missing, missing
