"""From a spec to a launchable kernel: render, look up the disk cache, compile, load.

``build`` needs no GPU (it compiles for a named architecture). ``get_kernel`` keeps a table per
device, so a repeated call costs one dictionary lookup.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

from .._version import __version__
from ..errors import KernelLaunchError
from ..runtime.capture import check_not_capturing
from ..settings import get_settings
from . import nvrtc
from .cache import CacheEntry, cache_key, default_cache
from .device import device_arch
from .render import render, source_fingerprint
from .spec import KernelSpec

logger = logging.getLogger(__name__)


def key_for(spec: KernelSpec, arch: str) -> tuple[str, str, tuple[str, ...]]:
    """(cache key, rendered source, options) of ``spec`` compiled for ``arch``."""
    arch = nvrtc.normalize_arch(arch)
    source = render(spec)
    options = nvrtc.compile_options(arch, spec.compile_options())
    info = nvrtc.nvrtc_info()
    headers = ""
    if "#include <cuda" in source:
        headers = nvrtc.header_checksum(nvrtc.cuda_include_dir())
    key = cache_key(source=source, options=options, arch=arch,
                    nvrtc_fingerprint=info.fingerprint, ge2jit_version=__version__,
                    header_checksum=headers)
    return key, source, options


def alias_for(spec: KernelSpec, arch: str) -> str:
    """A name of ``spec``'s kernel for ``arch`` made without rendering its source: a sha256 of
    the spec (its type and every field), the architecture, the compile options, NVRTC's
    fingerprint, ge2jit's version, the CUDA headers' names and sizes and
    ``source_fingerprint()`` (the templates and the Python files that rendering reads). The
    cache links it to the entry's key (``KernelCache.link``) when the kernel is compiled, so
    that a later process finds the entry without rendering (Jinja's parse of a large template
    costs tens of milliseconds: hundreds at the first step of a job). A spec whose fields do
    not print the same in every process (an object without a ``repr``) only misses."""
    arch = nvrtc.normalize_arch(arch)
    h = hashlib.sha256(b"ge2jit-kernel-alias-v1")
    for part in (f"{type(spec).__module__}.{type(spec).__qualname__}", repr(spec), arch,
                 "\0".join(nvrtc.compile_options(arch, spec.compile_options())),
                 nvrtc.nvrtc_info().fingerprint, __version__,
                 nvrtc.header_listing(nvrtc.cuda_include_dir()), source_fingerprint()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def build(spec: KernelSpec, arch: str, cache=None) -> tuple[CacheEntry, bool]:
    """Compile ``spec`` for ``arch`` unless the cache holds it; returns (entry, was_cached).
    The entry is looked up by its alias first (``alias_for``: no rendering), then by its key.
    With ``GE2JIT_DUMP_DIR`` set, the kernel is also written there (``ge2jit.jit.dump``).

    Raises:
        KernelCompileError: NVRTC rejected the rendered source.
    """
    entry, cached = _build(spec, arch, cache)
    directory = get_settings().dump_dir
    if directory is not None:
        from .dump import dump_kernel

        dump_kernel(directory, spec, nvrtc.normalize_arch(arch), entry)
    return entry, cached


def _build(spec: KernelSpec, arch: str, cache) -> tuple[CacheEntry, bool]:
    cache = default_cache() if cache is None else cache
    arch = nvrtc.normalize_arch(arch)
    alias = alias_for(spec, arch)
    linked = cache.resolve(alias)
    if linked is not None:
        entry = cache.get(linked, kernel_name=spec.kernel_name, arch=arch, count_miss=False)
        if entry is not None:
            logger.debug("found %s for %s in the cache by its alias", spec.kernel_name, arch)
            return entry, True
    key, source, _ = key_for(spec, arch)
    entry = cache.get(key, kernel_name=spec.kernel_name, arch=arch)
    if entry is not None:
        logger.debug("found %s for %s in the cache", spec.kernel_name, arch)
        where = cache.where(key)
        if where is not None and where.parent.parent == cache.root:
            cache.link(alias, key)   # never into the first directory for a shared entry
        return entry, True
    result = nvrtc.compile_to_cubin(source, spec.kernel_name, arch, spec.compile_options())
    info = nvrtc.nvrtc_info()
    r = result.resources
    entry = CacheEntry(
        key=key, kernel_name=spec.kernel_name, arch=arch, cubin=result.cubin,
        registers=r.registers, shared_bytes=r.shared_bytes, stack_bytes=r.stack_bytes,
        spill_stores=r.spill_stores, spill_loads=r.spill_loads,
        compile_seconds=result.compile_seconds,
        nvrtc_version=f"{info.version[0]}.{info.version[1]}", ge2jit_version=__version__,
        created=time.time(), log=result.log,
    )
    path = cache.put(entry, source)
    if path is not None:
        cache.link(alias, key)
    logger.info("compiled %s for %s in %.2f s -> %s", spec.kernel_name, arch,
                result.compile_seconds, path or "memory")
    return entry, False


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel loaded on one device."""

    spec: KernelSpec
    device_id: int
    entry: CacheEntry
    module: object
    function: object
    max_threads: int = 1024


_tables: dict[int, dict[KernelSpec, LoadedKernel]] = {}
_lock = threading.Lock()


def get_kernel(spec: KernelSpec, device_id: int) -> LoadedKernel:
    """The loaded kernel of ``spec`` on ``device_id`` (compiled and cached at first use)."""
    table = _tables.get(device_id)
    if table is not None:
        k = table.get(spec)
        if k is not None:
            return k
    return _load(spec, device_id)


#: (spec, device) -> its Launcher (``launcher_for``)
_launchers: dict = {}


def launcher_for(spec: KernelSpec, device_id: int):
    """The ``Launcher`` of ``spec``'s kernel on ``device_id`` (loaded at first use), for ops
    that launch a kernel by itself rather than through a plan of their own."""
    key = (spec, device_id)
    launcher = _launchers.get(key)
    if launcher is None:
        from .launch import Launcher

        launcher = _launchers[key] = Launcher.for_spec(spec, get_kernel(spec, device_id)
                                                       .function.ptr)
    return launcher


#: (spec, device, threads) -> blocks a multiprocessor holds (``resident_blocks``)
_resident: dict = {}


def resident_blocks(spec: KernelSpec, device_id: int, threads: int) -> int:
    """How many blocks of ``threads`` threads of ``spec``'s kernel (loaded at first use) one
    multiprocessor of ``device_id`` holds at once: the driver's occupancy calculator, with the
    spec's dynamic shared memory. For kernels whose blocks stay resident and walk the work."""
    key = (spec, device_id, threads)
    blocks = _resident.get(key)
    if blocks is None:
        import cupy

        fptr = get_kernel(spec, device_id).function.ptr
        with cupy.cuda.Device(device_id):
            blocks = _resident[key] = max(1, int(
                cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    fptr, threads, spec.smem_bytes)))
    return blocks


def _load(spec: KernelSpec, device_id: int) -> LoadedKernel:
    import cupy

    with _lock:
        table = _tables.setdefault(device_id, {})
        if spec in table:
            return table[spec]
        # never compile or load inside a CUDA graph capture (GraphCaptureError: warm up first)
        check_not_capturing(spec.kernel_name, device_id)
        entry, _ = build(spec, spec.target_arch(device_arch(device_id)))
        with cupy.cuda.Device(device_id):
            module = cupy.cuda.function.Module()
            try:
                module.load(entry.cubin)
                function = module.get_function(spec.kernel_name)
                driver = cupy.cuda.driver
                if spec.smem_bytes > 48 * 1024:
                    driver.funcSetAttribute(function.ptr,
                                            driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            spec.smem_bytes)
                max_threads = driver.funcGetAttribute(
                    driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function.ptr)
            except Exception as e:  # noqa: BLE001 - driver errors carry the reason
                raise KernelLaunchError(
                    f"could not load kernel {spec.kernel_name!r} on device {device_id} "
                    f"({entry.arch}): {e}"
                ) from e
        k = LoadedKernel(spec=spec, device_id=device_id, entry=entry, module=module,
                         function=function, max_threads=max_threads)
        table[spec] = k
        return k
