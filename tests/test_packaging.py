"""A wheel built from the repository, installed into a fresh virtual environment outside it,
ships the kernel templates and compiles kernels from them."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_and_compiles(tmp_path):
    pytest.importorskip("hatchling")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(ROOT)], check=True, timeout=300)
    (wheel,) = dist.glob("ge2jit-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, timeout=300)
    # The dependencies (jinja2, numpy, cupy, nvrtc) come from this interpreter's site-packages,
    # added as plain paths: .pth files there (an editable ge2jit) are not processed.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    code = textwrap.dedent("""
        import ge2jit, pathlib
        from ge2jit.jit.render import template_dir
        from ge2jit.jit.loader import build
        from ge2jit.jit.cache import KernelCache
        from ge2jit.ops.gemm.spec import *
        site = pathlib.Path(r"%s")
        assert pathlib.Path(ge2jit.__file__).is_relative_to(site), ge2jit.__file__
        assert template_dir().is_relative_to(site), template_dir()
        assert (template_dir() / "gemm" / "simt.cu").is_file()
        spec = GemmSpec(DType.F32, Layout.ROW, Layout.COL, None, Act.GELU, BiasKind.COL, True,
                        SIMT_F32_TILES[0])
        entry, _ = build(spec, "sm_80", cache=KernelCache(pathlib.Path(r"%s")))
        print("OK", entry.kernel_name, entry.registers)
    """) % (site, tmp_path / "cache")
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK gemm_f32_rc_128x128x8_8x8_gelu_colbias_z")
