"""``ge2jit.attention``, the op, on the GPU: CuPy arrays and PyTorch tensors, both layouts, every
option, outputs allocated or given, the log-sum-exp, packed sequences, the compiled launch path
on fresh inputs, zero sizes, the tools (explain, tune) and the refusals that need a GPU. The
kernel's own cases (every tiling, masks at block edges, large logits) are in
``test_attention_kernel_gpu.py``; the tolerances are those of ``helpers.check``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.attention.spec import CONFIGS, candidates_for, make_spec
from ge2jit.runtime.dtypes import SUPPORTED_DTYPES

from ...gpu_arrays import cp, poisoned, same_bits
from .helpers import check, inputs, rng_for

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]


def _inputs(dtype, b, s_q, s_k, h, h_kv, d, seqlens=None, seed=()):
    """Fresh host q, k, v and cu_seqlens (``helpers.inputs``), seeded by the arguments."""
    return inputs(rng_for("op", dtype, b, s_q, s_k, h, h_kv, d, seqlens, *seed), dtype, b,
                  s_q, s_k, h, h_kv, d, seqlens)


def _spec(dtype, d, **kw):
    """The spec the op runs (the check's diagnostics read its block_m)."""
    return make_spec(SUPPORTED_DTYPES[dtype], d, **kw)


def _device(x, bhsd: bool):
    """A host (B, S, H, D) array on the GPU, stored (B, H, S, D) when ``bhsd``."""
    return cp.asarray(np.ascontiguousarray(x.transpose(0, 2, 1, 3) if bhsd else x))


def _run(dtype="bfloat16", *, b=2, s_q=77, s_k=77, h=4, h_kv=None, d=64, bhsd=False,
         given=False, seqlens=None, seed=(), **options):
    h_kv = h if h_kv is None else h_kv
    q, k, v, cu_q, cu_k = _inputs(dtype, b, s_q, s_k, h, h_kv, d, seqlens, seed)
    lse_wanted = options.pop("return_lse", False)
    kw = dict(options)
    if seqlens is not None:
        kw.update(cu_seqlens_q=cp.asarray(cu_q), cu_seqlens_k=cp.asarray(cu_k),
                  max_seqlen_q=max(seqlens[0]), max_seqlen_k=max(seqlens[1]))
        dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    else:
        dq, dk, dv = (_device(x, bhsd) for x in (q, k, v))
        if bhsd:
            kw["layout"] = "bhsd"
    out = poisoned(dq.shape, dq.dtype) if given else None
    got = ge2jit.attention(dq, dk, dv, return_lse=lse_wanted, out=out, **kw)
    o, lse = got if lse_wanted else (got, None)
    if given:
        assert o is out
    assert o.shape == dq.shape and o.dtype == dq.dtype and o.flags.c_contiguous
    o_host = cp.asnumpy(o).astype(np.float64)
    if bhsd:
        o_host = o_host.transpose(0, 2, 1, 3)
    lse_host = None
    if lse_wanted:
        assert lse.dtype == np.float32 and lse.flags.c_contiguous
        lse_host = cp.asnumpy(lse).astype(np.float64)
    spec = _spec(dtype, d, causal=options.get("causal", False),
                 window=options.get("window") is not None,
                 softcap=bool(options.get("softcap")), varlen=seqlens is not None,
                 write_lse=lse_wanted)
    check(dtype, q, k, v, o_host, lse_host, spec, causal=options.get("causal", False),
          window=options.get("window"), softcap=options.get("softcap"),
          scale=options.get("scale"), cu_q=cu_q, cu_k=cu_k)
    return o, lse


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", sorted(CONFIGS))
@pytest.mark.parametrize("bhsd", [False, True], ids=["bshd", "bhsd"])
def test_both_layouts_every_head_dim(dtype, d, bhsd):
    _run(dtype, d=d, bhsd=bhsd, s_q=70, s_k=133)


@pytest.mark.parametrize("options", [
    dict(causal=True), dict(causal=True, s_q=40, s_k=150), dict(causal=True, s_q=150, s_k=40),
    dict(window=(16, 8)), dict(causal=True, window=(32, -1)), dict(softcap=20.0),
    dict(scale=0.3), dict(h=8, h_kv=2), dict(h=8, h_kv=1, causal=True),
    dict(return_lse=True), dict(return_lse=True, causal=True, softcap=5.0),
    dict(given=True), dict(given=True, bhsd=True, return_lse=True),
], ids=str)
def test_options(options):
    _run("bfloat16", **options)


@pytest.mark.parametrize("lse", [False, True])
def test_packed_sequences(lse):
    seqlens = ([5, 0, 130, 64], [70, 3, 130, 0])
    _run("float16", h=4, h_kv=2, seqlens=seqlens, causal=True, return_lse=lse)
    _run("bfloat16", h=4, seqlens=seqlens, window=(10, 10), return_lse=lse)


@pytest.mark.parametrize("given", [False, True])
def test_repeated_calls_take_fresh_inputs_on_the_compiled_path(given):
    from ge2jit.jit.fastlaunch import available
    from ge2jit.ops.attention.op import _COMPILED

    before = _COMPILED.stats()["hits"]
    for i in range(3):
        _run("bfloat16", s_q=33, s_k=65, given=given, return_lse=True, causal=True, seed=(i,))
        _run("float16", s_q=33, s_k=65, bhsd=True, given=given, seed=(i,))
    if available():
        assert _COMPILED.stats()["hits"] - before >= 4


def test_a_flag_given_as_1_is_refused_after_true_ran():
    """The compiled path keys an option by its type and value: causal=1 finds no program
    stored for causal=True, and the Python path refuses it (as it does on a first call)."""
    q, k, v, _, _ = (None if x is None else cp.asarray(x)
                     for x in _inputs("bfloat16", 1, 17, 17, 2, 2, 64))
    for _ in range(2):   # checked and stored, then the program
        ge2jit.attention(q, k, v, causal=True)
    with pytest.raises(ge2jit.ArgumentTypeError, match="causal: expected True or False, got 1"):
        ge2jit.attention(q, k, v, causal=1)


def test_the_compiled_path_gives_the_python_paths_bits():
    q, k, v, _, _ = (None if x is None else cp.asarray(x)
                     for x in _inputs("bfloat16", 2, 65, 90, 4, 2, 128))
    first = ge2jit.attention(q, k, v, causal=True, return_lse=True)   # checked, stored
    again = ge2jit.attention(q, k, v, causal=True, return_lse=True)   # the stored launch
    assert same_bits(first[0], again[0]) and same_bits(first[1], again[1])


def test_zero_sizes_and_no_keys():
    q, k, v, _, _ = (None if x is None else cp.asarray(x)
                     for x in _inputs("bfloat16", 2, 0, 9, 4, 4, 64))
    assert ge2jit.attention(q, k, v).shape == (2, 0, 4, 64)
    q, k, v, _, _ = (None if x is None else cp.asarray(x)
                     for x in _inputs("bfloat16", 2, 9, 0, 4, 4, 64))
    for _ in range(2):   # the Python path, then the compiled one
        o, lse = ge2jit.attention(q, k, v, return_lse=True)
        assert (cp.asnumpy(o).astype(np.float32) == 0).all()
        assert np.isneginf(cp.asnumpy(lse)).all()


def test_refusals_need_no_launch():
    q, k, v = (cp.asarray(x) for x in _inputs("bfloat16", 1, 16, 16, 2, 2, 64)[:3])
    with pytest.raises(ge2jit.ArgumentValueError, match="out: .*attention does not write in "
                                                        "place"):
        ge2jit.attention(q, k, v, out=q)
    with pytest.raises(ge2jit.ArgumentValueError, match="^q: expected head_dim"):
        ge2jit.attention(q[..., :48], k[..., :48], v[..., :48])
    with pytest.raises(ge2jit.ArgumentValueError, match="^q: expected a 16-byte aligned"):
        flat = cp.empty(q.size + 1, q.dtype)
        ge2jit.attention(flat[1:].reshape(q.shape), k, v)
    # a given output on the compiled path is checked for overlap at every call
    out = cp.empty_like(q)
    ge2jit.attention(q, k, v, out=out)
    ge2jit.attention(q, k, v, out=out)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps"):
        ge2jit.attention(q, k, v, out=v)


def test_torch_tensors_on_the_current_stream_and_explain():
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 100, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 2, 130, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(2, 2, 130, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            o, lse = ge2jit.attention(q, k, v, causal=True, layout="bhsd", return_lse=True)
    stream.synchronize()
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and o.dtype == q.dtype
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
        attn_mask=torch.ones(100, 130, dtype=torch.bool, device="cuda").tril(30))
    assert (o.double() - ref).abs().max().item() < 2e-2
    assert lse.shape == (2, 4, 100) and lse.dtype == torch.float32
    e = ge2jit.explain(ge2jit.attention, q, k, v, causal=True, layout="bhsd")
    family = "sm90" if torch.cuda.get_device_capability() == (9, 0) else "sm80"
    assert e.kernel_names[0].startswith(f"attn_fwd_{family}_bf16_d128")
    assert e.reason == "default"
    assert e.spill_bytes == (0,) and e.flops == 4.0 * 2 * 4 * 100 * 130 * 128 / 2


def test_tune_stores_a_config_that_later_calls_take(tmp_path, monkeypatch):
    from ge2jit.tune import db

    monkeypatch.setattr(db, "_default", db.TuningDB(tmp_path / "tuning"))
    q, k, v, _, _ = (None if x is None else cp.asarray(x)
                     for x in _inputs("float16", 1, 256, 256, 8, 8, 128))
    from ge2jit.ops.attention.op import _PREPARED

    ge2jit.attention(q, k, v, causal=True)
    result = ge2jit.tune(ge2jit.attention, q, k, v, causal=True, reps=3)
    assert len(_PREPARED) == 0   # the stored launches forgotten: the next call chooses again
    arch = 90 if cp.cuda.Device().compute_capability == "90" else 80
    assert result.best.name in {c.name for c in candidates_for(128, arch)}
    assert len(result.records) == len(candidates_for(128, arch))
    e = ge2jit.explain(ge2jit.attention, q, k, v, causal=True)
    assert (e.config, e.reason) == (result.best.name, "tuned")
    pinned = ge2jit.explain(ge2jit.attention, q, k, v, causal=True, config=CONFIGS[128][2])
    assert (pinned.config, pinned.reason) == (CONFIGS[128][2].name, "pinned")
    assert math.isfinite(e.flops)


@pytest.mark.parametrize("d", sorted(CONFIGS))
def test_every_candidate_config_of_this_gpu(d):
    """On sm_90 the Hopper kernel's configs and the sm_80 kernel's pinned; elsewhere the
    sm_80 kernel's."""
    arch = 90 if cp.cuda.Device().compute_capability == "90" else 80
    for config in candidates_for(d, arch):
        _run("bfloat16", d=d, s_q=150, s_k=260, h=4, h_kv=2, causal=True, return_lse=True,
             config=config)
        _run("float16", d=d, s_q=70, s_k=70, window=(20, 5), softcap=10.0, bhsd=True,
             config=config.name)
