"""strata as torch's per-device backend: mixed backend strings, DTensor on 1-D, 2-D and
3-D device meshes, functional collectives, under mpirun (CPU tensors)::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/tests/torch_mesh_check.py
    STRATA_TOPOLOGY=nodes:2x4 mpirun -np 8 python3 python/tests/torch_mesh_check.py

1. ``init_process_group("cpu:gloo,cuda:strata")``: CPU calls are gloo's (strata serves
   none, ``strata.torch.served()``), then ``"cpu:strata,cuda:gloo"``: strata serves them.
   In the whole-group form (torch without Python ``Backend`` subclasses, or
   ``STRATA_TORCH_BACKEND=group``) torch replaces the whole group with strata's, which
   composes a real gloo backend for the CPU itself: the same checks hold, and the
   meshes are skipped (DTensor looks its backend up by device, which that form cannot
   serve).
2. With ``init_process_group("strata")``, on every mesh the world size allows (``(p)``,
   ``(2, p/2)``, ``(2, 2, p/4)``): ``distribute_tensor`` on every placement combination
   of Replicate / Shard(0) / Shard(1), ``full_tensor``, ``redistribute`` from Partial
   (sum) to Replicate and from Shard(0) to Shard(1) (an all-to-all), a sharded matmul,
   and the functional collectives (``all_reduce``, ``all_gather_single``,
   ``reduce_scatter_single``, ``all_to_all_single``) on each mesh dimension's group, all
   against values computed locally. Every one of those calls must be served by strata.

Rank 0 prints ``torch mesh check: N checks OK``; any difference raises.
"""

import itertools
import logging
import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29564")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as fc  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402

import strata.torch as st  # noqa: E402

# DTensor warns that redistributing over several mesh dimensions takes one collective per
# dimension: what this check does on purpose.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
checks = 0
BASE_PORT = int(os.environ["MASTER_PORT"])
# The names of torch 2.15 (the older ones are deprecated there).
ALL_GATHER = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
REDUCE_SCATTER = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor


def ok(cond, what):
    global checks
    checks += 1
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def init(backend, k):
    """``init_process_group`` number ``k`` of this process, on its own store port: a
    store made again on the port just closed can refuse the ranks still leaving it."""
    os.environ["MASTER_PORT"] = str(BASE_PORT + k)
    dist.init_process_group(backend)


def cpu_served():
    return st.served().get("cpu", 0)


def mixed_strings():
    r = int(os.environ["RANK"])
    p = int(os.environ["WORLD_SIZE"])
    want = float(sum(range(p)))
    init("cpu:gloo,cuda:strata", 0)
    before = cpu_served()
    t = torch.full((4,), float(r))
    dist.all_reduce(t)
    ok(torch.equal(t, torch.full((4,), want)), "all_reduce under cpu:gloo,cuda:strata")
    xs = [torch.empty(2) for _ in range(p)]
    dist.all_gather(xs, torch.full((2,), float(r)))
    ok(torch.equal(torch.stack(xs)[:, 0], torch.arange(p, dtype=torch.float32)), "all_gather under cpu:gloo")
    dist.barrier()
    ok(cpu_served() == before, "cpu:gloo,cuda:strata: strata served a CPU call")
    if st.FORM in ("backend", "cpp"):  # per-device backends: torch holds gloo for CPU
        cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    else:
        cpu = dist.group.WORLD._others.get("cpu")
    ok(cpu is not None and "gloo" in type(cpu).__name__.lower(),
       f"cpu:gloo,cuda:strata: the CPU backend is {type(cpu).__name__}, not gloo")
    dist.destroy_process_group()
    init("cpu:strata,cuda:gloo", 1)
    before = cpu_served()
    t = torch.full((4,), float(r))
    dist.all_reduce(t)
    ok(torch.equal(t, torch.full((4,), want)), "all_reduce under cpu:strata,cuda:gloo")
    ok(cpu_served() == before + 1, "cpu:strata,cuda:gloo: strata did not serve the CPU call")
    dist.destroy_process_group()


def value(shape, salt):
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, dtype=torch.float32) * 7 + salt) % 13 - 6).reshape(shape)


def mesh_checks(shape):
    names = tuple(f"d{i}" for i in range(len(shape)))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    r = dist.get_rank()
    full = value((8, 12), len(shape))
    before = cpu_served()
    for pl in itertools.product([Replicate(), Shard(0), Shard(1)], repeat=len(shape)):
        d = distribute_tensor(full, mesh, list(pl))
        ok(torch.equal(d.full_tensor(), full), f"{shape} {pl}: full_tensor")
    # Partial (sum) -> Replicate: every rank contributes (rank+1) * ones.
    local = torch.ones(4, 6) * (r + 1)
    part = DTensor.from_local(local, mesh, [Partial()] * len(shape))
    rep = part.redistribute(mesh, [Replicate()] * len(shape))
    want = float(sum(range(1, dist.get_world_size() + 1)))
    ok(torch.equal(rep.to_local(), torch.full((4, 6), want)), f"{shape}: Partial -> Replicate")
    # Shard(0) -> Shard(1) on the last dimension: an all-to-all.
    s0 = distribute_tensor(full, mesh, [Replicate()] * (len(shape) - 1) + [Shard(0)])
    s1 = s0.redistribute(mesh, [Replicate()] * (len(shape) - 1) + [Shard(1)])
    ok(torch.equal(s1.full_tensor(), full), f"{shape}: Shard(0) -> Shard(1)")
    # A sharded matmul.
    a = distribute_tensor(full, mesh, [Shard(0)] + [Replicate()] * (len(shape) - 1))
    b = distribute_tensor(full.t().contiguous(), mesh, [Replicate()] * len(shape))
    ok(torch.allclose((a @ b).full_tensor(), full @ full.t()), f"{shape}: sharded matmul")
    # Functional collectives on each dimension's group.
    for i, name in enumerate(names):
        g = mesh[name].get_group()
        gr, gp = dist.get_rank(g), dist.get_world_size(g)
        ranks = dist.get_process_group_ranks(g)
        x = torch.full((gp * 3,), float(r))
        y = fc.all_reduce(x, "sum", g)
        ok(torch.equal(y, torch.full((gp * 3,), float(sum(ranks)))), f"{shape} dim {i}: fc.all_reduce")
        y = ALL_GATHER(torch.full((2,), float(r)), 0, g)
        ok(torch.equal(y, torch.tensor([float(q) for q in ranks for _ in range(2)])),
           f"{shape} dim {i}: fc.all_gather_single")
        y = REDUCE_SCATTER(x, "sum", 0, g)
        ok(torch.equal(y, torch.full((3,), float(sum(ranks)))), f"{shape} dim {i}: fc.reduce_scatter_single")
        src = torch.arange(gp, dtype=torch.float32) + 100 * gr
        y = fc.all_to_all_single(src, None, None, g)
        ok(torch.equal(y, torch.tensor([100.0 * q + gr for q in range(gp)])), f"{shape} dim {i}: fc.all_to_all_single")
    ok(cpu_served() > before, f"{shape}: strata served none of the mesh's calls")


def main():
    mixed_strings()
    init("strata", 2)
    p = dist.get_world_size()
    shapes = [(p,)]
    if p % 2 == 0 and p >= 4:
        shapes.append((2, p // 2))
    if p % 8 == 0:
        shapes.append((2, 2, p // 4))
    per_device = st.FORM in ("backend", "cpp")
    if per_device:
        for shape in shapes:
            mesh_checks(shape)
    dist.barrier()
    if dist.get_rank() == 0:
        note = "" if per_device else " (whole-group form: mixed strings only, no DTensor)"
        print(f"torch mesh check: {checks} checks OK on meshes {shapes}, strata as torch's {st.FORM}{note}")
    dist.destroy_process_group()


if __name__ == "__main__":
    from check_main import run

    run(main)
