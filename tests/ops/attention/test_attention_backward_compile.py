"""The attention backward's three kernels (sm_80+, mma.sync) compile with NVRTC for sm_80 and
sm_90 without spilling, for every option (no GPU needed), and their spec refuses what they
cannot be. CI compiles every head dimension's kernels with every option off and on, for both
types and architectures, plus a pairwise covering set; the full product runs with ``-m slow``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from allpairspy import AllPairs

from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.jit.parallel import compile_many
from ge2jit.jit.render import render
from ge2jit.ops.attention.spec import (
    BWD_CONFIGS,
    DOT_THREADS,
    MAX_SMEM_SM80,
    MAX_SMEM_SM90,
    SM90_BWD,
    SM90_BWD_FUSED,
    SM90_BWD_WIDE,
    AttentionBwdConfig,
    AttentionBwdSm90Spec,
    AttentionBwdSpec,
    bwd_specs_for,
    deferred_bwd_refusal,
    defers_dq,
    fused_step,
    make_bwd_sm90_specs,
    make_bwd_specs,
    wide_bwd_refusal,
)
from ge2jit.runtime.dtypes import DType

from ...compiled import check_compiled

ARCHS = ["sm_80", "sm_90"]
FLAGS = ("causal", "window", "softcap", "varlen")
PARAMS = {"head_dim": sorted(BWD_CONFIGS), "dtype": [DType.F16, DType.BF16],
          **{f: [False, True] for f in FLAGS}, "arch": ARCHS}


def _specs(p: dict) -> tuple:
    return make_bwd_specs(p["dtype"], p["head_dim"], **{f: p[f] for f in FLAGS})


def _cases() -> list:
    order = sorted(PARAMS, key=lambda k: -len(PARAMS[k]))
    rows = [dict(zip(order, row)) for row in AllPairs([PARAMS[k] for k in order])]
    rows += [{"head_dim": d, "dtype": dt, **{f: on for f in FLAGS}, "arch": arch}
             for d, arch in itertools.product(PARAMS["head_dim"], ARCHS)
             for dt, on in ((DType.F16, False), (DType.BF16, True))]
    seen, cases = set(), []
    for p in rows:
        for spec in _specs(p):
            if (spec, p["arch"]) not in seen:
                seen.add((spec, p["arch"]))
                cases.append(pytest.param(spec, p["arch"], id=f"{spec.kernel_name}-{p['arch']}"))
    return cases


@pytest.mark.parametrize("spec, arch", _cases())
def test_compiles_without_spills(spec, arch, compile_cache):
    check_compiled(spec, arch, compile_cache)


@pytest.mark.slow
def test_full_product_compiles_without_spills(tmp_path):
    jobs = list({(spec, row[-1]) for row in itertools.product(*PARAMS.values())
                 for spec in _specs(dict(zip(PARAMS, row)))})
    outcomes = compile_many(jobs, cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes != 0 or o.stack_bytes]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.spill_bytes) for o in bad[:20]]


def test_names_sources_and_shapes():
    specs = {s for row in itertools.product(*PARAMS.values())
             for s in _specs(dict(zip(PARAMS, row)))}
    names = {s.kernel_name for s in specs}
    assert len(names) == len(specs) and all(n.isidentifier() for n in names)
    dot, dq, dkv = make_bwd_specs(DType.BF16, 128, causal=True, varlen=True)
    assert dot.kernel_name == "attn_bwd_dot_sm80_bf16_d128_varlen"
    assert dq.kernel_name == "attn_bwd_dq_sm80_bf16_d128_m64n64w4_causal_varlen"
    for spec in (dot, dq, dkv):
        source = render(spec)
        assert "{{" not in source and "{%" not in source
        assert source.count("__global__") == 1 and f"{spec.kernel_name}(" in source
        assert spec.smem_bytes <= MAX_SMEM_SM80
    assert dot.threads == DOT_THREADS and dot.grid(3, 8, 2, 1000, 10) == (
        -(-1000 // (DOT_THREADS // 16)), 8, 3)
    assert dq.grid(3, 8, 2, 1000, 10) == (-(-1000 // dq.config.block_m), 8, 3)
    d256 = make_bwd_specs(DType.F16, 256)[2]
    assert d256.grid(1, 8, 2, 10, 1000) == (-(-1000 // d256.config.block_n) * 2, 2, 1)


@pytest.mark.parametrize("make, error, match", [
    (lambda: AttentionBwdSpec("dx", DType.F16, 64, BWD_CONFIGS[64][0]), ArgumentValueError,
     "kind"),
    (lambda: AttentionBwdSpec("dq", DType.F32, 64, BWD_CONFIGS[64][0]), ArgumentValueError,
     "float16 or bfloat16"),
    (lambda: AttentionBwdSpec("dq", DType.F16, 96, BWD_CONFIGS[64][0]), ArgumentValueError,
     "64, 128 or 256"),
    (lambda: AttentionBwdSpec("dq", DType.F16, 64, AttentionBwdConfig(32, 64)),
     ArgumentValueError, "16 rows a warp"),
    (lambda: AttentionBwdSpec("dkv", DType.F16, 64, AttentionBwdConfig(64, 32)),
     ArgumentValueError, "16 keys a warp"),
    (lambda: AttentionBwdSpec("dkv", DType.F16, 64, AttentionBwdConfig(64, 64, dsplit=2)),
     ArgumentValueError, "multiples of 64"),
    (lambda: AttentionBwdSpec("dq", DType.F16, 64, BWD_CONFIGS[64][0], causal=1),
     ArgumentTypeError, "causal: expected bool"),
    (lambda: AttentionBwdConfig(24, 64), ArgumentValueError, "multiples of 16"),
    (lambda: AttentionBwdConfig(64, 64, stages=3), ArgumentValueError, "stages 2"),
])
def test_spec_validation(make, error, match):
    with pytest.raises(error, match=match):
        make()


# --- the Hopper backward -----------------------------------------------------------------------


@pytest.mark.parametrize("d", sorted(SM90_BWD))
@pytest.mark.parametrize("dtype, on", [(DType.F16, False), (DType.BF16, True)],
                         ids=["f16-off", "bf16-on"])
def test_the_hopper_kernels_compile_without_spills(d, dtype, on, compile_cache):
    flags = dict(causal=on, window=on, softcap=on, varlen=on)
    specs = [*make_bwd_sm90_specs(dtype, d, **flags), *bwd_specs_for("sm90n", dtype, d, **flags)]
    for spec in specs:
        if spec.template != "attention/bwd_sm90.cu":   # the sm_80 dot and dqout kernels
            check_compiled(spec, "sm_80", compile_cache)
            continue
        entry = check_compiled(spec, "sm_90a", compile_cache)
        assert entry.registers <= 168 and spec.smem_bytes <= MAX_SMEM_SM90
        assert "wgmma.mma_async" in render(spec)
    kinds = [s.kind for s in bwd_specs_for("sm90", dtype, d, **flags)]
    # the one-kernel backward (dq by bulk reductions) at 64 and 128; two kernels at 256
    assert kinds == (["dot", "dkvq", "dqout"] if d in (64, 128) else ["dot", "dq", "dkv"])
    assert [s.kind for s in bwd_specs_for("sm90", dtype, d, deterministic=True, **flags)] == [
        "dot", "dq", "dkv"]
    if d in (64, 128):
        assert "cp.reduce.async.bulk" in render(bwd_specs_for("sm90", dtype, d, **flags)[1])


#: (head_dim, options) the wide one-kernel backward ("sm90w") takes: every option it does not
#: refuse, each dtype
_FLAGS = [dict(zip(("causal", "window", "varlen"), map(bool, bits)))
          for bits in ((0, 0, 0), (1, 0, 0), (1, 1, 1))]
WIDE = [(d, f) for d in sorted(SM90_BWD_WIDE) for f in _FLAGS if wide_bwd_refusal(d, **f) is None]


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("d, flags", WIDE, ids=[f"{d}-{''.join(k[0] for k, v in f.items() if v)}"
                                                for d, f in WIDE])
def test_the_wide_one_kernel_backward_compiles_without_spills(d, flags, dtype, compile_cache):
    dot, fused, out = bwd_specs_for("sm90w", dtype, d, **flags)
    assert (dot.kind, fused.kind, out.kind) == ("dot", "dkvq", "dqout")
    assert fused.step == SM90_BWD_WIDE[d] > bwd_specs_for("sm90n", dtype, d, **flags)[1].step
    default = bwd_specs_for("sm90", dtype, d, **flags)[1]   # the default's step where it applies
    assert default == replace(fused, defer_dq=d == 64)          # (at 64 with the dq deferred)
    entry = check_compiled(fused, "sm_90a", compile_cache)
    assert entry.registers <= 168 and fused.smem_bytes <= MAX_SMEM_SM90


#: every option of the deferred dq backward ("sm90d"): each alone, all, none
DEFERRED = [dict(zip(("causal", "window", "softcap", "varlen"), map(bool, bits)))
            for bits in ((0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 0), (0, 0, 0, 1),
                         (1, 1, 1, 1))]


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("flags", DEFERRED,
                         ids=["".join(k[0] for k, v in f.items() if v) or "-" for f in DEFERRED])
@pytest.mark.parametrize("d, seqlen_q", [(64, None), (64, 1), (128, None)],
                         ids=["64-long", "64-short", "128"])
def test_the_deferred_dq_backward_compiles_without_spills(d, seqlen_q, flags, dtype,
                                                          compile_cache):
    """At head_dim 64 both steps (the wide one where the default takes it), at 128 the
    narrow one (without softcap, where it would spill: refused)."""
    if deferred_bwd_refusal(d, **flags) is not None:
        with pytest.raises(ArgumentValueError, match=r"^config: 'sm90d' takes none of softcap "
                                                     r"at head_dim 128"):
            bwd_specs_for("sm90d", dtype, d, seqlen_q=seqlen_q, **flags)
        assert d == 128 and flags["softcap"]
        return
    dot, fused, out = bwd_specs_for("sm90d", dtype, d, seqlen_q=seqlen_q, **flags)
    family = "sm90" if d == 64 else "sm90n"
    assert fused.kind == "dkvq" and fused.defer_dq
    assert fused == replace(bwd_specs_for(family, dtype, d, seqlen_q=seqlen_q, **flags)[1],
                            defer_dq=True)
    entry = check_compiled(fused, "sm_90a", compile_cache)
    assert entry.registers <= 168 and fused.smem_bytes <= MAX_SMEM_SM90
    assert render(fused).count("issue_dq(") == 3   # defined, under the next step, the last


def test_the_wide_one_kernel_backward_refuses_what_would_spill():
    assert [d for d, f in WIDE if not any(f.values())] == [64, 128]
    assert any(d == 64 and f["varlen"] for d, f in WIDE)   # packed sequences at 64 keep
    for d, options, words in ((128, dict(softcap=True), "softcap, window, varlen"),
                              (128, dict(varlen=True), "got varlen"),
                              (64, dict(softcap=True, causal=True), "got softcap"),
                              (256, {}, "head_dim 64 or 128, got 256")):
        with pytest.raises(ArgumentValueError, match=r"^config: 'sm90w' takes .*" + words):
            bwd_specs_for("sm90w", DType.BF16, d, **options)
        if d in SM90_BWD_WIDE:   # the default takes the narrow step there
            narrow = bwd_specs_for("sm90n", DType.BF16, d, **options)
            dot, fused, out = bwd_specs_for("sm90", DType.BF16, d, **options)
            assert (dot, replace(fused, defer_dq=False), out) == narrow   # (64: deferred)
            assert fused.defer_dq == (d == 64) and narrow[1].step < SM90_BWD_WIDE[d]
    with pytest.raises(ArgumentValueError, match="deterministic=False"):
        bwd_specs_for("sm90w", DType.BF16, 128, deterministic=True)


def test_the_hopper_backward_spec_refuses_what_it_cannot_be():
    with pytest.raises(ArgumentValueError, match="kind"):
        AttentionBwdSm90Spec("dot", DType.F16, 64, 64)
    with pytest.raises(ArgumentValueError, match="dsplit"):
        AttentionBwdSm90Spec("dq", DType.F16, 128, 64, dsplit=2)
    with pytest.raises(ArgumentValueError, match="shared memory"):
        AttentionBwdSm90Spec("dq", DType.F16, 256, 256)
    with pytest.raises(ArgumentValueError, match="stages: expected 2, 3 or 4, got 5"):
        AttentionBwdSm90Spec("dkv", DType.F16, 128, 48, stages=5)
    with pytest.raises(ArgumentValueError, match="dkvq kernel takes head_dim 64 or 128"):
        AttentionBwdSm90Spec("dkvq", DType.F16, 256, 32, dsplit=2)
    with pytest.raises(ArgumentValueError, match="whole 16-query groups"):
        AttentionBwdSm90Spec("dkvq", DType.F16, 64, 48)
    assert AttentionBwdSm90Spec("dkvq", DType.BF16, 128, 48).kernel_name == (
        "attn_bwd_dkvq_sm90_bf16_d128_s48")
    assert AttentionBwdSm90Spec("dkv", DType.F16, 64, 64, stages=3).kernel_name == (
        "attn_bwd_dkv_sm90_f16_d64_s64p3")
    dq, dkv = make_bwd_sm90_specs(DType.BF16, 256, causal=True)
    assert dq.kernel_name == "attn_bwd_dq_sm90_bf16_d256_s32_causal"
    assert dkv.grid(2, 8, 2, 300, 300) == (3 * 2, 2, 2) and dq.grid(2, 8, 2, 300, 300) == (3, 8, 2)


@pytest.mark.parametrize("flags", [dict(causal=True), dict(causal=True, window=True, softcap=True)],
                         ids=["causal", "all"])
@pytest.mark.parametrize("d", sorted(SM90_BWD))
def test_the_hopper_backward_compiles_with_segments_without_spills(d, flags, compile_cache):
    """Each row's sequences kept apart by their bounds (``segments``): the dq and dkv kernels,
    and the one-kernel backward at the step the default and "sm90n" take at head_dim 64, the
    narrow one at 128 (the wide one spills 8 bytes there with segments: when the ops take
    them, ``WIDE_SPILLS`` names them), no spill."""
    specs = list(make_bwd_sm90_specs(DType.BF16, d, segments=True, **flags))
    if d in SM90_BWD_FUSED:
        for family in ("sm90", "sm90n") if d == 64 else ("sm90n",):
            step, _ = fused_step(family, d, **flags)
            specs.append(AttentionBwdSm90Spec("dkvq", DType.BF16, d, step,
                                              stages=SM90_BWD_FUSED[d][1],
                                              defer_dq=defers_dq(family, d), segments=True,
                                              **flags))
    for spec in specs:
        assert spec.kernel_name.endswith("_seg") and spec.params[-1].name == "seq_bounds"
        entry = check_compiled(spec, "sm_90a", compile_cache)
        assert entry.registers <= 168 and spec.smem_bytes <= MAX_SMEM_SM90


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", sorted(BWD_CONFIGS))
def test_the_sm80_backward_compiles_with_segments_without_spills(d, arch, compile_cache):
    """The mma.sync dq and dkv kernels with each row's sequences kept apart by their bounds
    (every other option but varlen on): no spill, ``seq_bounds`` their last parameter; the
    row kernels take no bounds and refuse them."""
    dot, dq, dkv = make_bwd_specs(DType.BF16, d, causal=True, window=True, softcap=True,
                                  segments=True)
    assert not dot.segments and "seq_bounds" not in [p.name for p in dot.params]
    for spec in (dq, dkv):
        assert spec.kernel_name.endswith("_seg") and spec.params[-1].name == "seq_bounds"
        check_compiled(spec, arch, compile_cache)
    with pytest.raises(ArgumentValueError, match="segments only with kind 'dq' or 'dkv'"):
        AttentionBwdSpec("dot", DType.BF16, d, BWD_CONFIGS[d][0], segments=True)
