"""strata for Python: a ctypes package over the C ABI (``include/strata.h``).

Quick start (an in-process world of 8 ranks on 2 nodes of 4, driven from threads)::

    import numpy as np, strata
    from concurrent.futures import ThreadPoolExecutor

    comms = strata.init_local(8, "nodes:2x4")
    def rank(comm):
        send = np.full(4, comm.rank, dtype=np.float32)
        recv = np.empty(4 * comm.size, dtype=np.float32)
        comm.all_gather(send, recv)          # blocks until recv holds the result
        return recv
    with ThreadPoolExecutor(len(comms)) as pool:
        results = list(pool.map(rank, comms))
    for c in comms:
        c.destroy()

Semantics are the C ABI's (NCCL's):

- Transports: ``local`` (threads of this process) and ``mpi`` move host memory; the GPU
  transports ``nccl``, ``rccl`` (one rank per GPU, as NCCL; library built with
  ``--features cuda`` / ``rocm``) and ``cuda-local`` (every rank a thread on one GPU,
  ``init_local(n, transport="cuda-local")``) move device memory. ``Comm.transport`` says
  which; ``get_unique_id("nccl")`` makes the 256-byte id that carries the NCCL id
  (broadcast it to every process, then ``init_rank(n, uid, rank, transport="nccl")``).
- Buffers on host transports: numpy arrays (or any object exposing
  ``__array_interface__``) and objects with ``data_ptr()`` (PyTorch CPU tensors),
  C-contiguous, in host memory; device memory is refused with a ``StrataError``.
- Buffers on GPU transports: PyTorch CUDA/ROCm tensors (``data_ptr()``, ``is_cuda``) or
  objects exposing ``__cuda_array_interface__`` (CuPy, Numba), contiguous, on the
  communicator's device; host memory is refused. The data pointer is passed as is (no
  copies), and the stream is ``torch.cuda.current_stream(tensor.device)`` unless
  ``stream=`` names one (a ``torch.cuda.Stream``, a CuPy stream or a raw pointer).
  Stream-ordered, as NCCL: the collective runs after the work queued on that stream
  before the call and before the work queued on it after, and the call returns without
  waiting for the device.
- The dtype is taken from the array (float32, float64, float16, int8, uint8, int32,
  uint32, int64, uint64, and bfloat16 from ml_dtypes or torch: NCCL's types but fp8);
  pass ``dtype="bf16"`` to reinterpret, e.g., a uint16 array as bfloat16. Integers
  wrap; 64-bit integers reduce and average exactly.
- Counts are inferred from the arrays (``count=`` overrides); in-place calls are NCCL's
  layouts, recognised from the pointers: ``all_gather(recv[r*n:(r+1)*n], recv)``,
  ``reduce_scatter(send, send[r*n:(r+1)*n])``, ``all_reduce(x)`` / ``broadcast(x)``.
- On host transports every call blocks until its result is in the receive buffer, except inside
  ``with strata.group():`` where calls return at once and complete when the block ends
  (the package keeps the arrays alive until then), and, on host transports, with
  ``async_op=True``: the call returns a ``Work`` at once (``wait()``, ``is_completed()``,
  as ``torch.distributed``'s), the communicator's calls run in the order they were made,
  and until the work completed the arrays belong to strata (do not read the receive
  array or write the send array; the package keeps both alive). Arrays are used in
  place, never copied. ``stream`` arguments are accepted and ignored on host
  transports. Inside a group on GPU transports, results are in place when the block
  ends.
- One communicator is driven by one thread at a time; ctypes releases the GIL during
  calls, so ranks on threads run concurrently.
- Failures raise ``StrataError`` with ``.code`` (NCCL's ``ncclResult_t`` value: 4 invalid
  argument, 5 invalid usage, 6 remote, ...) and ``.message`` (``strataGetLastError``; a
  transport the library was built without names the pip command that adds it, where the
  library says the cargo feature: docs/errors.md).

The shared library is found through ``STRATA_LIB`` (a path), else the one ``pip install
./python`` bundled in the package, else ``target/release`` then ``target/debug`` of the
source tree this package sits in, then the system's library path.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence

__all__ = [
    "StrataError",
    "LibraryNotFound",
    "Comm",
    "Work",
    "UniqueId",
    "init_local",
    "init_rank",
    "get_unique_id",
    "group",
    "group_start",
    "group_end",
    "version",
    "finalize",
    "library_path",
    "error_string",
    "features",
    "include_dir",
]

__version__ = "0.1.0"


# ---- constants of include/strata.h, read from the header itself ----


def include_dir() -> str:
    """The directory holding ``strata.h``, the C header this package's constants are read
    from (C++ code, e.g. the torch backend, compiles against it with ``-I``): the copy an
    installed package carries (``strata/include``, put there by ``python/setup.py``'s
    build), else the source tree's ``include/`` when the package runs from a checkout
    (``PYTHONPATH=python``)."""
    here = Path(__file__).resolve().parent
    for d in (here / "include", here.parent.parent / "include"):
        if (d / "strata.h").is_file():
            return str(d)
    raise ImportError(
        f"strata.h not found in {here / 'include'} (an installed package) nor in "
        f"{here.parent.parent / 'include'} (a source tree): reinstall the package"
    )


_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+\(?\s*(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*\)?\s*(?:/[*/].*)?$")
_ENUMERATOR = re.compile(r"^\s*(\w+)\s*=\s*(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*\s*,?\s*(?:/[*/].*)?$")


def _header_constants(path: str) -> dict:
    """Every integer constant of the header: ``#define NAME <integer>`` (parenthesised or
    not) and enumerators ``NAME = <integer>,``, by name."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = _DEFINE.match(line) or _ENUMERATOR.match(line)
            if m:
                out[m.group(1)] = int(m.group(2), 0)
    return out


#: The integer constants of ``include_dir()/strata.h`` by their C names.
HEADER = _header_constants(os.path.join(include_dir(), "strata.h"))


def _h(name: str) -> int:
    try:
        return HEADER[name]
    except KeyError:
        raise ImportError(f"{name} is not defined in {os.path.join(include_dir(), 'strata.h')}") from None


#: ``STRATA_VERSION_CODE`` of the header (major*10000 + minor*100 + patch): the library
#: loaded must have the same major and minor.
ABI_VERSION_CODE = _h("STRATA_VERSION_CODE")

_RESULTS = ("strataSuccess", "strataUnhandledCudaError", "strataSystemError", "strataInternalError",
            "strataInvalidArgument", "strataInvalidUsage", "strataRemoteError", "strataInProgress")  # fmt: skip
(SUCCESS, UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR,
 INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, IN_PROGRESS) = (_h(n) for n in _RESULTS)  # fmt: skip
RESULT_NAMES = {_h(n): n for n in _RESULTS}

INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = (
    _h("strata" + n) for n in ("Int8", "Uint8", "Int32", "Uint32", "Int64", "Uint64",
                               "Float16", "Float32", "Float64", "Bfloat16"))  # fmt: skip
DTYPES = {
    "i8": INT8, "int8": INT8,
    "u8": UINT8, "uint8": UINT8,
    "i32": INT32, "int32": INT32,
    "u32": UINT32, "uint32": UINT32,
    "i64": INT64, "int64": INT64,
    "u64": UINT64, "uint64": UINT64,
    "f16": FLOAT16, "float16": FLOAT16, "half": FLOAT16,
    "f32": FLOAT32, "float32": FLOAT32, "float": FLOAT32,
    "f64": FLOAT64, "float64": FLOAT64, "double": FLOAT64,
    "bf16": BFLOAT16, "bfloat16": BFLOAT16,
}  # fmt: skip
DTYPE_SIZES = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2,
               FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2}  # fmt: skip

SUM, PROD, MAX, MIN, AVG = (_h("strata" + n) for n in ("Sum", "Prod", "Max", "Min", "Avg"))
OPS = {"sum": SUM, "prod": PROD, "max": MAX, "min": MIN, "avg": AVG, "mean": AVG}

TRANSPORT_DEFAULT, TRANSPORT_LOCAL, TRANSPORT_MPI, TRANSPORT_NCCL, TRANSPORT_RCCL, TRANSPORT_CUDA_LOCAL = (
    _h("strataTransport" + n) for n in ("Default", "Local", "Mpi", "Nccl", "Rccl", "CudaLocal"))  # fmt: skip
#: Ranks as threads on the CPU device (the device code paths without a GPU); its calls
#: take CPU-device memory (``strataMemAlloc``), which this module does not allocate.
TRANSPORT_HOST_LOCAL = _h("strataTransportHostLocal")
TRANSPORT_NAMES = {TRANSPORT_LOCAL: "local", TRANSPORT_MPI: "mpi", TRANSPORT_NCCL: "nccl",
                   TRANSPORT_RCCL: "rccl", TRANSPORT_CUDA_LOCAL: "cuda-local",
                   TRANSPORT_HOST_LOCAL: "host-local"}  # fmt: skip
TRANSPORTS = {None: TRANSPORT_DEFAULT, "default": TRANSPORT_DEFAULT,
              **{n: c for c, n in TRANSPORT_NAMES.items()},
              **{n.replace("-", "_"): c for c, n in TRANSPORT_NAMES.items() if "-" in n}}  # fmt: skip
#: Transports whose calls take device memory.
GPU_TRANSPORTS = frozenset({"nccl", "rccl", "cuda-local"})
SPLIT_NOCOLOR = _h("STRATA_SPLIT_NOCOLOR")
SHRINK_DEFAULT = _h("STRATA_SHRINK_DEFAULT")  # strataCommShrink's flags (NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT)
SHRINK_ABORT = _h("STRATA_SHRINK_ABORT")
CONFIG_MAGIC = _h("STRATA_CONFIG_MAGIC")
#: ``STRATA_UNIQUE_ID_BYTES``: strata's 128 bytes, then room for an ``ncclUniqueId``.
UNIQUE_ID_BYTES = _h("STRATA_UNIQUE_ID_BYTES")
#: ``STRATA_UNIQUE_ID_VENDOR_OFFSET``: where the NCCL/RCCL id sits in a unique id.
UNIQUE_ID_VENDOR_OFFSET = _h("STRATA_UNIQUE_ID_VENDOR_OFFSET")


class StrataError(RuntimeError):
    """A strata call failed: ``code`` is the ``strataResult_t`` (NCCL's value) and
    ``message`` what ``strataGetLastError`` said (or the package's own check)."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.name = RESULT_NAMES.get(code, f"strataResult({code})")
        if code == INVALID_USAGE and "not compiled: " in message and _lib is not None:
            try:
                has = features()
            except Exception:
                has = frozenset()
            message = _not_compiled_step(message, _lib_path or "", has, bool(os.environ.get("STRATA_LIB")))
        self.message = message
        super().__init__(f"{self.name} ({code}): {message}")


_FEATURE = re.compile(r"`(mpi|cuda|rocm)` feature")
_CARGO_STEP = re.compile(r" \(cargo build --features \w+\)")
_FEATURE_ORDER = ("mpi", "cuda", "rocm")


def _not_compiled_step(message: str, lib_path: str, has: frozenset, from_env: bool) -> str:
    """A library's "not compiled" message (which names the cargo feature and the cargo
    command) with the Python user's next step instead of the command: how the library
    in use (``lib_path``, with features ``has``; ``from_env``: chosen by ``STRATA_LIB``)
    gets the feature. Other messages unchanged. docs/errors.md."""
    m = _FEATURE.search(message)
    if "not compiled: " not in message or m is None:
        return message
    f = m.group(1)
    want = ",".join(x for x in _FEATURE_ORDER if x in has or x == f)
    cargo = f"cargo build --release --features {want}"
    headers = " (with OpenMPI's headers installed: apt install libopenmpi-dev)" if f == "mpi" else ""
    built = f"was built without `{f}` (strata.features(): {', '.join(sorted(has)) or 'none'})"
    if from_env:
        step = (f"STRATA_LIB={lib_path} {built}: unset STRATA_LIB to use the library pip installed, "
                f"or rebuild that one with `{cargo}`")
    elif Path(lib_path).parent == Path(__file__).resolve().parent:
        step = (f"this package's library {built}: reinstall it with "
                f"`STRATA_FEATURES={want} pip install --force-reinstall ./python`{headers}")
    else:
        step = (f"the library {lib_path} {built}: install the package with `pip install ./python`"
                f"{headers}, or rebuild that library with `{cargo}`")
    return f"{_CARGO_STEP.sub('', message)}; {step}"


class LibraryNotFound(ImportError):
    """The shared library could not be loaded; the message names every candidate."""


# ---- C types ----


class UniqueId(ctypes.Structure):
    """``strataUniqueId`` (256 bytes): names a new world; pass the same id to every rank
    (``bytes(uid)`` / ``UniqueId.from_bytes`` to send it between processes). Ids made for
    nccl/rccl carry the vendor's id at ``UNIQUE_ID_VENDOR_OFFSET``."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]

    def __bytes__(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), ctypes.sizeof(self))

    @property
    def vendor_id(self) -> Optional[bytes]:
        """The embedded NCCL/RCCL unique id (128 bytes), or None for a plain id."""
        b = bytes(self)
        if b[28] == 0:
            return None
        return b[UNIQUE_ID_VENDOR_OFFSET:]

    @classmethod
    def from_bytes(cls, b: bytes) -> "UniqueId":
        if len(b) != UNIQUE_ID_BYTES:
            raise ValueError(f"a unique id has {UNIQUE_ID_BYTES} bytes, not {len(b)}")
        return cls.from_buffer_copy(b)


class Config(ctypes.Structure):
    """``strataConfig_t`` (filled by the package; see ``init_rank``)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("transport", ctypes.c_int),
        ("topology", ctypes.c_char_p),
        ("algo", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("links", ctypes.c_char_p),
    ]


class Traffic(ctypes.Structure):
    """``strataTraffic_t`` (see ``Comm.traffic``)."""

    _fields_ = [
        ("intra_package", ctypes.c_uint64),
        ("intra_node", ctypes.c_uint64),
        ("inter_node", ctypes.c_uint64),
        ("max_node_egress", ctypes.c_uint64),
        ("measured", ctypes.c_int),
    ]


_c_int, _c_size, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
_PROTOTYPES = {
    "strataGetVersion": [ctypes.POINTER(_c_int)],
    "strataGetFeatures": [ctypes.POINTER(ctypes.c_char_p)],
    "strataGetUniqueId": [ctypes.POINTER(UniqueId)],
    "strataGetUniqueIdForTransport": [_c_int, ctypes.POINTER(UniqueId)],
    "strataCommInitRankConfig": [ctypes.POINTER(_vp), _c_int, UniqueId, _c_int, ctypes.POINTER(Config)],
    "strataCommInitLocal": [ctypes.POINTER(_vp), _c_int, ctypes.c_char_p, ctypes.POINTER(Config)],
    "strataCommSplit": [_vp, _c_int, _c_int, ctypes.POINTER(_vp), ctypes.POINTER(Config)],
    "strataCommCreateGroup": [_vp, _c_int, ctypes.POINTER(_c_int), ctypes.POINTER(_vp), ctypes.POINTER(Config)],
    "strataCommShrink": [_vp, ctypes.POINTER(_c_int), _c_int, ctypes.POINTER(_vp), ctypes.POINTER(Config), _c_int],
    "strataCommDestroy": [_vp],
    "strataCommAbort": [_vp],
    "strataCommCount": [_vp, ctypes.POINTER(_c_int)],
    "strataCommUserRank": [_vp, ctypes.POINTER(_c_int)],
    "strataCommGetTransport": [_vp, ctypes.POINTER(_c_int)],
    "strataCommGetAsyncError": [_vp, ctypes.POINTER(_c_int)],
    "strataCommGetTraffic": [_vp, _c_int, ctypes.POINTER(Traffic)],
    "strataAllGather": [_vp, _vp, _c_size, _c_int, _vp, _vp],
    "strataReduceScatter": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "strataAllGatherQuantized": [_vp, _vp, _c_size, _c_int, _c_int, _c_size, _vp, _vp],
    "strataReduceScatterQuantized": [_vp, _vp, _c_size, _c_int, _c_int, _c_int, _c_size, _vp, _vp],
    "strataAllReduce": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "strataAllToAll": [_vp, _vp, _c_size, _c_int, _vp, _vp],
    "strataBroadcast": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "strataSend": [_vp, _c_size, _c_int, _c_int, _vp, _vp],
    "strataRecv": [_vp, _c_size, _c_int, _c_int, _vp, _vp],
    "strataAllGatherCoalesced": [ctypes.POINTER(_vp), ctypes.POINTER(_vp), ctypes.POINTER(_c_size), _c_size, _c_int, _vp, _vp],
    "strataReduceScatterCoalesced": [ctypes.POINTER(_vp), ctypes.POINTER(_vp), ctypes.POINTER(_c_size), _c_size, _c_int, _c_int, _vp, _vp],
    "strataGroupStart": [],
    "strataGroupEnd": [],
    "strataFinalize": [],
    "strataStreamCreate": [ctypes.POINTER(_vp)],
    "strataStreamDestroy": [_vp],
    "strataStreamSynchronize": [_vp],
    "strataStreamQuery": [_vp],
    "strataEventCreate": [ctypes.POINTER(_vp)],
    "strataEventDestroy": [_vp],
    "strataEventRecord": [_vp, _vp],
    "strataEventQuery": [_vp],
    "strataEventSynchronize": [_vp],
}  # fmt: skip

_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lib_lock = threading.Lock()


def _lib_name() -> str:
    if sys.platform == "darwin":
        return "libstrata.dylib"
    if sys.platform == "win32":
        return "strata.dll"
    return "libstrata.so"


def _candidates() -> List[str]:
    env = os.environ.get("STRATA_LIB")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    name = _lib_name()
    # The library bundled by `pip install ./python` (named with Python's extension
    # suffix), then a source tree's builds.
    from importlib.machinery import EXTENSION_SUFFIXES
    c = [str(here / ("libstrata" + sfx)) for sfx in EXTENSION_SUFFIXES if (here / ("libstrata" + sfx)).exists()]
    c += [str(root / "target" / "release" / name), str(root / "target" / "debug" / name)]
    found = ctypes.util.find_library("strata")
    c.append(found or name)
    return c


def _load() -> ctypes.CDLL:
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for cand in _candidates():
            local = os.sep in cand
            if local and not os.path.exists(cand):
                tried.append(f"{cand} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            for name, args in _PROTOTYPES.items():
                f = getattr(lib, name)
                f.argtypes = args
                f.restype = ctypes.c_int
            lib.strataGetErrorString.argtypes = [ctypes.c_int]
            lib.strataGetErrorString.restype = ctypes.c_char_p
            lib.strataGetLastError.argtypes = [_vp]
            lib.strataGetLastError.restype = ctypes.c_char_p
            v = ctypes.c_int()
            lib.strataGetVersion(ctypes.byref(v))
            if v.value // 100 != ABI_VERSION_CODE // 100:
                tried.append(f"{cand} (version code {v.value}, this package needs {ABI_VERSION_CODE})")
                continue
            _lib, _lib_path = lib, cand
            return lib
        if os.environ.get("STRATA_LIB"):
            step = ("point STRATA_LIB to a libstrata.so (`cargo build --release` makes "
                    "target/release/libstrata.so), or unset it to use the library pip installed")
        else:
            step = ("install the package with `pip install ./python` from a strata checkout (it "
                    "builds and bundles the library), or set STRATA_LIB to a libstrata.so")
        raise LibraryNotFound("cannot load the strata shared library; tried: " + "; ".join(tried) + ". Next: " + step)


def library_path() -> str:
    """Path (or name) of the loaded shared library (loading it if needed)."""
    _load()
    assert _lib_path is not None
    return _lib_path


def _last_error(handle: Optional[int]) -> str:
    msg = _load().strataGetLastError(handle)
    return msg.decode("utf-8", "replace") if msg else ""


def _check(code: int, handle: Optional[int] = None) -> None:
    if code != SUCCESS:
        raise StrataError(code, _last_error(handle))


def error_string(code: int) -> str:
    """``strataGetErrorString(code)``."""
    return _load().strataGetErrorString(code).decode()


def version() -> int:
    """``strataGetVersion``: the library's version code (major*10000 + minor*100 + patch)."""
    v = ctypes.c_int()
    _check(_load().strataGetVersion(ctypes.byref(v)))
    return v.value


def features() -> frozenset:
    """``strataGetFeatures``: the cargo features the loaded library was built with that
    add transports, a subset of ``{"mpi", "cuda", "rocm"}`` (``mpi``: the mpi transport;
    ``cuda``: nccl and cuda-local, CUDA and NCCL loaded at run time; ``rocm``: rccl).
    ``pip install ./python`` builds ``mpi`` (where OpenMPI's headers are) and ``cuda``."""
    p = ctypes.c_char_p()
    _check(_load().strataGetFeatures(ctypes.byref(p)))
    return frozenset(f for f in (p.value or b"").decode().split(",") if f)


def get_unique_id(transport: Optional[str] = None) -> UniqueId:
    """A new id; pass it to ``init_rank`` on every rank. Without ``transport``:
    ``strataGetUniqueId`` (an NCCL/RCCL id is embedded when ``STRATA_TRANSPORT`` is nccl
    or rccl); with one: ``strataGetUniqueIdForTransport`` (``"nccl"`` / ``"rccl"`` embed
    the vendor's id; a transport not compiled into the library raises code 5)."""
    uid = UniqueId()
    if transport is None:
        _check(_load().strataGetUniqueId(ctypes.byref(uid)))
    else:
        _check(_load().strataGetUniqueIdForTransport(_transport_code(transport), ctypes.byref(uid)))
    return uid


def finalize() -> None:
    """``strataFinalize``: end MPI if strata started it (no-op otherwise). After a peer
    failure (a ``StrataError`` with code 6 on ``mpi``) it aborts the whole MPI job
    instead of returning. The package also calls it at interpreter exit once an MPI
    communicator was made."""
    _check(_load().strataFinalize())


def _transport_code(transport: Any) -> int:
    if isinstance(transport, int) and not isinstance(transport, bool):
        return transport
    key = transport.lower() if isinstance(transport, str) else transport
    if key not in TRANSPORTS:
        raise StrataError(
            INVALID_ARGUMENT,
            f"transport {transport!r} is not one of local, mpi, nccl, rccl, cuda-local, host-local",
        )
    return TRANSPORTS[key]


def _config(transport=None, topology=None, algo=None, timeout=None, links=None) -> Config:
    code = _transport_code(transport)
    cfg = Config()
    cfg.size = ctypes.sizeof(Config)
    cfg.magic = CONFIG_MAGIC
    cfg.version = ABI_VERSION_CODE
    cfg.transport = code
    cfg.topology = topology.encode() if topology else None
    cfg.algo = algo.encode() if algo else None
    cfg.timeout_ms = 0 if timeout is None else max(1, int(round(timeout * 1000)))
    cfg.links = links.encode() if links else None
    return cfg


# ---- buffers ----

_TYPESTR = {"f4": FLOAT32, "f2": FLOAT16, "i1": INT8, "u1": UINT8, "i4": INT32,
            "u4": UINT32, "i8": INT64, "u8": UINT64, "f8": FLOAT64}  # fmt: skip
_TORCH = {"torch.float32": FLOAT32, "torch.float16": FLOAT16, "torch.bfloat16": BFLOAT16,
          "torch.int8": INT8, "torch.uint8": UINT8, "torch.int32": INT32,
          "torch.uint32": UINT32, "torch.int64": INT64, "torch.uint64": UINT64,
          "torch.float64": FLOAT64}  # fmt: skip


class _Buf:
    """A buffer seen through its data pointer: address, size in bytes, dtype code, and
    for device memory the torch device whose current stream orders the call."""

    __slots__ = ("obj", "ptr", "nbytes", "dtype", "torch_device")

    def __init__(self, obj: Any, ptr: int, nbytes: int, dtype: Optional[int], torch_device: Any = None):
        self.obj, self.ptr, self.nbytes, self.dtype = obj, ptr, nbytes, dtype
        self.torch_device = torch_device


def _dtype_code(d: Any) -> int:
    if isinstance(d, int):
        return d
    s = str(d).lower()
    if s in DTYPES:
        return DTYPES[s]
    raise StrataError(INVALID_ARGUMENT, f"unknown dtype {d!r} (f32, f16, bf16, f64, i8, u8, i32, u32, "
                      "i64, u64)")


def _interface(obj: Any, ai: dict, writable: bool, what: str, torch_device: Any = None) -> _Buf:
    """A buffer from an ``__array_interface__`` / ``__cuda_array_interface__`` dict."""
    shape = tuple(ai["shape"])
    typestr = ai["typestr"]
    itemsize = int(typestr[2:])
    n = 1
    for s in shape:
        n *= s
    strides = ai.get("strides")
    if strides is not None and n > 1:
        want, acc = [], itemsize
        for s in reversed(shape):
            want.append(acc)
            acc *= s
        if tuple(st for st, sh in zip(strides, shape) if sh > 1) != tuple(
            w for w, sh in zip(reversed(want), shape) if sh > 1
        ):
            raise StrataError(INVALID_ARGUMENT, f"{what} is not C-contiguous")
    ptr, readonly = ai["data"]
    if writable and readonly:
        raise StrataError(INVALID_ARGUMENT, f"{what} is read-only")
    dt = getattr(obj, "dtype", None)
    code = BFLOAT16 if getattr(dt, "name", "") == "bfloat16" else _TYPESTR.get(typestr[1:])
    return _Buf(obj, ptr or 0, n * itemsize, code, torch_device)


def _device_of(obj: Any) -> Optional[str]:
    """A description of where ``obj`` lives when that is not host memory, else None."""
    if hasattr(obj, "__cuda_array_interface__"):
        return "device memory (__cuda_array_interface__)"
    if callable(getattr(obj, "data_ptr", None)):
        dev = getattr(obj, "device", None)
        if getattr(obj, "is_cuda", False) is True:
            return f"device memory ({dev if dev is not None else 'cuda'})"
        if dev is not None and getattr(dev, "type", "cpu") != "cpu":
            return f"device memory ({dev})"
    return None


def _buf(obj: Any, writable: bool, what: str, gpu: bool = False) -> _Buf:
    """``obj``'s memory for a call on a host (``gpu=False``) or GPU transport."""
    where = _device_of(obj)
    if gpu:
        if where is None:
            raise StrataError(
                INVALID_ARGUMENT,
                f"{what} is host memory ({type(obj).__name__}): this communicator's transport "
                "moves device memory (pass a CUDA tensor, e.g. tensor.cuda())",
            )
        if callable(getattr(obj, "data_ptr", None)):
            dev = getattr(obj, "device", None)
            if dev is not None and getattr(dev, "type", "cuda") != "cuda":
                raise StrataError(INVALID_ARGUMENT, f"{what} is on {dev}: GPU transports take CUDA/ROCm tensors")
            if callable(getattr(obj, "is_contiguous", None)) and not obj.is_contiguous():
                raise StrataError(INVALID_ARGUMENT, f"{what} is not contiguous")
            nbytes = obj.numel() * obj.element_size()
            code = _TORCH.get(str(getattr(obj, "dtype", "")))
            return _Buf(obj, obj.data_ptr(), nbytes, code, dev)
        return _interface(obj, obj.__cuda_array_interface__, writable, what)
    if where is not None:
        raise StrataError(
            INVALID_ARGUMENT,
            f"{what} is {where}: this communicator's transport moves host memory "
            "(device memory needs the nccl, rccl or cuda-local transport)",
        )
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return _interface(obj, ai, writable, what)
    if callable(getattr(obj, "data_ptr", None)):
        if callable(getattr(obj, "is_contiguous", None)) and not obj.is_contiguous():
            raise StrataError(INVALID_ARGUMENT, f"{what} is not contiguous")
        nbytes = obj.numel() * obj.element_size()
        return _Buf(obj, obj.data_ptr(), nbytes, _TORCH.get(str(getattr(obj, "dtype", ""))))
    raise StrataError(
        INVALID_ARGUMENT,
        f"{what}: {type(obj).__name__} has no __array_interface__ or data_ptr() (numpy arrays, CPU tensors)",
    )


def _resolve_dtype(dtype: Any, *bufs: Optional[_Buf]) -> int:
    if dtype is not None:
        return _dtype_code(dtype)
    for b in bufs:
        if b is not None and b.dtype is not None:
            return b.dtype
    raise StrataError(INVALID_ARGUMENT, "cannot infer the dtype: pass dtype=")


def _size_of(code: int) -> int:
    # Unknown codes (NCCL's fp8): any size; the library rejects the dtype itself.
    return DTYPE_SIZES.get(code, 1)


def _need(b: _Buf, nbytes: int, what: str) -> None:
    if b.nbytes < nbytes:
        raise StrataError(
            INVALID_ARGUMENT, f"{what} holds {b.nbytes} bytes, the call needs {nbytes}"
        )


def _stream(stream: Any, *bufs: Optional[_Buf]) -> Optional[int]:
    """The raw stream pointer of ``stream``; when None and a buffer is a torch device
    tensor, that device's current torch stream (NULL otherwise: the legacy default)."""
    if stream is None:
        for b in bufs:
            if b is not None and b.torch_device is not None:
                torch = sys.modules.get("torch")
                if torch is not None:
                    return torch.cuda.current_stream(b.torch_device).cuda_stream or None
        return None
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise StrataError(INVALID_ARGUMENT, f"cannot take a stream pointer from {stream!r}")


def _op_code(op: Any) -> int:
    if isinstance(op, int):
        return op
    try:
        return OPS[str(op).lower()]
    except KeyError:
        raise StrataError(INVALID_ARGUMENT, f"unknown op {op!r} (sum, prod, max, min, avg)") from None


# ---- groups ----

_tls = threading.local()


def _group_keep(*objs: Any) -> None:
    if getattr(_tls, "depth", 0) > 0:
        _tls.keep.extend(objs)


def group_start() -> None:
    """``strataGroupStart``: calls on this thread return at once until ``group_end``."""
    _check(_load().strataGroupStart())
    if getattr(_tls, "depth", 0) == 0:
        _tls.keep = []
    _tls.depth = getattr(_tls, "depth", 0) + 1


def group_end() -> None:
    """``strataGroupEnd``: at the outermost end, run the group's calls and fill their
    receive buffers; the arrays are kept alive until then."""
    code = _load().strataGroupEnd()
    if getattr(_tls, "depth", 0) > 0:
        _tls.depth -= 1
        if _tls.depth == 0:
            _tls.keep = []
    _check(code)


@contextmanager
def group():
    """``with strata.group(): ...`` = ``group_start()`` ... ``group_end()``."""
    group_start()
    try:
        yield
    finally:
        group_end()


# ---- communicators ----


class Comm:
    """A communicator (``strataComm_t``): one rank's handle on a group of ranks. Drive it
    from one thread at a time. Release it with ``destroy()`` (or use it as a context
    manager); a destroyed communicator raises ``StrataError`` code 5."""

    def __init__(self, handle: int):
        self._h: Optional[int] = handle
        self._addr = handle
        self._transport: Optional[str] = None
        try:
            self._transport = self._query_transport()
        except StrataError:
            pass  # reported by the first call that needs it

    # -- properties --
    @property
    def handle(self) -> int:
        """The raw ``strataComm_t`` value."""
        return self._addr

    def _int(self, fn: str) -> int:
        v = ctypes.c_int()
        _check(getattr(_load(), fn)(self._addr, ctypes.byref(v)), self._addr)
        return v.value

    @property
    def rank(self) -> int:
        """``strataCommUserRank``."""
        return self._int("strataCommUserRank")

    @property
    def size(self) -> int:
        """``strataCommCount``."""
        return self._int("strataCommCount")

    def _query_transport(self) -> str:
        code = self._int("strataCommGetTransport")
        return TRANSPORT_NAMES.get(code, str(code))

    @property
    def transport(self) -> str:
        """``strataCommGetTransport``: ``local``, ``mpi``, ``nccl``, ``rccl`` or
        ``cuda-local``."""
        if self._transport is None:
            self._transport = self._query_transport()
        return self._transport

    @property
    def is_gpu(self) -> bool:
        """True on the GPU transports (nccl, rccl, cuda-local): calls take device memory."""
        return self.transport in GPU_TRANSPORTS

    @property
    def _gpu(self) -> bool:
        # A destroyed communicator: let the call itself report it (host checks first).
        try:
            return self.is_gpu
        except StrataError:
            return False

    @property
    def last_error(self) -> str:
        """``strataGetLastError(comm)``."""
        return _last_error(self._addr)

    def async_error(self) -> Optional["StrataError"]:
        """``strataCommGetAsyncError``: the failure that aborted this communicator after
        its call returned (a launched GPU call that failed, timed out or was aborted),
        as a ``StrataError``, or None. A destroyed communicator: None."""
        if self._h is None:
            return None
        v = ctypes.c_int()
        code = _load().strataCommGetAsyncError(self._addr, ctypes.byref(v))
        if code != SUCCESS or v.value == SUCCESS:
            return None
        return StrataError(v.value, _last_error(self._addr))

    def __repr__(self) -> str:
        if self._h is None:
            return f"<strata.Comm {self._addr:#x} destroyed>"
        return f"<strata.Comm {self._addr:#x}>"

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        if self._h is not None:
            self.destroy()

    # -- lifetime --
    def _drain(self) -> None:
        """Wait for the ``async_op`` calls and release their stream (errors were or will
        be raised by their ``Work``)."""
        hs = getattr(self, "_hs", None)
        if hs is not None:
            self._hs = None
            _load().strataStreamDestroy(hs)
        self._inflight = []

    def destroy(self) -> None:
        """``strataCommDestroy``: finish queued work and release the communicator."""
        self._drain()
        self._h = None
        _check(_load().strataCommDestroy(self._addr))

    def abort(self) -> None:
        """``strataCommAbort``: fail every waiter here and on the peers, and release."""
        self._h = None
        code = _load().strataCommAbort(self._addr)
        self._drain()
        _check(code)

    def split(self, color: Optional[int], key: int = 0) -> Optional["Comm"]:
        """``strataCommSplit`` (collective): ranks with the same ``color`` form a new
        communicator ordered by (key, rank); ``color=None`` opts out and returns None."""
        out = _vp()
        c = SPLIT_NOCOLOR if color is None else color
        _check(_load().strataCommSplit(self._addr, c, key, ctypes.byref(out), None), self._addr)
        return Comm(out.value) if out.value else None

    def create_group(self, ranks: Sequence[int], algo: Optional[str] = None) -> "Comm":
        """``strataCommCreateGroup``: a communicator of ``ranks`` (ranks of this one)
        made by those ranks alone (the others do not call), as ``torch.distributed``'s
        ``new_group`` needs; it keeps the world topology; ``algo`` is its default
        algorithm (else this one's). mpi, local, host-local and cuda-local transports."""
        rs = list(ranks)
        arr = (_c_int * max(len(rs), 1))(*rs)
        out = _vp()
        cfg = ctypes.byref(_config(None, None, algo, None)) if algo is not None else None
        _check(_load().strataCommCreateGroup(self._addr, len(rs), arr, ctypes.byref(out), cfg), self._addr)
        return Comm(out.value)

    def shrink(self, exclude: Sequence[int], abort: bool = False) -> "Comm":
        """``strataCommShrink`` (``ncclCommShrink``): a communicator of this one's ranks
        without ``exclude``, made by the survivors alone (the excluded ranks do not
        call), usually after a failure aborted this one. Every survivor passes the same
        list; the new ranks keep the old order; topology and configuration carry over.
        ``abort=True`` aborts this communicator's operations in flight first. This one
        stays valid (destroy it when done). local, mpi, host-local and cuda-local transports."""
        ex = list(exclude)
        arr = (_c_int * max(len(ex), 1))(*ex)
        out = _vp()
        flags = SHRINK_ABORT if abort else SHRINK_DEFAULT
        _check(_load().strataCommShrink(self._addr, arr, len(ex), ctypes.byref(out), None, flags), self._addr)
        return Comm(out.value)

    def traffic(self, all_members: bool = False) -> dict:
        """``strataCommGetTraffic``: the bytes strata sent since this communicator's
        world was created, by link class of the world topology: ``intra_package``,
        ``intra_node``, ``inter_node``, ``max_node_egress`` (the most bytes sent out of
        one node) and ``measured`` (True: every transfer, on the in-process transports;
        False: nominal, the sends strata's own algorithms issued, on mpi). This rank's
        sends, or with ``all_members`` every member's (collective: every rank calls it,
        after its queued work). Subtract two readings for what ran in between; nccl and
        rccl count nothing (``StrataError`` code 5)."""
        t = Traffic()
        _check(_load().strataCommGetTraffic(self._addr, 1 if all_members else 0, ctypes.byref(t)), self._addr)
        out = {f: int(getattr(t, f)) for f, _ in Traffic._fields_}
        out["measured"] = bool(t.measured)
        return out

    # -- collectives --
    def _call(self, fn: str, *args: Any) -> None:
        _check(getattr(_load(), fn)(*args), self._addr)

    def _issue(self, fn: str, args: list, stream: Any, async_op: bool, *bufs: Optional[_Buf],
               keep: tuple = ()) -> Optional["Work"]:
        """Run ``fn(*args, stream)``: blocking, or with ``async_op`` enqueued on this
        communicator's strata host stream and returned as a ``Work``."""
        if not async_op:
            self._call(fn, *args, _stream(stream, *bufs))
            return None
        if self._gpu:
            raise StrataError(INVALID_USAGE, "async_op=True is for host transports; on a GPU "
                              "communicator order the call on a stream (stream=)")
        if stream is not None:
            raise StrataError(INVALID_ARGUMENT, "async_op=True orders the call on the "
                              "communicator's own host stream: pass no stream")
        if getattr(self, "_hs", None) is None:
            out = _vp()
            _check(_load().strataStreamCreate(ctypes.byref(out)))
            self._hs = out.value
            self._inflight = []
        self._call(fn, *args, self._hs)
        work = Work(self, (bufs, keep))
        # Until completion is seen, the arrays must stay alive even if the caller drops
        # the Work: the communicator keeps the unfinished ones.
        self._inflight = [w for w in self._inflight if not w._poll()] + [work]
        return work

    def _send_recv(self, send, recv, count, dtype, per_rank: Optional[str]) -> tuple:
        """The buffers, dtype and count of a call from ``send`` to ``recv``: the buffer
        named by ``per_rank`` (``"send"`` or ``"recv"``) holds a block of ``count``
        elements per rank, the other one block (both where None). The count defaults to
        all of that one block (``send``'s where both are one), whose size is checked
        first. The arrays are kept alive for an open group."""
        s, r = _buf(send, False, "send", self._gpu), _buf(recv, True, "recv", self._gpu)
        dt = _resolve_dtype(dtype, s, r)
        sz = _size_of(dt)
        sides = [(s, "send"), (r, "recv")]
        if per_rank == "send":
            sides.reverse()
        count = sides[0][0].nbytes // sz if count is None else count
        for b, what in sides:
            _need(b, count * sz * (self.size if what == per_rank else 1), what)
        _group_keep(send, recv)
        return s, r, dt, count

    def all_gather(self, send, recv, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataAllGather``: ``recv`` (size*count) gathers every rank's ``send``
        (count; default: all of ``send``). In place when ``send`` is
        ``recv[rank*count:(rank+1)*count]``."""
        s, r, dt, count = self._send_recv(send, recv, count, dtype, "recv")
        return self._issue("strataAllGather", [s.ptr, r.ptr, count, dt, self._addr], stream, async_op, s, r)

    def reduce_scatter(self, send, recv, op="sum", count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataReduceScatter``: ``recv`` (count; default: all of ``recv``) = ``op``
        over ranks of ``send[rank*count:]`` (size*count). In place when ``recv`` is
        ``send[rank*count:(rank+1)*count]``."""
        s, r, dt, count = self._send_recv(send, recv, count, dtype, "send")
        return self._issue("strataReduceScatter", [s.ptr, r.ptr, count, dt, _op_code(op), self._addr], stream, async_op, s, r)

    def all_gather_quantized(self, send, recv, bits=8, block=256, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataAllGatherQuantized`` (ZeRO++ qwZ): as ``all_gather``, every rank's data
        travels block-quantized to ``bits`` (4 or 8) with one scale per ``block``."""
        s, r, dt, count = self._send_recv(send, recv, count, dtype, "recv")
        return self._issue("strataAllGatherQuantized", [s.ptr, r.ptr, count, dt, bits, block, self._addr], stream, async_op, s, r)

    def reduce_scatter_quantized(self, send, recv, op="sum", bits=4, block=256, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataReduceScatterQuantized`` (ZeRO++ qgZ, 2-hop): as ``reduce_scatter`` with
        ``op`` sum or avg, gradients travel block-quantized to ``bits`` (4 or 8)."""
        s, r, dt, count = self._send_recv(send, recv, count, dtype, "send")
        return self._issue("strataReduceScatterQuantized", [s.ptr, r.ptr, count, dt, _op_code(op), bits, block, self._addr], stream, async_op, s, r)

    def all_reduce(self, send, recv=None, op="sum", count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataAllReduce``; in place when ``recv`` is None or ``send`` itself."""
        recv = send if recv is None else recv
        s, r, dt, count = self._send_recv(send, recv, count, dtype, None)
        return self._issue("strataAllReduce", [s.ptr, r.ptr, count, dt, _op_code(op), self._addr], stream, async_op, s, r)

    def all_to_all(self, send, recv, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataAllToAll``: block j (count; default len(send)/size) of ``send`` goes to
        rank j, block i of ``recv`` comes from rank i."""
        s, r = _buf(send, False, "send", self._gpu), _buf(recv, True, "recv", self._gpu)
        dt = _resolve_dtype(dtype, s, r)
        sz = _size_of(dt)
        n = self.size
        if count is None:
            if s.nbytes % (sz * n):
                raise StrataError(INVALID_ARGUMENT, f"send ({s.nbytes} bytes) does not split into {n} blocks")
            count = s.nbytes // (sz * n)
        _need(s, count * sz * n, "send")
        _need(r, count * sz * n, "recv")
        _group_keep(send, recv)
        return self._issue("strataAllToAll", [s.ptr, r.ptr, count, dt, self._addr], stream, async_op, s, r)

    def broadcast(self, send, recv=None, root=0, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataBroadcast`` from ``root``; in place when ``recv`` is None (then ``send``
        is the buffer on every rank). Off the root, ``send`` may be None."""
        if recv is None:
            recv, send = send, send
        r = _buf(recv, True, "recv", self._gpu)
        s = _buf(send, False, "send", self._gpu) if send is not None else None
        dt = _resolve_dtype(dtype, r, s)
        sz = _size_of(dt)
        count = r.nbytes // sz if count is None else count
        _need(r, count * sz, "recv")
        if s is not None:
            _need(s, count * sz, "send")
        _group_keep(send, recv)
        return self._issue("strataBroadcast", [s.ptr if s else None, r.ptr, count, dt, root, self._addr], stream, async_op, s, r)

    def send(self, buf, peer: int, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataSend`` of ``buf`` to ``peer``."""
        return self._p2p("strataSend", buf, False, peer, count, dtype, stream, async_op)

    def recv(self, buf, peer: int, count=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataRecv`` into ``buf`` from ``peer``."""
        return self._p2p("strataRecv", buf, True, peer, count, dtype, stream, async_op)

    def _p2p(self, fn, buf, writable: bool, peer: int, count, dtype, stream, async_op) -> Optional["Work"]:
        """``fn`` (``strataSend`` / ``strataRecv``) of ``count`` elements of ``buf``
        (default: all of it) with ``peer``."""
        b = _buf(buf, writable, "buf", self._gpu)
        dt = _resolve_dtype(dtype, b)
        sz = _size_of(dt)
        count = b.nbytes // sz if count is None else count
        _need(b, count * sz, "buf")
        _group_keep(buf)
        return self._issue(fn, [b.ptr, count, dt, peer, self._addr], stream, async_op, b)

    def _coalesced(self, fn, sends, recvs, counts, dtype, op, gather: bool, stream, async_op=False) -> Optional["Work"]:
        sends, recvs = list(sends), list(recvs)
        if len(sends) != len(recvs):
            raise StrataError(INVALID_ARGUMENT, f"{len(sends)} send buffers but {len(recvs)} receive buffers")
        sb = [_buf(x, False, f"sends[{i}]", self._gpu) for i, x in enumerate(sends)]
        rb = [_buf(x, True, f"recvs[{i}]", self._gpu) for i, x in enumerate(recvs)]
        dt = _resolve_dtype(dtype, *(sb + rb))
        sz = _size_of(dt)
        n = self.size
        if counts is None:
            counts = [(s.nbytes if gather else r.nbytes) // sz for s, r in zip(sb, rb)]
        counts = list(counts)
        if len(counts) != len(sb):
            raise StrataError(INVALID_ARGUMENT, f"{len(counts)} counts for {len(sb)} buffers")
        for i, (s, r, c) in enumerate(zip(sb, rb, counts)):
            _need(s, c * sz * (1 if gather else n), f"sends[{i}]")
            _need(r, c * sz * (n if gather else 1), f"recvs[{i}]")
        k = len(sb)
        sp = (_vp * k)(*[s.ptr for s in sb])
        rp = (_vp * k)(*[r.ptr for r in rb])
        cp = (_c_size * k)(*counts)
        _group_keep(*sends, *recvs)
        args = [sp, rp, cp, k, dt] + ([] if gather else [_op_code(op)]) + [self._addr]
        return self._issue(fn, args, stream, async_op, *sb, *rb, keep=(sp, rp, cp))

    def all_gather_coalesced(self, sends: Sequence, recvs: Sequence, counts=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataAllGatherCoalesced``: ``recvs[i]`` gathers ``sends[i]`` for every i, in one
        collective (MiCS §4); counts default to the sizes of ``sends``."""
        return self._coalesced("strataAllGatherCoalesced", sends, recvs, counts, dtype, None, True, stream, async_op)

    def reduce_scatter_coalesced(self, sends: Sequence, recvs: Sequence, op="sum", counts=None, dtype=None, stream=None, async_op=False) -> Optional["Work"]:
        """``strataReduceScatterCoalesced``: ``recvs[i]`` = ``op`` over ranks of
        ``sends[i][rank*count_i:]``; counts default to the sizes of ``recvs``."""
        return self._coalesced("strataReduceScatterCoalesced", sends, recvs, counts, dtype, op, False, stream, async_op)


class Work:
    """The handle of an ``async_op=True`` call (as ``torch.distributed``'s ``Work``): a
    strata event recorded after the call on its communicator's host stream."""

    def __init__(self, comm: Comm, keep: Any):
        self._comm = comm
        self._keep = keep
        self._seen = False
        self._error: Optional[StrataError] = None
        out = _vp()
        _check(_load().strataEventCreate(ctypes.byref(out)))
        self._ev = out.value
        _check(_load().strataEventRecord(self._ev, comm._hs), comm._addr)

    def _done(self, code: int) -> None:
        self._seen = True
        self._keep = None
        if code != SUCCESS and self._error is None:
            self._error = StrataError(code, _last_error(None) or _last_error(self._comm._addr))

    def _poll(self) -> bool:
        """True once completion was seen (querying the event; failures are kept for
        ``wait``/``is_completed``)."""
        if not self._seen and self._ev is not None:
            code = _load().strataEventQuery(self._ev)
            if code != IN_PROGRESS:
                self._done(code)
        return self._seen

    def is_completed(self) -> bool:
        """True once the call (and those before it on the communicator) completed; never
        blocks. Raises the call's ``StrataError`` if it failed."""
        if not self._seen:
            code = _load().strataEventQuery(self._ev)
            if code == IN_PROGRESS:
                return False
            self._done(code)
        if self._error is not None:
            raise self._error
        return True

    def wait(self, timeout: Any = None) -> bool:
        """Block until the call completed (its results are in the arrays, which are the
        caller's again); raises its ``StrataError`` if it failed. Returns True."""
        if not self._seen:
            self._done(_load().strataEventSynchronize(self._ev))
        if self._error is not None:
            raise self._error
        return True

    def __del__(self) -> None:
        ev, self._ev = getattr(self, "_ev", None), None
        if ev is not None and _lib is not None:
            _lib.strataEventDestroy(ev)


def init_local(nranks: int, topology: Optional[str] = None, algo: Optional[str] = None,
               timeout: Optional[float] = None, transport: str = "local",
               links: Optional[str] = None) -> List[Comm]:
    """``strataCommInitLocal``: an in-process world of ``nranks`` ranks; returns one
    ``Comm`` per rank, rank i at index i, to drive from threads (or from one thread
    inside ``group()``). ``topology`` is a SPEC such as ``"nodes:2x4"`` (default:
    ``STRATA_TOPOLOGY``, else one node); ``algo`` an algorithm name (``ring``, ``log-step``,
    ``hier``, ``ho-ring``, ``auto``, ...); ``timeout`` seconds.
    ``transport``: ``"local"`` (host memory) or ``"cuda-local"`` (every rank on one CUDA
    device, ``STRATA_DEVICE`` or 0, taking device tensors; needs ``--features cuda``).
    ``links``: ``"preset"``, ``"probe"`` or ``"reprobe"`` (default ``STRATA_LINKS``, else
    preset): ``"probe"`` measures the world's links at creation, or reads them from the
    cache of an earlier probe of the same hosts, and ``auto`` decides from them."""
    out = (_vp * max(nranks, 1))()
    cfg = _config(transport, None, algo, timeout, links)
    _check(_load().strataCommInitLocal(out, nranks, topology.encode() if topology else None, ctypes.byref(cfg)))
    return [Comm(out[i]) for i in range(nranks)]


def init_rank(nranks: int, uid: UniqueId, rank: int, transport: Optional[str] = None,
              topology: Optional[str] = None, algo: Optional[str] = None,
              timeout: Optional[float] = None, links: Optional[str] = None) -> Comm:
    """``strataCommInitRankConfig``: this rank's communicator of a world of ``nranks``,
    blocking until all ranks joined with the same ``uid`` (local and cuda-local: threads
    of this process; nccl/rccl: any processes and threads, one per GPU, on the current
    device, with a ``uid`` from ``get_unique_id("nccl")``) or the MPI world formed
    (``transport="mpi"``). ``transport`` None: ``STRATA_TRANSPORT``, else local.
    ``links`` as in ``init_local``."""
    out = _vp()
    cfg = _config(transport, topology, algo, timeout, links)
    _check(_load().strataCommInitRankConfig(ctypes.byref(out), nranks, uid, rank, ctypes.byref(cfg)))
    comm = Comm(out.value)
    if comm._transport == "mpi":
        _finalize_at_exit()
    return comm


_finalize_registered = False


def _finalize_at_exit() -> None:
    """Once an MPI world exists, ``strataFinalize`` runs at interpreter exit (a no-op when
    the program already called ``finalize()`` or MPI belongs to it). After a peer
    failure it aborts the MPI job rather than waiting in ``MPI_Finalize`` for the
    failed peer, so a script that dies of a ``StrataError`` still ends the whole job."""
    global _finalize_registered
    if not _finalize_registered:
        _finalize_registered = True
        atexit.register(lambda: _load().strataFinalize())


def destroy_all(comms: Iterable[Optional[Comm]]) -> None:
    """Destroy every communicator of a list (None entries skipped)."""
    for c in comms:
        if c is not None:
            c.destroy()
