"""The tuning database: round trip, damage, unwritable directories, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing as mp
import warnings

from ge2jit import CacheWarning
from ge2jit.tune.db import TuningDB

KEY = {"op": "gemm_bias_act", "device": "NVIDIA H200", "arch": "sm_90", "bucket": [64, 64, 4096],
       "version": "0.1.0"}


def test_round_trip_across_instances(tmp_path):
    TuningDB(tmp_path).put(KEY, {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1})
    assert TuningDB(tmp_path).get(KEY) == {"config": "64x64x8_w32x32_s3_k4", "ms": 0.1}
    assert TuningDB(tmp_path).get({**KEY, "arch": "sm_80"}) is None
    records = list(TuningDB(tmp_path).records())
    assert len(records) == 1 and records[0]["key"] == KEY


def test_damaged_records_are_ignored(tmp_path):
    db = TuningDB(tmp_path)
    path = db.put(KEY, {"config": "a"})
    record = json.loads(path.read_text())
    record["value"]["config"] = "b"          # checksum no longer matches
    path.write_text(json.dumps(record))
    assert TuningDB(tmp_path).get(KEY) is None
    path.write_text("{ truncated")
    assert TuningDB(tmp_path).get(KEY) is None
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
