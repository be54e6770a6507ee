"""Every kernel variant compiles with NVRTC for sm_80 and sm_90, without spilling (no GPU needed).

CI compiles a pairwise covering set: every value of each parameter meets every value of every
other parameter at least once. The full product runs with ``-m slow``.
"""

from __future__ import annotations

import itertools

import pytest
from allpairspy import AllPairs

from ge2jit.jit.cache import KernelCache
from ge2jit.jit.loader import build
from ge2jit.ops.gemm.spec import SIMT_F32_TILES, Act, BiasKind, DType, GemmSpec, Layout

ARCHS = ("sm_80", "sm_90")
PARAMETERS = {
    "layout_a": list(Layout),
    "layout_b": list(Layout),
    "layout_c": [None, *Layout],
    "act": list(Act),
    "bias": list(BiasKind),
    "save_z": [False, True],
    "tile": list(SIMT_F32_TILES),
    "arch": list(ARCHS),
}
NAMES = list(PARAMETERS)


def covering_set() -> list[dict]:
    # The parameter with the most values first gives allpairspy its smallest sets.
    order = sorted(NAMES, key=lambda k: -len(PARAMETERS[k]))
    return [dict(zip(order, row)) for row in AllPairs([PARAMETERS[k] for k in order])]


def _spec(p: dict) -> GemmSpec:
    return GemmSpec(DType.F32, p["layout_a"], p["layout_b"], p["layout_c"], p["act"], p["bias"],
                    p["save_z"], p["tile"])


COVERING = covering_set()


def test_covering_set_covers_every_pair():
    for x, y in itertools.combinations(NAMES, 2):
        seen = {(row[x], row[y]) for row in COVERING}
        for pair in itertools.product(PARAMETERS[x], PARAMETERS[y]):
            assert pair in seen, (x, y, pair)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("compile-cache"))


def _check(entry, spec, arch):
    assert entry.kernel_name == spec.kernel_name
    assert entry.arch == arch
    assert entry.cubin[:4] == b"\x7fELF"
    assert 0 < entry.registers <= 255
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (spec.kernel_name, entry.log)
    assert entry.stack_bytes == 0, (spec.kernel_name, entry.log)
    assert entry.shared_bytes > 0


@pytest.mark.parametrize("params", COVERING, ids=lambda p: f"{_spec(p).kernel_name}-{p['arch']}")
def test_covering_set_compiles_without_spills(params, cache):
    spec = _spec(params)
    entry, _ = build(spec, params["arch"], cache=cache)
    _check(entry, spec, params["arch"])


FULL = [dict(zip(NAMES, row)) for row in itertools.product(*PARAMETERS.values())]


@pytest.mark.slow
@pytest.mark.parametrize("params", FULL, ids=lambda p: f"{_spec(p).kernel_name}-{p['arch']}")
def test_full_product_compiles_without_spills(params, cache):
    spec = _spec(params)
    entry, _ = build(spec, params["arch"], cache=cache)
    _check(entry, spec, params["arch"])
