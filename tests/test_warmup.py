"""The warm-up's machinery: architectures checked up front, compiler processes (how many, that
they die with the command, that an error every kernel would meet stops them), and what is
reported as stored."""

from __future__ import annotations

import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.jit import nvrtc


def test_check_archs_normalizes_and_keeps_the_order():
    assert nvrtc.check_archs(["sm_90a", "80", "compute_90", "sm_80"]) == (
        "sm_90a", "sm_80", "sm_90")


def test_check_archs_refuses_what_this_nvrtc_cannot_compile_listing_what_it_can(monkeypatch):
    info = nvrtc.nvrtc_info()
    fake = nvrtc.NvrtcInfo(version=(13, 0), path=info.path, fingerprint=info.fingerprint,
                           supported_archs=("sm_75", "sm_80", "sm_90", "sm_100"))
    monkeypatch.setattr(nvrtc, "nvrtc_info", lambda: fake)
    assert nvrtc.check_archs(["sm_90a", "sm_100f", "sm_75"]) == ("sm_90a", "sm_100f", "sm_75")
    with pytest.raises(ArgumentValueError) as e:
        nvrtc.check_archs(["sm_80", "sm_70", "sm_999"])
    msg = str(e.value)
    assert msg.startswith("arch: sm_70, sm_999: not supported by NVRTC 13.0"), msg
    assert "sm_75, sm_80, sm_90, sm_100" in msg and "\n" not in msg
    with pytest.raises(ArgumentValueError, match="arch: expected a CUDA architecture"):
        nvrtc.check_archs(["hopper"])


def test_check_archs_against_the_loaded_nvrtc():
    supported = nvrtc.nvrtc_info().supported_archs
    assert "sm_80" in supported
    with pytest.raises(ArgumentValueError, match="sm_999"):
        nvrtc.check_archs(["sm_999"])


def _jobs(n: int):
    from ge2jit.ops.gemm.spec import SIMT_F32_TILES, Act, BiasKind, DType, GemmSpec, Layout

    acts = [Act.RELU, Act.GELU, Act.SILU, Act.TANH, Act.SIGMOID, Act.NONE]
    return [(GemmSpec(DType.F32, Layout.ROW, Layout.ROW, None, act, BiasKind.COL, False,
                      tile), "sm_80") for act in acts for tile in SIMT_F32_TILES][:n]


class _Pools:
    """Records the size of each process pool compile_many starts (then starts it)."""

    def __init__(self, monkeypatch):
        from ge2jit.jit import parallel

        self.sizes: list[int] = []
        real = parallel.ProcessPoolExecutor

        def pool(max_workers, **kw):
            self.sizes.append(max_workers)
            return real(max_workers, **kw)

        monkeypatch.setattr(parallel, "ProcessPoolExecutor", pool)


@pytest.mark.parametrize("cores, requested, jobs, expected", [
    (2, 60, 5, 2),      # -j 60 on two cores: two processes
    (64, 60, 3, 3),     # never more processes than jobs
    (64, None, 3, 3),
    (2, None, 5, 2),
    (64, 1, 3, None),   # one process: in this one, no pool
])
def test_compiler_processes_are_bounded_by_cores_and_jobs(tmp_path, monkeypatch, cores,
                                                          requested, jobs, expected):
    from ge2jit.jit import parallel

    monkeypatch.setattr(parallel, "usable_cores", lambda: cores)
    pools = _Pools(monkeypatch)
    out = parallel.compile_many(_jobs(jobs), processes=requested, cache_root=tmp_path)
    assert [r.status for r in out] == ["compiled"] * jobs
    assert pools.sizes == ([expected] if expected else [])


def test_compile_many_refuses_a_process_count_below_one(tmp_path):
    from ge2jit.jit.parallel import compile_many

    for bad in (0, -1):
        with pytest.raises(ArgumentValueError, match="processes: expected a positive"):
            compile_many(_jobs(2), processes=bad, cache_root=tmp_path)
