"""The persistent tuning database.

One small JSON file per key under ``<cache dir>/tuning/``, named by the sha256 of the key and
sharded like the kernel cache; written to a temporary file and moved into place, so any number
of processes may tune and read at once. A record holds its key (checked on read) and a checksum
of its value. Each directory of ``GE2JIT_CACHE_DIR`` has its own ``tuning/``: look-ups go
through them in order and records are written to the first.

Records are read under the kernel cache's rules (regular files of at most
``MAX_RECORD_BYTES``, no symlink followed, in directories no one else can write) and checked
against their schema (``validate_record``); a record that fails is ignored with one warning.
An unwritable directory keeps records in memory, with one warning.

A record is keyed by the code it was tuned on, too: ``code`` in its key is ``code_fingerprint()``,
a hash of the kernel templates and of the Python that defines the configs and renders them.
A config tuned for other kernels may be slow, or no longer exist, for these; so an edit of a
template makes the records made before it miss (and ``records`` leaves them out), whatever
the version number says.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import warnings
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from ..errors import CacheWarning
from ..jit.cache import (
    _DIR_FLAGS,
    CacheDirs,
    UntrustedFile,
    _own_files,
    _shards,
    atomic_write,
    read_trusted,
    untrusted,
)
from ..settings import get_settings

MAX_RECORD_BYTES = 1024 * 1024       # records are a few KiB; more is not one of ours
MAX_DEPTH = 6                        # nested objects and arrays; records use 4
_RECORD_RE = re.compile(r"[0-9a-f]{62}\.json")
_CONFIG_MAX = 256


#: What a tuned config depends on besides its key, under the package: the modules that define
#: each op's configs, candidates and kernel specs, and those that render them (with the
#: templates, ``kernel_templates/**``).
_CODE_SOURCES = ("ops", "jit/spec.py", "jit/render.py", "runtime/rows.py")


def fingerprint_of(templates: Path, package: Path) -> str:
    """A hash (16 hex digits) of every file under ``templates`` and of ``_CODE_SOURCES``'s
    Python files under ``package``, with their relative names."""
    from ..jit.render import tree_digest

    return tree_digest(b"ge2jit-tuning-code-v1", templates, package, _CODE_SOURCES,
                       prefix="ge2jit/")[:16]


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of this ge2jit's kernels (``fingerprint_of`` its templates and config
    modules), computed once per process: part of every tuning record's key."""
    from ..jit.render import template_dir

    return fingerprint_of(template_dir(), Path(__file__).resolve().parent.parent)


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def validate_record(record: object) -> dict:
    """Check a tuning record against its schema; returns it unchanged.

    A record is ``{"key": {...}, "value": {...}, "checksum": "<sha256 of the value>",
    "created": <time>}``: the key an object with string names; the value an object with
    ``config`` (a config name), and optionally ``ms`` and ``tflops`` (finite numbers >= 0),
    ``shape`` ([M, N, K], positive integers) and ``table`` ([[config, ms], ...]); nothing is
    nested more than ``MAX_DEPTH`` deep.

    Raises:
        ValueError: the reason the record cannot be used.
    """
    if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, not {_kind(record)}")
    if _too_deep(record, MAX_DEPTH):
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    key, value = record.get("key"), record.get("value")
    if not isinstance(key, dict) or not key or not all(isinstance(k, str) for k in key):
        raise ValueError(f"key: expected a non-empty object, got {_kind(key)}")
    if not isinstance(value, dict):
        raise ValueError(f"value: expected an object, got {_kind(value)}")
    config = value.get("config")
    if not isinstance(config, str) or not 0 < len(config) <= _CONFIG_MAX:
        raise ValueError(f"value.config: expected a config name, got {_kind(config)}")
    for name in ("ms", "tflops"):
        if name in value and not _time_like(value[name]):
            raise ValueError(f"value.{name}: expected a finite number >= 0, "
                             f"got {value[name]!r:.40}")
    shape = value.get("shape", [1, 1, 1])
    if not (isinstance(shape, list) and len(shape) == 3
            and all(_int(x) and x > 0 for x in shape)):
        raise ValueError(f"value.shape: expected [M, N, K], got {shape!r:.60}")
    table = value.get("table", [])
    if not (isinstance(table, list) and all(
            isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)
            and _time_like(row[1]) for row in table)):
        raise ValueError("value.table: expected [[config, ms], ...]")
    checksum = record.get("checksum")
    if not isinstance(checksum, str):
        raise ValueError("checksum: missing")
    if checksum != hashlib.sha256(_canonical(value).encode()).hexdigest():
        raise ValueError("checksum: does not match the value")
    created = record.get("created", 0.0)
    if not _time_like(created):
        raise ValueError(f"created: expected a time, got {created!r:.40}")
    return record


def _kind(obj) -> str:
    return "nothing" if obj is None else type(obj).__name__


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _time_like(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= 0)


def _too_deep(obj, limit: int) -> bool:
    stack = [(obj, 1)]                   # iterative: a deep record must not exhaust the stack
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


class TuningDB:
    """Tuning results that persist across processes.

    Args:
        root: the ``tuning`` directory, or several in look-up order (default: ``tuning`` in
            each directory of ``GE2JIT_CACHE_DIR``). Records are written to the first.
        code: the fingerprint of the code records are for (default: ``code_fingerprint()``):
            added to every key as ``code`` (see ``full_key``).
    """

    def __init__(self, root: str | os.PathLike | Sequence[str | os.PathLike] | None = None, *,
                 code: str | None = None):
        settings = get_settings()
        self.code = code_fingerprint() if code is None else code
        roots = (tuple(d / "tuning" for d in settings.cache_dirs) if root is None
                 else CacheDirs.parse(root))
        self._dirs = CacheDirs(roots, enabled=not settings.disable_cache,
                               what="tuning database", kept="tuning results")
        self.roots: tuple[Path, ...] = self._dirs.roots
        self.root: Path = self._dirs.root
        self._memory: dict[str, dict] = {}
        self._ignored: set[Path] = set()     # bad records already warned about

    def _path(self, digest: str, root: Path | None = None) -> Path:
        return (self.root if root is None else root) / digest[:2] / (digest[2:] + ".json")

    @staticmethod
    def digest(key: dict) -> str:
        """The sha256 of a key (hex), which names its record."""
        return hashlib.sha256(_canonical(key).encode()).hexdigest()

    validate_record = staticmethod(validate_record)

    def full_key(self, key: dict) -> dict:
        """``key`` as stored: with ``code`` (this database's code fingerprint) unless it names
        one already (a record read from a bundle keeps the code it was tuned on)."""
        return key if "code" in key else {**key, "code": self.code}

    def get(self, key: dict) -> dict | None:
        """The stored value for ``key`` tuned on this code, or None (a bad record is ignored
        with one warning)."""
        key = self.full_key(key)
        d = self.digest(key)
        if d in self._memory:
            return self._memory[d]["value"]
        for i, root in self._dirs.readable():
            record = self._read(i, root, d)
            if record is not None and record["key"] != key:
                self._ignore(self._path(d, root), "it holds another key")
                record = None
            if record is not None:
                self._memory[d] = record
                return record["value"]
        return None

    def put(self, key: dict, value: dict) -> Path | None:
        """Store ``value`` for ``key`` in the first directory; returns the record's path, or
        None when it is kept in memory only.

        Raises:
            ValueError: the record would not pass ``validate_record``.
        """
        key = self.full_key(key)
        d = self.digest(key)
        record = validate_record({"key": key, "value": value, "created": time.time(),
                                  "checksum": hashlib.sha256(_canonical(value).encode())
                                  .hexdigest()})
        self._memory[d] = record
        path = self._path(d)
        try:
            if not self._dirs.prepare(path.parent):
                return None
            atomic_write(path, json.dumps(record, sort_keys=True, indent=1).encode())
        except OSError as e:
            self._dirs.fall_back(e)
            return None
        self._ignored.discard(path)
        return path

    def records(self) -> Iterator[dict]:
        """Yield every valid record on disk tuned on this code (the first directory's where
        several hold a key) as a dict with 'key' and 'value'; bad ones are ignored with one
        warning, other code's (older kernels') are left out."""
        seen: set[str] = set()
        for i, root in self._dirs.readable():
            for digest in _record_digests(root, shared=i > 0):
                if digest in seen:
                    continue
                record = self._read(i, root, digest)
                if record is not None and self.digest(record["key"]) != digest:
                    self._ignore(self._path(digest, root), "it holds another key")
                    record = None
                if record is not None and record["key"].get("code") == self.code:
                    seen.add(digest)
                    yield record

    def _read(self, i: int, root: Path, digest: str) -> dict | None:
        """The valid record ``digest`` in directory ``i``, or None."""
        path = self._path(digest, root)
        if path in self._ignored:
            return None
        try:
            data = read_trusted(root, digest[:2], digest[2:] + ".json", shared=i > 0,
                                max_bytes=MAX_RECORD_BYTES)
            if data is None:
                return None
            return validate_record(json.loads(data.decode()))
        except UntrustedFile as e:
            self._ignore(path, str(e))
        except RecursionError:
            self._ignore(path, f"nested more than {MAX_DEPTH} deep")
        except UnicodeDecodeError:
            self._ignore(path, "not UTF-8 text")
        except json.JSONDecodeError as e:
            self._ignore(path, f"not JSON ({e})")
        except ValueError as e:          # not a record
            self._ignore(path, str(e))
        return None

    def _ignore(self, path: Path, reason: str) -> None:
        if path in self._ignored:
            return
        self._ignored.add(path)
        warnings.warn(f"ge2jit ignores the tuning record {path}: {reason}", CacheWarning,
                      stacklevel=4)


def _record_digests(root: Path, *, shared: bool) -> list[str]:
    """The digests named by the record files in ``root`` (regular files in trusted shards)."""
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return []
    out = []
    try:
        for shard, shard_fd in _shards(root_fd):
            try:
                if untrusted(os.fstat(shard_fd), shared=shared):
                    continue
                out += [shard + name[:-len(".json")]
                        for name, _ in _own_files(shard_fd, _RECORD_RE)]
            finally:
                os.close(shard_fd)
    finally:
        os.close(root_fd)
    return out


_default: TuningDB | None = None


def default_db() -> TuningDB:
    """The process-wide tuning database (its location follows GE2JIT_CACHE_DIR at first use)."""
    global _default
    if _default is None:
        _default = TuningDB()
    return _default

