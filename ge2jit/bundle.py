"""Portable bundles of the kernel cache and the tuning database (``ge2jit cache export/import``).

A bundle is a zip file: ``manifest.json`` (ge2jit version, NVRTC version and build fingerprint,
and the sha256 of every member), ``kernels/<shard>/<key>.cubin`` entries exactly as the cache
stores them, ``aliases/<shard>/<alias>.key`` (the key of one of the bundle's kernels: the
cache finds it from its spec without rendering), and ``tuning/<shard>/<key>.json`` records.
Import verifies every checksum, entry and record (by the tuning database's
``validate_record``) before writing anything, and refuses a bundle made by another ge2jit or
NVRTC build: its kernels could never be found under this
build's cache keys. A bundle is untrusted input: its members are counted, named, and bounded in
size (``MAX_*``) before any is read, and read as bounded streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ._version import __version__
from .errors import CacheNotWritableError, CacheWarning, Ge2jitError
from .jit.cache import MAX_ENTRY_BYTES, CacheEntry, default_cache
from .jit.nvrtc import nvrtc_info
from .tune.db import MAX_RECORD_BYTES, TuningDB, default_db, validate_record

FORMAT = "ge2jit-bundle-1"


class BundleError(Ge2jitError):
    """A bundle file that cannot be used: damaged, too large, made for another build, or a
    path where no bundle can be written. Nothing was imported or written."""


@dataclass(frozen=True)
class BundleSummary:
    kernels: int
    tuning_records: int
    path: Path

    def __str__(self) -> str:
        return f"{self.kernels} kernels, {self.tuning_records} tuning records ({self.path})"


def _build_id() -> dict:
    info = nvrtc_info()
    return {"ge2jit": __version__, "nvrtc": f"{info.version[0]}.{info.version[1]}",
            "nvrtc_fingerprint": info.fingerprint}


def export_bundle(path: str | Path) -> BundleSummary:
    """Write every valid cache entry and tuning record of this build into a zip file.

    The bundle is written to a temporary file created exclusively in the target's folder and
    moved into place when whole: a failure leaves the folder as it was, and no file name can
    be planted in advance (a symlink) to redirect the write.

    Raises:
        BundleError: ``path`` is a directory, or its folder does not exist.
        OSError: writing failed (a full disk); nothing was left behind.
    """
    path = Path(path)
    if path.is_dir():
        raise BundleError(f"{path}: is a directory; give the bundle's file name, such as "
                          f"{path / 'bundle.zip'}")
    if not path.parent.is_dir():
        raise BundleError(f"{path}: the folder {path.parent} does not exist")
    build = _build_id()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as an ordinary new file: mkstemp makes it 0600
        with os.fdopen(fd, "wb") as f:
            kernels, records = _write_members(f, build)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return BundleSummary(kernels, records, path)


def _write_members(f, build: dict) -> tuple[int, int]:
    """The cache's entries, the tuning records and the manifest (last: it holds their
    checksums) into the zip file ``f``; returns (kernels, tuning records)."""
    members: dict[str, str] = {}
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for entry_path, entry in default_cache().entries():
            if entry is not None:  # the entry as read and verified, not the file read again
                name = f"kernels/{entry_path.parent.name}/{entry_path.name}"
                data = entry.to_bytes()
                z.writestr(name, data)
                members[name] = hashlib.sha256(data).hexdigest()
        kernel_keys = {n[len("kernels/"):].replace("/", "")[:64] for n in members}
        for alias, key in default_cache().aliases():
            if key in kernel_keys:   # an alias of an entry that is not there is left out
                name = f"aliases/{alias[:2]}/{alias[2:]}.key"
                data = key.encode("ascii")
                z.writestr(name, data)
                members[name] = hashlib.sha256(data).hexdigest()
        db = default_db()
        for record in db.records():
            digest = db.digest(record["key"])
            name = f"tuning/{digest[:2]}/{digest[2:]}.json"
            data = json.dumps(record).encode()
            z.writestr(name, data)
            members[name] = hashlib.sha256(data).hexdigest()
        manifest = {"format": FORMAT, **build, "members": members}
        z.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
    kernels = sum(n.startswith("kernels/") for n in members)
    return kernels, sum(n.startswith("tuning/") for n in members)


def _umask() -> int:
    try:  # Linux: read it, which unlike os.umask changes nothing for other threads
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def import_bundle(path: str | Path) -> BundleSummary:
    """Verify a bundle completely, then add its kernels and tuning records to the cache.

    The zip file is checked before any member is read (count, names, compression, declared
    sizes against ``MAX_*``), members are read as bounded streams (a lying header cannot make
    one larger), and every checksum, entry and record is verified before anything is written.
    Memory stays within one kernel entry: kernels are read again, and checked again, as they
    are written.

    Raises:
        BundleError: an unreadable, damaged or oversized bundle, or another build's; nothing
            was imported.
        CacheNotWritableError: the cache cannot store what the bundle holds.
    """
    path = Path(path)
    cache, db = default_cache(), default_db()
    try:
        with zipfile.ZipFile(path) as z:
            kernels, records, aliases = _verify(z, path)
            why = cache.writable_problem()
            if why:
                raise CacheNotWritableError(f"the kernel cache cannot store the bundle: {why}")
            for done, (info, key, sha256) in enumerate(kernels):
                # read and checked again: the bundle is not held in memory between the passes
                blob = _read(z, info, MAX_KERNEL_BYTES, path, expected=sha256)
                with warnings.catch_warnings(record=True) as caught:  # the reason: the error's
                    warnings.simplefilter("always", CacheWarning)
                    stored = cache.store(key, blob)
                if stored is None:
                    why = next((str(w.message) for w in caught),
                               "larger than GE2JIT_CACHE_MAX_SIZE")
                    raise CacheNotWritableError(
                        f"the kernel cache could not store {info.filename} ({why}); "
                        f"{done} of {len(kernels)} kernels were imported")
            for alias, key in aliases:
                cache.link(alias, key)
    except (OSError, zipfile.BadZipFile) as e:  # the bundle file itself; not the cache's
        raise BundleError(f"{path}: not a readable ge2jit bundle ({_reason(e)})") from None
    for done, record in enumerate(records):
        with warnings.catch_warnings(record=True) as caught:  # its reason goes in the error
            warnings.simplefilter("always", CacheWarning)
            stored = db.put(record["key"], record["value"])
        if stored is None:
            why = next((str(w.message) for w in caught), "it keeps them in memory only")
            raise CacheNotWritableError(
                f"the tuning database could not store the bundle's records ({why}); "
                f"{done} of {len(records)} were imported, and all {len(kernels)} kernels")
    return BundleSummary(len(kernels), len(records), path)


#: Limits of ``import_bundle``, checked against each member's declared size before reading
#: and against the bytes actually read. A tuning record: MAX_RECORD_BYTES, as the tuning
#: database reads them.
MAX_KERNEL_BYTES = MAX_ENTRY_BYTES      # one cache entry, as the cache reads them
MAX_MANIFEST_BYTES = 64 << 20           # the manifest: ~150 bytes per member
MAX_TOTAL_BYTES = 4 << 30               # all members together
MAX_MEMBERS = 100_000

_MEMBER_RE = re.compile(r"(kernels|aliases|tuning)/([0-9a-f]{2})/([0-9a-f]{62})\.(cubin|key|json)")
#: each kind of member's suffix
_SUFFIXES = {"kernels": "cubin", "aliases": "key", "tuning": "json"}
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_COMPRESSION = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def _verify(z: zipfile.ZipFile, path: Path) -> tuple[list, list[dict], list]:
    """Check the whole bundle; returns ([(ZipInfo, cache key, sha256)] of the kernels, the
    tuning records, and [(alias, key)] of the aliases)."""
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise BundleError(f"{path}: {len(infos)} members; a bundle holds at most {MAX_MEMBERS}")
    by_name: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        if name in by_name:
            raise BundleError(f"{path}: member {name!r} is there twice")
        m = _MEMBER_RE.fullmatch(name)
        if name != "manifest.json" and not (m and _SUFFIXES[m.group(1)] == m.group(4)):
            raise BundleError(f"{path}: unexpected member {name!r}")
        if info.compress_type not in _COMPRESSION:
            raise BundleError(f"{path}: member {name!r} uses compression method "
                              f"{info.compress_type}; expected stored or deflated")
        if info.flag_bits & 0x1:
            raise BundleError(f"{path}: member {name!r} is encrypted")
        limit = _limit(name)
        if info.file_size > limit:
            raise BundleError(f"{path}: member {name!r} holds {info.file_size} bytes; at most "
                              f"{limit} are expected")
        total += info.file_size if name != "manifest.json" else 0
        by_name[name] = info
    if total > MAX_TOTAL_BYTES:
        raise BundleError(f"{path}: the members hold {total} bytes; at most {MAX_TOTAL_BYTES} "
                          "bytes are expected in all")
    if "manifest.json" not in by_name:
        raise BundleError(f"{path}: not a ge2jit bundle (no manifest.json)")
    members = _manifest(_read(z, by_name.pop("manifest.json"), MAX_MANIFEST_BYTES, path), path)
    if set(members) != set(by_name):
        odd = sorted(set(members) ^ set(by_name))
        raise BundleError(f"{path}: members do not match the manifest (first: {odd[0]!r}, "
                          f"{len(odd)} in all)")
    kernels, records, aliases = [], [], []
    for name, info in by_name.items():
        blob = _read(z, info, _limit(name), path, expected=members[name])
        key = name.split("/", 1)[1].replace("/", "")[:64]
        if name.startswith("aliases/"):
            aliases.append((key, blob.decode("ascii", errors="replace")))
        elif name.startswith("kernels/"):
            try:
                CacheEntry.from_bytes(blob, expected_key=key)
            except Exception as e:  # noqa: BLE001 - any defect refuses the bundle
                raise BundleError(f"{path}: damaged kernel {name} ({e})") from None
            kernels.append((info, key, members[name]))
        else:
            records.append(_record(blob, name, path))
    inside = {key for _, key, _ in kernels}
    for alias, key in aliases:
        if key not in inside:
            raise BundleError(f"{path}: alias {alias} names kernel {key[:16]}..., which the "
                              "bundle does not hold")
    return kernels, records, aliases


def _limit(name: str) -> int:
    if name == "manifest.json":
        return MAX_MANIFEST_BYTES
    if name.startswith("aliases/"):
        return 64
    return MAX_KERNEL_BYTES if name.startswith("kernels/") else MAX_RECORD_BYTES


def _read(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: Path,
          expected: str | None = None) -> bytes:
    """A member's bytes, read in chunks, at most ``limit`` of them, whatever its header says;
    checked against the sha256 ``expected``."""
    h, chunks, size = hashlib.sha256(), [], 0
    try:
        with z.open(info) as f:
            while chunk := f.read(min(1 << 20, limit + 1 - size)):
                size += len(chunk)
                if size > limit:
                    raise BundleError(f"{path}: member {info.filename!r} holds more than its "
                                      f"header says, and more than the {limit} bytes expected")
                h.update(chunk)
                chunks.append(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
        raise BundleError(f"{path}: damaged member {info.filename!r} ({_reason(e)})") from None
    if expected is not None and h.hexdigest() != expected:
        raise BundleError(f"{path}: checksum mismatch for {info.filename}; nothing was "
                          "imported")
    return b"".join(chunks)


def _manifest(data: bytes, path: Path) -> dict[str, str]:
    """The manifest's members (name -> sha256), once it is checked to be this build's."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"{path}: manifest.json is not JSON ({_reason(e)})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: manifest.json: expected a JSON object, got "
                          f"{type(manifest).__name__}")
    fmt = manifest.get("format")
    if not isinstance(fmt, str):
        raise BundleError(f"{path}: manifest.json: format: expected a string such as "
                          f"{FORMAT!r}, got {fmt!r:.60}")
    if fmt != FORMAT:
        raise BundleError(f"{path}: unknown bundle format {fmt!r:.60}; expected {FORMAT!r}")
    here = _build_id()
    for key in ("ge2jit", "nvrtc", "nvrtc_fingerprint"):
        if manifest.get(key) != here[key]:
            raise BundleError(
                f"{path}: made with {key} {manifest.get(key)!r:.60}, but this installation has "
                f"{here[key]!r}; its kernels would never be used. Export the bundle again with "
                "the same ge2jit and NVRTC as the machines that import it.")
    members = manifest.get("members")
    if not isinstance(members, dict) or not all(
            isinstance(v, str) and _SHA256_RE.fullmatch(v) for v in members.values()):
        raise BundleError(f"{path}: manifest.json: members: expected an object of member "
                          "name -> sha256 (64 lowercase hex digits)")
    return members


def _record(blob: bytes, name: str, path: Path) -> dict:
    """A tuning record, checked by the tuning database's rules and filed under its key."""
    try:
        record = json.loads(blob.decode("utf-8"))
        validate_record(record)
        if TuningDB.digest(record["key"]) != name[len("tuning/"):-len(".json")].replace("/", ""):
            raise ValueError("filed under another key's name")
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"{path}: damaged tuning record {name} ({_reason(e)})") from None
    return record


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e) or type(e).__name__
