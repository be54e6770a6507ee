"""Host time of cached calls: CuPy arrays and PyTorch tensors, forward and backward; then
the host time of an MLP block's training step and its pieces, ge2jit's and PyTorch's, eager
and under ``torch.compile``.

    python bench/bench_host.py [--json PATH] [--quick]

"host only": the wall time of 200 calls queued right after a synchronization (the launch
queue never fills, so the GPU's time is not in it), median of 50 batches. Every case is
measured in turns (one batch of each per round), so clock drift affects them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from common import add_quick, commit, cp

import ge2jit

#: --quick: calls per batch and batches
QUICK_CALLS, QUICK_ROUNDS = 50, 10


def _cases():
    import torch

    rng = cp.random.default_rng(0)
    f32 = cp.float32
    a = rng.standard_normal((64, 64), dtype=f32)
    b = rng.standard_normal((64, 64), dtype=f32)
    bias = rng.standard_normal(64, dtype=f32)
    out = cp.empty((64, 64), f32)
    z = cp.empty((64, 64), f32)
    gy = rng.standard_normal((64, 64), dtype=f32)
    ta, tb, tbias, tout, tgy = (torch.from_dlpack(x) for x in (a, b, bias, out, gy))
    _, z = ge2jit.gemm_bias_act(a, b, bias, act="gelu", save_preact=True)
    tz = torch.from_dlpack(z)
    # a larger problem on torch tensors (bfloat16), the 4096 x 1024 x 4096
    la = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    lb = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    lbias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    gelu = torch.nn.functional.gelu
    # bfloat16 64 x 64: PyTorch's own op beside ge2jit's on the same tensors
    ha, hw, hbias = (torch.randn(*s, device="cuda", dtype=torch.bfloat16)
                     for s in ((64, 64), (64, 64), (64,)))
    hout = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    linear = torch.nn.functional.linear
    noop = cp.RawKernel('extern "C" __global__ void noop(float* x) {}', "noop")
    return {
        "ge2jit forward, out= (CuPy)":
            lambda: ge2jit.gemm_bias_act(a, b, bias, act="gelu", out=out),
        "ge2jit forward, new output (CuPy)":
            lambda: ge2jit.gemm_bias_act(a, b, bias, act="gelu"),
        "ge2jit forward, new output (torch)":
            lambda: ge2jit.gemm_bias_act(ta, tb, tbias, act="gelu"),
        "ge2jit forward, out= (torch)":
            lambda: ge2jit.gemm_bias_act(ta, tb, tbias, act="gelu", out=tout),
        "ge2jit forward 4096x1024x4096 bf16 (torch)":
            lambda: ge2jit.gemm_bias_act(la, lb, lbias, act="gelu_tanh"),
        "ge2jit backward, z (CuPy)":
            lambda: ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu", z=z),
        "ge2jit backward, z (torch)":
            lambda: ge2jit.gemm_bias_act_backward(tgy, ta, tb, tbias, act="gelu", z=tz),
        "torch F.linear 64x64 bf16": lambda: linear(ha, hw, hbias),
        "ge2jit forward 64x64 bf16, new output (torch)":
            lambda: ge2jit.gemm_bias_act(ha, hw.T, hbias),
        "ge2jit forward 64x64 bf16, out= (torch)":
            lambda: ge2jit.gemm_bias_act(ha, hw.T, hbias, out=hout),
        "torch eager addmm + gelu":
            lambda: gelu(torch.addmm(tbias, ta, tb)),
        "torch._addmm_activation (cuBLASLt bias+gelu)":
            lambda: torch._addmm_activation(tbias, ta, tb, use_gelu=True),
        "cupy.RawKernel (empty kernel)": lambda: noop((1,), (32,), (out,)),
        "cupy.from_dlpack(torch tensor)": lambda: cp.from_dlpack(ta),
    }


def measure(cases: dict, calls: int = 200, rounds: int = 50) -> dict:
    for name, fn in list(cases.items()):
        try:
            for _ in range(calls):
                fn()
        except Exception as e:  # noqa: BLE001 - reported, the others still measured
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
            del cases[name]
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    cp.cuda.Device().synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


def step_cases(tokens: int = 512, d: int = 1024, compiled: bool = True) -> dict:
    """One training step of the MLP block of ``bench_torch_mlp.py`` (Linear d -> 4d,
    GELU-tanh, Linear 4d -> d, bfloat16, ``model(x).backward(gy)``) and its pieces, ge2jit's
    and PyTorch's; with ``compiled``, also both steps under ``torch.compile``."""
    import importlib

    import torch

    import ge2jit.torch as gt

    torch_ops = importlib.import_module("ge2jit.ops.gemm.torch_ops")   # (loaded by gt)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    ours = gt.MLP([d, 4 * d, d], act="gelu_tanh", device="cuda", dtype=dtype)
    ref = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * d, d)).to("cuda", dtype)
    x = torch.randn(tokens, d, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(tokens, d, device="cuda", dtype=dtype)
    xd = x.detach()
    ws = [m.weight.detach() for m in ours.layers]
    bs = [m.bias.detach() for m in ours.layers]
    acts = "gelu_tanh,none"
    w0 = ws[0].T
    cases = {"torch eager step": lambda: ref(x).backward(gy),
             "ge2jit eager step": lambda: ours(x).backward(gy)}
    if compiled:
        compiled_ours, compiled_ref = torch.compile(ours), torch.compile(ref)
        cases["torch.compile step"] = lambda: compiled_ref(x).backward(gy)
        cases["ge2jit compiled step"] = lambda: compiled_ours(x).backward(gy)
    return {
        **cases,
        "torch eager forward": lambda: ref(x),
        "ge2jit eager forward": lambda: ours(x),
        "torch.ops.ge2jit.mlp, no autograd": lambda: torch.ops.ge2jit.mlp(
            xd, ws, bs, [True, True], acts, 0.01, None, True),
        "its implementation": lambda: torch_ops._mlp(xd, ws, bs, [True, True], acts, 0.01,
                                                     None, True),
        # the one-GEMM op: tensors and scalars only (no lists to box)
        "torch.ops.ge2jit.gemm_bias_act, no autograd": lambda: torch.ops.ge2jit.gemm_bias_act(
            xd, w0, bs[0], None, "gelu_tanh", 1.0, 0.0, 0.01, None, True),
        "its implementation (gemm)": lambda: torch_ops._gemm(
            xd, w0, bs[0], None, "gelu_tanh", 1.0, 0.0, 0.01, None, True),
    }


def measure_steps(cases: dict, calls: int = 20, rounds: int = 15) -> dict:
    """Host µs per call of each case: ``calls`` calls queued behind a GPU sleep that outlasts
    them (so that only the host counts, and the launch queue never fills), median of
    ``rounds`` batches, the cases in turns."""
    import torch

    for fn in cases.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            torch.cuda._sleep(int(5e8))
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    add_quick(ap, f"{QUICK_ROUNDS} batches of {QUICK_CALLS} calls")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    results = (measure(_cases(), QUICK_CALLS, QUICK_ROUNDS) if args.quick
               else measure(_cases()))
    from ge2jit.jit.fastlaunch import launch_path

    print(f"launch path: {launch_path()}")
    print("| what | host µs per call |\n|---|---|")
    for name, us in results.items():
        print(f"| {name} | {us:.2f} |")
    steps = (measure_steps(step_cases(compiled=False), 5, 3) if args.quick
             else measure_steps(step_cases()))
    print("\n| MLP block, 512 tokens (GPU held busy: host time only) | host µs |\n|---|---|")
    for name, us in steps.items():
        print(f"| {name} | {us:.1f} |")
    ratio = steps["ge2jit eager step"] / steps["torch eager step"]
    print(f"ge2jit eager step / torch eager step: {ratio:.2f} (target <= 0.60)")
    mlp = steps["torch.ops.ge2jit.mlp, no autograd"] - steps["its implementation"]
    gemm = (steps["torch.ops.ge2jit.gemm_bias_act, no autograd"]
            - steps["its implementation (gemm)"])
    print(f"the custom ops' own overhead without autograd: mlp {mlp:.1f} µs, gemm_bias_act "
          f"{gemm:.1f} µs (target <= 10)")
    if args.json:
        doc = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               "date": time.strftime("%Y-%m-%d"), "commit": commit(),
               "host_us": results, "step_host_us": steps}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
