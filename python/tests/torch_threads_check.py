"""Several process groups driven from several Python threads at once, from their first
call on (issue 65): run under mpirun on CPU tensors, e.g.::

    MASTER_PORT=29610 mpirun -np 2 python3 python/tests/torch_threads_check.py
    STRATA_TOPOLOGY=nodes:2x2 MASTER_PORT=29611 mpirun -np 4 python3 python/tests/torch_threads_check.py

or on CUDA tensors at any world size (groups of one rank on one GPU: NCCL takes one rank
per GPU)::

    STRATA_THREADS_DEVICE=cuda python3 -m torch.distributed.run --standalone --nproc_per_node=1 \\
        python/tests/torch_threads_check.py

A job as users write it: ``init_process_group(BACKEND)``, then groups made with
``dist.new_group`` in the same order on every rank (three of the whole world, a
training, a metrics and a data group; at 4 ranks also the proper subsets [0, 1], [2, 3]
and [1, 2, 3], which non-members never use; at 2 ranks also the single-rank groups [0]
and [1]), one Python thread per group of which the rank is a member. No call runs on any
of them before the threads start, together, at a ``threading.Barrier``: each group's
first call races the others' (strata makes a group's communicator at its first call).
Each thread runs ITERS iterations of: a blocking all_reduce, an async all_reduce waited
by the thread itself, an async all_reduce handed to a waiter thread that waits on works
issued by every other thread (a queue), all_gather_into_tensor, reduce_scatter_tensor,
broadcast from a rotating root, all_reduce BAND on int32 and dist.reduce (which the C++
backend hands to its Python half), and a send/recv ring. Beside them, threads spin in
pure Python holding the GIL, and the main thread issues on the default group. Group g's
rank r contributes ``(g + 1) * 10000 + it * 100 + 10 * r + i % 7`` at element i of
iteration it, so a call paired with another group's, another iteration's or another
rank's data gives a wrong value; every value is checked exactly against its closed form.

It never hangs: ``faulthandler.dump_traceback_later(STRATA_THREADS_HANG_S, exit=True)``
(default 150 s) prints every thread's stack and exits 1. A wrong value prints
``FAILED: ...`` and exits 1 at once (mpirun then ends the job). Rank 0 prints ``torch
threads check: OK ...`` once every rank passed (their counts through the store).

Parameters (argv ``--backend B``, ``--device D``, ``--iters N`` or the environment):
``STRATA_THREADS_BACKEND`` (default ``strata``, or ``cpu:strata``, ``cuda:strata``;
``gloo`` or ``nccl`` prove the check itself, NCCL without the BAND),
``STRATA_THREADS_DEVICE`` (``cpu``, the default, or ``cuda``: each thread on a stream of
its own), ``STRATA_THREADS_ITERS`` (default 4), ``STRATA_THREADS_HANG_S``.
"""

import argparse
import faulthandler
import os
import queue
import sys
import threading
import time
import traceback

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29610")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

R = dist.ReduceOp
N = 1031  # elements per rank in every call: divisible by nothing


def options():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default=os.environ.get("STRATA_THREADS_BACKEND", "strata"))
    p.add_argument("--device", default=os.environ.get("STRATA_THREADS_DEVICE", "cpu"), choices=["cpu", "cuda"])
    p.add_argument("--iters", type=int, default=int(os.environ.get("STRATA_THREADS_ITERS", "4")))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("STRATA_THREADS_ROUNDS", "3")))
    p.add_argument("--hang-s", type=float, default=float(os.environ.get("STRATA_THREADS_HANG_S", "150")))
    return p.parse_args()


OPT = options()
# Armed before anything that could hang (the backend's import joins the MPI world).
faulthandler.dump_traceback_later(OPT.hang_s, exit=True)
if "strata" in OPT.backend:
    import strata.torch  # noqa: E402,F401  (registers the backend)

RANK = int(os.environ["RANK"])
_CHECKED = [0]
_COUNT_LOCK = threading.Lock()


def fail(msg):
    """A wrong value or an exception: say so and leave at once (a peer would otherwise
    wait on this rank's next call; mpirun ends the job on the non-zero exit)."""
    print(f"FAILED: rank {RANK}: {msg}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def contrib(g, r, it):
    """What group g's rank r contributes at iteration it (exact in float32)."""
    return (g + 1) * 10000 + it * 100 + 10 * r + torch.arange(N, dtype=torch.float32) % 7


def check(got, want, what):
    got = got.detach().to("cpu")
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = int(bad[0][0]) if len(bad) else -1
        fail(f"{what}: {len(bad)} of {got.numel()} values wrong; first at {i}: got "
             f"{got.flatten()[i].item() if i >= 0 else got} expected {want.flatten()[i].item() if i >= 0 else want}")
    with _COUNT_LOCK:
        _CHECKED[0] += got.numel()


class Group:
    def __init__(self, g, name, ranks, pg):
        self.g, self.name, self.ranks, self.pg = g, name, ranks, pg
        self.n = len(ranks)
        self.r = ranks.index(RANK) if RANK in ranks else -1


def group_specs(world):
    specs = [("train", None), ("metrics", None), ("data", None)]
    if world == 2:
        specs += [("solo0", [0]), ("solo1", [1])]
    elif world >= 4:
        specs += [("pair01", [0, 1]), ("pair23", [2, 3]), ("trio123", [1, 2, 3])]
    return specs


def make_groups(world, rnd):
    """Round rnd's groups, made in the same order on every rank (torch's rule), before
    any call on them; numbered on from the earlier rounds' (their values differ)."""
    specs = group_specs(world)
    groups = []
    for k, (name, ranks) in enumerate(specs):
        pg = dist.new_group(ranks)
        g = rnd * len(specs) + k
        groups.append(Group(g, f"{name}.{rnd}", list(range(world)) if ranks is None else ranks, pg))
    return groups


def run_group(grp, dev, iters, waiter_q, start):
    g, n, r, pg = grp.g, grp.n, grp.r, grp.pg
    rsum = 10 * n * (n - 1) // 2  # sum over the ranks of 10 * r
    tag = f"group {g} ({grp.name}, ranks {grp.ranks}) rank {r}"
    start.wait()
    for it in range(iters):
        mine = contrib(g, r, it)
        base = (g + 1) * 10000 + it * 100 + torch.arange(N, dtype=torch.float32) % 7
        total = n * base + rsum
        # blocking all_reduce
        x = mine.to(dev, copy=True)
        dist.all_reduce(x, group=pg)
        stream_sync(dev)
        check(x, total, f"{tag} it {it}: blocking all_reduce")
        # async all_reduce handed to the waiter thread (works issued here, waited there)
        y = (mine + 1).to(dev, copy=True)
        w = dist.all_reduce(y, group=pg, async_op=True)
        waiter_q.put((f"{tag} it {it}: async all_reduce waited by the waiter thread", w, y, total + n))
        # async all_reduce MAX, waited here
        z = mine.to(dev, copy=True)
        w = dist.all_reduce(z, op=R.MAX, group=pg, async_op=True)
        w.wait()
        stream_sync(dev)
        check(z, base + 10 * (n - 1), f"{tag} it {it}: async all_reduce MAX + wait")
        # all_gather_into_tensor
        out = torch.empty(n * N, dtype=torch.float32, device=dev)
        dist.all_gather_into_tensor(out, mine.to(dev, copy=True), group=pg)
        stream_sync(dev)
        check(out, torch.cat([contrib(g, j, it) for j in range(n)]), f"{tag} it {it}: all_gather_into_tensor")
        # reduce_scatter_tensor: chunk j of rank r's input is mine + j
        inp = torch.cat([mine + j for j in range(n)]).to(dev, copy=True)
        rs = torch.empty(N, dtype=torch.float32, device=dev)
        dist.reduce_scatter_tensor(rs, inp, group=pg)
        stream_sync(dev)
        check(rs, total + n * r, f"{tag} it {it}: reduce_scatter_tensor")
        # broadcast from a rotating root
        src = it % n
        b = mine.to(dev, copy=True)
        dist.broadcast(b, group_src=src, group=pg)
        stream_sync(dev)
        check(b, contrib(g, src, it), f"{tag} it {it}: broadcast from group rank {src}")
        # BAND on int32 (not a native call: the C++ backend hands it to its Python half;
        # NCCL has no BAND)
        if "nccl" not in OPT.backend:
            a_g = ((g + 1) << 16) | (it << 8)
            band = torch.full((17,), a_g | (1 << r) | (1 << 7), dtype=torch.int32, device=dev)
            dist.all_reduce(band, op=R.BAND, group=pg)
            stream_sync(dev)
            want = a_g | (1 << 7) | ((1 << r) if n == 1 else 0)
            check(band, torch.full((17,), want, dtype=torch.int32), f"{tag} it {it}: all_reduce BAND int32")
        # dist.reduce to a rotating root (the non-roots' tensors are not checked)
        root = (it + 1) % n
        red = mine.to(dev, copy=True)
        dist.reduce(red, group_dst=root, group=pg)
        stream_sync(dev)
        if r == root:
            check(red, total, f"{tag} it {it}: reduce to group rank {root}")
        # send/recv ring
        if n > 1:
            got = torch.empty(N, dtype=torch.float32, device=dev)
            # In one batch, as NCCL needs (and strata: a send past MPI's eager limit
            # returns once the peer received it, include/strata.h's strataSend).
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine.to(dev, copy=True), group=pg,
                                                      group_peer=(r + 1) % n),
                                           dist.P2POp(dist.irecv, got, group=pg, group_peer=(r - 1) % n)])
            for q in reqs:
                q.wait()
            stream_sync(dev)
            check(got, contrib(g, (r - 1) % n, it), f"{tag} it {it}: send/recv ring")


def stream_sync(dev):
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()


def waiter(dev, q):
    """Waits on the works other threads issued, then checks their tensors."""
    stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    with torch.cuda.stream(stream) if stream is not None else _null():
        while True:
            item = q.get()
            if item is None:
                return
            what, w, t, want = item
            w.wait()
            stream_sync(dev)
            check(t, want, what)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def thread_main(fn, *args, dev=None, stream=None):
    def body():
        try:
            if dev is not None and dev.type == "cuda":
                torch.cuda.set_device(dev)
                with torch.cuda.stream(stream):
                    fn(*args)
            else:
                fn(*args)
        except BaseException as e:  # noqa: BLE001
            traceback.print_exc()
            fail(f"{threading.current_thread().name}: {e!r}")
    return body


def spin(stop, start):
    """A pure-Python busy loop: holds the GIL but for the interpreter's switches."""
    start.wait()
    k = 0
    while not stop.is_set():
        for i in range(2000):
            k += i * i % 7


def main():
    t0 = time.monotonic()
    dev = torch.device("cpu")
    if OPT.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    dist.init_process_group(OPT.backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    waiter_q: "queue.Queue" = queue.Queue()
    stop = threading.Event()
    n_spin = 1
    spin_start = threading.Barrier(n_spin + 1)
    spinners = [threading.Thread(target=thread_main(spin, stop, spin_start), name=f"spin{i}", daemon=True)
                for i in range(n_spin)]
    wt = threading.Thread(target=thread_main(waiter, dev, waiter_q, dev=dev), name="waiter", daemon=True)
    for t in spinners + [wt]:
        t.start()
    spin_start.wait()
    n_groups = n_threads = 0
    # Each round: fresh groups whose first calls race (one more chance to pair two
    # groups' communicators wrongly), beside the default group's calls.
    for rnd in range(OPT.rounds):
        groups = make_groups(world, rnd)
        mine = [grp for grp in groups if grp.r >= 0]
        n_groups += len(groups)
        n_threads += len(mine)
        # The group threads and the main thread start together.
        start = threading.Barrier(len(mine) + 1)
        workers = [threading.Thread(target=thread_main(run_group, grp, dev, OPT.iters, waiter_q, start, dev=dev,
                                                       stream=torch.cuda.Stream(dev) if dev.type == "cuda" else None),
                                    name=f"group{grp.g}-{grp.name}", daemon=True) for grp in mine]
        for t in workers:
            t.start()
        start.wait()
        # The main thread on the default group meanwhile (its own values: g past every
        # round's groups).
        gm, rsum = OPT.rounds * len(group_specs(world)) + rnd, 10 * world * (world - 1) // 2
        pending = []
        for it in range(OPT.iters):
            base = (gm + 1) * 10000 + it * 100 + torch.arange(N, dtype=torch.float32) % 7
            x = contrib(gm, rank, it).to(dev, copy=True)
            dist.all_reduce(x)
            stream_sync(dev)
            check(x, world * base + rsum, f"round {rnd}: default group it {it}: blocking all_reduce")
            y = contrib(gm, rank, it).to(dev, copy=True)
            pending.append((it, dist.all_reduce(y, async_op=True), y, world * base + rsum))
            out = torch.empty(world * N, dtype=torch.float32, device=dev)
            dist.all_gather_into_tensor(out, contrib(gm, rank, it).to(dev, copy=True))
            stream_sync(dev)
            check(out, torch.cat([contrib(gm, j, it) for j in range(world)]),
                  f"round {rnd}: default group it {it}: all_gather_into_tensor")
        for it, w, y, want in pending:
            w.wait()
            stream_sync(dev)
            check(y, want, f"round {rnd}: default group it {it}: async all_reduce waited after the loop")
        for t in workers:
            t.join()
    waiter_q.put(None)
    wt.join()
    stop.set()
    for t in spinners:
        t.join()
    took = time.monotonic() - t0
    # Every rank's verdict through the store (a wrong value exits before this).
    store = dist.distributed_c10d._get_default_store()
    store.set(f"strata-threads-check-{rank}", str(_CHECKED[0]))
    if rank == 0:
        total = sum(int(store.get(f"strata-threads-check-{j}")) for j in range(world))
        form = getattr(sys.modules.get("strata.torch"), "FORM", "-") if "strata" in OPT.backend else "-"
        print(f"torch threads check: OK (np={world}, backend {OPT.backend}, form {form}, {dev.type} tensors): "
              f"{OPT.rounds} rounds of {n_groups // OPT.rounds} new groups, {n_threads} group threads on rank 0 + "
              f"a waiter + {n_spin} spinning + the main thread, {OPT.iters} iterations each, {total} values exact, "
              f"{took:.1f} s", flush=True)
    dist.barrier()
    faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(60, exit=True)  # the teardown must not hang either
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        fail(repr(e))
