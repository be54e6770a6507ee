"""linear_cross_entropy without a GPU: the default chunks (the logits' budget against the
float32 accumulator several chunks need), and the PyTorch op on meta tensors (its fake: shapes
and types of the loss and of both gradients, for every reduction)."""

from __future__ import annotations

import pytest

from ge2jit.composed.linear_cross_entropy import CHUNK_BYTES, chunk_rows_for


def test_default_chunks():
    assert chunk_rows_for(4096, 32000, 2, 4096) == 4096           # 250 MiB of logits: one
    assert chunk_rows_for(16384, 128256, 2, 1024) == 2048         # chunks of 512 MiB
    assert chunk_rows_for(4096, 128256, 2, 2048) == 4096          # 1 GiB, the accumulator's
    assert chunk_rows_for(16384, 262144, 4, 64) == 512
    assert chunk_rows_for(10, 10**9, 2) == 128                    # at least 128 rows
    assert chunk_rows_for(0, 100, 2) == 1
    rows = chunk_rows_for(100000, 50257, 2, 768)
    assert rows % 128 == 0 and rows * 50257 * 2 <= CHUNK_BYTES


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_pytorch_op_on_meta_tensors(reduction):
    torch = pytest.importorskip("torch")
    import ge2jit.torch as gt

    x = torch.empty(3, 5, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(50, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    t = torch.empty(3, 5, device="meta", dtype=torch.int64)
    loss = gt.linear_cross_entropy(x, w, t, reduction=reduction)
    assert loss.dtype == torch.float32
    assert loss.shape == ((15,) if reduction == "none" else ())
    loss.backward(torch.empty_like(loss))
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
    assert w.grad.shape == w.shape and w.grad.dtype == w.dtype
    with pytest.raises(ValueError, match=r"targets: expected shape \(3, 5\)"):
        gt.linear_cross_entropy(x, w, t[:, :4])
