"""cross_entropy as the tools see it (``runtime.registry.Op``): what a call runs, its
candidates, its tuning key and the kernels of a config."""

from __future__ import annotations

from typing import NamedTuple

from ...errors import ArgumentValueError
from ...runtime.adapter import Configs, Planned, declare
from . import cases, warmup
from .op import checked, cross_entropy, decide, tuning_key
from .spec import XentConfig, as_grad_dtype, as_target_dtype, candidates, kernels, parse_config

#: floating-point operations per logit: max, subtract, exp, add (the loss); exp, scale,
#: subtract, scale again (the gradient)
FLOPS_LOSS, FLOPS_GRAD = 4.0, 4.0


class Call(NamedTuple):
    """A checked call: its problem, the logits' view, the gradient's pointer and row stride
    (0, 0 without one)."""

    problem: object
    logits: object
    grad_ptr: int
    grad_stride: int


def check(args) -> Call:
    options = (args["ignore_index"], args["reduction"], args["label_smoothing"], args["grad"],
               args["grad_scale"] is None, args["inplace"], args["check_targets"],
               args["config"])
    prob, _ = checked(args["logits"], args["targets"], args["out"], options,
                      args["grad_scale"])
    out = args["logits"] if prob.inplace else args["out"]
    grad = (0, 0) if out is None else (out.data.ptr, out.strides[0] // out.itemsize)
    return Call(prob, args["logits"], *grad)


def choose(call: Call, device_id: int) -> Planned:
    prob = call.problem
    ks, reason = decide(prob, call.logits, call.grad_ptr, call.grad_stride)
    flops = (FLOPS_LOSS + (FLOPS_GRAD if prob.grad_dtype else 0.0)) * prob.rows * prob.n
    return Planned(tuple(ks.specs), ks.config.name, reason, ks.grid, ks.block, flops=flops,
                   detail=ks.rows.kernel_name)


def specs(config, arch: str, *, dtype="float32", target_dtype="int64",
                     grad_dtype=None, reduction: str = "mean", smoothing: bool = False,
                     check: bool = True, vec: int = 8) -> list:
    """The kernels of ``config`` (a name or XentConfig; None: the heuristic's for 32768
    classes) on ``arch``: logits of ``dtype``, class indices of ``target_dtype``, a gradient
    of ``grad_dtype`` (None: the loss alone), ``reduction``, label ``smoothing`` on or off,
    the targets ``check``ed, accesses of up to ``vec`` elements. The rows kernel first."""
    if not isinstance(smoothing, bool) or not isinstance(check, bool):
        raise ArgumentValueError(f"smoothing, check: expected booleans, got {smoothing!r}, "
                                 f"{check!r}")
    cfg = config or parse_config("block_512")
    return list(kernels(cfg, 1, dtype, as_target_dtype(target_dtype), as_grad_dtype(grad_dtype),
                        reduction=reduction, smoothing=smoothing, check=check,
                        max_vec=vec).specs)


CROSS_ENTROPY = declare(
    "cross_entropy", cross_entropy, arrays=("logits", "targets", "out"), check=check,
    choose=choose, key=lambda call: tuning_key(call.problem),
    configs=Configs(specs, parse_config, lambda call: candidates(call.problem.n),
                    (XentConfig,)),
    warmup={"cross_entropy": warmup}, kernel_prefixes=("cross_entropy_",),
    layout_cases=cases.layout_cases)
