"""ge2jit's attention error against PyTorch's own backends' on the same inputs: the output and
the three gradients of ``ge2jit.torch.scaled_dot_product_attention`` against a float64
reference, their error (root mean square, and largest) no more than 1.5x that of the better of
PyTorch's flash, cuDNN and memory-efficient backends (each where it takes the inputs) on long
sequences, grouped-query heads and large logits (the largest error: or at most one ulp of the
type at the tensor's largest value, the rounding of the result itself, where the better
backend's stayed under it by luck of which of millions of elements fell near a rounding
boundary); and rows that see no key: an output and
gradients of exactly 0, never NaN."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import ge2jit.torch as gt  # noqa: E402 - after the skips above

F = torch.nn.functional

#: (b, h, h_kv, s, d, causal, sigma): q and k drawn with standard deviation sigma (4: logits
#: of standard deviation 16, a softmax close to one-hot)
CASES = [
    (1, 2, 2, 8192, 128, True, 1.0),     # long
    (1, 4, 2, 4096, 128, False, 1.0),    # long, grouped-query
    (2, 4, 4, 1024, 64, True, 1.0),
    (2, 4, 4, 1024, 128, False, 4.0),    # large logits
    (2, 4, 1, 1024, 64, True, 4.0),      # large logits, one kv head
    (1, 2, 2, 2048, 256, True, 1.0),
]
#: how much larger ge2jit's error may be than the better PyTorch backend's
RATIO = 1.5


def _inputs(b, h, h_kv, s, d, sigma, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, s, d, device="cuda", generator=g) * sigma
    k = torch.randn(b, h_kv, s, d, device="cuda", generator=g) * sigma
    v = torch.randn(b, h_kv, s, d, device="cuda", generator=g)
    do = torch.randn(b, h, s, d, device="cuda", generator=g)
    return [x.to(dtype) for x in (q, k, v, do)]


def _run(fn, q, k, v, do):
    """[o, dq, dk, dv] of ``fn`` on leaf copies of q, k and v."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return [out.detach()] + [x.grad for x in leaves]


def _reference(q, k, v, do, causal):
    group = q.shape[1] // k.shape[1]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                              v.repeat_interleave(group, 1), is_causal=causal)

    return _run(sdpa, *(x.double() for x in (q, k, v, do)))


def _ulp(x: float, dtype) -> float:
    """The spacing of ``dtype``'s values at ``x`` (> 0)."""
    return torch.finfo(dtype).eps * 2.0 ** (math.frexp(x)[1] - 1)


def _errors(got, want) -> tuple[float, float]:
    diff = got.double() - want
    return diff.pow(2).mean().sqrt().item(), diff.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) +
                         ("-causal" if c[5] else "") + f"-sigma{c[6]:g}")
def test_no_larger_error_than_the_better_pytorch_backend(case, dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, h_kv, s, d, causal, sigma = case
    q, k, v, do = _inputs(b, h, h_kv, s, d, sigma, dtype, seed=s + d)
    gqa = h != h_kv
    want = _reference(q, k, v, do, causal)
    ours = _run(lambda q, k, v: gt.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=gqa), q, k, v, do)
    errors = {"ge2jit": [_errors(x, w) for x, w in zip(ours, want)]}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                      enable_gqa=gqa)
        try:
            theirs = _run(sdpa, q, k, v, do)
            torch.cuda.synchronize()
        except RuntimeError:   # the backend does not take these inputs
            continue
        errors[name] = [_errors(x, w) for x, w in zip(theirs, want)]
    assert len(errors) > 1, "no PyTorch backend took these inputs"
    for i, what in enumerate(("o", "dq", "dk", "dv")):
        for j, kind in enumerate(("rms", "max")):
            best = min(e[i][j] for n, e in errors.items() if n != "ge2jit")
            got = errors["ge2jit"][i][j]
            bound = RATIO * best
            if kind == "max":   # one ulp at the tensor's largest value: the result's rounding
                bound = max(bound, _ulp(want[i].abs().max().item(), dtype))
            assert got <= bound, (what, kind, {n: e[i][j] for n, e in errors.items()})


@pytest.mark.parametrize("d", [64, 128])
def test_rows_that_see_no_key_give_zeros_and_no_nan(d):
    """Bottom-right causal with more queries than keys (FlashAttention's alignment): the first
    S_q - S_k rows see no key, with or without a window (also aligned bottom-right)."""
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16, generator=g) * 4
    k, v = (torch.randn(2, 100, 2, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    for kw in ({"causal": True}, {"window": (0, 0)}):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = gt.attention(*leaves, **kw)
        out.backward(torch.randn_like(out))
        grads = [x.grad for x in leaves]
        for x in (out, *grads):
            assert not x.isnan().any() and not x.isinf().any(), kw
        # bottom-right: query i sees key i - 200 at most (the window: exactly that one)
        assert (out[:, :200] == 0).all() and (grads[0][:, :200] == 0).all(), kw
        assert (out[:, 200:] != 0).any(dim=-1).all(), kw
