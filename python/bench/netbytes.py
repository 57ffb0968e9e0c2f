"""Bytes a node sent on the emulated cluster's link, for the benchmarks in this folder."""

import os


def node_sent():
    """Bytes this node has sent on ``STRATA_BENCH_NET_IF`` (the emulated cluster's inter-node
    link, docs/cluster.md), read by the node's first rank; 0 elsewhere or when unset."""
    nic = os.environ.get("STRATA_BENCH_NET_IF")
    if not nic or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0") != "0":
        return 0
    with open(f"/sys/class/net/{nic}/statistics/tx_bytes") as f:
        return int(f.read())
