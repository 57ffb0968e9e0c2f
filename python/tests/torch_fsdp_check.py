"""FSDP2 training over strata vs gloo, under mpirun (CPU, fp32)::

    STRATA_TOPOLOGY=nodes:2x2 mpirun -np 4 python3 python/tests/torch_fsdp_check.py

A small transformer is trained 20 steps with ``fully_shard`` (same seeds, same data) on a
1-D mesh and on a 2-D HSDP mesh (replicate x shard), each time with:

- ``gloo``: the mesh's groups are gloo groups (the reference);
- ``strata``: the mesh's groups are strata groups (backend ``strata``);
- ``hier``: gloo groups, with strata's ``hier`` all-gather and reduce-scatter put under
  FSDP (``strata.torch.set_custom_comms``);
- ``qwz8+qgz4``: gloo groups, strata's quantized all-gather (int8) and 2-hop
  reduce-scatter (int4) under FSDP.

Checks: the losses of ``strata`` and ``hier`` equal gloo's within 1e-5 relative at every
step; the quantized run's within the bound below. strata's traffic counters
(``strata.torch.traffic``) over the ``hier`` run show MiCS's hierarchical egress (§3.3):
in an all-gather of M bytes over a group of p ranks, k per node, on n nodes, each rank
sends its chunk c = M/p to the n-1 other nodes once, so (p-k)/p·M leaves each node, and
each reduce-scatter does the same (the stages reversed); on the HSDP mesh the shard
groups stay in one node (n = 1) and send nothing between nodes. The table shows every
run's inter-node bytes (the ``strata`` run's include its default algorithm's choice). Rank 0 prints a table and
``fsdp check OK``.

The bound for the quantized run: int8 blocks of 256 keep a parameter within 1/254 of its
block's largest magnitude and int4 blocks a gradient within 1/14 of its block's largest
(docs/quantization.md); the errors are unbiased across blocks and steps, so 20 SGD steps
(lr 0.5) move the loss by far less than the step-to-step change: 2% relative is the bound
(measured on 4 ranks: 7e-4 on the 1-D mesh, 5e-4 on HSDP).
"""

import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29571")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import strata.torch as st  # noqa: E402

STEPS = 20
QUANT_BOUND = 0.02


class Net(torch.nn.Module):
    """A small transformer (also the benchmark's and the GPU check's model)."""

    def __init__(self, vocab=64, d=32, layers=2, heads=4, ffn=64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def groups(backend, hsdp):
    p, r = dist.get_world_size(), dist.get_rank()
    if not hsdp:
        return DeviceMesh.from_group(dist.new_group(backend=backend), "cpu")
    half = p // 2
    mesh = torch.arange(p).view(2, half)
    shard = replicate = None
    for row in mesh.tolist():  # shard groups: the rows
        g = dist.new_group(row, backend=backend)
        if r in row:
            shard = g
    for col in mesh.t().tolist():  # replicate groups: the columns
        g = dist.new_group(col, backend=backend)
        if r in col:
            replicate = g
    return DeviceMesh.from_group([replicate, shard], "cpu", mesh=mesh,
                                 mesh_dim_names=("replicate", "shard"))


def ranks_per_node():
    """k of ``STRATA_TOPOLOGY=nodes:NxK`` (the check's topologies)."""
    spec = os.environ.get("STRATA_TOPOLOGY", "")
    if not spec.startswith("nodes:"):
        raise SystemExit("torch_fsdp_check: set STRATA_TOPOLOGY=nodes:NxK")
    return int(spec.split("x")[-1])


class Counted:
    """Adds to ``expected`` each call's nominal inter-node bytes of this rank under
    ``hier`` (MiCS §3.3): (n-1)·c, c the rank's chunk in bytes, n the group's nodes."""

    expected = 0

    def count(self, chunk, group):
        k = ranks_per_node()
        n = len({r // k for r in dist.get_process_group_ranks(group)})
        Counted.expected += (n - 1) * chunk.numel() * chunk.element_size()


class CountedAllGather(Counted, st.AllGather):
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.count(input_tensor, group)
        return super().__call__(output_tensor, input_tensor, group, async_op)


class CountedReduceScatter(Counted, st.ReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.count(output_tensor, group)
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def train(variant, hsdp):
    backend = "strata" if variant == "strata" else "gloo"
    mesh = groups(backend, hsdp)
    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if variant == "hier":
        st.set_custom_comms(model, CountedAllGather("hier"), CountedReduceScatter("hier"))
    elif variant == "quant":
        st.set_custom_comms(model, st.AllGather("qwz", bits=8), st.ReduceScatter("qgz", bits=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(STEPS):
        x = torch.randint(0, 64, (4, 12), generator=g)
        y = torch.roll(x, 1, dims=1)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the default group (gloo): the mean loss over ranks
        losses.append(total.item() / dist.get_world_size())
    return losses


def main():
    dist.init_process_group("cpu:gloo")
    p = dist.get_world_size()
    failures = []
    rows = []
    for hsdp in (False, True):
        if hsdp and (p < 4 or p % 2):
            continue
        ref = train("gloo", hsdp)
        mesh_name = "hsdp" if hsdp else "1d"
        for variant, bound in (("strata", 1e-5), ("hier", 1e-5), ("quant", QUANT_BOUND)):
            before, Counted.expected = st.traffic(), 0
            got = train(variant, hsdp)
            after = st.traffic()
            inter = after["inter_node"] - before["inter_node"]
            egress = after["max_node_egress"] - before["max_node_egress"]
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
            rows.append((mesh_name, variant, ref[0], ref[-1], got[-1], worst, bound, inter, egress))
            if worst > bound:
                failures.append(f"{mesh_name} {variant}: worst relative loss difference {worst:.3g} > {bound}")
            if variant == "hier":
                want = torch.tensor([Counted.expected], dtype=torch.int64)
                dist.all_reduce(want)
                nodes = p // ranks_per_node()
                if inter != want.item() or egress * nodes != inter:
                    failures.append(f"{mesh_name} hier: inter-node bytes {inter} (max node egress {egress}), "
                                    f"MiCS's closed form {want.item()} ({want.item() // nodes} per node)")
    if dist.get_rank() == 0:
        print(f"{'mesh':5} {'variant':7} {'loss0':>8} {'gloo20':>8} {'this20':>8} {'worst rel':>10} {'bound':>6}"
              f" {'inter_node B':>12} {'node_egress B':>13}")
        for m, v, l0, lr, lg, w, b, i, e in rows:
            print(f"{m:5} {v:7} {l0:8.5f} {lr:8.5f} {lg:8.5f} {w:10.2e} {b:6.0e} {i:12d} {e:13d}")
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        raise AssertionError("; ".join(failures))
    if int(os.environ["RANK"]) == 0:
        print(f"fsdp check OK (np={p})")


if __name__ == "__main__":
    from check_main import run

    run(main)
