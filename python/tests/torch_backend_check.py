"""Every torch.distributed call over backend ``strata`` equals the same call over
``gloo``: run under mpirun (CPU tensors, strata's mpi transport), e.g.::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/tests/torch_backend_check.py

Covers all-reduce (and coalesced), all_gather_into_tensor (and coalesced, and the list
form), reduce_scatter_tensor (and coalesced, and the list form), broadcast,
all_to_all_single (even and uneven splits), all_to_all, send/recv, barrier, async
handles, over the world and over sub-groups (the rows and the columns of a 2-D mesh),
for every dtype and reduce op (AVG included), on counts divisible by nothing. Rank 0
prints ``torch backend check: N calls equal`` and every rank exits 0; any difference
raises.
"""

import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata.torch  # noqa: E402,F401  (registers the backend)

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8, torch.bool, torch.complex64]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
calls = 0


def data(n, dtype, rank, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype in FLOATS:
        # Small integers in float: sums are exact in every order, so gloo == strata bitwise.
        return torch.randint(-4, 5, (n,), generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).to(dtype)
    if dtype.is_complex:
        re, im = torch.randint(-4, 5, (2, n), generator=g).float()
        return torch.complex(re, im).to(dtype)
    hi = 3 if dtype in (torch.int8, torch.uint8) else 50
    lo = 0 if dtype == torch.uint8 else -hi
    if dtype == torch.int64:
        # past 2^53 (float64 would round) and small enough that 8 ranks' sums fit
        return torch.randint(lo, hi, (n,), generator=g).to(dtype) + (1 << 58)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def same(a, b, what):
    global calls
    calls += 1
    if isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            same(x, y, what)
        calls -= len(a) - 1
        return
    if a.dtype in FLOATS and what.endswith("avg"):
        ok = torch.allclose(a.float(), b.float(), rtol=1e-2 if a.dtype != torch.float32 else 1e-6, atol=1e-2)
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: strata {a} != gloo {b}")


def ops_for(dtype):
    if dtype.is_complex:
        return [("sum", R.SUM)]
    ops = [("sum", R.SUM), ("max", R.MAX), ("min", R.MIN)]
    if dtype in FLOATS:
        ops += [("avg", R.AVG), ("premul", dist._make_nccl_premul_sum(0.5))]
    if dtype in (torch.float32, torch.float64, torch.bool):
        ops += [("prod", R.PRODUCT)]
    if dtype not in FLOATS:
        ops += [("band", R.BAND), ("bor", R.BOR), ("bxor", R.BXOR)]
    return ops


def gloo_op(name, op):
    # gloo has neither AVG nor PREMUL_SUM: SUM, then the same scaling.
    return R.SUM if name in ("avg", "premul") else op


def fix(name, t, p):
    if name == "avg":
        return (t.double() / p).to(t.dtype) if t.dtype in FLOATS else t
    if name == "premul":
        return t * 0.5
    return t


def check_group(sg, gg, tag, salt):
    r, p = dist.get_rank(sg), dist.get_world_size(sg)
    for dt in DTYPES:
        n = 7
        for name, op in ops_for(dt):
            # all_reduce (blocking and async), coalesced
            a, b = data(n, dt, r, salt), data(n, dt, r, salt)
            if name == "premul":
                b = b * 0.5
                gl = data(n, dt, r, salt) * 0.5
                dist.all_reduce(a, op=op, group=sg)
                dist.all_reduce(gl, op=R.SUM, group=gg)
                same(a, gl, f"{tag} all_reduce {dt} {name}")
            else:
                w = dist.all_reduce(a, op=op, group=sg, async_op=True)
                dist.all_reduce(b, op=gloo_op(name, op), group=gg)
                w.wait()
                same(a, fix(name, b, p), f"{tag} all_reduce {dt} {name}")
            if name in ("sum", "max"):
                xs = [data(k, dt, r, salt + k) for k in (3, 5)]
                ys = [x.clone() for x in xs]
                with dist._coalescing_manager(group=sg):
                    for x in xs:
                        dist.all_reduce(x, op=op, group=sg)
                for y in ys:
                    dist.all_reduce(y, op=op, group=gg)
                same(xs, ys, f"{tag} all_reduce coalesced {dt} {name}")
            # reduce_scatter_tensor
            if name != "premul":
                inp = data(p * n, dt, r, salt + 1)
                o1, o2 = torch.empty(n, dtype=dt), torch.empty(n, dtype=dt)
                dist.reduce_scatter_tensor(o1, inp, op=op, group=sg)
                if dt in (torch.float16, torch.bfloat16) and name != "avg":
                    # gloo's reduce_scatter_tensor lacks these: all_reduce, then take the chunk.
                    full = inp.clone()
                    dist.all_reduce(full, op=gloo_op(name, op), group=gg)
                    o2 = full[r * n:(r + 1) * n].clone()
                elif dt in (torch.float16, torch.bfloat16):
                    full = inp.clone()
                    dist.all_reduce(full, op=R.SUM, group=gg)
                    o2 = full[r * n:(r + 1) * n].clone()
                else:
                    dist.reduce_scatter_tensor(o2, inp.clone(), op=gloo_op(name, op), group=gg)
                same(o1, fix(name, o2, p), f"{tag} reduce_scatter_tensor {dt} {name}")
        # all_gather_into_tensor, the list form, coalesced
        x = data(n, dt, r, salt + 2)
        o1, o2 = torch.empty(p * n, dtype=dt), torch.empty(p * n, dtype=dt)
        dist.all_gather_into_tensor(o1, x, group=sg)
        dist.all_gather_into_tensor(o2, x, group=gg)
        same(o1, o2, f"{tag} all_gather_into_tensor {dt}")
        l1 = [torch.empty(n, dtype=dt) for _ in range(p)]
        l2 = [torch.empty(n, dtype=dt) for _ in range(p)]
        dist.all_gather(l1, x, group=sg)
        dist.all_gather(l2, x, group=gg)
        same(l1, l2, f"{tag} all_gather list {dt}")
        ins = [data(k, dt, r, salt + k) for k in (2, 9)]
        outs = [torch.empty(p * k, dtype=dt) for k in (2, 9)]
        with dist._coalescing_manager(group=sg):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=sg)
        for o, i in zip(outs, ins):
            ref = torch.empty_like(o)
            dist.all_gather_into_tensor(ref, i, group=gg)
            same(o, ref, f"{tag} all_gather coalesced {dt}")
        # broadcast from the last rank
        b1, b2 = data(n, dt, r, salt + 3), data(n, dt, r, salt + 3)
        dist.broadcast(b1, group_src=p - 1, group=sg)
        dist.broadcast(b2, group_src=p - 1, group=gg)
        same(b1, b2, f"{tag} broadcast {dt}")
        # all_to_all_single, even and uneven
        a_in = data(p * 3, dt, r, salt + 4)
        a1, a2 = torch.empty_like(a_in), torch.empty_like(a_in)
        dist.all_to_all_single(a1, a_in, group=sg)
        dist.all_to_all_single(a2, a_in, group=gg)
        same(a1, a2, f"{tag} all_to_all_single {dt}")
        ins_s = [(r + j) % 3 + 1 for j in range(p)]
        outs_s = [(j + r) % 3 + 1 for j in range(p)]
        u_in = data(sum(ins_s), dt, r, salt + 5)
        u1, u2 = torch.empty(sum(outs_s), dtype=dt), torch.empty(sum(outs_s), dtype=dt)
        dist.all_to_all_single(u1, u_in, outs_s, ins_s, group=sg)
        dist.all_to_all_single(u2, u_in, outs_s, ins_s, group=gg)
        same(u1, u2, f"{tag} all_to_all_single uneven {dt}")
    # reduce_scatter list form (float32), all_to_all list form, send/recv ring, int64 moves
    r_in = [data(4, torch.float32, r, salt + 6 + j) for j in range(p)]
    s1, s2 = torch.empty(4), torch.empty(4)
    dist.reduce_scatter(s1, r_in, group=sg)
    dist.reduce_scatter(s2, [t.clone() for t in r_in], group=gg)
    same(s1, s2, f"{tag} reduce_scatter list")
    l_in = [data(3, torch.float32, r, salt + 7 + j) for j in range(p)]
    l1 = [torch.empty(3) for _ in range(p)]
    dist.all_to_all(l1, l_in, group=sg)
    # Rank j's tensor for this rank (gloo's list all_to_all is missing before torch 2.15).
    same(l1, [data(3, torch.float32, j, salt + 7 + r) for j in range(p)], f"{tag} all_to_all list")
    big = torch.arange(5, dtype=torch.int64) + 100 * r
    g1, g2 = torch.empty(5 * p, dtype=torch.int64), torch.empty(5 * p, dtype=torch.int64)
    dist.all_gather_into_tensor(g1, big, group=sg)
    dist.all_gather_into_tensor(g2, big, group=gg)
    same(g1, g2, f"{tag} all_gather int64")
    if p > 1:
        nxt, prv = (r + 1) % p, (r - 1) % p
        msg = torch.full((6,), float(r))
        got = torch.empty(6)
        reqs = [dist.isend(msg, group=sg, group_dst=nxt), dist.irecv(got, group=sg, group_src=prv)]
        for q in reqs:
            q.wait()
        same(got, torch.full((6,), float(prv)), f"{tag} send/recv ring")
    # gather / scatter / reduce to and from the last rank, every dtype for gather
    root = p - 1
    for dt in [d for d in DTYPES if not d.is_complex]:  # gloo's gather has no complex
        x = data(5, dt, r, salt + 8)
        g1 = [torch.empty(5, dtype=dt) for _ in range(p)] if r == root else None
        g2 = [torch.empty(5, dtype=dt) for _ in range(p)] if r == root else None
        dist.gather(x, g1, group_dst=root, group=sg)
        dist.gather(x, g2, group_dst=root, group=gg)
        if r == root:
            same(g1, g2, f"{tag} gather {dt}")
        src = [data(4, dt, r, salt + 9 + j) for j in range(p)] if r == root else None
        s1, s2 = torch.empty(4, dtype=dt), torch.empty(4, dtype=dt)
        dist.scatter(s1, src, group_src=root, group=sg)
        dist.scatter(s2, [t.clone() for t in src] if src else None, group_src=root, group=gg)
        same(s1, s2, f"{tag} scatter {dt}")
        for name, op in ops_for(dt):
            if name in ("avg", "premul"):
                continue
            x1, x2 = data(11, dt, r, salt + 10), data(11, dt, r, salt + 10)
            before = x1.clone()
            dist.reduce(x1, dst=dist.get_global_rank(sg, root) if sg != dist.group.WORLD else root,
                        op=op, group=sg)
            dist.reduce(x2, dst=dist.get_global_rank(gg, root) if gg != dist.group.WORLD else root,
                        op=op, group=gg)
            same(x1, x2 if r == root else before, f"{tag} reduce {dt} {name}")
    # object collectives, batch_isend_irecv
    objs = [None] * p
    dist.all_gather_object(objs, {"rank": r, "tag": tag}, group=sg)
    same(torch.tensor([o["rank"] for o in objs]), torch.arange(p), f"{tag} all_gather_object")
    lst = [f"from {r}", r * 10] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, group_src=0, group=sg)
    same(torch.tensor([lst[1]]), torch.tensor([0]), f"{tag} broadcast_object_list")
    if p > 1:
        nxt, prv = (r + 1) % p, (r - 1) % p
        got = torch.empty(3, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, torch.full((3,), r, dtype=torch.int64), group=sg, group_peer=nxt),
               dist.P2POp(dist.irecv, got, group=sg, group_peer=prv)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        same(got, torch.full((3,), prv, dtype=torch.int64), f"{tag} batch_isend_irecv")
    dist.barrier(group=sg)
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bool), op=R.AVG, group=sg)
    except RuntimeError as e:
        if "strata backend: allreduce: AVG on bool" not in str(e):
            raise
    else:
        raise AssertionError("AVG on bool was accepted")


def main():
    dist.init_process_group("strata")
    world_gloo = dist.new_group(backend="gloo")
    p, r = dist.get_world_size(), dist.get_rank()
    check_group(dist.group.WORLD, world_gloo, "world", 1)
    if p % 2 == 0 and p >= 4:
        half = p // 2
        rows = [list(range(0, half)), list(range(half, p))]
        cols = [[i, i + half] for i in range(half)]
        for name, sets in (("row", rows), ("col", cols)):
            mine_s = mine_g = None
            for s in sets:
                gs = dist.new_group(s, backend="strata")
                gg = dist.new_group(s, backend="gloo")
                if r in s:
                    mine_s, mine_g = gs, gg
            check_group(mine_s, mine_g, name, 2 if name == "row" else 3)
    dist.barrier()
    how = strata.torch.FORM
    if how == "cpp":
        # The C++ backend ran every call: the common ones directly, the rest (bool,
        # complex and bitwise reductions, uneven all-to-all, gather, scatter, reduce and
        # send/recv) from its Python half's plans.
        served = strata.torch.served()
        native = served["cpp"] - served["planned"]
        assert native > calls // 3, f"the C++ backend ran only {native} of {calls} calls directly"
        how += f", {served['cpp']} calls run in C++, {served['planned']} of them from plans"
    if r == 0:
        print(f"torch backend check: {calls} calls equal (np={p}, strata as torch's {how})")
    dist.destroy_process_group()


if __name__ == "__main__":
    from check_main import run

    run(main)
