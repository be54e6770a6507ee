"""Environment variables, read once into a frozen dataclass; a bad value raises SettingsError
where it is used, never at import.

| variable               | meaning                                                         |
|------------------------|-----------------------------------------------------------------|
| GE2JIT_CACHE_DIR       | where compiled kernels are stored (default: the user cache dir); |
|                        | several directories separated by ':' (misses go to the first)   |
| GE2JIT_DISABLE_CACHE   | 1: never read or write the disk cache (memory only)             |
| GE2JIT_SAVE_SOURCE     | 1: write each kernel's rendered .cu next to its cache entry     |
| GE2JIT_NVRTC           | path of the libnvrtc shared library to load                     |
| GE2JIT_VERBOSE         | 1: log compiles and cache events to stderr; 2: every decision   |
| GE2JIT_CACHE_MAX_SIZE  | size cap of the kernel cache (e.g. 2GB); least recently used out |
| GE2JIT_FLOAT32_PRECISION | default ``precision`` of float32 GEMMs: ieee, tf32 or tf32x3 |
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from .errors import SettingsError


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """The ``GE2JIT_*`` variables of this process.

    Reading them never fails; a value that cannot be used raises ``SettingsError`` (one line
    naming the variable, what it expects and what it holds) where it is used, so that
    ``import ge2jit`` works whatever the environment holds.

    Attributes:
        cache_dirs: the kernel cache's directories in look-up order; misses are written to the
            first, the others are read only (a shared, warmed cache).
        disable_cache: never read or write the disk cache.
        save_source: write each kernel's rendered source beside its cache entry.
        nvrtc_path: the libnvrtc to load, or None to choose one.
        verbose: 0 (quiet), 1 (compiles and cache events) or 2 (also every cache decision).
        cache_max_size_text: GE2JIT_CACHE_MAX_SIZE as given (see ``cache_max_size``).
        float32_precision_text: GE2JIT_FLOAT32_PRECISION as given (see ``float32_precision``).
    """

    cache_dirs: tuple[Path, ...]
    disable_cache: bool
    save_source: bool
    nvrtc_path: str | None
    verbose: int
    cache_max_size_text: str = ""
    float32_precision_text: str = ""

    @property
    def cache_dir(self) -> Path:
        """The first (writable) cache directory."""
        return self.cache_dirs[0]

    @cached_property
    def cache_max_size(self) -> int | None:
        """The kernel cache's size cap in bytes, or None for no cap.

        Raises:
            SettingsError: GE2JIT_CACHE_MAX_SIZE is not a size.
        """
        text = self.cache_max_size_text.strip()
        if not text:
            return None
        try:
            return parse_size(text)
        except ValueError as e:
            raise SettingsError(f"GE2JIT_CACHE_MAX_SIZE: {e}") from None

    @cached_property
    def float32_precision(self) -> str:
        """The default ``precision`` of float32 GEMMs: ieee, tf32 or tf32x3.

        Raises:
            SettingsError: GE2JIT_FLOAT32_PRECISION is none of those.
        """
        allowed = ("ieee", "tf32", "tf32x3")
        text = self.float32_precision_text.strip().lower()
        if not text:
            return "ieee"
        if text not in allowed:
            raise SettingsError(f"GE2JIT_FLOAT32_PRECISION: expected one of "
                                f"{', '.join(allowed)}, got {text!r}")
        return text


def _default_cache_dir() -> Path:
    try:
        import platformdirs
    except ImportError:  # pragma: no cover - platformdirs is a declared dependency
        return Path(os.path.expanduser("~/.cache/ge2jit"))
    return Path(platformdirs.user_cache_dir("ge2jit", appauthor=False))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read from the environment at first use (never raises)."""
    settings = Settings(
        cache_dirs=_cache_dirs(os.environ.get("GE2JIT_CACHE_DIR", "")),
        disable_cache=_flag("GE2JIT_DISABLE_CACHE"),
        save_source=_flag("GE2JIT_SAVE_SOURCE"),
        nvrtc_path=os.environ.get("GE2JIT_NVRTC") or None,
        verbose=_verbosity(os.environ.get("GE2JIT_VERBOSE", "")),
        cache_max_size_text=os.environ.get("GE2JIT_CACHE_MAX_SIZE", ""),
        float32_precision_text=os.environ.get("GE2JIT_FLOAT32_PRECISION", ""),
    )
    _configure_logging(settings.verbose)
    return settings


def _cache_dirs(text: str) -> tuple[Path, ...]:
    dirs = tuple(Path(p.strip()).expanduser() for p in text.split(os.pathsep) if p.strip())
    return dirs or (_default_cache_dir(),)


def _verbosity(text: str) -> int:
    text = text.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0
    return 2 if text in ("2", "debug") else 1    # anything else that is set: on


def parse_size(text: str) -> int:
    """'2GB', '500M', '1.5GiB', '1024' -> bytes (K, M, G, T are powers of 1024).

    Raises:
        ValueError: not a size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.I)
    if not m:
        raise ValueError(f"expected a size such as 2GB or 500MB, got {text.strip()!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


class _StderrHandler(logging.Handler):
    """GE2JIT_VERBOSE's handler: writes to the ``sys.stderr`` of the moment (pytest and
    notebooks replace it after import)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never break the program
            self.handleError(record)


def _configure_logging(verbose: int) -> None:
    """Attach (once) or detach the stderr handler of the ``ge2jit`` logger."""
    logger = logging.getLogger("ge2jit")
    ours = [h for h in logger.handlers if isinstance(h, _StderrHandler)]
    if not verbose:
        for h in ours:
            logger.removeHandler(h)
        if ours:
            logger.setLevel(logging.NOTSET)
        return
    if not ours:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(name)s %(asctime)s] %(message)s",
                                               "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)


def reload_settings() -> Settings:
    """Re-read the environment (tests and notebooks that change variables call this)."""
    get_settings.cache_clear()
    return get_settings()
