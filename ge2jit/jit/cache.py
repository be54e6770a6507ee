"""The on-disk kernel cache.

Rules (each one learned from a bug in another JIT's tracker):
- the key is a sha256 of everything that determines the machine code: rendered source, compile
  options, architecture, NVRTC version and build fingerprint, ge2jit's version, and a checksum
  of the CUDA headers when the source includes any; never the spec alone;
- an entry is written to a temporary file in its own directory and moved into place with
  ``os.replace``, so readers see a whole entry or none, and any number of processes may write
  the same key at once;
- each entry carries a checksum of its cubin; on read, any mismatch or error is a miss;
- the directory is sharded by the key's first two hex digits;
- an unwritable directory (read-only, full) makes the cache keep kernels in memory, with one
  warning per process.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CacheWarning
from ..settings import get_settings

MAGIC = b"GE2JITK1"
_HEADER_LEN = struct.Struct("<I")
SUFFIX = ".cubin"


def cache_key(*, source: str, options: tuple[str, ...], arch: str, nvrtc_fingerprint: str,
              ge2jit_version: str, header_checksum: str = "") -> str:
    """The sha256 key of one compiled kernel (hex)."""
    h = hashlib.sha256()
    for part in ("ge2jit-cache-v1", ge2jit_version, arch, nvrtc_fingerprint, header_checksum,
                 "\x00".join(options), source):
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One compiled kernel: its cubin and what is known about it."""

    key: str
    kernel_name: str
    arch: str
    cubin: bytes
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    compile_seconds: float
    nvrtc_version: str
    ge2jit_version: str
    created: float
    log: str = ""

    @property
    def spill_bytes(self) -> int:
        return max(self.spill_stores, 0) + max(self.spill_loads, 0)

    def header(self) -> dict:
        d = asdict(self)
        del d["cubin"]
        d["cubin_size"] = len(self.cubin)
        d["cubin_sha256"] = hashlib.sha256(self.cubin).hexdigest()
        return d

    def to_bytes(self) -> bytes:
        header = json.dumps(self.header(), sort_keys=True).encode()
        return MAGIC + _HEADER_LEN.pack(len(header)) + header + self.cubin

    @classmethod
    def from_bytes(cls, data: bytes, expected_key: str | None = None) -> CacheEntry:
        """Parse and verify an entry; raises ValueError on any defect."""
        if not data.startswith(MAGIC):
            raise ValueError("bad magic")
        off = len(MAGIC)
        (n,) = _HEADER_LEN.unpack_from(data, off)
        off += _HEADER_LEN.size
        header = json.loads(data[off:off + n].decode())
        cubin = data[off + n:]
        if len(cubin) != header.pop("cubin_size"):
            raise ValueError("truncated cubin")
        if hashlib.sha256(cubin).hexdigest() != header.pop("cubin_sha256"):
            raise ValueError("cubin checksum mismatch")
        if expected_key is not None and header.get("key") != expected_key:
            raise ValueError("key mismatch")
        return cls(cubin=cubin, **header)


class KernelCache:
    """Disk cache of compiled kernels, with an in-memory fallback."""

    def __init__(self, root: Path | None = None, *, enabled: bool | None = None):
        settings = get_settings()
        self.root = Path(root) if root is not None else settings.cache_dir
        self.enabled = (not settings.disable_cache) if enabled is None else enabled
        self._memory: dict[str, CacheEntry] = {}
        self._disk_ok = self.enabled
        self._warned = False
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.corrupt = 0
        self.writes = 0

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / (key[2:] + SUFFIX)

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None (a missing, unreadable or corrupt entry is a miss)."""
        entry = self._memory.get(key)
        if entry is not None:
            self.hits += 1
            return entry
        if self.enabled:
            path = self.path_for(key)
            try:
                data = path.read_bytes()
            except OSError:
                data = None
            if data is not None:
                try:
                    entry = CacheEntry.from_bytes(data, expected_key=key)
                except Exception:  # noqa: BLE001 - any defect is a miss that recompiles
                    self.corrupt += 1
                    entry = None
                if entry is not None:
                    self.hits += 1
                    try:  # record the use for least-recently-used eviction
                        os.utime(path)
                    except OSError:
                        pass
                    self._memory[key] = entry
                    return entry
        self.misses += 1
        return None

    def put(self, entry: CacheEntry, source: str | None = None) -> Path | None:
        """Store ``entry``; returns its path, or None when it is kept in memory only."""
        self._memory[entry.key] = entry
        if not self._disk_ok:
            return None
        path = self.path_for(entry.key)
        try:
            _atomic_write(path, entry.to_bytes())
            if source is not None and get_settings().save_source:
                _atomic_write(path.with_suffix(".cu"), source.encode())
        except OSError as e:
            self._fall_back_to_memory(e)
            return None
        self.writes += 1
        cap = get_settings().cache_max_size
        if cap is not None and self.writes % 32 == 1:  # the first write, then every 32nd
            self.prune(max_bytes=cap)
        return path

    def _fall_back_to_memory(self, err: OSError) -> None:
        with self._lock:
            self._disk_ok = False
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"ge2jit cannot write its kernel cache at {self.root} ({err.strerror or err}); "
                    "compiled kernels are kept in memory for this process only. Set "
                    "GE2JIT_CACHE_DIR to a writable directory to keep them across runs.",
                    CacheWarning,
                    stacklevel=4,
                )

    def info(self) -> dict:
        """Location, entries, size on disk, and this process's hit/miss counters."""
        entries = list(self.entries())
        return {
            "location": str(self.root),
            "disk_cache": "enabled" if self.enabled else "disabled (GE2JIT_DISABLE_CACHE)",
            "writable": self._disk_ok,
            "entries": len(entries),
            "unreadable_entries": sum(1 for _, e in entries if e is None),
            "size_bytes": sum(p.stat().st_size for p, _ in entries),
            "max_size_bytes": get_settings().cache_max_size,
            "process_hits": self.hits,
            "process_misses": self.misses,
            "process_corrupt_entries": self.corrupt,
            "process_writes": self.writes,
            "kernels_in_memory": len(self._memory),
        }

    def clear(self) -> int:
        """Remove every entry (and leftover temporary file); returns the number of entries."""
        removed = 0
        self._memory.clear()
        if not self.root.is_dir():
            return 0
        for shard in self.root.iterdir():
            if shard.is_dir() and len(shard.name) == 2:
                for path in shard.iterdir():
                    try:
                        path.unlink()
                        removed += path.suffix == SUFFIX
                    except OSError:
                        pass
        return removed

    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None
              ) -> tuple[int, int]:
        """Remove entries unused for ``older_than_s`` seconds, then the least recently used
        ones until the cache holds at most ``max_bytes``; returns (entries removed, bytes freed).
        Temporary files left by killed writers (older than an hour) go too."""
        if not self.root.is_dir():
            return 0, 0
        now = time.time()
        files = []
        for shard in self.root.iterdir():
            if not (shard.is_dir() and len(shard.name) == 2):
                continue
            for path in shard.iterdir():
                try:
                    st = path.stat()
                except OSError:
                    continue
                if path.name.startswith(".tmp-"):
                    if now - st.st_mtime > 3600:
                        _unlink(path)
                    continue
                if path.suffix == SUFFIX:
                    side = path.with_suffix(".cu")
                    extra = side.stat().st_size if side.exists() else 0
                    files.append((st.st_mtime, st.st_size + extra, path))
        files.sort()
        total = sum(f[1] for f in files)
        removed = freed = 0
        for mtime, size, path in files:
            too_old = older_than_s is not None and now - mtime > older_than_s
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big):
                continue
            if _unlink(path):
                _unlink(path.with_suffix(".cu"))
                total -= size
                freed += size
                removed += 1
        return removed, freed

    def entries(self):
        """Yield (path, entry-or-None) for every entry file on disk (None if unreadable)."""
        if not self.root.is_dir():
            return
        for shard in sorted(self.root.iterdir()):
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            for path in sorted(shard.glob("*" + SUFFIX)):
                key = shard.name + path.name[: -len(SUFFIX)]
                try:
                    yield path, CacheEntry.from_bytes(path.read_bytes(), expected_key=key)
                except Exception:  # noqa: BLE001
                    yield path, None


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=f"-{os.getpid()}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_default: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process-wide cache (its location follows GE2JIT_CACHE_DIR at first use)."""
    global _default
    if _default is None:
        _default = KernelCache()
    return _default


def reset_default_cache() -> None:
    """Forget the process-wide cache object (after changing GE2JIT_* variables)."""
    global _default
    _default = None


def log(msg: str) -> None:
    if get_settings().verbose:
        print(f"[ge2jit {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr)
