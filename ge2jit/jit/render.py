"""Rendering kernel templates with Jinja2 (StrictUndefined: a missing variable is an error)."""

from __future__ import annotations

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
