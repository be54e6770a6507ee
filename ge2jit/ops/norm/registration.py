"""rms_norm, layer_norm and their backward as the tools see them (``runtime.registry.Op``):
what a call runs, its candidates, its tuning key, the kernels of a config and the warm-up
tables (``[[rms_norm]]``, ``[[layer_norm]]``, ``[[rms_norm_backward]]``,
``[[layer_norm_backward]]``)."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...jit.nvrtc import normalize_arch
from ...runtime.arrays import call_arguments, views
from ...runtime.dtypes import as_dtype
from ...runtime.registry import ConfigChoice, Explanation, Op, bind
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


def _checked(function, names, check, args, kwargs, config=...):
    """(the checked call, device) of ``function``'s arguments, by ``check(views, bound
    arguments)``; ``config``, where given, in place of the call's."""
    a = bind(function, args, kwargs)
    if config is not ...:
        a["config"] = config
    fw, device_id, native = call_arguments({k: a.get(k) for k in names})
    return check(views(fw, native), a), device_id


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

    def checked(args, kwargs, config=...):
        return _checked(function, FORWARD_NAMES, lambda v, a: checked_forward(
            kind, v, a["eps"], a["save_stats"], a["config"]), args, kwargs, config)

    def plan(*args, **kwargs) -> Explanation:
        call, device_id = checked(args, kwargs)
        choice, reason = decide_forward(call, device_id)
        return Explanation(ConfigChoice(choice.config.name, reason, choice.spec.kernel_name),
                           (get_kernel(choice.spec, device_id),), choice.grid, choice.block, 0)

    def candidate_names(*args, **kwargs) -> list[str]:
        return [c.name for c in candidates(checked(args, kwargs, None)[0].n)]

    def key(*args, **kwargs) -> dict:
        call = checked(args, kwargs, None)[0]
        return forward_key(kind, call.types, call.rows, call.n)

    def call_specs(config, *args, **kwargs) -> list:
        call, device_id = checked(args, kwargs, config)
        return [decide_forward(call, device_id)[0].spec]

    def specs_for_config(config, arch: str, *, dtype="float32", out_dtype="same",
                         weight_dtype="same", bias_dtype="same" if kind == "layer" else None,
                         residual_dtype=None, save_stats: bool = False, vec: int = 8) -> list:
        """The forward kernel of ``config`` for these types on ``arch`` ("same": x's type,
        None: absent), with accesses of up to ``vec`` elements."""
        normalize_arch(arch)
        _no_configs_given(config, name)
        x = as_dtype(dtype)
        if kind == "rms" and bias_dtype is not None:
            raise ArgumentValueError(f"bias_dtype: {name} has no bias, got {bias_dtype!r}")
        r = _pick(residual_dtype, x, "residual_dtype")
        types = ForwardTypes(x, _pick(out_dtype, x, "out_dtype") or x, r, r,
                             _pick(weight_dtype, x, "weight_dtype"),
                             _pick(bias_dtype, x, "bias_dtype"), bool(save_stats))
        return [make_spec(kind, parse_config(config), types, vec)]

    return Op(name=name, function=function, warmup={name: getattr(warmup, kind)}, plan=plan,
              candidates=candidate_names, tuning_key=key, call_specs=call_specs,
              specs_for_config=specs_for_config, config_types=(NormConfig,),
              kernel_prefixes=(f"{name}_",), layout_cases=cases.forward_cases(kind))


def _backward_op(kind: str, function) -> Op:
    name = f"{OP_NAMES[kind]}_backward"

    def checked(args, kwargs, config=...):
        return _checked(function, BACKWARD_NAMES, lambda v, a: checked_backward(
            kind, v, a["config"]), args, kwargs, config)

    def kernels(call, device_id):
        choice, sums, reason = decide_backward(call, device_id)
        return choice, reason, [choice.spec] + ([sums] if sums is not None else [])

    def plan(*args, **kwargs) -> Explanation:
        call, device_id = checked(args, kwargs)
        choice, reason, specs = kernels(call, device_id)
        return Explanation(ConfigChoice(choice.config.name, reason, choice.spec.kernel_name),
                           tuple(get_kernel(s, device_id) for s in specs), choice.grid,
                           choice.block, choice.spec.smem_bytes)

    def candidate_names(*args, **kwargs) -> list[str]:
        return [c.name for c in backward_candidates(checked(args, kwargs, None)[0].n)]

    def key(*args, **kwargs) -> dict:
        call = checked(args, kwargs, None)[0]
        return backward_key(kind, call.types, call.rows, call.n)

    def call_specs(config, *args, **kwargs) -> list:
        return kernels(*checked(args, kwargs, config))[2]

    def specs_for_config(config, arch: str, *, dtype="float32", h_dtype="same",
                         weight_dtype="same", bias_dtype="same" if kind == "layer" else None,
                         dh_dtype=None, vec: int = 8) -> list:
        """The backward kernel of ``config`` for these types on ``arch`` (``dtype``: dy's;
        "same": dy's type, None: absent), and the kernel that adds up its partial sums."""
        normalize_arch(arch)
        _no_configs_given(config, name)
        dy = as_dtype(dtype)
        if kind == "rms" and bias_dtype is not None:
            raise ArgumentValueError(f"bias_dtype: {name} has no bias, got {bias_dtype!r}")
        h = _pick(h_dtype, dy, "h_dtype") or dy
        types = BackwardTypes(dy, h, h, _pick(weight_dtype, dy, "weight_dtype"),
                              _pick(bias_dtype, dy, "bias_dtype"), _pick(dh_dtype, dy, "dh_dtype"))
        specs = [make_backward_spec(kind, parse_backward_config(config), types, vec)]
        if types.partials:
            specs.append(NormSumsSpec(kind, types.weight, types.bias))
        return specs

    return Op(name=name, function=function, warmup={name: getattr(warmup, f"{kind}_backward")},
              plan=plan, candidates=candidate_names, tuning_key=key, call_specs=call_specs,
              specs_for_config=specs_for_config, config_types=(NormBackwardConfig,),
              kernel_prefixes=(f"{name}_",), layout_cases=cases.backward_cases(kind))


RMS_NORM = _forward_op("rms", rms_norm)
LAYER_NORM = _forward_op("layer", layer_norm)
RMS_NORM_BACKWARD = _backward_op("rms", rms_norm_backward)
LAYER_NORM_BACKWARD = _backward_op("layer", layer_norm_backward)
