"""The tools every op gets from its registration (``registry.Op``): ``explain``, ``tune`` and
the look-up of a tuned config at call time (``tuned_config``). Each takes the op first (its
function, name or ``Op``); given arrays first, the default op."""

from __future__ import annotations

import html
from dataclasses import dataclass

from .._version import __version__
from ..errors import ArgumentValueError, KernelLaunchError
from .registry import ConfigChoice, Explanation, Op, default_op, find, get


def op_and_args(first, args: tuple) -> tuple[Op, tuple]:
    """(op, its arguments) of a tool's call: ``first`` is the op, or the default op's first
    argument. A name that is no registered op is an error (listing the registered ones)."""
    op = find(first)
    if op is not None:
        return op, args
    if isinstance(first, str):
        get(first)   # raises
    return default_op(), (first, *args)


def explain(op, *args, **kwargs) -> Explanation:
    """Which config and kernels a call of ``op`` with these arguments would use, and why
    ("heuristic", "tuned", "pinned", "fallback"; "fixed" for an op without configs).
    Compiles the kernels, launches nothing; prints as text.

        ge2jit.explain(a, w, bias, act="gelu")          # the default op
        ge2jit.explain("<op name>", *arrays, **keywords)
    """
    op, args = op_and_args(op, args)
    if op.plan is None:
        raise ArgumentValueError(f"op: {op.name} registers no plan to explain")
    return op.plan(*args, **kwargs)


class Records(list):
    """A list of dicts that prints as a table (and renders as one in Jupyter)."""

    def _columns(self):
        cols = []
        for r in self:
            cols += [k for k in r if k not in cols]
        return cols

    def __repr__(self) -> str:
        cols = self._columns()
        cells = [[_cell(r.get(c)) for c in cols] for r in self]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = self._columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>"
                                        for c in cols) + "</tr>" for r in self)
        return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def sort_records(records: list[dict]) -> list[dict]:
    """Timed records fastest first, then the failed ones."""
    return sorted(records, key=lambda r: (r["ms"] is None, r["ms"] or 0.0))


def time_config(op: Op, config, args: tuple, kwargs: dict, *, reps: int,
                warmup: int) -> dict:
    """{"config", "ms"} of ``op.function(*args, config=config, **kwargs)``, or {"config",
    "ms": None, "error"} where it fails."""
    from ..tune.timing import time_ms

    name = str(getattr(config, "name", config))
    try:
        ms = time_ms(lambda: op.function(*args, config=config, **kwargs), warmup=warmup,
                     reps=reps)
    except Exception as e:  # noqa: BLE001 - a failing config is a result, not a crash
        return {"config": name, "ms": None, "error": (str(e).splitlines() or [repr(e)])[0]}
    return {"config": name, "ms": ms}


@dataclass(frozen=True)
class TuneResult:
    """The timings of every candidate (fastest first, failed ones last) and the winner stored
    in the tuning database under ``key``."""

    best: ConfigChoice
    records: tuple[dict, ...]
    key: dict

    def __repr__(self) -> str:
        return (f"TuneResult(best={self.best.name!r}, {len(self.records)} candidates)\n"
                + repr(Records(self.records)))


def _device_key() -> dict:
    """What of a tuning key the tools add: the current device, its architecture, ge2jit's
    version."""
    from .._deps import require_cupy
    from ..jit.device import device_arch, device_name

    device_id = require_cupy().cuda.runtime.getDevice()
    return {"device": device_name(device_id), "arch": device_arch(device_id),
            "version": __version__}


def full_key(op_name: str, key: dict) -> dict:
    """The tuning database's key of an op's ``key`` on the current device."""
    return {**_device_key(), **key, "op": op_name}


def tuned_config(op_name: str, key: dict) -> str | None:
    """The config name ``tune`` stored for ``key`` (an op's ``tuning_key``) on this device,
    or None. Ops read their tuned choice with this at call time. The database keys it by
    the code too (``TuningDB.full_key``): a config tuned on other kernel templates is not
    taken."""
    from ..tune.db import default_db

    value = default_db().get(full_key(op_name, key))
    config = None if value is None else value.get("config")
    return config if isinstance(config, str) else None


def tune(op, *args, reps: int = 20, processes: int | None = None, **kwargs) -> TuneResult:
    """Time every candidate config of ``op`` on these arguments and store the fastest in the
    persistent tuning database (under the kernel cache directory), where later calls in any
    process find it. The candidates' kernels compile first, in ``processes`` processes.

        ge2jit.tune(a, w, bias, act="gelu")             # the default op
        ge2jit.tune("<op name>", *arrays, reps=50)
    """
    from ..jit.parallel import compile_many
    from ..tune.db import default_db

    op, args = op_and_args(op, args)
    if op.tune is not None:
        return op.tune(*args, reps=reps, processes=processes, **kwargs)
    names = list(op.candidates(*args, **kwargs) or ()) if op.candidates else []
    if not names or op.tuning_key is None:
        raise ArgumentValueError(f"op: {op.name} has no configs to tune")
    key = full_key(op.name, op.tuning_key(*args, **kwargs))
    failed = {}
    if op.call_specs is not None:
        jobs = {name: [(s, s.target_arch(key["arch"]))
                       for s in op.call_specs(name, *args, **kwargs)] for name in names}
        outcomes = compile_many([j for js in jobs.values() for j in js], processes=processes)
        errors = {(o.spec, o.arch): o.error for o in outcomes if o.status == "failed"}
        for name, js in jobs.items():
            bad = [errors[j] for j in js if j in errors]
            if bad:
                failed[name] = {"config": name, "ms": None, "error": bad[0].splitlines()[0]}
    records = [failed.get(name) or time_config(op, name, args, kwargs, reps=reps, warmup=2)
               for name in names]
    records = sort_records(records)
    ok = [r for r in records if r["ms"] is not None]
    if not ok:
        raise KernelLaunchError("every candidate failed to compile or launch: " +
                                "; ".join(r["error"] for r in records))
    default_db().put(key, {"config": ok[0]["config"], "ms": ok[0]["ms"],
                           "table": [[r["config"], r["ms"]] for r in ok]})
    # every op's stored launches (prepared calls, compiled programs) chose before this record
    # existed: the next call of each pattern chooses again
    from .prepared import clear_all

    clear_all()
    if op.clear_plans is not None:
        op.clear_plans()
    best = ConfigChoice(ok[0]["config"], "tuned",
                        f"{ok[0]['ms']:.4g} ms, fastest of {len(ok)}")
    return TuneResult(best, tuple(records), key)
