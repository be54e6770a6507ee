"""GE2JIT_DUMP_DIR: each kernel a process uses, compiled or from the cache, is written once as
source, PTX, cubin, SASS and NVRTC's log; no GPU needed."""

from __future__ import annotations

import pytest

from ge2jit.jit import dump
from ge2jit.jit.cache import KernelCache
from ge2jit.jit.loader import build
from ge2jit.jit.sass import find_cuobjdump
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec
from ge2jit.settings import reload_settings

SPEC = TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                     Epilogue(out_dtype=DType.F32, act=Act.GELU, bias=BiasKind.COL,
                              bias_dtype=DType.F32), TILED_CONFIGS[0])


@pytest.fixture
def dump_dir(tmp_path, monkeypatch):
    where = tmp_path / "dumps"
    monkeypatch.setenv("GE2JIT_DUMP_DIR", str(where))
    monkeypatch.setattr(dump, "_done", set())
    reload_settings()
    yield where
    monkeypatch.delenv("GE2JIT_DUMP_DIR")
    reload_settings()


def test_a_kernel_is_dumped_once_whether_compiled_or_cached(tmp_path, dump_dir):
    cache = KernelCache(tmp_path / "c")
    entry, cached = build(SPEC, "sm_80", cache=cache)
    assert not cached
    base = dump_dir / f"{SPEC.kernel_name}.sm_80"
    files = {s: base.parent / f"{base.name}{s}" for s in (".cu", ".ptx", ".cubin", ".sass",
                                                          ".log")}
    assert all(p.is_file() for p in files.values()), sorted(p.name for p in dump_dir.iterdir())
    assert SPEC.kernel_name in files[".cu"].read_text()
    ptx = files[".ptx"].read_text()
    assert ".entry" in ptx and SPEC.kernel_name in ptx and ".target sm_80" in ptx
    assert files[".cubin"].read_bytes() == entry.cubin
    log = files[".log"].read_text()
    assert entry.key in log and "--gpu-architecture=sm_80" in log and "registers:" in log
    sass = files[".sass"].read_text()
    if find_cuobjdump() is not None:
        assert "FFMA" in sass
    else:
        assert sass.startswith("// no SASS:")
    # once per process: a second build (from the cache now) writes nothing again
    files[".cu"].unlink()
    _, cached = build(SPEC, "sm_80", cache=cache)
    assert cached and not files[".cu"].exists()
    # a new process (the set of dumped kernels forgotten) dumps the cached kernel
    dump._done.clear()
    build(SPEC, "sm_80", cache=cache)
    assert files[".cu"].is_file()


def test_the_hopper_kernels_ptx_names_sm_90a(tmp_path, dump_dir):
    from ge2jit.ops.gemm.spec import WGMMA_CONFIGS, WgmmaGemmSpec

    spec = WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL,
                         Epilogue(out_dtype=DType.BF16, act=Act.NONE, bias=BiasKind.NONE),
                         WGMMA_CONFIGS[0])
    build(spec, "sm_90a", cache=KernelCache(tmp_path / "c"))
    ptx = (dump_dir / f"{spec.kernel_name}.sm_90a.ptx").read_text()
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx


def test_a_dump_directory_that_is_a_file_is_one_clear_error(tmp_path, monkeypatch):
    from ge2jit.errors import SettingsError
    from ge2jit.settings import get_settings

    (tmp_path / "f").write_text("")
    monkeypatch.setenv("GE2JIT_DUMP_DIR", str(tmp_path / "f"))
    reload_settings()
    try:
        with pytest.raises(SettingsError, match="GE2JIT_DUMP_DIR=.*expected a directory"):
            get_settings().check()
    finally:
        monkeypatch.delenv("GE2JIT_DUMP_DIR")
        reload_settings()
