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


#: the most SMs a kernel's grid is sized for (``set_num_sms``); None: all of them
_sm_limit: int | None = None
#: called with no arguments when the limit changes (caches of launch plans sized by it)
_on_sm_change: list = []


def sm_count(device_id: int) -> int:
    """The SMs that kernels size their grids for: the device's, or fewer under
    ``set_num_sms``."""
    count = int(device_attributes(device_id)["MultiProcessorCount"])
    return count if _sm_limit is None else min(count, _sm_limit)


def set_num_sms(count: int | None) -> None:
    """Size every kernel's grid for at most ``count`` SMs (None: all of a device's again).

    A persistent kernel (one block per SM, each looping over its share of the tiles) fills
    every SM for its whole run, so a kernel on another stream, such as
    NCCL's all-reduce under a backward, gets none until it ends; and when the other kernel
    holds some SMs first, the persistent kernel's blocks for them wait, the kernel's share of
    them along. Leaving the communication ``device SMs - count`` SMs lets both run at once.
    The launch plans made so far are forgotten (a graph captured before keeps its grids).

    Raises:
        ArgumentValueError: ``count`` not None or an integer >= 1.
    """
    global _sm_limit
    from ..errors import ArgumentValueError

    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise ArgumentValueError(f"count: expected None or a number of SMs >= 1, got "
                                 f"{count!r}")
    if count != _sm_limit:
        _sm_limit = count
        for forget in _on_sm_change:
            forget()


#: whether kernels whose blocks walk their share of the work run one block per SM
_persistent = True


def set_persistent(enabled: bool) -> None:
    """Persistent grids on (True, the default) or off.

    A persistent kernel runs one block per SM, and each block walks its share of the work
    units (output tiles, say). Off, such a kernel runs one block per work unit, and a block
    leaves its SM when its tile is done. A kernel on another stream, such as
    NCCL's all-reduce under a backward, then gets SMs as soon as tiles finish, instead of when
    the whole kernel ends. It gives up the overlap of one tile's epilogue with the next tile's
    loads. The launch plans made so far are forgotten (a graph captured before keeps its
    grids).

    Raises:
        ArgumentValueError: ``enabled`` not a bool.
    """
    global _persistent
    from ..errors import ArgumentValueError

    if not isinstance(enabled, bool):
        raise ArgumentValueError(f"enabled: expected True or False, got {enabled!r}")
    if enabled != _persistent:
        _persistent = enabled
        for forget in _on_sm_change:
            forget()


def persistent_blocks(device_id: int, units: int) -> int:
    """The blocks of a grid over ``units`` work units: one per SM (``sm_count``) at most while
    persistent grids are on (``set_persistent``), else one per unit."""
    return min(units, sm_count(device_id)) if _persistent else units


def get_num_sms(device_id: int | None = None) -> int:
    """The SMs kernels size their grids for on ``device_id`` (default: the current device),
    after ``set_num_sms``."""
    if device_id is None:
        device_id = require_cupy().cuda.runtime.getDevice()
    return sm_count(device_id)


def on_sm_change(forget) -> None:
    """Call ``forget()`` whenever ``set_num_sms`` or ``set_persistent`` changes how grids are
    sized (a cache of plans)."""
    _on_sm_change.append(forget)


@lru_cache(maxsize=64)
def device_name(device_id: int) -> str:
    props = require_cupy().cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
