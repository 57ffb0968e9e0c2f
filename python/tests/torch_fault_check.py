"""A failed collective raises (issue 49): under mpirun, 2 ranks, ``STRATA_TIMEOUT=2``::

    STRATA_TIMEOUT=6 mpirun -np 2 python3 python/tests/torch_fault_check.py

First a slow peer (issue 65): rank 1 joins rank 0's ``async_op=True`` all-reduce on the
default group only 3 s late; ``work.wait(timeout=timedelta(seconds=0.5))`` must raise
(a ``RuntimeError``, e.g. ``DistBackendError``, naming the timeout, as ProcessGroupNCCL's
wait does) within 2 s but not before its 0.5 s, and the same work's ``wait()``
afterwards completes with the right sum once the peer came. Then the group's timeout (issue 65): on a group made with
``timeout=2 s``, rank 1 joins rank 0's blocking all-reduce 4 s late; rank 0's call must
raise ``DistBackendError`` naming the group's timeout after about 2 s. Then a peer's abort: on a
group of both ranks, rank 1 aborts the group (``ProcessGroup.abort()``, as a failing
rank's handler would) instead of joining rank 0's ``async_op=True`` all-reduce, whose
``wait()`` must raise ``DistBackendError`` (strata's abort fails the calls in flight
here and on the peers); then the next call on the group raises at once on both ranks,
at the call: ``async_op=True`` raises from the call itself, not from a Work that fails
later (issue 65), and on rank 1 a blocking call too. Then a frozen peer on the default
group: rank 1 stops taking part after a first all-reduce (it sleeps, as a frozen peer
would). Rank 0's next all-reduce, ``async_op=True``, must raise from ``wait()`` within a
few timeouts, as a ``torch.distributed.DistBackendError`` naming strata, and the call
after it must raise at once (the communicator was aborted), as ProcessGroupNCCL does: an
``async_op=True`` one at the call itself, then a blocking one. Every step runs even when
an earlier one failed (each failure is a ``FAILED: ...`` line on stderr). Rank 0 prints
``torch fault check: OK ...`` when all passed (``torch fault check: FAILED ...``
otherwise); then both ranks leave without finalizing (the job's MPI world is broken;
mpirun's own exit status is not the check's).
"""

import os
import re
import sys
import time
from datetime import timedelta

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
    slow = slow_peer()
    group_to = group_timeout()
    aborted = peer_abort(timeout)
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
        print(f"torch fault check: FAILED (strata as torch's {strata.torch.FORM}): a slow peer: {slow}; a peer's "
              f"abort: {aborted}; a frozen peer: wait() returned", flush=True)
        return 1
    ok = slow is not None and aborted is not None and group_to is not None
    if "strata backend" not in first:
        print(f"FAILED: the frozen peer's error does not name strata: {first}", file=sys.stderr)
        ok = False
    if took >= 3 * timeout + 1:
        print(f"FAILED: wait() raised only after {took:.1f} s", file=sys.stderr)
        ok = False
    # The next call, async_op=True: it raises at the call (the communicator was aborted),
    # it does not return a Work that raises later. Then a blocking one raises too.
    after = next_call_raises(None, "after a frozen peer")
    ok = ok and after is not None
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        after_blocking = str(e).splitlines()[0]
    else:
        print("FAILED: the blocking call after the failure succeeded", file=sys.stderr)
        return 1
    verdict = "OK" if ok else "FAILED (see the FAILED lines above)"
    print(f"torch fault check: {verdict} (strata as torch's {strata.torch.FORM}): a slow peer: {slow}; the group's "
          f"timeout: {group_to}; a peer's "
          f"abort: {aborted}; a frozen peer: wait() raised DistBackendError {took:.1f} s after the call: "
          f"{first[:160]}; the next call raised at the call: {after and after[:120]}; a blocking one: "
          f"{after_blocking[:80]}", flush=True)
    return 0 if ok else 1


def next_call_raises(group, what: str):
    """The next call on ``group`` after its communicator failed, ``async_op=True``, must
    raise from the call itself (an enqueue failure, as ProcessGroupNCCL raises it), not
    return a Work whose ``wait()`` raises. Returns the error's first line, or ``None``
    (printing why) when the call returned."""
    try:
        w = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    try:
        w.wait()
    except RuntimeError as e:
        later = f"its wait() raised: {str(e).splitlines()[0][:120]}"
    else:
        later = "its wait() returned"
    print(f"FAILED: {what}: the next call (async_op=True) returned a Work instead of raising at the call; "
          f"{later}", file=sys.stderr)
    return None


def slow_peer(delay: float = 3.0, limit: float = 0.5, within: float = 2.0):
    """Rank 1 joins rank 0's async all-reduce ``delay`` s late: rank 0's
    ``wait(timeout=limit)`` raises a RuntimeError naming the timeout within ``within``
    s, not before ``limit`` (a wait that refuses finite timeouts fails); then ``wait()``
    completes with the sum. Rank 0 returns what it saw (``None``: failed); rank 1's part
    (the sum) comes through the store."""
    rank = dist.get_rank()
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(torch.ones(1))  # the ranks leave this together
    store = dist.distributed_c10d._get_default_store()
    want = torch.full((1000,), 3.0)
    if rank == 1:
        time.sleep(delay)
        dist.all_reduce(x)
        store.set("strata-slow-peer-check", "1" if torch.equal(x, want) else "0")
        return "rank 1"
    t0 = time.monotonic()
    w = dist.all_reduce(x, async_op=True)
    ok = True
    try:
        w.wait(timeout=timedelta(seconds=limit))
    except RuntimeError as e:
        took = time.monotonic() - t0
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        seen = f"wait(timeout={limit} s) raised {type(e).__name__} {took:.1f} s after the call: {msg[:100]}"
        if took > within:
            print(f"FAILED: a slow peer: wait(timeout={limit} s) raised only {took:.1f} s after the call",
                  file=sys.stderr)
            ok = False
        if took < 0.8 * limit:  # e.g. "wait() with finite timeout not implemented"
            print(f"FAILED: a slow peer: wait(timeout={limit} s) raised {took:.2f} s after the call, before its "
                  f"timeout: {msg}", file=sys.stderr)
            ok = False
        if not re.search(r"tim(e|ed)[ _-]?out", str(e), re.IGNORECASE):
            print(f"FAILED: a slow peer: wait(timeout={limit} s) raised without naming the timeout: {msg}",
                  file=sys.stderr)
            ok = False
    else:
        took = time.monotonic() - t0
        print(f"FAILED: a slow peer: wait(timeout={limit} s) returned {took:.1f} s after the call (the peer came "
              f"{delay:.0f} s late) instead of raising", file=sys.stderr)
        ok = False
        seen = ""
    try:
        w.wait()
    except RuntimeError as e:
        print(f"FAILED: a slow peer: wait() after the timed-out wait raised: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return None
    if not torch.equal(x, want):
        print(f"FAILED: a slow peer: the all-reduce gave {x[:4].tolist()}, expected 3.0", file=sys.stderr)
        ok = False
    if store.get("strata-slow-peer-check") != b"1":
        print("FAILED: a slow peer: rank 1's all-reduce gave a wrong sum", file=sys.stderr)
        ok = False
    total = time.monotonic() - t0
    return f"{seen}; then wait() completed {total:.1f} s after the call with the sum" if ok else None


def group_timeout(limit: float = 2.0, delay: float = 4.0):
    """A group made with ``timeout=limit`` s (shorter than ``STRATA_TIMEOUT``): rank 1
    joins rank 0's blocking all-reduce ``delay`` s late, so rank 0's call must raise
    ``DistBackendError`` naming the group's timeout after about ``limit`` s (the
    backend's watchdog aborts the communicator), as ProcessGroupNCCL's watchdog does.
    Rank 0 returns what it saw (``None``: failed); rank 1's late call fails too."""
    g = dist.new_group(backend="strata", timeout=timedelta(seconds=limit))
    dist.all_reduce(torch.ones(4), group=g)  # both ranks reached the group
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 1:
        time.sleep(delay)
        try:
            dist.all_reduce(torch.ones(4), group=g)
        except RuntimeError:
            pass
        store.set("strata-group-timeout-check", "1")  # both go on from here together
        return "rank 1"
    t0 = time.monotonic()
    seen = None
    try:
        dist.all_reduce(torch.ones(4), group=g)
    except dist.DistBackendError as e:
        took = time.monotonic() - t0
        msg = str(e).splitlines()[0]
        if "group's timeout" not in msg:
            print(f"FAILED: the group's timeout: the error does not name it: {msg}", file=sys.stderr)
        elif not 0.8 * limit <= took <= limit + 1.5:
            print(f"FAILED: the group's timeout ({limit} s): the call raised after {took:.1f} s", file=sys.stderr)
        else:
            seen = f"a blocking call raised after {took:.1f} s: {msg[:110]}"
    else:
        print(f"FAILED: the group's timeout ({limit} s): the call returned after {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
    store.wait(["strata-group-timeout-check"])
    return seen


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
        # async_op=True raises at the call (not from a Work), then a blocking call too.
        first = next_call_raises(g, "a call on the aborted group")
        try:
            dist.all_reduce(torch.ones(4), group=g)
        except RuntimeError as e:
            seen = str(e).splitlines()[0] if first is not None else ""
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
        if seen:
            # The group's communicator failed here too: the next call, async_op=True,
            # raises at the call.
            nxt = next_call_raises(g, "rank 0's call on the group whose peer aborted")
            seen = f"{seen}; the next call raised at the call: {nxt[:80]}" if nxt is not None else ""
    # Rank 1's part counts too: its result through the store (a collective here would
    # wait on rank 0, which may still be in its wait() for a timeout).
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 1:
        store.set("strata-abort-check", "1" if seen else "0")
        return seen or None
    ok = store.get("strata-abort-check") == b"1"
    if not ok:
        print("FAILED: rank 1's calls on its aborted group did not raise (async_op=True at the call, "
              "then blocking)", file=sys.stderr)
    return seen if ok and seen else None


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
