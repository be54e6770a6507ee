"""The ``ge2jit`` command (also ``python -m ge2jit``): cache warm-up and cache management."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from datetime import datetime

from . import __version__
from .bundle import BundleError
from .errors import ArgumentTypeError, ArgumentValueError, Ge2jitError

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size for argparse, by the one parser GE2JIT_CACHE_MAX_SIZE uses too
    (``settings.parse_size``: 2GB is 2 * 10**9 bytes, 2GiB 2 * 2**30, 1024 bytes)."""
    from .settings import parse_size as parse

    try:
        return parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    from .jit.parallel import usable_cores
    from .precompile import example, warmup

    if args.example:
        if args.config is not None:
            raise ArgumentValueError(f"--example: prints the example file; give {args.config} "
                                     "or --example, not both")
        print(example(), end="")
        return 0
    if args.config is None:
        raise ArgumentValueError("give the warm-up FILE (TOML); `ge2jit warmup --example > "
                                 "warmup.toml` writes an example to start from")
    cores = usable_cores()
    if args.jobs is not None and args.jobs > cores:
        # more compiler processes than cores only cost memory (a few hundred MB each)
        _say(args.prog, f"note: -j {args.jobs} reduced to {cores}, the cores this process may "
                        "use")
        args.jobs = cores
    summary = warmup(args.config, archs=args.arch or None, processes=args.jobs,
                     progress=not args.no_progress, from_tuning_db=args.from_tuning_db,
                     sms=args.sms)
    from .jit.cache import default_cache

    print(f"ge2jit warmup: {summary}")
    print(f"kernel cache: {default_cache().root}")
    return 0 if summary.ok else 1


def _cache_info(args) -> int:
    from .jit.cache import default_cache
    from .jit.fastlaunch import launch_path
    from .jit.nvrtc import nvrtc_info

    with warnings.catch_warnings():
        # a refused directory's CacheWarning says what the report and the line below say
        warnings.simplefilter("ignore")
        info = default_cache().info()
    try:
        nvrtc = str(nvrtc_info())
    except Exception as e:  # noqa: BLE001 - info must work without NVRTC
        nvrtc = f"not loadable ({e})"
    launch = launch_path(build=False)   # info writes nothing
    launch_text = (f"python ({launch['reason']})" if launch["path"] == "python"
                   else f"compiled ({launch['module'] or launch['reason']})")
    # the disk cache is wanted but cannot keep anything: say so, and fail, so that a script
    # checking the set-up notices (a deliberately disabled cache is not a failure)
    code = 1 if info["disk_cache"].startswith("not used") else 0
    if args.json:
        print(json.dumps({**info, "nvrtc": nvrtc, "launch": launch}, indent=1))
    else:
        print(f"location:  {info['location']}")
        for shared in info["read_only_locations"]:   # looked up after the first, never written
            print(f"read-only: {shared}")
        bad = info["unreadable_entries"]
        print(f"entries:   {info['entries']}" + (f" ({bad} unreadable)" if bad else ""))
        print(f"size:      {_human(info['size_bytes'])}")
        cap, setting = info["max_size_bytes"], info["max_size_setting"]
        print("cap:       " + ("none (GE2JIT_CACHE_MAX_SIZE is not set)" if cap is None else
                               f"{_human(cap)} ({cap} bytes"
                               + (f", GE2JIT_CACHE_MAX_SIZE={setting})" if setting else ")")))
        print(f"NVRTC:     {nvrtc}")
        print(f"launch:    {launch_text}")
        print(f"disk cache {info['disk_cache']}" + ("; compiled kernels are kept in memory "
                                                     "only, for one process" if code else ""))
        print("(hit and miss counters are per process: ge2jit.cache_info() in your program)")
    if code:
        _say(args.prog, f"the disk cache is {info['disk_cache']}; compiled kernels are kept in "
                        "memory only (set GE2JIT_CACHE_DIR to a directory of yours)")
    return code


def _cache_list(args) -> int:
    from .jit.cache import default_cache
    from .runtime.registry import get, label

    only = get(args.op).name if args.op is not None else None
    rows = []
    for path, e in default_cache().entries():
        op = label(e.kernel_name) if e else None
        if only is not None and op != only:
            continue
        try:
            st = path.stat()
        except OSError:  # removed since it was listed (a prune in another process)
            continue
        rows.append({"kernel": e.kernel_name if e else None, "op": op,
                     "arch": e.arch if e else None,
                     "size": st.st_size, "registers": e.registers if e else None,
                     "spill_bytes": e.spill_bytes if e else None,
                     "last_used": datetime.fromtimestamp(st.st_mtime).astimezone()
                     .isoformat("T", "seconds"), "path": str(path), "mtime": st.st_mtime})
    rows.sort(key=lambda r: -r["mtime"])
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "mtime"} for r in rows], indent=1))
        return 0
    # the name columns as wide as the longest name, so that the columns after them stay aligned
    width = max([len("kernel")] + [len(r["kernel"] or "<unreadable>") for r in rows])
    op_width = max([len("op")] + [len(r["op"] or "?") for r in rows])
    print(f"{'kernel':{width}s} {'op':{op_width}s} {'arch':7s} {'size':>9s} {'regs':>4s} "
          f"{'spill':>5s}  last used")
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["mtime"]))
        regs, spill = (("?", "?") if r["kernel"] is None
                       else (r["registers"], r["spill_bytes"]))
        print(f"{r['kernel'] or '<unreadable>':{width}s} {r['op'] or '?':{op_width}s} "
              f"{r['arch'] or '?':7s} {_human(r['size']):>9s} {regs!s:>4s} {spill!s:>5s}  "
              f"{used}")
    return 0


def _cache_clear(args) -> int:
    from .jit.cache import default_cache

    cache = default_cache()
    return _removed(args.prog, cache.root, cache.clear())


def _cache_prune(args) -> int:
    from .jit.cache import default_cache

    if args.max_size is None and args.older_than is None:
        raise ArgumentValueError("give --max-size and/or --older-than")
    cache = default_cache()
    return _removed(args.prog, cache.root,
                    cache.prune(max_bytes=args.max_size, older_than_s=args.older_than))


def _removed(prog: str, root, result) -> int:
    """Report a RemoveResult: what was removed, then (one line) what could not be."""
    at_root = [why for path, why in result.failed if path == str(root)]
    if at_root:  # the directory itself is unusable: nothing was looked at
        _say(prog, f"{root}: {at_root[0]}")
        return 1
    print(f"removed {result.removed} entries ({_human(result.freed)}) from {root}")
    if result.failed:
        n = len(result.failed)
        path, why = result.failed[0]
        _say(prog, f"could not remove {n} file{'s' if n > 1 else ''} (first: {path}: {why})")
        return 1
    return 0


def _cache_export(args) -> int:
    return _bundle("export", args.file)


def _cache_import(args) -> int:
    return _bundle("import", args.file)


def _bundle(action: str, file: str) -> int:
    from .bundle import export_bundle, import_bundle

    done = (export_bundle if action == "export" else import_bundle)(file)
    print(f"{action}ed {done}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line reported in one line: the command, the
    argument, what was expected and what came (argparse prints the usage as well)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        # argparse leaves arguments no subcommand takes to the top parser, whose message
        # would name "ge2jit" alone: name the subcommand they were given to.
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            prog = getattr(ns, "prog", self.prog)
            self.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)} "
                         f"(see {prog} --help)\n")
        return ns


def _add(sub, name: str, func=None, **kw) -> argparse.ArgumentParser:
    # a subcommand that remembers its own name for the messages of _Parser.parse_args
    parser = sub.add_parser(name, **kw)
    parser.set_defaults(prog=parser.prog, func=func)
    return parser


def positive_int(text: str) -> int:
    """'4' -> 4; zero, negative numbers and anything else are refused."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _op_names() -> list[str]:
    from .runtime.registry import ops

    return [op.name for op in ops()]


def build_parser() -> argparse.ArgumentParser:
    """The ``ge2jit`` command line: ``warmup`` and ``cache <action>``."""
    parser = _Parser(prog="ge2jit", description="ge2jit kernel cache tools")
    parser.add_argument("--version", action="version", version=f"ge2jit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{warmup,cache}")
    _add_warmup(sub)
    c = _add(sub, "cache", help="inspect and manage the kernel cache",
             description="Inspect and manage the kernel cache (GE2JIT_CACHE_DIR).")
    actions = c.add_subparsers(dest="action", required=True,
                               metavar="{info,list,clear,prune,export,import}")
    _add_cache_views(actions)
    _add_cache_removals(actions)
    _add_cache_bundles(actions)
    return parser


def _add_warmup(sub) -> None:
    """``ge2jit warmup``."""
    w = _add(sub, "warmup", _cmd_warmup,
             help="compile the kernels a TOML file lists into the cache",
             description="Compile every kernel a warm-up file lists into the kernel cache, in "
                         "parallel, skipping what the cache holds. `ge2jit warmup --example > "
                         "warmup.toml` writes an example to start from.",
             epilog="Exit status: 0 every kernel asked for is in the cache; 1 a kernel failed "
                    "to compile or could not be stored on disk, or NVRTC is unusable; 2 a "
                    "mistake in the command line or the file (named with its line).")
    w.add_argument("config", nargs="?", metavar="FILE",
                   help="the warm-up file (TOML): what to compile, per op; - reads it from "
                        "standard input")
    w.add_argument("--example", action="store_true",
                   help="print an example warm-up file, with comments, and exit: "
                        "ge2jit warmup --example > warmup.toml")
    w.add_argument("--arch", action="append", metavar="ARCH",
                   help="architecture to compile for (repeatable), e.g. sm_90a; works without "
                        "a GPU. Default: the file's archs, else the GPUs present")
    w.add_argument("--from-tuning-db", action="store_true",
                   help="also compile the configurations recorded in the tuning database")
    w.add_argument("-j", "--jobs", type=positive_int, default=None, metavar="N",
                   help="parallel compiler processes (default: one per core)")
    w.add_argument("--sms", type=positive_int, default=None, metavar="N",
                   help="multiprocessor count for configs = 'heuristic' without a GPU")
    w.add_argument("--no-progress", action="store_true",
                   help="no progress (a bar on a terminal, else a line at every tenth of the "
                        "kernels)")


def _add_cache_views(actions) -> None:
    """``ge2jit cache info`` and ``ge2jit cache list``."""
    a = _add(actions, "info", _cache_info,
             help="location, writable or not, entries, size, cap, NVRTC in use",
             description="Where the cache is, whether new kernels can be stored there (and if "
                         "not, why), what it holds, its size cap (GE2JIT_CACHE_MAX_SIZE), and "
                         "the NVRTC in use.",
             epilog="Exit status: 0 done; 1 the disk cache is not disabled but cannot store "
                    "kernels (the reason is printed: compiled kernels are kept in memory "
                    "only); 2 a mistake in the command line or a GE2JIT_* variable.")
    a.add_argument("--json", action="store_true",
                   help="print a JSON object for scripts (location, read_only_locations, "
                        "disk_cache, writable, not_writable_reason, entries, size_bytes, "
                        "max_size_bytes, nvrtc, ...)")
    a = _add(actions, "list", _cache_list,
             help="one line per kernel: op, arch, size, registers, spills, last used",
             description="List the kernels in the cache, most recently used first, each with "
                         "the op it belongs to (by its name; ? where none claims it).")
    a.add_argument("--json", action="store_true",
                   help="print a JSON array of objects (kernel, op, arch, size, registers, "
                        "spill_bytes, last_used, path) for scripts; null for unreadable entries")
    a.add_argument("--op", metavar="OP", default=None,
                   help="only the kernels of this op (" + ", ".join(_op_names()) + ")")


def _add_cache_removals(actions) -> None:
    """``ge2jit cache clear`` and ``ge2jit cache prune``."""
    removal = ("Exit status: 0 done; 1 a file could not be removed or the directory is not "
               "usable (the first is named); 2 a mistake in the command line.")
    _add(actions, "clear", _cache_clear, help="remove every kernel from the cache",
         description="Remove every kernel from the cache (its first directory: the others "
                     "GE2JIT_CACHE_DIR lists are read only).", epilog=removal)
    a = _add(actions, "prune", _cache_prune, help="remove old or least recently used kernels",
             description="Remove the kernels unused for a time, then the least recently used "
                         "ones down to a size. Give at least one of the options.",
             epilog=removal)
    a.add_argument("--max-size", type=parse_size, default=None, metavar="SIZE",
                   help="evict least recently used entries down to this size: 2GB (2 * 10**9 "
                        "bytes; K, M, G, T and kB, MB, GB, TB are powers of 1000), 2GiB (2 * "
                        "2**30; KiB, MiB, GiB, TiB powers of 1024) or plain bytes")
    a.add_argument("--older-than", type=parse_age, default=None, metavar="AGE",
                   help="remove entries not used for this long (30d)")


def _add_cache_bundles(actions) -> None:
    """``ge2jit cache export`` and ``ge2jit cache import``."""
    a = _add(actions, "export", _cache_export,
             help="write the cache's kernels and tuning records into a bundle",
             description="Write every kernel of this ge2jit and NVRTC build, and the tuning "
                         "records, into a zip bundle.",
             epilog="Exit status: 0 written; 2 FILE is a folder or in a folder that does not "
                    "exist; 1 writing failed (nothing is left half-written).")
    a.add_argument("file", metavar="FILE", help="the bundle to write (a zip file)")
    a = _add(actions, "import", _cache_import,
             help="add a bundle's kernels and tuning records to the cache",
             description="Verify a bundle completely, then add its kernels and tuning records "
                         "to the cache.",
             epilog="Exit status: 0 imported; 2 the bundle cannot be used (unreadable, damaged, "
                    "too large, another build's: nothing is imported); 1 the cache could not "
                    "store it.")
    a.add_argument("file", metavar="FILE", help="the bundle to read (a zip file)")


def main(argv: list[str] | None = None) -> int:
    """Run the ``ge2jit`` command; returns its exit status.

    Exit status: 0 done; 2 a mistake in what was given (the command line, a warm-up file, a
    bundle, a ``GE2JIT_*`` variable); 1 the work failed (a kernel did not compile or could not
    be stored, a file could not be written or removed, NVRTC or CuPy is missing); 130
    interrupted. Each error is one line on stderr, ``ge2jit <command>: ...``. An error that is
    a bug in ge2jit is one line too, with its type; ``GE2JIT_VERBOSE=1`` shows its traceback.
    """
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        # a warning (CacheWarning: the cache is refused or full) as one line, like the errors
        warnings.showwarning = lambda message, *_, **__: _say(args.prog, f"warning: {message}")
        return _run(args)


def _run(args) -> int:
    try:
        from .settings import get_settings

        get_settings().check()  # a bad GE2JIT_* variable: one line and 2, before any work
        code = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is met inside the handler below
        return code
    except BrokenPipeError:
        # The reader went away (``ge2jit cache list | head``): stop quietly. Python's docs
        # (signal module, "Note on SIGPIPE"): point stdout at devnull, or the flush at exit
        # fails once more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    except (ArgumentValueError, ArgumentTypeError, BundleError) as e:  # bad files, variables
        _say(args.prog, str(e))
        return 2
    except Ge2jitError as e:
        _say(args.prog, str(e))
        return 1
    except OSError as e:
        _say(args.prog, f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
        return 1
    except Exception as e:
        if _verbose():
            raise
        _say(args.prog, f"internal error (please report it): {type(e).__name__}: {e}; run with "
                        "GE2JIT_VERBOSE=1 for the traceback")
        return 1


def _say(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr)


def _verbose() -> bool:
    # read here, not through the settings object, which may be the very thing that failed
    from .settings import verbosity_or_zero

    return verbosity_or_zero(os.environ.get("GE2JIT_VERBOSE", "")) > 0


if __name__ == "__main__":
    sys.exit(main())
