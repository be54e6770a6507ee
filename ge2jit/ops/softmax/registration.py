"""softmax as the tools see it (``runtime.registry.Op``): what a call runs, its candidates,
its tuning key and the kernels of a config."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...jit.nvrtc import normalize_arch
from ...runtime.arrays import call_arguments, views
from ...runtime.registry import ConfigChoice, Explanation, Op
from . import warmup
from .op import checked, decide, softmax, tuning_key
from .spec import SoftmaxConfig, as_dtype, candidates, make_spec, parse_config


def _call(x, axis=-1, *, out=None, config=None):
    """The checked arguments of a call (CuPy views) and the device."""
    fw, device_id, native = call_arguments({"x": x, "out": out})
    v = views(fw, native)
    return checked(v["x"], axis, v["out"], config), device_id


def plan(x, axis=-1, *, out=None, config=None) -> Explanation:
    (x, out, ax, in_dtype, out_dtype, cfg), device_id = _call(x, axis, out=out, config=config)
    choice, _, reason = decide(x, out, ax, in_dtype, out_dtype, cfg, device_id)
    flops = 5.0 * x.size   # max, subtract, exp, sum, scale: per element
    return Explanation(ConfigChoice(choice.spec.config.name, reason, choice.spec.kernel_name),
                       (get_kernel(choice.spec, device_id),), choice.grid, choice.block, 0,
                       flops=flops)


def candidate_names(x, axis=-1, *, out=None, config=None) -> list[str]:
    (x, out, ax, in_dtype, out_dtype, _), _ = _call(x, axis, out=out)
    n = (x.shape or (1,))[ax]
    strided = not tuning_key(x, ax, out=out)["rows_along_last_axis"]
    return [c.name for c in candidates(n, in_dtype, out_dtype, strided=strided)]


def key(x, axis=-1, *, out=None, config=None) -> dict:
    (x, out, ax, *_), _ = _call(x, axis, out=out)
    return tuning_key(x, ax, out=out)


def call_specs(config, x, axis=-1, *, out=None, **_) -> list:
    (x, out, ax, in_dtype, out_dtype, cfg), device_id = _call(x, axis, out=out, config=config)
    return [decide(x, out, ax, in_dtype, out_dtype, cfg, device_id)[0].spec]


def specs_for_config(config, arch: str, *, dtype="float32", out_dtype=None, vec: int = 8
                     ) -> list:
    """The kernel of ``config`` (a name or SoftmaxConfig) for these types on ``arch``, with
    accesses of up to ``vec`` elements (what aligned rows allow)."""
    normalize_arch(arch)
    if config is None:
        raise ArgumentValueError("config: softmax's kernels are named by config, e.g. "
                                 "'block_1024_v16'; got None")
    return [make_spec(parse_config(config), as_dtype(dtype),
                      None if out_dtype is None else as_dtype(out_dtype), vec)]


SOFTMAX = Op(name="softmax", function=softmax, warmup={"softmax": warmup}, plan=plan,
             candidates=candidate_names, tuning_key=key, call_specs=call_specs,
             specs_for_config=specs_for_config, config_types=(SoftmaxConfig,),
             kernel_prefixes=("softmax_",))
