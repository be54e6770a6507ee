"""Every op on every layout it accepts, from each op's registration (``Op.layout_cases``): each
array argument (inputs, outputs given with ``out=``, outputs the op allocates, residuals,
saved statistics, scales) contiguous; as rows of a wider array with pads that keep 16-byte
alignment and pads that don't; one element past an aligned base; transposed where the op
reads it so; at sizes that are and are not multiples of every vector width. Each result is
compared with the float64 reference, in CuPy and in PyTorch; pads around every array are
poisoned and must stay so; a layout the op does not take is refused with one line, before any
launch.

``GE2JIT_LAYOUT_SIZES=3,33`` runs a short version (the GPU check runs that under
compute-sanitizer)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ge2jit  # noqa: F401 - registers the ops
from ge2jit.runtime import registry
from ge2jit.runtime.cases import SIZES, Case

from .layouts import cp, geometry, run_variant, variants

OPS = [op.name for op in registry.ops()]
_env = os.environ.get("GE2JIT_LAYOUT_SIZES", "")
RUN_SIZES = tuple(int(s) for s in _env.split(",")) if _env else SIZES
#: PyTorch goes through the same kernels: its own array handling is proven at fewer sizes
TORCH_SIZES = tuple(s for s in RUN_SIZES if s in (3, 33, 4097, 32003)) or RUN_SIZES[:1]


# ---- CPU: the declarations and the machinery -------------------------------------------------

def test_every_op_declares_layout_cases():
    assert OPS and not [op.name for op in registry.ops() if op.layout_cases is None]


@pytest.mark.parametrize("op", OPS)
def test_cases_are_consistent(op):
    """Every case names what it runs: its references are of results it returns or arrays it
    holds, its layouts of arrays it has, and its values are finite random numbers."""
    for n in (1, 33):
        cases = registry.get(op).layout_cases(n)
        assert cases
        for case in cases:
            assert isinstance(case, Case)
            names = {*case.arrays, *case.outputs}
            assert set(case.refused) <= names and set(case.transposed) <= names
            assert case.required <= set(case.outputs)
            for name, x in case.arrays.items():
                assert np.isfinite(x.astype(np.float64)).all() and x.size > 0, name
                if n > 1 and x.size > 1 and x.dtype.kind != "i":
                    assert np.unique(x.astype(np.float64)).size > 1, f"{name} is constant"
            for name, ref in case.expected.items():
                assert np.isfinite(np.asarray(ref, np.float64)).all(), name
                case.tol(name)
            assert len(variants(case)) == len({tuple(sorted(v.items()))
                                               for v in variants(case)})


def test_layouts_cover_pads_offsets_and_transposes():
    shape = (3, 5)
    assert geometry("contiguous", shape) == (15, 0, (5, 1))
    assert geometry("pad8", shape) == (39, 0, (13, 1))
    assert geometry("offset", shape) == (16, 1, (5, 1))
    assert geometry("offset_pad3", shape) == (25, 1, (8, 1))
    assert geometry("transposed", shape) == (15, 0, (1, 3))
    assert geometry("stride2", (7,)) == (14, 0, (2,))
    assert geometry("offset", (7,)) == (8, 1, (1,))


def test_a_variant_per_array_and_layout():
    case = Case("c", {"x": np.ones((3, 4), np.float32), "w": np.ones(4, np.float32)},
                lambda a: {}, {}, 0.0, outputs={"out": ((3, 4), np.dtype(np.float32))},
                transposed=frozenset({"x"}), refused={"out": frozenset({"transposed"})})
    vs = variants(case)
    assert vs[0] == {"x": "contiguous", "w": "contiguous"}
    assert {v["x"] for v in vs} == {"contiguous", "pad1", "pad2", "pad3", "pad5", "pad8",
                                    "offset", "offset_pad3", "transposed"}
    assert {v["w"] for v in vs} == {"contiguous", "offset", "stride2"}
    # outputs: given in each layout (transposed only where the case lets the array be)
    assert {v["out"] for v in vs if "out" in v} == {"contiguous", "pad1", "pad2", "pad3",
                                                    "pad5", "pad8", "offset", "offset_pad3"}
    assert vs[-1] == {"x": "offset_pad3", "w": "offset", "out": "offset_pad3"}


# ---- GPU: every op, every layout, against the reference ---------------------------------------

def _run(op: str, n: int, framework: str) -> None:
    failures, count = [], 0
    for case in registry.get(op).layout_cases(n):
        for layout in variants(case):
            count += 1
            msg = run_variant(case, layout, framework)
            if msg:
                failures.append(msg)
    cp.get_default_memory_pool().free_all_blocks()
    assert not failures, (f"{len(failures)} of {count} layouts failed:\n"
                          + "\n".join(failures[:40]))


@pytest.mark.gpu
@pytest.mark.parametrize("n", RUN_SIZES)
@pytest.mark.parametrize("op", OPS)
def test_layouts_cupy(op, n):
    _run(op, n, "cupy")


@pytest.mark.gpu
@pytest.mark.parametrize("n", TORCH_SIZES)
@pytest.mark.parametrize("op", OPS)
def test_layouts_torch(op, n):
    pytest.importorskip("torch")
    _run(op, n, "torch")


@pytest.mark.gpu
def test_cross_entropy_on_a_padded_vocabulary_head():
    """GPT-2's 50257 classes sliced from a 50304-wide head (rows 16-byte aligned, V not a
    multiple of 4), the gradient allocated by the call: the layout that once wrote 16-byte
    vectors to misaligned rows."""
    from ge2jit.ops.cross_entropy.reference import cross_entropy_grad_ref, cross_entropy_ref

    rng = np.random.default_rng(7)
    for dtype, width, v in (("float32", 32008, 32003), ("float32", 50304, 50257)):
        host = rng.standard_normal((77, width)).astype(dtype)
        t = rng.integers(0, v, 77)
        logits = cp.asarray(host)[:, :v]
        loss, g = ge2jit.cross_entropy(logits, cp.asarray(t), grad=True)
        x = host[:, :v].astype(np.float64)
        assert abs(float(loss) - cross_entropy_ref(x, t)) <= 1e-5 * abs(cross_entropy_ref(x, t))
        ref = cross_entropy_grad_ref(x, t)
        assert np.abs(cp.asnumpy(g) - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.gpu
def test_torch_cross_entropy_on_a_padded_vocabulary_head():
    """The same layout through ``ge2jit.torch.cross_entropy`` and autograd, in bfloat16."""
    torch = pytest.importorskip("torch")
    import ge2jit.torch as gt
    from ge2jit.ops.cross_entropy.reference import cross_entropy_grad_ref, cross_entropy_ref

    torch.manual_seed(3)
    big = torch.randn(777, 50304, device="cuda").to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, 50257, (777,), device="cuda")
    loss = gt.cross_entropy(big[:, :50257], t)
    loss.backward()
    x = big.detach()[:, :50257].double().cpu().numpy()
    tn = t.cpu().numpy()
    ref = cross_entropy_ref(x, tn)
    assert abs(loss.item() - ref) <= 1e-5 * abs(ref)
    g = big.grad.double().cpu().numpy()
    gref = cross_entropy_grad_ref(x, tn)
    assert np.abs(g[:, :50257] - gref).max() <= 1e-2 * np.abs(gref).max()
    assert not g[:, 50257:].any()
