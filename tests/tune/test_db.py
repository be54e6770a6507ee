"""The tuning database: round trip, damage, unwritable directories, concurrent writers, record
validation, several directories."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import warnings
from pathlib import Path

import pytest

from ge2jit import CacheWarning
from ge2jit.tune import db as db_mod
from ge2jit.tune.db import TuningDB, validate_record

KEY = {"op": "gemm_bias_act", "device": "NVIDIA H200", "arch": "sm_90", "bucket": [64, 64, 4096],
       "version": "0.1.0"}


def test_round_trip_across_instances(tmp_path):
    TuningDB(tmp_path).put(KEY, {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1})
    assert TuningDB(tmp_path).get(KEY) == {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1}
    assert TuningDB(tmp_path).get({**KEY, "arch": "sm_80"}) is None
    records = list(TuningDB(tmp_path).records())
    assert len(records) == 1 and records[0]["key"] == {**KEY, "code": db_mod.code_fingerprint()}


def test_damaged_records_are_ignored(tmp_path):
    db = TuningDB(tmp_path)
    path = db.put(KEY, {"config": "a"})
    record = json.loads(path.read_text())
    record["value"]["config"] = "b"          # checksum no longer matches
    path.write_text(json.dumps(record))
    with pytest.warns(CacheWarning, match="checksum: does not match"):
        assert TuningDB(tmp_path).get(KEY) is None
    path.write_text("{ truncated")
    with pytest.warns(CacheWarning, match="not JSON"):
        assert TuningDB(tmp_path).get(KEY) is None
    with pytest.warns(CacheWarning, match="not JSON"):
        assert list(TuningDB(tmp_path).records()) == []


def test_unwritable_directory_keeps_results_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    db = TuningDB(blocker / "tuning")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert db.put(KEY, {"config": "a"}) is None
        db.put({**KEY, "arch": "sm_80"}, {"config": "b"})
    assert sum(issubclass(x.category, CacheWarning) for x in w) == 1
    assert db.get(KEY) == {"config": "a"}


def _writer(root, i, barrier):
    barrier.wait()
    for j in range(20):
        TuningDB(root).put(KEY, {"config": f"w{i}", "j": j})


def test_concurrent_writers_leave_one_valid_record(tmp_path):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), i, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    value = TuningDB(tmp_path).get(KEY)
    assert value["config"] in {f"w{i}" for i in range(4)} and value["j"] == 19
    assert not [p for p in tmp_path.rglob(".tmp-*")]


# --- records are validated when read: a bad one is ignored with one warning -----------------

GOOD = {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1, "shape": [64, 64, 4096],
        "table": [["64x64x8_w32x32_s3_k4", 0.1], ["64x64x8_4x4_k1", 0.2]]}


def _record(key=KEY, value=None, **extra) -> dict:
    value = GOOD if value is None else value
    checksum = hashlib.sha256(db_mod._canonical(value).encode()).hexdigest()
    return {"key": key, "value": value, "created": 1.0, "checksum": checksum, **extra}


def _plant(root: Path, text: str, key=KEY) -> Path:
    d = TuningDB.digest({**key, "code": db_mod.code_fingerprint()})   # where get looks
    path = root / d[:2] / (d[2:] + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_validate_record_accepts_what_put_writes(tmp_path):
    path = TuningDB(tmp_path).put(KEY, GOOD)
    record = json.loads(path.read_text())
    assert validate_record(record) is record
    assert validate_record(_record()) == _record()


@pytest.mark.parametrize("record, reason", [
    ([1, 2], "a JSON object"),
    (_record(value={**GOOD, "ms": "fast"}), "ms"),
    (_record(value={**GOOD, "ms": -1.0}), "ms"),
    (_record(value={**GOOD, "ms": float("nan")}), "ms"),
    (_record(value={**GOOD, "ms": True}), "ms"),
    (_record(value={"ms": 0.1}), "config"),
    (_record(value={**GOOD, "config": ["a"]}), "config"),
    (_record(value={**GOOD, "shape": [64, 64]}), "shape"),
    (_record(value={**GOOD, "shape": [64, -1, 8]}), "shape"),
    (_record(value={**GOOD, "table": [["a"]]}), "table"),
    (_record(value={**GOOD, "table": "a"}), "table"),
    (_record(value=[GOOD]), "value"),
    (_record(key=[1]), "key"),
    (_record(key={}), "key"),
    (_record(key={**KEY, "deep": [[[[[[[[[[1]]]]]]]]]]}), "deep"),
    (_record(value={**GOOD, "extra": {"a": {"b": {"c": {"d": {"e": {"f": {}}}}}}}}), "deep"),
    ({**_record(), "checksum": "0" * 64}, "checksum"),
    ({k: v for k, v in _record().items() if k != "checksum"}, "checksum"),
    (_record(created="yesterday"), "created"),
])
def test_validate_record_refuses_with_a_reason(record, reason):
    with pytest.raises(ValueError, match=reason):
        validate_record(record)


@pytest.mark.parametrize("text", [
    json.dumps(_record(value={**GOOD, "ms": "fast"})),
    json.dumps([_record()]),
    "[" * 200000 + "]" * 200000,                            # RecursionError in json.loads
    json.dumps(_record(key={**KEY, "version": "other"})),   # another key under this name
    "\xff\xfe not text",
])
def test_a_bad_record_is_ignored_with_one_warning(tmp_path, text):
    _plant(tmp_path, text)
    db = TuningDB(tmp_path)
    with pytest.warns(db_mod.CacheWarning, match="ignores the tuning record") as w:
        assert db.get(KEY) is None
        assert db.get(KEY) is None
        assert list(db.records()) == []
    assert len(w) == 1, [str(x.message) for x in w]


def test_an_oversized_record_is_not_read(tmp_path, monkeypatch):
    path = _plant(tmp_path, json.dumps(_record()))
    monkeypatch.setattr(db_mod, "MAX_RECORD_BYTES", path.stat().st_size - 1)
    with pytest.warns(db_mod.CacheWarning, match="bytes"):
        assert TuningDB(tmp_path).get(KEY) is None


def test_a_fifo_or_symlink_record_is_ignored(tmp_path):
    import signal

    path = _plant(tmp_path, json.dumps(_record()))
    elsewhere = tmp_path / "elsewhere.json"
    path.replace(elsewhere)
    path.symlink_to(elsewhere)
    other = {**KEY, "arch": "sm_80"}
    fifo = _plant(tmp_path, "", key=other)
    fifo.unlink()
    os.mkfifo(fifo)
    def hang(*_):
        raise TimeoutError("blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)                                        # a FIFO opened plainly would block
    try:
        with pytest.warns(db_mod.CacheWarning):
            db = TuningDB(tmp_path)
            assert db.get(KEY) is None and db.get(other) is None
            assert list(db.records()) == []
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_put_refuses_a_value_it_could_not_read_back(tmp_path):
    with pytest.raises(ValueError, match="config"):
        TuningDB(tmp_path).put(KEY, {"ms": 0.1})
    assert not list(tmp_path.rglob("*.json"))


# --- several directories: look-ups in order, writes to the first ------------------------------

def test_lookups_in_order_and_writes_to_the_first(tmp_path, monkeypatch):
    from ge2jit.settings import reload_settings

    mine, shared = tmp_path / "mine", tmp_path / "shared"
    TuningDB(shared / "tuning").put(KEY, {"config": "shared"})
    other = {**KEY, "arch": "sm_80"}
    TuningDB(shared / "tuning").put(other, {"config": "shared"})
    monkeypatch.setenv("GE2JIT_CACHE_DIR", f"{mine}:{shared}")
    reload_settings()
    try:
        db = TuningDB()
        assert db.roots == (mine / "tuning", shared / "tuning") and db.root == mine / "tuning"
        assert db.get(KEY) == {"config": "shared"}
        path = db.put(KEY, {"config": "mine"})
        assert path.is_relative_to(mine)
        fresh = TuningDB()
        assert fresh.get(KEY) == {"config": "mine"} and fresh.get(other) == {"config": "shared"}
        assert sorted(r["value"]["config"] for r in fresh.records()) == ["mine", "shared"]
        assert TuningDB(shared / "tuning").get(KEY) == {"config": "shared"}, "shared untouched"
    finally:
        monkeypatch.undo()
        reload_settings()


def test_a_tuning_directory_others_can_write_is_refused(tmp_path):
    TuningDB(tmp_path / "t").put(KEY, {"config": "a"})
    (tmp_path / "t").chmod(0o777)
    db = TuningDB(tmp_path / "t")
    with pytest.warns(db_mod.CacheWarning, match="writable by every user"):
        assert db.get(KEY) is None
        assert db.put({**KEY, "arch": "sm_80"}, {"config": "b"}) is None
    assert db.get({**KEY, "arch": "sm_80"}) == {"config": "b"}, "kept in memory"


# --- records are keyed by the code they were tuned on -------------------------------------------

def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the kernel templates and of the package's config modules: (templates,
    package), to edit."""
    import shutil

    from ge2jit.jit.render import template_dir

    package = Path(db_mod.__file__).resolve().parent.parent
    shutil.copytree(template_dir(), tmp_path / "kernel_templates")
    for name in db_mod._CODE_SOURCES:
        source = package / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / "ge2jit" / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / "ge2jit" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / "ge2jit" / name)
    return tmp_path / "kernel_templates", tmp_path / "ge2jit"


def test_the_code_fingerprint_follows_templates_and_config_modules(tmp_path):
    from ge2jit.jit.render import template_dir

    templates, package = _tree(tmp_path)
    before = db_mod.fingerprint_of(templates, package)
    real = Path(db_mod.__file__).resolve().parent.parent
    assert before == db_mod.fingerprint_of(template_dir(), real), "the copy is the code in use"
    template = sorted(templates.rglob("*.cu"))[0]
    template.write_text(template.read_text() + "// a comment changes the kernel's source\n")
    edited = db_mod.fingerprint_of(templates, package)
    assert edited != before
    spec = package / "ops" / "gemm" / "spec.py"
    spec.write_text(spec.read_text() + "\n# another config table\n")
    assert db_mod.fingerprint_of(templates, package) not in (before, edited)
    (package / "ops" / "gemm" / "torch_modules.py").unlink(missing_ok=True)
    template.rename(template.with_name("renamed.cu"))
    assert db_mod.fingerprint_of(templates, package) != edited


def test_a_template_edit_makes_older_records_miss(tmp_path):
    """A config tuned on other kernels is not reused: the record's key names the code."""
    templates, package = _tree(tmp_path / "src")
    old_code = db_mod.fingerprint_of(templates, package)
    template = sorted(templates.rglob("*.cu"))[0]
    template.write_text(template.read_text() + "// edited\n")
    new_code = db_mod.fingerprint_of(templates, package)
    root = tmp_path / "tuning"
    path = TuningDB(root, code=old_code).put(KEY, {"config": "old"})
    assert json.loads(path.read_text())["key"] == {**KEY, "code": old_code}
    newer = TuningDB(root, code=new_code)
    assert newer.get(KEY) is None and list(newer.records()) == []
    newer.put(KEY, {"config": "new"})
    assert TuningDB(root, code=new_code).get(KEY) == {"config": "new"}
    assert TuningDB(root, code=old_code).get(KEY) == {"config": "old"}, "each code its own"


def test_records_of_before_the_code_key_are_left_out(tmp_path):
    """0.1.0 stored records without ``code``: valid, but of unknown kernels."""
    d = TuningDB.digest(KEY)
    path = tmp_path / d[:2] / (d[2:] + ".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record()))
    db = TuningDB(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # not a bad record: no warning
        assert db.get(KEY) is None and list(db.records()) == []


def test_a_record_with_its_code_keeps_it(tmp_path):
    """A bundle's records carry their code: stored as they are, found by that code only."""
    key = {**KEY, "code": "0123456789abcdef"}
    TuningDB(tmp_path, code="fedcba9876543210").put(key, {"config": "a"})
    assert TuningDB(tmp_path, code="0123456789abcdef").get(KEY) == {"config": "a"}
    assert TuningDB(tmp_path, code="fedcba9876543210").get(KEY) is None


def test_the_tools_look_up_tuned_configs_by_the_code(tmp_path, monkeypatch):
    from ge2jit.runtime import tools

    monkeypatch.setattr(tools, "_device_key", lambda: {"device": "Toy GPU", "arch": "sm_90",
                                                       "version": "0.2.0"})
    monkeypatch.setattr(db_mod, "_default", TuningDB(tmp_path, code="aaaa"))
    db_mod.default_db().put(tools.full_key("toy", {"n": 3}), {"config": "fast"})
    assert tools.tuned_config("toy", {"n": 3}) == "fast"
    monkeypatch.setattr(db_mod, "_default", TuningDB(tmp_path, code="bbbb"))
    assert tools.tuned_config("toy", {"n": 3}) is None
