"""attention as the tools see them (``runtime.adapter.declare``): a call checked as the call
checks it, its kernel and tiling (pinned, tuned or the head dimension's default)."""

from __future__ import annotations

from ...jit.device import sm_count
from ...jit.nvrtc import arch_number
from ...runtime.adapter import Configs, Planned, declare
from ...runtime.dtypes import as_dtype
from . import backward, cases
from .op import ARRAYS, Call, attention, checked, clear_plans, launch_params
from .spec import (
    AttentionConfig,
    AttentionSm90Config,
    bwd_specs_for,
    candidates_for,
    forward_specs,
    fused_step,
)
from .warmup import BACKWARD_TABLE, TABLE, parse_config


def _check(args) -> Call:
    return checked(args, args.device)


def _flops(call: Call) -> float:
    """FlashAttention's count of a forward: 4 B H S_q S_k D (two products), halved when
    causal (the backward's is 2.5 times it)."""
    flops = 4.0 * call.batch * call.heads * call.seqlen_q * call.seqlen_k * call.head_dim
    return flops / 2 if call.causal else flops


def _choose(call: Call, device_id: int) -> Planned:
    grid, block, smem = (1, 1, 1), (call.spec.threads, 1, 1), call.spec.smem_bytes
    if not call.empty:
        grid, block, smem, _ = launch_params(call, sm_count(device_id))
    return Planned((call.spec,), call.config.name, call.reason, grid, block, smem,
                   flops=_flops(call), detail=call.spec.kernel_name)


def _choose_backward(call: backward.BackwardCall, device_id: int) -> Planned:
    """The three kernels, the dk-dv kernel's launch (the largest) as the main one."""
    launches, _ = backward.launch_params(call)
    main = next(i for i, (s, *_) in enumerate(launches) if s.kind in ("dkv", "dkvq"))
    spec, grid, block, smem = launches[main]
    others = tuple(s for i, s in enumerate(call.specs) if i != main)
    form = "dq and dk-dv kernels, deterministic"
    if spec.kind == "dkvq":
        f = call.fwd
        _, step = fused_step(call.family, f.head_dim, f.seqlen_q, causal=f.causal,
                             window=f.spec.window, softcap=f.spec.softcap, varlen=f.varlen,
                             segments=f.spec.segments)
        form = (f"one kernel, dq added up by bulk reductions (deterministic=True: two "
                f"kernels), {step}")
    return Planned((spec, *others), call.family, "fixed", grid, block, smem,
                   flops=2.5 * _flops(call.fwd), detail=f"{spec.kernel_name}, {form}")


def _backward_specs(config, arch: str, *, dtype="bfloat16", head_dim: int = 128,
                    causal: bool = False, window: bool = False, softcap: bool = False,
                    varlen: bool = False, segments: bool = False) -> list:
    """The backward's kernels of ``config`` ("sm90": the Hopper ones; "sm90w", "sm90n",
    "sm90d"; "sm80"; None: the architecture's) for these options, the "dot" kernel first."""
    family = config or ("sm90" if arch_number(arch) == 90 else "sm80")
    return list(bwd_specs_for(family, as_dtype(dtype), head_dim, causal=causal, window=window,
                              softcap=softcap, varlen=varlen, segments=segments))


def _backward_family(name):
    """A backward kernels' name, checked: "sm80", "sm90", "sm90w", "sm90n" or "sm90d"."""
    return backward._family(name, 90)


def _specs(config, arch: str, *, dtype="bfloat16", head_dim: int = 128, causal: bool = False,
           window: bool = False, softcap: bool = False, varlen: bool = False,
           lse: bool = False, segments: bool = False) -> list:
    """The forward kernel of ``config`` (None: the head dimension's defaults for ``arch``: the
    Hopper kernel on sm_90, for long and for short sequences where they differ) for these
    options."""
    return forward_specs(config, as_dtype(dtype), head_dim, arch_number(arch), causal=causal,
                         window=window, softcap=softcap, varlen=varlen, write_lse=lse,
                         segments=segments)


ATTENTION = declare(
    "attention", attention, arrays=ARRAYS, check=_check, choose=_choose,
    key=lambda call: call.key,
    configs=Configs(_specs, parse_config,
                    lambda call: list(candidates_for(call.head_dim, call.arch)),
                    (AttentionConfig, AttentionSm90Config)),
    warmup={"attention": TABLE}, kernel_prefixes=("attn_fwd_",),
    layout_cases=cases.forward_cases, clear_plans=clear_plans)

ATTENTION_BACKWARD = declare(
    "attention_backward", backward.attention_backward, arrays=backward.ARRAYS[:backward.INPUTS],
    parts={"out": (backward.outputs, backward.ARRAYS[backward.INPUTS:])},
    check=lambda args: backward.checked_backward(args, args.device), choose=_choose_backward,
    configs=Configs(_backward_specs, _backward_family),
    warmup={"attention_backward": BACKWARD_TABLE},
    kernel_prefixes=("attn_bwd_",), layout_cases=cases.backward_cases,
    clear_plans=backward.clear_plans)
