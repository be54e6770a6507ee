"""Tuning GEMM: every candidate config timed on the caller's arrays, the fastest stored in the
persistent tuning database (which the plans read)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ArgumentValueError, KernelCompileError, KernelLaunchError
from ...jit.device import device_arch
from ...jit.parallel import compile_many
from ...runtime.arrays import call_arguments, views
from ...tune.db import default_db
from ...tune.timing import time_ms
from .plans import _arch_number, aligns, build_plan, clear_plans, kernels_for, tuning_key
from .problem import Problem, validate
from .select import Choice, candidates, parse_config


def _scratch_outputs(p: Problem):
    """Y (and Z) to time candidates with: CuPy arrays on the current stream."""
    import cupy as cp

    y = cp.empty((p.m, p.epilogue.y_cols(p.n)), dtype=p.y_numpy_dtype)
    return y, (cp.empty((p.m, p.n), dtype=p.y_numpy_dtype) if p.epilogue.save_z else None)


@dataclass(frozen=True)
class TuneResult:
    """The timings of every candidate (fastest first) and the winner stored in the database."""

    best: Choice
    records: tuple[dict, ...]
    key: dict

    def __repr__(self) -> str:
        rows = [f"TuneResult(best={self.best.name!r}, {len(self.records)} candidates)"]
        for r in self.records:
            ms = f"{r['ms']:.4f} ms" if r["ms"] is not None else "failed"
            tf = f"{r['tflops']:.1f} TFLOP/s" if r["tflops"] else ""
            rows.append(f"  {r['config']:32s} {ms:>14s} {tf:>14s} {r.get('error', '')}")
        return "\n".join(rows)


def tune_problem(p: Problem, vecs, reps: int = 20, processes: int | None = None
                 ) -> TuneResult:
    """Time every candidate of ``p`` (compiled first, in parallel), store the fastest, forget
    the plans (so the next call takes it)."""
    import cupy as cp

    arch = device_arch(p.device_id)
    y, z = _scratch_outputs(p)
    stream = cp.cuda.get_current_stream().ptr
    alloc = cp.cuda.alloc   # the plans run on CuPy views here
    flops = 2.0 * p.m * p.n * p.k
    records = []
    cands = candidates(p.m, p.n, p.k, _arch_number(p.device_id), p.dtype, p.precision)
    # Compile every candidate first, in parallel processes; timing then only loads them.
    jobs = []
    for cfg, split in cands:
        try:
            ks = kernels_for(p, Choice(cfg, split), vecs)
        except ArgumentValueError:
            continue
        jobs += [(spec, spec.target_arch(arch)) for spec in ks.specs]
    compile_many(jobs, processes=processes)
    for cfg, split in cands:
        choice = Choice(cfg, split, "tuned")
        try:
            plan = build_plan(p, choice, vecs)
            ms = time_ms(lambda plan=plan: plan.launch(p, y, z, stream, alloc), warmup=2,
                         reps=reps)
            records.append({"config": plan.choice.name, "ms": ms,
                            "tflops": flops / ms / 1e9 if ms > 0 else 0.0})
        except (KernelCompileError, KernelLaunchError, ArgumentValueError) as e:
            records.append({"config": choice.name, "ms": None, "tflops": 0.0,
                            "error": str(e).splitlines()[0]})
    ok = sorted((r for r in records if r["ms"] is not None), key=lambda r: r["ms"])
    if not ok:
        raise KernelLaunchError("every candidate failed to compile or launch: " +
                                "; ".join(r.get("error", "") for r in records))
    best_cfg, best_split = parse_config(ok[0]["config"])
    key = tuning_key(p, arch)
    default_db().put(key, {"config": ok[0]["config"], "ms": ok[0]["ms"],
                           "shape": [p.m, p.n, p.k],
                           "table": [[r["config"], r["ms"]] for r in ok]})
    clear_plans()
    best = Choice(best_cfg, best_split, "tuned", f"{ok[0]['ms']:.4g} ms, fastest of {len(ok)}")
    failed = [r for r in records if r["ms"] is None]
    return TuneResult(best, tuple(ok + failed), key)


def tune(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0, beta: float = 0.0,
         leaky_slope: float = 0.01, save_preact: bool = False, out_dtype=None, precision=None,
         reps: int = 20, processes: int | None = None) -> TuneResult:
    """Time every candidate configuration on these arrays and store the fastest.

    The winner is written to the persistent tuning database (under the kernel cache directory),
    keyed by device, architecture, problem bucket (M, N, K rounded up to powers of two), dtype,
    layouts, the candidate list and ge2jit's version; later calls in any process use it.
    """
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "bias": bias, "c": c})
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], v["bias"], act, v["c"], alpha, beta, leaky_slope, None,
                     None, save_preact, out_dtype, precision)
        if p.empty:
            raise ArgumentValueError(f"a, b: M = {p.m}, N = {p.n}: nothing to tune")
        y, z = _scratch_outputs(p)
        return tune_problem(p, aligns(p, y, z), reps, processes)


def tune_gated(a, b, bias=None, *, act: str = "silu", alpha: float = 1.0,
               leaky_slope: float = 0.01, save_preact: bool = False, out_dtype=None,
               precision=None, reps: int = 20, processes: int | None = None) -> TuneResult:
    """``tune`` of a ``gemm_gated`` call: every candidate timed with the gated epilogue, the
    fastest stored under the gated GEMM's own key."""
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "bias": bias})
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], v["bias"], act, None, alpha, 0.0, leaky_slope, None,
                     None, save_preact, out_dtype, precision, glu=True)
        if p.empty:
            raise ArgumentValueError(f"a, b: M = {p.m}, N = {p.n // 2}: nothing to tune")
        y, z = _scratch_outputs(p)
        return tune_problem(p, aligns(p, y, z), reps, processes)
