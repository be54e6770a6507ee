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
| GE2JIT_CACHE_MAX_SIZE  | size cap of the kernel cache, at least 1MiB (2GB: 2 * 10**9      |
|                        | bytes, 2GiB: 2 * 2**30); least recently used out                |
| GE2JIT_FLOAT32_PRECISION | default ``precision`` of float32 GEMMs: ieee, tf32 or tf32x3 |
| GE2JIT_LINEINFO        | 1: compile kernels with line information (-lineinfo), for      |
|                        | profilers and compute-sanitizer; part of the kernels' cache key |
| GE2JIT_LAUNCH          | how prepared calls launch: compiled (default: the C launch path, |
|                        | built with the machine's C compiler where the install has none) |
|                        | or python (the pure-Python path)                                |
| GE2JIT_DUMP_DIR        | a directory: each kernel this process uses (compiled or from the |
|                        | cache) is written there once as source, PTX, cubin, SASS and    |
|                        | NVRTC's log                                                     |

The switches (GE2JIT_DISABLE_CACHE, GE2JIT_SAVE_SOURCE, GE2JIT_LINEINFO) take 1/0,
true/false, yes/no, on/off in any case, empty meaning unset; GE2JIT_VERBOSE also 2 (or debug).
Anything else is an error, not "on": a typo must not silently change what ge2jit does.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache
from pathlib import Path

from .errors import SettingsError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_FLAG_VALUES = "1, 0, true, false, yes, no, on or off (empty: unset)"

#: The smallest GE2JIT_CACHE_MAX_SIZE taken: one kernel takes tens of KiB to a few MiB, and a cap
#: below one kernel would evict every kernel right after writing it (a cache that keeps nothing).
MIN_CACHE_MAX_SIZE = 1 << 20


def parse_flag(name: str, text: str) -> bool:
    """A switch's value: 1/true/yes/on or 0/false/no/off, any case; empty is off.

    Raises:
        SettingsError: anything else, naming ``name``, the values it takes and what it holds.
    """
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if not value or value in _FALSE:
        return False
    raise SettingsError(f"{name}: expected {_FLAG_VALUES}, got {text.strip()!r}")


def parse_verbosity(text: str) -> int:
    """GE2JIT_VERBOSE's level: a switch (0 or 1), or 2 (also ``debug``).

    Raises:
        SettingsError: any other value.
    """
    value = text.strip().lower()
    if value in ("2", "debug"):
        return 2
    try:
        return int(parse_flag("GE2JIT_VERBOSE", text))
    except SettingsError:
        raise SettingsError(f"GE2JIT_VERBOSE: expected 0, 1 or 2 (or false, true, debug; also "
                            f"no, yes, off, on; empty: unset), got {text.strip()!r}") from None


@dataclass(frozen=True)
class Settings:
    """The ``GE2JIT_*`` variables of this process.

    Reading them never fails; a value that cannot be used raises ``SettingsError`` (one line
    naming the variable, what it expects and what it holds) where it is used, so that
    ``import ge2jit`` works whatever the environment holds.

    Attributes:
        cache_dirs: the kernel cache's directories in look-up order; misses are written to the
            first, the others are read only (a shared, warmed cache).
        nvrtc_path: the libnvrtc to load, or None to choose one.
        disable_cache_text, save_source_text, verbose_text, cache_max_size_text,
            float32_precision_text, launch_text, lineinfo_text, dump_dir_text: the variables
            as given; the properties of the same names without ``_text`` parse them.
    """

    cache_dirs: tuple[Path, ...]
    nvrtc_path: str | None
    disable_cache_text: str = ""
    save_source_text: str = ""
    verbose_text: str = ""
    cache_max_size_text: str = ""
    float32_precision_text: str = ""
    launch_text: str = ""
    lineinfo_text: str = ""
    dump_dir_text: str = ""

    @property
    def cache_dir(self) -> Path:
        """The first (writable) cache directory."""
        return self.cache_dirs[0]

    @cached_property
    def nvrtc_library(self) -> Path | None:
        """GE2JIT_NVRTC as the path of a file, or None when it is not set.

        Raises:
            SettingsError: it names no file.
        """
        if not self.nvrtc_path:
            return None
        path = Path(self.nvrtc_path).expanduser()
        if not path.is_file():
            raise SettingsError(f"GE2JIT_NVRTC={self.nvrtc_path!r}: expected the path of a "
                                "libnvrtc.so.* file, but no such file exists")
        return path

    @cached_property
    def disable_cache(self) -> bool:
        """GE2JIT_DISABLE_CACHE: never read or write the disk cache.

        Raises:
            SettingsError: the variable is not a switch's value.
        """
        return parse_flag("GE2JIT_DISABLE_CACHE", self.disable_cache_text)

    @cached_property
    def save_source(self) -> bool:
        """GE2JIT_SAVE_SOURCE: write each kernel's rendered source beside its cache entry.

        Raises:
            SettingsError: the variable is not a switch's value.
        """
        return parse_flag("GE2JIT_SAVE_SOURCE", self.save_source_text)

    @cached_property
    def verbose(self) -> int:
        """GE2JIT_VERBOSE: 0 (quiet), 1 (compiles and cache events) or 2 (also every cache
        decision).

        Raises:
            SettingsError: the variable is none of those.
        """
        return parse_verbosity(self.verbose_text)

    @cached_property
    def cache_max_size(self) -> int | None:
        """The kernel cache's size cap in bytes, or None for no cap.

        Raises:
            SettingsError: GE2JIT_CACHE_MAX_SIZE is not a size, or one below
                ``MIN_CACHE_MAX_SIZE`` (a cap smaller than one kernel keeps nothing).
        """
        text = self.cache_max_size_text.strip()
        if not text:
            return None
        try:
            size = parse_size(text)
        except ValueError as e:
            raise SettingsError(f"GE2JIT_CACHE_MAX_SIZE: {e}") from None
        if size < MIN_CACHE_MAX_SIZE:
            raise SettingsError(
                f"GE2JIT_CACHE_MAX_SIZE: expected at least 1MiB (one kernel takes tens of KiB to "
                f"a few MiB; a smaller cap would evict each kernel as it is written), got "
                f"{text!r}; unset it for no cap, or set GE2JIT_DISABLE_CACHE=1 to keep kernels "
                "off the disk")
        return size

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

    @cached_property
    def lineinfo(self) -> bool:
        """GE2JIT_LINEINFO: compile kernels with line information (a compile option, so part
        of every kernel's cache key).

        Raises:
            SettingsError: the variable is not a switch's value.
        """
        return parse_flag("GE2JIT_LINEINFO", self.lineinfo_text)

    @cached_property
    def launch(self) -> str:
        """How prepared calls launch: "compiled" (the C launch path where it can be loaded or
        built, else the Python path, saying why) or "python".

        Raises:
            SettingsError: GE2JIT_LAUNCH is neither.
        """
        text = self.launch_text.strip().lower()
        if not text:
            return "compiled"
        if text not in ("compiled", "python"):
            raise SettingsError(f"GE2JIT_LAUNCH: expected compiled or python, got {text!r}")
        return text

    @cached_property
    def dump_dir(self) -> Path | None:
        """GE2JIT_DUMP_DIR: where each kernel the process uses is written as source, PTX,
        cubin, SASS and NVRTC's log (``ge2jit.jit.dump``), or None.

        Raises:
            SettingsError: it names something that is not a directory.
        """
        text = self.dump_dir_text.strip()
        if not text:
            return None
        path = Path(text).expanduser()
        if path.exists() and not path.is_dir():
            raise SettingsError(f"GE2JIT_DUMP_DIR={text!r}: expected a directory (made if "
                                "missing), but a file of that name exists")
        return path

    def check(self) -> None:
        """Parse every variable now (a command checks them before doing anything).

        Raises:
            SettingsError: the first variable that cannot be used.
        """
        for name in ("disable_cache", "save_source", "verbose", "cache_max_size",
                     "float32_precision", "launch", "lineinfo", "dump_dir", "nvrtc_library"):
            getattr(self, name)


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
        nvrtc_path=os.environ.get("GE2JIT_NVRTC") or None,
        disable_cache_text=os.environ.get("GE2JIT_DISABLE_CACHE", ""),
        save_source_text=os.environ.get("GE2JIT_SAVE_SOURCE", ""),
        verbose_text=os.environ.get("GE2JIT_VERBOSE", ""),
        cache_max_size_text=os.environ.get("GE2JIT_CACHE_MAX_SIZE", ""),
        float32_precision_text=os.environ.get("GE2JIT_FLOAT32_PRECISION", ""),
        launch_text=os.environ.get("GE2JIT_LAUNCH", ""),
        lineinfo_text=os.environ.get("GE2JIT_LINEINFO", ""),
        dump_dir_text=os.environ.get("GE2JIT_DUMP_DIR", ""),
    )
    # A bad GE2JIT_VERBOSE logs nothing here (this never raises); the kernel cache reads
    # ``verbose`` when it is made, which raises at the first compile or cache command.
    _configure_logging(verbosity_or_zero(settings.verbose_text))
    return settings


def _cache_dirs(text: str) -> tuple[Path, ...]:
    dirs = tuple(Path(p.strip()).expanduser() for p in text.split(os.pathsep) if p.strip())
    return dirs or (_default_cache_dir(),)


def verbosity_or_zero(text: str) -> int:
    """GE2JIT_VERBOSE's level, or 0 for a value that is none (for code that must not raise)."""
    try:
        return parse_verbosity(text)
    except SettingsError:
        return 0


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?(b)?\s*", re.I)

def parse_size(text: str) -> int:
    """A size in bytes: '1024' or '1024B' bytes; '2GB', '2G' 2 * 10**9; '2GiB' 2 * 2**30;
    '1.5MB' 1500000 (case does not matter). The one parser of the ``ge2jit`` command's sizes
    and of GE2JIT_CACHE_MAX_SIZE.

    Raises:
        ValueError: not a size; the message names what is expected and what came.
    """
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"expected a size such as 2GB (2 * 10**9 bytes), 2GiB (2 * 2**30) or "
                         f"1048576 (bytes), got {text.strip()!r}")
    prefix = m.group(2)
    power = " kmgt".index(prefix.lower()) if prefix else 0
    base = 1024 if m.group(3) else 1000
    return int(Fraction(m.group(1)) * base ** power)   # exact: 1.1GB is 1100000000


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
