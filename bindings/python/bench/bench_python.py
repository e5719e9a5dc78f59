"""attnscope's Python package against torch in one process, 2 threads, as ratios.

    python bindings/python/bench/bench_python.py [--attnscope target/release/attnscope]

Prints a table: the B1 H8 L=S=2048 d64 f32 forward (attnscope.sdpa vs torch's SDPA, and vs
`attnscope bench sdpa` on the same shape when the binary is given), forward + backward through
the autograd function vs torch's, and the per-call time on a 1×1×8×8 input.
"""

import argparse
import json
import platform
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

import attnscope
from attnscope.torch import scaled_dot_product_attention as attnscope_autograd


def timed(fn, reps, warmup=0.25):
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnscope", help="the attnscope binary, for `bench sdpa` on the same shape")
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    attnscope.set_threads(2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g) for _ in range(3))
    rows = []

    ours = timed(lambda: attnscope.sdpa(q, k, v), args.reps)
    theirs = timed(lambda: F.scaled_dot_product_attention(q, k, v), args.reps)
    rows.append(("forward B1 H8 L=S=2048 d64 f32", ours, theirs, "torch SDPA"))
    if args.attnscope:
        out = subprocess.run([args.attnscope, "bench", "sdpa", "--seq", "2048", "--heads", "8",
                              "--head-dim", "64", "--threads", "2", "--reps", str(args.reps), "--json"],
                             check=True, capture_output=True, text=True).stdout
        cli = json.loads(out)
        cli_s = cli["ms"] / 1e3
        rows.append(("  the same from Python vs `attnscope bench sdpa`", ours, cli_s, "attnscope bench sdpa"))

    def train(fn):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        fn(*xs).sum().backward()

    ours = timed(lambda: train(attnscope_autograd), max(3, args.reps // 2))
    theirs = timed(lambda: train(F.scaled_dot_product_attention), max(3, args.reps // 2))
    rows.append(("forward + backward, autograd", ours, theirs, "torch SDPA"))

    tiny = torch.randn(1, 1, 8, 8, generator=g)
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        attnscope.sdpa(tiny, tiny, tiny)
    per_call = (time.perf_counter() - t) / n
    tn = tiny.numpy()
    t = time.perf_counter()
    for _ in range(n):
        attnscope.sdpa(tn, tn, tn)
    per_call_np = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        F.scaled_dot_product_attention(tiny, tiny, tiny)
    per_call_torch = (time.perf_counter() - t) / n

    print(f"{cpu_name()}, 2 threads, torch {torch.__version__}")
    print(f"| workload | attnscope | reference | ratio |")
    print(f"|---|---|---|---|")
    for name, a, b, ref in rows:
        print(f"| {name} | {a * 1e3:.2f} ms | {ref} {b * 1e3:.2f} ms | {b / a:.2f}× |")
    print(f"| per call, 1×1×8×8 | torch tensors {per_call * 1e6:.1f} µs, numpy {per_call_np * 1e6:.1f} µs "
          f"| torch SDPA {per_call_torch * 1e6:.1f} µs | |")


if __name__ == "__main__":
    main()
