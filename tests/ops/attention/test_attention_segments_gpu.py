"""Several sequences a row of a dense batch (``seq_bounds``) on the GPU: the output, lse and
gradients of each kept token are those of the same tokens packed as variable-length sequences
(cu_seqlens), checked against the float64 reference within the bounds of
test_attention_kernel_gpu.py and test_attention_backward_gpu.py; a token of no sequence
(bounds (t, t), padding) gets output 0, lse -inf and no gradient, and no other token sees it.
Random partitions (sequences of 1 to 300 tokens, crossing the kernels' blocks), both layouts,
GQA, causal and not, windows and soft-capping, every kernel family (the Hopper forward and
backward, its one-kernel backward's narrow step, the deterministic backward, the sm_80 kernels
pinned), the compiled path. Run with ``-x``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.attention.spec import CONFIGS

from ...gpu_arrays import cp
from .helpers import check, check_grads, randn, rng_for

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

#: the lengths a random partition draws its sequences' from
LENGTHS = (1, 2, 7, 40, 64, 129, 300)
_SPEC = SimpleNamespace(config=SimpleNamespace(block_m=128))   # (for the messages only)


def random_bounds(rng, b: int, s: int, padding: bool = False) -> np.ndarray:
    """(B, S, 2) int32 bounds of random sequences along each row; with ``padding`` about one
    token in ten is in no sequence ((t, t))."""
    bounds = np.zeros((b, s, 2), np.int32)
    for r in range(b):
        t = 0
        while t < s:
            if padding and rng.random() < 0.1:
                bounds[r, t] = (t, t)
                t += 1
                continue
            n = int(min(s - t, rng.choice(LENGTHS)))
            bounds[r, t:t + n] = (t, t + n)
            t += n
    return bounds


def packed_view(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the kept tokens' indices into the B * S tokens, the cu_seqlens of their sequences)."""
    b, s, _ = bounds.shape
    kept, cu = [], [0]
    for r in range(b):
        t = 0
        while t < s:
            lo, hi = (int(x) for x in bounds[r, t])
            if hi <= lo:
                t += 1
                continue
            kept.extend(range(r * s + lo, r * s + hi))
            cu.append(cu[-1] + hi - lo)
            t = hi
    return np.asarray(kept, np.int64), np.asarray(cu, np.int32)


def _run(dtype="bfloat16", *, b=2, s=700, h=4, h_kv=2, d=64, causal=True, window=None,
         softcap=None, bhsd=False, padding=False, config=None, bwd_config=None,
         deterministic=False, backward=True, seed=()):
    rng = rng_for("segments", dtype, b, s, h, h_kv, d, causal, window, softcap, bhsd, padding,
                  str(config), bwd_config, deterministic, *seed)
    bounds = random_bounds(rng, b, s, padding)
    q, k, v, do = (randn(rng, (b, s, n, d), dtype) for n in (h, h_kv, h_kv, h))
    kw = dict(causal=causal, window=window, softcap=softcap)

    def dev(x):
        return cp.asarray(np.ascontiguousarray(x.transpose(0, 2, 1, 3) if bhsd else x))

    def host(x):   # a result as (B, S, heads, D)
        x = cp.asnumpy(x).astype(np.float64)
        return x.transpose(0, 2, 1, 3) if bhsd else x

    layout = {"layout": "bhsd"} if bhsd else {}
    args = [dev(x) for x in (q, k, v)]
    o, lse = ge2jit.attention(*args, seq_bounds=cp.asarray(bounds), return_lse=True,
                              config=config, **kw, **layout)
    o_h, lse_h = host(o), cp.asnumpy(lse)
    kept, cu = packed_view(bounds)
    flat = [x.reshape(b * s, *x.shape[2:])[kept] for x in (q, k, v, do)]
    o_k = o_h.reshape(b * s, h, d)[kept]
    lse_k = lse_h.transpose(1, 0, 2).reshape(h, b * s)[:, kept]
    check(dtype, *flat[:3], o_k, lse_k, _SPEC, cu_q=cu, cu_k=cu, **kw)
    dropped = np.setdiff1d(np.arange(b * s), kept)
    assert padding or dropped.size == 0
    if dropped.size:   # padding: output 0, lse -inf
        assert not o_h.reshape(b * s, h, d)[dropped].any()
        assert np.isneginf(lse_h.transpose(1, 0, 2).reshape(h, b * s)[:, dropped]).all()
    if not backward:
        return
    grads = ge2jit.attention_backward(dev(do), *args, o, lse, seq_bounds=cp.asarray(bounds),
                                      deterministic=deterministic, config=bwd_config, **kw,
                                      **layout)
    grads = [x.reshape(b * s, *x.shape[2:]) for x in map(host, grads)]
    check_grads(dtype, *flat[:3], flat[3], o_k, lse_k, [g[kept] for g in grads], cu_q=cu,
                cu_k=cu, **kw)
    for g in grads:   # no token's gradient reaches one of no sequence
        assert not g[dropped].any()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("bwd_config", [None, "sm90n", "sm80"])
def test_causal_sequences_a_row_forward_and_backward(d, bwd_config):
    if bwd_config == "sm90n" and cp.cuda.Device().compute_capability != "90":
        pytest.skip("the Hopper backward")
    _run(d=d, bwd_config=bwd_config)
    _run("float16", d=d, h_kv=1, bhsd=True, bwd_config=bwd_config, seed=(1,))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_windows_softcap_padding_and_deterministic(d):
    _run(d=d, window=(33, 0), softcap=20.0, padding=True)
    _run("float16", d=d, causal=False, padding=True, deterministic=True, s=333)
    _run(d=d, causal=False, window=(17, 5), h_kv=4, deterministic=True, s=300)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_sm80_forward_pinned(d):
    _run(d=d, config=CONFIGS[d][0], bwd_config="sm80", padding=True)
    _run(d=d, config=CONFIGS[d][-1], causal=False, softcap=30.0, backward=False, s=257)


def test_a_batch_of_one_sequence_a_row_is_the_causal_batch():
    """Bounds (0, S) everywhere: the same output as plain causal attention, bit for bit
    (the same blocks and order of keys)."""
    rng = rng_for("segments-whole")
    q, k, v = (cp.asarray(randn(rng, (3, 500, 4, 64), "bfloat16")) for _ in range(3))
    bounds = cp.zeros((3, 500, 2), cp.int32)
    bounds[..., 1] = 500
    o_seg = ge2jit.attention(q, k, v, causal=True, seq_bounds=bounds)
    o = ge2jit.attention(q, k, v, causal=True)
    assert cp.array_equal(o_seg, o)


def test_the_compiled_path_reads_new_bounds():
    """The stored launch (the compiled path) with other bounds at the same address and at
    another: each call reads its own."""
    for i in range(3):
        _run(s=300, seed=(i,), backward=i == 2)
    rng = rng_for("segments-new")
    q, k, v = (cp.asarray(randn(rng, (2, 300, 4, 64), "bfloat16")) for _ in range(3))
    first = cp.asarray(random_bounds(rng, 2, 300))
    second = cp.asarray(random_bounds(rng, 2, 300))
    a = ge2jit.attention(q, k, v, causal=True, seq_bounds=first)
    b = ge2jit.attention(q, k, v, causal=True, seq_bounds=second)
    first[...] = second
    c = ge2jit.attention(q, k, v, causal=True, seq_bounds=first)
    assert not cp.array_equal(a, b) and cp.array_equal(b, c)


def test_torch_tensors_and_sequence_bounds():
    torch = pytest.importorskip("torch")
    import ge2jit.torch as gt

    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 2] * 30, [5] * 150 + [6] * 150],
                       device="cuda")
    bounds = gt.sequence_bounds(ids)
    assert bounds.dtype == torch.int32 and bounds.shape == (2, 300, 2)
    want = np.asarray(
        [[(t - t % 10 + {0: 0, 1: 0, 2: 0, 3: 3, 4: 3}.get(t % 10, 5),
           t - t % 10 + {0: 3, 1: 3, 2: 3, 3: 5, 4: 5}.get(t % 10, 10)) for t in range(300)],
         [(0, 150)] * 150 + [(150, 300)] * 150])
    assert (bounds.cpu().numpy() == want).all()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g,
                           requires_grad=True) for _ in range(3))
    o = gt.attention(q, k, v, causal=True, seq_bounds=bounds)
    o.backward(torch.ones_like(o))
    for row, cut in ((0, 3), (1, 150)):   # the first sequence of each row alone
        qs, ks, vs = (x.detach()[row:row + 1, :cut] for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2).double() for x in (qs, ks, vs)), is_causal=True)
        assert (o[row:row + 1, :cut].double() - ref.transpose(1, 2)).abs().max() < 2e-2
