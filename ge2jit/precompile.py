"""Cache warm-up: compile, before the first request, every kernel a deployment will use.

A TOML file lists what to compile: ``archs`` (optional: default the GPUs present, or
``--arch``) and one array of tables per registered warm-up table (``runtime.registry``: each
op names its tables and expands them to kernel specs); ``ge2jit warmup --example`` prints one.

Kernels compile in parallel processes into the kernel cache, skipping what it holds already.
"""

from __future__ import annotations

import re
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ArgumentValueError, CacheNotWritableError
from .jit.fastlaunch import build_into_cache
from .jit.nvrtc import check_archs
from .jit.parallel import CompileOutcome, compile_many
from .runtime.registry import warmup_tables
from .runtime.tables import MAX_SMS
from .settings import get_settings

MAX_FILE_BYTES = 16 << 20  # a warm-up file is a few kB: more is not one


def top_keys() -> tuple[str, ...]:
    """The keys a warm-up file may hold: ``archs`` and every registered table."""
    return ("archs", *warmup_tables())


def __getattr__(name: str):
    # OPS (table name -> table) and TOP_KEYS, as they are now in the registry
    if name == "OPS":
        return warmup_tables()
    if name == "TOP_KEYS":
        return top_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class WarmupConfigError(ArgumentValueError):
    """A warm-up file that cannot be used; the message names the file, the line and the key."""


def _line_of(text: str, key: str, table: str | None, index: int) -> int | None:
    """1-based line of ``key = ...`` inside the index-th [[table]] (or at top level, where a
    [key] or [[key]] header also counts)."""
    lines = text.splitlines()
    start, seen = 0, -1
    if table is not None:
        header = re.compile(r"^\s*\[\[\s*" + re.escape(table) + r"\s*\]\]")
        for i, line in enumerate(lines):
            if header.match(line):
                seen += 1
                if seen == index:
                    start = i
                    break
        else:
            return None
    pattern = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
    for i in range(start, len(lines)):
        if i > start and table is not None and lines[i].lstrip().startswith("["):
            break
        if table is None and lines[i].lstrip().startswith("["):
            break
        if pattern.match(lines[i]):
            return i + 1
    if table is not None:
        return start + 1
    header = re.compile(r"^\s*\[\[?\s*" + re.escape(key) + r"\s*\]")
    return next((i + 1 for i, line in enumerate(lines) if header.match(line)), None)


def _error(path: str, line: int | None, msg: str) -> WarmupConfigError:
    where = f"{path}:{line}" if line else path
    return WarmupConfigError(f"{where}: {msg}")


@dataclass(frozen=True)
class WarmupPlan:
    """The (spec, arch) jobs a warm-up file asks for."""

    jobs: tuple
    archs: tuple[str, ...]


def _read(path: str) -> bytes:
    """The bytes of the warm-up file ``path`` ("-": standard input), at most one more than
    ``MAX_FILE_BYTES`` (bounded: the path may name a device such as /dev/zero)."""
    if path == "-":
        return sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise WarmupConfigError(f"{path}: cannot read the warm-up file: {e.strerror}") from None


def _arch_list(archs) -> list:
    """``archs`` as given from Python or the command line: one name or a list/tuple of them."""
    if isinstance(archs, str):
        return [archs]          # "sm_90": one architecture, not the letters of one
    if isinstance(archs, (list, tuple)):
        return list(archs)
    raise WarmupConfigError(f"archs: expected an architecture such as 'sm_90a' or a list of "
                            f"them, got {type(archs).__name__} {archs!r:.60}")


def load(path: str | Path, *, archs=None, from_tuning_db: bool = False,
         sms: int | None = None) -> WarmupPlan:
    """Read and check a warm-up file ("-": standard input) and expand it into compile jobs.

    ``archs`` (one name or a list) replaces the file's ``archs``.

    Raises:
        WarmupConfigError: the file is not TOML, has an unknown key or a bad value, or lists no
            kernels; the message names the file, the line and the accepted values.
    """
    path = str(path)
    if sms is not None and (not isinstance(sms, int) or isinstance(sms, bool)
                            or not 0 < sms <= MAX_SMS):
        raise WarmupConfigError(f"sms: expected a positive integer (the GPU's multiprocessor "
                                f"count), got {sms!r}")
    archs = None if archs is None else _arch_list(archs)
    file = _parse(path)
    tables = _check_top_keys(file)
    arch_list = _archs_of(file, archs)
    if sms is None and _present_archs():
        from .jit.device import sm_count

        sms = sm_count(0)
    records = None
    if from_tuning_db:
        from .tune.db import default_db

        records = list(default_db().records())
    jobs = []
    for op, module in tables.items():
        jobs += _jobs_of(file, op, module, arch_list, sms, records)
    return WarmupPlan(tuple(dict.fromkeys(jobs)), tuple(arch_list))


@dataclass(frozen=True, slots=True)
class _File:
    """A warm-up file as read: its name in messages ("<stdin>" for standard input), its text
    and its TOML data."""

    path: str
    text: str
    data: dict


def _parse(path: str) -> _File:
    """The warm-up file ``path`` ("-": standard input), read and parsed as TOML."""
    raw = _read(path)
    if path == "-":
        path = "<stdin>"
    if len(raw) > MAX_FILE_BYTES:
        raise WarmupConfigError(f"{path}: more than {MAX_FILE_BYTES} bytes; a warm-up file is a "
                                "few kB of TOML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _error(path, raw.count(b"\n", 0, e.start) + 1,
                     f"not a UTF-8 text file (byte 0x{raw[e.start]:02x}); TOML files are "
                     "UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise _error(path, int(m.group(1)) if m else None, f"not valid TOML: {e}") from None
    return _File(path, text, data)


def _check_top_keys(file: _File) -> dict:
    """The registered warm-up tables (name -> module), once the file's top-level keys are
    known ones and at least one of them is a table."""
    path, text, data = file.path, file.text, file.data
    tables, keys = warmup_tables(), top_keys()
    for key in data:
        if key not in keys:
            raise _error(path, _line_of(text, key, None, 0),
                         f"{key}: unknown key; accepted: {', '.join(keys)}")
    if not any(op in data for op in tables):
        # compiling nothing and succeeding would hide an empty or wrong file (a shell's
        # redirection that truncated it, say)
        got = f"only {', '.join(data)}" if data else "an empty file"
        raise WarmupConfigError(
            f"{path}: the warm-up file lists no kernels: expected at least one table such as "
            f"[[{next(iter(tables))}]] (accepted: {', '.join(tables)}), got {got}; `ge2jit "
            "warmup --example` prints one")
    return tables


def _archs_of(file: _File, archs: list | None) -> list[str]:
    """The architectures to compile for, checked: ``archs`` (given as an argument), else the
    file's, else the GPUs present."""
    path, text, data = file.path, file.text, file.data
    if archs:
        arch_list = archs
    elif "archs" in data:
        arch_list = data["archs"]
        if not isinstance(arch_list, list) or not arch_list:
            raise _error(path, _line_of(text, "archs", None, 0),
                         f"archs: expected a list such as ['sm_90a', 'sm_80'], got {arch_list!r}")
    else:
        arch_list = _present_archs()
        if not arch_list:
            raise _error(path, None, "archs: no GPU here and no architecture given; set "
                         "archs = [...] in the file or pass --arch sm_90a")
    try:
        return list(check_archs(arch_list))
    except ArgumentValueError as e:
        if archs:  # given as an argument, not by the file
            raise WarmupConfigError(str(e)) from None
        raise _error(path, _line_of(text, "archs", None, 0), str(e)) from None


def _jobs_of(file: _File, op: str, module, arch_list: list[str], sms: int | None,
             records: list | None) -> list:
    """The (spec, arch) jobs of the file's [[op]] tables (``module``: the table's), for each
    architecture; ``records``: the tuning database's, whose configs are added (None: none)."""
    path, text = file.path, file.text
    entries = file.data.get(op, [])
    if isinstance(entries, dict) or not isinstance(entries, list):
        raise _error(path, _line_of(text, op, None, 0),
                     f"{op}: expected an array of tables, written [[{op}]]")
    jobs = []
    for i, raw in enumerate(entries):
        try:
            entry = module.validate_entry(raw)
        except ArgumentValueError as e:
            key = str(e).split(":", 1)[0]
            raise _error(path, _line_of(text, key, op, i), f"[[{op}]] #{i + 1}: {e}") from None
        for arch in arch_list:
            tuned = module.tuned_entries(records, arch) if records is not None else []
            try:
                specs = module.expand(entry, arch, sms=entry.get("sms") or sms, tuned=tuned)
            except ArgumentValueError as e:
                key = str(e).split(":", 1)[0]
                raise _error(path, _line_of(text, key, op, i),
                             f"[[{op}]] #{i + 1}: {e}") from None
            jobs.extend((spec, spec.target_arch(arch)) for spec in specs)
    return jobs


def example() -> str:
    """The example warm-up file shipped with ge2jit (``ge2jit warmup --example`` prints it)."""
    from importlib.resources import files

    return files("ge2jit").joinpath("data", "warmup.toml").read_text(encoding="utf-8")


def _check_cache_writable() -> None:
    """A warm-up whose results cannot be stored is pointless: say so before compiling."""
    from .jit.cache import default_cache

    cache = default_cache()
    if not cache.enabled:
        raise CacheNotWritableError("the disk cache is disabled (GE2JIT_DISABLE_CACHE): a "
                                    "warm-up would keep nothing")
    why = cache.writable_problem()
    if why:
        raise CacheNotWritableError(
            f"the kernel cache cannot store kernels: {why}; set GE2JIT_CACHE_DIR to a writable "
            "directory. (Without one ge2jit still works, compiling into memory in each "
            "process.)")


def _present_archs() -> list[str]:
    from .jit.device import device_arch, gpu_count

    return sorted({device_arch(i) for i in range(gpu_count())})


@dataclass
class WarmupSummary:
    """What a warm-up did: kernels compiled and stored, found in the cache, kept in memory only
    (the cache could not store them: lost when the process ends), and failed."""

    compiled: int = 0
    cached: int = 0
    memory: list[CompileOutcome] = field(default_factory=list)
    failed: list[CompileOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every kernel asked for is in the disk cache."""
        return not self.failed and not self.memory

    def __str__(self) -> str:
        kept = f"{len(self.memory)} kept in memory only, " if self.memory else ""
        text = (f"{self.compiled} compiled, {self.cached} already cached, {kept}"
                f"{len(self.failed)} failed, in {self.seconds:.1f} s")
        if self.memory:
            why = next((m.error for m in self.memory if m.error), "")
            text += (f"\nNOT STORED: {len(self.memory)} kernels could not be written to the "
                     "kernel cache and are lost when this process ends" + (f": {why}" if why
                                                                           else ""))
        for f in self.failed:
            text += f"\nFAILED {f.kernel_name} ({f.arch}):\n{f.error}"
        return text


class _Lines:
    """The progress where stderr is no terminal (a log, CI): a plain line at every tenth of
    the kernels, no carriage-return frames."""

    def __init__(self, total: int):
        self.total, self.done, self.shown = total, 0, 0
        self.t0 = time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        tenth = self.done * 10 // max(self.total, 1)
        if tenth > self.shown:
            self.shown = tenth
            print(f"ge2jit warmup: {self.done}/{self.total} kernels "
                  f"({self.done * 100 // max(self.total, 1)}%), "
                  f"{time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress(total: int):
    """A progress bar (tqdm) on a terminal, plain lines elsewhere."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is None or not isatty():
        return _Lines(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="kernel", desc="ge2jit warmup")


def warmup(config: str | Path, *, archs=None, processes: int | None = None,
           progress: bool = True, from_tuning_db: bool = False,
           sms: int | None = None) -> WarmupSummary:
    """Compile everything a warm-up file lists into the kernel cache; see the module doc.

    Works without a GPU when architectures are given (in the file or ``archs``: one name such
    as ``"sm_90a"`` or a list). ``config`` "-" reads the file from standard input.
    ``progress``: a bar on a terminal, a line at every tenth of the kernels elsewhere. Returns
    a summary; failures (with each kernel's name and NVRTC log) are in ``summary.failed``.
    The compiled launch path's C module is built into the cache too (where the install has
    none and a C compiler is present), so that a job started on this cache builds nothing.
    """
    plan = load(config, archs=archs, from_tuning_db=from_tuning_db, sms=sms)
    _check_cache_writable()
    _ = get_settings().cache_max_size  # a bad GE2JIT_CACHE_MAX_SIZE: once, not per kernel
    summary = WarmupSummary()
    t0 = time.perf_counter()
    bar = _progress(len(plan.jobs)) if progress else None

    def on_result(r: CompileOutcome) -> None:
        if r.status == "compiled":
            summary.compiled += 1
        elif r.status == "cached":
            summary.cached += 1
        elif r.status == "memory":
            summary.memory.append(r)
        else:
            summary.failed.append(r)
        if bar is not None:
            bar.update(1)

    try:
        compile_many(plan.jobs, processes=processes, on_result=on_result)
    finally:
        if bar is not None:
            bar.close()
    build_into_cache()   # the compiled launch path's C module, beside the kernels
    summary.seconds = time.perf_counter() - t0
    return summary
