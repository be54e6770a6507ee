"""quantize_fp8 as the tools see it (``runtime.registry.Op``): what a call runs, its
candidates, its tuning key and the kernels of a config."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.nvrtc import arch_number
from ...runtime.adapter import Configs, Planned, declare
from ...runtime.checks import check_bool, host_scale
from ...runtime.dtypes import as_dtype, as_fp8
from . import cases, warmup
from .op import NAME, explain_parts, is_flat, quantize_fp8, tuning_key
from .spec import SCALE_KINDS, QuantConfig, candidates, kernels, parse_config, source_of

#: floating-point operations per element: |x| and its maximum, the multiply
FLOPS = 3.0


def check(args) -> tuple:
    """(problem, kernels, reason) of a checked call (the choice needs the device)."""
    check_bool(args["per_row"], "per_row")
    scale = args["scale"]
    if not host_scale(scale):
        scale = args.fw.view(scale, "scale")
    return explain_parts(args["x"], scale, args["per_row"], args["amax_out"], args["out"],
                         args["fmt"], args["config"], args.device)


def choose(call: tuple, device_id: int) -> Planned:
    prob, ks, reason = call
    return Planned(tuple(ks.specs), ks.config.name, reason, ks.grid, ks.block,
                   flops=FLOPS * prob.rows * prob.n, detail=ks.quantize.kernel_name)


def specs(config, arch: str, *, dtype="bfloat16", fmt="e4m3", scale="dynamic",
          per_row: bool = False, amax: bool = False, vec: int = 8) -> list:
    """The kernels of ``config`` (None: the heuristic's for rows of 4096) on ``arch`` (sm_89
    or newer): x of ``dtype`` to ``fmt``, the scale ``"dynamic"``, ``"device"`` or
    ``"host"``, ``per_row`` or per tensor, ``amax`` kept, accesses of up to ``vec``
    elements. The quantize kernel first."""
    if arch_number(arch) < 89:
        raise ArgumentValueError(f"arch: 8-bit float conversions need sm_89 or newer, got "
                                 f"{arch}")
    check_bool(per_row, "per_row")
    check_bool(amax, "amax")
    source = source_of(scale, per_row) if scale in SCALE_KINDS else None
    if source is None:
        raise ArgumentValueError(f"scale: expected 'dynamic', 'device' or 'host' ('host' per "
                                 f"tensor only), got {scale!r}")
    cfg = config or parse_config("flat_512" if not per_row else "block_256_v16")
    return list(kernels(cfg, 1, cfg.capacity or 4096, as_dtype(dtype), as_fp8(fmt),
                        source, amax=amax, max_vec=vec).specs)


def _tried(call) -> list:
    prob = call[0]
    return candidates(prob.n, is_flat(prob, prob.n))


QUANTIZE_FP8 = declare(NAME, quantize_fp8, arrays=("x", "amax_out", "out"), check=check,
                       choose=choose, key=lambda call: tuning_key(call[0]),
                       configs=Configs(specs, parse_config, _tried, (QuantConfig,)),
                       warmup={NAME: warmup.TABLE}, kernel_prefixes=("quantize_fp8_",),
                       layout_cases=cases.layout_cases)
