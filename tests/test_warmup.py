"""The warm-up's machinery: architectures checked up front, compiler processes (how many, that
they die with the command, that an error every kernel would meet stops them), and what is
reported as stored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.jit import nvrtc

ROOT = Path(__file__).resolve().parent.parent


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
    from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
    from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec

    acts = [Act.RELU, Act.GELU, Act.SILU, Act.TANH, Act.SIGMOID, Act.NONE]
    return [(TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                           Epilogue(out_dtype=DType.F32, act=act, bias=BiasKind.COL,
                                    bias_dtype=DType.F32), tile), "sm_80")
            for act in acts for tile in TILED_CONFIGS][:n]


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


# --- compiler processes end with the command ---------------------------------------------------


#: 5 activations x every config: enough kernels to keep two compiler processes busy a while
MANY = textwrap.dedent("""
    archs = ["sm_80"]

    [[gemm_bias_act]]
    acts = ["relu", "gelu", "silu", "tanh", "sigmoid"]
    bias = ["col"]
    layouts = ["rr"]
    configs = "all"
""")


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo.extend(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be collected


def _start_warmup(tmp_path) -> tuple[subprocess.Popen, set[int]]:
    """A warm-up with -j 2, once both its compiler processes run: (process, descendants)."""
    cfg = tmp_path / "many.toml"
    cfg.write_text(MANY)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GE2JIT_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen([sys.executable, "-m", "ge2jit", "warmup", str(cfg), "-j", "2",
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        kids = _descendants(proc.pid)
        workers = [k for k in kids if b"spawn_main" in _cmdline(k)]
        if len(workers) == 2:
            time.sleep(1.0)  # well into their first compiles
            return proc, _descendants(proc.pid)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no compiler processes came up: {proc.communicate()}")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.time() + seconds
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if _alive(p)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_compiler_processes_die_with_a_killed_warmup(tmp_path):
    proc, kids = _start_warmup(tmp_path)
    assert len(kids) >= 2, kids
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = _wait_gone(kids, 5)
    for p in left:  # clean up before failing
        os.kill(p, signal.SIGKILL)
    assert not left, [_cmdline(p) for p in left]


def test_without_prctl_a_thread_ends_the_worker_with_its_parent(tmp_path):
    # parent -> worker, the worker armed as on a system without prctl (not Linux)
    worker = textwrap.dedent("""
        import os, sys, time
        from ge2jit.jit import parallel
        sys.platform = "darwin"
        parallel._die_with_parent(os.getppid())
        print("armed", flush=True)
        time.sleep(120)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        w = subprocess.Popen([sys.executable, "-c", {worker!r}], stdout=subprocess.PIPE)
        assert w.stdout.readline() == b"armed\\n"
        print(w.pid, flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env, stdout=subprocess.PIPE)
    pid = int(proc.stdout.readline())
    assert _alive(pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = _wait_gone({pid}, 5)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left


# --- an error that every kernel would meet stops the warm-up --------------------------------


@pytest.mark.parametrize("variable, value, error", [
    ("GE2JIT_NVRTC", "no-libnvrtc.so", "NvrtcError"),   # each worker fails to load NVRTC
    ("GE2JIT_CACHE_MAX_SIZE", "lots", "SettingsError"),  # each put fails to read the cap
])
def test_an_error_every_worker_meets_stops_everything_at_once(tmp_path, monkeypatch, variable,
                                                              value, error):
    from ge2jit import errors
    from ge2jit.jit.parallel import compile_many

    monkeypatch.setenv(variable, value)  # the workers start with this environment
    seen = []
    t0 = time.time()
    with pytest.raises(getattr(errors, error), match=variable):
        compile_many(_jobs(40), processes=2, cache_root=tmp_path / "c", on_result=seen.append)
    assert seen == [] and time.time() - t0 < 60


def test_a_missing_dependency_stops_a_serial_warmup_at_the_first_kernel(tmp_path, monkeypatch):
    from ge2jit.errors import MissingDependencyError
    from ge2jit.jit import loader
    from ge2jit.jit.parallel import compile_many

    calls = []

    def build(spec, arch, cache=None):
        calls.append(spec)
        raise MissingDependencyError("cupy is not installed: pip install 'ge2jit[cuda13]'")

    monkeypatch.setattr(loader, "build", build)
    with pytest.raises(MissingDependencyError, match="cupy is not installed"):
        compile_many(_jobs(5), processes=1, cache_root=tmp_path)
    assert len(calls) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupted_warmup_stops_its_compiler_processes(tmp_path):
    proc, kids = _start_warmup(tmp_path)
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, to the command alone
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130 and err.strip() == "ge2jit warmup: interrupted", err
    left = _wait_gone(kids, 5)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left


# --- the warm-up file and arguments from Python -------------------------------------------------


def test_a_warmup_file_is_read_up_to_a_size(tmp_path, monkeypatch):
    from ge2jit import precompile
    from ge2jit.precompile import WarmupConfigError, load

    monkeypatch.setattr(precompile, "MAX_FILE_BYTES", 100)
    cfg = tmp_path / "w.toml"
    cfg.write_text('archs = ["sm_80"]\n' + "#" * 200 + "\n")
    with pytest.raises(WarmupConfigError, match=r"w.toml: more than 100 bytes"):
        load(cfg)
    monkeypatch.undo()
    with pytest.raises(WarmupConfigError, match=r"/dev/zero: more than 16777216 bytes"):
        load("/dev/zero")  # endless: read no further than the limit


@pytest.mark.parametrize("sms", [0, -4, 2**31, 1.5, True])
def test_sms_from_python_is_checked(tmp_path, sms):
    from ge2jit.precompile import WarmupConfigError, load

    cfg = tmp_path / "w.toml"
    cfg.write_text('archs = ["sm_80"]\n[[adam_update]]\n')
    with pytest.raises(WarmupConfigError, match=r"sms: expected a positive integer"):
        load(cfg, sms=sms)


WARMUP = 'archs = ["sm_80"]\n[[adam_update]]\n'


@pytest.mark.parametrize("archs, expected", [
    ("sm_90", ("sm_90",)), ("90a", ("sm_90a",)), (("sm_80", "sm_90"), ("sm_80", "sm_90")),
    (["sm_90a"], ("sm_90a",)),
])
def test_archs_from_python_take_one_name_or_a_list(tmp_path, archs, expected):
    """A string is one architecture, not the letters of one (it was read as 's', 'm', ...)."""
    from ge2jit.precompile import load

    cfg = tmp_path / "w.toml"
    cfg.write_text(WARMUP)
    plan = load(cfg, archs=archs)
    assert plan.archs == expected and len(plan.jobs) > 0


@pytest.mark.parametrize("archs", [90, {"sm_90"}, b"sm_90"])
def test_archs_of_another_type_are_one_line_errors(tmp_path, archs):
    from ge2jit.precompile import WarmupConfigError, load

    cfg = tmp_path / "w.toml"
    cfg.write_text(WARMUP)
    with pytest.raises(WarmupConfigError, match=r"^archs: expected an architecture such as "
                                                r"'sm_90a' or a list of them, got "):
        load(cfg, archs=archs)


@pytest.mark.parametrize("text, got", [("", "an empty file"), ("# nothing yet\n", "an empty file"),
                                       ('archs = ["sm_80"]\n', "only archs")])
def test_a_warmup_file_without_kernels_is_an_error(tmp_path, text, got):
    from ge2jit.precompile import WarmupConfigError, load

    cfg = tmp_path / "w.toml"
    cfg.write_text(text)
    with pytest.raises(WarmupConfigError) as e:
        load(cfg, archs="sm_80")
    msg = str(e.value)
    assert msg.startswith(f"{cfg}: the warm-up file lists no kernels: expected at least one "
                          "table such as [[gemm_bias_act]] (accepted: gemm_bias_act, ")
    assert f"got {got};" in msg and "\n" not in msg


def test_progress_without_a_terminal_is_plain_lines(capsys):
    from ge2jit import precompile

    bar = precompile._progress(25)           # pytest's stderr is no terminal
    for _ in range(25):
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 10 and lines[-1].startswith("ge2jit warmup: 25/25 kernels (100%), ")
    assert lines[0].startswith("ge2jit warmup: 3/25 kernels (12%), ")


def test_progress_on_a_terminal_is_a_bar(monkeypatch):
    from ge2jit import precompile

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = precompile._progress(3)
    try:
        assert type(bar).__module__.startswith("tqdm")
    finally:
        bar.close()
