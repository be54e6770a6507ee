"""gemm_bias_act on the GPU against a float64 NumPy reference.

Every output is poisoned with NaN before the call, inputs are fresh random numbers for each
check (never zeros), and ||Y - ref|| / ||ref|| < 1e-5 (Z alike) for float32.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.device import gpu_count
from ge2jit.ops.gemm.reference import (
    activation,
    gemm_bias_act_ref,
    magnitude_scale,
    rel_error,
)
from ge2jit.ops.gemm.spec import PIPELINED_F32_CONFIGS, TILED_CONFIGS, Act

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

TOL = 1e-5
ACTS = [a.value for a in Act]
BIAS_KINDS = ["none", "scalar", "col", "col2d", "row"]
LAYOUTS = list(itertools.product("rc", repeat=2))

_rng = np.random.default_rng(12345)


def rand(*shape, layout="r"):
    """A random float32 array on the GPU with the given layout ('c': a transposed view)."""
    host = _rng.standard_normal(shape).astype(np.float32)
    if layout == "c" and len(shape) == 2:
        return cp.asarray(np.ascontiguousarray(host.T)).T
    return cp.asarray(host)


def make_bias(kind, m, n):
    return {"none": None, "scalar": rand(), "col": rand(n), "col2d": rand(1, n),
            "row": rand(m, 1)}[kind]


def poisoned(m, n):
    return cp.full((m, n), np.nan, dtype=cp.float32)


def check(a, b, bias=None, *, act="none", c=None, alpha=1.0, beta=0.0, save_preact=False,
          leaky_slope=0.01, config=None, tol=TOL):
    m, n = a.shape[0], b.shape[1]
    y = poisoned(m, n)
    z = poisoned(m, n) if save_preact else None
    got = ge2jit.gemm_bias_act(a, b, bias, act=act, c=c, alpha=alpha, beta=beta,
                               save_preact=save_preact, out=y, preact_out=z,
                               leaky_slope=leaky_slope, config=config)
    if save_preact:
        assert got[0] is y and got[1] is z
    else:
        assert got is y
    host = [None if x is None else cp.asnumpy(x) for x in (a, b, bias, c)]
    ref_y, ref_z = gemm_bias_act_ref(host[0], host[1], host[2], act=act, c=host[3], alpha=alpha,
                                     beta=beta, leaky_slope=leaky_slope)
    floor = 0.5 * magnitude_scale(host[0], host[1], host[2], c=host[3], alpha=alpha, beta=beta)
    y_host = cp.asnumpy(y)
    assert np.isfinite(y_host).all(), "every element of Y is written"
    # The activations' slopes are at most about 1.1, so Z's floor bounds Y's too; leaky_relu's
    # small slope scales both Y and its error.
    y_floor = floor * (leaky_slope if act == "leaky_relu" else 1.0)
    err = rel_error(y_host, ref_y, y_floor)
    assert err < tol, f"Y: relative error {err:.3g} (||ref|| {np.linalg.norm(ref_y):.3g})"
    if save_preact:
        z_host = cp.asnumpy(z)
        assert np.isfinite(z_host).all()
        errz = rel_error(z_host, ref_z, floor)
        assert errz < tol, f"Z: relative error {errz:.3g}"
    return y_host


@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("bias_kind", BIAS_KINDS)
@pytest.mark.parametrize("act", ACTS)
def test_act_bias_layout(act, bias_kind, la, lb):
    m, n, k = 130, 67, 45
    a, b = rand(m, k, layout=la), rand(k, n, layout=lb)
    check(a, b, make_bias(bias_kind, m, n), act=act, alpha=1.25)


@pytest.mark.parametrize("lc", "rc")
@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("alpha, beta", [(0.5, 1.0), (-1.5, -0.25), (1.0, 2.0)])
def test_alpha_beta_c(la, lb, lc, alpha, beta):
    m, n, k = 75, 129, 33
    a, b, c = rand(m, k, layout=la), rand(k, n, layout=lb), rand(m, n, layout=lc)
    check(a, b, rand(n), act="silu", c=c, alpha=alpha, beta=beta, save_preact=True)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias_kind", ["row", "col", "scalar"])
def test_save_preact(act, bias_kind):
    m, n, k = 65, 66, 67
    check(rand(m, k), rand(k, n), make_bias(bias_kind, m, n), act=act, save_preact=True,
          leaky_slope=0.2)


SIZES = [1, 3, 17, 127, 1000]
KS = [1, 3, 17, 127, 1000, 4096]


@pytest.mark.parametrize("m, n", list(itertools.product(SIZES, SIZES)))
def test_sizes_not_multiple_of_tiles(m, n):
    k = KS[(SIZES.index(m) + 2 * SIZES.index(n)) % len(KS)]
    check(rand(m, k), rand(k, n, layout="c"), rand(n), act="gelu_tanh")


@pytest.mark.parametrize("k", [1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 127, 129, 255, 257,
                               511, 1000, 1023, 1025, 2047, 4095, 4096])
def test_k_sweep(k):
    check(rand(127, k), rand(k, 131), rand(131), act="gelu", save_preact=True)


ALL_CONFIGS = ([t.name for t in TILED_CONFIGS] + [c.name for c in PIPELINED_F32_CONFIGS]
               + [c.name + "_k3" for c in PIPELINED_F32_CONFIGS])


@pytest.mark.parametrize("config", ALL_CONFIGS)
@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("shape", [(1, 1, 1), (256, 128, 64), (257, 129, 65), (1000, 3, 513)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_candidate_config(config, la, lb, shape):
    m, n, k = shape
    c = rand(m, n)
    check(rand(m, k, layout=la), rand(k, n, layout=lb), rand(m, 1), act="leaky_relu", c=c,
          beta=0.5, save_preact=True, config=config)
    check(rand(m, k, layout=la), rand(k, n, layout=lb), None, act="sigmoid", config=config)


@pytest.mark.parametrize("config", [PIPELINED_F32_CONFIGS[0].name,
                                    PIPELINED_F32_CONFIGS[5].name + "_k4"])
def test_misaligned_operands_and_outputs(config):
    """Pointers off 16-byte alignment and odd leading dimensions take the 4-byte paths."""
    m, n, k = 300, 260, 200
    a = rand(k, m + 4).T[1:m + 1, :]                      # column-major, ld 304, base off by 4 B
    b = rand(k, n + 5)[:, 1:n + 1]                         # row-major, base off, ld odd
    y_big, z_big = poisoned(m, n + 1), poisoned(m, n + 1)
    bias = rand(n)
    y, z = ge2jit.gemm_bias_act(a, b, bias, act="gelu", out=y_big[:, 1:], save_preact=True,
                                preact_out=z_big[:, 1:], config=config)
    ref_y, ref_z = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), cp.asnumpy(bias), act="gelu")
    assert rel_error(cp.asnumpy(y), ref_y) < TOL and rel_error(cp.asnumpy(z), ref_z) < TOL
    assert np.isnan(cp.asnumpy(y_big[:, 0])).all()
    check(a, b, bias, act="gelu", config=config)


@pytest.mark.parametrize("shape", [(8192, 64, 4096), (512, 1024, 1024), (64, 64, 8192),
                                   (3000, 1000, 1500)])
def test_heuristic_choices_including_split_k(shape):
    m, n, k = shape
    a, b, bias = rand(m, k), rand(k, n), rand(n)
    info = ge2jit.explain(a, b, bias, act="silu")
    assert info.reason == "heuristic"
    check(a, b, bias, act="silu", save_preact=True)


def test_explain_pinned_and_tuned(tmp_path, monkeypatch):
    from ge2jit.tune import db

    monkeypatch.setattr(db, "_default", db.TuningDB(tmp_path / "tuning"))
    ge2jit.ops.gemm.clear_plans()
    m, n, k = 96, 80, 2048
    a, b = rand(m, k), rand(k, n)
    pinned = ge2jit.explain(a, b, config="64x64x8_w32x32_s3_k2")
    assert pinned.reason == "pinned" and pinned.config == "64x64x8_w32x32_s3_k2"
    assert len(pinned.kernel_names) == 2 and pinned.grid[2] == 2
    assert "pinned" in str(pinned)
    assert ge2jit.explain(a, b).reason == "heuristic"
    result = ge2jit.tune(a, b, reps=3, processes=2)
    timed = [r["ms"] for r in result.records if r["ms"] is not None]
    assert timed == sorted(timed) and result.records[0]["config"] == result.best.name
    assert result.best.name in repr(result)
    info = ge2jit.explain(a, b, act="relu")
    assert info.reason == "tuned" and info.config == result.best.name
    check(a, b, act="relu")
    ge2jit.ops.gemm.clear_plans()


def test_tuning_database_is_used_by_other_processes(tmp_path):
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import cupy as cp, ge2jit, sys
        a = cp.random.standard_normal((64, 4096), dtype=cp.float32)
        b = cp.random.standard_normal((4096, 48), dtype=cp.float32)
        if sys.argv[1] == "tune":
            print(ge2jit.tune(a, b, reps=3, processes=4).best.name)
        else:
            print(ge2jit.explain(a, b).reason, ge2jit.explain(a, b).config)
    """)
    env = {**__import__("os").environ, "GE2JIT_CACHE_DIR": str(tmp_path)}
    tuned = subprocess.run([sys.executable, "-c", code, "tune"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    used = subprocess.run([sys.executable, "-c", code, "use"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split() == ["tuned", tuned.stdout.strip()]


def test_autotune_argument(tmp_path, monkeypatch):
    from ge2jit.tune import db

    monkeypatch.setattr(db, "_default", db.TuningDB(tmp_path / "tuning"))
    ge2jit.ops.gemm.clear_plans()
    a, b = rand(100, 3000), rand(3000, 60)
    check(a, b, rand(60), act="tanh")
    y = ge2jit.gemm_bias_act(a, b, act="tanh", autotune=True)
    assert ge2jit.explain(a, b, act="tanh").reason == "tuned"
    ref, _ = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), act="tanh")
    assert rel_error(cp.asnumpy(y), ref) < TOL
    ge2jit.ops.gemm.clear_plans()


def test_failing_candidate_falls_back_with_one_warning(monkeypatch):
    from ge2jit.ops.gemm import plans

    real = plans.get_kernel

    def broken(spec, device_id):
        if spec.kernel_name.startswith("gemm_f32") and "_w" in spec.kernel_name:
            raise ge2jit.KernelCompileError(spec.kernel_name, "simulated failure", "", ())
        return real(spec, device_id)

    monkeypatch.setattr(plans, "get_kernel", broken)
    plans.clear_plans()
    plans._warned.clear()
    a, b = rand(130, 70), rand(70, 90)
    with pytest.warns(RuntimeWarning, match="using the fallback kernel"):
        info = ge2jit.explain(a, b, act="relu")
    assert info.reason == "fallback" and "NVRTC failed to compile" in info.choice.detail
    check(a, b, act="relu")
    with pytest.raises(ge2jit.KernelCompileError):
        ge2jit.gemm_bias_act(a, b, config=PIPELINED_F32_CONFIGS[0].name)  # pinned: no fallback
    plans.clear_plans()


def test_large_problem_default_choice():
    m, n, k = 2048, 1536, 1024
    check(rand(m, k), rand(k, n), rand(n), act="gelu")


def test_default_outputs_are_fresh_arrays():
    # Fill the memory pool with NaN blocks of the output's size, so that unwritten elements of
    # the internally allocated Y and Z would show.
    m, n, k = 100, 70, 30
    junk = [poisoned(m, n) for _ in range(4)]
    del junk
    a, b, bias = rand(m, k), rand(k, n), rand(n)
    y, z = ge2jit.gemm_bias_act(a, b, bias, act="relu", save_preact=True)
    ref_y, ref_z = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), cp.asnumpy(bias), act="relu")
    assert y.shape == (m, n) and y.dtype == cp.float32 and y.flags.c_contiguous
    assert rel_error(cp.asnumpy(y), ref_y) < TOL and rel_error(cp.asnumpy(z), ref_z) < TOL


def test_leading_dimension_slices():
    big_a, big_b, big_c = rand(200, 300), rand(400, 500), rand(300, 600)
    a, b, c = big_a[10:110, 5:85], big_b[3:83, 7:97], big_c[:100, 1:91]
    ct = rand(600, 300).T[:100, :90]                 # column-major with ld 600
    bias = rand(90)
    out_big = poisoned(150, 200)
    out = out_big[20:120, 30:120]
    ge2jit.gemm_bias_act(a, b, bias, act="tanh", c=c, beta=1.0, out=out)
    ref, _ = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), cp.asnumpy(bias), act="tanh",
                               c=cp.asnumpy(c), beta=1.0)
    assert rel_error(cp.asnumpy(out), ref) < TOL
    host = cp.asnumpy(out_big)
    host[20:120, 30:120] = 0.0
    assert np.isnan(host[:20]).all() and np.isnan(host[120:]).all(), "rows outside untouched"
    assert np.isnan(host[20:120, :30]).all() and np.isnan(host[20:120, 120:]).all()
    check(a, b, bias, act="tanh", c=ct, beta=-1.0)
    check(big_a[10:110, 5:85].T.copy().T, big_b.T[7:97, 3:83].T, None)


def test_other_strides_are_copied_and_right():
    a = rand(90, 140)[::2, ::2]          # no unit stride: copied
    b = rand(70, 80)[:, ::-1]            # negative stride: copied
    check(a, b, rand(80), act="relu")


def test_empty_m_or_n():
    for m, n in [(0, 5), (5, 0), (0, 0)]:
        y, z = ge2jit.gemm_bias_act(rand(m, 3) if m else cp.empty((0, 3), cp.float32),
                                    rand(3, n) if n else cp.empty((3, 0), cp.float32),
                                    act="gelu", save_preact=True)
        assert y.shape == (m, n) and z.shape == (m, n)


def test_k_zero_gives_act_of_beta_c_plus_bias():
    m, n = 33, 44
    a, b = cp.empty((m, 0), cp.float32), cp.empty((0, n), cp.float32)
    c, bias = rand(m, n), rand(n)
    y = poisoned(m, n)
    ge2jit.gemm_bias_act(a, b, bias, act="sigmoid", c=c, beta=0.75, out=y)
    ref = activation("sigmoid", 0.75 * cp.asnumpy(c).astype(np.float64) + cp.asnumpy(bias))
    assert rel_error(cp.asnumpy(y), ref) < TOL


@pytest.mark.parametrize("act", ACTS)
def test_nan_propagates(act):
    m, n, k = 40, 50, 60
    a = rand(m, k)
    a[3, 7] = np.nan
    y = cp.asnumpy(ge2jit.gemm_bias_act(a, rand(k, n), rand(n), act=act))
    assert np.isnan(y[3]).all(), f"{act}: NaN in a row of A must give NaN in that row of Y"
    assert np.isfinite(np.delete(y, 3, axis=0)).all()


def test_runs_on_current_stream():
    m, n, k = 1024, 1024, 1024
    a, b = rand(m, k), rand(k, n)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = ge2jit.gemm_bias_act(a, b, act="relu")
        done = stream.record()
    done.synchronize()
    ref, _ = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), act="relu")
    assert rel_error(cp.asnumpy(y), ref) < TOL


def test_repeated_call_is_a_table_lookup(monkeypatch):
    from ge2jit.jit import loader
    from ge2jit.ops.gemm import plans

    a, b = rand(64, 64), rand(64, 64)
    ge2jit.gemm_bias_act(a, b, act="relu")

    def no_build(*args, **kwargs):
        raise AssertionError("a repeated call must not choose, render, hash or compile")

    monkeypatch.setattr(loader, "build", no_build)
    monkeypatch.setattr(plans, "get_kernel", no_build)
    monkeypatch.setattr(plans, "_make_plan", no_build)
    ge2jit.gemm_bias_act(a, rand(64, 64), act="relu")


def test_errors_with_real_arrays():
    a, b = rand(8, 4), rand(4, 6)
    with pytest.raises(ge2jit.ArgumentTypeError, match=r"cupy.asarray\(a\)"):
        ge2jit.gemm_bias_act(cp.asnumpy(a), b)
    with pytest.raises(ge2jit.ArgumentValueError, match="supported dtypes: float32"):
        ge2jit.gemm_bias_act(a.astype(cp.float64), b.astype(cp.float64))
    with pytest.raises(ge2jit.ArgumentValueError, match="bias: shape"):
        ge2jit.gemm_bias_act(a, b, rand(8))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps a"):
        big = rand(8, 10)
        ge2jit.gemm_bias_act(big[:, :4], b, out=big[:, 4:])
    with pytest.raises(ge2jit.ArgumentValueError, match="act: unknown activation"):
        ge2jit.gemm_bias_act(a, b, act="swish")


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_arrays_on_two_devices():
    a = rand(8, 4)
    with cp.cuda.Device(1):
        b = cp.ones((4, 6), cp.float32)
    with pytest.raises(ge2jit.DeviceMismatchError, match="b: expected an array on the current"):
        ge2jit.gemm_bias_act(a, b)


def test_repeated_calls_on_the_cached_path_stay_right():
    m, n, k = 77, 150, 300
    for alpha in (1.0, 2, -0.5):                      # int and float scalars, same signature
        a, b, bias = rand(m, k, layout="c"), rand(k, n), rand(n)
        y = poisoned(m, n)
        ge2jit.gemm_bias_act(a, b, bias, act="silu", alpha=alpha, out=y)
        ref, _ = gemm_bias_act_ref(cp.asnumpy(a), cp.asnumpy(b), cp.asnumpy(bias), act="silu",
                                   alpha=alpha)
        assert rel_error(cp.asnumpy(y), ref) < TOL
        y2, z2 = ge2jit.gemm_bias_act(a, b, bias, act="silu", alpha=alpha, save_preact=True)
        assert rel_error(cp.asnumpy(y2), ref) < TOL


def test_cached_path_still_refuses_overlapping_out():
    big, other = rand(8, 10), rand(8, 10)
    b = rand(4, 6)
    ge2jit.gemm_bias_act(big[:, :4], b, out=other[:, 4:])          # fine, and now cached
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps a"):
        ge2jit.gemm_bias_act(big[:, :4], b, out=big[:, 4:])         # same signature
    bias, buf = rand(6), rand(2 * 48)
    ge2jit.gemm_bias_act(big[:, :4], b, bias, out=buf[:48].reshape(8, 6),
                         preact_out=buf[48:].reshape(8, 6), save_preact=True)    # cached
    with pytest.raises(ge2jit.ArgumentValueError, match="preact_out: overlaps out"):
        ge2jit.gemm_bias_act(big[:, :4], b, bias, out=buf[:48].reshape(8, 6),
                             preact_out=buf[24:72].reshape(8, 6), save_preact=True)
    flat, z = rand(8 * 6 + 8), rand(8, 6)
    ge2jit.gemm_bias_act(big[:, :4], b, flat[:6], out=flat[8:].reshape(8, 6), preact_out=z,
                         save_preact=True)                                      # cached
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps bias"):
        ge2jit.gemm_bias_act(big[:, :4], b, flat[:6], out=flat[:48].reshape(8, 6),
                             preact_out=z, save_preact=True)


def test_inspect_a_call_and_benchmark_configs():
    a, b, bias = rand(1000, 512), rand(512, 768), rand(768)
    info = ge2jit.inspect(a, b, bias, act="gelu", config="64x64x8_w32x32_s3_k2")
    assert info.explanation.reason == "pinned" and len(info.kernels) == 2
    main = info.kernels[0]
    assert main.occupancy is not None and 0 < main.occupancy <= 1 and main.blocks_per_sm >= 1
    assert "theoretical occupancy" in str(info) and "<table>" in info._repr_html_()
    records = ge2jit.benchmark_configs(["128x128x8_w32x64_s3", "64x64x8_4x4", "nonsense"],
                                       a, b, bias, act="gelu", reps=3)
    assert [r["config"] for r in records][-1] == "nonsense" and "error" in records[-1]
    timed = [r["ms"] for r in records if r["ms"] is not None]
    assert len(timed) == 2 and timed == sorted(timed)
    assert "TFLOP/s" in repr(records)


# --- out=c: accumulating in place -------------------------------------------------------------
# Each kernel family reads an element (or a tile) of C before the same thread (or tile) writes
# that element of Y, so ``out=c`` is Y = alpha * A @ B + beta * Y. Checked on every family, two
# calls in a row (the second on the cached path), against float64.
IN_PLACE_CASES = [("float32", "float32", "64x64x8_4x4"),
                  ("float32", "float32", "128x128x8_w32x64_s3"),
                  ("float32", "float32", "128x128x8_w32x64_s3_k4"),          # split-K
                  ("bfloat16", "float32", "mma_128x128x32_w64x64_s4"),
                  ("bfloat16", "bfloat16", "mma_128x128x32_w64x64_s4"),
                  ("bfloat16", "float32", "wgmma_128x256_s4"),
                  ("float16", "float16", "wgmma_128x128_s4_pp"),
                  ("bfloat16", "float32", None)]


@pytest.mark.parametrize("dtype,out_dtype,config", IN_PLACE_CASES,
                         ids=[f"{d}-{o}-{c}" for d, o, c in IN_PLACE_CASES])
def test_out_may_be_c_accumulating_in_place(dtype, out_dtype, config):
    import ml_dtypes

    from ge2jit.ops.gemm.plans import device_arch
    if config and config.startswith("wgmma") and not device_arch(0).startswith("sm_90"):
        pytest.skip("wgmma kernels need sm_90")
    np_dt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    m, n, k = 300, 520, 264
    a_h = _rng.standard_normal((m, k)).astype(np_dt[dtype])
    b_h = _rng.standard_normal((k, n)).astype(np_dt[dtype])
    bias_h = _rng.standard_normal(n).astype(np.float32)
    y_h = _rng.standard_normal((m, n)).astype(np_dt[out_dtype])
    a, b, bias = cp.asarray(a_h), cp.asarray(b_h), cp.asarray(bias_h)
    y = cp.asarray(y_h)
    want = y_h.astype(np.float64)
    prod = a_h.astype(np.float64) @ b_h.astype(np.float64)
    tol = 1e-5 if out_dtype == "float32" else 1e-2
    prec = "ieee" if dtype == "float32" else None
    for alpha, beta in ((1.0, 1.0), (0.5, -2.0)):
        got = ge2jit.gemm_bias_act(a, b, bias, c=y, alpha=alpha, beta=beta, out=y,
                                   config=config, precision=prec, out_dtype=out_dtype)
        assert got is y
        want = alpha * prod + beta * want + bias_h
        assert rel_error(cp.asnumpy(y).astype(np.float64), want) < tol
        want = cp.asnumpy(y).astype(np.float64)       # the next call adds to what is there
