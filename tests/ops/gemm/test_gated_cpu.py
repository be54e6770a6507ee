"""The gated GEMM without a GPU: its validation (on stand-in arrays), its epilogue and spec
rules, the kernels its warm-up tables and configs make, the heuristic's tiles, and the helpers
that build and split the interleaved weight."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.gemm import problem
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.problem import validate
from ge2jit.ops.gemm.select import glu_kind, heuristic, kernel_set
from ge2jit.ops.gemm.spec import WGMMA_CONFIGS, DType, DzSpec, WgmmaGemmSpec
from ge2jit.runtime import registry

from ...fake_cupy import FakeArray, make_module

M, K, N = 6, 5, 7


@pytest.fixture()
def fake_cupy(monkeypatch):
    from ge2jit.runtime import arrays, checks

    for module in (problem, checks):
        monkeypatch.setattr(module, "_cupy", lambda: make_module(0))
    monkeypatch.setattr(arrays, "_cupy_mod", make_module(0))
    monkeypatch.setattr(arrays, "current_device", lambda: 0)


def gated(**kw):
    args = dict(a=FakeArray((M, K)), b=FakeArray((K, 2 * N)), bias=None, act="silu", c=None,
                alpha=1.0, beta=0.0, leaky_slope=0.01, out=None, preact_out=None,
                save_preact=False, glu=True)
    args.update(kw)
    return validate(**args)


def test_validation(fake_cupy):
    p = gated(bias=FakeArray((2 * N,)), out=FakeArray((M, N)), save_preact=True,
              preact_out=FakeArray((M, 2 * N)))
    assert (p.m, p.n, p.k) == (M, 2 * N, K) and p.epilogue.glu
    assert p.epilogue.bias is BiasKind.COL and p.epilogue.y_cols(p.n) == N
    with pytest.raises(ge2jit.ArgumentValueError, match=r"b: expected \(K, 2N\)"):
        gated(b=FakeArray((K, 2 * N + 1)))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"b: expected shape \(5, 2N\)"):
        gated(b=FakeArray((K + 1, 2 * N)))
    for bias in (FakeArray((M, 1)), FakeArray((1,))):
        with pytest.raises(ge2jit.ArgumentValueError, match="bias: expected None or shape"):
            gated(bias=bias)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"out: expected shape \(6, 7\)"):
        gated(out=FakeArray((M, 2 * N)))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"preact_out: expected shape \(6, 14\)"):
        gated(save_preact=True, preact_out=FakeArray((M, N)))


def test_epilogue_rules_and_names():
    ep = Epilogue(out_dtype=DType.BF16, act=Act.SILU, bias=BiasKind.COL,
                  bias_dtype=DType.BF16, glu=True)
    assert ep.name(DType.BF16) == "_glu_silu_colbias"
    assert ep.y_cols(10) == 5
    for bad in (dict(layout_c=Layout.ROW, c_dtype=DType.BF16),
                dict(bias=BiasKind.ROW, bias_dtype=DType.BF16),
                dict(bias=BiasKind.SCALAR, bias_dtype=DType.BF16)):
        with pytest.raises(ge2jit.ArgumentValueError, match="Epilogue.glu"):
            Epilogue(out_dtype=DType.BF16, act=Act.SILU, glu=True, **bad)
    with pytest.raises(ge2jit.ArgumentValueError, match="DzSpec.glu"):
        DzSpec(Act.SILU, False, BiasKind.ROW, DType.BF16, DType.BF16, DType.BF16, glu=True)
    spec = DzSpec(Act.NONE, False, BiasKind.COL, DType.BF16, DType.BF16, DType.BF16, glu=True)
    assert spec.reads_src and spec.kernel_name.startswith("gemm_dz_glu_none_z")


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("save_z", [False, True])
@pytest.mark.parametrize("out", [DType.BF16, DType.F32])
@pytest.mark.parametrize("act,bias", [(Act.SILU, BiasKind.COL), (Act.SILU, BiasKind.NONE),
                                      (Act.GELU, BiasKind.NONE)])
def test_hopper_staging(cfg, save_z, out, act, bias):
    """Staged through shared memory where the tile has 128 columns of pairs and fits the
    registers (found by compiling: the compile tests check that those spill nothing); the
    others store from the registers."""
    ep = Epilogue(out_dtype=out, act=act, bias=bias,
                  bias_dtype=None if bias is BiasKind.NONE else DType.BF16, save_z=save_z,
                  glu=True)
    main = kernel_set(DType.BF16, Layout.ROW, Layout.COL, ep, cfg, 1, 4096,
                      (16, 16, 16, 16)).main
    assert isinstance(main, WgmmaGemmSpec) and main.epilogue.glu
    wide = cfg.bn >= 128
    if cfg.bn == 256:   # the cooperative tile: 16-bit Y and Z, no bias, not the erf GELU
        spills = save_z and (cfg.pingpong or out is DType.F32 or bias is BiasKind.COL
                             or act is Act.GELU)
    else:
        spills = save_z and cfg.pingpong and out is DType.F32 and bias is BiasKind.COL
    assert main.store16 == (wide and not spills), main.kernel_name
    if cfg.name == "wgmma_128x256_s4":   # what the heuristic is told
        assert glu_kind(ep) == ("y" if not save_z else "yz" if spills else "yz_wide")
    if cfg.bn < 128:
        with pytest.raises(ge2jit.ArgumentValueError, match="128 accumulator columns"):
            WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, ep, cfg, True, True)


def test_heuristic_for_gated_linear_units():
    by = {c.name: c for c in WGMMA_CONFIGS}
    plain = heuristic(4096, 22016, 4096, 132, 90, "rc", DType.BF16)
    assert plain.config is by["wgmma_128x256_s4"]
    assert heuristic(4096, 22016, 4096, 132, 90, "rc", DType.BF16, glu="y").config is plain.config
    z = heuristic(4096, 22016, 4096, 132, 90, "rc", DType.BF16, glu="yz")
    assert z.config is by["wgmma_128x128_s6_pp"]
    wide = heuristic(4096, 22016, 4096, 132, 90, "rc", DType.BF16, glu="yz_wide")
    assert wide.config is by["wgmma_128x256_s4"]
    for glu in ("yz", "yz_wide"):   # short K: ping-pong, whose epilogue hides
        assert heuristic(16384, 8192, 1024, 132, 90, "rc", DType.BF16,
                         glu=glu).config is by["wgmma_128x128_s6_pp"]
    short = heuristic(16384, 8192, 1024, 132, 90, "rc", DType.BF16, glu="y")
    assert short.config is by["wgmma_64x256_s4_pp"]


def test_heuristic_for_a_gated_units_backward():
    """dH's GEMM that writes the unit's dZ (``glu_grad``): a ping-pong tile, whose consumers
    take turns so that one's epilogue (Z's loads, the derivative) hides under the other's main
    loop: 128x128, or 64x256 where 128x128 would spill staging dZ (the erf GELU)."""
    by = {c.name: c for c in WGMMA_CONFIGS}

    def dz(act, layout_c=Layout.ROW, c_dtype=DType.BF16):
        return Epilogue(out_dtype=DType.BF16, layout_c=layout_c, c_dtype=c_dtype, glu_grad=act)

    assert glu_kind(dz(Act.SILU)) == glu_kind(dz(Act.GELU_TANH)) == "dz"
    assert glu_kind(dz(Act.GELU)) == "dz_256"
    # Z column-major or float32: no tile stages dZ, the plain GEMM's rules apply
    assert glu_kind(dz(Act.SILU, layout_c=Layout.COL)) is None
    assert glu_kind(dz(Act.SILU, c_dtype=DType.F32)) is None
    plain = heuristic(4096, 11008, 4096, 132, 90, "rr", DType.BF16)
    assert plain.config is by["wgmma_128x256_s4"]
    for m, n, k in ((4096, 11008, 4096), (8192, 11008, 4096), (4096, 5632, 2048)):
        ch = heuristic(m, n, k, 132, 90, "rr", DType.BF16, glu="dz")
        assert ch.config is by["wgmma_128x128_s6_pp"] and "dZ" in ch.detail, ch
        ch = heuristic(m, n, k, 132, 90, "rr", DType.BF16, glu="dz_256")
        assert ch.config is by["wgmma_64x256_s4_pp"], ch
        assert not WgmmaGemmSpec.staging_spills(ch.config, dz(Act.GELU))
    # less than a wave of ping-pong tiles: the plain GEMM's choice
    for glu in ("dz", "dz_256"):
        small = heuristic(512, 1024, 4096, 132, 90, "rr", DType.BF16, glu=glu)
        assert small.config is heuristic(512, 1024, 4096, 132, 90, "rr", DType.BF16).config


def test_warmup_tables():
    fwd = registry.warmup_tables()["gemm_gated"]
    entry = fwd.validate_entry({"dtypes": ["bfloat16"], "layouts": ["rc"], "bias": ["col"],
                                "save_preact": [False, True], "configs": "heuristic",
                                "shapes": [[4096, 11008, 4096]], "sms": 132})
    specs = fwd.expand(entry, "sm_90", sms=132)
    names = [s.kernel_name for s in specs]
    assert "gemm_bf16_rc_wgmma_128x256_s4_yt_glu_silu_colbias" in names, names
    assert "gemm_bf16_rc_wgmma_128x128_s6_pp_yt_glu_silu_colbias_z" in names, names
    # without a bias the 128x256 tile stages Y and Z: the kernel a call takes (K >= 2048)
    entry = fwd.validate_entry({"dtypes": ["bfloat16"], "layouts": ["rc"], "bias": ["none"],
                                "save_preact": [True], "configs": "heuristic",
                                "shapes": [[4096, 11008, 4096]], "sms": 132})
    names = [s.kernel_name for s in fwd.expand(entry, "sm_90", sms=132)]
    assert "gemm_bf16_rc_wgmma_128x256_s4_yt_glu_silu_nobias_z" in names, names
    with pytest.raises(ge2jit.ArgumentValueError, match="c: a gated GEMM has no C"):
        fwd.validate_entry({"c": ["r"]})
    with pytest.raises(ge2jit.ArgumentValueError, match="bias: expected"):
        fwd.validate_entry({"bias": ["row"]})
    bwd = registry.warmup_tables()["gemm_gated_backward"]
    entry = bwd.validate_entry({"dtypes": ["bfloat16"], "shapes": [[4096, 11008, 4096]],
                                "sms": 132})
    names = [s.kernel_name for s in bwd.expand(entry, "sm_90", sms=132)]
    assert any(n.startswith("gemm_dz_glu_silu_zbf16_gbf16_dzbf16_colbias") for n in names)
    assert any(n.startswith("gemm_bf16_rc_wgmma_") for n in names)   # dA = dZ @ B.T
    with pytest.raises(ge2jit.ArgumentValueError, match="sources"):
        bwd.validate_entry({"sources": ["y"], "shapes": [[8, 8, 8]]})


def test_registered_with_the_tools():
    op = registry.get("gemm_gated")
    assert op.function is ge2jit.gemm_gated
    specs = op.specs_for_config("wgmma_128x256_s4", "sm_90", dtype="bfloat16", layouts="rc")
    assert specs[0].kernel_name == "gemm_bf16_rc_wgmma_128x256_s4_yt_glu_silu_nobias"
    assert registry.get("gemm_gated_backward").function is ge2jit.gemm_gated_backward


def test_interleave_and_split_numpy():
    gate = np.arange(12, dtype=np.float32).reshape(3, 4)
    up = -gate - 1
    w = ge2jit.interleave_gate_up(gate, up)
    assert w.shape == (3, 8) and w.flags.c_contiguous
    assert np.array_equal(w[:, 0::2], gate) and np.array_equal(w[:, 1::2], up)
    g, u = ge2jit.split_gate_up(w)
    assert np.array_equal(g, gate) and np.array_equal(u, up)
    b = ge2jit.interleave_gate_up(gate[0], up[0])
    assert b.tolist() == [0, -1, 1, -2, 2, -3, 3, -4]
    with pytest.raises(ge2jit.ArgumentValueError, match="up: expected gate's shape"):
        ge2jit.interleave_gate_up(gate, up[:, :3])
    with pytest.raises(ge2jit.ArgumentValueError, match="b: expected a"):
        ge2jit.split_gate_up(np.zeros((3, 5)))


def test_glu_grad_epilogue():
    ep = Epilogue(out_dtype=DType.BF16, layout_c=Layout.ROW, c_dtype=DType.BF16,
                  glu_grad=Act.SILU)
    assert ep.y_cols(8) == 16 and ep.name(DType.BF16) == "_none_nobias_dglusilu_cr"
    with pytest.raises(ge2jit.ArgumentValueError, match="Epilogue.glu_grad"):
        Epilogue(out_dtype=DType.BF16, glu_grad=Act.SILU)   # no C
    with pytest.raises(ge2jit.ArgumentValueError, match="Epilogue.glu_grad"):
        Epilogue(out_dtype=DType.BF16, layout_c=Layout.ROW, c_dtype=DType.BF16,
                 glu_grad=Act.SILU, save_z=True)
    for cfg in WGMMA_CONFIGS:   # staged (see below), C read from memory, not the ring
        main = kernel_set(DType.BF16, Layout.ROW, Layout.ROW, ep, cfg, 1, 4096,
                          (16, 16, 16, 16)).main
        assert main.store16 and not main.c_tma and main.vec_y


def test_backward_warmup_a_glu():
    """[[gemm_bias_act_backward]] with a_glus: the layer after a gated unit, whose dA GEMM
    writes the unit's dZ, and the pass that sums it for the unit's bias."""
    table = registry.warmup_tables()["gemm_bias_act_backward"]
    entry = table.validate_entry({"dtypes": ["bfloat16"], "acts": ["none"], "bias": ["none"],
                                  "a_glus": ["silu"], "a_bias": [True],
                                  "shapes": [[4096, 4096, 11008]], "sms": 132})
    names = [s.kernel_name for s in table.expand(entry, "sm_90", sms=132)]
    # dH's GEMM: the ping-pong tile that a call takes (see the heuristic's test above)
    assert any(n.startswith("gemm_bf16_rc_wgmma_128x128_s6_pp_") and n.endswith("_dglusilu_cr")
               for n in names), names
    assert "gemm_dz_none_zbf16_gbf16_colbias" in names, names
    with pytest.raises(ge2jit.ArgumentValueError, match="a_glus"):
        table.validate_entry({"a_glus": ["swish"], "shapes": [[8, 8, 8]]})


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: c.name)
def test_hopper_staging_of_the_backward(cfg):
    """A gated unit's dZ (``glu_grad``) is formed in the staging blocks from Z copied there
    where Z is row-major, of the 16-bit output type, with 16-byte aligned rows; else it goes
    from the registers."""
    def main(c_dtype=DType.BF16, layout_c=Layout.ROW, align_c=16, act=Act.SILU):
        ep = Epilogue(out_dtype=DType.BF16, layout_c=layout_c, c_dtype=c_dtype, glu_grad=act)
        return kernel_set(DType.BF16, Layout.ROW, Layout.ROW, ep, cfg, 1, 4096,
                          (16, 16, 16, align_c)).main

    assert main().store16 and main().tma_store
    assert not main(align_c=4).store16
    assert not main(layout_c=Layout.COL).store16
    assert not main(c_dtype=DType.F32).store16
    assert main(act=Act.GELU).store16 == (cfg.name != "wgmma_128x128_s6_pp")

