#!/usr/bin/env python3
"""A collective loop on the mpi transport (not a pytest test). scripts/capi-test runs it
short, to completion (results checked, exit 0); scripts/fault-check runs it long while
one rank is frozen or killed mid-loop and the job must end non-zero within the
timeout + 15 s with the failed peer named. The StrataError is left uncaught, as in a
training script: the package's exit hook (strataFinalize) then aborts the MPI job.

    mpirun -np N python3 python/tests/mpi_fault_loop.py OP ALGO TOPOLOGY ITERS
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import strata  # noqa: E402

op, algo, topology, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
comm = strata.init_rank(size, strata.get_unique_id(), rank, transport="mpi",
                        topology=topology, algo=algo)
count = 1 << 16
send = (np.arange(count * size) % 7 + rank).astype(np.float32)
recv = np.empty(count * size, dtype=np.float32)
ready = os.environ.get("STRATA_FAULT_READY")  # created after the first collective
for it in range(iters):
    if op == "all-gather":
        comm.all_gather(send[:count], recv)
    elif op == "reduce-scatter":
        comm.reduce_scatter(send, recv[:count])
    elif op == "reduce-scatter-q":
        comm.reduce_scatter_quantized(send, recv[:count], bits=4)
    else:
        raise SystemExit(f"unknown op {op}")
    if it == 0 and ready:
        open(ready, "w").close()
# A run that was not interrupted checks its last result and exits 0 (the package's exit
# hook finalises MPI).
base = np.arange(count * size) % 7
if op == "all-gather":
    want = np.concatenate([(base[:count] + q) for q in range(size)]).astype(np.float32)
    assert np.array_equal(recv, want), "all-gather result wrong"
elif op == "reduce-scatter":
    want = (base[rank * count:(rank + 1) * count] * size + sum(range(size))).astype(np.float32)
    assert np.array_equal(recv[:count], want), "reduce-scatter result wrong"
comm.destroy()
if rank == 0:
    print(f"mpi_fault_loop: {op} {algo} np={size}: {iters} calls OK")
