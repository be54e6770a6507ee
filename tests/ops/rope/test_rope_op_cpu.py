"""rope's calls without a GPU (``tests/fake_cupy.py`` arrays): every argument check, the spec a
call runs, its launch parameters, the registry and the warm-up table."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.ops.rope import op as rope_op
from ge2jit.runtime import arrays, checks, registry

from ...fake_cupy import FakeArray, make_module


@pytest.fixture
def fake(monkeypatch):
    """The checked calls that reached the launch; no kernel runs."""
    module = make_module(0)
    module.empty = lambda shape, dtype: FakeArray(shape, dtype)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    runs = []

    def execute(fw, device_id, call, native):
        runs.append(call)
        return (native["q_out"], native["k_out"]), None

    monkeypatch.setattr(rope_op, "_execute", execute)
    return runs


def qk(b=2, s=5, hq=4, hk=2, d=16, dtype=np.float16):
    return FakeArray((b, s, hq, d), dtype), FakeArray((b, s, hk, d), dtype)


def tables(rows=5, half=8, dtype=np.float16, batch=None):
    shape = (rows, half) if batch is None else (batch, rows, half)
    return FakeArray(shape, dtype), FakeArray(shape, dtype)


def test_a_call_runs_the_widest_spec_its_layout_allows(fake):
    q, k = qk()
    cos, sin = tables()
    ge2jit.rope(q, k, cos, sin)
    call = fake[-1]
    assert (call.batch, call.seq, call.half) == (2, 5, 8)
    assert call.spec.vec == 8 and not call.spec.copy_rest and not call.spec.backward
    ge2jit.rope_backward(q, k, *tables(half=3), interleaved=True)
    call = fake[-1]
    assert call.spec.vec == 1 and call.spec.copy_rest and call.spec.backward
    assert call.spec.interleaved
    # a (batch, heads, seq, head_dim) array's transpose(1, 2): strides, not a copy
    qt = FakeArray((2, 5, 4, 16), np.float32, strides=(4 * 5 * 16 * 4, 16 * 4, 5 * 16 * 4, 4))
    ge2jit.rope(qt, None, *tables(dtype=np.float32))
    call = fake[-1]
    assert call.k is None and call.spec.vec == 4
    grid, block, params = rope_op.launch_params(call, qt, None)
    assert (params["qb"], params["qs"], params["qh"]) == (320, 16, 80)
    assert params["hk"] == 0 and params["tokens"] == 10 and params["table_rows"] == 5
    assert (params["cb"], params["cr"]) == (0, 8)


def test_which_inputs_get_an_output_laid_out_as_theirs():
    def t(shape, order):   # a C-contiguous array of shape[order], as a view of shape
        base = [shape[i] for i in order]
        st, acc = [0] * len(base), 2
        for i in reversed(range(len(base))):
            st[i], acc = acc, acc * base[i]
        strides = [0] * len(shape)
        for pos, axis in enumerate(order):
            strides[axis] = st[pos]
        return FakeArray(shape, np.float16, strides=tuple(strides))

    assert rope_op.swapped(t((2, 5, 4, 16), (0, 2, 1, 3)))
    assert rope_op.swapped(t((5, 4, 16), (1, 0, 2)))
    assert not rope_op.swapped(t((2, 5, 4, 16), (0, 1, 2, 3)))
    assert not rope_op.swapped(t((2, 5, 4, 16), (2, 0, 1, 3)))
    assert not rope_op.swapped(t((2, 5, 1, 16), (0, 2, 1, 3)))   # the same either way
    q = t((1, 5, 4, 16), (0, 2, 1, 3))
    odd = FakeArray(q.shape, np.float16, strides=(7, *q.strides[1:]))   # batch of 1: any
    assert rope_op.swapped(odd)


def test_positions_and_batched_tables(fake):
    q, k = qk(s=7)
    cos, sin = tables(rows=100, batch=2)
    ge2jit.rope(q, k, cos, sin, positions=FakeArray((2, 7), np.int64))
    call = fake[-1]
    assert call.spec.positions == "int64"
    _, _, params = rope_op.launch_params(call, None, None)
    assert (params["cb"], params["cr"], params["pb"], params["ps"]) == (800, 8, 7, 1)
    ge2jit.rope(q, k, *tables(rows=100, batch=1), positions=FakeArray((7,), np.int32))
    _, _, params = rope_op.launch_params(fake[-1], None, None)
    assert (params["cb"], params["pb"], params["ps"]) == (0, 0, 1)


def test_in_place_and_given_outputs(fake):
    q, k = qk()
    cos, sin = tables()
    ge2jit.rope(q, k, cos, sin, out=(q, k))
    qo, ko = qk()
    ge2jit.rope(q, k, cos, sin, out=(qo, ko))
    assert fake[-1].q_out is not None


@pytest.mark.parametrize("call, error, message", [
    (lambda q, k, c, s: ge2jit.rope(np.zeros((2, 5, 4, 16)), k, c, s), ArgumentTypeError,
     "q: expected a GPU array"),
    (lambda q, k, c, s: ge2jit.rope(FakeArray((5, 16), np.float16), k, c, s),
     ArgumentValueError, r"q: expected 4 dimensions \(batch, seq, heads, head_dim\) or 3"),
    (lambda q, k, c, s: ge2jit.rope(FakeArray((2, 5, 4, 16), np.float16,
                                              strides=(640, 128, 2, 8)), k, c, s),
     ArgumentValueError, "q: expected unit stride along head_dim"),
    (lambda q, k, c, s: ge2jit.rope(q, FakeArray((2, 6, 2, 16), np.float16), c, s),
     ArgumentValueError, "k: expected q's batch, seq and head_dim"),
    (lambda q, k, c, s: ge2jit.rope(q, FakeArray((2, 5, 2, 16), np.float32), c, s),
     ArgumentValueError, "k: expected q's dtype float16, got float32"),
    (lambda q, k, c, s: ge2jit.rope(q, k, FakeArray((5,), np.float16), s),
     ArgumentValueError, r"cos: expected shape \(rows, half\)"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, FakeArray((5, 8), np.float32)),
     ArgumentValueError, "sin: expected cos's shape"),
    (lambda q, k, c, s: ge2jit.rope(q, k, *tables(rows=4)),
     ArgumentValueError, "cos: expected at least seq = 5 rows without positions, got 4"),
    (lambda q, k, c, s: ge2jit.rope(q, k, *tables(half=9)),
     ArgumentValueError, "cos: expected 1 to head_dim / 2 = 8 columns"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, positions=FakeArray((2, 5), np.float32)),
     ArgumentValueError, "positions: expected dtype int32 or int64, got float32"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, positions=FakeArray((3, 5), np.int32)),
     ArgumentValueError, r"positions: expected shape \(2, 5\) or \(5,\)"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, interleaved=1), ArgumentTypeError,
     "interleaved: expected a bool, got 1"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=q), ArgumentTypeError,
     "out: expected None or a pair"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=(None, k)), ArgumentTypeError,
     r"out: expected q_out an array, got None \(pass out=None for new outputs\)"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=(q, None)), ArgumentValueError,
     "out: expected k_out an array as k is given"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=(FakeArray((2, 5, 4, 16), np.float32),
                                                     FakeArray((2, 5, 2, 16), np.float16))),
     ArgumentValueError, "q_out: expected q.s dtype float16, got float32"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=(FakeArray((2, 5, 4, 16), np.float16), q)),
     ArgumentValueError, "k_out: expected shape"),
    (lambda q, k, c, s: ge2jit.rope(q, k, c, s, out=(k, k)), ArgumentValueError,
     "q_out: expected shape"),
])
def test_bad_arguments_are_refused_in_one_line(fake, call, error, message):
    q, k = qk()
    cos, sin = tables()
    with pytest.raises(error, match=message) as e:
        call(q, k, cos, sin)
    assert "\n" not in str(e.value) and not fake


def test_an_output_over_another_array_is_refused(fake):
    base = FakeArray((2, 5, 4, 16), np.float16)
    q, k = qk(hk=4)
    cos, sin = tables()
    other = FakeArray((2, 5, 4, 16), np.float16, base=k.base)   # k's memory
    with pytest.raises(ArgumentValueError, match="q_out: overlaps k; pass a separate array"):
        ge2jit.rope(q, k, cos, sin, out=(other, FakeArray((2, 5, 4, 16), np.float16)))
    with pytest.raises(ArgumentValueError, match="k_out: overlaps q_out"):
        ge2jit.rope(q, k, cos, sin, out=(base, FakeArray((2, 5, 4, 16), np.float16,
                                                         base=base.base)))
    assert not fake


def test_the_ops_are_registered_with_their_tables():
    for name, prefix in (("rope", "rope_fwd_"), ("rope_backward", "rope_bwd_")):
        op = registry.get(name)
        assert op.kernel_prefixes == (prefix,) and op.candidates is None
        assert op.tuning_key is None and op.layout_cases is not None
        (spec,) = op.specs_for_config(None, "sm_90", dtype="float16", vec=8)
        assert spec.kernel_name.startswith(prefix) and spec.vec == 8
        with pytest.raises(ArgumentValueError, match="not named by configs"):
            op.specs_for_config("fast", "sm_90")
    table = registry.warmup_tables()["rope"]
    entry = table.validate_entry({"dtypes": ["bfloat16", "float32"], "halves": [64, 3],
                                  "positions": ["none", "int64"]})
    specs = table.expand(entry, "sm_90")
    assert len(specs) == 8 and {s.vec for s in specs} == {1, 4, 8}
    with pytest.raises(ArgumentValueError, match="positions: expected a list of"):
        table.validate_entry({"positions": ["int16"]})
    with pytest.raises(ArgumentValueError, match="halves: expected"):
        table.validate_entry({"halves": [0]})


def test_a_warm_up_file_compiles_both_directions_without_a_gpu(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('archs = ["sm_90"]\n[[rope]]\ndtypes = ["bfloat16"]\nhalves = [64]\n'
                    '[[rope_backward]]\ndtypes = ["bfloat16"]\nhalves = [64]\n')
    summary = ge2jit.warmup(str(path), progress=False, processes=1)
    assert summary.ok and summary.compiled + summary.cached == 2
