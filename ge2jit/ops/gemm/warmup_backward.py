"""What a warm-up entry for gemm_bias_act_backward compiles: its TOML keys and their expansion
to specs (the dZ pass, the dBias sums, and the GEMMs of dA and dB, gated where asked, for the
configs the heuristic picks for the layer's shapes)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...errors import ArgumentValueError
from ...runtime.tables import check_keys, check_list
from . import warmup
from .backward import _CHUNK, _pass_shape
from .epilogue import ACT_NAMES, ACTS_FROM_Y, Act, BiasKind
from .spec import DbiasSpec, DType, DzSpec

#: key -> (description of accepted values, default)
KEYS = {
    "dtypes": (f"a list of {sorted(warmup.DTYPES)} (the inputs' type; tf32, tf32x3: float32 "
               "inputs with that precision)", ["float32"]),
    "acts": (f"a list of {sorted(ACT_NAMES)} (the layer's activation)", ["none"]),
    "sources": ("a list of 'z' (the forward's saved Z), 'y' (its output) and 'recompute' "
                "(neither): where act' comes from", ["z"]),
    "grad_dtypes": ("a list of 'input' (gY in the inputs' type) and 'float32'", ["input"]),
    "bias": (f"a list of {sorted(warmup.BIAS)} (the layer's bias, whose gradient is asked "
             "for; 'none' for none, or when the next layer's a_bias makes it)", ["col"]),
    "bias_dtypes": ("a list of 'input' (the inputs' type) and 'float32'", ["input"]),
    "a_acts": (f"a list of 'none' (no a_act) and {sorted(ACT_NAMES)} (the previous layer's "
               "activation, a_act)", ["none"]),
    "a_sources": ("a list of 'z' (a_z given) and 'y' (a_act' from A itself)", ["z"]),
    "a_z_dtypes": ("a list of 'input' (the inputs' type) and 'float32'", ["input"]),
    "a_glus": (f"a list of 'none' (no a_glu) and {sorted(ACT_NAMES)}: A made by a gated "
               "linear unit with this gate (a_glu; its Z from a_z_dtypes, its (2K,) bias "
               "gradient with a_bias)", ["none"]),
    "a_bias": ("a list of booleans: the previous layer's bias gradient asked for (a_bias)",
               [False]),
    "a_bias_dtypes": ("a list of 'input' (the inputs' type) and 'float32'", ["input"]),
    "shapes": ("a list of [M, N, K] lists of positive integers: the layers' forward shapes "
               "(A is M x K, B is K x N)", None),
    "sms": ("a positive integer: the GPU's multiprocessor count, without a GPU", None),
    "aligned": ("a boolean: also compile the 16-byte paths for aligned operands", True),
}
TYPES = ("input", "float32")


def _check_list(entry: dict, key: str, allowed) -> list:
    return check_list(entry, key, allowed, KEYS)


def validate_entry(entry: dict) -> dict:
    """Check one [[gemm_bias_act_backward]] table; raise ArgumentValueError naming the key."""
    check_keys(entry, KEYS)
    out = {
        "dtypes": _check_list(entry, "dtypes", warmup.DTYPES),
        "acts": _check_list(entry, "acts", ACT_NAMES),
        "sources": _check_list(entry, "sources", ["z", "y", "recompute"]),
        "grad_dtypes": _check_list(entry, "grad_dtypes", TYPES),
        "bias": _check_list(entry, "bias", warmup.BIAS),
        "bias_dtypes": _check_list(entry, "bias_dtypes", TYPES),
        "a_acts": _check_list(entry, "a_acts", ["none", *ACT_NAMES]),
        "a_sources": _check_list(entry, "a_sources", ["z", "y"]),
        "a_z_dtypes": _check_list(entry, "a_z_dtypes", TYPES),
        "a_glus": _check_list(entry, "a_glus", ["none", *ACT_NAMES]),
        "a_bias": _check_list(entry, "a_bias", [False, True]),
        "a_bias_dtypes": _check_list(entry, "a_bias_dtypes", TYPES),
    }
    return warmup.check_shapes_and_machine(entry, out, KEYS, required=True)


@dataclass(frozen=True, slots=True)
class _Layer:
    """One combination of a validated entry's lists, expanded for one architecture (``sms``
    multiprocessors): the inputs' type (its entry name ``dname``), the layer's activation,
    where act' comes from (``source``), gY's type, the bias and its type's entry names, the
    forward's shape (``n``: the GEMMs' 2N for a gated linear unit's, ``glu``)."""

    entry: dict
    arch: str
    sms: int
    dname: str
    dtype: DType
    act: Act
    source: str
    grad: DType
    bias_name: str
    bname: str
    m: int
    n: int
    k: int
    glu: bool


def _gemms(layer: _Layer, layouts: str, shape, **kw) -> list:
    """The forward warm-up's expansion of one GEMM (no bias, act none) with the heuristic's
    config for this shape: what the backward's GEMM calls choose."""
    fwd = warmup.validate_entry({"dtypes": [layer.dname], "acts": ["none"], "bias": ["none"],
                                 "layouts": [layouts], "configs": "heuristic",
                                 "shapes": [list(shape)], "aligned": layer.entry["aligned"],
                                 **{k: v for k, v in kw.items() if k in warmup.KEYS}})
    gate = {k: v for k, v in kw.items() if k in ("gate", "gate_from_y", "bgrad", "glu_grad")}
    return warmup.expand(fwd, layer.arch, sms=layer.sms, **gate)


def _sums(dtype: DType, rows: int) -> list:
    """The fixed-order column sums of ``rows`` rows of partial sums into ``dtype``."""
    specs = [DbiasSpec(dtype, False)]
    if rows > 2 * _CHUNK:
        specs.append(DbiasSpec(DType.F32, False))
    return specs


def expand(entry: dict, arch: str, *, sms: int | None, tuned: list[tuple] = (),
           glu: bool = False) -> list:
    """The specs to compile for one validated entry on one architecture (``glu``:
    ``gemm_gated_backward``'s, whose shapes' N is Y's: the dZ pass and the GEMMs have 2N)."""
    sms = sms or entry.get("sms")
    if sms is None:
        raise ArgumentValueError("sms: the backward's GEMMs take the heuristic's configs, which "
                                 "need the GPU's multiprocessor count; run on the GPU, or set "
                                 "sms = <count> in the entry")
    specs = []
    grid = itertools.product(entry["dtypes"], entry["acts"], entry["sources"],
                             entry["grad_dtypes"], entry["bias"], entry["bias_dtypes"],
                             entry["shapes"])
    for dname, act_name, source, gname, bias_name, bname, (m, n, k) in grid:
        dtype, act = warmup.DTYPES[dname], ACT_NAMES[act_name]
        if source == "y" and (act not in ACTS_FROM_Y or glu):
            continue   # refused at run time: act' needs Z
        if glu and bias_name in ("scalar", "row"):
            continue   # refused: a gated GEMM's bias is per column
        layer = _Layer(entry, arch, sms, dname, dtype, act, source,
                       dtype if gname == "input" else DType.F32, bias_name, bname, m,
                       2 * n if glu else n, k, glu)
        specs += _dz_specs(layer)
        # dB = A.T @ dZ (column-major A.T, row-major dZ), and dA = dZ @ B.T, gated or not
        specs += _gemms(layer, "cr", (k, layer.n, m))
        specs += _glu_grad_specs(layer)
        specs += _grad_a_specs(layer)
    return list(dict.fromkeys(specs))


def _dz_specs(layer: _Layer) -> list:
    """The GEMM that recomputes Z (where neither Z nor Y is kept), the dZ pass and dBias's
    sums of one layer."""
    dtype, act, grad, glu, m, n, k = (layer.dtype, layer.act, layer.grad, layer.glu, layer.m,
                                      layer.n, layer.k)
    bias_kind = warmup.BIAS[layer.bias_name]
    bias_dtype = dtype if layer.bname == "input" else DType.F32
    src_dtype = DType.F32 if layer.source == "recompute" else dtype
    write_dz = glu or not (act is Act.NONE and grad is dtype)
    specs = []
    if layer.source == "recompute" and (act is not Act.NONE or glu):   # Z by a GEMM, float32
        specs += _gemms(layer, "rr", (m, n, k), bias=[layer.bias_name],
                        bias_dtypes=[layer.bname], out_dtypes=["float32"])
    if write_dz or bias_kind is not BiasKind.NONE:
        reads_src = act is not Act.NONE or glu   # act' of "none" is 1: nothing read
        vecs = [False, True] if layer.entry["aligned"] and n % 8 == 0 else [False]
        for vec in vecs:
            spec = DzSpec(act, layer.source == "y" and reads_src, bias_kind, grad,
                          src_dtype if reads_src else grad, dtype, write_dz=write_dz,
                          vec=vec, glu=glu)
            specs.append(spec)
            tm, pass_grid = _pass_shape(m, n, spec.cols)
            if bias_kind is BiasKind.SCALAR:
                specs.append(DbiasSpec(bias_dtype, True))
            elif bias_kind is not BiasKind.NONE:
                rows = pass_grid[1] if bias_kind is BiasKind.COL else pass_grid[0]
                specs += _sums(bias_dtype, rows)
    return specs


def _glu_grad_specs(layer: _Layer) -> list:
    """dA's GEMMs where a gated linear unit made A (``a_glus``), with that unit's bias
    gradient."""
    entry, dtype, m, n, k = layer.entry, layer.dtype, layer.m, layer.n, layer.k
    specs = []
    for unit, zname, a_bias, abname in itertools.product(
            entry["a_glus"], entry["a_z_dtypes"], entry["a_bias"], entry["a_bias_dtypes"]):
        if unit == "none":
            continue
        # A made by a gated linear unit: dA's GEMM writes its dZ (2K wide), the unit's bias
        # gradient by a pass over it
        specs += _gemms(layer, "rc", (m, k, n), c=["r"], c_dtypes=[zname],
                        glu_grad=ACT_NAMES[unit])
        if a_bias:
            spec = DzSpec(Act.NONE, False, BiasKind.COL, dtype, dtype, dtype,
                          write_dz=False, vec=False)
            specs.append(spec)
            specs += _sums(dtype if abname == "input" else DType.F32,
                           _pass_shape(m, 2 * k, spec.cols)[1][1])
    return specs


def _grad_a_specs(layer: _Layer) -> list:
    """dA's GEMMs, plain or gated by the previous layer's act' (``a_acts``), with that
    layer's bias gradient (from the epilogue's sums, or a pass over dA)."""
    entry, dtype, m, n, k = layer.entry, layer.dtype, layer.m, layer.n, layer.k
    specs = []
    for a_name, a_source, zname, a_bias, abname in itertools.product(
            entry["a_acts"], entry["a_sources"], entry["a_z_dtypes"], entry["a_bias"],
            entry["a_bias_dtypes"]):
        if a_name == "none":
            specs += _gemms(layer, "rc", (m, k, n))
            continue
        gate = ACT_NAMES[a_name]
        from_y = a_source == "y"
        if from_y and gate not in ACTS_FROM_Y:
            continue   # refused at run time: a_act' needs a_z
        gated = _gemms(layer, "rc", (m, k, n), c=["r"],
                       c_dtypes=["input" if from_y else zname], gate=gate,
                       gate_from_y=from_y, bgrad=a_bias)
        specs += gated
        if a_bias:
            a_bias_dtype = dtype if abname == "input" else DType.F32
            epilogues = [s.epilogue for s in gated if hasattr(s, "epilogue")]
            if any(e.bgrad for e in epilogues):   # sums from the epilogue
                specs += _sums(a_bias_dtype, -(-m // 16))
            if not all(e.bgrad for e in epilogues if e.gate is not None):
                # a pass over dA where the kernel makes no sums
                spec = DzSpec(Act.NONE, False, BiasKind.COL, dtype, dtype, dtype,
                              write_dz=False, vec=False)
                specs.append(spec)
                specs += _sums(a_bias_dtype, _pass_shape(m, k, spec.cols)[1][1])
    return specs


def tuned_entries(records, arch: str) -> list[tuple]:
    """The backward's GEMMs take the heuristic's configs: no tuned entries."""
    return []


__all__ = ["KEYS", "validate_entry", "expand", "tuned_entries"]
