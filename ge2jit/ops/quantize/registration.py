"""quantize_fp8 as the tools see it (``runtime.registry.Op``): what a call runs, its
candidates, its tuning key and the kernels of a config."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.loader import get_kernel
from ...jit.nvrtc import arch_number, normalize_arch
from ...runtime.arrays import call_arguments, views
from ...runtime.checks import check_bool, host_scale
from ...runtime.dtypes import as_dtype, as_fp8
from ...runtime.registry import ConfigChoice, Explanation, Op, bind
from . import cases, warmup
from .op import NAME, explain_parts, is_flat, quantize_fp8, tuning_key
from .spec import SCALE_KINDS, QuantConfig, candidates, kernels, parse_config, source_of

#: floating-point operations per element: |x| and its maximum, the multiply
FLOPS = 3.0


def _parts(args, kwargs, config=None):
    b = bind(quantize_fp8, args, kwargs)
    check_bool(b["per_row"], "per_row")
    scale = b["scale"]
    fw, device_id, native = call_arguments(
        {"x": b["x"], "scale": None if host_scale(scale) else scale,
         "amax_out": b["amax_out"], "out": b["out"]})
    v = views(fw, native)
    with fw.context(device_id):
        return explain_parts(v["x"], scale if host_scale(scale) else v["scale"], b["per_row"],
                             v["amax_out"], v["out"], b["fmt"],
                             b["config"] if config is None else config, device_id), device_id


def plan(*args, **kwargs) -> Explanation:
    (prob, ks, reason), device_id = _parts(args, kwargs)
    loaded = tuple(get_kernel(s, device_id) for s in ks.specs)
    return Explanation(ConfigChoice(ks.config.name, reason, ks.quantize.kernel_name), loaded,
                       ks.grid, ks.block, 0, flops=FLOPS * prob.rows * prob.n)


def candidate_names(*args, **kwargs) -> list[str]:
    (prob, _, _), _ = _parts(args, kwargs)
    return [c.name for c in candidates(prob.n, is_flat(prob, prob.n))]


def key(*args, **kwargs) -> dict:
    return tuning_key(_parts(args, kwargs)[0][0])


def call_specs(config, *args, **kwargs) -> list:
    (_, ks, _), _ = _parts(args, kwargs, config)
    return list(ks.specs)


def specs_for_config(config, arch: str, *, dtype="bfloat16", fmt="e4m3", scale="dynamic",
                     per_row: bool = False, amax: bool = False, vec: int = 8) -> list:
    """The kernels of ``config`` (a name or QuantConfig; None: the heuristic's for rows of
    4096) on ``arch`` (sm_89 or newer): x of ``dtype`` to ``fmt``, the scale ``"dynamic"``,
    ``"device"`` or ``"host"``, ``per_row`` or per tensor, ``amax`` kept, accesses of up to
    ``vec`` elements. The quantize kernel first."""
    arch = normalize_arch(arch)
    if arch_number(arch) < 89:
        raise ArgumentValueError(f"arch: 8-bit float conversions need sm_89 or newer, got "
                                 f"{arch}")
    check_bool(per_row, "per_row")
    check_bool(amax, "amax")
    source = source_of(scale, per_row) if scale in SCALE_KINDS else None
    if source is None:
        raise ArgumentValueError(f"scale: expected 'dynamic', 'device' or 'host' ('host' per "
                                 f"tensor only), got {scale!r}")
    cfg = parse_config(config if config is not None else
                       ("flat_512" if not per_row else "block_256_v16"))
    return list(kernels(cfg, 1, cfg.capacity or 4096, as_dtype(dtype), as_fp8(fmt),
                        source, amax=amax, max_vec=vec).specs)


QUANTIZE_FP8 = Op(name=NAME, function=quantize_fp8, warmup={NAME: warmup}, plan=plan,
                  candidates=candidate_names, tuning_key=key, call_specs=call_specs,
                  specs_for_config=specs_for_config, config_types=(QuantConfig,),
                  kernel_prefixes=("quantize_fp8_",), layout_cases=cases.layout_cases)
