"""rms_norm and layer_norm without a GPU: a pairwise covering set of every kernel variant
(kind x config x the types of x, y, the residual, h, the weight and bias x statistics x access
width, and for the backward dy, h, the weight, bias and dh) and every kernel the heuristics
choose compile for sm_80 and sm_90 without spilling and without stack; the config names, the
heuristics, the candidates and the launch shapes; the layout analysis; every argument check
(on stand-in arrays, ``tests/fake_cupy.py``); the launches a call makes, with a recording
launcher (parameters, grid, the prepared path, copies, empty calls); the warm-up tables."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from allpairspy import AllPairs

import ge2jit
from ge2jit import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from ge2jit.jit.cache import KernelCache
from ge2jit.jit.params import layout
from ge2jit.jit.render import render
from ge2jit.ops.norm import op as norm_op
from ge2jit.ops.norm.op import row_layout
from ge2jit.ops.norm.spec import (
    BackwardTypes,
    ForwardTypes,
    NormBackwardConfig,
    NormBackwardSpec,
    NormConfig,
    NormSpec,
    NormSumsSpec,
    all_backward_configs,
    all_configs,
    backward_candidates,
    backward_heuristic,
    candidates,
    choose,
    choose_backward,
    heuristic,
    make_backward_spec,
    make_spec,
    parse_backward_config,
    parse_config,
    sums_shape,
)
from ge2jit.runtime import arrays, checks
from ge2jit.runtime.dtypes import FLOAT_DTYPES, DType
from ge2jit.runtime.rows import vector_width

from ...compiled import check_compiled
from ...fake_cupy import FakeArray, make_module

ARCHS = ["sm_80", "sm_90"]
F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
LENGTHS = sorted({1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65, 127, 128, 129, 256, 257,
                  512, 513, 777, 1000, 1024, 1025, 2048, 2049, 4096, 4097, 8192, 8193, 12345,
                  16384, 16385, 32768, 65536, 131072})
ROW_COUNTS = [1, 3, 1000, 100_000]
#: the lengths at the edges of the heuristics' choices (their kernels are compiled)
EDGES = [1, 3, 8, 33, 128, 129, 256, 257, 512, 513, 1000, 4096, 4097, 8192, 8193, 16384, 16385]
#: representative type sets: x, y, residual, h, weight, bias (for LayerNorm), statistics
TYPE_SETS = [(BF16, BF16, None, None, BF16, BF16, False),
             (BF16, BF16, BF16, BF16, F32, F32, True),
             (F32, F32, F32, F32, F32, F32, True),
             (F16, F32, F32, F32, F16, None, False),
             (BF16, BF16, F32, F32, None, None, True)]


def forward_types(kind: str, ts) -> ForwardTypes:
    x, y, r, h, w, b, stats = ts
    return ForwardTypes(x, y, r, h, w, b if kind == "layer" else None, stats)


def backward_types(kind: str, ts) -> BackwardTypes:
    """The backward of a forward's types: dy of y's type, h of h's (x's), dh with a residual."""
    x, y, r, h, w, b, _ = ts
    return BackwardTypes(y, h or x, h or x, w, b if kind == "layer" else None, h)


# ---- configs and names

@pytest.mark.parametrize("configs, parse", [(all_configs(), parse_config),
                                            (all_backward_configs(), parse_backward_config)])
def test_config_names_round_trip(configs, parse):
    assert len({c.name for c in configs}) == len(configs)
    for c in configs:
        assert parse(c.name) == c and parse(c) is c and str(c) == c.name
    assert {c.variant for c in configs} == {"warp", "block", "loop"}


@pytest.mark.parametrize("name, match", [
    ("", "expected a normalization variant name such as 'warp32_v8_r2'"),
    ("warp32_v8", "expected a normalization variant name"),
    ("strided_256", "expected a normalization variant name"),
    (" block_512_v8", "expected a normalization variant name"),
    (5, "expected a normalization variant name"),
    ("warp32_v32_r1", r"values per thread \(_vV\) must be one of 4, 8, 16, got 32"),
    ("warp32_v16_r2", "holds 32 values per thread; at most 16"),
    ("warp3_v4_r1", r"lanes per row \(warpG\) must be one of 1, 2, 4, 8, 16, 32, got 3"),
    ("warp32_v4_r4", r"rows per lane group \(_rR\) must be one of 1, 2, got 4"),
    ("block_100_v8", r"threads \(block_T\) must be one of 128, 256, 512, 1024, got 100"),
    ("block_1024_v32", r"values per thread \(_vV\) must be one of 8, 16, got 32"),
    ("loop_128", r"threads \(loop_T\) must be one of 256, 512, 1024, got 128"),
])
def test_bad_config_names_are_refused_in_one_line(name, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match) as e:
        parse_config(name)
    assert str(e.value).startswith("config: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("name, match", [
    ("warp32_v8_r2", r"rows per lane group \(_rR\) must be one of 1, got 2"),
    ("block_1024_v16", r"values per thread \(_vV\) must be one of 4, 8, got 16"),
    ("warp32_v16_r1", r"values per thread \(_vV\) must be one of 4, 8, got 16"),
    ("fast", "expected a normalization backward variant name such as 'warp32_v8_r1'"),
])
def test_bad_backward_config_names_are_refused_in_one_line(name, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match) as e:
        parse_backward_config(name)
    assert "\n" not in str(e.value)


def test_pinned_configs_must_hold_the_rows():
    t = forward_types("rms", TYPE_SETS[0])
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: warp32_v16_r1 holds rows of at most 512 elements, got "
                             "rows of 513"):
        choose("rms", 10, 513, t, config="warp32_v16_r1")
    assert choose("rms", 10, 512, t, config="warp32_v16_r1").spec.config.name == "warp32_v16_r1"
    assert choose("layer", 1, 10**9, t, config="loop_256").spec.config.variant == "loop"
    bt = backward_types("layer", TYPE_SETS[1])
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: block_1024_v8 holds rows of at most 8192 elements"):
        choose_backward("layer", 10, 8193, bt, config="block_1024_v8")
    assert choose_backward("layer", 10, 10**6, bt, config="loop_512").block == (512, 1, 1)


# ---- heuristics

@pytest.mark.parametrize("n, variant", [(1, "warp"), (33, "warp"), (512, "warp"),
                                        (513, "block"), (16384, "block"), (16385, "loop"),
                                        (10**7, "loop")])
def test_heuristic_variant_by_length(n, variant):
    for ts in TYPE_SETS:
        assert heuristic(1000, n, forward_types("layer", ts)).variant == variant


@pytest.mark.parametrize("n, variant", [(1, "warp"), (256, "warp"), (257, "block"),
                                        (8192, "block"), (8193, "loop"), (10**6, "loop")])
def test_backward_heuristic_variant_by_length(n, variant):
    for ts in TYPE_SETS:
        assert backward_heuristic(n, backward_types("rms", ts)).variant == variant


@pytest.mark.parametrize("ts", TYPE_SETS, ids=str)
def test_heuristic_choices_fit_and_are_candidates(ts):
    for kind in ("rms", "layer"):
        t, bt = forward_types(kind, ts), backward_types(kind, ts)
        for n, rows in itertools.product(LENGTHS, ROW_COUNTS):
            c = choose(kind, rows, n, t, 132)
            cfg = c.config
            assert cfg.capacity is None or n <= cfg.capacity, (n, cfg)
            assert cfg in candidates(n), (n, cfg)
            assert c.spec.vec == (t.width if cfg.variant == "loop" else min(t.width, cfg.vpt))
            # the grid covers every row (the kernels loop past 2**31 - 1 blocks)
            assert c.grid[0] * cfg.rows_per_block >= rows and c.grid[0] <= 2**31 - 1
            assert (c.grid[0] - 1) * cfg.rows_per_block < rows
            assert c.block == (cfg.threads, 1, 1)
            b = choose_backward(kind, rows, n, bt, 132, 2)
            assert b.config in backward_candidates(n), (n, b.config)
            assert b.config.capacity is None or n <= b.config.capacity
            # resident blocks, and never more blocks than rows to walk (the loop variant's
            # blocks take LOOP_BACKWARD_ROWS at a time)
            per = b.spec.loop_rows if b.config.variant == "loop" else b.config.rows_per_block
            assert b.grid[0] == min(-(-rows // per), 132 * 2)
            for v in (1, 2, 4):
                assert choose(kind, rows, n, t, 132, max_vec=v).spec.vec <= v
                assert choose_backward(kind, rows, n, bt, 132, 2, max_vec=v).spec.vec <= v


def test_warp_rows_per_group_leave_every_multiprocessor_8_blocks():
    t32 = forward_types("rms", TYPE_SETS[2])
    t16 = forward_types("rms", TYPE_SETS[0])
    assert heuristic(10**6, 128, t32, sm_count=132).name == "warp32_v4_r2"
    assert heuristic(8 * 132 * 8, 128, t32, sm_count=132).name == "warp32_v4_r2"
    assert heuristic(8 * 132 * 8 - 8, 128, t32, sm_count=132).name == "warp32_v4_r1"
    assert heuristic(10**6, 128, t16, sm_count=132).name == "warp16_v8_r2"
    assert heuristic(10**6, 500, t16).name == "warp32_v16_r1"
    assert heuristic(10**6, 3, t32).name == "warp1_v4_r2"


def test_block_and_loop_shapes():
    t = forward_types("layer", TYPE_SETS[0])
    assert heuristic(1000, 1000, t).name == "block_128_v8"
    assert heuristic(1000, 4096, t).name == "block_512_v8"
    assert heuristic(1000, 4097, t).name == "block_512_v16"
    assert heuristic(1000, 16384, t).name == "block_1024_v16"
    assert heuristic(1000, 16385, t).name == "loop_1024"
    bt = backward_types("layer", TYPE_SETS[0])
    assert backward_heuristic(100, bt).name == "warp16_v8_r1"
    assert backward_heuristic(1000, bt).name == "block_128_v8"
    assert backward_heuristic(8192, bt).name == "block_1024_v8"
    assert backward_heuristic(8193, bt).name == "loop_1024"
    # the loop variants' values per step: two accesses a row array, one in the backward
    assert choose("layer", 3, 10**6, t).spec.vpt == 16
    assert choose("layer", 3, 10**6, t, max_vec=1).spec.vpt == 8
    assert choose_backward("layer", 3, 10**6, bt).spec.vpt == 8
    assert choose_backward("layer", 3, 10**6, bt, max_vec=1).spec.vpt == 4


def test_candidates_hold_the_rows_and_include_every_loop():
    for n in LENGTHS:
        for cands in (candidates(n), backward_candidates(n)):
            assert all(c.capacity is None or n <= c.capacity for c in cands)
            assert {c.name for c in cands if c.variant == "loop"} == {
                "loop_256", "loop_512", "loop_1024"}
    assert all(c.capacity <= 4096 for c in candidates(1000) if c.capacity)


def test_sums_shape():
    bt = backward_types("layer", TYPE_SETS[1])
    assert sums_shape(1000, bt) == ((32, 2, 1), (1024, 1, 1))
    assert sums_shape(33, backward_types("rms", TYPE_SETS[1])) == ((2, 1, 1), (1024, 1, 1))


# ---- specs

def test_specs_refuse_what_the_kernels_cannot_take():
    t = forward_types("layer", TYPE_SETS[2])
    cfg = parse_config("block_256_v8")
    with pytest.raises(ge2jit.ArgumentValueError, match=r"NormSpec.vec: expected 1, 2, 4 or 8 "
                                                        r"elements of at most 16 bytes"):
        NormSpec("layer", t, cfg, 8)            # 32-byte float32 accesses
    with pytest.raises(ge2jit.ArgumentValueError, match="NormSpec: RMSNorm takes no bias"):
        NormSpec("rms", t, cfg, 4)
    with pytest.raises(ge2jit.ArgumentValueError, match="kind: expected one of rms, layer"):
        NormSpec("group", t, cfg, 4)
    with pytest.raises(TypeError):
        NormSpec("layer", t, parse_backward_config("block_256_v8"), 4)
    with pytest.raises(ge2jit.ArgumentValueError, match="a residual and h come together"):
        ForwardTypes(F32, F32, F32, None)
    with pytest.raises(TypeError):
        ForwardTypes("float32", F32)
    with pytest.raises(ge2jit.ArgumentValueError, match="NormBackwardSpec: RMSNorm takes no"):
        NormBackwardSpec("rms", backward_types("layer", TYPE_SETS[2]),
                         parse_backward_config("loop_256"), 4)
    with pytest.raises(ge2jit.ArgumentValueError, match="nothing to add up"):
        NormSumsSpec("rms", None, None)


def test_kernel_names_are_unique_per_specialization():
    specs = {make_spec(k, c, forward_types(k, ts), v) for k in ("rms", "layer")
             for c in all_configs() for ts in TYPE_SETS for v in (1, 2, 4, 8)}
    specs |= {make_backward_spec(k, c, backward_types(k, ts), v) for k in ("rms", "layer")
              for c in all_backward_configs() for ts in TYPE_SETS for v in (1, 2, 4, 8)}
    assert len({s.kernel_name for s in specs}) == len(specs)
    s = make_spec("layer", parse_config("block_1024_v16"), forward_types("layer", TYPE_SETS[1]))
    assert s.kernel_name == "layer_norm_block1024_v16_x8_bf16_rbf16hbf16_ybf16_wf32_bf32_stats"
    assert render(s).startswith(f"// {s.kernel_name}")
    b = make_backward_spec("rms", parse_backward_config("loop_1024"),
                           backward_types("rms", TYPE_SETS[3]), 2)
    assert b.kernel_name == "rms_norm_backward_loop1024_v4_x2_dyf32_hf32_dxf32_wf16_dhf32"
    assert NormSumsSpec("layer", BF16, F32).kernel_name == "layer_norm_backward_sums_wbf16_bf32"


def test_loop_backward_sums_in_shared_memory_where_they_fit():
    loop = parse_backward_config("loop_1024")
    lt, rt = backward_types("layer", TYPE_SETS[1]), backward_types("rms", TYPE_SETS[1])
    s = make_backward_spec("layer", loop, lt, 8, 9000)
    assert (s.smem_cols, s.smem_bytes) == (16384, 2 * 4 * 16384)
    assert s.kernel_name.endswith("_s16384")
    assert make_backward_spec("rms", loop, rt, 8, 20000).smem_cols == 32768   # one array
    assert make_backward_spec("layer", loop, lt, 8, 20000).smem_cols == 0      # two: too big
    assert make_backward_spec("layer", loop, lt, 8).smem_cols == 0             # n unknown
    block = parse_backward_config("block_1024_v8")
    assert make_backward_spec("layer", block, lt, 8, 8192).smem_cols == 0
    assert choose_backward("layer", 4096, 16384, lt).spec.smem_cols == 16384
    with pytest.raises(ge2jit.ArgumentValueError, match="smem_cols"):
        NormBackwardSpec("layer", lt, block, 8, 16384)
    with pytest.raises(ge2jit.ArgumentValueError, match="smem_cols"):
        NormBackwardSpec("layer", lt, loop, 8, 32768)


# ---- compiles (no GPU): zero spills, zero stack

FORWARD_PARAMS = {
    "config": all_configs(),
    "kind": ["rms", "layer"],
    "x": list(FLOAT_DTYPES),
    "y": ["x", *FLOAT_DTYPES],
    "residual": [None, *FLOAT_DTYPES],
    "h": ["residual", *FLOAT_DTYPES],
    "weight": [None, *FLOAT_DTYPES],
    "bias": [None, *FLOAT_DTYPES],
    "stats": [False, True],
    "vec": [1, 2, 4, 8],
    "arch": ARCHS,
}
BACKWARD_PARAMS = {
    "config": all_backward_configs(),
    "kind": ["rms", "layer"],
    "dy": list(FLOAT_DTYPES),
    "h": list(FLOAT_DTYPES),
    "weight": [None, *FLOAT_DTYPES],
    "bias": [None, *FLOAT_DTYPES],
    "dh": [None, *FLOAT_DTYPES],
    "vec": [1, 2, 4, 8],
    "n": [None, 16384, 32768],   # the loop variant's sums in shared memory where they fit
    "arch": ARCHS,
}


def _forward_spec(p: dict) -> NormSpec:
    residual = p["residual"]
    h = None if residual is None else residual if p["h"] == "residual" else p["h"]
    types = ForwardTypes(p["x"], p["x"] if p["y"] == "x" else p["y"], residual, h, p["weight"],
                         p["bias"] if p["kind"] == "layer" else None, p["stats"])
    return make_spec(p["kind"], p["config"], types, p["vec"])


def _backward_spec(p: dict) -> NormBackwardSpec:
    types = BackwardTypes(p["dy"], p["h"], p["h"], p["weight"],
                          p["bias"] if p["kind"] == "layer" else None, p["dh"])
    return make_backward_spec(p["kind"], p["config"], types, p["vec"], p["n"])


def covering_set(params: dict) -> list[dict]:
    order = sorted(params, key=lambda k: -len(params[k]))
    return [dict(zip(order, row)) for row in AllPairs([params[k] for k in order])]


def _compile_cases():
    """The covering sets (the architecture is one of their parameters: every config and type
    meets both), every sums kernel for both architectures, and every kernel the heuristics
    choose for the lengths at their edges (aligned rows, each representative type set) for
    sm_90."""
    jobs = {(_forward_spec(p), p["arch"]) for p in covering_set(FORWARD_PARAMS)}
    jobs |= {(_backward_spec(p), p["arch"]) for p in covering_set(BACKWARD_PARAMS)}
    jobs |= {(NormSumsSpec(k, w, b if k == "layer" else None), a) for k in ("rms", "layer")
             for w in (None, *FLOAT_DTYPES) for b in (None, *FLOAT_DTYPES)
             if w or (b and k == "layer")
             for a in ARCHS}
    for kind, ts, n in itertools.product(("rms", "layer"), TYPE_SETS, EDGES):
        for rows in (7, 100_000):
            jobs.add((choose(kind, rows, n, forward_types(kind, ts)).spec, "sm_90"))
        jobs.add((choose_backward(kind, 7, n, backward_types(kind, ts)).spec, "sm_90"))
    return sorted(jobs, key=lambda j: (j[0].kernel_name, j[1]))


CASES = _compile_cases()


@pytest.mark.parametrize("params", [FORWARD_PARAMS, BACKWARD_PARAMS])
def test_covering_sets_cover_every_pair(params):
    rows = covering_set(params)
    for x, y in itertools.combinations(params, 2):
        seen = {(r[x], r[y]) for r in rows}
        for pair in itertools.product(params[x], params[y]):
            assert pair in seen, (x, y, pair)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("norm-compile-cache"))


@pytest.mark.parametrize("spec, arch", CASES, ids=[f"{s.kernel_name}-{a}" for s, a in CASES])
def test_compiles_without_spills(spec, arch, cache):
    # the launch bounds ask for 1024 threads per multiprocessor: 64 registers; the most shared
    # memory is the sums kernel's 32 x 33 floats (x 2 with dbias)
    check_compiled(spec, arch, cache, max_registers=64, max_shared=8448)


@pytest.mark.slow
def test_every_config_compiles_without_spills(tmp_path):
    """Every config of both directions x every representative type set x every access
    width, for both architectures."""
    from ge2jit.jit.parallel import compile_many

    specs = set()
    for kind, ts, v in itertools.product(("rms", "layer"), TYPE_SETS, (1, 2, 4, 8)):
        specs |= {make_spec(kind, c, forward_types(kind, ts), v) for c in all_configs()}
        specs |= {make_backward_spec(kind, c, backward_types(kind, ts), v)
                  for c in all_backward_configs()}
    jobs = [(s, a) for s in sorted(specs, key=lambda s: s.kernel_name) for a in ARCHS]
    outcomes = compile_many(jobs, cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes or o.stack_bytes]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.spill_bytes) for o in bad[:20]]


# ---- layouts

def test_row_layouts():
    a = FakeArray((3, 4, 5), np.float32)
    assert row_layout(a) == (12, 5)
    assert row_layout(FakeArray((7,), np.float16)) == (1, 0)
    wide = FakeArray((6, 40), np.float32)
    assert row_layout(FakeArray((6, 17), np.float32, strides=wide.strides)) == (6, 40)
    assert row_layout(FakeArray((3, 17), np.float32, strides=(-160, 4))) == (3, -40)
    assert row_layout(FakeArray((6, 40), np.float32).T) is None        # last stride 24
    assert row_layout(FakeArray((4, 5, 10), np.float32, strides=(320, 40, 4))) is None
    assert row_layout(FakeArray((4, 5, 10), np.float32, strides=(400, 80, 4))) == (20, 20)
    assert row_layout(FakeArray((5, 1), np.float32, strides=(4, 8))) == (5, 1)
    assert row_layout(FakeArray((6, 9), np.float32, strides=(0, 4))) == (6, 0)  # broadcast


def test_vector_width_follows_pointers_row_strides_and_vectors():
    assert vector_width(8, [(4096, 1024, 2), (8192, 1024, 2)], 10) == 8
    assert vector_width(8, [(4096 + 8, 1024, 2)], 10) == 4
    assert vector_width(8, [(4096, 1026, 2)], 10) == 2
    assert vector_width(8, [(4096, 1025, 2)], 10) == 1
    assert vector_width(8, [(4096, 1025, 2)], 1) == 8               # one row: strides unused
    # a float32 weight read 8 at a time needs 16-byte alignment, not 32
    assert vector_width(8, [(4096, 1024, 2), (4096 + 16, None, 4)], 10) == 8
    assert vector_width(8, [(4096, 1024, 2), (4096 + 8, None, 4)], 10) == 2
    assert vector_width(4, [(4096, -1024, 4)], 10) == 4


# ---- argument checks and launches, on stand-in arrays

class Recorder:
    """A launcher for every spec that records (kernel, grid, block, parameters), with the
    spec's parameters and their layout (what the compiled launch path's programs read: a
    program that misses or misnames a parameter is refused when it is made)."""

    def __init__(self):
        self.launches = []

    def __call__(self, spec, device_id):
        recorder = self

        class Launcher:
            params = spec.params
            offsets, size, _ = layout(spec.params)
            fptr = 0
            name = spec.kernel_name

            def bind(self, grid, block, smem, **fixed):
                def launch(stream, **rest):
                    recorder.launches.append((spec.kernel_name, grid, block, fixed | rest))
                return launch

        return Launcher()


@pytest.fixture
def fake(monkeypatch):
    module = make_module(0)
    module.cuda.get_current_stream = lambda: SimpleNamespace(ptr=7)
    module.zeros = lambda shape, dtype: FakeArray(shape, dtype)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(norm_op, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)     # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    monkeypatch.setattr(norm_op, "sm_count", lambda device_id: 132)
    monkeypatch.setattr(norm_op, "tuned_config", lambda name, key: None)
    monkeypatch.setattr(norm_op, "resident_blocks", lambda spec, dev, threads: 2048 // threads)
    recorder = Recorder()
    monkeypatch.setattr(norm_op, "launcher_for", recorder)
    norm_op._prepared.clear()
    norm_op._prepared_backward.clear()
    yield recorder.launches
    norm_op._prepared.clear()
    norm_op._prepared_backward.clear()


def x_(shape=(4, 8), dtype=np.float32, **kw):
    return FakeArray(shape, dtype, **kw)


def test_non_gpu_inputs_are_refused(fake):
    with pytest.raises(ge2jit.ArgumentTypeError,
                       match=r"x: expected a GPU array .*, got a numpy.ndarray of shape "
                             r"\(4, 3\); move it to the GPU with cupy.asarray\(x\)"):
        rms_norm(np.zeros((4, 3), np.float32))
    with pytest.raises(ge2jit.ArgumentTypeError, match="weight: expected a GPU array .*, got "
                                                       "list"):
        layer_norm(x_(), [1.0] * 8)
    with pytest.raises(ge2jit.ArgumentTypeError, match="dy: expected a GPU array"):
        rms_norm_backward(np.zeros((4, 8)), x_(), None, x_((4,)))
    assert not fake


@pytest.mark.parametrize("call, error, match", [
    (lambda: rms_norm(x_(dtype=np.float64)), ge2jit.ArgumentValueError,
     "x: dtype float64 is not supported; supported dtypes: float32, float16, bfloat16"),
    (lambda: rms_norm(x_(())), ge2jit.ArgumentValueError,
     "x: expected an array of at least 1 dimension"),
    (lambda: rms_norm(x_((4, 0))), ge2jit.ArgumentValueError,
     r"x: expected a last axis of at least 1 element, got shape \(4, 0\)"),
    (lambda: rms_norm(x_((2**31,))), ge2jit.ArgumentValueError,
     "x: expected rows of at most 2147483647 elements"),
    (lambda: rms_norm(x_(), x_((7,))), ge2jit.ArgumentValueError,
     r"weight: expected shape \(8,\) \(x's last axis\), got \(7,\)"),
    (lambda: layer_norm(x_(), x_((8,)), x_((8,), np.int32)), ge2jit.ArgumentValueError,
     "bias: dtype int32 is not supported"),
    (lambda: rms_norm(x_(), residual=x_((4, 9))), ge2jit.ArgumentValueError,
     r"residual: expected shape \(4, 8\) \(x's\), got \(4, 9\)"),
    (lambda: rms_norm(x_(), out=x_((8, 4))), ge2jit.ArgumentValueError,
     r"out: expected shape \(4, 8\) \(x's\), got \(8, 4\)"),
    (lambda: rms_norm(x_(), out=x_((8, 4)).T), ge2jit.ArgumentValueError,
     r"out: expected rows along a unit-stride last axis, each element held once"),
    (lambda: rms_norm(x_(), out=x_(strides=(0, 4))), ge2jit.ArgumentValueError,
     r"out: expected rows along a unit-stride last axis, each element held once .*got "
     r"strides \(0, 4\)"),
    (lambda: rms_norm(x_(), residual_out=x_()), ge2jit.ArgumentValueError,
     "residual_out: given without residual"),
    (lambda: rms_norm(x_(), residual=x_(), residual_out=x_(dtype=np.int8)),
     ge2jit.ArgumentValueError, "residual_out: dtype int8 is not supported"),
    (lambda: rms_norm(x_(), eps=-1e-6), ge2jit.ArgumentValueError,
     "eps: expected a finite number >= 0, got -1e-06"),
    (lambda: rms_norm(x_(), eps=float("nan")), ge2jit.ArgumentValueError,
     "eps: expected a finite number >= 0, got nan"),
    (lambda: rms_norm(x_(), eps="small"), ge2jit.ArgumentTypeError,
     "eps: expected a real number, got 'small'"),
    (lambda: rms_norm(x_(), save_stats=1), ge2jit.ArgumentTypeError,
     "save_stats: expected True or False, got 1"),
    (lambda: rms_norm(x_(), config="block_1000_v8"), ge2jit.ArgumentValueError,
     r"config: threads \(block_T\) must be one of"),
    (lambda: rms_norm(x_(offset=2)), ge2jit.ArgumentValueError,
     "x: expected a pointer aligned to its 4-byte elements"),
    (lambda: rms_norm(x_(device=1)), ge2jit.DeviceMismatchError,
     r"x: expected an array on the current device \(GPU 0\), got one on GPU 1"),
    (lambda: rms_norm(x_(), x_((8,), device=1)), ge2jit.DeviceMismatchError,
     r"weight: expected an array on the current device"),
    (lambda: rms_norm_backward(x_(), x_((4, 9)), None, x_((4,))), ge2jit.ArgumentValueError,
     r"h: expected shape \(4, 8\) \(dy's\), got \(4, 9\)"),
    (lambda: rms_norm_backward(x_(), x_(), None, x_((8,))), ge2jit.ArgumentValueError,
     r"rstd: expected shape \(4,\) \(dy's leading dimensions\) or \(4,\), got \(8,\)"),
    (lambda: rms_norm_backward(x_(), x_(), None, x_((4,), np.float16)),
     ge2jit.ArgumentValueError, "rstd: expected dtype float32 .*, got float16"),
    (lambda: layer_norm_backward(x_(), x_(), None, None, x_((4,))),
     ge2jit.ArgumentTypeError, "mean: expected a GPU array .*, got NoneType"),
    (lambda: layer_norm_backward(x_((2, 3, 8)), x_((2, 3, 8)), None, x_((2, 3)), x_((5,))),
     ge2jit.ArgumentValueError, r"rstd: expected shape \(2, 3\) .* or \(6,\), got \(5,\)"),
    (lambda: rms_norm_backward(x_(), x_(), None, x_((4,)), dh=x_((4, 7))),
     ge2jit.ArgumentValueError, r"dh: expected shape \(4, 8\) \(dy's\), got \(4, 7\)"),
    (lambda: rms_norm_backward(x_(), x_(), None, x_((4,)), config="block_128_v16"),
     ge2jit.ArgumentValueError, r"config: values per thread \(_vV\) must be one of 4, 8"),
    (lambda: rms_norm(x_((4, 600)), config="warp32_v16_r1"), ge2jit.ArgumentValueError,
     "config: warp32_v16_r1 holds rows of at most 512 elements, got rows of 600"),
])
def test_bad_arguments_are_refused_in_one_line(fake, call, error, match):
    with pytest.raises(error, match=match) as e:
        call()
    assert "\n" not in str(e.value)
    assert not fake


def test_overlapping_outputs_are_refused_exact_aliases_run_in_place(fake):
    x, r = x_(), x_()
    shifted = FakeArray((4, 8), base=x.base, offset=4)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="out: overlaps x without being x; pass out=x"):
        rms_norm(x, out=shifted)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps weight"):
        w = x_((8,))
        rms_norm(x, w, out=FakeArray((4, 8), base=w.base))
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="residual_out: overlaps out; pass a separate array"):
        y = x_()
        rms_norm(x, residual=r, out=y, residual_out=FakeArray((4, 8), base=y.base))
    as_half = FakeArray((4, 16), np.float16, base=x.base)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        rms_norm(FakeArray((4, 16), np.float32, base=x.base), out=as_half)
    assert not fake
    assert rms_norm(x, out=x) is x
    y, h = layer_norm(x, residual=r, out=r, residual_out=x)     # both in place, crossed
    assert y is r and h is x
    assert len(fake) == 2
    # the prepared path checks every call too
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        rms_norm(x, out=FakeArray((4, 8), base=x.base, offset=4))
    apart = FakeArray((4, 8), base=x.base, offset=128)                # right after x's bytes
    assert rms_norm(x, out=apart) is apart


def test_forward_launch_parameters(fake):
    x = x_((2, 3, 1000), np.float16)
    w = x_((1000,), np.float32)
    r = x_((2, 3, 1000), np.float32)
    y = rms_norm(x, w, eps=1e-5)
    assert (y.shape, y.dtype) == ((2, 3, 1000), np.float16)
    name, grid, block, p = fake[-1]
    assert name == "rms_norm_block128_v8_x8_f16_yf16_wf32"
    assert grid == (6, 1, 1) and block == (128, 1, 1)
    assert p["rows"] == 6 and p["n"] == 1000 and p["eps"] == 1e-5
    assert (p["sx"], p["sy"], p["sr"], p["sh"]) == (1000, 1000, 0, 0)
    assert p["x"] == x.data.ptr and p["w"] == w.data.ptr and p["y"] == y.data.ptr
    assert p["r"] == p["h"] == p["b"] == p["mean"] == p["rstd"] == 0
    y, h = rms_norm(x, w, residual=r)
    assert (y.dtype, h.dtype) == (np.float16, np.float32)    # h takes the residual's type
    assert fake[-1][0] == "rms_norm_block128_v8_x4_f16_rf32hf32_yf16_wf32"
    assert fake[-1][3]["r"] == r.data.ptr and fake[-1][3]["h"] == h.data.ptr
    out = layer_norm(x, w, x_((1000,), np.float16), residual=r, save_stats=True,
                     residual_out=x_((2, 3, 1000), np.float16))
    assert isinstance(out, ge2jit.NormOutput)
    assert out.h.dtype == np.float16 and out.mean.shape == out.rstd.shape == (2, 3)
    assert out.rstd.dtype == np.float32
    assert fake[-1][0] == "layer_norm_block128_v8_x4_f16_rf32hf16_yf16_wf32_bf16_stats"
    assert fake[-1][3]["mean"] == out.mean.data.ptr and fake[-1][3]["rstd"] == out.rstd.data.ptr
    stats = rms_norm(x_((5,)), save_stats=True)
    assert stats.rstd.shape == () and stats.mean is None and stats.h is None


def test_rows_of_wider_arrays_and_copies(fake):
    big = x_((6, 40))
    rows = FakeArray((6, 17), np.float32, strides=big.strides, base=big.base, offset=12)
    rms_norm(rows)
    p = fake[-1][3]
    assert p["sx"] == 40 and p["x"] == rows.data.ptr and fake[-1][0].endswith("_x1_f32_yf32_nw")
    out_big = x_((6, 48))
    out = FakeArray((6, 17), np.float32, strides=out_big.strides, base=out_big.base)
    assert rms_norm(rows, out=out) is out and fake[-1][3]["sy"] == 48
    # a transposed x is copied first (and the call is not prepared)
    t = x_((8, 4)).T
    rms_norm(t)
    assert fake[-1][3]["x"] != t.data.ptr and fake[-1][3]["sx"] == 8
    rms_norm(t)
    assert len(norm_op._prepared) == 2      # the first two calls' patterns only
    w = FakeArray((8,), np.float32, strides=(8,))       # a strided weight: copied
    rms_norm(x_(), w)
    assert fake[-1][3]["w"] != w.data.ptr


def test_prepared_calls_reuse_the_first_calls_choice(fake):
    x, w = x_((64, 256), np.float16), x_((256,), np.float16)
    y1 = rms_norm(x, w)
    assert len(norm_op._prepared) == 1
    x2 = x_((64, 256), np.float16)
    y2 = rms_norm(x2, w)
    assert len(norm_op._prepared) == 1 and y2 is not y1
    assert fake[-1][0] == fake[-2][0] and fake[-1][3]["x"] == x2.data.ptr
    assert fake[-1][3]["y"] == y2.data.ptr
    rms_norm(x2, w, eps=1e-3)                    # another eps: another signature
    assert len(norm_op._prepared) == 2 and fake[-1][3]["eps"] == 1e-3


def test_empty_rows_launch_nothing(fake):
    y = rms_norm(x_((0, 8)))
    assert y.shape == (0, 8)
    out = layer_norm(x_((0, 3, 8)), residual=x_((0, 3, 8)), save_stats=True)
    assert out.y.shape == out.h.shape == (0, 3, 8) and out.rstd.shape == (0, 3)
    g = layer_norm_backward(x_((0, 8)), x_((0, 8)), x_((8,)), x_((0,)), x_((0,)),
                            bias=x_((8,), np.float16))
    assert g.dx.shape == (0, 8) and g.dweight.shape == (8,) and g.dbias.dtype == np.float16
    assert not fake


def test_backward_launches(fake):
    dy, h = x_((2, 3, 1000), np.float16), x_((2, 3, 1000), np.float32)
    w, b = x_((1000,), np.float32), x_((1000,), np.float16)
    mean, rstd = x_((2, 3)), x_((6,))
    g = layer_norm_backward(dy, h, w, mean, rstd, bias=b, dh=h)
    assert isinstance(g, ge2jit.NormGradients)
    assert g.dx.shape == (2, 3, 1000) and g.dx.dtype == np.float32
    assert g.dweight.dtype == np.float32 and g.dbias.dtype == np.float16
    (k1, grid, block, p), (k2, sgrid, sblock, s) = fake[-2:]
    assert k1 == "layer_norm_backward_block128_v8_x4_dyf16_hf32_dxf32_wf32_bf16_dhf32"
    assert grid == (6, 1, 1) and block == (128, 1, 1)    # no more blocks than rows
    assert (p["rows"], p["n"], p["sdy"], p["sh"], p["sdh"], p["sdx"]) == (6, 1000, 1000,
                                                                          1000, 1000, 1000)
    assert p["mean"] == mean.data.ptr and p["rstd"] == rstd.data.ptr and p["dh"] == h.data.ptr
    assert k2 == "layer_norm_backward_sums_wf32_bf16"
    assert sgrid == (32, 2, 1) and sblock == (1024, 1, 1)
    assert s["parts"] == 6 and s["pw"] == p["pw"] != 0 and s["pb"] == p["pb"] != 0
    assert s["dw"] == g.dweight.data.ptr and s["db"] == g.dbias.data.ptr
    # many rows: the grid is what the GPU holds at once
    rms_norm_backward(x_((100_000, 64)), x_((100_000, 64)), x_((64,)), x_((100_000,)))
    assert fake[-2][1] == (132 * 16, 1, 1) and fake[-1][3]["parts"] == 132 * 16
    # no weight: no partial sums, one kernel
    before = len(fake)
    g = rms_norm_backward(x_(), x_(), None, x_((4,)))
    assert g.dweight is None and g.dbias is None and len(fake) == before + 1
    assert fake[-1][3]["pw"] == fake[-1][3]["pb"] == fake[-1][3]["w"] == 0


def test_config_objects_are_accepted(fake):
    rms_norm(x_(), config=NormConfig("block", 256, vpt=8))
    assert fake[-1][0].startswith("rms_norm_block256_v8")
    rms_norm_backward(x_(), x_(), None, x_((4,)), config=NormBackwardConfig("loop", 512))
    assert fake[-1][0].startswith("rms_norm_backward_loop512")


# ---- the warm-up tables (ops/norm/warmup.py)

def test_warmup_entries_expand_to_the_heuristic_kernels():
    from ge2jit.ops.norm import warmup

    entry = warmup.layer.validate_entry({"dtypes": ["bfloat16"], "lengths": [128, 4096, 50000],
                                         "residual_dtypes": ["none", "float32"],
                                         "weight_dtypes": ["float32"], "save_stats": [True]})
    specs = warmup.layer.expand(entry, "sm_90", sms=132)
    names = [s.kernel_name for s in specs]
    assert len(names) == len(set(names))
    assert "layer_norm_block512_v8_x8_bf16_ybf16_wf32_bbf16_stats" in names
    assert "layer_norm_loop1024_v8_x4_bf16_rf32hf32_ybf16_wf32_bbf16_stats" in names
    # every kernel the call would take on aligned rows of these lengths is among them
    for r in (None, F32):
        t = ForwardTypes(BF16, BF16, r, r, F32, BF16, True)
        for n, rows in itertools.product((128, 4096, 50000), (1, 1000, 10**6)):
            assert choose("layer", rows, n, t, 132).spec in specs
    pinned = warmup.rms.expand(warmup.rms.validate_entry(
        {"lengths": [100, 5000], "configs": ["block_256_v16", "warp32_v4_r1"],
         "weight_dtypes": ["none"]}), "sm_80")
    assert [s.kernel_name for s in pinned] == ["rms_norm_block256_v16_x4_f32_yf32_nw",
                                               "rms_norm_warp32_v4_r1_x4_f32_yf32_nw"]
    every = warmup.rms.expand(warmup.rms.validate_entry({"lengths": [1000], "configs": "all"}),
                              "sm_90")
    assert {s.config for s in every} == {c for c in all_configs()
                                         if c.capacity is None or c.capacity >= 1000}


def test_backward_warmup_entries_expand_to_what_calls_run():
    from ge2jit.ops.norm import warmup

    entry = warmup.layer_backward.validate_entry(
        {"dtypes": ["bfloat16"], "h_dtypes": ["same", "float32"], "weight_dtypes": ["float32"],
         "dh_dtypes": ["none", "same"], "lengths": [100, 4096, 50000]})
    specs = warmup.layer_backward.expand(entry, "sm_90")
    for h, dh in itertools.product((BF16, F32), (None, "same")):
        bt = BackwardTypes(BF16, h, h, F32, BF16, h if dh else None)
        for n in (100, 4096, 50000):
            assert choose_backward("layer", 10**6, n, bt).spec in specs
        assert NormSumsSpec("layer", F32, BF16) in specs
    rms = warmup.rms_backward.expand(warmup.rms_backward.validate_entry(
        {"lengths": [300], "weight_dtypes": ["none"], "configs": "all"}), "sm_90")
    assert all(isinstance(s, NormBackwardSpec) for s in rms)   # no weight: no sums kernel
    assert {s.config for s in rms} == {c for c in all_backward_configs()
                                       if c.capacity is None or c.capacity >= 300}


@pytest.mark.parametrize("table, entry, match", [
    ("rms", {}, "lengths: expected a non-empty list of row lengths"),
    ("rms", {"lengths": [0]}, "lengths: expected"),
    ("rms", {"lengths": [2**31]}, "lengths: expected"),
    ("rms", {"lengths": [True]}, "lengths: expected"),
    ("rms", {"lengths": [5], "dtypes": ["float64"]}, "dtypes: expected a list of"),
    ("rms", {"lengths": [5], "out_dtypes": ["none"]}, "out_dtypes: expected a list of"),
    ("rms", {"lengths": [5], "weight_dtypes": "same"}, "weight_dtypes: expected a list of"),
    ("rms", {"lengths": [5], "bias_dtypes": ["same"]}, "bias_dtypes: unknown key"),
    ("rms", {"lengths": [5], "configs": "fast"}, "configs: expected 'heuristic', 'all' or"),
    ("rms", {"lengths": [5], "configs": ["block_1000_v8"]}, "config: threads"),
    ("rms", {"lengths": [5], "save_stats": [1]}, "save_stats: expected a list of booleans"),
    ("rms", {"lengths": [5], "backward": True}, "backward: unknown key"),
    ("layer", {"lengths": [5], "bias_dtypes": ["int8"]}, "bias_dtypes: expected a list of"),
    ("layer_backward", {"lengths": [5], "h_dtypes": ["none"]}, "h_dtypes: expected a list"),
    ("layer_backward", {"lengths": [5], "configs": ["warp32_v8_r2"]},
     r"config: rows per lane group \(_rR\) must be one of 1"),
    ("rms_backward", {"lengths": [5], "residual_dtypes": ["none"]},
     "residual_dtypes: unknown key"),
])
def test_bad_warmup_entries_are_refused(table, entry, match):
    from ge2jit.ops.norm import warmup

    with pytest.raises(ge2jit.ArgumentValueError, match=match):
        getattr(warmup, table).validate_entry(entry)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
def test_programs_launch_what_the_python_path_launched(fake, monkeypatch, kind, residual):
    """The compiled launch path's programs (forward: one launch; backward: the main kernel and
    the sums of dweight and dbias) give every kernel parameter the value the Python path
    launched with: each constant, and each pointer as the argument or slot that held it
    (outputs the program allocates in the slots the call returns)."""
    from ge2jit.jit import fastlaunch

    made = []

    def program(fw, steps, allocs=(), pairs=(), overlap=None, stream=None, failed=None,
                returns=(0,), slots=0):
        made.append((steps, allocs, returns, slots))
        return "program"

    monkeypatch.setattr(fastlaunch, "program", program)
    monkeypatch.setattr(fastlaunch.Table, "put", lambda self, args, prog, framework: False)
    specs = {}
    launcher_for = norm_op.launcher_for

    def remember(spec, device_id):
        specs[spec.kernel_name] = spec
        return launcher_for(spec, device_id)

    monkeypatch.setattr(norm_op, "launcher_for", remember)
    ptr = norm_op._ptr

    def check(step, launch, slots):
        name, grid, block, values = launch
        fptr, s_grid, s_block, smem, size, offsets, ops = step
        assert (tuple(s_grid), tuple(s_block)) == (tuple(grid), tuple(block))
        names = [p.name for p in specs[name].params]
        assert len(ops) == len(names)
        for param, (_, how, arg, value) in zip(names, ops):
            if how == 1:   # an argument's or a slot's pointer (plus no offset)
                want = 0 if slots[arg] is None else ptr(slots[arg])
                assert value == 0 and values[param] == want, (name, param, arg)
            else:
                assert how == 0 and value == values[param], (name, param)

    x, w, b = x_((4, 8)), x_((8,)), x_((8,))
    r = x_((4, 8)) if residual else None
    bias = b if kind == "layer" else None
    if kind == "layer":
        out = layer_norm(x, w, b, residual=r, save_stats=True)
    else:
        out = rms_norm(x, w, residual=r, save_stats=True)
    steps, allocs, returns, slots = made[-1]
    assert returns == (4, 5, 6, 7) and slots == 8
    assert [(slot, shape) for slot, _, shape in allocs] == (
        [(4, (4, 8))] + ([(5, (4, 8))] if residual else [])
        + ([(6, (4,))] if kind == "layer" else []) + [(7, (4,))])
    assert len(steps) == 1
    check(steps[0], fake[-1], [x, w, bias, r, *out])

    dy = x_((4, 8))
    if kind == "layer":
        grads = layer_norm_backward(dy, out.h if residual else x, w, out.mean, out.rstd,
                                    bias=b)
    else:
        grads = rms_norm_backward(dy, out.h if residual else x, w, out.rstd)
    steps, allocs, returns, slots = made[-1]
    assert returns == (7, 10, 11) and slots == 12 and len(steps) == 2
    main, sums = fake[-2:]
    parts = main[1][0]
    assert [(slot, shape) for slot, _, shape in allocs] == (
        [(7, (4, 8)), (8, (parts, 8)), (10, (8,))]
        + ([(9, (parts, 8)), (11, (8,))] if kind == "layer" else []))
    # the partial sums are the program's own: the sums kernel reads what the main one wrote
    h = out.h if residual else x
    slots_ = [dy, h, w, bias, out.mean, out.rstd, None, grads.dx, None, None, grads.dweight,
              grads.dbias]
    assert main[3]["pw"] == sums[3]["pw"] != 0 and main[3]["pb"] == sums[3]["pb"]
    slots_[8] = SimpleNamespace(data=SimpleNamespace(ptr=main[3]["pw"]))
    if kind == "layer":
        slots_[9] = SimpleNamespace(data=SimpleNamespace(ptr=main[3]["pb"]))
    check(steps[0], main, slots_)
    check(steps[1], sums, slots_)
