"""The machine's baseline, printed beside every timing in docs/benchmarks.md: the CPU's name, torch's CPU capability,
a 2-thread float32 matmul in GFLOP/s and a 1e7-step Python loop in seconds (best of a few runs each), so that timings
taken on different machines can be set side by side.

    python benchmarks/machine.py [--threads 2] [--size 2048]
"""

from __future__ import annotations

import argparse
import platform
import time


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def python_loop(steps: int = 10_000_000) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(steps):
        total += i
    return time.perf_counter() - start


def matmul_gflops(threads: int, size: int, repeats: int = 5) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up: the BLAS picks its kernels and allocates
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args(argv)
    import torch

    print(f"cpu: {cpu_name()}; torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"fp32 matmul {args.size}^3, {args.threads} threads: {matmul_gflops(args.threads, args.size):.0f} GFLOP/s")
    print(f"python loop of 1e7 steps: {min(python_loop() for _ in range(3)):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
