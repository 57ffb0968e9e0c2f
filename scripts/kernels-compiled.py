#!/usr/bin/env python3
"""strata's quantization kernels written in a few lines of PyTorch, compiled with
torch.compile (default mode, fullgraph), timed the way strata-gpu-check times its own:
CUDA events around each call after warm-up (compilation excluded), the median of
--iters runs, random inputs, the same bytes read and written as strata's rows.

    python3 scripts/kernels-compiled.py --elems 67108864 --small 65536,262144 --iters 50

Prints one JSON object on stdout, {row name as strata-gpu-check names it: microseconds};
the rows at the --small sizes are named "ROW @N" (N elements). Diagnostics go to stderr.
A row that fails (or an element count its shape does not divide) is left out; rows not
started within --budget seconds are left out too. strata-gpu-check runs it (docs/gpu.md).

Before each timed batch a torch.cuda._sleep fills the stream's queue, so the times are
the GPU's (Python's dispatch time per call is hidden, as a training step hides it).
"""
import argparse
import json
import sys
import time

try:
    import torch
    import torch._dynamo

    DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
except Exception as e:  # noqa: BLE001 - reported by main(), which prints {}
    torch, NO_TORCH = None, e


def log(*a):
    print("kernels-compiled:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the kernels in PyTorch
def quant(x, bits):
    """Block absmax quantization of x (rows, block) in f32: (scales (rows,), codes)."""
    qmax = (1 << (bits - 1)) - 1
    amax = x.abs().amax(1, keepdim=True)
    scale = amax / qmax
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).clamp(-qmax, qmax)
    if bits == 8:
        return scale.squeeze(1), q.to(torch.int8)
    q = q.to(torch.int32)  # int4: two codes a byte, the even element in the low nibble
    return scale.squeeze(1), ((q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)).to(torch.uint8)


def dequant(codes, scales, bits):
    """Codes (..., block or block/2 bytes) and scales (...) -> f32 values (..., block)."""
    if bits == 8:
        v = codes.float()
    else:
        b = codes.to(torch.int32)
        v = torch.stack([((b & 15) ^ 8) - 8, ((b >> 4) ^ 8) - 8], -1).flatten(-2).float()
    return v * scales.unsqueeze(-1)


# ---------------------------------------------------------------- inputs of strata's shapes
def need(cond, what):
    if not cond:
        raise ValueError(what)


def packed(bits, block, *lead):
    """Random scales (lead) and codes (lead + (code bytes of a block,))."""
    cb = block if bits == 8 else block // 2
    scales = torch.rand(*lead, device="cuda") + 0.5
    if bits == 8:
        codes = torch.randint(-127, 128, (*lead, cb), dtype=torch.int8, device="cuda")
    else:
        codes = torch.randint(0, 256, (*lead, cb), dtype=torch.uint8, device="cuda")
    return scales, codes


def k_quantize(n, dt, bits, block):
    need(n % block == 0, f"{n} elements not a multiple of block {block}")
    x = torch.randn(n, device="cuda").to(DT[dt])
    return lambda x: quant(x.view(-1, block).float(), bits), (x,)


def k_swizzled(n, dt, bits, block):
    """qgZ's first hop, nodes 4 x devices 8 x 2 stages: chunk c = n/32 per rank; the
    output is stage-major, then local destination, then node (scales apart)."""
    c = n // 32
    need(c % (2 * block) == 0, f"half a chunk of {c} elements not a multiple of {block}")
    x = torch.randn(32 * c, device="cuda").to(DT[dt])

    def f(x):
        y = x.view(4, 8, 2, c // 2).permute(2, 1, 0, 3).reshape(-1, block)
        return quant(y.float(), bits)

    return f, (x,)


def k_dequantize(n, dt, bits, block):
    need(n % block == 0, f"{n} elements not a multiple of block {block}")
    s, q = packed(bits, block, n // block)
    t = DT[dt]
    return lambda q, s: dequant(q, s, bits).view(-1).to(t), (q, s)


def k_dequant_reduce(n, dt, bits, block):
    """qgZ's last step: 4 senders' slices of n/4 elements, summed, divided by 32."""
    m = n // 4
    need(m % block == 0, f"{m} elements not a multiple of block {block}")
    s, q = packed(bits, block, 4, m // block)
    t = DT[dt]
    return lambda q, s: (dequant(q, s, bits).sum(0) / 32).view(-1).to(t), (q, s)


def k_drq(n, bits, block):
    """qgZ's middle hop: 8 senders, 4 slices of n/32 elements each, summed, requantized."""
    m = n // 32
    need(m % block == 0, f"{m} elements not a multiple of block {block}")
    s, q = packed(bits, block, 8, 4 * (m // block))
    return lambda q, s: quant(dequant(q, s, bits).sum(0), bits), (q, s)


def rows(n, small, full):
    """(key, builder, args): strata-gpu-check's rows at n, then the small sizes. Without
    --full the rows a gpu-all run can afford to compile (about 2-4 s each): block 2048,
    f32 and bf16 (f16 costs what bf16 does), the quantizers' small sizes."""
    out = []
    for bits, block in ((8, 2048), (4, 2048), (8, 256)):
        if not full and block != 2048:
            continue
        for dt in ("f32", "bf16", "f16"):
            if not full and dt == "f16":
                continue
            sfx = f"{dt} q{bits} b{block}"
            out += [
                (f"quantize {sfx}", k_quantize, (n, dt, bits, block)),
                (f"dequantize {sfx}", k_dequantize, (n, dt, bits, block)),
                (f"dequant_reduce k4 avg {sfx}", k_dequant_reduce, (n, dt, bits, block)),
            ]
            if full or bits == 8:
                out.append((f"swizzled_quantize 4x8x2 {sfx}", k_swizzled, (n, dt, bits, block)))
        out.append((f"dequant_reduce_quant k8 x4 q{bits} b{block}", k_drq, (n, bits, block)))
    for m in small:
        out += [
            (f"quantize f32 q8 b2048 @{m}", k_quantize, (m, "f32", 8, 2048)),
            (f"quantize bf16 q8 b2048 @{m}", k_quantize, (m, "bf16", 8, 2048)),
        ]
        if full:
            out += [
                (f"dequantize bf16 q8 b2048 @{m}", k_dequantize, (m, "bf16", 8, 2048)),
                (f"dequant_reduce_quant k8 x4 q8 b2048 @{m}", k_drq, (m, 8, 2048)),
            ]
    return out


# ---------------------------------------------------------------- timing
def bench(fn, args, warm, iters):
    for _ in range(warm):
        fn(*args)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        fn(*args)
    host = (time.perf_counter() - t) / 3  # Python's time per call
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    try:  # keep the GPU busy while the calls are queued (about 2 GHz: generous)
        torch.cuda._sleep(int(min(iters * (2 * host + 20e-6), 0.5) * 2.5e9))
    except Exception:
        pass
    for a, b in ev:
        a.record()
        fn(*args)
        b.record()
    torch.cuda.synchronize()
    us = sorted(a.elapsed_time(b) * 1000.0 for a, b in ev)
    return us[len(us) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elems", type=int, default=1 << 26, help="elements of the main rows")
    p.add_argument("--small", default="", help="comma-separated element counts (rows 'ROW @N')")
    p.add_argument("--iters", "-n", type=int, default=50)
    p.add_argument("--warmup", "-w", type=int, default=5)
    p.add_argument("--budget", type=float, default=150.0, help="seconds: start no row after")
    p.add_argument("--only", default="", help="run the rows whose key contains this")
    p.add_argument("--full", action="store_true", help="every row (default: the affordable set)")
    a = p.parse_args()
    t0 = time.monotonic()
    out = {}
    try:
        if torch is None:
            raise NO_TORCH
        assert torch.cuda.is_available(), "torch sees no CUDA device"
        torch.manual_seed(0)
        torch.set_grad_enabled(False)
        log(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    except Exception as e:  # noqa: BLE001 - the parent check must not fail for it
        log(f"no torch with CUDA: {e!r}")
        print("{}")
        return
    small = [int(s) for s in a.small.split(",") if s.strip()]
    todo = [r for r in rows(a.elems, small, a.full) if a.only in r[0]]
    compile_s = 0.0
    for i, (key, build, args) in enumerate(todo):
        if time.monotonic() - t0 > a.budget:
            log(f"budget of {a.budget:.0f} s spent: {len(todo) - i} rows left out from {key!r} on")
            break
        try:
            torch._dynamo.reset()  # a fresh cache per row: no recompile limit to reach
            fn, inputs = build(*args)
            cfn = torch.compile(fn, fullgraph=True, dynamic=False)
            t = time.monotonic()
            cfn(*inputs)
            torch.cuda.synchronize()
            compile_s += time.monotonic() - t
            out[key] = round(bench(cfn, inputs, max(a.warmup, 1), max(a.iters, 1)), 2)
            del fn, cfn, inputs
        except Exception as e:  # noqa: BLE001 - one row's failure leaves the row out
            log(f"{key}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    log(f"{len(out)} of {len(todo)} rows in {time.monotonic() - t0:.1f} s (compiling {compile_s:.1f} s)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
