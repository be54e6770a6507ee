"""The rope kernel without a GPU: every spec renders, a pairwise covering set of the spec's
fields (every dtype and every vec among them) and the variants that hold the most registers
compile for sm_80 and sm_90 within 64 registers and without spills (the full product: ``-m
slow``); ``make_spec``'s and ``check_fits``' one-line refusals; ``launch_geometry`` and
``max_vec``; and the float64 reference against the complex formulation ``(x1 + i x2)
e^(i theta)`` of both layouts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from allpairspy import AllPairs

from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.jit.render import render
from ge2jit.ops.rope.reference import rope_reference
from ge2jit.ops.rope.spec import (
    DEFAULT_THREADS,
    MAX_TOKEN_LANES,
    RopeSpec,
    check_fits,
    launch_geometry,
    make_spec,
    max_vec,
)
from ge2jit.runtime.dtypes import DType
from ge2jit.runtime.rows import GRID_MAX

from ...kernel_checks import check_clean_build

ARCHS = ["sm_80", "sm_90"]
DTYPES = ["float32", "float16", "bfloat16"]
VECS = {"float32": (1, 2, 4), "float16": (1, 2, 4, 8), "bfloat16": (1, 2, 4, 8)}
#: every spec field; (dtype, vec) together, as the vecs a dtype allows differ
FIELDS = {
    "dtype_vec": [(d, v) for d in DTYPES for v in VECS[d]],
    "table": DTYPES,
    "positions": [None, "int32", "int64"],
    "interleaved": [False, True],
    "backward": [False, True],
    "copy_rest": [False, True],
    "arch": ARCHS,
}


def _spec(p: dict) -> RopeSpec:
    dtype, vec = p["dtype_vec"]
    return make_spec(dtype, p["table"], positions=p["positions"], interleaved=p["interleaved"],
                     backward=p["backward"], copy_rest=p["copy_rest"], vec=vec)


def covering_set(params: dict) -> list[dict]:
    order = sorted(params, key=lambda k: -len(params[k]))
    return [dict(zip(order, row)) for row in AllPairs([params[k] for k in order])]


def full_product(params: dict) -> list[dict]:
    return [dict(zip(params, row)) for row in itertools.product(*params.values())]


COVERING = covering_set(FIELDS)
#: the variants that hold the most registers (the widest accesses, int64 positions, the copy
#: of the rest), every type pair, both layouts and architectures
HEAVIEST = [{"dtype_vec": (d, VECS[d][-1]), "table": t, "positions": "int64", "interleaved": i,
             "backward": True, "copy_rest": True, "arch": a}
            for d, t, i, a in itertools.product(DTYPES, DTYPES, [False, True], ARCHS)]
ALL_SPECS = sorted({_spec(p) for p in full_product(FIELDS)}, key=lambda s: s.kernel_name)


# ---- specs, rendering and compiles

def test_covering_set_covers_every_pair():
    for x, y in itertools.combinations(FIELDS, 2):
        seen = {(r[x], r[y]) for r in COVERING}
        for pair in itertools.product(FIELDS[x], FIELDS[y]):
            assert pair in seen, (x, y, pair)


def test_every_spec_renders_with_a_unique_name():
    assert len(ALL_SPECS) == 11 * 3 * 3 * 2 * 2 * 2
    assert len({s.kernel_name for s in ALL_SPECS}) == len(ALL_SPECS)
    for s in ALL_SPECS:
        src = render(s)
        assert src.startswith(f"// {s.kernel_name}\n")
        assert f"void __launch_bounds__(THREADS, 1024 / THREADS)\n{s.kernel_name}(" in src
        assert "{{" not in src and "{%" not in src
        assert f"constexpr int VEC = {s.vec};" in src
    s = make_spec("bfloat16", "float32", positions="int64", interleaved=True, backward=True,
                  copy_rest=True, vec=8)
    assert s.kernel_name == "rope_bwd_gptj_bf16_csf32_pos64_copy_x8_t256"
    assert make_spec("float32").kernel_name == "rope_fwd_neox_f32_csf32_nopos_keep_x1_t256"


@pytest.mark.parametrize("p", COVERING + HEAVIEST,
                         ids=lambda p: f"{_spec(p).kernel_name}-{p['arch']}")
def test_covering_set_compiles_without_spills(p, compile_cache):
    # the launch bounds ask for 1024 threads per multiprocessor: 64 registers
    check_clean_build(_spec(p), p["arch"], compile_cache, max_registers=64, max_shared=0)


@pytest.mark.slow
def test_every_spec_compiles_without_spills(tmp_path):
    """Every field combination (792 kernels) for both architectures."""
    from ge2jit.jit.parallel import compile_many

    outcomes = compile_many([(s, a) for s in ALL_SPECS for a in ARCHS], cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes or o.stack_bytes
           or not 0 < o.registers <= 64]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.registers) for o in bad[:20]]


def test_params_in_order():
    s = make_spec("float16", "float32", positions="int64")
    names = [p.name for p in s.params]
    assert names == ["q", "k", "q_out", "k_out", "cos", "sin", "positions", "tokens", "seq",
                     "hq", "hk", "head_dim", "half", "table_rows", "qb", "qs", "qh", "kb",
                     "ks", "kh", "qob", "qos", "qoh", "kob", "kos", "koh", "cb", "cr", "sb",
                     "sr", "pb", "ps"]
    decl = {p.name: p.declaration for p in s.params}
    assert decl["q"] == "const f16_t* q" and decl["q_out"] == "f16_t* q_out"
    assert decl["cos"] == "const float* __restrict__ cos"
    assert decl["positions"] == "const long long* __restrict__ positions"
    assert make_spec("float32").params[6].declaration == "const int* __restrict__ positions"


# ---- refusals

@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "float64"}, r"^dtype: expected one of float32, float16, bfloat16, got "),
    ({"dtype": "float32", "table_dtype": "int8"}, r"^table_dtype: expected one of float32"),
    ({"dtype": "float32", "positions": "int16"},
     r"^positions: expected None, int32 or int64, got 'int16'"),
    ({"dtype": "float32", "positions": 3}, r"^positions: expected None, int32 or int64"),
    ({"dtype": "float32", "interleaved": "yes"}, r"^interleaved: expected a bool, got 'yes'"),
    ({"dtype": "float32", "backward": 1}, r"^backward: expected a bool, got 1"),
    ({"dtype": "float32", "copy_rest": None}, r"^copy_rest: expected a bool, got None"),
    ({"dtype": "float32", "vec": 8},
     r"^vec: expected 1, 2, 4 or 8 elements of at most 16 bytes \(4 of float32\), got 8"),
    ({"dtype": "bfloat16", "vec": 3}, r"^vec: expected 1, 2, 4 or 8 .*\(8 of bfloat16\), got 3"),
    ({"dtype": "bfloat16", "vec": 16}, r"^vec: .* got 16"),
    ({"dtype": "bfloat16", "vec": True}, r"^vec: .* got True"),
    ({"dtype": "bfloat16", "vec": 2.0}, r"^vec: .* got 2.0"),
    ({"dtype": "float16", "threads": 100},
     r"^threads: expected one of 32, 64, 128, 256, 512, 1024, got 100"),
    ({"dtype": "float16", "threads": 2048}, r"^threads: .* got 2048"),
])
def test_make_spec_refuses_in_one_line(kwargs, match):
    with pytest.raises(ArgumentValueError, match=match) as e:
        make_spec(**kwargs)
    assert "\n" not in str(e.value)


def test_make_spec_defaults_and_dtype_forms():
    s = make_spec(np.float16, positions=np.dtype("int32"), interleaved=np.bool_(True))
    assert s == RopeSpec(DType.F16, DType.F16, "int32", True, False, False, 1, DEFAULT_THREADS)
    assert make_spec("bfloat16", np.float32, positions=np.int64).positions == "int64"
    assert make_spec(DType.F32, threads=128, vec=4).threads == 128


def test_spec_itself_refuses_what_the_kernel_cannot_take():
    with pytest.raises(TypeError):
        RopeSpec("float32", DType.F32)
    with pytest.raises(ArgumentValueError, match=r"RopeSpec.dtype: expected float32, float16"):
        RopeSpec(DType.E4M3, DType.F32)
    with pytest.raises(ArgumentValueError, match=r"RopeSpec.vec"):
        RopeSpec(DType.F32, DType.F32, vec=8)
    with pytest.raises(ArgumentValueError, match=r"RopeSpec.positions"):
        RopeSpec(DType.F32, DType.F32, positions="int8")
    with pytest.raises(ArgumentValueError, match=r"RopeSpec.threads"):
        RopeSpec(DType.F32, DType.F32, threads=96)
    with pytest.raises(ArgumentTypeError, match=r"RopeSpec.interleaved: expected bool, got 1"):
        RopeSpec(DType.F32, DType.F32, interleaved=1)


@pytest.mark.parametrize("vec, copy_rest, half, d, match", [
    (1, False, 0, 8, r"^half: expected at least 1 rotated pair, got 0"),
    (1, False, 5, 8, r"^half: the rotary dimension 2 \* 5 exceeds the head dimension 8"),
    (4, False, 6, 12, r"^half: 6 pairs are not whole chunks of the spec's vec \(4\)"),
    (4, True, 4, 12, None),
    (4, True, 4, 10, r"^head_dim: 10 is not a multiple of the spec's vec \(4\)"),
    (4, False, 4, 10, None),          # in place: the rest is not touched
    (8, False, 64, 128, None),
])
def test_check_fits(vec, copy_rest, half, d, match):
    spec = make_spec("bfloat16", copy_rest=copy_rest, vec=vec)
    if match is None:
        check_fits(spec, half, d)
        return
    with pytest.raises(ArgumentValueError, match=match) as e:
        check_fits(spec, half, d)
    assert "\n" not in str(e.value)


# ---- launch shape

def _covered(grid, block, tokens, heads, chunks):
    """How many times the kernel's loops visit each (token, head, chunk), as rope.cu walks
    them (a Python transcription of its three loops)."""
    seen = {}
    bx, by, bz = block
    for blk in range(grid[0]):
        for x, y, z in itertools.product(range(bx), range(by), range(bz)):
            for tok in range(blk * bz + z, tokens, grid[0] * bz):
                for c in range(x, chunks, bx):
                    for h in range(y, heads, by):
                        seen[tok, h, c] = seen.get((tok, h, c), 0) + 1
    return seen


@pytest.mark.parametrize("dtype, vec, tokens, heads, half", [
    ("bfloat16", 8, 5, 40, 64), ("bfloat16", 8, 3, 64, 64), ("float32", 4, 4, 40, 64),
    ("float16", 1, 3, 3, 20), ("bfloat16", 2, 7, 1, 2), ("float32", 1, 2, 2, 300),
    ("bfloat16", 8, 200, 2, 8),
])
def test_launch_geometry_covers_every_chunk_once(dtype, vec, tokens, heads, half):
    spec = make_spec(dtype, vec=vec)
    grid, block = launch_geometry(spec, tokens, heads, half)
    chunks = half // vec
    seen = _covered(grid, block, tokens, heads, chunks)
    assert seen == {k: 1 for k in itertools.product(range(tokens), range(heads),
                                                    range(chunks))}


def test_launch_geometry_shapes():
    bf16 = make_spec("bfloat16", vec=8)
    # LLaMA (Hq = 32, Hk = 8, D = 128): 8 chunk lanes, 40 heads in 2 rounds of 20 lanes
    assert launch_geometry(bf16, 4096, 40, 64) == ((4096, 1, 1), (8, 20, 1))
    assert launch_geometry(bf16, 4096, 64, 64) == ((4096, 1, 1), (8, 32, 1))
    assert launch_geometry(bf16, 10, 33, 64) == ((10, 1, 1), (8, 17, 1))
    # float32: 16 chunk lanes, 40 heads in 3 rounds of 14 lanes
    assert launch_geometry(make_spec("float32", vec=4), 7, 40, 64) == ((7, 1, 1), (16, 14, 1))
    # few work items per token: several tokens a block (at most 64)
    assert launch_geometry(bf16, 1000, 2, 8) == ((16, 1, 1), (1, 2, 64))
    assert launch_geometry(bf16, 1000, 4, 32) == ((63, 1, 1), (4, 4, 16))
    assert launch_geometry(bf16, 3, 4, 32) == ((1, 1, 1), (4, 4, 3))
    # more chunks than threads: the kernel loops over them
    assert launch_geometry(make_spec("float32"), 5, 8, 1024) == ((5, 1, 1), (256, 1, 1))
    # no tokens, no heads: a valid (empty) launch
    assert launch_geometry(bf16, 0, 0, 64) == ((1, 1, 1), (8, 1, 1))
    # the grid stops at 2^31 - 1 blocks (the kernel walks the rest)
    assert launch_geometry(bf16, 2**40, 40, 64)[0] == (GRID_MAX, 1, 1)


@pytest.mark.parametrize("threads", [32, 128, 256, 1024])
def test_launch_geometry_limits(threads):
    for tokens, heads, half, vec in itertools.product([1, 3, 1000, 2**33], [1, 2, 5, 40, 96],
                                                      [1, 8, 64, 200, 4096], [1, 8]):
        if half % vec:
            continue
        grid, (bx, by, bz) = launch_geometry(make_spec("bfloat16", vec=vec, threads=threads),
                                             tokens, heads, half)
        assert 1 <= grid[0] <= GRID_MAX and grid[1:] == (1, 1)
        assert bx * by * bz <= threads and 1 <= bz <= MAX_TOKEN_LANES
        assert grid[0] * bz >= min(tokens, GRID_MAX * bz)
        # the fewest rounds of head lanes, as even as they can be: the lanes of the token's
        # threads hold no more heads than rounds - 1 beyond the heads
        rounds = -(-heads // (threads // bx))
        assert -(-heads // by) == rounds and by * rounds - heads < rounds
        assert bx == min(half // vec, threads)


# ---- max_vec

ALIGNED = 0x10000


@pytest.mark.parametrize("kwargs, want", [
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128}, 8),
    ({"dtype": "float16", "table_dtype": "float32", "half": 64, "head_dim": 128}, 8),
    ({"dtype": "float32", "half": 64, "head_dim": 128}, 4),
    ({"dtype": "bfloat16", "half": 12, "head_dim": 24}, 4),
    ({"dtype": "bfloat16", "half": 3, "head_dim": 6}, 1),
    ({"dtype": "bfloat16", "half": 32, "head_dim": 100}, 8),                   # in place
    ({"dtype": "bfloat16", "half": 32, "head_dim": 100, "copy_rest": True}, 4),
    ({"dtype": "bfloat16", "half": 32, "head_dim": 99, "copy_rest": True}, 1),
    # pointers and strides
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128,
      "arrays": [(ALIGNED, (40 * 128, 128)), (ALIGNED + 4, (8 * 128, 128))]}, 2),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128,
      "arrays": [(ALIGNED, (40 * 132, 132))]}, 4),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128,
      "arrays": [(ALIGNED, (40 * 131, 131))]}, 1),
    ({"dtype": "float32", "half": 64, "head_dim": 128, "arrays": [(ALIGNED + 8, ())]}, 2),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128, "arrays": [(ALIGNED, (0, 128))]}, 8),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128, "arrays": [(ALIGNED, (-128,))]}, 8),
    # tables: their own item size (a float32 table at vec 8 needs 16-byte alignment)
    ({"dtype": "bfloat16", "table_dtype": "float32", "half": 64, "head_dim": 128,
      "tables": [(ALIGNED, (64,)), (ALIGNED + 8, (64,))]}, 2),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128,
      "tables": [(ALIGNED, (0, 68))]}, 4),
    ({"dtype": "bfloat16", "half": 64, "head_dim": 128,
      "tables": [(ALIGNED + 8, (64,))]}, 4),
])
def test_max_vec(kwargs, want):
    got = max_vec(**kwargs)
    assert got == want
    # the widest allowed is a spec that fits
    spec = make_spec(kwargs["dtype"], kwargs.get("table_dtype"), vec=got,
                     copy_rest=kwargs.get("copy_rest", False))
    check_fits(spec, kwargs["half"], kwargs["head_dim"])


# ---- the reference

_rng = np.random.default_rng(7)


def _complex_rope(x, theta, half, interleaved):
    """The rotation as complex products: (x1 + i x2) e^(i theta), theta (B, S, half)."""
    out = x.copy()
    lo, hi = ((slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved
              else (slice(0, half), slice(half, 2 * half)))
    z = (x[..., lo] + 1j * x[..., hi]) * np.exp(1j * theta)[:, :, None, :]
    out[..., lo], out[..., hi] = z.real, z.imag
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("positions", ["none", "1d", "2d"])
def test_reference_is_the_complex_rotation(interleaved, positions):
    b, s, hq, hk, d, half, rows = 2, 5, 3, 2, 12, 4, 9
    theta_table = _rng.uniform(-10, 10, (rows, half))
    q = _rng.standard_normal((b, s, hq, d))
    k = _rng.standard_normal((b, s, hk, d))
    pos = {"none": None, "1d": _rng.integers(0, rows, s),
           "2d": _rng.integers(0, rows, (b, s)).astype(np.int32)}[positions]
    qo, ko = rope_reference(q, k, np.cos(theta_table), np.sin(theta_table),
                            interleaved=interleaved, positions=pos)
    idx = np.broadcast_to(np.arange(s) if pos is None else pos, (b, s))
    theta = theta_table[idx]
    np.testing.assert_allclose(qo, _complex_rope(q, theta, half, interleaved), atol=1e-12)
    np.testing.assert_allclose(ko, _complex_rope(k, theta, half, interleaved), atol=1e-12)
    assert np.array_equal(qo[..., 2 * half:], q[..., 2 * half:])
    # backward: the opposite angle, the inverse rotation
    bq, bk = rope_reference(qo, ko, np.cos(theta_table), np.sin(theta_table),
                            interleaved=interleaved, positions=pos, backward=True)
    np.testing.assert_allclose(bq, q, atol=1e-12)
    np.testing.assert_allclose(bk, k, atol=1e-12)
    np.testing.assert_allclose(bq, _complex_rope(qo, -theta, half, interleaved), atol=1e-12)


def test_reference_batched_tables_missing_rows_and_no_k():
    b, s, h, d, half, rows = 3, 4, 2, 8, 4, 6
    theta = _rng.uniform(-3, 3, (b, rows, half))
    q = _rng.standard_normal((b, s, h, d)).astype(np.float32)
    pos = np.array([[0, 5, 6, -1], [2, 3, 4, 5], [10**12, 0, 1, 2]], np.int64)
    qo, ko = rope_reference(q, None, np.cos(theta), np.sin(theta), positions=pos)
    assert ko is None and qo.dtype == np.float64
    bad = (pos < 0) | (pos >= rows)
    assert np.isnan(qo[bad][..., :2 * half]).all()
    assert not np.isnan(qo[~bad]).any()
    assert np.array_equal(qo[..., 2 * half:], q[..., 2 * half:])    # passed through, also bad
    good = np.where(bad, 0, pos)
    want = _complex_rope(q.astype(np.float64), theta[np.arange(b)[:, None], good], half, False)
    np.testing.assert_allclose(qo[~bad], want[~bad], atol=1e-12)
    # a 3-D table of one batch is the 2-D one
    one, _ = rope_reference(q, None, np.cos(theta[:1]), np.sin(theta[:1]), interleaved=True)
    two, _ = rope_reference(q, None, np.cos(theta[0]), np.sin(theta[0]), interleaved=True)
    assert np.array_equal(one, two)
