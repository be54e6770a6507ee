"""softmax and softmax_backward as the tools see them (``runtime.registry.Op``): what a call
runs, its candidates, its tuning key and the kernels of a config."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...jit.nvrtc import normalize_arch
from ...runtime.arrays import call_arguments, views
from ...runtime.dtypes import as_dtype
from ...runtime.registry import ConfigChoice, Explanation, Op, bind
from . import cases, warmup
from .op import BACKWARD, FORWARD, Kind, checked, decide, softmax, softmax_backward, tuning_key
from .spec import SoftmaxConfig, candidates, make_spec, parse_config

#: floating-point operations per element: max, subtract, exp, sum, scale (forward); multiply,
#: sum, subtract, multiply (backward)
FLOPS = {False: 5.0, True: 4.0}


def _op(kind: Kind, function) -> Op:
    def call(args, kwargs, config=None):
        """The checked arguments of a call (CuPy views) and the device; ``config`` replaces
        the call's own."""
        b = bind(function, args, kwargs)
        arrays = {name: b[name] for name in kind.inputs} | {"out": b["out"]}
        fw, device_id, native = call_arguments(arrays)
        v = views(fw, native)
        cfg = b["config"] if config is None else config
        return checked(kind, [v[n] for n in kind.inputs], b["axis"], v["out"], cfg), device_id

    def plan(*args, **kwargs) -> Explanation:
        (ins, out, ax, in_dtype, out_dtype, cfg), device_id = call(args, kwargs)
        choice, _, reason = decide(kind, ins, out, ax, in_dtype, out_dtype, cfg, device_id)
        return Explanation(ConfigChoice(choice.spec.config.name, reason, choice.spec.kernel_name),
                           (get_kernel(choice.spec, device_id),), choice.grid, choice.block, 0,
                           flops=FLOPS[kind.backward] * ins[0].size)

    def candidate_names(*args, **kwargs) -> list[str]:
        (ins, out, ax, in_dtype, out_dtype, _), _ = call(args, kwargs)
        n = (ins[0].shape or (1,))[ax]
        strided = not tuning_key(ins[0], ax, out=out)["rows_along_last_axis"]
        return [c.name for c in candidates(n, in_dtype, out_dtype, strided=strided,
                                           backward=kind.backward)]

    def key(*args, **kwargs) -> dict:
        (ins, out, ax, *_), _ = call(args, kwargs)
        return tuning_key(ins[0], ax, out=out)

    def call_specs(config, *args, **kwargs) -> list:
        (ins, out, ax, in_dtype, out_dtype, cfg), device_id = call(args, kwargs, config)
        return [decide(kind, ins, out, ax, in_dtype, out_dtype, cfg, device_id)[0].spec]

    def specs_for_config(config, arch: str, *, dtype="float32", out_dtype=None, vec: int = 8
                         ) -> list:
        """The kernel of ``config`` (a name or SoftmaxConfig) for these types on ``arch``,
        with accesses of up to ``vec`` elements (what aligned rows allow)."""
        normalize_arch(arch)
        if config is None:
            raise ArgumentValueError(f"config: {kind.name}'s kernels are named by config, e.g. "
                                     "'block_1024_v16'; got None")
        return [make_spec(parse_config(config), as_dtype(dtype),
                          None if out_dtype is None else as_dtype(out_dtype), vec,
                          backward=kind.backward)]

    return Op(name=kind.name, function=function,
              warmup={kind.name: warmup.TABLES[kind.backward]}, plan=plan,
              candidates=candidate_names, tuning_key=key, call_specs=call_specs,
              specs_for_config=specs_for_config, config_types=(SoftmaxConfig,),
              kernel_prefixes=(f"{kind.name}_",),
              layout_cases=cases.backward_cases if kind.backward else cases.forward_cases)


SOFTMAX = _op(FORWARD, softmax)
SOFTMAX_BACKWARD = _op(BACKWARD, softmax_backward)
