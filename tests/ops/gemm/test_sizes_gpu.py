"""Sizes at the kernels' 32-bit limits, on the GPU: K near 2**31, M at its limit, and the
arguments whose byte sizes, strides or pointers no kernel can take.

Inputs are structured so that the exact answer is known without a reference GEMM over
billions of products: ones over the first 1000 values of K and a few values at its very end
(past 2**30 or 2**31 - 16, where 32-bit byte counts and tile counts used to wrap), zeros
elsewhere. Outputs are poisoned with NaN first. These tests need up to about 70 GB of GPU
memory and run alone (the ``bigmem`` marker), after the parallel suite.
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    cp.get_default_memory_pool().free_all_blocks()


def _need_bytes(n: int) -> None:
    free, _ = cp.cuda.runtime.memGetInfo()
    if free < n * 1.05:
        pytest.skip(f"needs {n / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} free")


def _structured(m: int, n: int, k: int, dtype, tail: int):
    """A (m, k) and B (k, n): ones over k < 1000; A = 1 and B = 3 over the last ``tail`` k;
    zeros elsewhere. A @ B = 1000 + 3 * tail everywhere."""
    a = cp.zeros((m, k), dtype=dtype)
    b = cp.zeros((k, n), dtype=dtype)
    a[:, :1000] = 1
    b[:1000, :] = 1
    a[:, k - tail:] = 1
    b[k - tail:, :] = 3
    return a, b, 1000.0 + 3 * tail


@pytest.mark.bigmem
def test_bf16_k_over_2_30_unaligned_rows_on_mma_sync():
    """K = 2**30 + 1002: rows of 2**31 + 2004 bytes (4-byte aligned, so the mma.sync kernel with
    4-byte copies); the byte count of a row's remainder used to wrap to negative (zero-fill)."""
    import ml_dtypes

    m = n = 16
    k = 2**30 + 1002
    _need_bytes(2 * m * k * 2)
    a, b, want = _structured(m, n, k, ml_dtypes.bfloat16, tail=24)
    expl = ge2jit.explain(a, b, out_dtype=np.float32)
    assert expl.choice.family == "mma", str(expl)
    y = cp.full((m, n), np.nan, dtype=cp.float32)
    ge2jit.gemm_bias_act(a, b, out=y)
    assert cp.all(y == want), (want, cp.unique(y))


K_MAX = 2**31 - 1


@pytest.mark.bigmem
@pytest.mark.parametrize("k, config, precision, family", [
    (K_MAX, None, "ieee", "pipelined"),                  # the heuristic (split K)
    # The plain tiled kernel, with a deep K tile: one block walks all of K, 2**25 tiles.
    (K_MAX, "32x32x64_4x4", "ieee", "tiled"),
    (K_MAX - 3, "mma_128x128x32_w64x64_s4", "tf32", "mma"),
    (K_MAX - 3, None, "tf32", "wgmma"),                  # Hopper: TMA (16-byte rows)
    (K_MAX, None, "tf32x3", "pipelined"),                # 3K would overflow: exact float32
])
def test_f32_k_at_2_31_minus_1(k, config, precision, family):
    """M = N = 1 and K up to 2**31 - 1: the tile count (K + BK - 1) / BK used to wrap."""
    _need_bytes(2 * k * 4)
    a, b, want = _structured(1, 1, k, cp.float32, tail=8)
    expl = ge2jit.explain(a, b, config=config, precision=precision)
    if family == "wgmma" and cp.cuda.Device().compute_capability != "90":
        family = "mma"
    assert expl.choice.family == family, str(expl)
    y = cp.full((1, 1), np.nan, dtype=cp.float32)
    ge2jit.gemm_bias_act(a, b, out=y, config=config, precision=precision)
    assert float(y[0, 0]) == want, (str(expl), float(y[0, 0]))


@pytest.mark.bigmem
def test_f32_tf32x3_pinned_tensor_core_config_over_3k_is_refused():
    k = 2**31 // 3 + 16
    _need_bytes(2 * k * 4)
    a = cp.empty((1, k), dtype=cp.float32)      # refused before any launch: never read
    b = cp.empty((k, 1), dtype=cp.float32)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"3K = \d+, more than the 2147483647"):
        ge2jit.gemm_bias_act(a, b, config="mma_128x128x32_w64x64_s4", precision="tf32x3")


@pytest.mark.bigmem
def test_m_at_its_limit():
    """M = 2**31 - 2**16 rows (the largest accepted), N = K = 1: every row computed."""
    m = ge2jit.ops.gemm.problem.MAX_MN
    _need_bytes(2 * m * 4)
    a = (cp.arange(m, dtype=cp.int32) % 251).astype(cp.float32).reshape(m, 1)
    b = cp.full((1, 1), 3.0, dtype=cp.float32)
    y = cp.full((m, 1), np.nan, dtype=cp.float32)
    ge2jit.gemm_bias_act(a, b, out=y)
    assert bool(cp.all(y == 3 * a))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"M = 2147418113: at most 2147418112"):
        ge2jit.gemm_bias_act(cp.empty((m + 1, 0), cp.float32), cp.empty((0, 1), cp.float32))


# ---- arguments no kernel can take: refused with real arrays, on the cached path too ----------

def _view(base, shape, dtype, offset=0, strides=None):
    mem = base.data + offset
    return cp.ndarray(shape, dtype=dtype, memptr=mem, strides=strides)


def test_misaligned_and_odd_strided_arrays_are_refused_on_the_cached_path():
    rng = np.random.default_rng(5)
    a = cp.asarray(rng.standard_normal((64, 32)), dtype=cp.float32)
    b = cp.asarray(rng.standard_normal((32, 48)), dtype=cp.float32)
    buf = cp.empty(64 * 48 * 4 + 64, dtype=cp.uint8)
    out = _view(buf, (64, 48), cp.float32, offset=16)
    ge2jit.gemm_bias_act(a, b, out=out)                       # the plan is prepared
    bad = _view(buf, (64, 48), cp.float32, offset=18)          # same shape, 2 bytes off
    with pytest.raises(ge2jit.ArgumentValueError, match="out: expected a pointer aligned"):
        ge2jit.gemm_bias_act(a, b, out=bad)
    odd = _view(buf, (7, 7), cp.float32, strides=(30, 4))      # was read as ld 7
    with pytest.raises(ge2jit.ArgumentValueError, match="out: expected strides"):
        ge2jit.gemm_bias_act(a[:7], b[:, :7], out=odd)
    bias_buf = cp.asarray(rng.standard_normal(49), dtype=cp.float32)
    bias = _view(bias_buf, (48,), cp.float32, offset=4)
    ge2jit.gemm_bias_act(a, b, bias)
    with pytest.raises(ge2jit.ArgumentValueError, match="bias: expected a pointer aligned"):
        ge2jit.gemm_bias_act(a, b, _view(bias_buf, (48,), cp.float32, offset=6))
    with pytest.raises(ge2jit.ArgumentValueError, match="bias: expected strides"):
        ge2jit.gemm_bias_act(a, b, _view(bias_buf, (48,), cp.float32, strides=(2,)))


def test_scalar_beyond_float64_on_the_cached_path():
    a = cp.ones((16, 16), dtype=cp.float32)
    y = ge2jit.gemm_bias_act(a, a, alpha=2)                     # an int alpha: plan prepared
    assert float(y[0, 0]) == 32.0
    with pytest.raises(ge2jit.ArgumentValueError, match="alpha: expected a real number within"):
        ge2jit.gemm_bias_act(a, a, alpha=10**400)
