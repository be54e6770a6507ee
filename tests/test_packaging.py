"""A wheel built from the repository, installed into a fresh virtual environment outside it,
ships the kernel templates and compiles kernels from them."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from the repository."""
    pytest.importorskip("hatchling")
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(ROOT)], check=True, timeout=300)
    (built,) = dist.glob("ge2jit-*.whl")
    return built


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(name))


def test_cuda_extras_bring_what_the_readme_uses(wheel):
    """The README's bfloat16 example needs ml_dtypes: each CUDA extra brings it."""
    requires = _metadata(wheel).get_all("Requires-Dist")
    for extra in ("cuda13", "cuda12"):
        names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-")
                 for r in requires if f"extra == '{extra}'" in r.replace('"', "'")}
        assert "ml-dtypes" in names and "cupy-" + extra + "x" in names, (extra, names)


def test_tools_extra_brings_the_disassemblers(wheel):
    """KernelInfo.sass()'s error names this extra."""
    requires = [r.replace('"', "'") for r in _metadata(wheel).get_all("Requires-Dist")]
    for tool in ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"):
        for extra in ("tools", "test"):
            assert any(r.startswith(tool) and f"extra == '{extra}'" in r for r in requires)


def test_wheel_ships_the_compiled_launch_path_for_this_interpreter(wheel):
    """The C launch path is built into the wheel, which is tagged for this interpreter and
    platform (a module built for one Python does not load in another)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    with zipfile.ZipFile(wheel) as z:
        assert f"ge2jit/jit/_fastlaunch{suffix}" in z.namelist()
        (wheel_file,) = [n for n in z.namelist() if n.endswith(".dist-info/WHEEL")]
        tags = [t for t in z.read(wheel_file).decode().splitlines() if t.startswith("Tag:")]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tags and all(t.split(": ")[1].startswith(f"{tag}-{tag}-") for t in tags), tags
    assert "Root-Is-Purelib: false" in z_read(wheel, wheel_file)


def z_read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name).decode()


def test_wheel_metadata_license_and_typing_marker(wheel):
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) >= {"Homepage", "Source", "Issues"}
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = meta.get_all("Classifier")
    for wanted in ("Programming Language :: Python :: 3.11", "Environment :: GPU :: NVIDIA CUDA",
                   "Typing :: Typed"):
        assert wanted in classifiers, wanted
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression"
    assert any(c.startswith("Topic :: ") for c in classifiers)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(license_file).startswith(b"MIT License")
        assert "ge2jit/py.typed" in names


def test_wheel_ships_templates_and_compiles(tmp_path, wheel):
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
        assert (template_dir() / "gemm" / "tiled.cu").is_file()
        epilogue = Epilogue(out_dtype=DType.F32, act=Act.GELU, bias=BiasKind.COL,
                            bias_dtype=DType.F32, save_z=True)
        spec = TiledGemmSpec(DType.F32, Layout.ROW, Layout.COL, epilogue, TILED_CONFIGS[0])
        entry, _ = build(spec, "sm_80", cache=KernelCache(pathlib.Path(r"%s")))
        from ge2jit.jit.fastlaunch import launch_path
        path = launch_path()
        assert path["path"] == "compiled", path          # the wheel's prebuilt module
        assert pathlib.Path(path["module"]).is_relative_to(site), path
        print("OK", entry.kernel_name, entry.registers)
    """) % (site, tmp_path / "cache")
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK gemm_f32_rc_128x128x8_8x8_gelu_colbias_z")


def test_without_cupy_each_call_names_the_extra():
    """``pip install ge2jit`` without a CUDA extra: import works; the first call that needs
    CuPy (or NVRTC through it) says which extra to install."""
    code = textwrap.dedent("""
        import sys
        sys.modules["cupy"] = sys.modules["cupy_backends"] = None   # as if not installed
        import numpy as np
        import ge2jit
        from ge2jit import MissingDependencyError
        from ge2jit.jit.loader import build
        from ge2jit.ops.gemm.spec import *
        a = np.ones((4, 4), np.float32)
        calls = {
            "gemm_bias_act": lambda: ge2jit.gemm_bias_act(a, a),
            "explain": lambda: ge2jit.explain(a, a),
            "adam_update": lambda: ge2jit.adam_update(a, a, a, a, step=1),
            "nvrtc_info": ge2jit.nvrtc_info,
            "compile": lambda: build(TiledGemmSpec(DType.F32, Layout.ROW, Layout.COL,
                                                   Epilogue(out_dtype=DType.F32),
                                                   TILED_CONFIGS[0]), "sm_80"),
            "inspect": lambda: ge2jit.inspect("64x64x8_4x4", arch="sm_80"),
            "device_arch": lambda: ge2jit.jit.device.device_arch(0),
        }
        for name, call in calls.items():
            try:
                call()
            except MissingDependencyError as e:
                print(name, "|", e)
            else:
                print(name, "| no error")
        print("gpu_count", ge2jit.jit.device.gpu_count())
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 8 and lines[-1] == "gpu_count 0", r.stdout
    for line in lines[:-1]:
        assert line.split(" | ")[1].startswith("cupy is not installed; install ge2jit with a "
                                              'CUDA extra: pip install "ge2jit[cuda13]"'), line
        assert '"ge2jit[cuda12]"' in line, line


def _make_n(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``make -n ARGS`` with the repository's Makefile in ``tmp_path`` (its environments are
    looked for there: nothing is installed, nothing of the checkout's is touched)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch(exist_ok=True)
    os.utime(tmp_path / "pyproject.toml", (1, 1))   # older than any environment's marker
    # as a user's own make: not a sub-make of `make test` (whose MAKEFLAGS and MAKELEVEL would
    # print "Entering directory" lines and pass its variables on), no CUDA or VENV from outside
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "CUDA", "VENV")}
    return subprocess.run(["make", "-n", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)


def test_make_keeps_one_environment_per_cuda_major(tmp_path):
    default = _make_n(tmp_path, "demo")
    assert default.returncode == 0, default.stderr
    assert default.stdout.splitlines() == [
        "python3 -m venv .venv", ".venv/bin/python -m pip install -q --upgrade pip",
        '.venv/bin/python -m pip install -q -e ".[cuda13,test]"',
        "touch .venv/.installed-cuda13", ".venv/bin/python -m ge2jit.demo"]
    (tmp_path / ".venv").mkdir()   # as after `make demo`: .venv made and up to date
    (tmp_path / ".venv" / ".installed-cuda13").touch()
    assert _make_n(tmp_path, "test").stdout.splitlines() == [".venv/bin/ruff check .",
                                                            ".venv/bin/python -m pytest"]
    cuda12 = _make_n(tmp_path, "demo", "CUDA=cuda12")
    assert cuda12.returncode == 0, cuda12.stderr
    assert cuda12.stdout.splitlines() == [
        "python3 -m venv .venv-cuda12", ".venv-cuda12/bin/python -m pip install -q --upgrade pip",
        '.venv-cuda12/bin/python -m pip install -q -e ".[cuda12,test]"',
        "touch .venv-cuda12/.installed-cuda12", ".venv-cuda12/bin/python -m ge2jit.demo"]


def test_make_refuses_to_mix_cuda_majors_in_one_environment(tmp_path):
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".installed-cuda13").touch()
    r = _make_n(tmp_path, "demo", "CUDA=cuda12", "VENV=.venv")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert len(r.stderr.splitlines()) == 1 and r.stderr.rstrip().endswith(
        "*** .venv holds ge2jit for cuda13, not cuda12: leave VENV unset (CUDA=cuda12 uses "
        ".venv-cuda12) or name another VENV.  Stop."), r.stderr
