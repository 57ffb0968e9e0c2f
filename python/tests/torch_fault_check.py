"""A failed collective raises (issue 49): under mpirun, 2 ranks, ``STRATA_TIMEOUT=2``::

    STRATA_TIMEOUT=6 mpirun -np 2 python3 python/tests/torch_fault_check.py

First a peer's abort: on a group of both ranks, rank 1 aborts the group
(``ProcessGroup.abort()``, as a failing rank's handler would) instead of joining rank 0's
``async_op=True`` all-reduce, whose ``wait()`` must raise ``DistBackendError`` (strata's
abort fails the calls in flight here and on the peers); rank 1's next call on the
aborted group raises at once. Then a frozen peer on the default group:
rank 1 stops taking part after a first all-reduce (it sleeps, as a frozen peer would).
Rank 0's next all-reduce, ``async_op=True``, must raise from ``wait()`` within a few
timeouts, as a ``torch.distributed.DistBackendError`` naming strata, and the call after it
must raise at once (the communicator was aborted), as ProcessGroupNCCL does. Rank 0
prints ``torch fault check: OK ...``; then both ranks leave without finalizing (the
job's MPI world is broken; mpirun's own exit status is not the check's).
"""

import os
import sys
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29606")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))
os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata.torch  # noqa: E402,F401  (registers the backend)


def main() -> int:
    timeout = float(os.environ.get("STRATA_TIMEOUT", "60"))
    dist.init_process_group("strata")
    x = torch.ones(256)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((256,), 2.0)), "the first all-reduce"
    aborted = peer_abort(timeout)
    if aborted is None:
        return 1
    if dist.get_rank() == 1:
        time.sleep(4 * timeout + 2)  # a frozen peer
        os._exit(0)
    t0 = time.monotonic()
    w = dist.all_reduce(x, async_op=True)
    try:
        w.wait()
    except dist.DistBackendError as e:
        took = time.monotonic() - t0
        first = str(e).splitlines()[0]
    else:
        print("FAILED: wait() returned for an all-reduce the peer never joined", file=sys.stderr)
        return 1
    assert "strata backend" in first, first
    assert took < 3 * timeout + 1, f"wait() raised only after {took:.1f} s"
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        after = str(e).splitlines()[0]
    else:
        print("FAILED: the call after the failure succeeded", file=sys.stderr)
        return 1
    print(f"torch fault check: OK (strata as torch's {strata.torch.FORM}): a peer's abort: {aborted}; a frozen "
          f"peer: wait() raised DistBackendError {took:.1f} s after the call: {first[:160]}; the next call raised: "
          f"{after[:120]}", flush=True)
    return 0


def peer_abort(timeout: float):
    """Rank 1 aborts a group of both ranks instead of joining rank 0's async all-reduce:
    rank 0's ``wait()`` raises; rank 1's next call on the group raises. Rank 0 returns
    what it saw (``None``: failed); both ranks meet on the default group afterwards."""
    g = dist.new_group(backend="strata")
    y = torch.ones(64)
    dist.all_reduce(y, group=g)  # the group's communicator made on both ranks
    seen = ""
    if dist.get_rank() == 1:
        g.abort()
        try:
            dist.all_reduce(torch.ones(4), group=g)
        except RuntimeError as e:
            seen = str(e).splitlines()[0]
        else:
            print("FAILED: a call on the aborted group succeeded", file=sys.stderr)
    else:
        t0 = time.monotonic()
        w = dist.all_reduce(y, group=g, async_op=True)
        try:
            w.wait()
        except dist.DistBackendError as e:
            seen = f"wait() raised {time.monotonic() - t0:.1f} s after the call: {str(e).splitlines()[0][:120]}"
        else:
            print("FAILED: wait() returned for an all-reduce whose peer aborted", file=sys.stderr)
        if time.monotonic() - t0 > 3 * timeout + 1:
            print(f"FAILED: wait() raised only after {time.monotonic() - t0:.1f} s", file=sys.stderr)
            seen = ""
    # Rank 1's part counts too: its result through the store (a collective here would
    # wait on rank 0, which may still be in its wait() for a timeout).
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 1:
        store.set("strata-abort-check", "1" if seen else "0")
        return seen or None
    ok = store.get("strata-abort-check") == b"1"
    if not ok:
        print("FAILED: rank 1's call on its aborted group did not raise", file=sys.stderr)
    return seen if ok and seen else None


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
