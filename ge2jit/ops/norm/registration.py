"""rms_norm, layer_norm and their backward as the tools see them (``runtime.registry.Op``):
what a call runs, its candidates, its tuning key, the kernels of a config and the warm-up
tables (``[[rms_norm]]``, ``[[layer_norm]]``, ``[[rms_norm_backward]]``,
``[[layer_norm_backward]]``)."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...runtime.adapter import Configs, Planned, declare
from ...runtime.dtypes import as_dtype
from ...runtime.registry import Op
from . import cases, warmup
from .op import (
    BACKWARD_NAMES,
    FORWARD_NAMES,
    backward_key,
    checked_backward,
    checked_forward,
    decide_backward,
    decide_forward,
    forward_key,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)
from .spec import (
    OP_NAMES,
    BackwardTypes,
    ForwardTypes,
    NormBackwardConfig,
    NormConfig,
    NormSumsSpec,
    backward_candidates,
    candidates,
    make_backward_spec,
    make_spec,
    parse_backward_config,
    parse_config,
)


def _pick(value, same, name: str):
    """A type argument of ``specs_for_config``: None or "none" (absent), "same" (``same``),
    or a dtype."""
    if value is None or value == "none":
        return None
    if value == "same":
        return same
    try:
        return as_dtype(value)
    except ArgumentValueError:
        raise ArgumentValueError(f"{name}: expected None, 'same' or one of float32, float16, "
                                 f"bfloat16, got {value!r}") from None


def _no_configs_given(config, what: str) -> None:
    if config is None:
        raise ArgumentValueError(f"config: {what}'s kernels are named by config, e.g. "
                                 "'block_512_v8'; got None")


def _forward_op(kind: str, function) -> Op:
    name = OP_NAMES[kind]

    def check(args):
        return checked_forward(kind, {n: args.get(n) for n in FORWARD_NAMES}, args["eps"],
                               args["save_stats"], args["config"])

    def choose(call, device_id: int) -> Planned:
        choice, reason = decide_forward(call, device_id)
        return Planned((choice.spec,), choice.config.name, reason, choice.grid, choice.block,
                       detail=choice.spec.kernel_name)

    def specs_for_config(config, arch: str, *, dtype="float32", out_dtype="same",
                         weight_dtype="same", bias_dtype="same" if kind == "layer" else None,
                         residual_dtype=None, save_stats: bool = False, vec: int = 8) -> list:
        """The forward kernel of ``config`` for these types on ``arch`` ("same": x's type,
        None: absent), with accesses of up to ``vec`` elements."""
        _no_configs_given(config, name)
        x = as_dtype(dtype)
        if kind == "rms" and bias_dtype is not None:
            raise ArgumentValueError(f"bias_dtype: {name} has no bias, got {bias_dtype!r}")
        r = _pick(residual_dtype, x, "residual_dtype")
        types = ForwardTypes(x, _pick(out_dtype, x, "out_dtype") or x, r, r,
                             _pick(weight_dtype, x, "weight_dtype"),
                             _pick(bias_dtype, x, "bias_dtype"), bool(save_stats))
        return [make_spec(kind, config, types, vec)]

    return declare(name, function, arrays=FORWARD_NAMES, check=check, choose=choose,
                   key=lambda call: forward_key(kind, call.types, call.rows, call.n),
                   configs=Configs(specs_for_config, parse_config,
                                   lambda call: candidates(call.n), (NormConfig,)),
                   warmup={name: getattr(warmup, kind)}, kernel_prefixes=(f"{name}_",),
                   layout_cases=cases.forward_cases(kind))


def _backward_op(kind: str, function) -> Op:
    name = f"{OP_NAMES[kind]}_backward"

    def check(args):
        return checked_backward(kind, {n: args.get(n) for n in BACKWARD_NAMES}, args["config"])

    def choose(call, device_id: int) -> Planned:
        choice, sums, reason = decide_backward(call, device_id)
        return Planned((choice.spec,) + ((sums,) if sums is not None else ()),
                       choice.config.name, reason, choice.grid, choice.block,
                       choice.spec.smem_bytes, detail=choice.spec.kernel_name)

    def specs_for_config(config, arch: str, *, dtype="float32", h_dtype="same",
                         weight_dtype="same", bias_dtype="same" if kind == "layer" else None,
                         dh_dtype=None, vec: int = 8) -> list:
        """The backward kernel of ``config`` for these types on ``arch`` (``dtype``: dy's;
        "same": dy's type, None: absent), and the kernel that adds up its partial sums."""
        _no_configs_given(config, name)
        dy = as_dtype(dtype)
        if kind == "rms" and bias_dtype is not None:
            raise ArgumentValueError(f"bias_dtype: {name} has no bias, got {bias_dtype!r}")
        h = _pick(h_dtype, dy, "h_dtype") or dy
        types = BackwardTypes(dy, h, h, _pick(weight_dtype, dy, "weight_dtype"),
                              _pick(bias_dtype, dy, "bias_dtype"), _pick(dh_dtype, dy, "dh_dtype"))
        specs = [make_backward_spec(kind, config, types, vec)]
        if types.partials:
            specs.append(NormSumsSpec(kind, types.weight, types.bias))
        return specs

    return declare(name, function, arrays=BACKWARD_NAMES, check=check, choose=choose,
                   key=lambda call: backward_key(kind, call.types, call.rows, call.n),
                   configs=Configs(specs_for_config, parse_backward_config,
                                   lambda call: backward_candidates(call.n),
                                   (NormBackwardConfig,)),
                   warmup={name: getattr(warmup, f"{kind}_backward")},
                   kernel_prefixes=(f"{name}_",), layout_cases=cases.backward_cases(kind))


RMS_NORM = _forward_op("rms", rms_norm)
LAYER_NORM = _forward_op("layer", layer_norm)
RMS_NORM_BACKWARD = _backward_op("rms", rms_norm_backward)
LAYER_NORM_BACKWARD = _backward_op("layer", layer_norm_backward)
