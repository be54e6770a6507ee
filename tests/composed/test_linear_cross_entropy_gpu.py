"""linear_cross_entropy on the GPU against the float64 reference
(``reference.linear_cross_entropy_ref``) from the inputs' own values.

Every reduction, ignored rows, label smoothing, one chunk and several (the last one short),
sizes that are no multiple of a vector width, rows of wider arrays and transposed weights,
int32 targets, grad_scale, a 256k vocabulary, every row ignored, the per-row backward, PyTorch
tensors, and the errors. Inputs are fresh random values.

Tolerances: float32 (exact GEMMs) 1e-5 of the loss's scale and 1e-4 (Frobenius, relative) for the
gradients. 16-bit: the logits are rounded once to the inputs' type (as ``F.linear`` gives
them) and so is their gradient before its two GEMMs (as PyTorch's backward): a loss within
4 roundings of the largest logit, gradients within 2**-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.composed.linear_cross_entropy import linear_cross_entropy_rows
from ge2jit.composed.reference import linear_cross_entropy_ref

from ..gpu_arrays import DT, cp

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

_rng = np.random.default_rng(2026)
EPS = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def _inputs(rows, d, classes, dtype, ignored=0.2, target_dtype=np.int64):
    x = (_rng.standard_normal((rows, d)) / np.sqrt(d) * 4).astype(np.float32).astype(DT[dtype])
    w = _rng.standard_normal((classes, d)).astype(np.float32).astype(DT[dtype])
    t = _rng.integers(0, classes, rows).astype(target_dtype)
    t[_rng.random(rows) < ignored] = -100
    return x, w, t


def _rel(got, want) -> float:
    got, want = cp.asnumpy(got).astype(np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def _check(dtype, x, w, t, got, want, logit_max):
    loss, dx, dw = got
    rloss, rdx, rdw = want
    loss = cp.asnumpy(loss).astype(np.float64)
    nan = np.isnan(rloss)            # a mean over no rows (every row ignored): NaN, as PyTorch
    assert np.array_equal(np.isnan(loss), nan), (loss, rloss)
    loss, rloss = np.where(nan, 0.0, loss), np.where(nan, 0.0, rloss)
    if dtype == "float32":
        assert np.allclose(loss, rloss, rtol=1e-5, atol=1e-5), (loss, rloss)
        gtol = 1e-4
    else:
        bound = 4 * EPS[dtype] * logit_max + 1e-5
        assert np.all(np.abs(loss - rloss) <= bound * np.maximum(1, np.abs(rloss))), \
            (loss, rloss, bound)
        gtol = 2.0**-6
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert dw.dtype == w.dtype and dw.shape == w.shape
    assert _rel(dx, rdx) < gtol
    assert _rel(dw, rdw) < gtol


CASES = [  # rows, d, classes, dtype, chunk_rows
    (300, 96, 1000, "float32", None),
    (300, 96, 1000, "float32", 128),          # three chunks, the last of 44 rows
    (257, 64, 4097, "bfloat16", None),
    (257, 64, 4097, "bfloat16", 128),
    (200, 72, 1001, "float16", 64),
    (1, 32, 33, "bfloat16", None),
]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("rows,d,classes,dtype,chunk", CASES,
                         ids=[f"{r}x{d}x{c}-{t}-{k}" for r, d, c, t, k in CASES])
def test_against_float64(rows, d, classes, dtype, chunk, reduction):
    x, w, t = _inputs(rows, d, classes, dtype)
    smoothing = 0.1 if reduction == "sum" else 0.0
    want = linear_cross_entropy_ref(x, w, t, reduction=reduction, label_smoothing=smoothing,
                                    grad_scale=0.5)
    got = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t),
                                      reduction=reduction, label_smoothing=smoothing, grad=True,
                                      grad_scale=0.5, chunk_rows=chunk,
                                      precision="ieee" if dtype == "float32" else None)
    logit_max = float(np.abs(x.astype(np.float64) @ w.astype(np.float64).T).max())
    _check(dtype, x, w, t, got, want, logit_max)
    loss_only = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t),
                                            reduction=reduction, label_smoothing=smoothing,
                                            chunk_rows=chunk,
                                            precision="ieee" if dtype == "float32" else None)
    assert np.array_equal(cp.asnumpy(loss_only), cp.asnumpy(got[0]), equal_nan=True)  # same bits


def test_per_row_losses_and_their_backward():
    x, w, t = _inputs(300, 64, 2000, "bfloat16")
    losses = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t),
                                         reduction="none", chunk_rows=128)
    want, _, _ = linear_cross_entropy_ref(x, w, t, reduction="none")
    logit_max = float(np.abs(x.astype(np.float64) @ w.astype(np.float64).T).max())
    assert losses.shape == (300,) and losses.dtype == np.float32
    assert np.all(np.abs(cp.asnumpy(losses) - want) <= 4 * EPS["bfloat16"] * logit_max + 1e-5)
    assert np.all(cp.asnumpy(losses)[t == -100] == 0)
    scale = _rng.standard_normal(300).astype(np.float32)
    dx, dw = linear_cross_entropy_rows(cp.asarray(x), cp.asarray(w), cp.asarray(t),
                                       cp.asarray(scale), chunk_rows=128)
    _, rdx, rdw = linear_cross_entropy_ref(x, w, t, reduction="none", row_scale=scale)
    assert _rel(dx, rdx) < 2.0**-6 and _rel(dw, rdw) < 2.0**-6


def test_strided_inputs_and_int32_targets():
    x, w, t = _inputs(130, 40, 515, "bfloat16", target_dtype=np.int32)
    wide = cp.asarray(np.concatenate([x, x[:, :9]], axis=1))[:, :40]        # rows of a wider array
    wt = cp.asarray(np.ascontiguousarray(w.T)).T                            # a transposed view
    tt = cp.asarray(np.stack([t, t], axis=1))[:, 0]                         # a strided vector
    got = ge2jit.linear_cross_entropy(wide, wt, tt, grad=True, chunk_rows=64)
    logit_max = float(np.abs(x.astype(np.float64) @ w.astype(np.float64).T).max())
    _check("bfloat16", x, w, t, got, linear_cross_entropy_ref(x, w, t), logit_max)


def test_a_256k_vocabulary_in_chunks():
    x, w, t = _inputs(96, 64, 256000, "bfloat16")
    got = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t), grad=True,
                                      chunk_rows=32)
    logit_max = float(np.abs(x.astype(np.float64) @ w.astype(np.float64).T).max())
    _check("bfloat16", x, w, t, got, linear_cross_entropy_ref(x, w, t), logit_max)


def test_every_row_ignored():
    x, w, t = _inputs(50, 32, 100, "float32", ignored=1.0)
    loss, dx, dw = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t),
                                               grad=True, chunk_rows=16)
    assert np.isnan(float(loss))                        # the mean of nothing, as PyTorch
    assert float(cp.abs(dx).max()) == 0 and float(cp.abs(dw).max()) == 0
    s = ge2jit.linear_cross_entropy(cp.asarray(x), cp.asarray(w), cp.asarray(t), reduction="sum")
    assert float(s) == 0




def test_errors_are_one_line_before_any_launch():
    x, w, t = (cp.asarray(a) for a in _inputs(8, 16, 40, "float32"))
    refused = pytest.raises(ge2jit.ArgumentValueError)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"weight: expected shape \(V, 16\)"):
        ge2jit.linear_cross_entropy(x, w[:, :8], t)
    with pytest.raises(ge2jit.ArgumentValueError, match="weight: expected x's dtype float32"):
        ge2jit.linear_cross_entropy(x, w.astype(cp.float16), t)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"targets: expected shape \(8,\)"):
        ge2jit.linear_cross_entropy(x, w, t[:4])
    with pytest.raises(ge2jit.ArgumentValueError, match="x: expected a 2-D array"):
        ge2jit.linear_cross_entropy(x[None], w, t)
    with pytest.raises(ge2jit.ArgumentValueError, match="targets: expected dtype int32 or int64"):
        ge2jit.linear_cross_entropy(x, w, t.astype(cp.float32))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"label_smoothing: expected a number"):
        ge2jit.linear_cross_entropy(x, w, t, label_smoothing=1.5)
    with pytest.raises(ge2jit.ArgumentValueError, match="reduction: expected one of"):
        ge2jit.linear_cross_entropy(x, w, t, reduction="avg")
    with pytest.raises(ge2jit.ArgumentValueError, match="chunk_rows: expected a positive"):
        ge2jit.linear_cross_entropy(x, w, t, chunk_rows=0)
    with pytest.raises(ge2jit.ArgumentValueError, match="grad_scale: applies to the gradient"):
        ge2jit.linear_cross_entropy(x, w, t, grad_scale=2.0)
    bad = t.copy()
    bad[3] = 40
    with refused:
        ge2jit.linear_cross_entropy(x, w, bad, grad=True)


def test_pytorch_tensors_give_tensors():
    torch = pytest.importorskip("torch")
    x, w, t = _inputs(200, 64, 700, "bfloat16")
    xt = torch.from_dlpack(cp.asarray(x.view(np.uint16))).view(torch.bfloat16)
    wt = torch.from_dlpack(cp.asarray(w.view(np.uint16))).view(torch.bfloat16)
    tt = torch.from_dlpack(cp.asarray(t))
    loss, dx, dw = ge2jit.linear_cross_entropy(xt, wt, tt, grad=True, chunk_rows=64)
    assert all(isinstance(a, torch.Tensor) for a in (loss, dx, dw))
    got = (cp.from_dlpack(loss.detach()), cp.from_dlpack(dx.view(torch.int16)).view(DT["bfloat16"]),
           cp.from_dlpack(dw.view(torch.int16)).view(DT["bfloat16"]))
    logit_max = float(np.abs(x.astype(np.float64) @ w.astype(np.float64).T).max())
    _check("bfloat16", x, w, t, got, linear_cross_entropy_ref(x, w, t), logit_max)
