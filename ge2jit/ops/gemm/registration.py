"""The GEMM ops as the tools see them (``runtime.registry.Op``): the forward, with its plans,
candidates, tuning and configs, and the backward, with its warm-up table."""

from __future__ import annotations

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.device import device_arch
from ...jit.nvrtc import arch_number
from ...runtime.arrays import call_arguments, views
from ...runtime.dtypes import dtype_name
from ...runtime.registry import Explanation, Op, bind
from . import cases, warmup, warmup_backward
from .backward import gemm_bias_act_backward
from .epilogue import BiasKind, Epilogue, Layout
from .gated import explain_gated, gemm_gated, gemm_gated_backward
from .op import clear_plans, explain, gemm_bias_act, tune
from .plans import tuning_key as _problem_tuning_key
from .problem import (
    SUPPORTED_DTYPES,
    check_act,
    check_out_dtype,
    check_precision,
    validate,
)
from .select import Choice, candidates, check_config, kernel_set, parse_config
from .spec import DType, MmaConfig, PipelineConfig, TileConfig, WgmmaConfig
from .tuning import tune_gated
from .warmup_gated import BACKWARD_TABLE, FORWARD_TABLE

#: ``bias=`` and ``c_layout=`` names: "none" (or None), "scalar", "col", "row"; "r", "c"
_BIAS = {kind.name.lower(): kind for kind in BiasKind}
_C_LAYOUTS = {"none": None, **{layout.value: layout for layout in Layout}}
_LAYOUTS = [a.value + b.value for a in Layout for b in Layout]
#: K of the problem a config is inspected for: only how split-K slices it depends on K, and a
#: long K gives every slice work
_INSPECT_K = 1 << 16


def _problem(args: tuple, kwargs: dict, glu: bool = False):
    """The validated problem of a ``gemm_bias_act`` (``glu``: ``gemm_gated``) call with these
    arguments."""
    x = bind(gemm_gated if glu else gemm_bias_act, args, kwargs)
    fw, _, native = call_arguments({k: x.get(k) for k in ("a", "b", "bias", "c", "out",
                                                          "preact_out")})
    v = views(fw, native)
    return validate(v["a"], v["b"], v["bias"], x["act"], v["c"], x["alpha"], x.get("beta", 0.0),
                    x["leaky_slope"], v["out"], v["preact_out"], x["save_preact"],
                    x["out_dtype"], x["precision"], glu=glu)


def plan(*args, **kwargs) -> Explanation:
    """What ``gemm_bias_act(*args, **kwargs)`` runs (``op.explain``), with its flops."""
    return explain(*args, **kwargs)


def candidate_names(*args, _glu: bool = False, **kwargs) -> list[str]:
    """The configs the tuner tries for these arguments on this GPU."""
    p = _problem(args, kwargs, _glu)
    number = arch_number(device_arch(p.device_id))
    return [Choice(cfg, split).name
            for cfg, split in candidates(p.m, p.n, p.k, number, p.dtype, p.precision)]


def tuning_key(*args, _glu: bool = False, **kwargs) -> dict:
    """The tuning database's key of these arguments on this GPU."""
    p = _problem(args, kwargs, _glu)
    return _problem_tuning_key(p, device_arch(p.device_id))


def gated_candidate_names(*args, **kwargs) -> list[str]:
    """``candidate_names`` of a ``gemm_gated`` call."""
    return candidate_names(*args, _glu=True, **kwargs)


def gated_tuning_key(*args, **kwargs) -> dict:
    """``tuning_key`` of a ``gemm_gated`` call."""
    return tuning_key(*args, _glu=True, **kwargs)


def _choose(value, name: str, accepted: dict, text: str):
    """``accepted[value]``, or a one-line error naming ``name``, ``text`` and the value."""
    if isinstance(value, str) or value is None:
        key = "none" if value is None else value
        if key in accepted:
            return accepted[key]
    raise ArgumentValueError(f"{name}: expected {text}, got {value!r}")


def specs_for_config(config, arch: str, *, dtype="float32", act: str = "none",
                     bias: str | None = None, bias_dtype=None, layouts: str = "rr",
                     c_layout: str | None = None, save_preact: bool = False, out_dtype=None,
                     precision: str | None = None, aligned: bool = True,
                     glu: bool = False) -> tuple:
    """The kernels ``config`` runs for one specialization on ``arch``, the GEMM first (a
    split-K reduction, operand copies after it); no arrays, no GPU.

    Args:
        config: a name as ``gemm_bias_act``'s ``config=`` takes (``"128x128x16_w32x64_s3"``,
            ``"..._k4"`` for split K, ``"mma_128x128x32_w64x64_s4"``, ``"wgmma_128x256_s4"``,
            ``"64x64x8_4x4"``) or a config object.
        arch: the architecture to compile for (``"sm_80"``, ``"sm_90"``).
        dtype: the inputs' type: "float32", "float16" or "bfloat16" (or a NumPy dtype).
        act: the activation, as ``gemm_bias_act``'s ``act``.
        bias: None, "scalar", "col" (one value per column) or "row" (one per row).
        bias_dtype: the bias' type: ``dtype`` (default) or "float32".
        layouts: A's then B's layout, "r" (row-major) or "c" (column-major): "rr", "rc", ...
        c_layout: None (no C), "r" or "c" (a C added as ``beta * C``, row- or column-major).
        save_preact: the kernel also stores Z.
        out_dtype: Y's type: ``dtype`` (default) or "float32".
        precision: float32 inputs: "ieee", "tf32" or "tf32x3" (None: as ``gemm_bias_act``).
        aligned: operands with 16-byte aligned pointers and rows (False: only element
            alignment, which runs the kernels' narrow copies, or another family).
        glu: ``gemm_gated``'s kernels (a gated linear unit's epilogue; no C, no bias or one
            per column).

    Raises:
        ArgumentValueError: a bad name, argument, or a config that cannot run this
            specialization on ``arch`` (the message names the argument).
    """
    cfg, split = parse_config(config)
    name = dtype_name(dtype)
    if name not in SUPPORTED_DTYPES:
        raise ArgumentValueError(f"dtype: expected one of {', '.join(SUPPORTED_DTYPES)}, got "
                                 f"{dtype!r}")
    dt = SUPPORTED_DTYPES[name]
    if bias_dtype is None:
        bias_dt = dt
    else:
        bias_dt = SUPPORTED_DTYPES.get(dtype_name(bias_dtype))
        if bias_dt not in (dt, DType.F32):
            raise ArgumentValueError(
                f"bias_dtype: expected {' or '.join(sorted({name, 'float32'}))} (dtype is "
                f"{name}), got {bias_dtype!r}")
    act_ = check_act(act)
    bias_kind = _choose(bias, "bias", _BIAS, "None, 'scalar', 'col' or 'row'")
    if layouts not in _LAYOUTS:
        raise ArgumentValueError(f"layouts: expected 'rr', 'rc', 'cr' or 'cc' (A's then B's "
                                 f"layout: row- or column-major), got {layouts!r}")
    layout_c = _choose(c_layout, "c_layout", _C_LAYOUTS, "None, 'r' or 'c'")
    for flag, value in (("save_preact", save_preact), ("aligned", aligned)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"{flag}: expected True or False, got {value!r}")
    out_dt = check_out_dtype(out_dtype, dt, None)
    prec = check_precision(precision, dt)
    check_config(cfg, arch, dt, prec, who="arch", target="the arch asked for")
    aligns = ((16, 16, 16, 16) if aligned else
              (dt.itemsize, dt.itemsize, out_dt.itemsize, 16 if layout_c is None else dt.itemsize))
    epilogue = Epilogue(out_dtype=out_dt, act=act_, bias=bias_kind,
                        bias_dtype=None if bias_kind is BiasKind.NONE else bias_dt,
                        layout_c=layout_c, c_dtype=None if layout_c is None else dt,
                        save_z=save_preact, glu=glu)
    return kernel_set(dt, Layout(layouts[0]), Layout(layouts[1]), epilogue, cfg, split,
                      _INSPECT_K, aligns, prec).specs


FORWARD = Op(
    name="gemm_bias_act", function=gemm_bias_act, warmup={"gemm_bias_act": warmup},
    plan=plan, candidates=candidate_names, tuning_key=tuning_key,
    specs_for_config=specs_for_config,
    config_types=(PipelineConfig, MmaConfig, WgmmaConfig, TileConfig, Choice),
    kernel_prefixes=("gemm_", "transpose_", "tf32x3_split_"), tune=tune,
    clear_plans=clear_plans, layout_cases=cases.forward_cases)
BACKWARD = Op(
    name="gemm_bias_act_backward", function=gemm_bias_act_backward,
    warmup={"gemm_bias_act_backward": warmup_backward},
    kernel_prefixes=("gemm_dz_", "gemm_dbias_"), layout_cases=cases.backward_cases)


def gated_specs_for_config(config, arch: str, *, dtype="float32", act: str = "silu",
                           bias: str | None = None, bias_dtype=None, layouts: str = "rr",
                           save_preact: bool = False, out_dtype=None,
                           precision: str | None = None, aligned: bool = True) -> tuple:
    """``specs_for_config`` of ``gemm_gated``: the kernels ``config`` runs for one
    specialization on ``arch`` (bias None or "col")."""
    if bias not in (None, "none", "col"):
        raise ArgumentValueError(f"bias: expected None or 'col' (a gated GEMM's bias is per "
                                 f"column), got {bias!r}")
    return specs_for_config(config, arch, dtype=dtype, act=act, bias=bias,
                            bias_dtype=bias_dtype, layouts=layouts, save_preact=save_preact,
                            out_dtype=out_dtype, precision=precision, aligned=aligned, glu=True)


GATED = Op(
    name="gemm_gated", function=gemm_gated, warmup={"gemm_gated": FORWARD_TABLE},
    plan=explain_gated, candidates=gated_candidate_names, tuning_key=gated_tuning_key,
    specs_for_config=gated_specs_for_config,
    config_types=(PipelineConfig, MmaConfig, WgmmaConfig, TileConfig, Choice),
    tune=tune_gated, clear_plans=clear_plans, layout_cases=cases.gated_cases)
GATED_BACKWARD = Op(
    name="gemm_gated_backward", function=gemm_gated_backward,
    warmup={"gemm_gated_backward": BACKWARD_TABLE},
    layout_cases=cases.gated_backward_cases)
