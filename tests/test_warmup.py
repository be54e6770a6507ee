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
