"""The optimizer steps as the tools see them (``runtime.registry.Op``): warm-up tables, the
kernel of a call (``explain``) and of a type combination (``inspect``); they have no configs."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...runtime.dtypes import SUPPORTED_DTYPES, dtype_name
from ...runtime.registry import ConfigChoice, Explanation, Op, bind
from . import (
    STEP_TYPES,
    UpdateSpec,
    _adam_scalars,
    _checked,
    _is_device_step,
    _sgd_scalars,
    adam_update,
    cases,
    sgd_update,
    warmup,
)


def _arrays(rule: str, x: dict) -> tuple:
    """(param, grad, buf1, buf2, param_copy, nesterov[, device step]) of a call's bound
    arguments, whose scalars are checked as the call checks them."""
    if rule == "adam":
        _adam_scalars(x["step"], x["lr"], x["betas"], x["eps"], x["weight_decay"])
        return (x["param"], x["grad"], x["m"], x["v"], x["param_copy"], False,
                x["step"] if _is_device_step(x["step"]) else None)
    _sgd_scalars(x["lr"], x["momentum"], x["weight_decay"], x["nesterov"])
    return (x["param"], x["grad"], x["momentum_buffer"], None, x["param_copy"],
            x["nesterov"])


def _dtype(value, name: str, accepted: dict):
    dt = accepted.get(dtype_name(value) if value is not None else "none", ArgumentValueError)
    if dt is ArgumentValueError:
        raise ArgumentValueError(f"{name}: expected one of {', '.join(accepted)}, got "
                                 f"{value!r}")
    return dt


def _op(rule: str, function, prefixes: tuple[str, ...]) -> Op:
    name = function.__name__

    def plan(*args, **kwargs) -> Explanation:
        step = _checked(rule, *_arrays(rule, bind(function, args, kwargs)))
        if step is None:
            raise ArgumentValueError("param: an empty parameter launches nothing")
        spec, device_id, blocks = step[:3]
        return Explanation(ConfigChoice("none", "fixed", f"{name} has no configs"),
                           (get_kernel(spec, device_id),), (blocks, 1, 1),
                           (UpdateSpec.threads, 1, 1))

    def specs_for_config(config, arch: str, *, grad_dtype="float32", copy_dtype=None,
                         nesterov: bool = False, step_dtype=None) -> tuple:
        """The step's kernel for a gradient type and a copy type (None: no param_copy);
        Adam's ``step_dtype``: None for a Python int step, else the device counter's type."""
        if config is not None:
            raise ArgumentValueError(f"config: {name} has no configs, got {config!r}")
        if not isinstance(nesterov, bool):
            raise ArgumentValueError(f"nesterov: expected a bool, got {nesterov!r}")
        return (UpdateSpec(rule, _dtype(grad_dtype, "grad_dtype", SUPPORTED_DTYPES),
                           _dtype(copy_dtype, "copy_dtype", warmup.COPIES), nesterov,
                           None if step_dtype is None else
                           _dtype(step_dtype, "step_dtype", {t: t for t in STEP_TYPES})),)

    return Op(name=name, function=function, warmup={name: getattr(warmup, rule)}, plan=plan,
              specs_for_config=specs_for_config, kernel_prefixes=prefixes,
              layout_cases=cases.cases_of(rule))


ADAM = _op("adam", adam_update, ("adam_update_",))
SGD = _op("sgd", sgd_update, ("sgd_update_", "sgd_nesterov_update_"))
