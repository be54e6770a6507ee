"""The ge2jit command: warm-up from a TOML file (no GPU needed with --arch) and the cache tools."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ge2jit.errors import CacheWarning
from ge2jit.jit.cache import KernelCache

SMALL = textwrap.dedent("""
    archs = ["sm_80"]

    [[gemm_bias_act]]
    acts = ["relu", "gelu"]
    bias = ["col"]
    layouts = ["rr"]
    configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]
    shapes = [[256, 256, 256]]
""")


ROOT = Path(__file__).resolve().parent.parent


def ge2jit(args, cache: Path, timeout=600, env=None, **kw):
    # PYTHONPATH: this checkout's ge2jit, also from another working directory
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GE2JIT_CACHE_DIR": str(cache), **(env or {})}
    return subprocess.run([sys.executable, "-m", "ge2jit", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, **kw)


def write(tmp_path, text, name="w.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def valid_entries(cache: Path) -> tuple[int, int]:
    good = bad = 0
    for _, e in KernelCache(cache).entries():
        good += e is not None
        bad += e is None
    return good, bad


def test_warmup_compiles_then_finds_everything_cached(tmp_path):
    cfg = write(tmp_path, SMALL)
    r = ge2jit(["warmup", str(cfg), "-j", "2", "--no-progress"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    # 2 acts x (pipelined: aligned and unaligned variants; tiled: one) = 6 kernels
    assert "6 compiled, 0 already cached, 0 failed" in r.stdout
    assert valid_entries(tmp_path / "c") == (6, 0)
    # the compiled launch path's module beside the kernels: a job on this cache builds nothing
    (module,) = (tmp_path / "c" / "launch").glob("_fastlaunch-*")
    again = ge2jit(["warmup", str(cfg), "--no-progress"], tmp_path / "c")
    assert again.returncode == 0 and "0 compiled, 6 already cached, 0 failed" in again.stdout
    assert list((tmp_path / "c" / "launch").iterdir()) == [module]


def test_arch_option_overrides_the_file(tmp_path):
    cfg = write(tmp_path, SMALL)
    r = ge2jit(["warmup", str(cfg), "--arch", "sm_90", "--arch", "sm_80", "-j", "2",
                "--no-progress"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "12 compiled" in r.stdout
    archs = {e.arch for _, e in KernelCache(tmp_path / "c").entries()}
    assert archs == {"sm_80", "sm_90"}


@pytest.mark.parametrize("text, line, words", [
    ("colour = 1\n" + SMALL, 1, ["colour: unknown key", "accepted: archs, gemm_bias_act"]),
    (SMALL + "colour = 1\n", 10,
     ["colour: unknown key", "accepted keys: dtypes, out_dtypes, bias_dtypes, c_dtypes, acts"]),
    (SMALL.replace("acts =", "act ="), 5, ["act: unknown key", "acts"]),
    (SMALL.replace('["col"]', '["colum"]'), 6, ["bias: expected", "'col'", "'row'"]),
    (SMALL.replace('["rr"]', '["rx"]'), 7, ["layouts: expected", "'rc'"]),
    (SMALL.replace('"64x64x8_4x4"', '"huge"'), 8, ["configs:", "128x128x8_w32x64_s3"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 256]]"), 9, ["shapes: expected"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 2147418113, 256]]"), 9,
     ["shapes:", "N = 2147418113", "at most 2147418112 (2**31 - 2**16)"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 256, 2147483648]]"), 9,
     ["shapes:", "K = 2147483648", "at most 2147483647 (2**31 - 1)"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 256, 256], [-1, 256, 256]]"), 9,
     ["shapes: expected", "positive integers"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 0, 256]]"), 9, ["shapes: expected"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 256.0, 256]]"), 9, ["shapes: expected"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, true, 256]]"), 9, ["shapes: expected"]),
    (SMALL.replace("[[256, 256, 256]]", "[[256, 256, 256]]\nsms = 4294967296"), 10,
     ["sms:", "up to 2**31 - 1"]),
    (SMALL.replace('["sm_80"]', '["sm_8"]'), 2, ["arch: expected a CUDA architecture"]),
    (SMALL.replace("acts = [", "acts = [[", 1), 6, ["not valid TOML"]),
    (SMALL.replace('configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]', 'configs = "heuristic"'),
     4, ["sms:", "multiprocessor count", "--sms"]),
    (SMALL.replace("shapes = [[256, 256, 256]]\n", "").replace(
        'configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]', 'configs = "heuristic"'),
     4, ["shapes: configs = 'heuristic' needs the shapes"]),
])
def test_config_errors_name_file_line_and_accepted_values(tmp_path, text, line, words):
    cfg = write(tmp_path, text)
    r = ge2jit(["warmup", str(cfg), "--no-progress"], tmp_path / "c")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"{cfg}:{line}:" in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "c").exists() or valid_entries(tmp_path / "c") == (0, 0)


def test_a_warmup_file_that_is_not_utf8_is_one_line(tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_bytes(SMALL.encode() + b"# caf\xe9 au lait\n")
    line = one_line_error(ge2jit(["warmup", str(cfg)], tmp_path / "c"), "ge2jit warmup")
    assert f"{cfg}:10:" in line and "UTF-8" in line, line


def test_heuristic_configs_with_sms_on_a_machine_without_gpu(tmp_path):
    cfg = write(tmp_path, SMALL.replace('configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]',
                                        'configs = "heuristic"\nsms = 132'))
    r = ge2jit(["warmup", str(cfg), "-j", "2", "--no-progress"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    names = {e.kernel_name for _, e in KernelCache(tmp_path / "c").entries()}
    # 256 x 256 on 132 SMs: 64x64 tiles, K = 256 is too short to split
    assert names and all("64x64x16_w32x32_s3" in n for n in names), names


def test_tensor_core_warmup_for_hopper_without_gpu(tmp_path):
    cfg = write(tmp_path, textwrap.dedent("""
        archs = ["sm_90"]

        [[gemm_bias_act]]
        dtypes = ["bfloat16", "tf32"]
        bias_dtypes = ["float32"]
        acts = ["gelu_tanh"]
        bias = ["col"]
        layouts = ["rc"]
        configs = "heuristic"
        sms = 132
        shapes = [[4096, 4096, 4096]]
    """))
    r = ge2jit(["warmup", str(cfg), "-j", "2", "--no-progress"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    entries = [e for _, e in KernelCache(tmp_path / "c").entries()]
    by_name = {e.kernel_name: e.arch for e in entries}
    # aligned: the Hopper kernel, compiled for sm_90a; the least aligned variant steps down
    # (bfloat16 at 2-byte alignment: the plain kernel; tf32: mma.sync)
    hopper = {n: a for n, a in by_name.items() if "_wgmma_" in n}
    assert {n.split("_")[1] for n in hopper} == {"bf16", "f32"}, by_name
    assert set(hopper.values()) == {"sm_90a"}
    assert all(n.endswith("colbiasf32") for n in hopper if n.startswith("gemm_bf16"))
    assert any("_64x64x8_4x4_" in n and a == "sm_90" for n, a in by_name.items()), by_name
    assert any(n.startswith("gemm_f32_rc_mma_") for n in by_name), by_name


def test_example_warmup_file_is_printed_by_the_command_and_expands(tmp_path):
    from ge2jit.precompile import example, load

    r = ge2jit(["warmup", "--example"], tmp_path / "c")
    assert r.returncode == 0 and r.stdout == example() and r.stderr == "", r.stderr
    assert r.stdout.startswith("# ge2jit warm-up") and "ge2jit warmup --example" in r.stdout
    (tmp_path / "warmup.toml").write_text(r.stdout)
    plan = load(tmp_path / "warmup.toml", archs=["sm_90"], sms=132)
    names = {spec.kernel_name for spec, _ in plan.jobs}
    assert any(n.startswith("gemm_bf16_") and "_wgmma_" in n for n in names)
    assert any(n.startswith("gemm_f16_") and n.endswith("_of32") for n in names)
    # the backward's entry: its dZ pass, dBias sums and gated dA with the previous bias' sums
    assert any(n.startswith("gemm_dz_gelu_tanh_zbf16") for n in names), names
    assert any(n.endswith("_gzgelu_tanh_cr_bg") for n in names), names
    assert {"adam_update_gbf16_copybf16", "adam_update_gf32"} <= names


def test_the_wheel_ships_the_example_warmup_file(tmp_path):
    import zipfile

    pytest.importorskip("hatchling")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("ge2jit-*.whl")
    from ge2jit.precompile import example

    with zipfile.ZipFile(wheel) as z:
        assert z.read("ge2jit/data/warmup.toml").decode() == example()


@pytest.mark.parametrize("args, words", [
    (["warmup"], ["give the warm-up FILE", "--example"]),
    (["warmup", "w.toml", "--example"], ["--example", "not both"]),
])
def test_warmup_needs_a_file_or_example(tmp_path, args, words):
    line = one_line_error(ge2jit(args, tmp_path / "c"), "ge2jit warmup")
    for w in words:
        assert w in line, line


def test_optimizer_warmup_tables():
    from ge2jit.ops.optim.warmup import adam, sgd

    entry = sgd.validate_entry({"grad_dtypes": ["float16"], "copy_dtypes": ["none", "float16"],
                                "nesterov": [False, True]})
    assert {s.kernel_name for s in sgd.expand(entry, "sm_80")} == {
        "sgd_update_gf16", "sgd_nesterov_update_gf16", "sgd_update_gf16_copyf16",
        "sgd_nesterov_update_gf16_copyf16"}
    assert [s.kernel_name for s in adam.expand(adam.validate_entry({}), "sm_80")] == [
        "adam_update_gf32"]
    with pytest.raises(ValueError, match="nesterov: unknown key"):
        adam.validate_entry({"nesterov": [True]})
    with pytest.raises(ValueError, match="copy_dtypes: expected a list of"):
        adam.validate_entry({"copy_dtypes": ["int8"]})


def test_tf32x3_warmup_expands_to_what_calls_run():
    from ge2jit.ops.gemm.warmup import expand, validate_entry

    entry = validate_entry({"dtypes": ["tf32x3"], "acts": ["gelu"], "bias": ["col"],
                            "layouts": ["rr"], "configs": "heuristic",
                            "shapes": [[4096, 4096, 4096], [512, 1024, 4096],
                                       [8192, 64, 4096]]})
    names = {spec.kernel_name for spec in expand(entry, "sm_90", sms=132)}
    # 4096^3: the 128x128 Hopper kernel with rounded chunks, both operands split
    assert any("_wgmma_128x128_s6_y16_p_gelu" in n for n in names), names
    assert {"tf32x3_split_hhl", "tf32x3_split_hlh_t"} <= names
    # 512 x 1024 x 4096: 128x64 tiles, K split in two, the epilogue in the reduction
    assert any("_wgmma_128x64_s8_y16_p_splitk" in n for n in names), names
    assert any(n.startswith("gemm_splitk_reduce_f32_gelu_colbias") for n in names), names
    # 8192 x 64 x 4096: too narrow for the split copies: the exact float32 kernel
    assert any(n.startswith("gemm_f32_rr_") and "_v" in n and "_wgmma_" not in n
               for n in names), names


def test_two_overlapping_warmups_at_once(tmp_path):
    a = write(tmp_path, SMALL, "a.toml")
    b = write(tmp_path, SMALL.replace('["relu", "gelu"]', '["gelu", "silu"]'), "b.toml")
    env = {**os.environ, "GE2JIT_CACHE_DIR": str(tmp_path / "c")}
    procs = [subprocess.Popen([sys.executable, "-m", "ge2jit", "warmup", str(p), "-j", "1",
                               "--no-progress"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for p in (a, b)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert valid_entries(tmp_path / "c") == (9, 0)


def test_warmup_killed_midway_leaves_no_partial_entry(tmp_path):
    big = SMALL.replace('["relu", "gelu"]', '["relu", "gelu", "silu", "tanh", "sigmoid"]')
    big = big.replace('configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]', 'configs = "all"')
    cfg = write(tmp_path, big)
    cache = tmp_path / "c"
    env = {**os.environ, "GE2JIT_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "ge2jit", "warmup", str(cfg), "-j", "2",
                             "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and valid_entries(cache)[0] < 3:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)      # the command and its compiler processes
    proc.wait(timeout=30)
    good, bad = valid_entries(cache)
    assert good >= 3 and bad == 0, "every entry on disk is whole"
    r = ge2jit(["warmup", str(cfg), "-j", "2", "--no-progress"], cache)
    assert r.returncode == 0, r.stderr
    assert f"{good} already cached" in r.stdout or "already cached" in r.stdout
    assert valid_entries(cache)[1] == 0


def test_unwritable_cache_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = ge2jit(["warmup", str(write(tmp_path, SMALL)), "--no-progress"], blocker / "cache")
    line = one_line_error(r, "ge2jit warmup", 1)  # the work cannot be done: not a mistake
    assert "is not writable" in line and "GE2JIT_CACHE_DIR" in line


def test_cache_info_list_prune_clear(tmp_path):
    cache = tmp_path / "c"
    assert ge2jit(["warmup", str(write(tmp_path, SMALL)), "-j", "2", "--no-progress"],
                  cache).returncode == 0
    info = ge2jit(["cache", "info"], cache)
    assert info.returncode == 0 and f"location:  {cache}" in info.stdout
    assert "entries:   6" in info.stdout and "NVRTC:     NVRTC" in info.stdout
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    info = ge2jit(["cache", "info"], cache, env={"GE2JIT_CACHE_DIR": f"{cache}:{shared}"})
    assert f"location:  {cache}\nread-only: {shared}\n" in info.stdout
    listing = ge2jit(["cache", "list"], cache).stdout
    assert "gemm_f32_rr_64x64x8_w32x32_s3" in listing and "sm_80" in listing
    # make one entry old: --older-than removes it alone
    oldest = sorted(cache.glob("??/*.cubin"))[0]
    os.utime(oldest, (time.time() - 40 * 86400,) * 2)
    r = ge2jit(["cache", "prune", "--older-than", "30d"], cache)
    assert r.returncode == 0 and "removed 1 entries" in r.stdout
    r = ge2jit(["cache", "prune", "--max-size", "1"], cache)
    assert "removed 5 entries" in r.stdout
    assert ge2jit(["cache", "prune"], cache).returncode == 2
    assert ge2jit(["warmup", str(write(tmp_path, SMALL)), "--no-progress"],
                  cache).returncode == 0
    r = ge2jit(["cache", "clear"], cache)
    assert "removed 6 entries" in r.stdout and valid_entries(cache) == (0, 0)


def test_a_cap_smaller_than_a_kernel_is_kept_in_memory_with_one_warning(tmp_path):
    from ge2jit.jit.loader import build
    from ge2jit.ops.gemm.epilogue import Act, Epilogue, Layout
    from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec

    c = KernelCache(tmp_path, max_size=1000)
    spec = TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                         Epilogue(out_dtype=DType.F32, act=Act.RELU), TILED_CONFIGS[-1])
    with pytest.warns(CacheWarning, match="too small for a kernel"):
        entry, _ = build(spec, "sm_80", cache=c)
    assert c.where(entry.key) is None and valid_entries(tmp_path) == (0, 0)


@pytest.mark.parametrize("value", ["0", "10KB"])
def test_a_cap_setting_smaller_than_a_kernel_is_refused_in_one_line(tmp_path, value):
    for args in (["cache", "info"], ["warmup", str(write(tmp_path, SMALL)), "--no-progress"]):
        r = ge2jit(args, tmp_path / "c", env={"GE2JIT_CACHE_MAX_SIZE": value})
        line = one_line_error(r, f"ge2jit {args[0]}" + (" info" if args[0] == "cache" else ""))
        assert line.split(": ", 1)[1].startswith("GE2JIT_CACHE_MAX_SIZE: expected at least 1MiB")
        assert f"got '{value}'" in line
    assert valid_entries(tmp_path / "c") == (0, 0)


def test_cache_info_shows_the_cap(tmp_path):
    r = ge2jit(["cache", "info"], tmp_path / "c", env={"GE2JIT_CACHE_MAX_SIZE": "2GB"})
    assert r.returncode == 0, r.stderr
    assert "cap:       1.9 GiB (2000000000 bytes, GE2JIT_CACHE_MAX_SIZE=2GB)" in r.stdout
    r = ge2jit(["cache", "info"], tmp_path / "c")
    assert "cap:       none (GE2JIT_CACHE_MAX_SIZE is not set)" in r.stdout
    assert "disk cache enabled\n" in r.stdout and not (tmp_path / "c").exists()


def test_cache_info_says_which_launch_path_runs(tmp_path):
    """It writes nothing: a C module not built yet is said to be so."""
    r = ge2jit(["cache", "info"], tmp_path / "c", env={"GE2JIT_LAUNCH": "python"})
    assert "launch:    python (GE2JIT_LAUNCH=python)\n" in r.stdout
    r = ge2jit(["cache", "info"], tmp_path / "c")
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("launch:")]
    assert line.startswith("launch:    compiled (") and not (tmp_path / "c").exists(), line
    info = json.loads(ge2jit(["cache", "info", "--json"], tmp_path / "c").stdout)
    assert info["launch"]["path"] == "compiled"


@pytest.mark.parametrize("how, words", [
    ("a plain file", "is not a directory"),
    ("in a plain file", "is not a directory"),     # as /proc/x: it cannot be made
    ("open to all", "writable by every user"),
])
def test_cache_info_says_when_the_disk_cache_cannot_store_kernels(tmp_path, how, words):
    import json

    (tmp_path / "file").write_text("x")
    cache = {"a plain file": tmp_path / "file", "in a plain file": tmp_path / "file" / "c",
             "open to all": tmp_path / "open"}[how]
    if how == "open to all":
        cache.mkdir()
        cache.chmod(0o777)
    r = ge2jit(["cache", "info"], cache)
    line = one_line_error(r, "ge2jit cache info", 1)
    assert line.startswith("ge2jit cache info: the disk cache is not used: ") and words in line
    assert "kept in memory only" in line
    assert f"disk cache not used: {cache}" in r.stdout and words in r.stdout
    info = json.loads(ge2jit(["cache", "info", "--json"], cache).stdout)
    assert info["writable"] is False and words in info["not_writable_reason"]
    assert info["disk_cache"].startswith("not used: ")


def test_cache_info_json_for_scripts(tmp_path):
    import json

    cache = tmp_path / "c"
    fake_entries(cache, ["gemm_a", "gemm_b"])
    r = ge2jit(["cache", "info", "--json"], cache, env={"GE2JIT_CACHE_MAX_SIZE": "1GiB"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    info = json.loads(r.stdout)
    assert info["location"] == str(cache) and info["entries"] == 2
    assert info["writable"] is True and info["not_writable_reason"] is None
    assert info["disk_cache"] == "enabled" and info["max_size_bytes"] == 2 ** 30
    assert info["max_size_setting"] == "1GiB" and info["nvrtc"].startswith("NVRTC ")
    assert "--json" in ge2jit(["cache", "info", "--help"], cache).stdout


def test_version_and_help():
    r = subprocess.run([sys.executable, "-m", "ge2jit", "--version"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.startswith("ge2jit ")
    r = subprocess.run([sys.executable, "-m", "ge2jit", "warmup", "--help"],
                       capture_output=True, text=True)
    assert "--arch" in r.stdout and "--from-tuning-db" in r.stdout
    assert "--example" in r.stdout and "examples/warmup.toml" not in r.stdout


def test_export_import_round_trip_and_refusals(tmp_path):
    import json
    import zipfile

    src, dst = tmp_path / "src", tmp_path / "dst"
    assert ge2jit(["warmup", str(write(tmp_path, SMALL)), "-j", "2", "--no-progress"],
                  src).returncode == 0
    from ge2jit.tune.db import TuningDB

    TuningDB(src / "tuning").put({"op": "gemm_bias_act", "arch": "sm_80"}, {"config": "x"})
    bundle = tmp_path / "b.zip"
    r = ge2jit(["cache", "export", str(bundle)], src)
    assert r.returncode == 0 and "6 kernels, 1 tuning records" in r.stdout, r.stderr
    r = ge2jit(["cache", "import", str(bundle)], dst)
    assert r.returncode == 0 and "6 kernels, 1 tuning records" in r.stdout, r.stderr
    assert valid_entries(dst) == (6, 0)
    assert TuningDB(dst / "tuning").get({"op": "gemm_bias_act", "arch": "sm_80"}) == {
        "config": "x"}
    # the imported cache is used: a warm-up finds everything
    r = ge2jit(["warmup", str(write(tmp_path, SMALL)), "--no-progress"], dst)
    assert "0 compiled, 6 already cached" in r.stdout

    def tampered(name, edit):
        out = tmp_path / name
        with zipfile.ZipFile(bundle) as zin, zipfile.ZipFile(out, "w") as zout:
            for item in zin.namelist():
                zout.writestr(item, edit(item, zin.read(item)))
        return out

    flipped = tampered("bad.zip", lambda n, d: d[:-1] + bytes([d[-1] ^ 1])
                       if n.endswith(".cubin") else d)
    other = tampered("other.zip", lambda n, d: json.dumps({**json.loads(d), "ge2jit": "0.0.1"})
                     .encode() if n == "manifest.json" else d)
    for bad, words in ((flipped, "checksum mismatch"), (other, "made with ge2jit '0.0.1'"),
                       (write(tmp_path, "not a zip", "junk.zip"), "not a readable")):
        fresh = tmp_path / f"fresh-{bad.stem}"
        r = ge2jit(["cache", "import", str(bad)], fresh)
        assert words in one_line_error(r, "ge2jit cache import")  # the file given is unusable
        assert not fresh.exists() or valid_entries(fresh) == (0, 0), "nothing imported"


def test_warmup_from_tuning_db_adds_tuned_configs(tmp_path):
    from ge2jit.tune.db import TuningDB

    cache = tmp_path / "c"
    TuningDB(cache / "tuning").put(
        {"op": "gemm_bias_act", "arch": "sm_80", "layouts": "rr", "bucket": [256, 256, 4096]},
        {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1, "shape": [256, 256, 4096]})
    cfg = write(tmp_path, SMALL.replace('["relu", "gelu"]', '["relu"]').replace(
        'configs = ["64x64x8_w32x32_s3", "64x64x8_4x4"]', 'configs = ["64x64x8_4x4"]'))
    plain = ge2jit(["warmup", str(cfg), "--no-progress"], cache)
    assert plain.returncode == 0 and "1 compiled" in plain.stdout, plain.stdout
    r = ge2jit(["warmup", str(cfg), "--from-tuning-db", "-j", "2", "--no-progress"], cache)
    assert r.returncode == 0, r.stderr
    names = {e.kernel_name for _, e in KernelCache(cache).entries()}
    assert any(n.endswith("_splitk") and "64x64x8_w32x32_s3" in n for n in names), names
    assert any(n.startswith("gemm_splitk_reduce_f32_relu_colbias") for n in names), names


BACKWARD = textwrap.dedent("""
    archs = ["sm_80"]

    [[gemm_bias_act_backward]]
    dtypes = ["float32"]
    acts = ["relu"]
    sources = ["y"]
    bias = ["col"]
    shapes = [[96, 64, 48]]
    sms = 132
""")


def test_backward_warmup_compiles_then_finds_everything_cached(tmp_path):
    from ge2jit.ops.gemm.warmup_backward import expand, validate_entry

    entry = validate_entry({"dtypes": ["float32"], "acts": ["relu"], "sources": ["y"],
                            "bias": ["col"], "shapes": [[96, 64, 48]]})
    specs = expand(entry, "sm_80", sms=132)
    names = {s.kernel_name for s in specs}
    assert {"gemm_dz_relu_yf32_gf32_dzf32_colbias", "gemm_dz_relu_yf32_gf32_dzf32_colbias_v8",
            "gemm_dbias_columns_f32"} <= names, names
    cfg = write(tmp_path, BACKWARD)
    r = ge2jit(["warmup", str(cfg), "-j", "2", "--no-progress"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert f"{len(specs)} compiled, 0 already cached, 0 failed" in r.stdout, r.stdout
    assert valid_entries(tmp_path / "c") == (len(specs), 0)
    again = ge2jit(["warmup", str(cfg), "--no-progress"], tmp_path / "c")
    assert f"0 compiled, {len(specs)} already cached, 0 failed" in again.stdout, again.stdout


def test_backward_warmup_expands_to_what_calls_run():
    from ge2jit.ops.gemm.warmup_backward import expand, validate_entry

    entry = validate_entry({"dtypes": ["bfloat16"], "acts": ["gelu_tanh"], "sources": ["z"],
                            "bias": ["col"], "a_acts": ["none", "gelu_tanh"],
                            "a_bias": [False, True], "shapes": [[4096, 4096, 1024]]})
    names = {spec.kernel_name for spec in expand(entry, "sm_90", sms=132)}
    # the dZ pass (fast act' for a 16-bit dZ) and its column sums
    assert "gemm_dz_gelu_tanh_zbf16_gbf16_dzbf16_colbias_v8_fast" in names, names
    assert "gemm_dbias_columns_bf16" in names
    # dB = A.T @ dZ; dA = dZ @ B.T plain and gated (its C, the saved Z, through the ring,
    # with the previous bias' sums; where C cannot come through the ring, the 128x256 tile
    # this shape takes leaves the sums to a pass over dA: they spill there)
    assert any(n.startswith("gemm_bf16_cr_wgmma_") for n in names), names
    assert any(n.startswith("gemm_bf16_rc_wgmma_") and n.endswith("_nobias") for n in names)
    assert "gemm_bf16_rc_wgmma_128x256_s4_yt_ct_none_nobias_gzgelu_tanh_cr" in names, names
    assert "gemm_bf16_rc_wgmma_128x256_s4_yt_ct_none_nobias_gzgelu_tanh_cr_bg" in names, names
    assert "gemm_dz_none_zbf16_gbf16_colbias" in names, names
    assert not any(n.endswith("_bg") and "_ct_" not in n for n in names), names
    # a derivative from Y where the activation has none is left out, not an error
    entry = validate_entry({"dtypes": ["float32"], "acts": ["gelu"], "sources": ["y"],
                            "shapes": [[64, 64, 64]]})
    names = {spec.kernel_name for spec in expand(entry, "sm_90", sms=132)}
    assert not any(n.startswith("gemm_dz_") for n in names), names


@pytest.mark.parametrize("entry, words", [
    ({"dtypes": ["bfloat16"]}, "shapes: expected a list of [M, N, K]"),
    ({"shapes": [[1, 2, 3]], "sources": ["x"]}, "sources: expected a list of 'z'"),
    ({"shapes": [[1, 2, 3]], "a_bias": ["yes"]}, "a_bias: expected a list of booleans"),
    ({"shapes": [[1, 2, 3]], "speed": 1}, "speed: unknown key"),
])
def test_backward_warmup_entry_errors_name_the_key(entry, words):
    from ge2jit.ops.gemm.warmup_backward import validate_entry

    with pytest.raises(ValueError) as e:
        validate_entry(entry)
    assert words in str(e.value)



def one_line_error(r, prefix: str, code: int = 2) -> str:
    """The command failed with ``code`` and said why in one line starting with ``prefix``."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix + ": "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["warmup", "w.toml", "-j", "0"], ["-j/--jobs", "a positive integer", "'0'"]),
    (["warmup", "w.toml", "-j", "-1"], ["-j/--jobs", "a positive integer", "'-1'"]),
    (["warmup", "w.toml", "-j", "two"], ["-j/--jobs", "a positive integer", "'two'"]),
    (["warmup", "w.toml", "--sms", "0"], ["--sms", "a positive integer", "'0'"]),
    (["warmup", "w.toml", "--sms", "-132"], ["--sms", "a positive integer", "'-132'"]),
])
def test_bad_warmup_arguments_are_one_line_errors(tmp_path, args, words):
    write(tmp_path, SMALL)
    line = one_line_error(ge2jit(args, tmp_path / "c", cwd=tmp_path), "ge2jit warmup")
    for w in words:
        assert w in line, line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args, prefix, words", [
    (["cache", "list", "extra.zip"], "ge2jit cache list", ["unrecognized", "extra.zip"]),
    (["cache", "info", "--max-size", "1G"], "ge2jit cache info", ["--max-size"]),
    (["cache", "clear", "x"], "ge2jit cache clear", ["x"]),
    (["cache", "export"], "ge2jit cache export", ["FILE"]),
    (["cache", "import", "a.zip", "b.zip"], "ge2jit cache import", ["b.zip"]),
    (["cache", "prune", "--max-size", "lots"], "ge2jit cache prune", ["2GB", "'lots'"]),
    (["cache", "prune", "--older-than", "soon"], "ge2jit cache prune", ["30d", "'soon'"]),
    (["cache", "prune"], "ge2jit cache prune", ["--max-size", "--older-than"]),
    (["cache", "tidy"], "ge2jit cache", ["tidy", "list"]),
    (["cache"], "ge2jit cache", ["info"]),
    (["warm"], "ge2jit", ["warm", "warmup"]),
])
def test_cache_actions_take_only_their_own_arguments(tmp_path, args, prefix, words):
    line = one_line_error(ge2jit(args, tmp_path / "c"), prefix)
    for w in words:
        assert w in line, line


def test_each_cache_action_has_its_own_help(tmp_path):
    helps = {a: ge2jit(["cache", a, "--help"], tmp_path / "c") for a in
             ("info", "list", "clear", "prune", "export", "import")}
    assert all(r.returncode == 0 for r in helps.values())
    assert "--max-size" in helps["prune"].stdout and "--older-than" in helps["prune"].stdout
    assert "FILE" in helps["export"].stdout and "FILE" in helps["import"].stdout
    for action in ("info", "list", "clear", "export", "import"):
        assert "--max-size" not in helps[action].stdout, action
    assert "FILE" not in helps["list"].stdout


def fake_entries(cache: Path, names: list[str], arch: str = "sm_80") -> list:
    """Store entries with these kernel names (a few bytes of cubin each) without compiling."""
    import hashlib

    from ge2jit.jit.cache import CacheEntry

    c = KernelCache(cache)
    out = []
    for i, name in enumerate(names):
        e = CacheEntry(key=hashlib.sha256(f"{name}-{i}".encode()).hexdigest(), kernel_name=name,
                       arch=arch, cubin=bytes(100 + i), registers=32 + i, shared_bytes=0,
                       stack_bytes=0, spill_stores=i, spill_loads=0, compile_seconds=0.1,
                       nvrtc_version="13.0", ge2jit_version="0", created=time.time())
        assert c.put(e) is not None
        out.append(e)
    return out


def test_cache_list_json_for_scripts(tmp_path):
    import datetime
    import json

    cache = tmp_path / "c"
    entries = fake_entries(cache, ["gemm_a", "gemm_b"])
    r = ge2jit(["cache", "list", "--json"], cache)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["kernel"] for row in rows} == {"gemm_a", "gemm_b"}
    for row in rows:
        e = next(e for e in entries if e.kernel_name == row["kernel"])
        path = Path(row["path"])
        assert path == KernelCache(cache).path_for(e.key)
        assert row["arch"] == "sm_80" and row["size"] == path.stat().st_size
        assert row["registers"] == e.registers and row["spill_bytes"] == e.spill_bytes
        used = datetime.datetime.fromisoformat(row["last_used"])
        assert abs(used.timestamp() - path.stat().st_mtime) < 1
    assert json.loads(ge2jit(["cache", "list", "--json"], tmp_path / "empty").stdout) == []
    assert "--json" in ge2jit(["cache", "list", "--help"], cache).stdout


def test_cache_list_columns_stay_aligned_with_long_names(tmp_path):
    cache = tmp_path / "c"
    names = ["gemm_short", "gemm_" + "x" * 90 + "_long", "gemm_" + "y" * 70]
    fake_entries(cache, names)
    lines = ge2jit(["cache", "list"], cache).stdout.splitlines()
    assert len(lines) == 4
    header, rows = lines[0], lines[1:]
    arch_col = header.index("arch")
    for name in names:
        (row,) = [r for r in rows if r.startswith(name + " ")]
        assert row[arch_col:arch_col + 5] == "sm_80", (header, row)
    assert len({len(r) for r in rows}) == 1 and len(header) <= len(rows[0]), lines


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    cache = tmp_path / "c"
    fake_entries(cache, [f"gemm_{i:04d}_" + "x" * 200 for i in range(400)])  # > a pipe's 64 KiB
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GE2JIT_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "ge2jit", "cache", "list"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # `ge2jit cache list | head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == "", err


def test_a_failure_of_the_work_is_one_line(tmp_path):
    # a file that is no library: NVRTC is unusable (1), where a path that names no file is a
    # mistake in the variable (2, test_a_bad_setting_is_one_line_and_exit_2)
    fake = tmp_path / "libnvrtc.so.13"
    fake.write_text("not a library\n")
    r = ge2jit(["cache", "export", str(tmp_path / "b.zip")], tmp_path / "c",
               env={"GE2JIT_NVRTC": str(fake)})
    assert f"could not load NVRTC from {fake}" in one_line_error(r, "ge2jit cache export", 1)


def test_an_unexpected_error_is_one_line_unless_verbose(monkeypatch, capsys):
    from ge2jit import cli

    def broken(args):
        raise RuntimeError("something no user can fix")

    monkeypatch.setattr(cli, "_cache_info", broken)
    monkeypatch.delenv("GE2JIT_VERBOSE", raising=False)
    assert cli.main(["cache", "info"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ge2jit cache info: internal error"), err
    assert "RuntimeError: something no user can fix" in err[0] and "GE2JIT_VERBOSE=1" in err[0]
    monkeypatch.setenv("GE2JIT_VERBOSE", "1")
    with pytest.raises(RuntimeError, match="something no user can fix"):
        cli.main(["cache", "info"])


@pytest.mark.parametrize("where", ["file", "option"])
def test_an_architecture_nvrtc_lacks_is_refused_once_up_front(tmp_path, where):
    from ge2jit.jit.nvrtc import nvrtc_info

    if where == "file":
        cfg = write(tmp_path, SMALL.replace('["sm_80"]', '["sm_80", "sm_999"]'))
        r = ge2jit(["warmup", str(cfg), "--no-progress"], tmp_path / "c")
    else:
        cfg = write(tmp_path, SMALL)
        r = ge2jit(["warmup", str(cfg), "--arch", "sm_80", "--arch", "sm_999", "--no-progress"],
                   tmp_path / "c")
    line = one_line_error(r, "ge2jit warmup")
    assert "sm_999: not supported by NVRTC" in line and ", ".join(
        nvrtc_info().supported_archs) in line, line
    assert (f"{cfg}:2: arch:" in line) == (where == "file"), line
    assert not (tmp_path / "c").exists()


def test_more_jobs_than_cores_is_reduced_with_a_note(tmp_path):
    cores = len(os.sched_getaffinity(0))
    r = ge2jit(["warmup", str(write(tmp_path, SMALL)), "-j", "60", "--no-progress"],
               tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (f"ge2jit warmup: note: -j 60 reduced to {cores}, the cores this "
                                "process may use"), r.stderr


def test_kernels_the_cache_could_not_store_are_counted_and_fail_the_warmup(tmp_path):
    from ge2jit.jit.loader import key_for
    from ge2jit.precompile import load

    cfg = write(tmp_path, SMALL)
    keys = [key_for(spec, arch)[0] for spec, arch in load(cfg).jobs]
    assert len(keys) == 6 and keys[2][:2] not in (keys[0][:2], keys[1][:2])
    cache = tmp_path / "c"
    cache.mkdir()
    # the disk "fills up" at the third kernel: a file where its shard directory goes
    (cache / keys[2][:2]).write_text("")
    r = ge2jit(["warmup", str(cfg), "-j", "1", "--no-progress"], cache)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "2 compiled, 0 already cached, 4 kept in memory only, 0 failed" in r.stdout, r.stdout
    assert "NOT STORED" in r.stdout and "Not a directory" in r.stdout, r.stdout
    assert "CacheWarning" not in r.stderr, r.stderr
    assert valid_entries(cache) == (2, 0)


@pytest.fixture
def in_process(monkeypatch, tmp_path):
    """Run ``main`` in this process on the cache ``tmp_path / "c"``: (cache, run(args))."""
    from ge2jit import cli
    from ge2jit.jit import cache as kernel_cache
    from ge2jit.settings import reload_settings
    from ge2jit.tune import db

    cache = tmp_path / "c"
    monkeypatch.setenv("GE2JIT_CACHE_DIR", str(cache))
    reload_settings()
    # the process-wide cache and tuning database: new ones, on this directory, until the end
    monkeypatch.setattr(kernel_cache, "_default", None)
    monkeypatch.setattr(db, "_default", None)
    yield cache, cli.main
    monkeypatch.undo()
    reload_settings()


@pytest.mark.parametrize("action", [["clear"], ["prune", "--max-size", "0"]])
def test_files_clear_and_prune_cannot_remove_are_counted_and_fail(in_process, monkeypatch,
                                                                  capsys, action):
    cache, main = in_process
    fake_entries(cache, ["gemm_a", "gemm_b", "gemm_c"])
    real_unlink = os.unlink

    def unlink(path, *, dir_fd=None):
        if str(path).endswith(".cubin") and not str(path).startswith("1"):
            raise PermissionError(13, "Permission denied")
        return real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    stuck = sorted(p for p in cache.glob("??/*.cubin") if not p.name.startswith("1"))
    assert stuck
    code = main(["cache", *action])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    removed = 3 - len(stuck)
    assert out.startswith(f"removed {removed} entries"), out
    err = err.strip().splitlines()
    head = (f"ge2jit cache {action[0]}: could not remove {len(stuck)} "
            f"file{'s' if len(stuck) > 1 else ''} (first: ")
    assert len(err) == 1 and err[0].startswith(head), err
    assert err[0][len(head):] in {f"{p}: Permission denied)" for p in stuck}, err


@pytest.mark.parametrize("action", [["clear"], ["prune", "--older-than", "1s"]])
@pytest.mark.parametrize("how, words", [
    ("file", ["not a directory"]),
    ("open to all", ["writable by every user"]),
])
def test_clear_and_prune_of_an_unusable_cache_directory_are_one_line(tmp_path, action, how,
                                                                      words):
    cache = tmp_path / "c"
    if how == "file":
        cache.write_text("")
    else:
        fake_entries(cache, ["gemm_a"])
        cache.chmod(0o777)
    line = one_line_error(ge2jit(["cache", *action], cache), f"ge2jit cache {action[0]}", 1)
    assert line.startswith(f"ge2jit cache {action[0]}: {cache}: ") and all(
        w in line for w in words), line


def test_clear_counts_entries_not_files(tmp_path):
    cache = tmp_path / "c"
    r = ge2jit(["warmup", str(write(tmp_path, SMALL)), "-j", "2", "--no-progress"], cache,
               env={"GE2JIT_SAVE_SOURCE": "1"})
    assert r.returncode == 0 and len(list(cache.glob("??/*.cu"))) == 6, r.stderr
    r = ge2jit(["cache", "clear"], cache)
    assert r.returncode == 0 and r.stdout.startswith("removed 6 entries ("), r.stdout
    assert not list(cache.glob("??/*"))


@pytest.mark.parametrize("args", [["cache", "info"], ["warmup", "w.toml", "--no-progress"],
                                  ["cache", "list"]])
@pytest.mark.parametrize("name, value", [
    ("GE2JIT_CACHE_MAX_SIZE", "lots"), ("GE2JIT_DISABLE_CACHE", "maybe"),
    ("GE2JIT_VERBOSE", "loud"), ("GE2JIT_SAVE_SOURCE", "please"),
    ("GE2JIT_FLOAT32_PRECISION", "half"), ("GE2JIT_NVRTC", "/nonexistent/libnvrtc.so.13"),
    ("GE2JIT_LAUNCH", "fast"), ("GE2JIT_LINEINFO", "maybe"),
    ("GE2JIT_DUMP_DIR", "w.toml"),   # a file, not a directory
])
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path, args, name, value):
    write(tmp_path, SMALL)
    r = ge2jit(args, tmp_path / "c", cwd=tmp_path, env={name: value})
    prefix = f"ge2jit {args[0]}" + (f" {args[1]}" if args[0] == "cache" else "")
    line = one_line_error(r, prefix)
    assert line.startswith(f"{prefix}: {name}") and f"'{value}'" in line and "expected" in line
    assert "FAILED" not in r.stdout and r.stdout == ""
    assert valid_entries(tmp_path / "c") == (0, 0)


def test_an_empty_warmup_file_is_one_line_and_exit_2(tmp_path):
    for text in ("", 'archs = ["sm_80"]\n'):
        r = ge2jit(["warmup", str(write(tmp_path, text)), "--no-progress"], tmp_path / "c")
        line = one_line_error(r, "ge2jit warmup")
        assert "the warm-up file lists no kernels" in line and "0kernel" not in r.stderr
        assert r.stdout == ""


def test_warmup_reads_the_file_from_standard_input(tmp_path):
    r = ge2jit(["warmup", "-", "--no-progress"], tmp_path / "c", input=SMALL)
    assert r.returncode == 0, r.stderr
    assert "6 compiled, 0 already cached, 0 failed" in r.stdout
    bad = ge2jit(["warmup", "-"], tmp_path / "c", input=SMALL.replace("acts =", "act ="))
    assert one_line_error(bad, "ge2jit warmup").startswith("ge2jit warmup: <stdin>:5: ")
    assert "standard input" in ge2jit(["warmup", "--help"], tmp_path / "c").stdout


def test_warmup_progress_into_a_log_is_plain_lines(tmp_path):
    """Its stderr is a pipe here, as in CI: no progress bar's carriage-return frames."""
    r = ge2jit(["warmup", str(write(tmp_path, SMALL)), "-j", "2"], tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "it/s" not in r.stderr and "kernel/s" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and all(line.startswith("ge2jit warmup: ") for line in lines), r.stderr
    assert lines[-1].startswith("ge2jit warmup: 6/6 kernels (100%), ")


def test_sizes_on_the_command_line_are_read_honestly(tmp_path):
    from ge2jit import cli

    assert cli.parse_size("1MB") == 10 ** 6 and cli.parse_size("1MiB") == 2 ** 20
    assert cli.parse_size("2G") == 2 * 10 ** 9 and cli.parse_size("4096") == 4096
    cache = tmp_path / "c"
    fake_entries(cache, ["gemm_a", "gemm_b", "gemm_c"])
    size = sum(p.stat().st_size for p in cache.glob("??/*.cubin"))
    r = ge2jit(["cache", "prune", "--max-size", f"{size / 1000:.3f}kB"], cache)
    assert r.returncode == 0 and "removed 0 entries" in r.stdout, (r.stdout, r.stderr)
    r = ge2jit(["cache", "prune", "--max-size", f"{(size - 1) / 1024:.4f}KiB"], cache)
    assert r.returncode == 0 and "removed 1 entries" in r.stdout, (r.stdout, r.stderr)
    text = " ".join(ge2jit(["cache", "prune", "--help"], cache).stdout.split())
    assert "2GB (2 * 10**9 bytes" in text and "2GiB (2 * 2**30" in text


def test_warnings_are_one_line_naming_the_command(tmp_path):
    cache = tmp_path / "c"
    cache.mkdir()
    cache.chmod(0o777)  # refused by the cache: kernels would be kept in memory
    r = ge2jit(["cache", "list"], cache)
    assert r.returncode == 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "ge2jit cache list: warning: ge2jit does not use the kernel cache directory"), r.stderr
