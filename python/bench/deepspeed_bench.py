"""DeepSpeed ZeRO-3 step time over strata vs gloo, under mpirun (CPU, fp32)::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/bench/deepspeed_bench.py

On the emulated cluster (docs/cluster.md; addresses and interface as in scripts/cluster-bench)::

    scripts/cluster up 2 4 --rate 100mbit
    MASTER_ADDR=10.231.0.1 GLOO_SOCKET_IFNAME=eth0 STRATA_BENCH_NET_IF=eth0 \\
      STRATA_LIB=$PWD/target/release/libstrata.so PYTHONPATH=$PWD/python \\
      scripts/cluster run target/torch-venv/bin/python python/bench/deepspeed_bench.py
    scripts/cluster down

Every rank runs two phases in one process, as python/tests/deepspeed_check.py does:
``deepspeed.init_distributed(dist_backend="gloo")``, train, ``destroy_process_group``,
then ``deepspeed.init_distributed(dist_backend="strata")`` and the same training. Training
is ZeRO-3 (DeepSpeed's default stage-3 settings: buckets, prefetch, parameter persistence
threshold) of torch_fsdp_check.py's transformer, sized by ``STRATA_BENCH_DS_MODEL``
(``vocab,d,layers,heads,ffn``; default ``1024,256,2,4,1024``, about 2.1 M parameters,
8.4 MB fp32), a torch SGD optimizer, micro-batch ``STRATA_BENCH_DS_BATCH`` (default 4)
sequences of 32 tokens per rank. Both phases use the same weights (seed 0) and the same
batches (a generator seeded 100 + rank, a fresh batch each step).

Timing: ``STRATA_BENCH_WARMUP`` (default 2) warm-up steps, then ``STRATA_BENCH_STEPS``
(default 5) timed steps; before each step a barrier on the backend under test; each rank
times its forward + backward + step; a step's time is the max over ranks (an all-reduce
MAX of the per-rank times after the steps); the table reports the median step. With
``STRATA_BENCH_NET_IF`` set (the emulated cluster's ``eth0``), each node's first rank
reads the interface's tx_bytes before and after the timed steps (barriers included): the
sum over nodes, per step, is the inter-node MB/step column.

The last loss is the mean over ranks of the last step's loss; strata's should equal
gloo's within 1e-5 relative. This is a benchmark: the difference is printed, not
asserted. A phase that raises is reported as failed (traceback on stderr) and the other
phase still runs. Rank 0 prints a markdown table.
"""

import logging
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29597")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
# DeepSpeed asserts LOCAL_RANK == OMPI_COMM_WORLD_LOCAL_RANK under Open MPI (engine.py).
os.environ["LOCAL_RANK"] = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
# The CPU accelerator's device_count(): the ranks per node (only qgZ / MiCS use it).
os.environ.setdefault("LOCAL_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# gloo gives up on a stuck peer after this many minutes (DeepSpeed's default: 10).
os.environ.setdefault("DEEPSPEED_TIMEOUT", "5")

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

import strata.torch  # noqa: E402,F401  (registers "strata"; joins the MPI world: every rank, now)
import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
import deepspeed.ops  # noqa: E402

# The CPU accelerator's TorchBackend JIT-builds the deepspeed_shm_comm op (C++, ninja) at
# init_distributed; it serves only inference_all_reduce. No compiled ops here.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.utils.logger.setLevel(logging.ERROR)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_fsdp_check import Net as _Net  # noqa: E402  (the FSDP check's small transformer)
from netbytes import node_sent  # noqa: E402

STEPS = int(os.environ.get("STRATA_BENCH_STEPS", "5"))
WARMUP = int(os.environ.get("STRATA_BENCH_WARMUP", "2"))
VOCAB, D_MODEL, LAYERS, HEADS, FFN = (int(x) for x in os.environ.get(
    "STRATA_BENCH_DS_MODEL", "1024,256,2,4,1024").split(","))
BATCH = int(os.environ.get("STRATA_BENCH_DS_BATCH", "4"))
SEQ = 32
LR = 0.1
BOUND = 1e-5
ZERO = {"stage": 3}


def log(msg):
    """Progress, from rank 0."""
    if int(os.environ["RANK"]) == 0:
        print(msg, flush=True)


def config():
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
            "wall_clock_breakdown": False, "zero_optimization": dict(ZERO)}


def train():
    """ZeRO-3 training on the current default group: (per-step max-over-ranks seconds of
    the timed steps, mean loss over ranks of the last step, parameter count, bytes all
    nodes sent during the timed steps)."""
    torch.manual_seed(0)
    model = _Net(vocab=VOCAB, d=D_MODEL, layers=LAYERS, heads=HEADS, ffn=FFN)
    nparams = sum(t.numel() for t in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config())
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    last = torch.zeros(1, dtype=torch.float64)

    def step():
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        y = torch.roll(x, 1, dims=1)
        loss = torch.nn.functional.cross_entropy(engine(x).reshape(-1, VOCAB), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        last.fill_(loss.item())

    try:
        for _ in range(WARMUP):
            dist.barrier()
            step()
        times = torch.zeros(STEPS, dtype=torch.float64)
        dist.barrier()
        sent0 = node_sent()
        for i in range(STEPS):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times[i] = time.perf_counter() - t0
        dist.barrier()
        sent = torch.tensor([float(node_sent() - sent0)], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        dist.all_reduce(sent)
        dist.all_reduce(last)
    finally:
        if hasattr(engine, "destroy"):
            engine.destroy()
    return times.tolist(), last.item() / dist.get_world_size(), nparams, sent.item()


def phase(backend, port):
    """Init DeepSpeed on ``backend``, train, tear down: a result dict (``error`` set on failure)."""
    os.environ["MASTER_PORT"] = str(port)
    t0 = time.perf_counter()
    out = {"backend": backend}
    try:
        deepspeed.init_distributed(dist_backend=backend)
        if tdist.get_backend() != backend:
            raise RuntimeError(f"default group's backend is {tdist.get_backend()}, not {backend}")
        out["times"], out["loss"], out["nparams"], out["sent"] = train()
    except Exception as e:  # noqa: BLE001  (a benchmark: reported, the other phase still runs)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        out["error"] = f"{type(e).__name__}: {msg}"[:200]
        print(f"rank {os.environ['RANK']}: {backend} phase failed:", file=sys.stderr)
        traceback.print_exc()
    finally:
        try:
            if tdist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        forget_groups()
    out["wall"] = time.perf_counter() - t0
    if "error" in out:
        log(f"  {backend}: FAILED ({out['error']}) after {out['wall']:.0f} s")
    else:
        log(f"  {backend}: median step {statistics.median(out['times']):.3f} s "
            f"(steps {' '.join(f'{t:.3f}' for t in out['times'])}), last loss {out['loss']:.6f}, "
            f"phase {out['wall']:.0f} s")
    return out


def forget_groups():
    """Drop DeepSpeed's cached groups after the process group is destroyed (DeepSpeed >=
    0.19.7 does it in destroy_process_group; older ones never do)."""
    from deepspeed.utils import groups
    if hasattr(groups, "_release_process_group_references"):
        return
    for name in ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP",
                 "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "mpu"):
        if hasattr(groups, name):
            setattr(groups, name, None)
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        if hasattr(groups, name):
            getattr(groups, name).clear()


def header(nparams):
    nodes = os.environ.get("STRATA_TOPOLOGY", "(detected)")
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return (f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, np={os.environ['WORLD_SIZE']}, "
            f"STRATA_TOPOLOGY={nodes}, cores={os.cpu_count()}, load avg {load}\n"
            f"ZeRO-3 {ZERO}, fp32 CPU, SGD lr {LR}; transformer vocab {VOCAB}, d {D_MODEL}, "
            f"{LAYERS} layers, {HEADS} heads, ffn {FFN}: {nparams / 1e6:.2f} M params "
            f"({nparams * 4 / 1e6:.1f} MB fp32); batch {BATCH}x{SEQ} per rank; "
            f"{STEPS} timed steps after {WARMUP} warm-up; step time = max over ranks "
            f"(barrier, then each rank times forward + backward + step), median over steps")


def print_table(results):
    net = os.environ.get("STRATA_BENCH_NET_IF")
    nparams = next((r["nparams"] for r in results if "nparams" in r), 0)
    print("\n" + header(nparams) + "\n")
    print("| variant | median step s | min..max s | step/gloo | last loss | loss - gloo (rel) |"
          + (" inter-node MB/step |" if net else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if net else ""))
    ref = results[0] if "error" not in results[0] else None
    for r in results:
        name = r["backend"]
        if "error" in r:
            print(f"| {name} | failed: {r['error'].replace('|', '/')} | | | | |" + (" |" if net else ""))
            continue
        med = statistics.median(r["times"])
        ratio = f"{med / statistics.median(ref['times']):.2f}" if ref else "-"
        if ref and r is not ref:
            d = r["loss"] - ref["loss"]
            rel = abs(d) / abs(ref["loss"]) if ref["loss"] else float("inf")
            diff = f"{d:+.2e} ({rel:.1e}{', within 1e-5' if rel <= BOUND else ', OVER 1e-5'})"
        else:
            diff = "-"
        print(f"| {name} | {med:.3f} | {min(r['times']):.3f}..{max(r['times']):.3f} | {ratio} "
              f"| {r['loss']:.6f} | {diff} |" + (f" {r['sent'] / STEPS / 1e6:.2f} |" if net else ""))
    if net:
        print(f"\ninter-node MB/step: bytes all nodes sent on {net} during the timed steps (with their "
              f"barriers), per step; 1e6 bytes")
    strata_r = results[-1]
    if ref and "error" not in strata_r:
        d = strata_r["loss"] - ref["loss"]
        print(f"\nloss difference strata - gloo: {d:+.3e} (relative {abs(d) / abs(ref['loss']):.2e}, "
              f"bound {BOUND:g})")


def main():
    base = int(os.environ["MASTER_PORT"])
    t0 = time.perf_counter()
    log(f"deepspeed bench: np={os.environ['WORLD_SIZE']}, gloo then strata")
    results = [phase("gloo", base), phase("strata", base + 1)]
    if int(os.environ["RANK"]) == 0:
        print_table(results)
        print(f"\nbench wall time {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
