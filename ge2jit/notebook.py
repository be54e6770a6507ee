"""Notebook helpers: what a kernel is (``inspect``) and how configs compare (``benchmark_configs``).

Both return objects that print as text and render as HTML tables in Jupyter.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from ._deps import require_cupy
from .jit.cache import default_cache
from .jit.device import device_arch, gpu_count
from .jit.loader import build, get_kernel
from .jit.render import render
from .jit.sass import dump_sass, instruction_mix
from .jit.spec import KernelSpec


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
        """The kernel's machine code (``cuobjdump --dump-sass``; needs cuobjdump, from the
        nvidia-cuda-cuobjdump wheel or a CUDA toolkit)."""
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


def kernel_info(spec: KernelSpec, arch: str | None = None) -> KernelInfo:
    """Compile (or find in the cache) ``spec`` and describe it. Without a GPU, name ``arch``."""
    on_gpu = gpu_count() > 0
    if arch is None:
        if not on_gpu:
            raise ValueError("arch: no GPU here; name an architecture such as 'sm_90'")
        arch = device_arch(require_cupy().cuda.runtime.getDevice())
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
        cache_path=str(path) if path.exists() else None, cubin=entry.cubin)


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


def inspect(obj, *args, arch: str | None = None, **kwargs):
    """Describe a kernel: ``inspect(spec, arch=...)`` for a spec, or ``inspect(a, b, bias,
    act=..., ...)`` with gemm_bias_act's arguments for the kernels that call would run."""
    if isinstance(obj, KernelSpec):
        return kernel_info(obj, arch)
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
            ms = time_ms(lambda: gemm_bias_act(a, b, bias, config=config, **kwargs),
                         warmup=3, reps=reps)
            records.append({"config": info.config, "ms": ms,
                            "TFLOP/s": 2.0 * m * n * k / ms / 1e9,
                            "kernels": ", ".join(info.kernel_names)})
        except Exception as e:  # noqa: BLE001 - a failing config is a result, not a crash
            records.append({"config": str(name), "ms": None, "TFLOP/s": None,
                            "error": str(e).splitlines()[0]})
    records.sort(key=lambda r: (r["ms"] is None, r["ms"] or 0.0))
    return records
