"""Portable bundles of the kernel cache and the tuning database (``ge2jit cache export/import``).

A bundle is a zip file: ``manifest.json`` (ge2jit version, NVRTC version and build fingerprint,
and the sha256 of every member), ``kernels/<shard>/<key>.cubin`` entries exactly as the cache
stores them, and ``tuning/<shard>/<key>.json`` records. Import verifies every checksum before
writing anything and refuses a bundle made by another ge2jit or NVRTC build: its kernels could
never be found under this build's cache keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._version import __version__
from .errors import Ge2jitError
from .jit.cache import CacheEntry, _atomic_write, default_cache
from .jit.nvrtc import nvrtc_info
from .tune.db import default_db

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
    return kernels, len(members) - kernels


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

    Raises:
        BundleError: unreadable file, bad checksum, damaged entry, or another build's bundle.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read("manifest.json"))
            data = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise BundleError(f"{path}: not a readable ge2jit bundle ({e})") from None
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: unknown bundle format {manifest.get('format')!r}")
    here = _build_id()
    for key in ("ge2jit", "nvrtc", "nvrtc_fingerprint"):
        if manifest.get(key) != here[key]:
            raise BundleError(
                f"{path}: made with {key} {manifest.get(key)!r}, but this installation has "
                f"{here[key]!r}; its kernels would never be used. Export the bundle again with "
                "the same ge2jit and NVRTC as the machines that import it.")
    expected = manifest.get("members", {})
    if set(expected) != set(data):
        raise BundleError(f"{path}: members do not match the manifest")
    entries, records = [], []
    for name, blob in data.items():
        if hashlib.sha256(blob).hexdigest() != expected[name]:
            raise BundleError(f"{path}: checksum mismatch for {name}; nothing was imported")
        parts = name.split("/")
        if len(parts) != 3 or len(parts[1]) != 2 or ".." in parts:
            raise BundleError(f"{path}: unexpected member {name!r}")
        if parts[0] == "kernels" and parts[2].endswith(".cubin"):
            key = parts[1] + parts[2][: -len(".cubin")]
            try:
                CacheEntry.from_bytes(blob, expected_key=key)
            except Exception as e:  # noqa: BLE001 - any defect refuses the bundle
                raise BundleError(f"{path}: damaged kernel {name} ({e})") from None
            entries.append((key, blob))
        elif parts[0] == "tuning" and parts[2].endswith(".json"):
            try:
                record = json.loads(blob)
                record["key"], record["value"]
            except (ValueError, KeyError, TypeError) as e:
                raise BundleError(f"{path}: damaged tuning record {name} ({e})") from None
            records.append(record)
        else:
            raise BundleError(f"{path}: unexpected member {name!r}")
    cache, db = default_cache(), default_db()
    for key, blob in entries:
        _atomic_write(cache.path_for(key), blob)
    for record in records:
        db.put(record["key"], record["value"])
    return BundleSummary(len(entries), len(records), path)
