"""cross_entropy as the tools see it (``runtime.registry.Op``): what a call runs, its
candidates, its tuning key and the kernels of a config."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...jit.nvrtc import normalize_arch
from ...runtime.arrays import call_arguments, views
from ...runtime.registry import ConfigChoice, Explanation, Op, bind
from . import cases, warmup
from .op import checked, cross_entropy, decide, tuning_key
from .spec import XentConfig, as_grad_dtype, as_target_dtype, candidates, kernels, parse_config

#: floating-point operations per logit: max, subtract, exp, add (the loss); exp, scale,
#: subtract, scale again (the gradient)
FLOPS_LOSS, FLOPS_GRAD = 4.0, 4.0


def _checked(args, kwargs, config=None):
    """(problem, the logits' view, the gradient's pointer and row stride, device) of a call's
    arguments; ``config`` replaces the call's own."""
    b = bind(cross_entropy, args, kwargs)
    fw, device_id, native = call_arguments({k: b[k] for k in ("logits", "targets", "out")})
    v = views(fw, native)
    options = (b["ignore_index"], b["reduction"], b["label_smoothing"], b["grad"],
               b["grad_scale"] is None, b["inplace"], b["check_targets"],
               b["config"] if config is None else config)
    prob, _ = checked(v["logits"], v["targets"], v["out"], options, b["grad_scale"])
    logits, out = v["logits"], v["out"]
    if prob.inplace:
        out = logits
    grad = (0, 0) if out is None else (out.data.ptr, out.strides[0] // out.itemsize)
    return prob, logits, grad, device_id


def plan(*args, **kwargs) -> Explanation:
    prob, logits, grad, device_id = _checked(args, kwargs)
    ks, reason = decide(prob, logits, *grad)
    loaded = tuple(get_kernel(s, device_id) for s in ks.specs)
    flops = (FLOPS_LOSS + (FLOPS_GRAD if prob.grad_dtype else 0.0)) * prob.rows * prob.n
    return Explanation(ConfigChoice(ks.config.name, reason, ks.rows.kernel_name), loaded,
                       ks.grid, ks.block, 0, flops=flops)


def candidate_names(*args, **kwargs) -> list[str]:
    prob, *_ = _checked(args, kwargs)
    return [c.name for c in candidates(prob.n)]


def key(*args, **kwargs) -> dict:
    return tuning_key(_checked(args, kwargs)[0])


def call_specs(config, *args, **kwargs) -> list:
    prob, logits, grad, _ = _checked(args, kwargs, config)
    return list(decide(prob, logits, *grad)[0].specs)


def specs_for_config(config, arch: str, *, dtype="float32", target_dtype="int64",
                     grad_dtype=None, reduction: str = "mean", smoothing: bool = False,
                     check: bool = True, vec: int = 8) -> list:
    """The kernels of ``config`` (a name or XentConfig; None: the heuristic's for 32768
    classes) on ``arch``: logits of ``dtype``, class indices of ``target_dtype``, a gradient
    of ``grad_dtype`` (None: the loss alone), ``reduction``, label ``smoothing`` on or off,
    the targets ``check``ed, accesses of up to ``vec`` elements. The rows kernel first."""
    normalize_arch(arch)
    if not isinstance(smoothing, bool) or not isinstance(check, bool):
        raise ArgumentValueError(f"smoothing, check: expected booleans, got {smoothing!r}, "
                                 f"{check!r}")
    cfg = parse_config(config if config is not None else "block_512")
    return list(kernels(cfg, 1, dtype, as_target_dtype(target_dtype), as_grad_dtype(grad_dtype),
                        reduction=reduction, smoothing=smoothing, check=check,
                        max_vec=vec).specs)


CROSS_ENTROPY = Op(name="cross_entropy", function=cross_entropy,
                   warmup={"cross_entropy": warmup}, plan=plan, candidates=candidate_names,
                   tuning_key=key, call_specs=call_specs, specs_for_config=specs_for_config,
                   config_types=(XentConfig,), kernel_prefixes=("cross_entropy_",),
                   layout_cases=cases.layout_cases)
