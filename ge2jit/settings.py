"""Environment variables, read once into a frozen dataclass.

| variable               | meaning                                                         |
|------------------------|-----------------------------------------------------------------|
| GE2JIT_CACHE_DIR       | where compiled kernels are stored (default: the user cache dir); |
|                        | several directories separated by ':' (misses go to the first)   |
| GE2JIT_DISABLE_CACHE   | 1: never read or write the disk cache (memory only)             |
| GE2JIT_SAVE_SOURCE     | 1: write each kernel's rendered .cu next to its cache entry     |
| GE2JIT_NVRTC           | path of the libnvrtc shared library to load                     |
| GE2JIT_VERBOSE         | 1: log compiles and cache events to stderr                      |
| GE2JIT_CACHE_MAX_SIZE  | size cap of the kernel cache (e.g. 2GB); least recently used out |
| GE2JIT_FLOAT32_PRECISION | default ``precision`` of float32 GEMMs: ieee, tf32 or tf32x3 |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """The ``GE2JIT_*`` variables of this process.

    Attributes:
        cache_dirs: the kernel cache's directories in look-up order; misses are written to the
            first, the others are read only (a shared, warmed cache).
    """

    cache_dirs: tuple[Path, ...]
    disable_cache: bool
    save_source: bool
    nvrtc_path: str | None
    verbose: bool
    cache_max_size: int | None = None
    float32_precision: str = "ieee"

    @property
    def cache_dir(self) -> Path:
        """The first (writable) cache directory."""
        return self.cache_dirs[0]


def _default_cache_dir() -> Path:
    try:
        import platformdirs
    except ImportError:  # pragma: no cover - platformdirs is a declared dependency
        return Path(os.path.expanduser("~/.cache/ge2jit"))
    return Path(platformdirs.user_cache_dir("ge2jit", appauthor=False))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read from the environment at first use."""
    return Settings(
        cache_dirs=_cache_dirs(os.environ.get("GE2JIT_CACHE_DIR", "")),
        disable_cache=_flag("GE2JIT_DISABLE_CACHE"),
        save_source=_flag("GE2JIT_SAVE_SOURCE"),
        nvrtc_path=os.environ.get("GE2JIT_NVRTC") or None,
        verbose=_flag("GE2JIT_VERBOSE"),
        cache_max_size=_size("GE2JIT_CACHE_MAX_SIZE"),
        float32_precision=_choice("GE2JIT_FLOAT32_PRECISION", ("ieee", "tf32", "tf32x3"),
                                   "ieee"),
    )


def _cache_dirs(text: str) -> tuple[Path, ...]:
    dirs = tuple(Path(p.strip()).expanduser() for p in text.split(os.pathsep) if p.strip())
    return dirs or (_default_cache_dir(),)


def _choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {text!r}")
    return text


def parse_size(text: str) -> int:
    """'2GB', '500M', '1.5GiB', '1024' -> bytes (K, M, G, T are powers of 1024)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.I)
    if not m:
        raise ValueError(f"expected a size such as 2GB or 500MB, got {text!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


def _size(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def reload_settings() -> Settings:
    """Re-read the environment (tests and notebooks that change variables call this)."""
    get_settings.cache_clear()
    return get_settings()
