"""Rendering kernel templates with Jinja2 (StrictUndefined: a missing variable is an error)."""

from __future__ import annotations

import hashlib
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


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """A sha256 of every file under the templates and of the Python files that rendering and
    the compile options read (``_RENDER_SOURCES``), with their names, computed once per
    process: the same on every machine with the same ge2jit."""
    package = Path(__file__).resolve().parent.parent
    files = [(f"kernel_templates/{p.relative_to(template_dir()).as_posix()}", p)
             for p in sorted(template_dir().rglob("*")) if p.is_file()]
    for name in _RENDER_SOURCES:
        where = package / name
        paths = sorted(where.rglob("*.py")) if where.is_dir() else [where]
        files += [(p.relative_to(package).as_posix(), p) for p in paths if p.is_file()]
    h = hashlib.sha256(b"ge2jit-source-v1")
    for name, path in files:
        h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
