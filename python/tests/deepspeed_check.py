"""DeepSpeed ZeRO training over strata vs gloo, under mpirun (CPU, fp32)::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/tests/deepspeed_check.py

Every rank runs two phases in one process: ``deepspeed.init_distributed(dist_backend="gloo")``,
every variant below, ``deepspeed.comm.destroy_process_group()``, then
``deepspeed.init_distributed(dist_backend="strata")`` and the same variants. A variant is a
small transformer (same seed, one fixed batch per rank) trained ``STEPS`` steps with
``deepspeed.initialize`` and a torch SGD optimizer, no compiled DeepSpeed op
(``DS_ACCELERATOR=cpu``; the CPU accelerator's shared-memory op is switched off):

- ``zero1``, ``zero2``, ``zero3``: ZeRO stages 1, 2, 3 (stage 3 with
  ``stage3_param_persistence_threshold: 0``, so every parameter is partitioned and gathered);
- ``zero3-init``: ZeRO-3 with the model built under ``deepspeed.zero.Init``;
- ``hpz``: ZeRO-3 + ZeRO++ hpZ (``zero_hpz_partition_size: 2``: the secondary partition
  within each of the 2 nodes);
- ``qwz``, ``qgz``: ZeRO-3 + ZeRO++ ``zero_quantized_weights`` / ``zero_quantized_gradients``;
- ``mics``: ZeRO-3 + MiCS (``mics_shard_size: 2``, model built under
  ``deepspeed.zero.MiCS_Init``) where the installed DeepSpeed has MiCS (<= 0.19.6; it works
  in <= 0.19.2);
- ``zero2-reduce``: ZeRO-2 with ``use_multi_rank_bucket_allreduce: false`` (``dist.reduce``).

``EXPECT`` holds each variant's outcome on the CPU: ``equal`` (both backends train;
strata's losses equal gloo's within 1e-5 relative at every step), ``both-fail`` (DeepSpeed
itself fails on the CPU, the same error on both backends), ``equal-zero3`` (MiCS: gloo
cannot run it; strata's losses equal gloo's ``zero3-init``). Any other outcome fails the
check. ``DS_CHECK_VARIANTS=a,b`` runs only those; ``DS_CHECK_DEBUG=1`` prints each
failure's traceback. Rank 0 prints a table, with the strata
ProcessGroup methods each variant called (``method@group size xcount``), and ``deepspeed
check OK``.
"""

import collections
import gc
import logging
import os
import sys

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29591")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
# DeepSpeed asserts LOCAL_RANK == OMPI_COMM_WORLD_LOCAL_RANK under Open MPI (engine.py).
os.environ["LOCAL_RANK"] = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
# The CPU accelerator's device_count() is LOCAL_SIZE, the ranks per "node" (MiCS and qgZ
# group by it); 2 ranks per node matches STRATA_TOPOLOGY=nodes:2x2.
os.environ.setdefault("LOCAL_SIZE", "2")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

import strata.torch as st  # noqa: E402  (registers "strata"; joins the MPI world)
import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
import deepspeed.ops  # noqa: E402

# The CPU accelerator's TorchBackend JIT-builds the deepspeed_shm_comm op (C++, ninja) at
# init_distributed; it serves only inference_all_reduce. No compiled ops here.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.utils.logger.setLevel(logging.ERROR)

STEPS = 10
BOUND = 1e-5
HAS_MICS = hasattr(deepspeed.zero, "MiCS_Init")
# MiCS in DeepSpeed 0.19.3-0.19.6 hangs on any backend (docs/deepspeed.md): not run there.
_V = tuple(int(x) for x in deepspeed.__version__.split("+")[0].split(".")[:3])
MICS_HANGS = HAS_MICS and (0, 19, 3) <= _V < (0, 19, 7)

Z3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 4000,
      "reduce_bucket_size": 3000}
VARIANTS = {
    "zero1": {"stage": 1, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000},
    "zero2": {"stage": 2, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000},
    "zero3": dict(Z3),
    "zero3-init": dict(Z3),
    "hpz": dict(Z3, zero_hpz_partition_size=2),
    "qwz": dict(Z3, zero_quantized_weights=True),
    "qgz": dict(Z3, zero_quantized_gradients=True),
    "mics": dict(Z3, mics_shard_size=2),
    "zero2-reduce": {"stage": 2, "reduce_bucket_size": 3000, "use_multi_rank_bucket_allreduce": False},
}
EXPECT = {
    "zero1": "equal", "zero2": "equal", "zero3": "equal", "zero3-init": "equal", "hpz": "equal",
    # ZeRO++'s quantizer is a CUDA op (QuantizerBuilder): the CPU accelerator has none.
    "qwz": "both-fail", "qgz": "both-fail",
    # MiCS was removed in DeepSpeed 0.19.7 (DeepSpeedConfigError on mics_shard_size).
    # MiCS (DeepSpeed <= 0.19.6) issues coalesced all-gathers, which gloo refuses
    # ("Backend gloo does not implement startCoalescing"): strata's MiCS is compared with
    # gloo's zero3-init (2-rank shards over 4 ranks: the same SGD from the same weights).
    "mics": "equal-zero3" if HAS_MICS else "both-fail",
    "zero2-reduce": "equal",
}
ONLY = [v for v in os.environ.get("DS_CHECK_VARIANTS", "").split(",") if v]

# Count the strata backend methods torch calls that reach Python (method@group size).
CALLS: collections.Counter = collections.Counter()
_METHODS = ["allreduce", "allreduce_coalesced", "all_gather_single", "_allgather_base", "allgather",
            "all_gather_single_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter_single",
            "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_single_coalesced",
            "reduce_scatter_tensor_coalesced", "broadcast", "all_to_all_single", "alltoall_base",
            "alltoall", "send", "recv", "barrier", "reduce"]


def _counted(name, fn):
    def call(self, *args, **kwargs):
        CALLS[f"{name}@{self.size()}"] += 1
        return fn(self, *args, **kwargs)
    return call


for _m in _METHODS:  # the Python half's methods: the calls it planned (or served, in the Python form)
    if _m in st.backend._Ops.__dict__:
        setattr(st.backend._Ops, _m, _counted(_m, st.backend._Ops.__dict__[_m]))


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fsdp_check import Net  # noqa: E402  (the FSDP check's small transformer)


def config(zero):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
            "zero_optimization": dict(zero)}


def train(variant):
    cfg = config(VARIANTS[variant])
    torch.manual_seed(0)
    if variant == "mics" and HAS_MICS:
        with deepspeed.zero.MiCS_Init(config_dict_or_path=cfg):
            model = Net()
    elif variant == "zero3-init":
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = Net()
    else:
        model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randint(0, 64, (4, 12), generator=g)  # one batch per rank: the loss falls
    y = torch.roll(x, 1, dims=1)
    losses = []
    try:
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(engine(x).reshape(-1, 64), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            total = loss.detach().clone()
            dist.all_reduce(total)  # the mean loss over ranks, on the backend under test
            losses.append(total.item() / dist.get_world_size())
    finally:
        if hasattr(engine, "destroy"):
            engine.destroy()
    return losses


def phase(backend, port):
    os.environ["MASTER_PORT"] = str(port)
    deepspeed.init_distributed(dist_backend=backend)
    assert tdist.get_backend() == backend, tdist.get_backend()
    out = {}
    for variant in VARIANTS:
        if ONLY and variant not in ONLY or variant == "mics" and MICS_HANGS:
            continue
        CALLS.clear()
        try:
            out[variant] = ("ok", train(variant), dict(CALLS))
        except Exception as e:  # noqa: BLE001  (recorded, judged against EXPECT)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            out[variant] = ("fail", f"{type(e).__name__}: {msg}"[:240], dict(CALLS))
            if os.environ.get("DS_CHECK_DEBUG"):
                import traceback
                traceback.print_exc()
        # DeepSpeed keeps the hpZ secondary group and qgZ's all-to-all groups in module globals
        # past the engine: drop them, or the next variant would use them too.
        forget_groups(world=False)
        gc.collect()
        tdist.barrier()
    dist.destroy_process_group()
    forget_groups(world=True)
    return out


def forget_groups(world):
    """Drop DeepSpeed's cached sub-groups (``world``: all of them, after the process group is
    destroyed). DeepSpeed >= 0.19.7 does it in destroy_process_group; older ones never do."""
    from deepspeed.utils import groups
    if world:
        if hasattr(groups, "_release_process_group_references"):
            return
        for name in ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP",
                     "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "mpu"):
            if hasattr(groups, name):
                setattr(groups, name, None)
        for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                     "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
            getattr(groups, name).clear()
        return
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    groups._ALL_TO_ALL_GROUP.clear()


def main():
    base = int(os.environ["MASTER_PORT"])
    ref = phase("gloo", base)
    got = phase("strata", base + 1)
    failures, rows = [], []
    for variant in ref:
        (rs, rv, _), (gs, gv, calls) = ref[variant], got[variant]
        if variant == "mics" and rs == "fail" and gs == "ok" and ref.get("zero3-init", ("",))[0] == "ok":
            # gloo cannot run MiCS (no startCoalescing); MiCS with 2-rank shards over 4 ranks is
            # the same SGD as ZeRO-3 from the same weights (built under zero.Init, as
            # MiCS_Init builds them): compare strata's MiCS with gloo's zero3-init.
            rv = ref["zero3-init"][1]
            worst = max(abs(a - b) / abs(b) for a, b in zip(gv, rv))
            outcome = "equal-zero3" if worst <= BOUND else f"differ {worst:.2e}"
            detail = (f"{rv[0]:.6f} {rv[-1]:.6f} {gv[-1]:.6f} {worst:.1e} (vs gloo zero3-init; gloo mics: "
                      f"{ref[variant][1]})")
        elif rs == "ok" and gs == "ok":
            worst = max(abs(a - b) / abs(b) for a, b in zip(gv, rv))
            outcome = "equal" if worst <= BOUND else f"differ {worst:.2e}"
            detail = f"{rv[0]:.6f} {rv[-1]:.6f} {gv[-1]:.6f} {worst:.1e}"
        elif rs == "fail" and gs == "fail":
            outcome = "both-fail" if rv.split(":")[0] == gv.split(":")[0] else "fail-differ"
            detail = f"gloo {rv} | strata {gv}" if outcome != "both-fail" else rv
            worst = None
        elif rs == "ok":
            outcome = "strata-refuses" if "strata backend:" in gv else "strata-fails"
            detail = gv
        else:
            outcome, detail = "gloo-fails", rv
        rows.append((variant, outcome, detail, calls))
        if outcome != EXPECT[variant]:
            failures.append(f"{variant}: {outcome} (expected {EXPECT[variant]}): {detail}")
    if int(os.environ["RANK"]) == 0:
        if MICS_HANGS:
            print(f"mics not run: DeepSpeed {deepspeed.__version__}'s MiCS hangs (0.19.3-0.19.6)")
        print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, np={os.environ['WORLD_SIZE']}, "
              f"{STEPS} steps; columns: gloo loss0 gloo loss{STEPS - 1} strata loss{STEPS - 1} worst rel")
        for variant, outcome, detail, calls in rows:
            print(f"{variant:13} {outcome:15} {detail}")
            if calls:
                print(f"{'':13} strata calls: " + ", ".join(f"{k} x{n}" for k, n in sorted(calls.items())))
    if failures:
        raise AssertionError("; ".join(failures))
    if st.FORM == "cpp" and not st.served().get("cpp"):
        raise AssertionError("the C++ backend ran none of DeepSpeed's calls")
    if int(os.environ["RANK"]) == 0:
        native = f", {st.served().get('cpp', 0)} calls run in C++" if st.FORM == "cpp" else ""
        print(f"deepspeed check OK (np={os.environ['WORLD_SIZE']}, strata as torch's {st.FORM}{native})")


if __name__ == "__main__":
    from check_main import run

    run(main)
