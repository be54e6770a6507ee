"""What a warm-up entry for gemm_bias_act compiles: its TOML keys and their expansion to specs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...errors import ArgumentValueError
from ...jit.nvrtc import arch_number
from ...runtime.tables import MAX_SMS, check_keys, check_list
from .epilogue import ACT_NAMES, Act, BiasKind, Epilogue, Layout
from .problem import MAX_K, MAX_MN, PRECISIONS, SUPPORTED_DTYPES
from .select import (
    Choice,
    adds_wide_c,
    candidates,
    glu_kind,
    heuristic,
    kernel_set,
    parse_config,
    resolve,
    uses_tensor_cores,
    wgmma_configs,
)
from .spec import (
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    DType,
    MmaConfig,
    PipelineConfig,
    Precision,
    WgmmaConfig,
    mma_configs,
)

#: dtype names of a warm-up entry: the input types, and "tf32" / "tf32x3" for float32 inputs
#: with that ``precision``.
DTYPES = {**SUPPORTED_DTYPES, "tf32": DType.F32, "tf32x3": DType.F32}
BIAS = {"none": BiasKind.NONE, "scalar": BiasKind.SCALAR, "col": BiasKind.COL,
        "row": BiasKind.ROW}
LAYOUTS = {"rr", "rc", "cr", "cc"}
C_LAYOUTS = {"none": None, "r": Layout.ROW, "c": Layout.COL}

#: Sizes follow gemm_bias_act's limits.
SIZE_LIMITS = {"M": (MAX_MN, "2**31 - 2**16"), "N": (MAX_MN, "2**31 - 2**16"),
               "K": (MAX_K, "2**31 - 1")}

#: key -> (description of accepted values, default)
KEYS = {
    "dtypes": (f"a list of {sorted(DTYPES)} (the inputs' type; tf32, tf32x3: float32 inputs "
               "with that precision)", ["float32"]),
    "out_dtypes": ("a list of 'input' (Y in the inputs' type) and 'float32'", ["input"]),
    "bias_dtypes": ("a list of 'input' (the inputs' type) and 'float32'", ["input"]),
    "c_dtypes": ("a list of 'input' (the inputs' type) and 'float32'", ["input"]),
    "acts": (f"a list of {sorted(ACT_NAMES)}", ["none"]),
    "bias": (f"a list of {sorted(BIAS)}", ["col"]),
    "layouts": ("a list of 'rr', 'rc', 'cr', 'cc' (A then B: row- or column-major)", ["rr"]),
    "c": ("a list of 'none', 'r', 'c' (no C, row-major C, column-major C)", ["none"]),
    "save_preact": ("a list of booleans", [False]),
    "configs": ("'all', 'heuristic' or a list of config names such as '128x128x8_w32x64_s3'",
                "all"),
    "shapes": ("a list of [M, N, K] lists of positive integers", []),
    "sms": ("a positive integer: the GPU's multiprocessor count, for 'heuristic' without a GPU",
            None),
    "aligned": ("a boolean: also compile the 16-byte paths for aligned operands", True),
}


def check_shapes_and_machine(entry: dict, out: dict, keys: dict = KEYS,
                             required: bool = False) -> dict:
    """``shapes`` (a list of [M, N, K]; at least one when ``required``), ``sms`` and
    ``aligned`` into ``out``."""
    shapes = entry.get("shapes", [])
    if not isinstance(shapes, list) or (required and not shapes) or not all(
            isinstance(s, list) and len(s) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s)
            for s in shapes):
        raise ArgumentValueError(f"shapes: expected {keys['shapes'][0]}, got {shapes!r}")
    for s in shapes:
        for name, size in zip("MNK", s):
            limit, text = SIZE_LIMITS[name]
            if size > limit:
                raise ArgumentValueError(f"shapes: {name} = {size} in {s}: at most {limit} "
                                         f"({text}) is supported")
    out["shapes"] = [tuple(s) for s in shapes]
    sms = entry.get("sms")
    if sms is not None and (not isinstance(sms, int) or isinstance(sms, bool) or sms <= 0):
        raise ArgumentValueError(f"sms: expected {keys['sms'][0]}, got {sms!r}")
    if sms is not None and sms > MAX_SMS:
        raise ArgumentValueError(f"sms: {sms} multiprocessors: counts up to 2**31 - 1 are "
                                 "supported")
    out["sms"] = sms
    aligned = entry.get("aligned", True)
    if not isinstance(aligned, bool):
        raise ArgumentValueError(f"aligned: expected {keys['aligned'][0]}, got {aligned!r}")
    out["aligned"] = aligned
    return out


def validate_entry(entry: dict) -> dict:
    """Check one [[gemm_bias_act]] table; raise ArgumentValueError naming the key."""
    check_keys(entry, KEYS)
    out = {
        "dtypes": check_list(entry, "dtypes", DTYPES, KEYS),
        "out_dtypes": check_list(entry, "out_dtypes", ("input", "float32"), KEYS),
        "bias_dtypes": check_list(entry, "bias_dtypes", ("input", "float32"), KEYS),
        "c_dtypes": check_list(entry, "c_dtypes", ("input", "float32"), KEYS),
        "acts": check_list(entry, "acts", ACT_NAMES, KEYS),
        "bias": check_list(entry, "bias", BIAS, KEYS),
        "layouts": check_list(entry, "layouts", LAYOUTS, KEYS),
        "c": check_list(entry, "c", C_LAYOUTS, KEYS),
        "save_preact": check_list(entry, "save_preact", (True, False), KEYS),
    }
    configs = entry.get("configs", "all")
    if configs in ("all", "heuristic"):
        out["configs"] = configs
    elif isinstance(configs, list) and configs and all(isinstance(c, str) for c in configs):
        for name in configs:
            try:
                parse_config(name)
            except ArgumentValueError as e:
                raise ArgumentValueError(f"configs: {e}") from None
        out["configs"] = configs
    else:
        raise ArgumentValueError(f"configs: expected {KEYS['configs'][0]}, got {configs!r}")
    check_shapes_and_machine(entry, out)
    if out["configs"] == "heuristic" and not out["shapes"]:
        raise ArgumentValueError("shapes: configs = 'heuristic' needs the shapes to decide for")
    return out


@dataclass(frozen=True, slots=True)
class GemmKind:
    """The GEMMs a forward entry expands to (``expand``'s keywords, ``Epilogue`` fields): the
    backward's gated GEMMs (``gate``, ``gate_from_y``, ``bgrad``), ``gemm_gated``'s
    (``glu``), the next layer's dA GEMMs that write a gated unit's dZ (``glu_grad``), or by
    default ``gemm_bias_act``'s."""

    gate: Act | None = None
    gate_from_y: bool = False
    bgrad: bool = False
    glu: bool = False
    glu_grad: Act | None = None


@dataclass(frozen=True, slots=True)
class _Variant:
    """One combination of an entry's lists: the inputs' type and math mode, A's and B's
    layouts ("rr", ...), the epilogue, and C's item size and layout ("r", "c"; both None
    without C)."""

    dtype: DType
    precision: Precision
    layouts: str
    epilogue: Epilogue
    c_item: int | None
    c_layout: str | None


def _variant(combo: tuple, kind: GemmKind) -> _Variant:
    """The ``_Variant`` of one item of ``expand``'s grid of an entry's lists."""
    dname, oname, bname, cname, act, bias, layouts, c, save_z = combo
    dtype = DTYPES[dname]
    precision = PRECISIONS.get(dname, Precision.IEEE)
    out_dtype, bias_dtype, c_dtype = (dtype if x == "input" else DType.F32
                                      for x in (oname, bname, cname))
    layout_c = C_LAYOUTS[c]
    epilogue = Epilogue(out_dtype=out_dtype, act=ACT_NAMES[act], bias=BIAS[bias],
                        bias_dtype=None if BIAS[bias] is BiasKind.NONE else bias_dtype,
                        layout_c=layout_c, c_dtype=None if layout_c is None else c_dtype,
                        save_z=save_z, gate=kind.gate, gate_from_y=kind.gate_from_y,
                        bgrad=kind.bgrad, glu=kind.glu, glu_grad=kind.glu_grad)
    return _Variant(dtype, precision, layouts, epilogue,
                    None if layout_c is None else c_dtype.itemsize,
                    None if layout_c is None else layout_c.value)


def _vec_variants(entry: dict, v: _Variant, kind: GemmKind, m: int | None, n: int | None,
                  k: int | None):
    """Alignment variants (bytes: A, B, Y, C) to compile: the least aligned one the types
    allow always, the aligned one when asked (for a shape: what contiguous operands of that
    shape have; Y's columns are not N for a gated linear unit's GEMMs)."""
    from .select import alignment

    item, y_item, c_item, layouts = (v.dtype.itemsize, v.epilogue.out_dtype.itemsize,
                                     v.c_item, v.layouts)
    y_cols = (n // 2 if kind.glu else 2 * n if kind.glu_grad else None) if n else None
    out = [(item, item, y_item, c_item or 16)]
    if entry["aligned"]:
        if m is None:
            out.append((16, 16, 16, 16))
        else:
            lda = k if layouts[0] == "r" else m
            ldb = n if layouts[1] == "r" else k
            ldc = n if v.c_layout == "r" else m
            out.append((alignment(256, lda * item), alignment(256, ldb * item),
                        alignment(256, (y_cols or n) * y_item),
                        alignment(256, ldc * c_item) if c_item else 16))
    return list(dict.fromkeys(out))


def expand(entry: dict, arch: str, *, sms: int | None, tuned: list[tuple] = (),
           gate=None, gate_from_y: bool = False, bgrad: bool = False,
           glu: bool = False, glu_grad=None) -> list:
    """The specs to compile for one validated entry on one architecture.

    ``tuned`` holds (layouts, (M, N, K), config name) from the tuning database to add.
    ``gate``, ``gate_from_y``, ``bgrad``: the backward's gated GEMMs (their ``Epilogue``
    fields). ``glu``: ``gemm_gated``'s GEMMs, whose shapes' N is Y's (the GEMM's is 2N).
    ``glu_grad``: the next layer's dA GEMMs that write a gated unit's dZ (2N wide).
    """
    number = arch_number(arch)
    kind = GemmKind(gate, gate_from_y, bgrad, glu, glu_grad)
    specs = []
    grid = itertools.product(entry["dtypes"], entry["out_dtypes"], entry["bias_dtypes"],
                             entry["c_dtypes"], entry["acts"], entry["bias"], entry["layouts"],
                             entry["c"], entry["save_preact"])
    for combo in grid:
        v = _variant(combo, kind)
        operands = (v.dtype, Layout(v.layouts[0]), Layout(v.layouts[1]))
        for cfg, split, (m, n, k), aligns, chosen in _choices(entry, v, kind, number, sms,
                                                              tuned):
            if not _runs_here(cfg, chosen, number, v):
                continue
            for al in aligns:
                # the family below when this alignment rules the config out (as at run time)
                ch = resolve(Choice(cfg, split), v.dtype, v.layouts, al, m or 4096, n or 4096,
                             k, sms or 132, v.precision)
                specs.extend(kernel_set(*operands, v.epilogue, ch.config, ch.split_k, k, al,
                                        v.precision).specs)
    return list(dict.fromkeys(specs))


def _choices(entry: dict, v: _Variant, kind: GemmKind, number: int, sms: int | None,
             tuned) -> list[tuple]:
    """(config, split, (M, N, K), alignment variants, from the heuristic) of one variant:
    the heuristic's for each shape, or the named configs (``all``: the arch's candidates)
    for each shape or none, and the tuned ones of its layouts."""
    dtype, precision, layouts = v.dtype, v.precision, v.layouts

    def variants(m, n, k):
        return _vec_variants(entry, v, kind, m, n, k)

    shapes = [(m, 2 * n, k) for m, n, k in entry["shapes"]] if kind.glu else entry["shapes"]
    choices = []
    if entry["configs"] == "heuristic":
        if sms is None:
            raise ArgumentValueError(
                "sms: configs = 'heuristic' needs the GPU's multiprocessor count; run on "
                "the GPU, set sms = <count> in the entry, or pass --sms <count>")
        for m, n, k in shapes:
            ch = heuristic(m, n, k, sms, number, layouts, dtype, precision,
                           gated=kind.gate is not None,
                           glu=glu_kind(v.epilogue),
                           wide_c=adds_wide_c(v.epilogue, dtype))
            choices.append((ch.config, ch.split_k, (m, n, k), variants(m, n, k), True))
    else:
        if entry["configs"] == "all":
            if number < 80:
                named = [(cfg, 1) for cfg in TILED_CONFIGS]
            elif uses_tensor_cores(dtype, precision):
                hopper = wgmma_configs(precision) if number == 90 else ()
                named = [(cfg, 1) for cfg in (*hopper, *mma_configs(dtype, precision))]
            else:
                named = [(cfg, s) for cfg in PIPELINED_F32_CONFIGS for s in (1, 2)]
        else:
            named = [parse_config(name) for name in entry["configs"]]
        for cfg, split in named:
            for m, n, k in shapes or [(None, None, 1 << 20)]:
                choices.append((cfg, split, (m, n, k), variants(m, n, k), False))
    for t_layouts, (m, n, k), name, *t_glu in tuned:
        if t_layouts == layouts and bool(t_glu and t_glu[0]) == kind.glu:
            cfg, split = parse_config(name)
            choices.append((cfg, split, (m, n, k), variants(m, n, k), False))
    return choices


def _runs_here(cfg, chosen: bool, number: int, v: _Variant) -> bool:
    """Whether ``cfg`` runs on an sm_``number`` GPU for this variant's inputs (a named config
    of another family than the inputs' is skipped; the heuristic's, ``chosen``, is not)."""
    if number < 80 and cfg not in TILED_CONFIGS:
        return False  # pipelined and tensor-core kernels need sm_80+
    if isinstance(cfg, WgmmaConfig) and number != 90:
        return False
    tc = uses_tensor_cores(v.dtype, v.precision)
    if not chosen and (isinstance(cfg, (MmaConfig, WgmmaConfig)) != tc or (
            isinstance(cfg, PipelineConfig) and v.dtype is not DType.F32)):
        return False  # a named config of another family than this dtype's
    return not (isinstance(cfg, MmaConfig) and not cfg.supports(v.dtype))


def tuned_entries(records, arch: str) -> list[tuple]:
    """(layouts, shape, config) of tuning-database records for ``arch``."""
    out = []
    for r in records:
        key, value = r.get("key", {}), r.get("value", {})
        if key.get("op") == "gemm_bias_act" and key.get("arch") == arch:
            shape = value.get("shape")
            if isinstance(shape, list) and len(shape) == 3 and "config" in value:
                out.append((key.get("layouts"), tuple(shape), value["config"],
                            bool(key.get("glu"))))
    return out


__all__ = ["KEYS", "validate_entry", "expand", "tuned_entries", "candidates"]
