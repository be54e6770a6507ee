"""attention as the tools see them (``runtime.adapter.declare``): a call checked as the call
checks it, its kernel and tiling (pinned, tuned or the head dimension's default)."""

from __future__ import annotations

from ...runtime.adapter import Configs, Planned, declare
from ...runtime.dtypes import as_dtype
from . import cases
from .op import ARRAYS, Call, attention, checked, clear_plans, launch_params
from .spec import CONFIGS, AttentionConfig, make_spec
from .warmup import TABLE, parse_config


def _check(args) -> Call:
    return checked(args, args.device)


def _choose(call: Call, device_id: int) -> Planned:
    grid, block, smem = (1, 1, 1), (call.spec.threads, 1, 1), call.spec.smem_bytes
    if not call.empty:
        grid, block, smem, _ = launch_params(call)
    # FlashAttention's count: 4 B H S_q S_k D (two products), halved when causal
    flops = 4.0 * call.batch * call.heads * call.seqlen_q * call.seqlen_k * call.head_dim
    return Planned((call.spec,), call.config.name, call.reason, grid, block, smem,
                   flops=flops / 2 if call.causal else flops, detail=call.spec.kernel_name)


def _specs(config, arch: str, *, dtype="bfloat16", head_dim: int = 128, causal: bool = False,
           window: bool = False, softcap: bool = False, varlen: bool = False,
           lse: bool = False) -> list:
    """The forward kernel of ``config`` (None: the head dimension's default) for these
    options."""
    return [make_spec(as_dtype(dtype), head_dim, causal=causal, window=window, softcap=softcap,
                      varlen=varlen, write_lse=lse, config=config)]


ATTENTION = declare(
    "attention", attention, arrays=ARRAYS, check=_check, choose=_choose,
    key=lambda call: call.key,
    configs=Configs(_specs, parse_config, lambda call: list(CONFIGS[call.head_dim]),
                    (AttentionConfig,)),
    warmup={"attention": TABLE}, kernel_prefixes=("attn_fwd_",),
    layout_cases=cases.forward_cases, clear_plans=clear_plans)
