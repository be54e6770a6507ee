"""The documentation's structure, read from the files (the site itself is built by ``make
docs``, ``mkdocs build --strict``, which CI runs after the tests): every page of ``docs/`` is in
``mkdocs.yml``'s nav, every relative link of README.md and of the pages points to a file (and
an anchor) that exists, and README.md stays a short entry point."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: links to this repository's files on GitHub, which the pages use for files outside docs/
REPO_BLOB = "https://github.com/ge2jit/ge2jit/blob/main/"
README_MAX_LINES = 320

PAGES = sorted(DOCS.glob("*.md"))
SOURCES = [README, ROOT / "CONTRIBUTING.md", *PAGES]


def _nav_pages() -> list[str]:
    """The pages ``mkdocs.yml``'s nav lists (read without a YAML parser: the nav block is
    the indented lines after ``nav:``; each entry ends in a page path)."""
    lines = (ROOT / "mkdocs.yml").read_text().splitlines()
    start = lines.index("nav:") + 1
    pages = []
    for line in lines[start:]:
        if line.strip() and not line.startswith((" ", "\t")):
            break
        m = re.search(r"([\w./-]+\.md)\s*$", line)
        if m:
            pages.append(m.group(1))
    return pages


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans (links there are code)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(text: str) -> list[str]:
    """The targets of the Markdown inline links ``[text](target)`` of ``text``'s prose."""
    return re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", _prose(text))


def _slug(heading: str) -> str:
    """A heading's anchor as MkDocs makes it (Python-Markdown's ``toc`` slugify of the
    heading's text, code spans and emphasis reduced to their text)."""
    text = re.sub(r"[`*]", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated one gets ``_1``, ``_2``, ...)."""
    found: set[str] = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug, n = _slug(m.group(1)), 0
        while (slug if n == 0 else f"{slug}_{n}") in found:
            n += 1
        found.add(slug if n == 0 else f"{slug}_{n}")
    return found


def _generated(page: Path) -> bool:
    """Whether a page holds mkdocstrings blocks (``::: module``), whose anchors are the
    documented objects' paths (``api.md#ge2jit.softmax``), made when the site is built."""
    return re.search(r"^::: ", page.read_text(), flags=re.M) is not None


def test_every_page_is_in_the_nav():
    nav = _nav_pages()
    assert nav, "mkdocs.yml has no nav"
    pages = [p.relative_to(DOCS).as_posix() for p in PAGES]
    assert sorted(set(pages) - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages)) == [], "nav entries without a page"
    assert len(nav) == len(set(nav)), "a page listed twice"


def test_the_site_has_an_overview_and_the_api_reference():
    assert (DOCS / "index.md").is_file()
    api = (DOCS / "api.md").read_text()
    for module in ("ge2jit", "ge2jit.torch", "ge2jit.graph", "ge2jit.distributed"):
        assert re.search(rf"^::: {re.escape(module)}$", api, flags=re.M), module


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files_and_anchors(source):
    bad = []
    for target in _links(source.read_text()):
        if target.startswith(REPO_BLOB):
            if not (ROOT / target[len(REPO_BLOB):].split("#")[0]).exists():
                bad.append(f"{target}: no such file in the repository")
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", target):      # https:, mailto:: not checked here
            continue
        path, _, anchor = target.partition("#")
        file = source if not path else (source.parent / path).resolve()
        if not file.exists():
            bad.append(f"{target}: no such file")
            continue
        if source.parent == DOCS and not file.is_relative_to(DOCS):
            bad.append(f"{target}: outside docs/ (the site has only docs/; link to "
                       f"{REPO_BLOB}...)")
            continue
        if anchor and file.suffix == ".md":
            if _generated(file) and re.fullmatch(r"ge2jit(\.\w+)*", anchor):
                continue
            if anchor not in _anchors(file):
                bad.append(f"{target}: no heading with the anchor #{anchor} in "
                           f"{file.relative_to(ROOT)}")
    assert bad == [], f"{source.relative_to(ROOT)}: broken links"


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; details go to docs/"


def test_the_link_reader_and_slugs():
    text = ("See [a](gemm.md#the-contract) and [b](<row-ops.md>).\n"
            "```python\nx = [y](not_a_link.md)\n```\n`[c](code.md)` [d](https://x.y/z)\n")
    assert _links(text) == ["gemm.md#the-contract", "row-ops.md", "https://x.y/z"]
    assert _slug("`ge2jit.torch`: custom ops, autograd, layers") == (
        "ge2jittorch-custom-ops-autograd-layers")
    assert _slug("8-bit float inputs (FP8, Hopper)") == "8-bit-float-inputs-fp8-hopper"
    assert _slug("Quantizing to FP8: `ge2jit.quantize_fp8`") == (
        "quantizing-to-fp8-ge2jitquantize_fp8")
