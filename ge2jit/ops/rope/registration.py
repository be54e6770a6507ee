"""rope and rope_backward as the tools see them (``runtime.adapter.declare``): one kernel a
call, no configs to choose among."""

from __future__ import annotations

from ...runtime.adapter import Configs, Planned, declare
from . import cases
from .op import Call, checked, launch_params, outputs, rope, rope_backward
from .spec import make_spec
from .warmup import TABLES

#: floating-point operations per rotated pair: four multiplies, two adds
FLOPS = 6.0


def _declare(name: str, function, backward: bool):
    def check(args) -> Call:
        return checked(args, bool(args["interleaved"]), backward)

    def choose(call: Call, device_id: int) -> Planned:
        grid, block, _ = launch_params(call, call.q_out, call.k_out)
        heads = call.q.shape[-2] + (0 if call.k is None else call.k.shape[-2])
        return Planned((call.spec,), "fixed", "fixed", grid, block, detail=call.spec.kernel_name,
                       flops=FLOPS * call.batch * call.seq * heads * call.half)

    def specs(config, arch: str, *, dtype="bfloat16", table_dtype=None, positions=None,
              interleaved: bool = False, partial: bool = False, vec: int = 8) -> list:
        """The kernel for these types and options with accesses of up to ``vec`` elements
        (``partial``: a rotary dimension below the head's, the rest copied)."""
        return [make_spec(dtype, table_dtype, positions=positions, interleaved=interleaved,
                          backward=backward, copy_rest=partial, vec=vec)]

    return declare(name, function, arrays=("q", "k", "cos", "sin", "positions"), check=check,
                   parts={"out": (outputs, ("q_out", "k_out"))},
                   choose=choose, configs=Configs(specs), warmup={name: TABLES[backward]},
                   kernel_prefixes=(f"rope_{'bwd' if backward else 'fwd'}_",),
                   layout_cases=cases.backward_cases if backward else cases.forward_cases)


ROPE = _declare("rope", rope, False)
ROPE_BACKWARD = _declare("rope_backward", rope_backward, True)
