"""cross_entropy on the GPU against the float64 reference (``ops/cross_entropy/reference.py``)
computed from the inputs' own values (16-bit logits included).

Every dtype and reduction on V in {1, 31, 33, 1000, 4097, 32000, 128256, 262144} classes and
{1, 3, 1024} rows, with and without label smoothing and ignored rows; every row ignored (the
mean of nothing is NaN, the gradient 0); the gradient into a new array, into ``out`` (poisoned
with NaN first, of another type too) and over the logits (in place); special values (-inf, +inf,
NaN); targets out of range (the call raises before writing; unchecked, NaN rows); int32 and
strided targets, rows of wider arrays, unaligned rows; every config pinned; grad_scale; the
same bits on every run; PyTorch tensors; rows x V past 2**31 (``bigmem``). Inputs are fresh
random values (standard normal logits times 3, random classes).

Tolerances: the loss of a row 1e-5 relative (+1e-5 absolute: it is log(sum e^x) - x_t in
float32 with compensated sums), a sum or mean 2e-5 of the sum of the rows' magnitudes; the
gradient, elementwise, 1e-5 of the magnitude of its terms (softmax, e / V, (1 - e) at the
target) times the scale, plus one rounding of a 16-bit gradient (float16 2**-11, bfloat16 2**-8
relative; float16's subnormals 2**-24 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.cross_entropy import all_configs, cross_entropy, heuristic
from ge2jit.ops.cross_entropy.reference import (
    count,
    cross_entropy_grad_ref,
    cross_entropy_ref,
    row_losses,
)
from ge2jit.ops.softmax.reference import softmax_ref

from ...gpu_arrays import BF16, DT, DTYPES, cp, poisoned, same_bits

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

CLASSES = [1, 31, 33, 1000, 4097, 32000, 128256, 262144]
ROWS = [1, 3, 1024]
REDUCTIONS = ["none", "sum", "mean"]
OUT_ROUNDING = {"float32": (0.0, 0.0), "float16": (2.0**-11, 2.0**-24),
                "bfloat16": (2.0**-8, 1e-30)}
CHUNK = 2**24            # logits per chunk of the host reference (float64 temporaries)

_rng = np.random.default_rng(91)


def make_inputs(rows: int, n: int, dtype, *, ignored: float = 0.0, target_dtype=np.int64):
    """(logits, targets) on the host: standard normal logits times 3 rounded to ``dtype``,
    random classes, a fraction ``ignored`` of the rows set to -100 (at least one when
    ``ignored`` > 0 and there are rows)."""
    logits = (_rng.standard_normal((rows, n), dtype=np.float32) * 3).astype(dtype)
    targets = _rng.integers(0, n, rows).astype(target_dtype)
    if ignored and rows:
        pick = _rng.random(rows) < ignored
        pick[_rng.integers(0, rows)] = True
        targets[pick] = -100
    return logits, targets


def _chunks(rows: int, n: int):
    step = max(1, CHUNK // max(n, 1))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def reference_losses(logits, targets, smoothing=0.0, ignore_index=-100) -> np.ndarray:
    """The rows' losses, float64, computed in chunks of rows."""
    rows, n = logits.shape
    return np.concatenate([row_losses(logits[a:b], targets[a:b], ignore_index, smoothing)
                           for a, b in _chunks(rows, n)] or [np.zeros(0)])


def check_loss(loss, logits, targets, reduction, smoothing=0.0, ignore_index=-100, ref=None):
    """The call's loss against the reference (``ref``: the rows' reference losses, if known)."""
    got = cp.asnumpy(loss) if isinstance(loss, cp.ndarray) else np.asarray(loss)
    assert got.dtype == np.float32
    if ref is None:
        ref = reference_losses(logits, targets, smoothing, ignore_index)
    if reduction == "none":
        assert got.shape == ref.shape
        with np.errstate(invalid="ignore"):
            bad = ~((np.abs(got - ref) <= 1e-5 * np.abs(ref) + 1e-5)
                    | (np.isnan(ref) & np.isnan(got)) | (np.isinf(ref) & (got == ref)))
        assert not bad.any(), (np.nonzero(bad)[0][:5], got[bad][:5], ref[bad][:5])
        return
    assert got.shape == ()
    c = count(targets, ignore_index)
    total = ref.sum()
    want = total if reduction == "sum" else (total / c if c else np.nan)
    if np.isnan(want):
        assert np.isnan(got), got
        return
    scale = np.abs(ref).sum() / (1 if reduction == "sum" else c)
    assert abs(float(got) - want) <= 2e-5 * scale + 1e-6, (float(got), want)


def check_grad(grad, logits, targets, reduction, smoothing=0.0, grad_scale=1.0,
               ignore_index=-100):
    """The gradient (a GPU array) against the reference, chunk by chunk; past 2**26 logits,
    on 96 of the rows (the first and last 32, and 32 drawn at random)."""
    rows, n = logits.shape
    assert grad.shape == (rows, n)
    rel, atol = OUT_ROUNDING[np.dtype(grad.dtype).name]
    scale = grad_scale
    if reduction == "mean":
        c = count(targets, ignore_index)
        scale = grad_scale / c if c else 0.0
    picked = np.arange(rows)
    if rows * n > 2**26:
        picked = np.unique(np.concatenate([picked[:32], picked[-32:],
                                           _rng.choice(rows, 32, replace=False)]))
    for a, b in _chunks(len(picked), n):
        at = picked[a:b]
        got = cp.asnumpy(grad[cp.asarray(at)]).astype(np.float64)
        x, t = logits[at], targets[at]
        ref = cross_entropy_grad_ref(x, t, ignore_index, "sum", smoothing, grad_scale=scale)
        p = softmax_ref(x)
        p[t == ignore_index] = 0.0           # ignored rows: exactly 0 (checked below)
        onehot = np.zeros_like(p)
        valid = (t >= 0) & (t < n)
        onehot[np.nonzero(valid)[0], t[valid]] = 1.0 - smoothing
        with np.errstate(invalid="ignore", over="ignore"):
            bound = (1e-5 * abs(scale) * (np.abs(p) + smoothing / n + onehot)
                     + rel * np.abs(ref) + atol + 1e-37)
            bad = ~((np.abs(got - ref) <= bound) | (np.isnan(ref) & np.isnan(got)))
        assert not bad.any(), (at[np.argwhere(bad)[:5, 0]], got[bad][:5], ref[bad][:5])
        assert (got[t == ignore_index] == 0).all()


# ---- loss and gradient, every dtype, reduction and size

@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", CLASSES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_and_gradient_match_reference(dtype, n, rows):
    """Each reduction, with and without smoothing, some rows ignored; the gradient into a new
    array and into a poisoned out (the largest problems' gradient checked for "mean" alone, on
    96 rows: the host reference is slow, and the other reductions differ only by the
    scale)."""
    for smoothing, ignored in ((0.0, 0.0), (0.1, 0.25)):
        logits, targets = make_inputs(rows, n, DT[dtype], ignored=ignored)
        ref = reference_losses(logits, targets, smoothing)
        x, t = cp.asarray(logits), cp.asarray(targets)
        for reduction in REDUCTIONS:
            loss = cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)
            check_loss(loss, logits, targets, reduction, ref=ref)
            out = poisoned((rows, n), DT[dtype])
            loss, grad = cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing,
                                       grad=True, out=out)
            assert grad is out
            check_loss(loss, logits, targets, reduction, ref=ref)
            if reduction == "mean" or rows * n <= 2**26:
                check_grad(grad, logits, targets, reduction, smoothing)
            if reduction == "none":
                new = cross_entropy(x, t, reduction="none", label_smoothing=smoothing,
                                    grad=True)[1]
                assert new.dtype == DT[dtype] and same_bits(cp.asnumpy(new), cp.asnumpy(out))
                del new
            del out, grad
        assert same_bits(cp.asnumpy(x), logits), "the logits changed"
        del x, t


@pytest.mark.parametrize("n", [31, 4097, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_ignored(dtype, n):
    logits, _ = make_inputs(5, n, DT[dtype])
    targets = np.full(5, -100, np.int64)
    x, t = cp.asarray(logits), cp.asarray(targets)
    loss, grad = cross_entropy(x, t, grad=True)
    assert np.isnan(float(loss))                      # PyTorch: the mean of nothing
    assert not cp.asnumpy(grad).astype(np.float64).any()
    assert float(cross_entropy(x, t, reduction="sum")) == 0.0
    assert not cp.asnumpy(cross_entropy(x, t, reduction="none")).any()
    loss, grad = cross_entropy(x, t, grad=True, label_smoothing=0.1)
    assert np.isnan(float(loss)) and not cp.asnumpy(grad).astype(np.float64).any()


@pytest.mark.parametrize("n", [1, 33, 4097, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_gradient(dtype, n):
    for reduction, smoothing in (("mean", 0.0), ("sum", 0.1), ("none", 0.1)):
        logits, targets = make_inputs(64, n, DT[dtype], ignored=0.1)
        x, t = cp.asarray(logits), cp.asarray(targets)
        loss, grad = cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing,
                                   grad=True, inplace=True, grad_scale=0.5)
        assert grad is x
        check_loss(loss, logits, targets, reduction, smoothing)
        check_grad(x, logits, targets, reduction, smoothing, grad_scale=0.5)
        y = cp.asarray(logits)
        loss2, grad2 = cross_entropy(y, t, reduction=reduction, label_smoothing=smoothing,
                                     grad=True, out=y, grad_scale=0.5)
        assert grad2 is y and same_bits(cp.asnumpy(y), cp.asnumpy(x))
        assert same_bits(cp.asnumpy(loss2), cp.asnumpy(loss))


@pytest.mark.parametrize("types", [("bfloat16", "float32"), ("float32", "bfloat16"),
                                   ("float16", "float32")], ids="->".join)
def test_gradient_of_another_type(types):
    src, dst = types
    logits, targets = make_inputs(40, 5000, DT[src], ignored=0.1)
    out = poisoned((40, 5000), DT[dst])
    loss, grad = cross_entropy(cp.asarray(logits), cp.asarray(targets), grad=True, out=out,
                               label_smoothing=0.1)
    assert grad is out and grad.dtype == DT[dst]
    check_loss(loss, logits, targets, "mean", 0.1)
    check_grad(grad, logits, targets, "mean", 0.1)


@pytest.mark.parametrize("n", [5, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, n):
    logits, targets = make_inputs(8, n, np.float32)
    targets[:] = np.arange(8) % n
    logits[0, targets[0]] = -np.inf          # the target at -inf: infinite loss
    logits[1, (targets[1] + 1) % n] = -np.inf   # another class at -inf: finite, p = 0 there
    logits[2, n // 2] = np.inf               # +inf: NaN row
    logits[3, n - 1] = np.nan                # NaN: NaN row
    logits[4, :] = -np.inf                   # all -inf: NaN
    logits[5, :] = 1e4 if dtype == "float16" else 1e30   # all equal and huge: log(n)
    logits[6, :] = 0.0                       # all equal: log(n)
    logits = logits.astype(DT[dtype])
    targets[7] = -100
    logits[7, 0] = np.nan                    # an ignored row is not read: loss 0, gradient 0
    x = cp.asarray(logits)
    losses = cross_entropy(x, cp.asarray(targets), reduction="none")
    check_loss(losses, logits, targets, "none")
    got = cp.asnumpy(losses)
    assert got[0] == np.inf and np.isnan(got[2:5]).all() and got[7] == 0.0
    np.testing.assert_allclose(got[5:7], np.log(n), rtol=1e-5)
    out = poisoned(logits.shape, DT[dtype])
    _, grad = cross_entropy(x, cp.asarray(targets), reduction="sum", grad=True, out=out)
    check_grad(grad, logits, targets, "sum")
    g = cp.asnumpy(grad).astype(np.float64)
    assert np.isnan(g[2:5]).all() and (g[7] == 0).all() and np.isfinite(g[1]).all()


# ---- targets

@pytest.mark.parametrize("inplace", [False, True])
def test_a_target_out_of_range_raises_before_anything_is_written(inplace):
    logits, targets = make_inputs(6, 1000, np.float32, ignored=0.2)
    targets[4] = 1000
    targets[5] = -3
    x, t = cp.asarray(logits), cp.asarray(targets)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"targets: row 4 holds 1000, outside \[0, 1000\) and not "
                             r"ignore_index \(-100\); nothing was written") as e:
        cross_entropy(x, t, grad=True, inplace=inplace)
    assert "\n" not in str(e.value)
    assert same_bits(cp.asnumpy(x), logits)
    only5 = targets.astype(np.int32)
    only5[4] = 0
    backwards = cp.asarray(only5[::-1].copy())[::-1]       # int32, a negative stride
    with pytest.raises(ge2jit.ArgumentValueError, match="targets: row 5 holds -3"):
        cross_entropy(x, backwards, reduction="none")
    losses = cross_entropy(x, t, reduction="none", check_targets=False)
    got = cp.asnumpy(losses)
    assert np.isnan(got[4:]).all()
    check_loss(losses, logits, targets, "none")
    loss, grad = cross_entropy(x, t, grad=True, check_targets=False)
    assert np.isnan(float(loss)) and np.isnan(cp.asnumpy(grad)[4:]).all()
    check_grad(grad, logits, targets, "mean")


@pytest.mark.parametrize("target_dtype", [np.int32, np.int64])
def test_target_types_strides_and_ignore_index(target_dtype):
    logits, targets = make_inputs(50, 3000, BF16, ignored=0.2, target_dtype=target_dtype)
    wide = np.zeros(150, target_dtype)
    wide[::3] = targets
    t = cp.asarray(wide)[::3]                            # a stride of three elements
    for ignore in (-100, 7):
        tt = targets.copy()
        if ignore == 7:
            tt[tt == -100] = 7
            wide[::3] = tt
            t = cp.asarray(wide)[::3]
        loss, grad = cross_entropy(cp.asarray(logits), t, grad=True, ignore_index=ignore)
        check_loss(loss, logits, tt, "mean", ignore_index=ignore)
        check_grad(grad, logits, tt, "mean", ignore_index=ignore)


@pytest.mark.parametrize("offsets", [(0, 0), (1, 3), (8, 8)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_wider_arrays(dtype, offsets):
    """Logits and gradient are column slices of wider arrays (aligned and not: narrower
    accesses); the rest of out's array is left alone."""
    ox, og = offsets
    rows, n = 20, 4097
    wide, targets = make_inputs(rows, n + 64, DT[dtype])
    targets %= n
    logits = wide[:, ox:ox + n]
    out_wide = poisoned((rows, n + 40), DT[dtype])
    out = out_wide[:, og:og + n]
    loss, grad = cross_entropy(cp.asarray(wide)[:, ox:ox + n], cp.asarray(targets), grad=True,
                               out=out, label_smoothing=0.1)
    check_loss(loss, logits, targets, "mean", 0.1)
    check_grad(grad, logits, targets, "mean", 0.1)
    rest = cp.asnumpy(out_wide).astype(np.float64)
    assert np.isnan(rest[:, :og]).all() and np.isnan(rest[:, og + n:]).all()
    t_logits = cp.asarray(np.ascontiguousarray(logits.T)).T      # a strided class axis: copied
    check_loss(cross_entropy(t_logits, cp.asarray(targets)), logits, targets, "mean")


# ---- configs, scale, determinism, empty, PyTorch

@pytest.mark.parametrize("name", [c.name for c in all_configs()])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pinned_config(name, dtype):
    for n in (1, 33, 3000, 70001):
        logits, targets = make_inputs(9, n, DT[dtype], ignored=0.2)
        x, t = cp.asarray(logits), cp.asarray(targets)
        for smoothing in (0.0, 0.1):
            loss, grad = cross_entropy(x, t, grad=True, config=name, label_smoothing=smoothing)
            check_loss(loss, logits, targets, "mean", smoothing)
            check_grad(grad, logits, targets, "mean", smoothing)


def test_grad_scale_and_heuristic_bits():
    logits, targets = make_inputs(30, 50000, np.float32, ignored=0.1)
    x, t = cp.asarray(logits), cp.asarray(targets)
    for scale in (2.0, -0.75, 0.0):
        loss, grad = cross_entropy(x, t, grad=True, grad_scale=scale, reduction="sum")
        check_grad(grad, logits, targets, "sum", grad_scale=scale)
    name = heuristic(50000).name
    a = cross_entropy(x, t, grad=True)
    b = cross_entropy(x, t, grad=True, config=name)
    assert same_bits(cp.asnumpy(a[1]), cp.asnumpy(b[1]))
    assert same_bits(cp.asnumpy(a[0]), cp.asnumpy(b[0]))


@pytest.mark.parametrize("n", [33, 32000, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_same_bits_on_every_run(dtype, n):
    logits, targets = make_inputs(1024, n, DT[dtype], ignored=0.1)
    x, t = cp.asarray(logits), cp.asarray(targets)
    first = [cp.asnumpy(a) for a in cross_entropy(x, t, grad=True, label_smoothing=0.1)]
    for _ in range(3):
        again = [cp.asnumpy(a) for a in cross_entropy(x, t, grad=True, label_smoothing=0.1)]
        assert all(same_bits(p, q) for p, q in zip(first, again))
    sums = {cp.asnumpy(cross_entropy(x, t, reduction="sum")).tobytes() for _ in range(5)}
    assert len(sums) == 1


def test_empty_rows():
    x, t = cp.empty((0, 100), np.float32), cp.empty(0, np.int64)
    assert np.isnan(float(cross_entropy(x, t)))
    assert float(cross_entropy(x, t, reduction="sum")) == 0.0
    assert cross_entropy(x, t, reduction="none").shape == (0,)
    loss, grad = cross_entropy(x, t, grad=True)
    assert grad.shape == (0, 100) and np.isnan(float(loss))


def test_scale_gradient():
    from ge2jit.ops.cross_entropy import scale_gradient

    for dtype in DTYPES:
        g = cp.asarray((_rng.standard_normal((7, 1001)) * 1e-3).astype(DT[dtype]))
        before = cp.asnumpy(g).astype(np.float64)
        assert scale_gradient(g, cp.asarray(np.float32(1.0))) is g
        assert same_bits(cp.asnumpy(g).astype(np.float64), before)
        scale_gradient(g, cp.asarray(np.float32(3.0)))
        rel = OUT_ROUNDING[dtype][0]
        np.testing.assert_allclose(cp.asnumpy(g).astype(np.float64), before * 3,
                                   rtol=rel + 1e-7, atol=OUT_ROUNDING[dtype][1])
        per_row = cp.asarray(np.array([1, 2, 0, 1, -1, 1, 0.5], np.float32))
        g2 = cp.asarray(before.astype(DT[dtype]))
        scale_gradient(g2, cp.broadcast_to(per_row[:1], (7,)))      # a zero stride: all 1
        assert same_bits(cp.asnumpy(g2).astype(np.float64), before)
        scale_gradient(g2, per_row)
        np.testing.assert_allclose(cp.asnumpy(g2).astype(np.float64),
                                   before * cp.asnumpy(per_row)[:, None].astype(np.float64),
                                   rtol=rel + 1e-7, atol=OUT_ROUNDING[dtype][1])


def test_pytorch_tensors():
    torch = pytest.importorskip("torch")
    logits = torch.randn(64, 5000, device="cuda", dtype=torch.bfloat16) * 3
    targets = torch.randint(0, 5000, (64,), device="cuda")
    targets[3] = -100
    loss, grad = cross_entropy(logits, targets, grad=True, label_smoothing=0.1)
    assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
    assert isinstance(grad, torch.Tensor) and grad.dtype == torch.bfloat16
    ref = torch.nn.functional.cross_entropy(logits.double(), targets, label_smoothing=0.1)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    x = logits.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(x, targets, label_smoothing=0.1).backward()
    torch.testing.assert_close(grad.double(), x.grad, rtol=8e-3, atol=1e-6)


# ---- past 2**31 logits (64-bit offsets); about 14 GB while the inputs are made: bigmem

@pytest.mark.bigmem
def test_rows_past_2_31_logits_in_place():
    rows, n = 8200, 262144                  # 2.15e9 bfloat16 logits: 4.3 GB
    free, _ = cp.cuda.runtime.memGetInfo()
    if free < rows * n * 6 * 1.1:
        pytest.skip("needs about 14 GB of free GPU memory")
    x = cp.random.default_rng(3).standard_normal((rows, n), dtype=cp.float32).astype(BF16)
    targets = cp.asarray(_rng.integers(0, n, rows))
    check = [0, 1, rows // 2, rows - 2, rows - 1]
    logits = cp.asnumpy(x[cp.asarray(check)])
    losses = cross_entropy(x, targets, reduction="none")
    loss, grad = cross_entropy(x, targets, grad=True, inplace=True)
    assert grad is x
    t = cp.asnumpy(targets)
    np.testing.assert_allclose(cp.asnumpy(losses)[check], row_losses(logits, t[check]),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss), float(cp.asnumpy(losses).astype(np.float64).mean()),
                               rtol=1e-5)
    ref = cross_entropy_grad_ref(logits, t[check], reduction="sum", grad_scale=1.0 / rows)
    got = cp.asnumpy(x[cp.asarray(check)]).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2**-8, atol=1e-12)
    assert cross_entropy_ref(logits, t[check], reduction="none").shape == (5,)
