"""The documentation holds together: links reach their files and headings, the README stays short.

The README is the front door and the reference lives in ``docs/``, so a page renamed or a heading
reworded must not leave a link pointing nowhere. Anchors follow GitHub's rule for heading ids:
the heading's text (inline code and links reduced to their text) in lower case, every character
that is not a letter, a digit, an underscore, a hyphen or a space removed, spaces turned into
hyphens, and ``-1``, ``-2``, ... appended to repeated ids.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

README_MAX_LINES = 250

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            lines.append((number, line))
        elif (
            match
            and match.group(1)[0] == fence[0]
            and len(match.group(1)) >= len(fence)
            and not line.strip().strip(fence[0])  # a closing fence has no info string
        ):
            fence = None
    return lines


def slug(heading: str) -> str:
    """GitHub's id for a heading's text (before de-duplication)."""
    text = _CODE_SPAN.sub(lambda m: m.group(0).strip("`").strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every id a link may point at in the markdown file ``path``."""
    seen: dict[str, int] = {}
    ids: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        ids.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    return ids


def relative_links(path: Path) -> list[tuple[int, str]]:
    """The relative link targets in ``path`` (outside code), with their line numbers."""
    links = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        prose = _CODE_SPAN.sub(lambda m: "", line)
        targets = [m.group(2) for m in _INLINE_LINK.finditer(prose)]
        definition = _REFERENCE_DEF.match(prose)
        if definition:
            targets.append(definition.group(1))
        for target in targets:
            if not target or _SCHEME.match(target) or target.startswith("//"):
                continue
            links.append((number, target))
    return links


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_pages_exist() -> None:
    """The README and the reference pages it leads to are where the links expect them."""
    assert README.is_file()
    assert DOCS, "docs/ holds no markdown page"


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link reaches an existing file, and its #anchor a heading of the target."""
    broken = []
    for number, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        where = f"{_label(page)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
            continue
        if not anchor:
            continue
        if dest.suffix != ".md" or not dest.is_file():
            broken.append(f"{where}: an anchor into a file that is not a markdown page")
        elif anchor not in anchors(dest):
            broken.append(f"{where}: no heading with the id {anchor!r}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """Whatever moved out of the README stays one link away from it."""
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in relative_links(README)
        if target.partition("#")[0]
    }
    missing = [_label(page) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_readme_is_short() -> None:
    """The README is a front door; the reference lives in docs/."""
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines, at most {README_MAX_LINES}"


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Quick start", "quick-start"),
        ("The `otel-lockwatch` command", "the-otel-lockwatch-command"),
        ("Sections -> instrumentation", "sections---instrumentation"),
        ("spawn and forkserver: the bootstrap", "spawn-and-forkserver-the-bootstrap"),
        ("What is tested, and what was not", "what-is-tested-and-what-was-not"),
        ('Recorder snapshot ("data")', "recorder-snapshot-data"),
        ("The C fast path (`_speedups`)", "the-c-fast-path-_speedups"),
        ("See [the docs](docs/cli.md)", "see-the-docs"),
    ],
)
def test_slug(heading: str, expected: str) -> None:
    """Heading ids as GitHub makes them."""
    assert slug(heading) == expected


def test_repeated_headings_are_numbered(tmp_path: Path) -> None:
    """A repeated heading gets -1, -2, ...; headings inside code blocks are not headings."""
    page = tmp_path / "page.md"
    text = "# Cost\n\n## Cost\n\n```\n# not a heading\n```\n\n### Cost\n"
    page.write_text(text, encoding="utf-8")
    assert anchors(page) == {"cost", "cost-1", "cost-2"}


def test_links_in_code_are_not_links(tmp_path: Path) -> None:
    """Link syntax inside code blocks and code spans is text, not a link."""
    page = tmp_path / "page.md"
    page.write_text(
        "[a](a.md#x) `[b](b.md)` [`c`](c.md) [d](https://example.org/d.md)\n\n```\n[e](e.md)\n```\n",
        encoding="utf-8",
    )
    assert [target for _, target in relative_links(page)] == ["a.md#x", "c.md"]


def test_the_options_table_is_the_declarations():
    """docs/configuration.md's options table is exactly what ``_settings`` declares: one row per
    option, in declaration order, with the declared default and meaning (a new option, a changed
    default or a reworded meaning that is not in the docs fails here)."""
    from otel_lockwatch._settings import docs_table_rows

    text = (ROOT / "docs" / "configuration.md").read_text()
    begin, end = "<!-- options-table:begin -->", "<!-- options-table:end -->"
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert rows == docs_table_rows()
