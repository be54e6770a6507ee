"""Notebook helpers: what a kernel is (``inspect``) and how configs compare (``benchmark_configs``).

Both return objects that print as text and render as HTML tables in Jupyter.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from ._deps import require_cupy
from .errors import ArgumentTypeError, ArgumentValueError
from .jit.cache import default_cache
from .jit.device import device_arch, gpu_count
from .jit.loader import build, get_kernel
from .jit.nvrtc import normalize_arch
from .jit.render import render
from .jit.sass import dump_sass, instruction_mix
from .jit.spec import KernelSpec
from .ops.gemm.problem import (
    SUPPORTED_DTYPES,
    check_act,
    check_out_dtype,
    check_precision,
    dtype_name,
)
from .ops.gemm.select import Choice, check_config, kernel_set, parse_config
from .ops.gemm.spec import (
    BiasKind,
    DType,
    Layout,
    MmaConfig,
    PipelineConfig,
    TileConfig,
    WgmmaConfig,
)

#: what ``inspect`` takes as a kernel configuration besides its name
CONFIG_TYPES = (PipelineConfig, MmaConfig, WgmmaConfig, TileConfig, Choice)
#: ``bias=`` and ``c_layout=`` names: "none" (or None), "scalar", "col", "row"; "r", "c"
_BIAS = {kind.name.lower(): kind for kind in BiasKind}
_C_LAYOUTS = {"none": None, **{layout.value: layout for layout in Layout}}
_LAYOUTS = [a.value + b.value for a in Layout for b in Layout]
#: K of the problem a config is inspected for: only how split-K slices it depends on K, and a
#: long K gives every slice work
_INSPECT_K = 1 << 16


@dataclass(frozen=True)
class KernelInfo:
    """One compiled kernel: spec, source, resources, occupancy, compile time and cache path."""

    kernel_name: str
    spec: KernelSpec
    arch: str
    source: str
    registers: int
    shared_bytes: int
    dynamic_shared_bytes: int
    spill_bytes: int
    threads: int | None
    occupancy: float | None          # resident warps / maximum, on the current device
    blocks_per_sm: int | None
    compile_seconds: float
    cache_path: str | None
    extra: dict = field(default_factory=dict)
    cubin: bytes = field(default=b"", repr=False)

    def sass(self) -> str:
        """The kernel's machine code (``cuobjdump --dump-sass``).

        Raises:
            MissingDependencyError: no cuobjdump or nvdisasm; ``pip install "ge2jit[tools]"``
                (or a CUDA toolkit) brings them.
        """
        return dump_sass(self.cubin)

    def instruction_mix(self) -> dict[str, int]:
        """How many of each SASS opcode the kernel has (HGMMA, HMMA, FFMA, LDL, ...), most
        frequent first."""
        return dict(instruction_mix(self.sass()).most_common())

    def rows(self) -> list[tuple[str, str]]:
        occ = ("–" if self.occupancy is None else
               f"{self.occupancy:.0%} ({self.blocks_per_sm} blocks of {self.threads} threads "
               "per SM)")
        rows = [("kernel", self.kernel_name), ("spec", repr(self.spec)), ("arch", self.arch),
                ("registers / thread", str(self.registers)),
                ("shared memory", f"{self.shared_bytes} B static + {self.dynamic_shared_bytes} "
                                  "B dynamic"),
                ("spill bytes", str(self.spill_bytes)), ("theoretical occupancy", occ),
                ("compile time", f"{self.compile_seconds:.2f} s"),
                ("cache entry", self.cache_path or "memory only")]
        rows += [(k, str(v)) for k, v in self.extra.items()]
        return rows

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in self.rows())
        return (f"<table>{body}</table><details><summary>rendered source "
                f"({len(self.source.splitlines())} lines)</summary><pre>"
                f"{html.escape(self.source)}</pre></details>")


def _arch(arch: str | None, on_gpu: bool) -> str:
    """``arch`` normalized, or the current device's when None (there must be a GPU then)."""
    if arch is not None:
        return normalize_arch(arch)
    if not on_gpu:
        raise ArgumentValueError("arch: no GPU here; name an architecture such as 'sm_90'")
    return device_arch(require_cupy().cuda.runtime.getDevice())


def kernel_info(spec: KernelSpec, arch: str | None = None,
                extra: dict | None = None) -> KernelInfo:
    """Compile (or find in the cache) ``spec`` and describe it. Without a GPU, name ``arch``."""
    on_gpu = gpu_count() > 0
    arch = _arch(arch, on_gpu)
    given_arch = arch
    arch = spec.target_arch(arch)          # what it compiles for: sm_90a for the Hopper kernel
    entry, _ = build(spec, arch)
    cache = default_cache()
    path = cache.path_for(entry.key)
    threads = getattr(spec, "threads", None) or getattr(getattr(spec, "tile", None), "threads",
                                                        None)
    occupancy = blocks = None
    if on_gpu and threads:
        cupy = require_cupy()
        dev = cupy.cuda.runtime.getDevice()
        if device_arch(dev) == given_arch:
            loaded = get_kernel(spec, dev)
            blocks = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                loaded.function.ptr, threads, spec.smem_bytes)
            max_threads = cupy.cuda.Device(dev).attributes["MaxThreadsPerMultiProcessor"]
            occupancy = blocks * threads / max_threads
    return KernelInfo(
        kernel_name=entry.kernel_name, spec=spec, arch=arch, source=render(spec),
        registers=entry.registers, shared_bytes=entry.shared_bytes,
        dynamic_shared_bytes=spec.smem_bytes, spill_bytes=entry.spill_bytes, threads=threads,
        occupancy=occupancy, blocks_per_sm=blocks, compile_seconds=entry.compile_seconds,
        cache_path=str(path) if path.exists() else None, extra=dict(extra or {}),
        cubin=entry.cubin)


def _choose(value, name: str, accepted: dict, text: str):
    """``accepted[value]``, or a one-line error naming ``name``, ``text`` and the value."""
    if isinstance(value, str) or value is None:
        key = "none" if value is None else value
        if key in accepted:
            return accepted[key]
    raise ArgumentValueError(f"{name}: expected {text}, got {value!r}")


def config_info(config, *, arch: str | None = None, dtype="float32", act: str = "none",
                bias: str | None = None, bias_dtype=None, layouts: str = "rr",
                c_layout: str | None = None, save_preact: bool = False, out_dtype=None,
                precision: str | None = None, aligned: bool = True) -> KernelInfo:
    """Compile and describe the GEMM kernel that ``config`` runs for one specialization; no
    arrays, and no GPU when ``arch`` is named. ``ge2jit.inspect(name, ...)`` calls this.

    Args:
        config: a name as ``gemm_bias_act``'s ``config=`` takes (``"128x128x16_w32x64_s3"``,
            ``"..._k4"`` for split K, ``"mma_128x128x32_w64x64_s4"``, ``"wgmma_128x256_s4"``,
            ``"64x64x8_4x4"``) or a config object.
        arch: the architecture to compile for (``"sm_80"``, ``"sm_90"``); default: the GPU's.
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

    Returns:
        The ``KernelInfo`` of the GEMM kernel; ``extra`` names the config and any other
        kernels it launches (a split-K reduction, operand copies).

    Raises:
        ArgumentValueError: a bad name, argument, or a config that cannot run this
            specialization on ``arch`` (the message names the argument).
    """
    cfg, split = parse_config(config)
    choice = Choice(cfg, split)
    arch = _arch(arch, gpu_count() > 0)
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
    aligns = (16, 16, 16) if aligned else (dt.itemsize, dt.itemsize, out_dt.itemsize)
    ks = kernel_set(dt, Layout(layouts[0]), Layout(layouts[1]), layout_c, act_, bias_kind,
                    save_preact, cfg, split, _INSPECT_K, aligns, out_dt, dt, bias_dt, prec)
    extra = {"config": choice.name}
    others = [s.kernel_name for s in ks.specs if s is not ks.main]
    if others:
        extra["also launches"] = ", ".join(others)
    return kernel_info(ks.main, arch, extra)


@dataclass(frozen=True)
class CallInfo:
    """What one gemm_bias_act call runs: the chosen config, why, and each kernel."""

    explanation: object
    kernels: tuple[KernelInfo, ...]

    def __str__(self) -> str:
        return "\n\n".join([str(self.explanation)] + [str(k) for k in self.kernels])

    def _repr_html_(self) -> str:
        head = f"<p><b>{html.escape(str(self.explanation.choice))}</b></p>"
        return head + "".join(k._repr_html_() for k in self.kernels)


def inspect(obj, *args, arch: str | None = None, **kwargs) -> KernelInfo | CallInfo:
    """Describe a kernel: its spec, source, registers, shared memory, spills, occupancy.

    Three forms:
        - ``inspect("128x128x16_w32x64_s3", arch="sm_90", dtype="float32", act="gelu",
          bias="col", ...)``: the kernel a config runs for one specialization (no arrays, no
          GPU needed; the keywords are ``config_info``'s).
        - ``inspect(spec, arch="sm_90")``: any kernel spec.
        - ``inspect(a, b, bias, act=..., ...)``: with ``gemm_bias_act``'s arguments, the
          configuration that call chooses, why, and each kernel it runs (on the GPU).

    ``arch`` defaults to the current GPU's; without a GPU it must be named.
    """
    if isinstance(obj, KernelSpec):
        return kernel_info(obj, arch)
    if isinstance(obj, (str, *CONFIG_TYPES)):
        return config_info(obj, *args, arch=arch, **kwargs)
    from .ops.gemm.op import explain

    info = explain(obj, *args, **kwargs)
    return CallInfo(info, tuple(kernel_info(s) for s in info.specs))


class Records(list):
    """A list of dicts that prints as a table (and renders as one in Jupyter)."""

    def _columns(self):
        cols = []
        for r in self:
            cols += [k for k in r if k not in cols]
        return cols

    def __repr__(self) -> str:
        cols = self._columns()
        cells = [[_cell(r.get(c)) for c in cols] for r in self]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = self._columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>"
                                        for c in cols) + "</tr>" for r in self)
        return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def benchmark_configs(configs, a, b, bias=None, *, reps: int = 20, **kwargs) -> Records:
    """Time ``gemm_bias_act(a, b, bias, config=c, **kwargs)`` for each config on these arrays.

    Returns one record per config, fastest first: config, ms (median of CUDA events), TFLOP/s
    and the kernels it ran; a config that fails records its error instead.
    """
    from .ops.gemm.op import explain, gemm_bias_act
    from .tune.timing import time_ms

    m, k = a.shape
    n = b.shape[1]
    records = Records()
    for config in configs:
        name = getattr(config, "name", config)
        try:
            info = explain(a, b, bias, config=config, **kwargs)
            ms = time_ms(lambda config=config: gemm_bias_act(a, b, bias, config=config,
                                                             **kwargs),
                         warmup=3, reps=reps)
            records.append({"config": info.config, "ms": ms,
                            "TFLOP/s": 2.0 * m * n * k / ms / 1e9,
                            "kernels": ", ".join(info.kernel_names)})
        except Exception as e:  # noqa: BLE001 - a failing config is a result, not a crash
            records.append({"config": str(name), "ms": None, "TFLOP/s": None,
                            "error": str(e).splitlines()[0]})
    records.sort(key=lambda r: (r["ms"] is None, r["ms"] or 0.0))
    return records
