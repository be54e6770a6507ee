"""softmax and softmax_backward as the tools see them, declared by how a call is checked and
how its kernel is chosen (``runtime.adapter.declare`` derives the rest)."""

from __future__ import annotations

from typing import NamedTuple

from ...errors import ArgumentValueError
from ...runtime.adapter import Configs, Planned, declare
from ...runtime.dtypes import DType, as_dtype
from . import cases, warmup
from .op import BACKWARD, FORWARD, Kind, checked, decide, softmax, softmax_backward, tuning_key
from .spec import SoftmaxConfig, candidates, make_spec, parse_config

#: floating-point operations per element: max, subtract, exp, sum, scale (forward); multiply,
#: sum, subtract, multiply (backward)
FLOPS = {False: 5.0, True: 4.0}


class Call(NamedTuple):
    """A checked call (CuPy views; ``axis`` normalized; ``out`` None: a new output)."""

    inputs: list
    out: object
    axis: int
    in_dtype: DType
    out_dtype: DType
    config: SoftmaxConfig | None


def _declare(kind: Kind, function):
    def check(args) -> Call:
        return Call(*checked(kind, [args[n] for n in kind.inputs], args["axis"], args["out"],
                             args["config"]))

    def choose(call: Call, device_id: int) -> Planned:
        choice, _, reason = decide(kind, *call, device_id)
        return Planned((choice.spec,), choice.spec.config.name, reason, choice.grid,
                       choice.block, flops=FLOPS[kind.backward] * call.inputs[0].size,
                       detail=choice.spec.kernel_name)

    def key(call: Call) -> dict:
        return tuning_key(call.inputs[0], call.axis, out=call.out)

    def tried(call: Call) -> list:
        n = (call.inputs[0].shape or (1,))[call.axis]
        return candidates(n, call.in_dtype, call.out_dtype, backward=kind.backward,
                          strided=not key(call)["rows_along_last_axis"])

    def specs(config, arch: str, *, dtype="float32", out_dtype=None, vec: int = 8) -> list:
        """The kernel of ``config`` for these types, with accesses of up to ``vec``
        elements (what aligned rows allow)."""
        if config is None:
            raise ArgumentValueError(f"config: {kind.name}'s kernels are named by config, e.g. "
                                     "'block_1024_v16'; got None")
        return [make_spec(config, as_dtype(dtype),
                          None if out_dtype is None else as_dtype(out_dtype), vec,
                          backward=kind.backward)]

    return declare(kind.name, function, arrays=(*kind.inputs, "out"), check=check,
                   choose=choose, key=key,
                   configs=Configs(specs, parse_config, tried, (SoftmaxConfig,)),
                   warmup={kind.name: warmup.TABLES[kind.backward]},
                   kernel_prefixes=(f"{kind.name}_",),
                   layout_cases=cases.backward_cases if kind.backward else cases.forward_cases)


SOFTMAX = _declare(FORWARD, softmax)
SOFTMAX_BACKWARD = _declare(BACKWARD, softmax_backward)
