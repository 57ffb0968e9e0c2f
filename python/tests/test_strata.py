"""pytest over the C ABI through the ctypes package, on host memory: every call is driven
from threads on an in-process world (`strata.init_local(8, "nodes:2x4")`)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import strata

N = 8


@pytest.fixture
def comms():
    cs = strata.init_local(N, "nodes:2x4", timeout=20)
    yield cs
    for c in cs:
        try:
            c.destroy()
        except strata.StrataError as e:
            assert e.code == strata.INVALID_USAGE  # already destroyed by the test


def on_ranks(comms, fn):
    """Run fn(comm, rank) on every rank's thread; return the results in rank order."""
    with ThreadPoolExecutor(len(comms)) as pool:
        futs = [pool.submit(fn, c, r) for r, c in enumerate(comms)]
        return [f.result() for f in futs]


def val(r, n, dtype=np.float32):
    """Small integers: exact sums in every dtype."""
    return ((np.arange(n) * 3 + r * 7) % 11 - 5).astype(dtype)


def bf16(a):
    """float32 -> bfloat16 bits (round to nearest even) as uint16."""
    u = np.asarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def test_version_and_strings():
    assert strata.version() == strata.ABI_VERSION_CODE
    assert strata.error_string(0) == "no error"
    assert "invalid argument" in strata.error_string(4)
    assert strata.error_string(42) == "unknown result code"
    assert os.path.exists(strata.library_path())


def test_constants_are_the_headers(tmp_path):
    """The package's constants are read from strata.h at import: the C compiler, given the
    same header, agrees on every one of them (and on the names the package uses)."""
    inc = strata.include_dir()
    assert os.path.isfile(os.path.join(inc, "strata.h"))
    names = sorted(n for n in strata.HEADER if n.startswith(("strata", "STRATA_")))
    assert {"strataSuccess", "strataBfloat16", "strataAvg", "strataTransportHostLocal",
            "STRATA_SPLIT_NOCOLOR", "STRATA_SHRINK_ABORT", "STRATA_CONFIG_MAGIC",
            "STRATA_UNIQUE_ID_BYTES", "STRATA_UNIQUE_ID_VENDOR_OFFSET",
            "STRATA_VERSION_CODE"} <= set(names)  # fmt: skip
    assert strata.SPLIT_NOCOLOR == -1 and strata.CONFIG_MAGIC == strata.HEADER["STRATA_CONFIG_MAGIC"]
    assert strata.RESULT_NAMES[strata.INVALID_USAGE] == "strataInvalidUsage"
    assert strata.TRANSPORTS["cuda_local"] == strata.TRANSPORTS["cuda-local"] == strata.TRANSPORT_CUDA_LOCAL
    cc = next((c for c in ("cc", "gcc", "clang") if __import__("shutil").which(c)), None)
    if cc is None:
        pytest.skip("no C compiler to cross-check the header's values")
    src = tmp_path / "consts.c"
    src.write_text('#include <stdio.h>\n#include "strata.h"\nint main(void) {\n'
                   + "".join(f'  printf("{n} %lld\\n", (long long)({n}));\n' for n in names)
                   + "  return 0;\n}\n")  # fmt: skip
    exe = tmp_path / "consts"
    subprocess.run([cc, "-std=c11", "-I", inc, str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {n: int(v) for n, v in (line.split() for line in out.splitlines())}
    assert got == {n: strata.HEADER[n] for n in names}


def test_features_name_the_compiled_transports():
    """strata.features() (strataGetFeatures): a subset of mpi, cuda, rocm; a transport
    whose feature is missing is refused with the message naming that feature, one whose
    feature is there is not (it may still fail for want of its run-time library)."""
    f = strata.features()
    assert isinstance(f, frozenset) and f <= {"mpi", "cuda", "rocm"}
    for transport, feature in (("nccl", "cuda"), ("rccl", "rocm")):
        try:
            strata.get_unique_id(transport)
            assert feature in f, transport
        except strata.StrataError as e:
            assert (f"`{feature}` feature" in e.message) == (feature not in f), (transport, f, e.message)
    want = os.environ.get("STRATA_EXPECT_FEATURES")
    if want is not None:
        assert f == {x for x in want.split(",") if x}, (f, want)


def test_rank_and_size(comms):
    assert [c.rank for c in comms] == list(range(N))
    assert all(c.size == N for c in comms)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.int64, np.float64])
def test_all_gather(comms, dtype):
    def body(c, r):
        send = val(r, 5, dtype)
        recv = np.zeros(5 * N, dtype)
        c.all_gather(send, recv)
        inplace = np.zeros(5 * N, dtype)
        inplace[r * 5 : (r + 1) * 5] = send
        c.all_gather(inplace[r * 5 : (r + 1) * 5], inplace)  # NCCL's in-place layout
        return recv, inplace

    want = np.concatenate([val(p, 5, dtype) for p in range(N)])
    for recv, inplace in on_ranks(comms, body):
        np.testing.assert_array_equal(recv, want)
        np.testing.assert_array_equal(inplace, want)


def test_traffic_counters_show_the_hierarchical_egress():
    # nodes:2x4 (p=8, k=4): a hier all-gather of M bytes sends (p-k)/p*M = M/2 out of each
    # node (MiCS 3.3); ring's (p-1)/p*M.
    m = 8 * 5 * 4
    for algo, egress in (("hier", m // 2), ("ring", 7 * m // 8)):
        cs = strata.init_local(N, "nodes:2x4", algo=algo, timeout=20)

        def run(c, r):
            before = c.traffic(all_members=True)
            x = np.full(5, r, np.float32)
            y = np.zeros(8 * 5, np.float32)
            c.all_gather(x, y)
            assert (y == np.repeat(np.arange(8, dtype=np.float32), 5)).all()
            after = c.traffic(all_members=True)
            return {k: after[k] - before[k] for k in ("inter_node", "max_node_egress")}, c.traffic()

        got = on_ranks(cs, run)
        for c in cs:
            c.destroy()
        assert all(g == {"inter_node": 2 * egress, "max_node_egress": egress} for g, _ in got), (algo, got)
        assert all(mine["measured"] for _, mine in got)
        assert sum(mine["inter_node"] for _, mine in got) == 2 * egress


def test_all_gather_bf16(comms):
    def body(c, r):
        recv = np.zeros(3 * N, np.uint16)
        c.all_gather(bf16(val(r, 3)), recv, dtype="bf16")
        return from_bf16(recv)

    want = np.concatenate([val(p, 3) for p in range(N)])
    for got in on_ranks(comms, body):
        np.testing.assert_array_equal(got, want)


def reference(op, parts):
    s = np.stack(parts).astype(np.float64)
    return {"sum": s.sum(0), "avg": s.mean(0), "max": s.max(0), "min": s.min(0), "prod": s.prod(0)}[op]


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_reduce_scatter(comms, op):
    c_ = 3

    def body(c, r):
        send = val(r, c_ * N)
        recv = np.zeros(c_, np.float32)
        c.reduce_scatter(send, recv, op=op)
        inplace = send.copy()
        c.reduce_scatter(inplace, inplace[r * c_ : (r + 1) * c_], op=op)
        return recv, inplace

    full = reference(op, [val(p, c_ * N) for p in range(N)])
    for r, (recv, inplace) in enumerate(on_ranks(comms, body)):
        np.testing.assert_allclose(recv, full[r * c_ : (r + 1) * c_], rtol=1e-6)
        np.testing.assert_allclose(inplace[r * c_ : (r + 1) * c_], full[r * c_ : (r + 1) * c_], rtol=1e-6)
        rest = np.delete(inplace, np.s_[r * c_ : (r + 1) * c_])
        np.testing.assert_array_equal(rest, np.delete(val(r, c_ * N), np.s_[r * c_ : (r + 1) * c_]))


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_all_reduce(comms, op):
    def body(c, r):
        x = val(r, 4) / 4 + 1  # prod stays small
        out = np.zeros(4, np.float32)
        c.all_reduce(x, out, op=op)
        c.all_reduce(x, op=op)  # in place
        return out, x

    want = reference(op, [val(p, 4) / 4 + 1 for p in range(N)])
    for out, x in on_ranks(comms, body):
        np.testing.assert_allclose(out, want, rtol=1e-5)
        np.testing.assert_allclose(x, want, rtol=1e-5)


def test_all_reduce_f16(comms):
    def body(c, r):
        x = val(r, 6, np.float16)
        c.all_reduce(x, op="sum")
        return x

    want = reference("sum", [val(p, 6) for p in range(N)])
    for x in on_ranks(comms, body):
        np.testing.assert_array_equal(x.astype(np.float64), want)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_all_reduce_64_bit_integers_are_exact(comms, op):
    # Values past 2^53, where a trip through float64 would round; avg rounds half away
    # from zero; uint64 sums wrap.
    big = np.int64(1) << 58

    def body(c, r):
        x = np.array([big + r, -big - 3 * r, r - 4, 7], np.int64)
        u = np.array([np.uint64(2**63) + np.uint64(r), r], np.uint64)
        c.all_reduce(x, op=op)
        c.all_reduce(u, op=op)
        return x, u

    xs = [[int(big) + r, -int(big) - 3 * r, r - 4, 7] for r in range(N)]
    us = [[2**63 + r, r] for r in range(N)]

    def ref(rows, wrap):
        out = []
        for col in zip(*rows):
            if op == "sum":
                v = sum(col)
            elif op == "max":
                v = max(col)
            elif op == "min":
                v = min(col)
            else:
                s = sum(col) % 2**64 if wrap else sum(col)
                s = s if wrap or s < 2**63 else s - 2**64
                q, rem = divmod(abs(s), N)
                v = (q + (2 * rem >= N)) * (1 if s >= 0 else -1)
            out.append(v % 2**64 if wrap else v)
        return out

    for x, u in on_ranks(comms, body):
        assert [int(v) for v in x] == ref(xs, False)
        assert [int(v) for v in u] == ref(us, True)


def test_all_reduce_f64(comms):
    def body(c, r):
        x = np.array([0.1 * r, 1e308, -2.5, r], np.float64)
        c.all_reduce(x, op="sum")
        return x

    for x in on_ranks(comms, body):
        assert x[2] == -2.5 * N and x[3] == sum(range(N)) and np.isinf(x[1])
        np.testing.assert_allclose(x[0], 0.1 * sum(range(N)), rtol=1e-15)


def test_all_to_all(comms):
    def body(c, r):
        send = np.array([r * 100 + p * 10 + i for p in range(N) for i in range(2)], np.float32)
        recv = np.zeros_like(send)
        c.all_to_all(send, recv)
        return recv

    for r, recv in enumerate(on_ranks(comms, body)):
        want = np.array([p * 100 + r * 10 + i for p in range(N) for i in range(2)], np.float32)
        np.testing.assert_array_equal(recv, want)


def test_broadcast(comms):
    root = 5

    def body(c, r):
        recv = np.zeros(7, np.float32)
        c.broadcast(val(r, 7) if r == root else None, recv, root=root)
        x = val(r, 7)
        c.broadcast(x, root=2)  # in place
        return recv, x

    for recv, x in on_ranks(comms, body):
        np.testing.assert_array_equal(recv, val(root, 7))
        np.testing.assert_array_equal(x, val(2, 7))


def test_send_recv_and_groups(comms):
    def body(c, r):
        nxt, prv = (r + 1) % N, (r - 1) % N
        got = np.zeros(3, np.float32)
        with strata.group():
            c.recv(got, prv)
            c.send(val(r, 3), nxt)
        ar = np.array([r, 1], np.float32)
        ag = np.zeros(N, np.int32)
        with strata.group():  # results appear when the block ends
            c.all_reduce(ar)
            c.all_gather(np.array([r], np.int32), ag)
        return got, ar, ag

    for r, (got, ar, ag) in enumerate(on_ranks(comms, body)):
        np.testing.assert_array_equal(got, val((r - 1) % N, 3))
        np.testing.assert_array_equal(ar, [N * (N - 1) / 2, N])
        np.testing.assert_array_equal(ag, np.arange(N))


def test_one_thread_drives_all_ranks_in_a_group(comms):
    outs = [np.zeros(2 * N, np.float32) for _ in range(N)]
    with strata.group():
        for r, c in enumerate(comms):
            c.all_gather(np.array([r, -r], np.float32), outs[r])  # temporaries kept alive
    want = np.array([v for p in range(N) for v in (p, -p)], np.float32)
    for o in outs:
        np.testing.assert_array_equal(o, want)


def test_coalesced(comms):
    counts = [1, 7, 4]

    def body(c, r):
        sends = [val(r, k) + 20 * i for i, k in enumerate(counts)]
        recvs = [np.zeros(k * N, np.float32) for k in counts]
        c.all_gather_coalesced(sends, recvs)
        rs_send = [val(r, k * N) for k in counts]
        rs_recv = [np.zeros(k, np.float32) for k in counts]
        c.reduce_scatter_coalesced(rs_send, rs_recv, op="avg")
        return recvs, rs_recv

    for r, (recvs, rs_recv) in enumerate(on_ranks(comms, body)):
        for i, k in enumerate(counts):
            np.testing.assert_array_equal(recvs[i], np.concatenate([val(p, k) + 20 * i for p in range(N)]))
            full = reference("avg", [val(p, k * N) for p in range(N)])
            np.testing.assert_allclose(rs_recv[i], full[r * k : (r + 1) * k], rtol=1e-6)


def test_split(comms):
    def body(c, r):
        sub = c.split(r % 2, key=-r)
        x = np.array([r], np.float32)
        sub.all_reduce(x)
        info = (sub.rank, sub.size, float(x[0]))
        sub.destroy()
        with pytest.raises(strata.StrataError) as e:
            sub.all_reduce(x)
        assert e.value.code == strata.INVALID_USAGE and "destroyed" in e.value.message
        none = c.split(None if r == 0 else 1)
        if none is not None:
            none.destroy()
        return info, none is None

    for r, ((rank, size, s), opted_out) in enumerate(on_ranks(comms, body)):
        assert size == N // 2 and rank == N // 2 - 1 - r // 2
        assert s == sum(range(r % 2, N, 2))
        assert opted_out == (r == 0)


def test_shrink_after_a_lost_rank():
    # nodes:2x2 with a short timeout; rank 1 is lost (it never calls): the others'
    # all-reduce fails and aborts the communicator, they shrink it and go on.
    cs = strata.init_local(4, "nodes:2x2", timeout=0.5)

    def body(c, r):
        if r == 1:
            return None
        with pytest.raises(strata.StrataError):
            c.all_reduce(np.ones(4, np.float32))
        with pytest.raises(strata.StrataError) as e:
            c.shrink([r])
        assert e.value.code == strata.INVALID_ARGUMENT
        s = c.shrink([1])
        x = np.full(3, r + 1, np.float32)
        s.all_reduce(x)
        info = (s.rank, s.size, float(x[0]))
        s.destroy()
        return info

    out = on_ranks(cs, body)
    for c in cs:
        c.destroy()
    assert out[1] is None
    for r in (0, 2, 3):
        assert out[r] == (r - (r > 1), 3, 1.0 + 3.0 + 4.0)


def test_async_op_work_handles(comms):
    def body(c, r):
        d = c.split(0, key=r)  # the same ranks, a second communicator
        x = np.full(1000, r + 1, np.float32)
        y = np.zeros(1000 * N, np.float32)
        w1 = c.all_reduce(x, async_op=True)  # several calls outstanding, two communicators
        w2 = d.all_gather(np.full(1000, r, np.float32), y, async_op=True)
        w3 = c.all_reduce(np.ones(4, np.float32), async_op=True)  # dropped unwaited: kept alive
        del w3
        assert w2.wait() and w1.wait() and w1.is_completed()
        # A call that cannot finish yet says so: rank 0 receives on d from rank 1, which
        # sends only after a blocking all-reduce that rank 0 joins after asking.
        got = np.zeros(3, np.float32)
        pending = None
        if r == 0:
            w = d.recv(got, 1, async_op=True)
            pending = w.is_completed()
        c.all_reduce(np.ones(1, np.float32))
        if r == 1:
            d.send(np.array([1.5, 2.5, 3.5], np.float32), 0)
        if r == 0:
            w.wait()
        with pytest.raises(strata.StrataError) as e:
            c.all_reduce(x, async_op=True, stream=0)
        assert e.value.code == strata.INVALID_ARGUMENT
        d.destroy()
        return x, y, got, pending

    for r, (x, y, got, pending) in enumerate(on_ranks(comms, body)):
        np.testing.assert_array_equal(x, np.full(1000, N * (N + 1) / 2, np.float32))
        np.testing.assert_array_equal(y, np.repeat(np.arange(N, dtype=np.float32), 1000))
        if r == 0:
            assert pending is False
            np.testing.assert_array_equal(got, [1.5, 2.5, 3.5])


def test_async_op_inside_a_group(comms):
    # Nonblocking calls grouped: the group ends at once, the calls run together, a call
    # after the group waits for all of them (as torch's coalescing manager uses them).
    def body(c, r):
        a = np.full(3, r + 1, np.float32)
        b = np.full(5, 10 * (r + 1), np.float32)
        with strata.group():
            w1 = c.all_reduce(a, async_op=True)
            w2 = c.all_reduce(b, async_op=True)
        w3 = c.all_reduce(a, async_op=True)
        assert w3.wait() and w1.is_completed() and w2.is_completed()
        return a, b

    total = N * (N + 1) / 2
    for a, b in on_ranks(comms, body):
        np.testing.assert_array_equal(a, np.full(3, N * total, np.float32))
        np.testing.assert_array_equal(b, np.full(5, 10 * total, np.float32))


def test_init_rank_from_threads():
    uid = strata.get_unique_id()
    assert len(bytes(uid)) == 256 and uid.vendor_id is None

    def body(r):
        c = strata.init_rank(4, uid, r, topology="nodes:2x2", algo="hier", timeout=20)
        x = np.full(3, r, np.float32)
        c.all_reduce(x)
        out = (c.rank, c.size, x.copy())
        c.destroy()
        return out

    with ThreadPoolExecutor(4) as pool:
        res = list(pool.map(body, range(4)))
    for r, (rank, size, x) in enumerate(res):
        assert (rank, size) == (r, 4)
        np.testing.assert_array_equal(x, np.full(3, 6.0))


def test_init_rank_timeout_is_an_error_not_a_hang():
    with pytest.raises(strata.StrataError) as e:
        strata.init_rank(2, strata.get_unique_id(), 0, timeout=0.2)
    assert e.value.code == strata.REMOTE_ERROR and "1 of 2" in e.value.message


class TensorLike:
    """A stand-in for a CPU tensor: data_ptr(), numel(), element_size(), dtype, device."""

    class _Dev:
        def __init__(self, t):
            self.type = t

    def __init__(self, arr, device="cpu"):
        self.arr = arr
        self.device = self._Dev(device)
        self.dtype = "torch.float32"

    def data_ptr(self):
        return self.arr.ctypes.data

    def numel(self):
        return self.arr.size

    def element_size(self):
        return self.arr.itemsize

    def is_contiguous(self):
        return True


def test_objects_with_a_data_pointer(comms):
    def body(c, r):
        t = TensorLike(np.full(2, r + 1, np.float32))
        c.all_reduce(t)
        return t.arr

    for a in on_ranks(comms, body):
        np.testing.assert_array_equal(a, np.full(2, N * (N + 1) / 2))
    with pytest.raises(strata.StrataError) as e:
        comms[0].all_reduce(TensorLike(np.zeros(2, np.float32), device="cuda"))
    assert e.value.code == strata.INVALID_ARGUMENT

    class Device:
        __cuda_array_interface__ = {"data": (1234, False), "shape": (2,), "typestr": "<f4"}

    with pytest.raises(strata.StrataError) as e:
        comms[0].all_reduce(Device())
    assert e.value.code == strata.INVALID_ARGUMENT and "device memory" in e.value.message


def test_async_error_names_the_failure_that_aborted_the_communicator():
    cs = strata.init_local(2, "nodes:1x2", timeout=1)
    try:
        assert cs[0].async_error() is None
        x = np.ones(4, np.float32)
        with pytest.raises(strata.StrataError) as e:  # rank 1 never joins
            cs[0].all_reduce(x)
        assert e.value.code == 6
        err = cs[0].async_error()
        assert err is not None and err.code == 6, err
        with pytest.raises(strata.StrataError):  # the next call fails at once
            cs[0].all_reduce(x)
    finally:
        for c in cs:
            c.abort()


def test_errors_carry_code_and_last_error(comms):
    c = comms[0]
    x = np.zeros(4, np.float32)
    # Unknown dtype (NCCL's fp8 e4m3): passed to the library, which names it.
    with pytest.raises(strata.StrataError) as e:
        c.all_reduce(x, dtype=10)
    assert e.value.code == 4 and "strataAllReduce" in e.value.message and "datatype 10" in e.value.message
    assert c.last_error == e.value.message
    with pytest.raises(strata.StrataError) as e:
        c.all_reduce(x, op=17)
    assert e.value.code == 4 and "op 17" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        c.broadcast(x, root=N)
    assert e.value.code == 4 and "root" in e.value.message
    with pytest.raises(strata.StrataError) as e:  # overlapping, not in place
        c.all_reduce(x[:3], x[1:4])
    assert e.value.code == 4 and "overlap" in e.value.message
    with pytest.raises(strata.StrataError) as e:  # count overflow
        c.all_reduce(x, count=2**62)
    assert e.value.code == 4
    with pytest.raises(strata.StrataError) as e:  # package-side size check
        c.all_gather(x, np.zeros(4, np.float32))
    assert e.value.code == 4 and "needs" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        c.all_reduce(np.zeros((4, 4), np.float32)[:, 0])
    assert "contiguous" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        strata.group_end()
    assert e.value.code == 5
    with pytest.raises(strata.StrataError) as e:
        strata.init_local(3, "nodes:2x2")
    assert e.value.code == 5 and "4 ranks" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        strata.init_local(2, algo="bogus")
    assert e.value.code == 4 and "bogus" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        strata.init_rank(4, strata.get_unique_id(), 4)
    assert e.value.code == 4 and "rank 4" in e.value.message
    # The communicator still works after all that.
    out = on_ranks(comms, lambda cm, r: (cm.all_reduce(np.ones(1, np.float32)) or 0))
    assert out == [0] * N
    # Destroyed communicators are detected.
    comms[0].destroy()
    with pytest.raises(strata.StrataError) as e:
        comms[0].size
    assert e.value.code == 5


def test_missing_library_names_the_candidates():
    env = dict(os.environ, STRATA_LIB="/nonexistent/libstrata.so")
    p = subprocess.run(
        [sys.executable, "-c", "import strata; strata.version()"],
        env=env, capture_output=True, text=True,
        cwd=os.path.join(os.path.dirname(__file__), ".."),
    )
    assert p.returncode != 0
    assert "LibraryNotFound" in p.stderr and "/nonexistent/libstrata.so" in p.stderr


def test_config_layout():
    import ctypes

    assert ctypes.sizeof(strata.Config) == (56 if ctypes.sizeof(ctypes.c_void_p) == 8 else 32)
    assert ctypes.sizeof(strata.UniqueId) == 256 == strata.UNIQUE_ID_BYTES


def test_links_probe_at_creation():
    # Measured at creation (every rank agrees, or the collectives below could not match),
    # then the world works as any other; a bad name is refused.
    cs = strata.init_local(4, "nodes:2x2", timeout=20, links="reprobe")

    def body(c, r):
        out = np.zeros(4 * 33, dtype=np.float32)
        c.all_gather(val(r, 33), out)
        assert np.array_equal(out, np.concatenate([val(q, 33) for q in range(4)]))

    on_ranks(cs, body)
    strata.destroy_all(cs)
    with pytest.raises(strata.StrataError) as e:
        strata.init_local(2, timeout=20, links="measured")
    assert e.value.code == strata.INVALID_ARGUMENT


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_collectives(comms, bits):
    n = 96

    def body(c, r):
        send = np.tile(val(r, n), N).astype(np.float16)
        out = np.zeros(n, dtype=np.float16)
        c.reduce_scatter_quantized(send, out, op="avg", bits=bits, block=32)
        exact = np.mean([val(q, n) for q in range(N)], axis=0)
        qmax = 2 ** (bits - 1) - 1
        # Bound: every input quantized once (|x| <= 5) plus the node partials requantized.
        bound = N * 5 / (2 * qmax) / N + 2 * (4 * 5) / (2 * qmax) / N + 0.01
        assert np.max(np.abs(out.astype(np.float64) - exact)) <= bound
        gathered = np.zeros(N * n, dtype=np.float32)
        c.all_gather_quantized(val(r, n), gathered, bits=bits, block=32)
        want = np.concatenate([val(q, n) for q in range(N)])
        assert np.max(np.abs(gathered - want)) <= 5 / (2 * qmax) + 1e-5
        with pytest.raises(strata.StrataError) as e:
            c.all_gather_quantized(val(r, n), gathered, bits=3)
        assert e.value.code == strata.INVALID_ARGUMENT

    on_ranks(comms, body)


def test_transports_and_unique_ids(comms):
    assert comms[0].transport == "local" and not comms[0].is_gpu
    uid = strata.get_unique_id("local")
    assert len(bytes(uid)) == strata.UNIQUE_ID_BYTES and uid.vendor_id is None
    assert bytes(uid)[:8] == b"STRATAID"
    assert strata.UniqueId.from_bytes(bytes(uid)).vendor_id is None
    with pytest.raises(ValueError):
        strata.UniqueId.from_bytes(bytes(128))
    with pytest.raises(strata.StrataError) as e:
        strata.get_unique_id("gloo")
    assert e.value.code == strata.INVALID_ARGUMENT and "cuda-local" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        strata.get_unique_id(9)  # not a strataTransport_t: the library says so
    assert e.value.code == strata.INVALID_ARGUMENT
    # nccl: an id carrying an NCCL id where the library has the cuda feature and libnccl
    # loads; otherwise a clear error naming what is missing.
    try:
        nccl = strata.get_unique_id("nccl")
    except strata.StrataError as e:
        assert (e.code == strata.INVALID_USAGE and "`cuda` feature" in e.message) or (
            e.code == strata.SYSTEM_ERROR and "nccl" in e.message.lower()
        ), e
    else:
        assert nccl.vendor_id is not None and any(nccl.vendor_id)
        assert bytes(nccl)[:8] == b"STRATAID"
    # The GPU transports where they are not an in-process world, or not compiled in.
    with pytest.raises(strata.StrataError) as e:
        strata.init_local(2, transport="nccl")
    assert e.value.code in (strata.INVALID_ARGUMENT, strata.INVALID_USAGE)
    try:
        world = strata.init_local(2, transport="cuda-local", timeout=20)
    except strata.StrataError as e:
        assert e.code in (strata.INVALID_USAGE, strata.SYSTEM_ERROR, strata.UNHANDLED_CUDA_ERROR), e
        if e.code == strata.INVALID_USAGE:
            assert "`cuda` feature" in e.message
    else:  # a cuda build on a machine with a GPU
        assert [c.transport for c in world] == ["cuda-local"] * 2
        strata.destroy_all(world)
    # A plain id on the nccl transport: not compiled, or no NCCL id in it.
    with pytest.raises(strata.StrataError) as e:
        strata.init_rank(1, uid, 0, transport="nccl", timeout=2)
    assert (e.value.code == strata.INVALID_USAGE and "feature" in e.value.message) or (
        e.value.code == strata.INVALID_ARGUMENT and "strataGetUniqueIdForTransport" in e.value.message
    ), e.value


class CudaTensorLike(TensorLike):
    """A stand-in for a CUDA tensor (is_cuda): refused by host communicators before the
    pointer reaches the library."""

    is_cuda = True

    def __init__(self, arr):
        super().__init__(arr, device="cuda")


def test_device_tensors_on_host_communicators(comms):
    with pytest.raises(strata.StrataError) as e:
        comms[0].all_reduce(CudaTensorLike(np.zeros(2, np.float32)))
    assert e.value.code == strata.INVALID_ARGUMENT
    assert "device memory" in e.value.message and "cuda-local" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        comms[0].all_gather(np.zeros(1, np.float32), CudaTensorLike(np.zeros(N, np.float32)))
    assert e.value.code == strata.INVALID_ARGUMENT and "recv" in e.value.message
