"""Facts about GPUs, read from the device (never hard-coded)."""

from __future__ import annotations

from functools import lru_cache

from .._deps import require_cupy
from .nvrtc import normalize_arch


def gpu_count() -> int:
    """Number of CUDA devices visible; 0 when there is no GPU or no driver."""
    try:
        return int(require_cupy().cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no GPU"
        return 0


@lru_cache(maxsize=64)
def device_arch(device_id: int) -> str:
    """The real architecture of a device, e.g. 'sm_90'."""
    return normalize_arch(require_cupy().cuda.Device(device_id).compute_capability)


@lru_cache(maxsize=64)
def device_attributes(device_id: int) -> dict:
    return dict(require_cupy().cuda.Device(device_id).attributes)


def sm_count(device_id: int) -> int:
    return int(device_attributes(device_id)["MultiProcessorCount"])


@lru_cache(maxsize=64)
def device_name(device_id: int) -> str:
    props = require_cupy().cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
