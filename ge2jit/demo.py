"""The quick-start demo: ``python -m ge2jit.demo``.

With a GPU: runs the fused op on a Linear-layer shape, checks it against NumPy in float64 and
prints the time. Without one: says so, and still compiles the demo's kernels for a default
architecture into the cache, showing where they went. A setup problem (CuPy or NVRTC not
installed, an architecture NVRTC cannot compile for) is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import __version__
from ._deps import script_errors
from .jit.cache import default_cache
from .jit.device import gpu_count
from .jit.loader import build
from .jit.nvrtc import arch_number, check_archs, nvrtc_info
from .ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from .ops.gemm.reference import gemm_bias_act_ref, rel_error
from .ops.gemm.select import heuristic, kernel_set
from .ops.gemm.spec import DType

DEMO_ACTS = ("gelu", "relu", "silu")
PROG = "python -m ge2jit.demo"


def _demo_specs(arch: str, m: int, n: int, k: int) -> list:
    """The kernels the GPU demo runs on ``arch``: row-major, aligned operands, bias per column.

    The heuristic's choice for this shape is the same on every GPU with fewer multiprocessors
    than the shape has 128x128 tiles, so it is asked with one multiprocessor.
    """
    number = arch_number(arch)
    choice = heuristic(m, n, k, 1, number, "rr")
    vecs = (4, 16 if n % 4 == 0 else 4, 16 if n % 4 == 0 else 4, 16)   # A unaligned, B, Y by N
    specs = []
    for act in DEMO_ACTS:
        epilogue = Epilogue(out_dtype=DType.F32, act=Act(act), bias=BiasKind.COL,
                            bias_dtype=DType.F32)
        specs += kernel_set(DType.F32, Layout.ROW, Layout.ROW, epilogue, choice.config,
                            choice.split_k, k, vecs).specs
    return specs


def run_on_gpu(m: int, n: int, k: int) -> int:
    import cupy as cp

    from . import gemm_bias_act

    dev = cp.cuda.Device()
    print(f"ge2jit {__version__}, {nvrtc_info()}, GPU {dev.id}: "
          f"{cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}")
    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((m, k), dtype=np.float32)
    w_h = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b_h = rng.standard_normal(n, dtype=np.float32)
    a, w, bias = cp.asarray(a_h), cp.asarray(w_h), cp.asarray(b_h)
    worst = 0.0
    for act in DEMO_ACTS:
        t0 = time.perf_counter()
        y = gemm_bias_act(a, w, bias, act=act)
        cp.cuda.Device().synchronize()
        first = time.perf_counter() - t0
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(20):
            start.record()
            gemm_bias_act(a, w, bias, act=act, out=y)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        ms = float(np.median(times))
        ref, _ = gemm_bias_act_ref(a_h, w_h, b_h, act=act)
        err = rel_error(cp.asnumpy(y), ref)
        worst = max(worst, err)
        print(f"  Y = {act}(A @ W + bias)  {m}x{n}x{k} float32: {ms:.3f} ms "
              f"({2 * m * n * k / ms / 1e9:.1f} TFLOP/s), first call {first:.2f} s, "
              f"relative error vs NumPy float64 {err:.2e}")
    ok = worst < 1e-5
    print("OK: matches NumPy" if ok else "FAILED: error above 1e-5")
    return 0 if ok else 1


def compile_only(arch: str, m: int, n: int, k: int) -> int:
    print(f"No CUDA GPU found: nothing to run. Compiling the demo's kernels for {arch} instead "
          f"(with {nvrtc_info()}).")
    cache = default_cache()
    for spec in _demo_specs(arch, m, n, k):
        entry, cached = build(spec, spec.target_arch(arch), cache=cache)
        where = cache.where(entry.key) or "memory only"   # the file, if one was written
        state = "cached" if cached else f"compiled in {entry.compile_seconds:.2f} s"
        print(f"  {spec.kernel_name:48s} {state:20s} {entry.registers:3d} regs, "
              f"{entry.spill_bytes} spill bytes -> {where}")
    print(f"Kernel cache: {cache.root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(4096, 4096, 1024),
                        metavar=("M", "N", "K"), help="problem size (default: 4096 4096 1024)")
    parser.add_argument("--arch", default="sm_90",
                        help="architecture to compile for when there is no GPU (default: sm_90)")
    args = parser.parse_args(argv)
    with script_errors(PROG):
        # checked first, with or without a GPU: NVRTC (and CuPy, which loads it) must be
        # there, and a name it cannot compile for is one line, not a compile error per kernel
        (arch,) = check_archs([args.arch])
        if gpu_count() > 0:
            return run_on_gpu(*args.shape)
        return compile_only(arch, *args.shape)


if __name__ == "__main__":
    sys.exit(main())
