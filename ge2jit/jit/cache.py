"""The on-disk kernel cache.

Rules (each one learned from a bug in another JIT's tracker):
- the key is a sha256 of everything that determines the machine code: rendered source, compile
  options, architecture, NVRTC version and build fingerprint, ge2jit's version, and a checksum
  of the CUDA headers when the source includes any; never the spec alone;
- an entry is written to a temporary file in its own directory and moved into place with
  ``os.replace``, so readers see a whole entry or none, and any number of processes may write
  the same key at once;
- each entry ends with a checksum of its header and cubin; on read, any mismatch or error is a
  miss, and so is an entry whose key, kernel name or architecture is not the one asked for, or
  whose cubin does not define that kernel;
- the directory is sharded by the key's first two hex digits;
- an unwritable directory (read-only, full) makes the cache keep kernels in memory, with one
  warning per process;
- nothing in a directory is trusted that ge2jit could not have written (see ``untrusted``):
  only regular files up to ``MAX_ENTRY_BYTES`` are read, without following a symlink or
  blocking on a FIFO, and a directory that other users can write is refused, as ssh refuses
  such key files;
- ``GE2JIT_CACHE_DIR`` may list several directories: look-ups go through them in order and
  misses are written to the first; the others are read only (a shared, warmed cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CacheWarning
from ..settings import get_settings

MAGIC = b"GE2JITK2"               # K1 entries checksummed the cubin only: now misses
_HEADER_LEN = struct.Struct("<I")
_CHECKSUM_LEN = 32                # sha256 of everything before it
SUFFIX = ".cubin"
SOURCE_SUFFIX = ".cu"
#: a kernel's alias file: the key of its entry, found from its spec without rendering the
#: source (``KernelCache.resolve``)
ALIAS_SUFFIX = ".key"
TMP_PREFIX = ".tmp-ge2jit-"
MAX_ENTRY_BYTES = 64 * 1024 * 1024   # the largest cubins are a few MiB; anything more is not ours

# The only names that clear and prune may delete: a shard directory is two hex digits, an entry
# the key's other 62 (with its optional source beside it), a temporary file ours by prefix.
_SHARD_RE = re.compile(r"[0-9a-f]{2}")
_ENTRY_RE = re.compile(r"([0-9a-f]{62})(\.cubin|\.cu|\.key)")
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_TMP_RE = re.compile(re.escape(TMP_PREFIX) + r"[0-9]+-[a-z0-9_]+")
_TMP_MAX_AGE_S = 3600.0          # prune: a temporary file this old belongs to a killed writer
_FILE_MODE = 0o644               # less the umask; never group- or world-writable (see untrusted)
_RESCAN_EVERY = 64               # writes between scans that see other processes' entries
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted under an entry's name must not wait for a writer.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

logger = logging.getLogger("ge2jit.cache")

_FROM_SETTINGS = object()            # KernelCache's max_size: GE2JIT_CACHE_MAX_SIZE


def _read_umask() -> int:
    """This process's umask, read without changing it where Linux tells (/proc)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:                    # elsewhere: set and restore it, once, at import
        old = os.umask(0o022)
        os.umask(old)
    return old


_umask_lock = threading.Lock()
_UMASK = _read_umask()


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
        """The entry's facts as stored: every field but the cubin, plus its size."""
        d = asdict(self)
        del d["cubin"]
        d["cubin_size"] = len(self.cubin)
        return d

    def to_bytes(self) -> bytes:
        """The entry as stored: magic, header length, JSON header, cubin, sha256 of them all."""
        header = json.dumps(self.header(), sort_keys=True).encode()
        body = MAGIC + _HEADER_LEN.pack(len(header)) + header + self.cubin
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes, expected_key: str | None = None, *,
                   kernel_name: str | None = None, arch: str | None = None) -> CacheEntry:
        """Parse and verify an entry.

        Args:
            data: the stored bytes.
            expected_key: the key it must carry (None: any).
            kernel_name: the kernel it must hold: named in its header and defined by its cubin.
            arch: the architecture it must be compiled for.

        Raises:
            ValueError: any defect or mismatch.
        """
        if not data.startswith(MAGIC):
            raise ValueError("bad magic")
        body, checksum = data[:-_CHECKSUM_LEN], data[-_CHECKSUM_LEN:]
        if len(data) < len(MAGIC) + _HEADER_LEN.size + _CHECKSUM_LEN or \
                hashlib.sha256(body).digest() != checksum:
            raise ValueError("checksum mismatch")
        off = len(MAGIC)
        (n,) = _HEADER_LEN.unpack_from(body, off)
        off += _HEADER_LEN.size
        header = json.loads(body[off:off + n].decode())
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
        cubin = body[off + n:]
        if len(cubin) != header.pop("cubin_size", None):
            raise ValueError("truncated cubin")
        if set(header) != set(_HEADER_TYPES) - {"log"} and set(header) != set(_HEADER_TYPES):
            raise ValueError(f"header fields {sorted(header)} are not an entry's")
        for field, value in header.items():
            if not isinstance(value, _HEADER_TYPES[field]) or isinstance(value, bool):
                raise ValueError(f"header field {field}: {type(value).__name__} value")
        entry = cls(cubin=cubin, **header)
        if expected_key is not None and entry.key != expected_key:
            raise ValueError(f"key {entry.key!r} where {expected_key!r} was expected")
        if arch is not None and entry.arch != arch:
            raise ValueError(f"compiled for {entry.arch!r}, not {arch!r}")
        if kernel_name is not None:
            if entry.kernel_name != kernel_name:
                raise ValueError(f"holds kernel {entry.kernel_name!r}, not {kernel_name!r}")
            # The symbol, or a section named after it: kernel names have no dots, so either
            # occurs only in a cubin that defines this kernel.
            name = kernel_name.encode()
            if b"\0" + name + b"\0" not in cubin and b"." + name + b"\0" not in cubin:
                raise ValueError(f"the cubin does not define kernel {kernel_name!r}")
        return entry


_HEADER_TYPES = {
    **dict.fromkeys(("key", "kernel_name", "arch", "nvrtc_version", "ge2jit_version", "log"), str),
    **dict.fromkeys(("registers", "shared_bytes", "stack_bytes", "spill_stores", "spill_loads"),
                    int),
    **dict.fromkeys(("compile_seconds", "created"), (int, float)),
}


@dataclass(frozen=True)
class RemoveResult:
    """What ``KernelCache.clear`` or ``KernelCache.prune`` did.

    Attributes:
        removed: cache entries removed.
        freed: bytes freed (entries, their sources and leftover temporary files).
        failed: (path, reason) of everything that should have been removed and was not,
            including a cache directory that is unusable.
    """

    removed: int = 0
    freed: int = 0
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failed


class CacheDirs:
    """The directories of one store (kernels, tuning records): the first takes the writes,
    the others are only read. Keeps which are refused and warns once per directory.

    Args:
        roots: the directories in look-up order.
        enabled: False: no directory is used at all.
        what: the store's name in warnings ("kernel cache").
        kept: what is kept in memory instead ("compiled kernels").
    """

    def __init__(self, roots: tuple[Path, ...], *, enabled: bool, what: str, kept: str):
        if not roots:
            raise ValueError(f"{what}: expected at least one directory, got none")
        self.roots = roots
        self.root = roots[0]
        self.enabled = enabled
        self.writable = enabled              # False after a refusal or a failed write
        self.what, self.kept = what, kept
        self._refused: dict[int, str | None] = {}   # index -> why it is not used
        self._failed_write: str | None = None       # why the last write failed
        self._warned = False
        self._lock = threading.Lock()

    @staticmethod
    def parse(root: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[Path, ...]:
        """One directory or several, as a tuple of paths."""
        if isinstance(root, (str, os.PathLike)):
            return (Path(root),)
        return tuple(Path(r) for r in root)

    def readable(self) -> Iterator[tuple[int, Path]]:
        """(index, directory) of each directory to look in, in order."""
        if not self.enabled:
            return
        for i, root in enumerate(self.roots):
            if not self.problem(i):      # a failed write (disk full) still lets entries be read
                yield i, root

    def problem(self, i: int) -> str | None:
        """Why directory ``i`` is not used (checked once it exists), or None."""
        if i in self._refused:
            return self._refused[i]
        root = self.roots[i]
        if not root.is_dir():
            return None if i == 0 else "missing"   # the first is made at the first write
        why = _dir_problem(root, shared=i > 0, follow=True)
        if why:
            self.refuse(i, f"it is {why}")
        else:
            self._refused[i] = None
        return why

    def prepare(self, shard: Path) -> bool:
        """Make the first directory and its subdirectory ``shard``; False when either may not
        be used (refused, with the warning). Raises OSError when they cannot be made."""
        if not self.writable:
            return False
        _make_dirs(self.root)
        if self.problem(0):
            return False
        _make_dirs(shard)
        why = _dir_problem(shard, shared=False, follow=False)
        if why:
            self.refuse(0, f"its subdirectory {shard.name} is {why}")
            return False
        return True

    def refused_why(self, i: int) -> str | None:
        """Why this process stopped using directory ``i`` (refused, or a write failed), or
        None when it has not."""
        if i == 0 and self._failed_write:
            return self._failed_write
        return self._refused.get(i)                 # "it is ...", "its subdirectory ..."

    def refuse(self, i: int, why: str) -> None:
        """Stop using directory ``i`` for this process; warn once."""
        root = self.roots[i]
        with self._lock:
            self._refused[i] = why
            if i == 0:
                self.writable = False
                if self._warned:
                    return
                self._warned = True
                msg = (f"ge2jit does not use the {self.what} directory {root}: {why}; "
                       f"{self.kept} are kept in memory for this process only. Make it yours "
                       f"and writable by you alone (chmod go-w {root}) or set GE2JIT_CACHE_DIR "
                       "to a private directory.")
            else:
                msg = (f"ge2jit does not read the shared {self.what} directory {root}: {why}; "
                       "a shared cache must be writable by its owner alone (chmod go-w).")
        warnings.warn(msg, CacheWarning, stacklevel=2)

    def fall_back(self, err: OSError) -> None:
        """A write failed (read-only, full): keep to memory for this process; warn once."""
        with self._lock:
            self.writable = False
            self._failed_write = f"a write failed ({err.strerror or err})"
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            f"ge2jit cannot write its {self.what} at {self.root} ({err.strerror or err}); "
            f"{self.kept} are kept in memory for this process only. Set GE2JIT_CACHE_DIR to a "
            "writable directory to keep them across runs.",
            CacheWarning,
            stacklevel=2,
        )


class KernelCache:
    """Disk cache of compiled kernels, with an in-memory fallback.

    Args:
        root: one directory or several in look-up order (default: ``GE2JIT_CACHE_DIR``).
            Misses are written to the first; the others are only read (a shared, warmed cache).
        enabled: False keeps kernels in memory only (default: not ``GE2JIT_DISABLE_CACHE``).
        max_size: the first directory's size cap in bytes, None for none (default:
            ``GE2JIT_CACHE_MAX_SIZE``, read at each write).

    Raises:
        SettingsError: GE2JIT_DISABLE_CACHE or GE2JIT_VERBOSE holds a value that is no switch.
    """

    def __init__(self, root: str | os.PathLike | Sequence[str | os.PathLike] | None = None, *,
                 enabled: bool | None = None, max_size: int | None | object = _FROM_SETTINGS):
        settings = get_settings()
        # GE2JIT_VERBOSE decides the compile log, which starts with the cache: a bad value is
        # reported here, at the first compile or cache command, not taken as "on".
        _ = settings.verbose
        roots = tuple(settings.cache_dirs) if root is None else CacheDirs.parse(root)
        enabled = (not settings.disable_cache) if enabled is None else enabled
        self._max_size = max_size
        self._cap_warned = False
        self._dirs = CacheDirs(roots, enabled=enabled, what="kernel cache",
                               kept="compiled kernels")
        self.roots: tuple[Path, ...] = self._dirs.roots
        self.root: Path = self._dirs.root
        self.enabled: bool = enabled
        self._memory: dict[str, CacheEntry] = {}
        self._disk_bytes: int | None = None         # the first directory's entries, in bytes
        self.hits = 0
        self.misses = 0
        self.corrupt = 0
        self.writes = 0

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / (key[2:] + SUFFIX)

    def get(self, key: str, *, kernel_name: str | None = None, arch: str | None = None,
            count_miss: bool = True) -> CacheEntry | None:
        """The entry for ``key``, or None.

        A missing, unreadable or damaged entry is a miss, and so is one that does not hold
        ``kernel_name`` compiled for ``arch`` (when given); damaged or mismatched entries are
        counted in ``corrupt``, and the next ``put`` overwrites them. ``count_miss=False``: a
        miss is not counted (a look-up that another one follows).
        """
        entry = self._memory.get(key)
        if entry is not None:
            self.hits += 1
            return entry
        for i, root in self._dirs.readable():
            try:
                data = read_trusted(root, key[:2], key[2:] + SUFFIX, shared=i > 0,
                                    touch=i == 0)       # the use, for LRU eviction
                if data is None:
                    continue
                entry = CacheEntry.from_bytes(data, expected_key=key, kernel_name=kernel_name,
                                              arch=arch)
            except Exception as e:  # noqa: BLE001 - any defect is a miss that recompiles
                self.corrupt += 1
                logger.debug("cache entry %s in %s refused: %s", key, root, e)
                continue
            self.hits += 1
            self._memory[key] = entry
            return entry
        self.misses += count_miss
        return None

    def resolve(self, alias: str) -> str | None:
        """The key an alias was linked to (``link``), from the first directory that has it,
        or None. An alias file is read by the rules of an entry's; one that does not hold a
        key is no alias."""
        for i, root in self._dirs.readable():
            try:
                data = read_trusted(root, alias[:2], alias[2:] + ALIAS_SUFFIX, shared=i > 0,
                                    max_bytes=128)
            except Exception:  # noqa: BLE001 - a defect is no alias: the source is rendered
                continue
            if data is not None:
                key = data.decode("ascii", errors="replace").strip()
                if _KEY_RE.fullmatch(key):
                    return key
        return None

    def link(self, alias: str, key: str) -> None:
        """Record in the first directory that ``alias`` names the entry ``key`` (nothing when
        that directory is not used; a failed write only costs a later render)."""
        path = self.root / alias[:2] / (alias[2:] + ALIAS_SUFFIX)
        if not self.enabled:
            return
        try:
            if self._dirs.prepare(path.parent):
                atomic_write(path, key.encode("ascii"))
        except OSError:
            pass

    def put(self, entry: CacheEntry, source: str | None = None) -> Path | None:
        """Store ``entry`` in the first directory; returns its path, or None when it is kept in
        memory only (the disk cache is disabled, refused or unwritable)."""
        self._memory[entry.key] = entry
        return self.store(entry.key, entry.to_bytes(), source)

    def store(self, key: str, data: bytes, source: str | None = None) -> Path | None:
        """Write one entry's bytes (as ``CacheEntry.to_bytes`` makes them) under ``key`` in the
        first directory, by the directory rules and within the size cap, keeping no copy in
        memory; returns the path, or None when they are not on disk (the directory is
        refused or unwritable, with one warning; or the entry alone exceeds the cap)."""
        path = self.path_for(key)
        # read before anything is written: a bad value raises with nothing half done
        cap = self.max_size
        encoded = source.encode() if source is not None and get_settings().save_source else None
        if cap is not None and not self._fits(cap, len(data) + len(encoded or b"")):
            return None
        try:
            if not self._dirs.prepare(path.parent):
                return None
            replaced = _file_bytes(path) if cap is not None else 0
            atomic_write(path, data)
            if encoded is not None:
                atomic_write(path.with_suffix(SOURCE_SUFFIX), encoded)
        except OSError as e:
            self._dirs.fall_back(e)
            return None
        self.writes += 1
        if cap is not None and not self._hold_cap(cap, _file_bytes(path) - replaced, path):
            return None
        return path

    @property
    def max_size(self) -> int | None:
        """The first directory's size cap in bytes, or None.

        Raises:
            SettingsError: GE2JIT_CACHE_MAX_SIZE cannot be used (when it is the source).
        """
        if self._max_size is _FROM_SETTINGS:
            return get_settings().cache_max_size
        return self._max_size

    def _fits(self, cap: int, size: int) -> bool:
        """Whether an entry of ``size`` bytes can stay under the cap; warns once when not.

        Eviction goes down to nine tenths of the cap, so a larger entry would be evicted by its
        own write, after evicting every other: it is kept in memory instead, and said so.
        """
        if size <= cap - cap // 10:
            return True
        if not self._cap_warned:
            self._cap_warned = True
            setting = get_settings().cache_max_size_text.strip()
            named = (f"GE2JIT_CACHE_MAX_SIZE={setting}" if self._max_size is _FROM_SETTINGS
                     else "max_size")
            warnings.warn(
                f"ge2jit's kernel cache cap ({named}, {cap} bytes) is too small for a kernel of "
                f"{size} bytes (eviction goes down to nine tenths of the cap); such kernels "
                "are kept in memory for this process only. Raise the cap (2GB holds thousands "
                "of kernels).", CacheWarning, stacklevel=4)
        return False

    def where(self, key: str) -> Path | None:
        """The file that holds ``key``'s entry on disk (in the first directory that has it), or
        None when the entry is in memory only (the disk cache is disabled, refused, not
        writable, or the entry did not fit the cap)."""
        for _, root in self._dirs.readable():
            path = root / key[:2] / (key[2:] + SUFFIX)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    return path
            except OSError:
                continue
        return None

    def _hold_cap(self, cap: int, added: int, path: Path) -> bool:
        """Evict least recently used entries if the first directory now holds more than
        ``cap`` bytes; False if that evicted ``path``, the entry just written.

        The total is kept in memory between scans, so a write under the cap costs no scan.
        Other processes' writes are seen at the next scan (every ``_RESCAN_EVERY`` writes).
        """
        if self._disk_bytes is None or self.writes % _RESCAN_EVERY == 0:
            try:
                root_fd = os.open(self.root, _DIR_FLAGS)
            except OSError:
                return True
            try:
                entries, _ = _entry_files(root_fd)
            finally:
                os.close(root_fd)
            self._disk_bytes = sum(e[1] for e in entries.values())
        else:
            self._disk_bytes += added
        if self._disk_bytes <= cap:
            return True
        # Down to nine tenths of the cap, so that evictions (each a scan) come in batches.
        self.prune(max_bytes=cap - cap // 10)
        return os.path.lexists(path)

    def writable_problem(self, *, create: bool = True) -> str | None:
        """Why the first directory cannot take new entries (disabled, refused, not writable),
        or None when it can. Warns of nothing.

        ``create``: make the directory (as the first write would); False leaves a missing one
        missing and tries a file in its nearest existing parent instead (what ``info`` does).
        """
        if not self.enabled:
            return "the disk cache is disabled (GE2JIT_DISABLE_CACHE)"
        refused = self._dirs.refused_why(0)   # this process already gave up on it
        if refused:
            return f"{self.root}: {refused}"
        where = self.root
        try:
            if create:
                _make_dirs(self.root)
            else:
                while not os.path.lexists(where) and where.parent != where:
                    where = where.parent
                if not where.is_dir():
                    return (f"{self.root} cannot be made: {where} is not a directory"
                            if where != self.root else f"{self.root} is not a directory")
            if where == self.root:
                why = _dir_problem(self.root, shared=False, follow=True)
                if why:
                    return f"{self.root} is {why}"
            fd, probe = tempfile.mkstemp(dir=where, prefix=f"{TMP_PREFIX}{os.getpid()}-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            if where != self.root:
                return f"{self.root} cannot be made in {where} ({e.strerror or e})"
            return f"{self.root} is not writable ({e.strerror or e})"
        return None

    def info(self) -> dict:
        """Location, whether new kernels can be stored there (and if not, why), entries, size on
        disk, the size cap, and this process's hit/miss counters.

        ``disk_cache`` is ``"enabled"``, ``"disabled (GE2JIT_DISABLE_CACHE)"`` or ``"not
        used: <why>"`` (then compiled kernels are kept in memory only); ``writable`` and
        ``not_writable_reason`` say the same for scripts. Creates nothing.

        Raises:
            SettingsError: GE2JIT_CACHE_MAX_SIZE cannot be used.
        """
        cap = self.max_size
        why = self.writable_problem(create=False) if self.enabled else None
        entries = list(self.entries())
        if not self.enabled:
            disk = "disabled (GE2JIT_DISABLE_CACHE)"
        else:
            disk = f"not used: {why}" if why else "enabled"
        return {
            "location": str(self.root),
            "read_only_locations": [str(r) for r in self.roots[1:]],
            "disk_cache": disk,
            "writable": self.enabled and why is None,
            "not_writable_reason": why,
            "entries": len(entries),
            "unreadable_entries": sum(1 for _, e in entries if e is None),
            "size_bytes": sum(p.stat().st_size for p, _ in entries),
            "max_size_bytes": cap,
            "max_size_setting": (get_settings().cache_max_size_text.strip() or None
                                 if self._max_size is _FROM_SETTINGS else None),
            "process_hits": self.hits,
            "process_misses": self.misses,
            "process_corrupt_entries": self.corrupt,
            "process_writes": self.writes,
            "kernels_in_memory": len(self._memory),
        }

    def clear(self) -> RemoveResult:
        """Remove every entry of the first directory, with its source and any temporary file.

        Only ge2jit's own file names are touched (``<2 hex>/<62 hex>.cubin``, the ``.cu``
        beside it, ``.tmp-ge2jit-*``), and no symlink is followed. The directories listed after
        the first (read-only shared caches) and the tuning database (``tuning/``) are left as
        they are.
        """
        self._memory.clear()
        self._disk_bytes = None
        result = _Removal()
        root_fd = result.open_root(self.root)
        if root_fd is None:
            return result.done()
        try:
            for shard, shard_fd in _shards(root_fd):
                try:
                    for name, st in _own_files(shard_fd):
                        result.unlink(shard_fd, self.root / shard / name, st,
                                      counts=name.endswith(SUFFIX))
                finally:
                    os.close(shard_fd)
        finally:
            os.close(root_fd)
        return result.done()

    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None
              ) -> RemoveResult:
        """Shrink the first directory.

        Removes the entries unused for ``older_than_s`` seconds, then the least recently used
        ones until the entries take at most ``max_bytes``; temporary files left by killed
        writers (older than an hour) go too. The same file rules as ``clear`` apply.
        """
        result = _Removal()
        root_fd = result.open_root(self.root)
        if root_fd is None:
            return result.done()
        now = time.time()
        try:
            entries, temporary = _entry_files(root_fd)
            for shard, name, st in temporary:
                if now - st.st_mtime > _TMP_MAX_AGE_S:
                    result.unlink_in(root_fd, self.root, shard, [name])
            total = sum(e[1] for e in entries.values())
            for key, (mtime, _, names) in sorted(entries.items(), key=lambda kv: kv[1][0]):
                too_old = older_than_s is not None and now - mtime > older_than_s
                too_big = max_bytes is not None and total > max_bytes
                if not (too_old or too_big):
                    continue
                before = result.freed
                result.unlink_in(root_fd, self.root, key[:2], sorted(names, reverse=True))
                total -= result.freed - before
            self._disk_bytes = total
        finally:
            os.close(root_fd)
        return result.done()

    def aliases(self) -> Iterator[tuple[str, str]]:
        """Yield (alias, key) for every alias file of the first directory that holds a key
        (read by the rules of ``resolve``)."""
        for shard, name, data in self._own_reads(ALIAS_SUFFIX, max_bytes=128):
            key = (data or b"").decode("ascii", errors="replace").strip()
            if data is not None and _KEY_RE.fullmatch(key):
                yield shard + name[:-len(ALIAS_SUFFIX)], key

    def entries(self) -> Iterator[tuple[Path, CacheEntry | None]]:
        """Yield (path, entry or None if unreadable) for every entry file of the first
        directory. Other names, symlinks, FIFOs and a subdirectory others can write are not
        entries; a file that breaks the other rules of ``get`` is unreadable."""
        for shard, name, data in self._own_reads(SUFFIX):
            try:
                entry = CacheEntry.from_bytes(data or b"",
                                              expected_key=shard + name[:-len(SUFFIX)])
            except Exception:  # noqa: BLE001 - any defect makes it unreadable
                entry = None
            yield self.root / shard / name, entry

    def _own_reads(self, suffix: str, max_bytes: int | None = None
                   ) -> Iterator[tuple[str, str, bytes | None]]:
        """(shard, name, bytes or None when unreadable) of each file of the first directory
        with ge2jit's names ending in ``suffix``, read by the rules of ``get``; none when the
        directory is refused (GE2JIT_DISABLE_CACHE or not, it lists what is there)."""
        if self._dirs.problem(0):
            return
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return
        try:
            for shard, shard_fd in _shards(root_fd):
                try:
                    if untrusted(os.fstat(shard_fd), shared=False):
                        continue
                    for name, _ in _own_files(shard_fd):
                        if not name.endswith(suffix):
                            continue
                        try:
                            data = _read_at(shard_fd, name, shared=False, max_bytes=max_bytes)
                        except Exception:  # noqa: BLE001 - any defect makes it unreadable
                            data = None
                        yield shard, name, data
                finally:
                    os.close(shard_fd)
        finally:
            os.close(root_fd)


class _Removal:
    """Counts of one clear or prune, and its removals through directory descriptors."""

    def __init__(self) -> None:
        self.removed = 0
        self.freed = 0
        self.failed: list[tuple[str, str]] = []

    def done(self) -> RemoveResult:
        return RemoveResult(self.removed, self.freed, tuple(self.failed))

    def open_root(self, root: Path) -> int | None:
        """A descriptor of ``root`` (the user named it: a symlink there is followed), or None
        with the reason recorded; a missing directory holds nothing to remove."""
        try:
            fd = os.open(root, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            self.failed.append((str(root), "not a directory"))
            return None
        except OSError as e:
            self.failed.append((str(root), f"cannot open the directory ({e.strerror or e})"))
            return None
        why = untrusted(os.fstat(fd), shared=False)
        if why:
            os.close(fd)
            self.failed.append((str(root), f"refused: the directory is {why}"))
            return None
        if not os.access(root, os.W_OK | os.X_OK):
            os.close(fd)
            self.failed.append((str(root), "the directory is not writable"))
            return None
        return fd

    def unlink(self, dir_fd: int, path: Path, st: os.stat_result, counts: bool = False) -> bool:
        try:
            os.unlink(path.name, dir_fd=dir_fd)
        except FileNotFoundError:            # another process removed it first
            return False
        except OSError as e:
            self.failed.append((str(path), e.strerror or str(e)))
            return False
        self.freed += st.st_size
        self.removed += counts
        return True

    def unlink_in(self, root_fd: int, root: Path, shard: str, names: list[str]) -> None:
        """Remove one entry's files (the cubin last: it is what makes the entry)."""
        try:
            shard_fd = os.open(shard, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError as e:
            self.failed.append((str(root / shard), e.strerror or str(e)))
            return
        try:
            for name in names:
                try:
                    st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    self.unlink(shard_fd, root / shard / name, st, counts=name.endswith(SUFFIX))
        finally:
            os.close(shard_fd)


def _shards(root_fd: int) -> Iterator[tuple[str, int]]:
    """(name, open descriptor) of each shard directory, in order; the caller closes it.
    A symlink or anything but a directory under a shard's name is skipped."""
    names = sorted(e.name for e in os.scandir(root_fd) if _SHARD_RE.fullmatch(e.name))
    for name in names:
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError:                      # a symlink (ELOOP), a file, or gone
            continue
        yield name, fd


def _entry_files(root_fd: int) -> tuple[dict[str, list], list[tuple[str, str, os.stat_result]]]:
    """The first directory's entries, key -> [last use, bytes with the source, file names], and
    its temporary files, (shard, name, lstat)."""
    entries: dict[str, list] = {}
    temporary = []
    for shard, shard_fd in _shards(root_fd):
        try:
            for name, st in _own_files(shard_fd):
                m = _ENTRY_RE.fullmatch(name)
                if m is None:
                    temporary.append((shard, name, st))
                    continue
                e = entries.setdefault(shard + m.group(1), [0.0, 0, []])
                if m.group(2) in (SUFFIX, ALIAS_SUFFIX):   # the cubin's time is the entry's
                    e[0] = st.st_mtime                     # use; an alias's, its own
                e[1] += st.st_size
                e[2].append(name)
        finally:
            os.close(shard_fd)
    return entries, temporary


def _file_bytes(path: Path) -> int:
    """Bytes of an entry file and the source beside it (0 for what is not there)."""
    total = 0
    for p in (path, path.with_suffix(SOURCE_SUFFIX)):
        try:
            total += os.lstat(p).st_size
        except OSError:
            pass
    return total


def _own_files(shard_fd: int, pattern: re.Pattern | None = None
               ) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of the regular files in a shard that have ge2jit's names (entries and
    temporary files, or those ``pattern`` matches), sorted."""
    out = []
    for e in os.scandir(shard_fd):
        if pattern is not None:
            if not pattern.fullmatch(e.name):
                continue
        elif not (_ENTRY_RE.fullmatch(e.name) or _TMP_RE.fullmatch(e.name)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((e.name, st))
    return sorted(out, key=lambda x: x[0])


class UntrustedFile(ValueError):
    """A file (or its directory) under a cache name that ge2jit could not have written."""


def untrusted(st: os.stat_result, *, shared: bool) -> str | None:
    """Why a cache file or directory with status ``st`` cannot be trusted, or None.

    The rules, as ssh applies to key files: it belongs to this user or root, and no one else
    can write it, that is, it is not world-writable, and group-writable only when the group is
    this user's private group (same name, no other member: the usual umask 002 set-up). In a
    read-only shared directory (``shared``) the owner may be anyone (the one who warmed it),
    but then neither group nor world may write.
    """
    mine = st.st_uid in (os.geteuid(), 0)
    mode = stat.S_IMODE(st.st_mode)
    if not (mine or shared):
        return f"owned by another user (uid {st.st_uid})"
    if mode & stat.S_IWOTH:
        return f"writable by every user (mode {mode:#o})"
    if mode & stat.S_IWGRP and not (mine and _group_is_private(st.st_gid)):
        return f"writable by group {_group_name(st.st_gid)} (mode {mode:#o})"
    return None


def _group_is_private(gid: int) -> bool:
    import grp
    import pwd

    try:
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (KeyError, OSError):
        return False
    return (gid == user.pw_gid and group.gr_name == user.pw_name
            and all(m == user.pw_name for m in group.gr_mem))


def _group_name(gid: int) -> str:
    import grp

    try:
        return repr(grp.getgrgid(gid).gr_name)
    except (KeyError, OSError):
        return str(gid)


def _dir_problem(path: Path, *, shared: bool, follow: bool) -> str | None:
    """Why the directory ``path`` is refused, or None (also when it cannot be examined: the
    write that needs it reports that). ``follow``: a symlink there is followed (only for a
    directory the user named)."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return None
    return untrusted(st, shared=shared)


def read_trusted(root: Path, shard: str, name: str, *, shared: bool, touch: bool = False,
                 max_bytes: int | None = None) -> bytes | None:
    """The bytes of ``root/shard/name``, or None when there is none.

    The shard directory and the file are opened without following symlinks and must pass
    ``untrusted``; the file must be regular and hold at most ``max_bytes`` (default
    MAX_ENTRY_BYTES). ``touch`` records the use (mtime) for eviction.

    Raises:
        UntrustedFile: something is there that breaks these rules (the reason says what).
    """
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    try:
        try:
            shard_fd = os.open(shard, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except FileNotFoundError:
            return None
        except OSError as e:                 # ELOOP: a symlink; ENOTDIR: not a directory
            raise UntrustedFile(f"{shard}: {e.strerror or e}") from None
        try:
            why = untrusted(os.fstat(shard_fd), shared=shared)
            if why:
                raise UntrustedFile(f"{shard} is {why}")
            return _read_at(shard_fd, name, shared=shared, touch=touch, max_bytes=max_bytes)
        finally:
            os.close(shard_fd)
    finally:
        os.close(root_fd)


def _read_at(dir_fd: int, name: str, *, shared: bool, touch: bool = False,
             max_bytes: int | None = None) -> bytes | None:
    """The bytes of the regular file ``name`` in ``dir_fd`` (None if there is none), read only
    if it passes ``untrusted`` and holds at most ``max_bytes`` (default MAX_ENTRY_BYTES)."""
    limit = MAX_ENTRY_BYTES if max_bytes is None else max_bytes
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UntrustedFile(f"{name}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):         # never open a device, FIFO or symlink
        raise UntrustedFile(f"{name} is not a regular file")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UntrustedFile(f"{name}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)                    # what was opened, if it changed since the stat
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{name} is not a regular file")
        if st.st_size > limit:
            raise UntrustedFile(f"{name} holds {st.st_size} bytes, more than {limit}")
        why = untrusted(st, shared=shared)
        if why:
            raise UntrustedFile(f"{name} is {why}")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UntrustedFile(f"{name} holds more than {limit} bytes")
        if touch:
            try:
                os.utime(fd)
            except OSError:
                pass
        return b"".join(chunks)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, mode 0o755 less the umask: a directory that
    ge2jit makes is never group- or world-writable (a writable cache is private)."""
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except FileNotFoundError:
        if path.parent == path:
            raise
        _make_dirs(path.parent)
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            pass


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    for attempt in range(3):
        _make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{os.getpid()}-")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(fd, _FILE_MODE & ~_UMASK)  # mkstemp's 0600 would hide it from a group
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return
        except FileNotFoundError:
            # A concurrent ``clear`` removed the temporary file (or its shard): write again.
            if attempt == 2:
                raise
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

