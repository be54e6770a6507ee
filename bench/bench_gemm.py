"""Benchmark of gemm_bias_act against the baselines, measured side by side in one process.

    python bench/bench_gemm.py [--tune] [--quick] [--dtypes float32,bfloat16,...]
                               [--shapes MxNxK,...] [--epilogues-only] [--out bench/results.json]

For each dtype, shape and activation (bias per column): ge2jit's fused op; what a CuPy user writes
today (cupy.matmul, then one elementwise kernel for bias + activation); and, when PyTorch is
importable, cuBLASLt's fused epilogue (torch._addmm_activation: relu and tanh-GELU only) and
torch.nn.functional.linear followed by the activation. Times are medians of CUDA-event
timings after warm-up, with several input sets rotated so that L2 does not hold them; each
kernel is timed in batches of back-to-back calls (about 1 ms), so that the host's enqueue time
does not land between the events, and the implementations of a row are timed in turns (a batch
of each per round, 15 rounds), so that clock and temperature drift falls on all alike.
The epilogues' costs: for the tensor-core dtypes, each activation's time on the target shapes,
the activations timed in turns so that clock drift falls on all alike (``--epilogues-only``).
Also measured: host time per call on the cached path (back to back, and the host's own time),
the accuracy of each float32 mode against a float64 product, cold compile time of one kernel,
and the time to load one kernel from the disk cache in a fresh process.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from common import (
    ROOT,
    add_quick,
    commit,
    cp,
    enqueue_us,
    import_torch,
    interleaved_ms,
    np_dtype,
    parse_shapes,
    per_call_us,
)

import ge2jit

L2_BYTES = 64 << 20

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
MLP = [(m, n, k) for m in (512, 4096, 16384)
       for (k, n) in ((1024, 1024), (1024, 4096), (4096, 1024), (4096, 16384))]
SKINNY = [(8192, 64, 4096), (8192, 256, 4096)]
SMALL_K = [(4096, 4096, 64), (16384, 1024, 64)]
ODD = [(1000, 3000, 1500)]
BIG = [(8192, 16384, 4096)]
#: The tensor-core dtypes run on the shapes of their targets and a spread of others.
TC_SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 16384, 4096),
             (8192, 1024, 1024), (16384, 4096, 1024), (16384, 1024, 4096), (512, 1024, 4096),
             (8192, 256, 4096), (4096, 4096, 64), (1000, 3000, 1500)]
ACTS = ("gelu_tanh", "relu", "silu")
#: The tensor-core rows add the epilogues cuBLASLt does not have, on the target shapes.
TC_ACTS = ("gelu_tanh", "relu", "silu", "sigmoid", "tanh")
TC_TARGETS = {(4096, 4096, 4096), (8192, 8192, 8192), (8192, 16384, 4096), (8192, 1024, 1024)}
#: --dtypes name -> (array dtype, precision)
DTYPES = {"float32": ("float32", None), "tf32": ("float32", "tf32"),
          "tf32x3": ("float32", "tf32x3"), "bfloat16": ("bfloat16", None),
          "float16": ("float16", None)}
#: float32-input kinds that answer to the float32 baselines (exact cuBLAS, CuPy) and sweep
F32_SWEEP = ("float32", "tf32x3")

_CUPY_ACT = {
    "gelu_tanh": "0.5f * z * (1.0f + tanhf(0.7978845608f * (z + 0.044715f * z * z * z)))",
    "relu": "z < 0.0f ? 0.0f : z",
    "silu": "z / (1.0f + expf(-z))",
    "sigmoid": "1.0f / (1.0f + expf(-z))",
    "tanh": "tanhf(z)",
}


@functools.cache
def _cupy_kernel(act: str):
    """CuPy's elementwise bias + ``act`` (made on first use: importing this script makes no
    CuPy object, so that it imports without a GPU)."""
    return cp.ElementwiseKernel("T x, T bias", "T y",
                                f"float z = (float)x + (float)bias; y = (T)({_CUPY_ACT[act]});",
                                f"bias_{act}")


def cupy_unfused(a, b, bias, act, out):
    cp.matmul(a, b, out=out)
    _cupy_kernel(act)(out, bias, out)


#: The epilogues timed against each other (interleaved) on the tensor-core target shapes.
EPILOGUE_ACTS = ("none", "relu", "gelu_tanh", "silu", "sigmoid", "tanh", "gelu")


def _fused(act, precision):
    """ge2jit's call of one activation, on an input set (a, b, bias, out)."""
    return lambda a, b, bias, out: ge2jit.gemm_bias_act(a, b, bias, act=act, out=out,
                                                        precision=precision)


def epilogue_costs(dtype: str, shapes) -> list[dict]:
    """ge2jit's time with each activation (bias per column), the activations timed in turns;
    each as a ratio to ReLU's."""
    precision = DTYPES[dtype][1]
    out = []
    for (m, n, k) in shapes:
        sets = make_sets(m, n, k, dtype)
        times = interleaved_ms([(_fused(act, precision), sets) for act in EPILOGUE_ACTS])
        relu = times[EPILOGUE_ACTS.index("relu")]
        row = {"dtype": dtype, "m": m, "n": n, "k": k,
               "config": ge2jit.explain(*sets[0][:3], precision=precision).config,
               "ms": dict(zip(EPILOGUE_ACTS, times)),
               "vs_relu": {a: t / relu for a, t in zip(EPILOGUE_ACTS, times)}}
        out.append(row)
        print(f"epilogues {dtype:8s} {m}x{n}x{k} ({row['config']}): " + ", ".join(
            f"{a} {t:.4f} ms ({t / relu:.3f})" for a, t in zip(EPILOGUE_ACTS, times)),
            flush=True)
    return out


def make_sets(m, n, k, dtype="float32"):
    dt = np_dtype(DTYPES[dtype][0])
    per_set = dt.itemsize * (m * k + k * n + n + m * n)
    count = max(1, min(8, -(-2 * L2_BYTES // per_set)))
    rng = cp.random.default_rng(0)
    return [(rng.standard_normal((m, k), dtype=cp.float32).astype(dt),
             (rng.standard_normal((k, n), dtype=cp.float32) / np.float32(np.sqrt(k))).astype(dt),
             rng.standard_normal(n, dtype=cp.float32).astype(dt),
             cp.empty((m, n), dtype=dt)) for _ in range(count)]


def bench_shape(m, n, k, act, torch, tune: bool, dtype: str = "float32") -> dict:
    sets = make_sets(m, n, k, dtype)
    precision = DTYPES[dtype][1]
    flops = 2.0 * m * n * k
    row = {"m": m, "n": n, "k": k, "act": act, "dtype": dtype}
    a, b, bias, _ = sets[0]
    if tune and act == ACTS[0]:   # the tuning key holds no activation: once per shape
        ge2jit.tune(a, b, bias, act=act, reps=5, precision=precision)
    row["config"] = ge2jit.explain(a, b, bias, act=act, precision=precision).config
    cases = {"ge2jit": (_fused(act, precision), sets)}
    if precision != "tf32":   # CuPy's matmul has no per-call tf32 switch
        cases["cupy_unfused"] = (lambda a, b, bias, out: cupy_unfused(a, b, bias, act, out), sets)
        cases["cupy_matmul"] = (lambda a, b, bias, out: cp.matmul(a, b, out=out), sets)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        F = torch.nn.functional
        tsets = [tuple(torch.from_dlpack(x) for x in s) for s in sets]
        act_fn = {"gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "relu": F.relu,
                  "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act]
        cases["torch_linear_act"] = (
            lambda a, b, bias, out: act_fn(F.linear(a, b.t(), bias)), tsets)
        if act in ("gelu_tanh", "relu"):
            cases["cublaslt_fused"] = (lambda a, b, bias, out: torch._addmm_activation(
                bias, a, b, use_gelu=act == "gelu_tanh"), tsets)
        cases["cublas_gemm"] = (lambda a, b, bias, out: torch.mm(a, b, out=out), tsets)
    for key, (fn, s) in list(cases.items()):
        try:
            fn(*s[0])
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run is left out
            if key == "ge2jit":
                raise
            print(f"  ({key} failed for {dtype}: {str(e).splitlines()[0]})")
            del cases[key]
    # all implementations timed in turns, so that clock and temperature drift (the GPU is
    # power-limited on large problems) falls on all of them alike
    row.update(zip(cases, interleaved_ms(list(cases.values()))))
    for key in list(row):
        if key in ("m", "n", "k", "act", "config", "dtype"):
            continue
        row[f"{key}_tflops"] = flops / row[key] / 1e9
    return row


def host_time_us(calls: int = 20000, rounds: int = 50) -> dict:
    """Wall time per call of back-to-back tiny launches (the cached, launch-bound path): of
    ``calls`` calls, and the host's own of ``rounds`` batches (``enqueue_us``)."""
    a = cp.random.standard_normal((64, 64), dtype=cp.float32)
    b = cp.random.standard_normal((64, 64), dtype=cp.float32)
    bias = cp.random.standard_normal(64, dtype=cp.float32)
    out = cp.empty((64, 64), dtype=cp.float32)
    noop = cp.RawKernel('extern "C" __global__ void noop(float* x) {}', "noop")
    from ge2jit.ops.gemm import op
    from ge2jit.ops.gemm.plans import LaunchArgs
    from ge2jit.runtime.arrays import CUPY

    dev = cp.cuda.runtime.getDevice()
    # the arguments of the op's private _signature (the key of its prepared calls), bound by
    # name, so that a change of its parameters (the device id passed in or read inside, say)
    # does not shift them
    values = dict(fw=CUPY, a=a, b=b, bias=bias, act="gelu", c=None, alpha=1.0, beta=0.0,
                  leaky_slope=0.01, save_preact=False, out=out, preact_out=None, config=None,
                  autotune=False, device_id=dev, out_dtype=None, precision=None)
    sig_args = [values[p.name] for p in inspect.signature(op._signature).parameters.values()
                if p.default is p.empty]
    cases = {
        "ge2jit.gemm_bias_act": lambda: ge2jit.gemm_bias_act(a, b, bias, act="gelu", out=out),
        "ge2jit.gemm_bias_act (new output)": lambda: ge2jit.gemm_bias_act(a, b, bias, act="gelu"),
        "cupy.matmul": lambda: cp.matmul(a, b, out=out),
        "cupy.RawKernel (empty kernel)": lambda: noop((1,), (32,), (out,)),
        # pieces of ge2jit's cached path, to see where its time goes
        "  part: call signature": lambda: op._signature(*sig_args),
        "  part: cupy.ndarray((64, 64))": lambda: cp.ndarray((64, 64), np.float32),
        "  part: get_current_stream().ptr": lambda: cp.cuda.get_current_stream().ptr,
        "  part: getDevice()": cp.cuda.runtime.getDevice,
    }
    ge2jit.gemm_bias_act(a, b, bias, act="gelu", out=out)
    plan = op._fast.get(op._signature(*sig_args)).plan
    stream_ptr = cp.cuda.get_current_stream().ptr
    # Plan.run's scratch allocator (for a plan with workspaces; this one has none) is the
    # framework's, as the op passes it
    fixed = LaunchArgs(m=64, n=64, k=64, lda=64, ldb=64, ldc=0, bias_stride=1, ldy=64, ldz=0,
                       alloc=CUPY.scratch(dev))
    args = (fixed, a.data.ptr, b.data.ptr, 0, bias.data.ptr, out.data.ptr, 0, 1.0, 0.0, 0.01,
            stream_ptr)
    cases["  part: Plan.run (pack + cuLaunchKernel)"] = lambda: plan.run(*args)
    times = {name: per_call_us(fn, calls) for name, fn in cases.items()}
    for name in ("ge2jit.gemm_bias_act", "ge2jit.gemm_bias_act (new output)", "cupy.matmul",
                 "cupy.RawKernel (empty kernel)", "  part: Plan.run (pack + cuLaunchKernel)"):
        times[f"{name}, host only"] = enqueue_us(cases[name], rounds=rounds)
    return times


def accuracy(torch, m: int = 2048, n: int = 2048, k: int = 4096) -> dict:
    """||Y - ref|| / ||ref|| of A @ B for float32 inputs against a float64 product on the GPU,
    for each float32 mode of ge2jit and of the baselines (the same random inputs)."""
    rng = cp.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n), dtype=cp.float32)
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    norm = float(cp.linalg.norm(ref))

    def err(y):
        return float(cp.linalg.norm(y.astype(cp.float64) - ref)) / norm

    out = {f"ge2jit precision={p!r}": err(ge2jit.gemm_bias_act(a, b, precision=p))
           for p in ("ieee", "tf32x3", "tf32")}
    out["cupy.matmul float32"] = err(cp.matmul(a, b))
    if torch is not None:
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            out[f"torch.mm float32 (allow_tf32={tf32})"] = err(cp.from_dlpack(ta @ tb))
        torch.backends.cuda.matmul.allow_tf32 = False
    return {"shape": [m, n, k], "rel_error": out}


_COLD = textwrap.dedent("""
    import time, sys
    t0 = time.perf_counter()
    import cupy as cp, ge2jit
    a = cp.ones((256, 256), dtype=cp.float32); b = cp.ones((256, 256), dtype=cp.float32)
    cp.cuda.Device().synchronize()
    t1 = time.perf_counter()
    ge2jit.gemm_bias_act(a, b, act="gelu", config="128x128x8_w32x64_s3")
    cp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    print(t2 - t1)
""")


def compile_and_load_times(loads: int = 3) -> dict:
    """Seconds of the first call in a fresh process: with an empty kernel cache (a cold
    compile), and with the kernel in the disk cache (the best of ``loads``)."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "GE2JIT_CACHE_DIR": d}
        run = lambda: float(subprocess.run([sys.executable, "-c", _COLD], env=env, check=True,  # noqa: E731
                                           capture_output=True, text=True).stdout.split()[-1])
        cold = run()
        warm = [run() for _ in range(loads)]
    return {"cold_first_call_s": cold, "disk_cache_first_call_s": min(warm)}


#: --quick: the shapes, activations (those cuBLASLt fuses too, so every baseline is timed),
#: epilogue shapes, host-time calls and rounds, and cache loads
QUICK_SHAPES = [(4096, 4096, 4096), (8192, 1024, 1024), (8192, 64, 4096)]
QUICK_ACTS = ("gelu_tanh", "relu")
QUICK_EPILOGUE_SHAPES = [(4096, 4096, 4096)]


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked; ``dtypes`` and ``shapes`` as lists (``shapes`` None: the sweep)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    parser.add_argument("--tune", action="store_true", help="autotune each shape first")
    add_quick(parser, f"shapes {QUICK_SHAPES}, activations {', '.join(QUICK_ACTS)}, the "
                      f"epilogues on {QUICK_EPILOGUE_SHAPES}, fewer host-time calls")
    parser.add_argument("--host-only", action="store_true",
                        help="only the host time per call on the cached path")
    parser.add_argument("--dtypes", default="float32,tf32,bfloat16,float16",
                        help=f"comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--epilogues-only", action="store_true",
                        help="only the activations' costs, timed in turns on the target shapes")
    parser.add_argument("--shapes", default=None,
                        help="MxNxK,... instead of the sweep (e.g. 4096x4096x4096)")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in args.dtypes:
        if d not in DTYPES:
            parser.error(f"--dtypes: unknown {d!r}; expected names from {', '.join(DTYPES)}")
    if args.shapes:
        args.shapes = parse_shapes(parser, args.shapes)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    dtypes = args.dtypes
    calls, rounds = (2000, 10) if args.quick else (20000, 50)
    torch = import_torch()
    if args.host_only:
        for name, us in host_time_us(calls, rounds).items():
            print(f"{name:45s} {us:7.2f} us")
        return 0
    shapes = SQUARES + MLP + SKINNY + SMALL_K + ODD + BIG
    if args.quick:
        shapes = QUICK_SHAPES
    if args.shapes:
        shapes = args.shapes
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    meta = {
        "device": props["name"].decode(), "sms": props["multiProcessorCount"],
        "date": time.strftime("%Y-%m-%d"), "nvrtc": str(ge2jit.nvrtc_info()),
        "cupy": cp.__version__, "torch": getattr(torch, "__version__", None),
        "python": platform.python_version(), "tuned": args.tune,
        "commit": commit(),
    }
    # first, so that a sweep cut short still has them
    extra = {}
    tc = [d for d in dtypes if d not in F32_SWEEP]
    if tc:
        targets = (shapes if args.shapes else QUICK_EPILOGUE_SHAPES if args.quick
                   else sorted(TC_TARGETS))
        extra["epilogues"] = [r for d in tc for r in epilogue_costs(d, targets)]
        if args.epilogues_only:
            Path(args.out).write_text(json.dumps({"meta": meta, **extra}, indent=1))
            return 0
    if {"float32", "tf32", "tf32x3"} & set(dtypes):
        extra["accuracy"] = accuracy(torch)
        print("accuracy:", extra["accuracy"])
    host = host_time_us(calls, rounds)
    print("host time per call (us):", {k: round(v, 2) for k, v in host.items()})
    rows = []
    for dtype in dtypes:
        sweep = shapes if (dtype in F32_SWEEP or args.shapes or args.quick) else TC_SHAPES
        for (m, n, k) in sweep:
            tc_row = dtype not in F32_SWEEP and ((m, n, k) in TC_TARGETS or args.shapes)
            acts = QUICK_ACTS if args.quick else TC_ACTS if tc_row else ACTS
            for act in acts:
                row = bench_shape(m, n, k, act, torch, args.tune, dtype)
                rows.append(row)
                base = row.get("cublaslt_fused", row.get("torch_linear_act"))
                Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows,
                                                      "host_us": host, **extra}, indent=1))
                print(f"{dtype:8s} {m:6d} {n:6d} {k:6d} {act:9s} ge2jit {row['ge2jit']:8.4f} ms "
                      f"{row['ge2jit_tflops']:6.1f} TF/s | cupy "
                      f"{row.get('cupy_unfused', float('nan')):8.4f} | "
                      f"torch {base if base is None else round(base, 4)} | cuBLAS gemm "
                      f"{row.get('cublas_gemm', float('nan')):.4f} | {row['config']}",
                      flush=True)
    compile_times = compile_and_load_times(1 if args.quick else 3)
    print("compile/load (s):", compile_times)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "host_us": host,
                                          **extra, **compile_times}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
