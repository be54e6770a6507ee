"""Environment variables, read once into a frozen dataclass.

| variable               | meaning                                                         |
|------------------------|-----------------------------------------------------------------|
| GE2JIT_CACHE_DIR       | where compiled kernels are stored (default: the user cache dir) |
| GE2JIT_DISABLE_CACHE   | 1: never read or write the disk cache (memory only)             |
| GE2JIT_SAVE_SOURCE     | 1: write each kernel's rendered .cu next to its cache entry     |
| GE2JIT_NVRTC           | path of the libnvrtc shared library to load                     |
| GE2JIT_VERBOSE         | 1: log compiles and cache events to stderr                      |
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
    cache_dir: Path
    disable_cache: bool
    save_source: bool
    nvrtc_path: str | None
    verbose: bool


def _default_cache_dir() -> Path:
    try:
        import platformdirs
    except ImportError:  # pragma: no cover - platformdirs is a declared dependency
        return Path(os.path.expanduser("~/.cache/ge2jit"))
    return Path(platformdirs.user_cache_dir("ge2jit", appauthor=False))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read from the environment at first use."""
    cache_dir = os.environ.get("GE2JIT_CACHE_DIR")
    return Settings(
        cache_dir=Path(cache_dir).expanduser() if cache_dir else _default_cache_dir(),
        disable_cache=_flag("GE2JIT_DISABLE_CACHE"),
        save_source=_flag("GE2JIT_SAVE_SOURCE"),
        nvrtc_path=os.environ.get("GE2JIT_NVRTC") or None,
        verbose=_flag("GE2JIT_VERBOSE"),
    )


def reload_settings() -> Settings:
    """Re-read the environment (tests and notebooks that change variables call this)."""
    get_settings.cache_clear()
    return get_settings()
