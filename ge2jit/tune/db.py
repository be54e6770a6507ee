"""The persistent tuning database.

One small JSON file per key under ``<cache dir>/tuning/``, named by the sha256 of the key and
sharded like the kernel cache; written to a temporary file and moved into place, so any number
of processes may tune and read at once. A record holds its key (checked on read) and a checksum
of its value; a damaged record is ignored. An unwritable directory keeps records in memory, with
one warning.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path

from ..errors import CacheWarning
from ..jit.cache import _atomic_write
from ..settings import get_settings


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class TuningDB:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else get_settings().cache_dir / "tuning"
        self._memory: dict[str, dict] = {}
        self._disk_ok = not get_settings().disable_cache
        self._warned = False

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / (digest[2:] + ".json")

    @staticmethod
    def digest(key: dict) -> str:
        return hashlib.sha256(_canonical(key).encode()).hexdigest()

    def get(self, key: dict) -> dict | None:
        """The stored value for ``key``, or None."""
        d = self.digest(key)
        if d in self._memory:
            return self._memory[d]["value"]
        if not self._disk_ok:
            return None
        try:
            record = json.loads(self._path(d).read_text())
            if record["key"] != key:
                return None
            if record["checksum"] != hashlib.sha256(_canonical(record["value"]).encode()).hexdigest():
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._memory[d] = record
        return record["value"]

    def put(self, key: dict, value: dict) -> Path | None:
        d = self.digest(key)
        record = {"key": key, "value": value, "created": time.time(),
                  "checksum": hashlib.sha256(_canonical(value).encode()).hexdigest()}
        self._memory[d] = record
        if not self._disk_ok:
            return None
        path = self._path(d)
        try:
            _atomic_write(path, json.dumps(record, sort_keys=True, indent=1).encode())
        except OSError as e:
            self._disk_ok = False
            if not self._warned:
                self._warned = True
                warnings.warn(f"ge2jit cannot write its tuning database at {self.root} "
                              f"({e.strerror or e}); tuning results are kept in memory only.",
                              CacheWarning, stacklevel=3)
            return None
        return path

    def records(self):
        """Yield every readable record on disk as a dict with 'key' and 'value'."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob("??/*.json")):
            try:
                record = json.loads(path.read_text())
                if self.digest(record["key"]) == path.parent.name + path.stem:
                    yield record
            except (OSError, ValueError, KeyError, TypeError):
                continue


_default: TuningDB | None = None


def default_db() -> TuningDB:
    global _default
    if _default is None:
        _default = TuningDB()
    return _default


def reset_default_db() -> None:
    global _default
    _default = None
