"""The ``ge2jit`` command (also ``python -m ge2jit``): cache warm-up and cache management."""

from __future__ import annotations

import argparse
import re
import sys
import time

from . import __version__

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)


def parse_size(text: str) -> int:
    """'2GB', '500M', '1.5GiB', '1024' -> bytes (K/M/G/T are powers of 1024)."""
    from .settings import parse_size as parse

    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 2GB or 500MB, got {text!r}") from None


def parse_age(text: str) -> float:
    """'30d', '12h', '90m', '2w' -> seconds."""
    m = _AGE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected an age such as 30d, 12h or 90m, got {text!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400,
                                "w": 604800}[m.group(2).lower()]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _cmd_warmup(args) -> int:
    from .precompile import WarmupConfigError, warmup

    try:
        summary = warmup(args.config, archs=args.arch or None, processes=args.jobs,
                         progress=not args.no_progress, from_tuning_db=args.from_tuning_db,
                         sms=args.sms)
    except WarmupConfigError as e:
        print(f"ge2jit warmup: {e}", file=sys.stderr)
        return 2
    from .jit.cache import default_cache

    print(f"ge2jit warmup: {summary}")
    print(f"kernel cache: {default_cache().root}")
    return 0 if summary.ok else 1


def _cmd_cache(args) -> int:
    from .jit.cache import default_cache
    from .jit.nvrtc import nvrtc_info

    cache = default_cache()
    if args.action == "info":
        info = cache.info()
        print(f"location:  {info['location']}")
        bad = info["unreadable_entries"]
        print(f"entries:   {info['entries']}" + (f" ({bad} unreadable)" if bad else ""))
        cap = info["max_size_bytes"]
        print(f"size:      {_human(info['size_bytes'])}"
              + (f" (cap {_human(cap)}, GE2JIT_CACHE_MAX_SIZE)" if cap else ""))
        try:
            print(f"NVRTC:     {nvrtc_info()}")
        except Exception as e:  # noqa: BLE001 - info must work without NVRTC
            print(f"NVRTC:     not loadable ({e})")
        print(f"disk cache {info['disk_cache']}")
        print("(hit and miss counters are per process: ge2jit.cache_info() in your program)")
        return 0
    if args.action == "list":
        rows = []
        for path, e in cache.entries():
            st = path.stat()
            if e is None:
                rows.append(("<unreadable>", "?", st.st_size, "?", "?", st.st_mtime))
            else:
                rows.append((e.kernel_name, e.arch, st.st_size, e.registers, e.spill_bytes,
                             st.st_mtime))
        rows.sort(key=lambda r: -r[5])
        print(f"{'kernel':60s} {'arch':7s} {'size':>9s} {'regs':>4s} {'spill':>5s}  last used")
        for name, arch, size, regs, spill, mtime in rows:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime))
            print(f"{name:60s} {arch:7s} {_human(size):>9s} {regs!s:>4s} {spill!s:>5s}  {used}")
        return 0
    if args.action == "clear":
        removed = cache.clear().removed
        print(f"removed {removed} entries from {cache.root}")
        return 0
    if args.action in ("export", "import"):
        from .bundle import BundleError, export_bundle, import_bundle

        if not args.file:
            print(f"ge2jit cache {args.action}: give the bundle's FILE", file=sys.stderr)
            return 2
        try:
            done = (export_bundle if args.action == "export" else import_bundle)(args.file)
        except BundleError as e:
            print(f"ge2jit cache {args.action}: {e}", file=sys.stderr)
            return 1
        print(f"{args.action}ed {done}")
        return 0
    if args.action == "prune":
        if args.max_size is None and args.older_than is None:
            print("ge2jit cache prune: give --max-size and/or --older-than", file=sys.stderr)
            return 2
        r = cache.prune(max_bytes=args.max_size, older_than_s=args.older_than)
        removed, freed = r.removed, r.freed
        print(f"removed {removed} entries ({_human(freed)}) from {cache.root}")
        return 0
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ge2jit", description="ge2jit kernel cache tools")
    parser.add_argument("--version", action="version", version=f"ge2jit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("warmup", help="compile the kernels a TOML file lists into the cache")
    w.add_argument("config", help="warm-up file (TOML); see examples/warmup.toml")
    w.add_argument("--arch", action="append", metavar="ARCH",
                   help="architecture to compile for (repeatable), e.g. sm_90a; works without "
                        "a GPU. Default: the file's archs, else the GPUs present")
    w.add_argument("--from-tuning-db", action="store_true",
                   help="also compile the configurations recorded in the tuning database")
    w.add_argument("-j", "--jobs", type=int, default=None,
                   help="parallel compiler processes (default: one per core)")
    w.add_argument("--sms", type=int, default=None,
                   help="multiprocessor count for configs = 'heuristic' without a GPU")
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    w.set_defaults(func=_cmd_warmup)

    c = sub.add_parser("cache", help="inspect and manage the kernel cache")
    c.add_argument("action", choices=("info", "list", "clear", "prune", "export", "import"))
    c.add_argument("file", nargs="?", help="export/import: the bundle (a zip file)")
    c.add_argument("--max-size", type=parse_size, default=None,
                   help="prune: evict least recently used entries down to this size (2GB)")
    c.add_argument("--older-than", type=parse_age, default=None,
                   help="prune: remove entries not used for this long (30d)")
    c.set_defaults(func=_cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
