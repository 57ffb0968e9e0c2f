"""strata vs gloo as torch.distributed backends on CPU tensors, under mpirun::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/bench/torch_bench.py

(``bash scripts/torch-bench`` sets up the environment and runs this.) Two parts, one run:

(a) ``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor`` (fp32, SUM) with
    the large buffer (all-gather's output, reduce-scatter's input) of each size in
    ``STRATA_BENCH_SIZES`` MiB, on a gloo group, a strata group (backend ``strata``,
    default algorithm), and strata's ``hier`` algorithm. The backend takes no per-group
    algorithm, so ``hier`` is strata's FSDP custom comm objects called directly on the
    gloo group (``strata.torch.AllGather("hier")(out, inp, group)``: a strata
    communicator of that group's ranks whose default algorithm is ``hier``).
(b) FSDP2 (``fully_shard`` on a 1-D mesh of all ranks) step time of a small transformer
    with gloo groups, strata groups, gloo groups with strata's ``hier`` custom comms, and
    gloo groups with strata's quantized custom comms (qwz int8 all-gather, qgz int4
    reduce-scatter), and gloo groups with ``hier`` all-gather + qgz int4 reduce-scatter
    (the hierarchy for the weights, ZeRO++'s quantized 2-hop reduce-scatter for the
    gradients).

Timing: before each iteration (or step) a barrier on the default (gloo) group; each rank
times its call (until it has returned complete); the iteration's time is the max over
ranks (an all-reduce MAX of the per-rank times); a row reports the median of those over
``STRATA_BENCH_ITERS`` iterations (``STRATA_BENCH_STEPS`` steps) after
``STRATA_BENCH_WARMUP`` (3 steps) of warm-up. Rank 0 prints markdown tables. With
``STRATA_BENCH_NET_IF`` set (the emulated cluster's ``eth0``, docs/cluster.md), part (b)
also reports the bytes all nodes sent on that interface per step.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29581")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import strata.torch as st  # noqa: E402  (joins the MPI world: every rank, now)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_fsdp_check as _fsdp_check  # noqa: E402
from netbytes import node_sent  # noqa: E402

SIZES_MIB = [int(s) for s in os.environ.get("STRATA_BENCH_SIZES", "1,4,16,64").split(",")]
ITERS = int(os.environ.get("STRATA_BENCH_ITERS", "20"))
WARMUP = int(os.environ.get("STRATA_BENCH_WARMUP", "2"))
STEPS = int(os.environ.get("STRATA_BENCH_STEPS", "10"))
STEP_WARMUP = 3
VOCAB, D_MODEL, LAYERS, HEADS, FFN, BATCH, SEQ = 1024, 256, 4, 4, 1024, 8, 32


def log(msg):
    """Progress, from rank 0."""
    if dist.get_rank() == 0:
        print(msg, flush=True)


def timed(fn, iters, warmup):
    """Median over ``iters`` iterations (after ``warmup``) of the max over ranks of
    ``fn()``'s time on each rank, in seconds; each iteration starts after a barrier."""
    for _ in range(warmup):
        fn()
    times = torch.zeros(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.tolist())


def collective_rows(gloo, strata):
    """Part (a): one row per (size, op): bytes of the large buffer and median seconds
    for gloo, strata and strata-hier."""
    p = dist.get_world_size()
    ag_hier, rs_hier = st.AllGather("hier"), st.ReduceScatter("hier")
    rows = []
    for mib in SIZES_MIB:
        per = mib * 2**20 // 4 // p  # fp32 elements per rank
        big = torch.randn(per * p)
        small = torch.randn(per)
        nbytes = big.numel() * 4
        ops = {
            "all_gather": (
                lambda: dist.all_gather_into_tensor(big, small, group=gloo),
                lambda: dist.all_gather_into_tensor(big, small, group=strata),
                lambda: ag_hier(big, small, gloo)),
            "reduce_scatter": (
                lambda: dist.reduce_scatter_tensor(small, big, op=dist.ReduceOp.SUM, group=gloo),
                lambda: dist.reduce_scatter_tensor(small, big, op=dist.ReduceOp.SUM, group=strata),
                lambda: rs_hier(small, big, gloo, dist.ReduceOp.SUM)),
        }
        for op, fns in ops.items():
            secs = [timed(f, ITERS, WARMUP) for f in fns]
            log(f"  {mib} MiB {op}: " + " ".join(f"{s * 1e3:.2f}" for s in secs) + " ms")
            rows.append((mib, op, nbytes, secs))
    return rows


def Net():
    """torch_fsdp_check.py's transformer, bigger."""
    return _fsdp_check.Net(vocab=VOCAB, d=D_MODEL, layers=LAYERS, heads=HEADS, ffn=FFN)


def fsdp_step_time(variant):
    """Part (b): (median step seconds, last step's mean loss, parameter count) of FSDP2
    training with ``variant``: gloo, strata, hier, quant or hier-qgz."""
    backend = "strata" if variant == "strata" else "gloo"
    mesh = DeviceMesh.from_group(dist.new_group(backend=backend), "cpu")
    torch.manual_seed(0)
    model = Net()
    nparams = sum(t.numel() for t in model.parameters())
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if variant == "hier":
        st.set_custom_comms(model, st.AllGather("hier"), st.ReduceScatter("hier"))
    elif variant == "quant":
        st.set_custom_comms(model, st.AllGather("qwz", bits=8), st.ReduceScatter("qgz", bits=4))
    elif variant == "hier-qgz":
        st.set_custom_comms(model, st.AllGather("hier"), st.ReduceScatter("qgz", bits=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    last = torch.zeros(1)

    def step():
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB),
                                                 torch.roll(x, 1, dims=1).reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        last.copy_(loss.detach())

    sent0 = node_sent()
    secs = timed(step, STEPS, STEP_WARMUP)
    sent = torch.tensor([float(node_sent() - sent0)], dtype=torch.float64)
    dist.all_reduce(sent)
    dist.all_reduce(last)
    return secs, last.item() / dist.get_world_size(), nparams, sent.item() / (STEPS + STEP_WARMUP)


def header():
    """One line: torch version, ranks, topology, cores, timing method."""
    return (f"torch {torch.__version__}, np={dist.get_world_size()}, "
            f"STRATA_TOPOLOGY={os.environ.get('STRATA_TOPOLOGY', '(detected)')}, "
            f"cores={os.cpu_count()}; time = median over iterations of the max over ranks "
            f"(barrier, then each rank times its call; all-reduce MAX of the per-rank times)")


def print_tables(coll, fsdp, nparams):
    """Rank 0: the markdown tables of parts (a) and (b)."""
    print(header())
    print(f"\n(a) collectives, fp32, SUM: {ITERS} iterations after {WARMUP} warm-up; "
          "size = the large buffer (all-gather output, reduce-scatter input); GB/s = 1e9 bytes/s\n")
    print("| size MiB | op | gloo ms | strata ms | strata-hier ms | gloo GB/s | strata GB/s "
          "| strata-hier GB/s | strata/gloo |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for mib, op, nbytes, (g, s, h) in coll:
        print(f"| {mib} | {op} | {g * 1e3:.2f} | {s * 1e3:.2f} | {h * 1e3:.2f} "
              f"| {nbytes / g / 1e9:.2f} | {nbytes / s / 1e9:.2f} | {nbytes / h / 1e9:.2f} "
              f"| {s / g:.2f} |")
    print(f"\n(b) FSDP2 step, 1-D mesh, transformer d={D_MODEL}, {LAYERS} layers, ffn {FFN}, "
          f"vocab {VOCAB}, {nparams / 1e6:.2f} M params (fp32), batch {BATCH}x{SEQ} per rank: "
          f"{STEPS} steps after {STEP_WARMUP} warm-up\n")
    net = os.environ.get("STRATA_BENCH_NET_IF")
    print("| variant | groups | FSDP comms | step ms | step/gloo | last loss |"
          + (" inter-node MB/step |" if net else ""))
    print("|---|---|---|---:|---:|---:|" + ("---:|" if net else ""))
    base = fsdp[0][1]
    for name, secs, loss, sent in fsdp:
        groups, comms = {"gloo": ("gloo", "gloo"), "strata": ("strata", "strata (auto)"),
                         "hier": ("gloo", "strata hier AG + RS"),
                         "quant": ("gloo", "strata qwz int8 AG + qgz int4 RS"),
                         "hier-qgz": ("gloo", "strata hier AG + qgz int4 RS")}[name]
        print(f"| {name} | {groups} | {comms} | {secs * 1e3:.1f} | {secs / base:.2f} | {loss:.4f} |"
              + (f" {sent / 1e6:.2f} |" if net else ""))
    if net:
        print(f"\ninter-node MB/step: bytes all nodes sent on {net} during the warm-up and timed "
              "steps (with their barriers), per step")


def main():
    """Run parts (a) and (b); rank 0 prints the tables."""
    dist.init_process_group("cpu:gloo")
    t0 = time.perf_counter()
    log(header())
    gloo, strata = dist.new_group(backend="gloo"), dist.new_group(backend="strata")
    log("(a) collectives: gloo strata strata-hier")
    coll = collective_rows(gloo, strata)
    log("(b) FSDP2 steps")
    fsdp, nparams = [], 0
    for variant in ("gloo", "strata", "hier", "quant", "hier-qgz"):
        secs, loss, nparams, sent = fsdp_step_time(variant)
        log(f"  {variant}: {secs * 1e3:.1f} ms/step")
        fsdp.append((variant, secs, loss, sent))
    if dist.get_rank() == 0:
        print_tables(coll, fsdp, nparams)
        print(f"\nbench wall time {time.perf_counter() - t0:.0f} s (after init)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
