"""attention_backward's call checks without a GPU (``tests/fake_cupy.py`` arrays): an accepted
call gives the three kernels and the strides, sizes and scalars they are launched with; every
refusal names its argument in one line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.ops.attention import backward as bwd
from ge2jit.ops.attention.spec import BWD_CONFIGS, DOT_THREADS
from ge2jit.runtime.dtypes import DType

from ...fake_cupy import FakeArray

F16 = np.float16
B, SQ, SK, H, HKV, D = 2, 5, 7, 4, 2, 128


pytestmark = pytest.mark.usefixtures("fake_cupy")


def arr(shape, dtype=F16, **kw):
    return FakeArray(shape, dtype, **kw)


def _args(**over):
    """A good dense call's arguments with some replaced."""
    a = {"do": arr((B, SQ, H, D)), "q": arr((B, SQ, H, D)), "k": arr((B, SK, HKV, D)),
         "v": arr((B, SK, HKV, D)), "o": arr((B, SQ, H, D)),
         "lse": arr((B, H, SQ), np.float32)}
    a.update(over)
    return a


def check(**over) -> bwd.BackwardCall:
    a = _args(**over)
    return bwd.check_backward_arguments(a.pop("do"), a.pop("q"), a.pop("k"), a.pop("v"),
                                        a.pop("o"), a.pop("lse"), **a)[3]


def test_a_dense_call_gives_three_kernels_and_their_parameters():
    call = check(causal=True, softcap=10.0)
    dot, dq, dkv = call.specs
    assert (dot.kind, dq.kind, dkv.kind) == ("dot", "dq", "dkv")
    assert dq.causal and dq.softcap and not dq.window and not dot.causal
    assert (dq.config, dkv.config) == BWD_CONFIGS[D]
    launches, params = bwd.launch_params(call)
    (_, g_dot, b_dot, s_dot), (_, g_dq, b_dq, s_dq), (_, g_kv, b_kv, s_kv) = launches
    assert g_dot == (-(-SQ // (DOT_THREADS // (D // 8))), H, B) and b_dot == (DOT_THREADS, 1, 1)
    assert g_dq == (1, H, B) and s_dq == dq.smem_bytes and s_dot == 0
    assert g_kv == (1 * dkv.config.dsplit, HKV, B) and b_kv == (32 * dkv.config.warps, 1, 1)
    row = H * D
    assert (params["qb"], params["qs"], params["qh"]) == (SQ * row, row, D)
    assert (params["gb"], params["gs"], params["gh"]) == (SQ * row, row, D)
    assert (params["dkb"], params["dks"], params["dkh"]) == (SK * HKV * D, HKV * D, D)
    assert (params["H"], params["H_kv"], params["S_q"], params["S_k"]) == (H, HKV, SQ, SK)
    assert params["window_right"] == 0 and params["softcap"] == 10.0


def test_bhsd_and_given_outputs_keep_their_strides():
    q = arr((B, H, SQ, D))
    k, v = arr((B, HKV, SK, D)), arr((B, HKV, SK, D))
    outs = (arr((B, H, SQ, D)), arr((B, HKV, SK, D)), arr((B, HKV, SK, D)))
    call = check(do=arr((B, H, SQ, D)), q=q, k=k, v=v, o=arr((B, H, SQ, D)), layout="bhsd",
                 out=outs)
    assert call.fwd.layout == "bhsd" and call.dq_out is not None
    assert call.dq_strides == (H * SQ * D, D, SQ * D)
    assert call.dk_strides == (HKV * SK * D, D, SK * D)


def test_packed_sequences_and_head_dim_256_split():
    cu = arr((3,), np.int32)
    call = check(do=arr((12, H, 256)), q=arr((12, H, 256)), k=arr((20, HKV, 256)),
                 v=arr((20, HKV, 256)), o=arr((12, H, 256)), lse=arr((H, 12), np.float32),
                 cu_seqlens_q=cu, cu_seqlens_k=arr((3,), np.int32), max_seqlen_q=8,
                 max_seqlen_k=11)
    assert all(s.varlen for s in call.specs) and call.specs[2].config.dsplit == 2
    launches, _ = bwd.launch_params(call)
    assert launches[2][1] == (1 * 2, HKV, 2)


def test_packed_sequences_on_sm_90_give_each_sequence_whole_tiles_of_dq_sums(monkeypatch):
    from ge2jit.ops.attention import op

    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)
    cu = arr((4,), np.int32)   # 3 sequences in 12 rows
    call = check(do=arr((12, H, D)), q=arr((12, H, D)), k=arr((20, HKV, D)),
                 v=arr((20, HKV, D)), o=arr((12, H, D)), lse=arr((H, 12), np.float32),
                 cu_seqlens_q=cu, cu_seqlens_k=arr((4,), np.int32), max_seqlen_q=8,
                 max_seqlen_k=11)
    dkvq = call.specs[1]
    assert dkvq.kind == "dkvq" and dkvq.varlen
    # (H, total_q + B step, D): sequence b from row cu[b] + b step, so its tiles never meet
    assert bwd.accum_shape(call) == (H, 12 + 3 * dkvq.step, D)
    _, params = bwd.launch_params(call)
    assert params["dq_pad"] == dkvq.step and params["B"] == 3


def test_deterministic_is_a_flag():
    assert check(deterministic=True).fwd.heads == H
    with pytest.raises(ArgumentTypeError, match="^deterministic: expected True or False"):
        check(deterministic=1)


REFUSALS = [
    ("do", ArgumentValueError, "expected q's shape", dict(do=arr((B, SQ, H, 64)))),
    ("o", ArgumentValueError, "expected q's shape", dict(o=arr((B, SQ, H, D), np.float32))),
    ("lse", ArgumentValueError, "expected dtype float32", dict(lse=arr((B, H, SQ)))),
    ("lse", ArgumentValueError, "expected shape (2, 4, 5)",
     dict(lse=arr((B, SQ, H), np.float32))),
    ("lse", ArgumentValueError, "expected a contiguous array",
     dict(lse=arr((B, H, SQ), np.float32, strides=(4 * H * 8, 4 * 8, 4)))),
    ("out", ArgumentTypeError, "expected None or a triple", dict(out=(arr((1,)),) * 2)),
    ("out", ArgumentTypeError, "out: expected dq an array, got None (pass out=None",
     dict(out=(None, None, None))),
    ("out", ArgumentValueError, "expected dk of shape", dict(
        out=(arr((B, SQ, H, D)), arr((B, SQ, H, D)), arr((B, SK, HKV, D))))),
    ("q", ArgumentValueError, "expected head_dim", dict(
        q=arr((B, SQ, H, 96)), k=arr((B, SK, HKV, 96)), v=arr((B, SK, HKV, 96)))),
    ("do", ArgumentValueError, "16-byte aligned", dict(do=arr((B, SQ, H, D), offset=2))),
]


@pytest.mark.parametrize("name, error, fragment, over", REFUSALS,
                         ids=[f"{i}-{r[0]}" for i, r in enumerate(REFUSALS)])
def test_a_refusal_names_its_argument_in_one_line(name, error, fragment, over):
    with pytest.raises(error) as e:
        check(**over)
    message = str(e.value)
    assert message.startswith(f"{name}") and fragment in message and "\n" not in message, \
        message


def test_outputs_must_meet_no_input_and_no_other_output():
    do = arr((B, SQ, H, D))
    with pytest.raises(ArgumentValueError, match=r"^out \(dq\): .*do"):
        check(do=do, out=(do, arr((B, SK, HKV, D)), arr((B, SK, HKV, D))))
    dk = arr((B, SK, HKV, D))
    with pytest.raises(ArgumentValueError, match=r"^out \(d[kv]\): "):
        check(out=(arr((B, SQ, H, D)), dk, dk))
    assert DType.F16 is check().fwd.dtype


def test_on_sm_90_the_hopper_kernels_and_sm80_pinned(monkeypatch):
    from ge2jit.ops.attention import op

    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)
    # by default the one-kernel backward: dot (zeroing dq's float32 sums), dkvq, dqout
    fused = check()
    dot, dkvq, out = fused.specs
    assert (dot.kind, dkvq.kind, out.kind) == ("dot", "dkvq", "dqout")
    assert dkvq.template == "attention/bwd_sm90.cu" and out.template == "attention/bwd_sm80.cu"
    assert sorted(bwd.map_geometries(fused)) == [1]
    assert bwd.map_geometries(fused)[1]["tma_k"][3][1] == 128
    assert out.grid(B, H, HKV, SQ, SK) == dot.grid(B, H, HKV, SQ, SK)
    # explain's plan: the main kernel first (the one-kernel one, or dk-dv), and which form
    from ge2jit.ops.attention.registration import _choose_backward
    plan = _choose_backward(fused, 0)
    assert [s.kind for s in plan.specs] == ["dkvq", "dot", "dqout"]
    assert "one kernel, dq added up by bulk reductions" in plan.detail
    assert plan.detail.startswith(dkvq.kernel_name) and plan.config == "sm90"
    assert bwd.accum_shape(fused) == (B, H, -(-SQ // dkvq.step) * dkvq.step, D)
    call = check(deterministic=True)   # the two-kernel form, no atomics
    plan = _choose_backward(call, 0)
    assert [s.kind for s in plan.specs] == ["dkv", "dot", "dq"]
    assert plan.detail.endswith("dq and dk-dv kernels, deterministic")
    assert bwd.accum_shape(call) is None
    dot, dq, dkv = call.specs
    assert call.family == "sm90" and dot.kind == "dot"
    assert (dq.kind, dkv.kind) == ("dq", "dkv") and dq.template == "attention/bwd_sm90.cu"
    geometries = bwd.map_geometries(call)
    assert sorted(geometries) == [1, 2]
    # the dq kernel's own rows (q, do) 128 a box, the steps' (k, v) its step; dkv the reverse
    assert geometries[1]["tma_q"][3][1] == 128 and geometries[1]["tma_k"][3][1] == dq.step
    assert geometries[2]["tma_k"][3][1] == 128 and geometries[2]["tma_do"][3][1] == dkv.step
    assert geometries[2]["tma_do"][0] == 0 and geometries[2]["tma_v"][0] == 3
    launches, params = bwd.launch_params(call)
    assert launches[1][2] == (384, 1, 1) and "qs" not in bwd._own(dq, params)
    pinned = check(config="sm80")
    assert pinned.family == "sm80" and pinned.specs[1].template == "attention/bwd_sm80.cu"
    assert check(lse=arr((B, H, SQ), np.float32), k=arr((B, 0, HKV, D)),
                 v=arr((B, 0, HKV, D))).family == "sm80"   # no keys: nothing to map


def test_the_wide_one_kernel_backward_is_pinned_where_it_applies(monkeypatch):
    from ge2jit.ops.attention import op
    from ge2jit.ops.attention.registration import _choose_backward

    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)
    wide = check(config="sm90w")
    dot, dkvq, out = wide.specs
    assert wide.family == "sm90w" and dkvq.kind == "dkvq" and dkvq.step == 64   # head_dim 128
    assert bwd.accum_shape(wide) == (B, H, 64, D)
    assert bwd.launch_params(wide)[1]["dq_pad"] == 64
    assert _choose_backward(wide, 0).config == "sm90w"
    with pytest.raises(ArgumentValueError, match=r"^config: 'sm90w' takes none of softcap, "
                                                 r"window, varlen at head_dim 128 \(its "
                                                 r"registers would spill\), got window$"):
        check(config="sm90w", window=(4, 4))
    with pytest.raises(ArgumentValueError, match=r"^config: 'sm90w' takes deterministic=False"):
        check(config="sm90w", deterministic=True)
    # the default takes the wide step where it applies, the narrow one elsewhere
    assert check().specs == wide.specs and check().family == "sm90"
    narrow = check(config="sm90n")
    assert narrow.specs[1].kind == "dkvq" and narrow.specs[1].step == 48
    assert check(window=(4, 4)).specs == check(config="sm90n", window=(4, 4)).specs


def test_at_head_dim_64_the_wide_step_waits_for_long_sequences(monkeypatch):
    from ge2jit.ops.attention import op
    from ge2jit.ops.attention.spec import WIDE_MIN_QUERIES, bwd_specs_for

    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)
    long_q = WIDE_MIN_QUERIES[64]

    def call(s_q, **over):
        q = arr((1, s_q, H, 64))
        return check(do=q, q=q, o=arr((1, s_q, H, 64)), k=arr((1, SK, HKV, 64)),
                     v=arr((1, SK, HKV, 64)), lse=arr((1, H, s_q), np.float32), **over)

    assert call(long_q).specs[1].step == 96 and call(long_q - 1).specs[1].step == 64
    assert call(long_q - 1, config="sm90w").specs[1].step == 96        # pinned: wide anyway
    assert call(long_q, config="sm90n").specs[1].step == 64
    assert call(long_q - 1).specs == tuple(   # the narrow step, its dq product deferred
        replace(x, defer_dq=True) if x.kind == "dkvq" else x
        for x in call(long_q - 1, config="sm90n").specs)
    # explain says which step and why
    from ge2jit.ops.attention.registration import _choose_backward

    assert _choose_backward(call(long_q - 1), 0).detail.endswith(
        f"the narrow step of 64 queries (the wide one from {long_q} queries at head_dim 64, "
        f"got {long_q - 1}), each step's dq product under the next step's")
    assert _choose_backward(call(long_q), 0).detail.endswith(
        "the wide step of 96 queries, each step's dq product under the next step's")
    assert _choose_backward(call(long_q, config="sm90n"), 0).detail.endswith(
        "the narrow step of 64 queries (pinned)")
    assert _choose_backward(call(long_q, softcap=5.0), 0).detail.endswith(
        "the narrow step of 64 queries (the wide one takes none of softcap at head_dim 64 (its "
        "registers would spill), got softcap), each step's dq product under the next step's")
    # head_dim 128 takes its wide step at any length; no length given: the long sequences'
    assert bwd_specs_for("sm90", DType.BF16, 128, seqlen_q=1)[1].step == 64
    assert bwd_specs_for("sm90", DType.BF16, 64)[1].step == 96
    # a warm-up of head_dim 64 compiles both steps
    from ge2jit.ops.attention.warmup import BACKWARD_TABLE

    entry = BACKWARD_TABLE.validate_entry({"head_dims": [64]})
    assert {s.step for s in BACKWARD_TABLE.expand(entry, "sm_90") if s.kind == "dkvq"} == {64, 96}


def test_the_deferred_dq_backward_takes_the_steps_its_registers_allow(monkeypatch):
    """``config="sm90d"``: the one-kernel backward with each step's dq product deferred under
    the next step's, at the default's step at head_dim 64 and the narrow one at 128;
    deterministic and head_dim 256 refused in one line; explain says so."""
    from ge2jit.ops.attention import op
    from ge2jit.ops.attention.registration import _choose_backward
    from ge2jit.ops.attention.spec import WIDE_MIN_QUERIES

    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)

    def call(d, s_q=SQ, **over):
        q = arr((B, s_q, H, d))
        return check(do=q, q=q, o=arr((B, s_q, H, d)), k=arr((B, SK, HKV, d)),
                     v=arr((B, SK, HKV, d)), lse=arr((B, H, s_q), np.float32), **over)

    for d, s_q, family in ((64, SQ, "sm90n"), (64, WIDE_MIN_QUERIES[64], "sm90"),
                           (128, SQ, "sm90n"), (128, 4096, "sm90n")):
        deferred = call(d, s_q, config="sm90d")
        dot, dkvq, out = deferred.specs
        assert dkvq.kind == "dkvq" and dkvq.defer_dq and dkvq.kernel_name.endswith("_dqd")
        assert deferred.specs == tuple(
            replace(x, defer_dq=True) if x.kind == "dkvq" else x
            for x in call(d, s_q, config=family).specs)
    # the default defers at head_dim 64 (its explain says so), not at 128; "sm90n", "sm90w" never
    assert call(64).specs == call(64, config="sm90d").specs
    assert call(64, s_q=WIDE_MIN_QUERIES[64]).specs == call(
        64, s_q=WIDE_MIN_QUERIES[64], config="sm90d").specs
    assert _choose_backward(call(64), 0).detail.endswith(
        "got 5), each step's dq product under the next step's")
    for d, family in ((64, "sm90n"), (64, "sm90w"), (128, None), (128, "sm90n")):
        if family == "sm90w":
            specs = call(d, s_q=WIDE_MIN_QUERIES[64], config=family).specs
        else:
            specs = call(d, config=family).specs
        assert not any(getattr(s, "defer_dq", False) for s in specs), (d, family)
    assert "dq product" not in _choose_backward(call(128), 0).detail
    assert _choose_backward(call(64, config="sm90d"), 0).detail.endswith(
        "(the wide one from 2048 queries at head_dim 64, got 5), each step's dq product under "
        "the next step's (pinned)")
    assert _choose_backward(call(128, config="sm90d"), 0).detail.endswith(
        "the narrow step of 48 queries (the wide one's registers would spill), each step's dq "
        "product under the next step's (pinned)")
    with pytest.raises(ArgumentValueError, match=r"^config: 'sm90d' takes head_dim 64 or 128, "
                                                 r"got 256$"):
        call(256, config="sm90d")
    with pytest.raises(ArgumentValueError, match=r"^config: 'sm90d' takes deterministic=False"):
        call(64, config="sm90d", deterministic=True)
    with pytest.raises(ArgumentValueError, match=r"^config: 'sm90d' takes none of softcap at "
                                                 r"head_dim 128 \(its registers would spill\), "
                                                 r"got softcap$"):
        call(128, config="sm90d", softcap=10.0)
    assert call(64, config="sm90d", softcap=10.0).specs[1].defer_dq
    with pytest.raises(ArgumentValueError, match="defer_dq only with kind 'dkvq'"):
        replace(call(64, config="sm90d").specs[1], kind="dkv")


def test_the_hopper_kernels_are_refused_elsewhere_and_a_bad_config_in_one_line():
    for name in ("sm90", "sm90w", "sm90n", "sm90d"):
        with pytest.raises(ArgumentValueError, match="^config: expected one of 'sm80' on this "
                                                     "GPU"):
            check(config=name)
    with pytest.raises(ArgumentTypeError, match="^config: expected None or a name"):
        check(config=3)
