"""Notebook helpers: what a kernel is (``inspect``) and how configs compare (``benchmark_configs``).

Both return objects that print as text and render as HTML tables in Jupyter.
"""

from __future__ import annotations

import difflib
import html
from dataclasses import dataclass, field
from inspect import signature

from ._deps import require_cupy
from .errors import ArgumentTypeError, ArgumentValueError
from .jit.cache import default_cache
from .jit.device import device_arch, gpu_count
from .jit.loader import build, get_kernel
from .jit.nvrtc import normalize_arch
from .jit.render import render
from .jit.sass import dump_sass, instruction_mix
from .jit.spec import KernelSpec
from .runtime.registry import Explanation, Op, default_op, find, get, ops
from .runtime.tools import Records, explain, sort_records, time_config


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


def config_info(op: Op, config=None, *, arch: str | None = None, **kwargs) -> KernelInfo:
    """Compile and describe the kernel that ``config`` of ``op`` (None for an op without
    configs) runs for one specialization, which ``kwargs`` name (the op's
    ``specs_for_config`` says how); no arrays, and no GPU when ``arch`` is named. ``extra``
    names the config and any other kernels it launches.

    Raises:
        ArgumentValueError: a bad name or argument, or a config that cannot run this
            specialization on ``arch`` (the message names the argument).
    """
    op = get(op)
    if op.specs_for_config is None:
        raise ArgumentValueError(f"op: {op.name} cannot be inspected without arrays (it "
                                 "registers no specs_for_config)")
    arch = _arch(arch, gpu_count() > 0)
    specs = op.specs_for_config(config, arch, **kwargs)
    extra = {} if config is None else {"config": str(getattr(config, "name", config))}
    if len(specs) > 1:
        extra["also launches"] = ", ".join(s.kernel_name for s in specs[1:])
    return kernel_info(specs[0], arch, extra)


@dataclass(frozen=True)
class CallInfo:
    """What one call runs: the chosen config, why, and each kernel."""

    explanation: Explanation
    kernels: tuple[KernelInfo, ...]

    def __str__(self) -> str:
        return "\n\n".join([str(self.explanation)] + [str(k) for k in self.kernels])

    def _repr_html_(self) -> str:
        head = f"<p><b>{html.escape(str(self.explanation.choice))}</b></p>"
        return head + "".join(k._repr_html_() for k in self.kernels)


def inspect(obj, *args, arch: str | None = None, **kwargs) -> KernelInfo | CallInfo:
    """Describe a kernel: its spec, source, registers, shared memory, spills, occupancy.

    Forms (``op`` is an op's function, name or ``Op``; left out, the default op):
        - ``inspect([op,] "<config>", arch="sm_90", **keywords)``: the kernel a config runs
          for one specialization (no arrays, no GPU needed; the keywords are the op's
          ``specs_for_config``'s). An op without configs: ``inspect(op, arch=..., ...)``.
        - ``inspect(spec, arch="sm_90")``: any kernel spec.
        - ``inspect([op,] *arrays, **keywords)``: with the op's arguments, the configuration
          that call chooses, why, and each kernel it runs (on the GPU).

    ``arch`` defaults to the current GPU's; without a GPU it must be named.
    """
    if isinstance(obj, KernelSpec):
        return kernel_info(obj, arch)
    op = find(obj)
    if op is None and isinstance(obj, str):
        return _default_config_info(obj, args, arch, kwargs)
    if op is None:
        op, args = default_op(), (obj, *args)
    if not args or isinstance(args[0], (str, *op.config_types)):
        return config_info(op, *args, arch=arch, **kwargs)
    info = explain(op, *args, **kwargs)
    return CallInfo(info, tuple(kernel_info(s) for s in info.specs))


def _default_config_info(name: str, args: tuple, arch, kwargs: dict) -> KernelInfo:
    """``inspect(name, ...)`` where ``name`` is no op's: a config of the default op, if it is
    one; else one line that there is no op or config so named, listing the ops (rather than
    the default op's complaint about a config name when an op's name was misspelt)."""
    names = [o.name for o in ops()]
    default = default_op()

    def unknown(detail: str) -> ArgumentValueError:
        return ArgumentValueError(f"op or config: no op or config named {name!r}{detail}; the "
                                  f"ops: {', '.join(names)}")

    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        raise unknown(f" (did you mean {close[0]!r}?)")
    if args:   # a config takes keywords only: arrays after a name are another op's call
        raise unknown("")
    try:
        return config_info(default, name, arch=arch, **kwargs)
    except ArgumentValueError as e:
        # the default op refused the name itself (not an argument or the arch)
        text = str(e)
        if text.startswith("config:") and text.endswith(f"got {name!r}"):
            raise unknown(f" (not a config of {default.name}: "
                          f"{text.removeprefix('config: ').split(', got ')[0]})") from None
        raise


def _check_call(op: Op, args: tuple, kwargs: dict) -> None:
    """The arguments ``benchmark_configs`` times ``op`` on must make a call of it (arrays
    left out, each config would record the same TypeError)."""
    try:
        signature(op.function).bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentTypeError(f"args: expected the arguments of a call of {op.name} (its "
                                f"arrays and keywords) to time each config on; {e}") from None


def benchmark_configs(op, *args, configs=None, reps: int = 20, **kwargs) -> Records:
    """Time ``op`` (its function, name or ``Op``) on these arguments with each of
    ``configs`` pinned (default: the op's candidates for them).

    ``benchmark_configs(configs, *arrays, **keywords)`` (configs first) times the default op.

    Returns one record per config, fastest first: config, ms (median of CUDA events), TFLOP/s
    (where the op counts its flops) and the kernels it ran; a config that fails records its
    error instead.
    """
    if find(op) is None and not isinstance(op, str):   # configs first: the default op's
        op, configs = default_op(), op
    op = get(op)
    _check_call(op, args, kwargs)
    if configs is None:
        if op.candidates is None:
            raise ArgumentValueError(f"op: {op.name} has no configs to compare")
        configs = op.candidates(*args, **kwargs)
    records = Records()
    for config in configs:
        record = time_config(op, config, args, kwargs, reps=reps, warmup=3)
        if record["ms"] is not None and op.plan is not None:
            info = explain(op, *args, config=config, **kwargs)
            record["config"] = info.config
            if info.flops is not None:
                record["TFLOP/s"] = info.flops / record["ms"] / 1e9
            record["kernels"] = ", ".join(info.kernel_names)
        records.append(record)
    records[:] = sort_records(records)
    return records
