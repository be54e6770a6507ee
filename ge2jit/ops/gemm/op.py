"""gemm_bias_act: the fused GEMM + bias + activation, and its launcher."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentTypeError, ArgumentValueError, KernelLaunchError
from ...jit.device import sm_count
from ...jit.loader import get_kernel
from .problem import validate
from .spec import SIMT_F32_TILES, GemmSpec, TileConfig

_NULL = np.uintp(0)
_GRID_Y_MAX = 65535


def choose_tile(m: int, n: int, device_id: int) -> TileConfig:
    """The largest tile that still gives every multiprocessor at least one block."""
    sms = sm_count(device_id)
    for tile in SIMT_F32_TILES:
        blocks = -(-m // tile.bm) * -(-n // tile.bn)
        if blocks >= sms:
            return tile
    return SIMT_F32_TILES[-1]


def _tile_from_config(config) -> TileConfig:
    if isinstance(config, TileConfig):
        return config
    if isinstance(config, str):
        try:
            return TileConfig.parse(config)
        except ValueError as e:
            raise ArgumentValueError(str(e)) from None
    raise ArgumentTypeError(
        f"config: expected a TileConfig or a name like '128x128x8_8x8', got {config!r}"
    )


def _outputs(p, save_preact: bool):
    import cupy as cp

    y = p.out if p.out is not None else cp.empty((p.m, p.n), dtype=np.float32)
    z = None
    if save_preact:
        z = p.preact_out if p.preact_out is not None else cp.empty((p.m, p.n), dtype=np.float32)
    return y, z


def gemm_bias_act(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0,
                  beta: float = 0.0, leaky_slope: float = 0.01, save_preact: bool = False,
                  out=None, preact_out=None, config=None):
    """Fused ``Y = act(alpha * (A @ B) + beta * C + bias)``, written once to memory.

    Products are accumulated in float32 and the epilogue (scaling, C, bias, activation) runs in
    registers, so Y (and Z when ``save_preact``) are written exactly once. Runs on CuPy's current
    device and stream; never synchronizes; allocates only its outputs.

    Args:
        a: (M, K) ``cupy.ndarray``, float32. Row-major, column-major (a transposed view such as
            ``w.T``) or a slice of a larger array with a unit stride in one dimension is used as
            it is; any other strides are copied once into a C-contiguous array.
        b: (K, N) ``cupy.ndarray``, float32, same layout rules as ``a``.
        bias: None, or an array that broadcasts to (M, N): shape ``()`` or ``(1,)`` is a scalar,
            ``(N,)`` or ``(1, N)`` one value per column, ``(M, 1)`` one value per row.
        act: "none", "relu", "leaky_relu", "gelu" (exact, erf form), "gelu_tanh" (tanh
            approximation), "sigmoid", "tanh" or "silu". NaN propagates through all of them.
        c: None, or an (M, N) array (any layout ``a`` accepts), added as ``beta * C``. When
            ``beta == 0`` C is not read (the BLAS convention).
        alpha: scale of ``A @ B``.
        beta: scale of ``C``; nonzero ``beta`` needs ``c``.
        leaky_slope: slope of "leaky_relu" for negative inputs.
        save_preact: also return ``Z = alpha * A @ B + beta * C + bias``, the pre-activation.
        out: optional (M, N) float32 array written in place: row-major (C-contiguous, or a slice
            of the rows of a larger array); it must not overlap any input.
        preact_out: optional preallocated Z for ``save_preact``, with the same rules as ``out``.
        config: pin a kernel configuration, a ``TileConfig`` or its name (``"128x64x8_8x4"``);
            default: chosen from the problem's shape.

    Returns:
        ``Y``, or ``(Y, Z)`` when ``save_preact`` is true. M = 0 or N = 0 give empty results;
        K = 0 gives ``act(beta * C + bias)``.

    Raises:
        ArgumentTypeError: an argument of the wrong type (a NumPy array, say).
        ArgumentValueError: bad dtype, shape, activation, bias shape, ``out`` or device.
        KernelCompileError: NVRTC rejected the kernel (the message holds its log).
    """
    import cupy as cp

    p = validate(a, b, bias, act, c, alpha, beta, leaky_slope, out, preact_out, save_preact)
    m, n, k = p.m, p.n, p.k
    pinned = None if config is None else _tile_from_config(config)
    if p.empty:
        y, z = _outputs(p, save_preact)
        return (y, z) if save_preact else y

    tile = choose_tile(m, n, p.device_id) if pinned is None else pinned
    grid_m = -(-m // tile.bm)
    grid_n = -(-n // tile.bn)
    if grid_n > _GRID_Y_MAX:
        raise ArgumentValueError(
            f"b: N = {n} needs {grid_n} column blocks, more than the {_GRID_Y_MAX} a launch allows "
            f"with tile {tile.name}"
        )
    spec = GemmSpec(p.dtype, p.layout_a, p.layout_b, p.layout_c, p.act, p.bias_kind,
                    bool(save_preact), tile)
    kernel = get_kernel(spec, p.device_id)
    y, z = _outputs(p, save_preact)
    ldy = y.strides[0] // y.itemsize if m > 1 else n
    ldz = (z.strides[0] // z.itemsize if m > 1 else n) if z is not None else 0
    args = (
        p.a, np.int64(p.lda), p.b, np.int64(p.ldb),
        p.c if p.c is not None else _NULL, np.int64(p.ldc),
        p.bias if p.bias is not None else _NULL, np.int64(p.bias_stride),
        y, np.int64(ldy),
        z if z is not None else _NULL, np.int64(ldz),
        np.int32(m), np.int32(n), np.int32(k),
        np.float32(p.alpha), np.float32(p.beta), np.float32(p.leaky_slope),
    )
    try:
        kernel.function((grid_m, grid_n, 1), (tile.threads, 1, 1), args,
                        stream=cp.cuda.get_current_stream())
    except Exception as e:  # noqa: BLE001 - the driver's reason is in the message
        raise KernelLaunchError(f"launch of {spec.kernel_name} failed: {e}") from e
    return (y, z) if save_preact else y
