"""Rendering kernel templates with Jinja2 (StrictUndefined: a missing variable is an error)."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import jinja2

from .spec import KernelSpec


def template_dir() -> Path:
    """Where the .cu templates are: inside the installed package, or in the source tree."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "kernel_templates", here.parent / "kernel_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"ge2jit's kernel templates were not found next to {here}: the installation is incomplete"
    )


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@lru_cache(maxsize=4096)
def render(spec: KernelSpec) -> str:
    """The CUDA source of ``spec``'s kernel."""
    return environment().get_template(spec.template).render(spec=spec)


#: the Python sources that rendering reads (beside the templates), under the package
_RENDER_SOURCES = ("ops", "jit/spec.py", "jit/render.py", "jit/params.py", "jit/nvrtc.py",
                   "runtime/rows.py", "_version.py")


def files_under(root: Path, suffix: str = "") -> list[tuple[str, str]]:
    """(name relative to ``root``, '/'-separated; path) of every file under ``root`` whose name
    ends with ``suffix``, in the order of their names' parts (``sorted(root.rglob(...))``'s),
    by ``os.scandir``: a process's first kernel pays for this walk, and pathlib's is several
    times slower."""
    found = []

    def walk(directory: str, prefix: tuple[str, ...]) -> None:
        with os.scandir(directory) as entries:
            for e in entries:
                if e.is_dir():
                    walk(e.path, (*prefix, e.name))
                elif e.name.endswith(suffix) and e.is_file():
                    found.append(((*prefix, e.name), e.path))

    walk(str(root), ())
    found.sort()
    return [("/".join(parts), path) for parts, path in found]


def tree_digest(seed: bytes, templates: Path, package: Path, sources, prefix: str = "") -> str:
    """A sha256 (hex) of ``seed``, then every file under ``templates`` (named
    ``kernel_templates/...``) and every Python file of ``sources`` (folders and files under
    ``package``, named ``prefix`` + their path there), each name with its bytes' sha256."""
    files = [(f"kernel_templates/{name}", path) for name, path in files_under(templates)]
    for source in sources:
        where = package / source
        if where.is_dir():
            files += [(f"{prefix}{source}/{name}", path)
                      for name, path in files_under(where, ".py")]
        elif where.is_file():
            files.append((f"{prefix}{source}", str(where)))
    h = hashlib.sha256(seed)
    for name, path in files:
        h.update(name.encode() + b"\0" + _file_digest(path))
    return h.hexdigest()


#: the sha256 of each file read, by (path, modification time, size): the fingerprints share
#: their files' digests within a process (a file edited since is read again)
_digests: dict[tuple[str, int, int], bytes] = {}


def _file_digest(path: str) -> bytes:
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    digest = _digests.get(key)
    if digest is None:
        with open(path, "rb") as f:
            digest = _digests[key] = hashlib.sha256(f.read()).digest()
    return digest


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """A sha256 of every file under the templates and of the Python files that rendering and
    the compile options read (``_RENDER_SOURCES``), with their names, computed once per
    process: the same on every machine with the same ge2jit."""
    return tree_digest(b"ge2jit-source-v1", template_dir(),
                       Path(__file__).resolve().parent.parent, _RENDER_SOURCES)
