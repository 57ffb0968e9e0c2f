#!/usr/bin/env python3
"""All-gather and reduce-scatter on an in-process world of 8 ranks (2 nodes x 4), each
rank driven by its own thread, through the C ABI (ctypes).

Run from the repository root after `cargo build --release` (or set STRATA_LIB):

    python3 python/examples/allgather.py

Each rank contributes 4 float32 values (rank*10 + i). The all-gather leaves all 32 values,
rank-major, on every rank; the in-place reduce-scatter (NCCL's layout: the receive
buffer is the rank's own block of the send buffer) then leaves on rank r the sum over
ranks of block r. With `algo="hier"` strata runs MiCS' hierarchical algorithm on the
nodes:2x4 topology.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import strata  # noqa: E402

NRANKS, COUNT = 8, 4


def rank_main(comm: strata.Comm):
    r, n = comm.rank, comm.size
    send = (r * 10 + np.arange(COUNT)).astype(np.float32)
    gathered = np.empty(n * COUNT, dtype=np.float32)
    comm.all_gather(send, gathered)  # blocks until `gathered` holds everyone's data

    # In-place reduce-scatter: recv is this rank's block of the send buffer.
    buf = gathered.copy()
    mine = buf[r * COUNT : (r + 1) * COUNT]
    comm.reduce_scatter(buf, mine, op="sum")
    return r, gathered, mine.copy()


def main():
    print(f"library: {os.path.relpath(strata.library_path())} (version code {strata.version()})")
    comms = strata.init_local(NRANKS, "nodes:2x4", algo="hier")
    try:
        with ThreadPoolExecutor(NRANKS) as pool:
            results = list(pool.map(rank_main, comms))
    finally:
        for c in comms:
            c.destroy()
    r0 = results[0][1]
    print(f"all-gather on every rank ({r0.size} values, rank-major):")
    print("  " + " ".join(f"{v:g}" for v in r0))
    assert all(np.array_equal(g, r0) for _, g, _ in results)
    print("in-place reduce-scatter (sum over 8 ranks of block r):")
    for r, _, mine in results:
        print(f"  rank {r}: {mine}")
        assert np.array_equal(mine, NRANKS * r0[r * COUNT : (r + 1) * COUNT])
    try:
        comms[0].all_reduce(np.zeros(1, np.float32))
    except strata.StrataError as e:
        print(f"after destroy: StrataError code {e.code}: {e.message}")


if __name__ == "__main__":
    main()
