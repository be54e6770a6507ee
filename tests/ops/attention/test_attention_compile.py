"""The attention forward kernel (sm_80+, mma.sync) compiles with NVRTC for sm_80 and sm_90
without spilling, for every option (no GPU needed), and its spec refuses what it cannot be.

CI compiles a pairwise covering set (every value of each field meets every value of every
other field at least once) plus, for every config and architecture, the variants with every
option off and every option on (the most registers). The full product runs with ``-m slow``.
"""

from __future__ import annotations

import itertools

import pytest
from allpairspy import AllPairs

from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.jit.parallel import compile_many
from ge2jit.jit.params import layout
from ge2jit.jit.render import render
from ge2jit.ops.attention.spec import (
    CONFIGS,
    MAX_SMEM_SM80,
    MAX_SMEM_SM90,
    SM90_BLOCK_N,
    SM90_CONFIGS,
    AttentionConfig,
    AttentionFwdSm90Spec,
    AttentionFwdSpec,
    AttentionSm90Config,
    default_configs,
    make_sm90_spec,
    make_spec,
)
from ge2jit.runtime.dtypes import DType

from ...compiled import check_compiled

ARCHS = ["sm_80", "sm_90"]
DTYPES = [DType.F16, DType.BF16]
FLAGS = ("causal", "window", "softcap", "varlen", "write_lse")
#: (head_dim, config): every candidate config of every head dimension
TILINGS = [(d, cfg) for d, cfgs in CONFIGS.items() for cfg in cfgs]

PARAMS = {"tiling": TILINGS, "dtype": DTYPES, **{f: [False, True] for f in FLAGS},
          "arch": ARCHS}


def _spec(p: dict) -> AttentionFwdSpec:
    d, cfg = p["tiling"]
    return AttentionFwdSpec(p["dtype"], d, cfg, **{f: p[f] for f in FLAGS})


def covering_set(params: dict) -> list[dict]:
    # the parameter with the most values first gives allpairspy its smallest sets
    order = sorted(params, key=lambda k: -len(params[k]))
    return [dict(zip(order, row)) for row in AllPairs([params[k] for k in order])]


COVERING = covering_set(PARAMS)
# every tiling and architecture with all options off and all on
EXTREMES = [{"tiling": tiling, "dtype": dtype, **{f: on for f in FLAGS}, "arch": arch}
            for tiling, arch in itertools.product(TILINGS, ARCHS)
            for dtype, on in ((DType.F16, False), (DType.BF16, True))]


def _cases(rows):
    seen, cases = set(), []
    for p in rows:
        key = (_spec(p).kernel_name, p["arch"])
        if key not in seen:
            seen.add(key)
            cases.append(pytest.param(p, id=f"{key[0]}-{key[1]}"))
    return cases


def test_covering_set_covers_every_pair():
    for x, y in itertools.combinations(PARAMS, 2):
        seen = {(row[x], row[y]) for row in COVERING}
        for pair in itertools.product(PARAMS[x], PARAMS[y]):
            assert pair in seen, (x, y, pair)


def _compile_and_check(spec: AttentionFwdSpec, arch: str, cache) -> None:
    check_compiled(spec, arch, cache)


@pytest.mark.parametrize("params", _cases(COVERING + EXTREMES))
def test_compiles_without_spills(params, compile_cache):
    _compile_and_check(_spec(params), params["arch"], compile_cache)


@pytest.mark.slow
def test_full_product_compiles_without_spills(tmp_path):
    """Every variant of every config for both architectures (896 compiles: about 10 minutes
    on 2 cores)."""
    jobs = [(_spec(dict(zip(PARAMS, row))), row[-1])
            for row in itertools.product(*PARAMS.values())]
    outcomes = compile_many(jobs, cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes != 0 or o.stack_bytes]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.spill_bytes) for o in bad[:20]]


def test_kernel_names_are_unique():
    specs = {_spec(dict(zip(PARAMS, row))) for row in itertools.product(*PARAMS.values())}
    names = {s.kernel_name for s in specs}
    assert len(names) == len(specs)
    assert all(n.isidentifier() for n in names)


def test_kernel_name_reads_its_options():
    cfg = AttentionConfig(128, 64, 8)
    spec = AttentionFwdSpec(DType.BF16, 128, cfg, causal=True, window=True, softcap=True,
                            varlen=True, write_lse=True)
    assert spec.kernel_name == "attn_fwd_sm80_bf16_d128_m128n64w8s2_causal_win_cap_varlen_lse"
    assert AttentionFwdSpec(DType.F16, 64, cfg).kernel_name == "attn_fwd_sm80_f16_d64_m128n64w8s2"


@pytest.mark.parametrize("spec", [
    AttentionFwdSpec(DType.F16, 64, CONFIGS[64][0]),
    AttentionFwdSpec(DType.BF16, 256, CONFIGS[256][0], causal=True, window=True, softcap=True,
                     varlen=True, write_lse=True),
], ids=lambda s: s.kernel_name)
def test_rendered_source_is_plain_cuda(spec):
    source = render(spec)
    assert "{{" not in source and "{%" not in source
    assert f"{spec.kernel_name}(" in source
    assert source.count("__global__") == 1


def test_params_pack():
    spec = make_spec(DType.F16, 128)
    names = [p.name for p in spec.params]
    assert names[:7] == ["q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k"]
    assert names[-4:] == ["scale", "softcap", "window_left", "window_right"]
    offsets, size, fmt = layout(spec.params)
    assert size == 8 * len(names) and fmt.count("d") == 2


def test_launch_shape_and_budget():
    for d, cfgs in CONFIGS.items():
        for cfg in cfgs:
            spec = AttentionFwdSpec(DType.F16, d, cfg)
            assert spec.threads == 32 * cfg.warps
            assert cfg.m_tiles == 1                       # 16 rows a warp: what compiles
            assert spec.smem_bytes == (cfg.block_m + 4 * cfg.block_n) * d * 2
            assert spec.smem_bytes <= MAX_SMEM_SM80
            assert spec.q_in_registers == (d <= 128)
            assert spec.target_arch("sm_90a") == "sm_90"
            assert spec.grid(3, 16, 1000) == (-(-1000 // cfg.block_m), 16, 3)
    assert make_spec(DType.BF16, 256).config == CONFIGS[256][0]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dtype": DType.F32}, ArgumentValueError, "float16 or bfloat16"),
    ({"dtype": "bf16"}, TypeError, "expected a DType"),
    ({"head_dim": 96}, ArgumentValueError, "64, 128 or 256"),
    ({"head_dim": True}, ArgumentValueError, "64, 128 or 256"),
    ({"config": (128, 64, 8)}, TypeError, "AttentionConfig"),
    ({"causal": 1}, ArgumentTypeError, "AttentionFwdSpec.causal: expected bool, got 1"),
    ({"write_lse": None}, ArgumentTypeError, "write_lse: expected bool, got None"),
    ({"head_dim": 256, "config": AttentionConfig(128, 64, 8)}, ArgumentValueError,
     "shared memory"),
])
def test_spec_validation(kwargs, error, match):
    fields = {"dtype": DType.F16, "head_dim": 128, "config": CONFIGS[128][0], **kwargs}
    with pytest.raises(error, match=match):
        AttentionFwdSpec(**fields)


@pytest.mark.parametrize("args, match", [
    ((48, 64, 4), "block_m"),        # 12 rows a warp
    ((256, 64, 4), None),            # 64 rows a warp: raises below
    ((128, 24, 4), "block_n"),
    ((128, 64, 3), "warps"),
    ((128, 64, 8, 1), "stages"),
    ((128, 64, 8, 2, 4), "min_blocks"),
    ((0, 64, 4), "positive int"),
    ((128.0, 64, 4), "positive int"),
])
def test_config_validation(args, match):
    with pytest.raises(ArgumentValueError, match=match or "16 or 32 rows per warp"):
        AttentionConfig(*args)


def test_make_spec_refuses_an_unknown_head_dim():
    with pytest.raises(ArgumentValueError, match="head_dim"):
        make_spec(DType.F16, 80)


# --- the Hopper forward -----------------------------------------------------------------------

SM90_FLAGS = ("causal", "window", "softcap", "varlen", "write_lse")


@pytest.mark.parametrize("d", sorted(SM90_BLOCK_N))
@pytest.mark.parametrize("dtype, on", [(DType.F16, False), (DType.BF16, True),
                                       (DType.BF16, False)], ids=["f16-off", "bf16-on",
                                                                  "bf16-off"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_the_hopper_kernel_compiles_without_spills(d, dtype, on, overlap, compile_cache):
    config = next(c for c in SM90_CONFIGS[d] if c.overlap == overlap)
    spec = make_sm90_spec(dtype, d, config=config, **{f: on for f in SM90_FLAGS})
    entry = check_compiled(spec, "sm_90a", compile_cache)
    # the producer's setmaxnreg gives the consumers their registers: the kernel is compiled
    # for 384 threads of one block on a multiprocessor
    assert entry.registers <= 168
    assert spec.smem_bytes <= MAX_SMEM_SM90 and spec.target_arch("sm_90") == "sm_90a"
    source = render(spec)
    assert "wgmma.mma_async.sync.aligned.m64n" in source and "{%" not in source


def test_the_hopper_spec_refuses_what_it_cannot_be():
    with pytest.raises(ArgumentValueError, match="head_dim"):
        make_sm90_spec(DType.F16, 96)
    with pytest.raises(ArgumentValueError, match="block_n a multiple of 16"):
        AttentionFwdSm90Spec(DType.F16, 128, 72)
    with pytest.raises(ArgumentValueError, match="shared memory"):
        AttentionFwdSm90Spec(DType.F16, 256, 256)
    with pytest.raises(ArgumentTypeError, match="causal: expected bool"):
        AttentionFwdSm90Spec(DType.F16, 128, 128, causal=1)
    assert make_sm90_spec(DType.BF16, 128, causal=True).kernel_name == \
        "attn_fwd_sm90_bf16_d128_n128s2ip_causal"


def test_the_hopper_configs_name_overlap_pingpong_and_persistence():
    """``o``: the intra-warpgroup overlap with ping-pong; ``i``: the overlap alone; ``p``:
    persistent, with either; ping-pong without the overlap is refused in one line."""
    for config, name in ((AttentionSm90Config(128), "h128s2"),
                         (AttentionSm90Config(128, overlap=True), "h128s2o"),
                         (AttentionSm90Config(128, overlap=True, pingpong=False), "h128s2i"),
                         (AttentionSm90Config(160, overlap=True, persistent=True), "h160s2op"),
                         (AttentionSm90Config(128, 3, True, True, False), "h128s3ip")):
        assert config.name == name
        spec = make_sm90_spec(DType.BF16, 128, config=config, causal=True)
        assert spec.config == config and spec.pingpong == config.pingpong
        assert spec.kernel_name == f"attn_fwd_sm90_bf16_d128_n{name[1:]}_causal"
        source = render(spec)
        assert ("constexpr bool PINGPONG = true;" in source) == config.pingpong
        assert ("constexpr bool OVERLAP = true;" in source) == config.overlap
    with pytest.raises(ArgumentValueError, match="^AttentionSm90Config: expected pingpong only "
                                                 "with overlap$"):
        AttentionSm90Config(128, pingpong=True)
    with pytest.raises(ArgumentValueError, match="pingpong only with overlap"):
        AttentionFwdSm90Spec(DType.BF16, 128, 128, pingpong=True)
    with pytest.raises(ArgumentTypeError, match="pingpong: expected bool"):
        AttentionSm90Config(128, overlap=True, pingpong=1)
    assert AttentionFwdSm90Spec(DType.BF16, 128, 128, overlap=True).pingpong is True


EVERY_SM90 = [(d, c) for d, cs in SM90_CONFIGS.items() for c in cs]


@pytest.mark.parametrize("d, config", EVERY_SM90, ids=[f"{d}-{c.name}" for d, c in EVERY_SM90])
@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_every_hopper_candidate_compiles_without_spills(d, config, on, compile_cache):
    spec = make_sm90_spec(DType.BF16, d, config=config, **{f: on for f in SM90_FLAGS})
    entry = check_compiled(spec, "sm_90a", compile_cache)
    assert entry.registers <= 168 and spec.smem_bytes <= MAX_SMEM_SM90


@pytest.mark.parametrize("d, config", EVERY_SM90, ids=[f"{d}-{c.name}" for d, c in EVERY_SM90])
def test_every_hopper_candidate_compiles_with_segments_without_spills(d, config, compile_cache):
    """Each row's sequences kept apart by their bounds (``segments``, dense batches only):
    every candidate with every other option on but varlen and softcap (the wider candidates,
    h192s2ip at 64, h160s2ip at 128, spill with softcap in some combinations without segments
    too), and each head dimension's defaults with softcap as well, no spill; the kernel takes
    ``seq_bounds`` (a kernel without segments takes no such parameter)."""
    defaults = [c.name for c in default_configs(d, 90, True) + default_configs(d, 90, False)]
    flags = {f: f not in ("varlen", "softcap") or (f == "softcap" and config.name in defaults)
             for f in SM90_FLAGS}
    spec = make_sm90_spec(DType.BF16, d, config=config, segments=True, **flags)
    assert spec.kernel_name.endswith("_seg") and spec.params[-1].name == "seq_bounds"
    assert "seq_bounds" not in [p.name for p in make_sm90_spec(DType.BF16, d, config=config,
                                                               **flags).params]
    assert "seq_bounds + 2 * static_cast<long long>(b) * S_q" in render(spec)
    entry = check_compiled(spec, "sm_90a", compile_cache)
    assert entry.registers <= 168 and spec.smem_bytes <= MAX_SMEM_SM90


def test_segments_are_refused_with_packed_sequences():
    with pytest.raises(ArgumentValueError, match="segments .* without varlen"):
        AttentionFwdSm90Spec(DType.BF16, 128, 128, varlen=True, segments=True)
    with pytest.raises(ArgumentValueError, match="segments .* without varlen"):
        AttentionFwdSpec(DType.BF16, 64, CONFIGS[64][0], varlen=True, segments=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d, config", TILINGS, ids=[f"{d}-{c.name}" for d, c in TILINGS])
def test_the_sm80_kernel_compiles_with_segments_without_spills(d, config, arch, compile_cache):
    """The mma.sync forward with each row's sequences kept apart by their bounds, every tiling
    with every other option but varlen on: no spill, ``seq_bounds`` its last parameter."""
    spec = make_spec(DType.BF16, d, config=config, causal=True, window=True, softcap=True,
                     write_lse=True, segments=True)
    assert spec.kernel_name.endswith("_seg") and spec.params[-1].name == "seq_bounds"
    assert "seq_bounds + 2 * static_cast<long long>(b) * S_q" in render(spec)
    check_compiled(spec, arch, compile_cache)
