"""GPU transports through the C ABI with PyTorch CUDA tensors (device pointers, the
current torch stream). Needs torch with CUDA and a GPU, and a library built with
``--features cuda`` (libnccl from torch's nvidia-nccl wheel or STRATA_NCCL_LIB); every
test skips cleanly where one of those is missing.

    cargo build --release --features cuda
    STRATA_LIB=target/release/libstrata.so python3 -m pytest -q python/tests/test_gpu.py
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import strata

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU")

DEV = "cuda:0"


def nccl_id():
    """An id carrying an NCCL id, or skip when the library lacks nccl."""
    try:
        return strata.get_unique_id("nccl")
    except strata.StrataError as e:
        if e.code in (strata.INVALID_USAGE, strata.SYSTEM_ERROR):
            pytest.skip(f"no nccl transport in this library: {e}")
        raise


@pytest.fixture
def nccl_comm():
    uid = nccl_id()
    assert uid.vendor_id is not None and any(uid.vendor_id)
    torch.cuda.set_device(0)
    c = strata.init_rank(1, uid, 0, transport="nccl", timeout=60)
    yield c
    c.destroy()


def test_nccl_one_rank_on_the_current_stream(nccl_comm):
    c = nccl_comm
    assert (c.transport, c.is_gpu, c.rank, c.size) == ("nccl", True, 0, 1)
    n = 1 << 16
    x = torch.zeros(n, dtype=torch.float32, device=DEV)
    # Work queued on the current stream right before the call: a long sleep, then the
    # values. The collective must wait for both (the stream is passed implicitly).
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(50_000_000)
    x.copy_(torch.arange(n, dtype=torch.float32, device=DEV))
    y = torch.empty_like(x)
    c.all_reduce(x, y)  # out of place: y must hold the values, not the zeros
    torch.testing.assert_close(y, torch.arange(n, dtype=torch.float32, device=DEV))
    c.all_reduce(y, op="avg")  # in place, avg over 1 rank
    torch.testing.assert_close(y, torch.arange(n, dtype=torch.float32, device=DEV))
    # Work queued after the call on the same stream sees the result (stream-ordered).
    z = y * 2
    torch.testing.assert_close(z[:4], torch.tensor([0.0, 2.0, 4.0, 6.0], device=DEV))

    g = torch.full((n,), -1.0, device=DEV)
    c.all_gather(x, g)
    torch.testing.assert_close(g, x)
    g2 = x.clone()
    c.all_gather(g2[0:n], g2)  # in place (rank 0's block is the whole buffer)
    torch.testing.assert_close(g2, x)

    rs = torch.empty(n, device=DEV)
    c.reduce_scatter(x, rs)
    torch.testing.assert_close(rs, x)
    b = torch.arange(7, dtype=torch.bfloat16, device=DEV)
    c.broadcast(b, root=0)
    torch.testing.assert_close(b, torch.arange(7, dtype=torch.bfloat16, device=DEV))
    h = torch.arange(5, dtype=torch.float16, device=DEV)
    c.all_reduce(h, op="max")
    torch.testing.assert_close(h, torch.arange(5, dtype=torch.float16, device=DEV))


def test_nccl_side_stream_and_groups(nccl_comm):
    c = nccl_comm
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(1000, device=DEV) * 3
        y = torch.empty_like(x)
        c.all_reduce(x, y)  # on s (the current stream inside the block)
    torch.testing.assert_close(y, torch.full((1000,), 3.0, device=DEV))
    out = torch.empty(1000, device=DEV)
    c.all_reduce(x, out, stream=s)  # explicit torch stream
    torch.testing.assert_close(out, x)
    a, b = torch.full((10,), 2.0, device=DEV), torch.full((10,), 5.0, device=DEV)
    with strata.group():
        c.all_reduce(a)
        c.all_reduce(b, op="sum")
    torch.testing.assert_close(a + b, torch.full((10,), 7.0, device=DEV))


def test_nccl_refuses_host_memory(nccl_comm):
    with pytest.raises(strata.StrataError) as e:
        nccl_comm.all_reduce(np.ones(4, np.float32))
    assert e.value.code == strata.INVALID_ARGUMENT and "host memory" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        nccl_comm.all_reduce(torch.ones(4))  # a CPU tensor
    assert e.value.code == strata.INVALID_ARGUMENT
    # A raw host pointer passed as device memory: the library checks it.
    host = np.ones(4, np.float32)
    with pytest.raises(strata.StrataError) as e:
        nccl_comm._call("strataAllReduce", host.ctypes.data, host.ctypes.data, 4, strata.FLOAT32,
                        strata.SUM, nccl_comm.handle, None)
    assert e.value.code == strata.INVALID_ARGUMENT and "device memory" in e.value.message


def cuda_local_world(n):
    try:
        return strata.init_local(n, transport="cuda-local", timeout=60)
    except strata.StrataError as e:
        if e.code == strata.INVALID_USAGE and "feature" in e.message:
            pytest.skip(f"no cuda-local transport in this library: {e}")
        raise


def test_cuda_local_world_from_threads():
    n = 4
    comms = cuda_local_world(n)
    try:
        assert [c.transport for c in comms] == ["cuda-local"] * n

        def body(c, r):
            torch.cuda.set_device(0)
            x = torch.full((1000,), float(r + 1), device=DEV)
            c.all_reduce(x)
            g = torch.empty(n * 3, device=DEV)
            c.all_gather(torch.full((3,), float(r), device=DEV), g)
            rs = torch.empty(2, device=DEV)
            c.reduce_scatter(torch.arange(2 * n, dtype=torch.float32, device=DEV), rs, op="avg")
            torch.cuda.current_stream().synchronize()
            return x.cpu(), g.cpu(), rs.cpu()

        with ThreadPoolExecutor(n) as pool:
            res = [f.result() for f in [pool.submit(body, c, r) for r, c in enumerate(comms)]]
        for r, (x, g, rs) in enumerate(res):
            assert torch.all(x == n * (n + 1) / 2)
            assert g.tolist() == [float(p) for p in range(n) for _ in range(3)]
            assert rs.tolist() == [2.0 * r, 2.0 * r + 1]
        # One thread drives every rank inside a group.
        xs = [torch.full((8,), float(r), device=DEV) for r in range(n)]
        with strata.group():
            for c, x in zip(comms, xs):
                c.all_reduce(x)
        for x in xs:
            assert torch.all(x.cpu() == sum(range(n)))
    finally:
        strata.destroy_all(comms)
