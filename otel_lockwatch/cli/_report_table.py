"""Terminal tables and lines that fit a width (the terminal's, 100 columns without one).

:func:`table` lays a table out in the first of three forms that fits:

1. every cell on one line, columns as wide as their widest cell;
2. the text (left-aligned) columns narrowed, the widest first, down to :data:`MIN_TEXT`
   columns, their cells wrapped onto more lines (after a ``.``, ``:``, ``/``, ``_``, ``-`` or a
   space where one falls, else anywhere), a header at its spaces;
3. the text cells of a row on a line of their own, above its numbers; the numbers (the
   right-aligned columns) in a table of their own under the text headers' line.

:func:`fit` wraps any other line wider than the width at its spaces, the continuation indented
under the line's own indent.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence

from otel_lockwatch.record._witness import printable

__all__ = ["DEFAULT_WIDTH", "MIN_TEXT", "fit", "table", "wrap_cell"]

#: The width without a terminal.
DEFAULT_WIDTH = 100
#: The narrowest a text column is made before its cells move onto lines of their own.
MIN_TEXT = 16
_GAP = "  "
_BREAK = re.compile(r"[.:/_\- ]")


def wrap_cell(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a separator where one
    falls in the second half of a line, else at ``width``."""
    lines = []
    while len(text) > width:
        cut = max((m.end() for m in _BREAK.finditer(text, 0, width)), default=0)
        if cut <= width // 2:
            cut = width
        lines.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    lines.append(text)
    return lines


def _widths(headers: Sequence[str], rows: Sequence[Sequence[str]], header_words: bool) -> list[int]:
    out = []
    for i, h in enumerate(headers):
        head = max(map(len, h.split(" "))) if header_words else len(h)
        out.append(max(head, *(len(r[i]) for r in rows)) if rows else head)
    return out


def _render(
    headers: Sequence[str], rows: Sequence[Sequence[str]], widths: list[int], right: set[int]
) -> list[str]:
    def lines(cells: Sequence[str], is_header: bool) -> list[str]:
        wrapped = [
            (textwrap.wrap(c, w) or [""]) if is_header else wrap_cell(c, w)
            for c, w in zip(cells, widths, strict=True)
        ]
        height = max(map(len, wrapped))
        out = []
        for k in range(height):
            parts = []
            for i, cell in enumerate(wrapped):
                c = cell[k] if k < len(cell) else ""
                parts.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
            out.append(_GAP.join(parts).rstrip())
        return out

    result = lines(headers, True) if headers else []
    for r in rows:
        result += lines(r, False)
    return result


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    right: set[int],
    width: int = DEFAULT_WIDTH,
    indent: int = 2,
) -> list[str]:
    """The lines of a table (without the indent, which the caller adds) that fit ``width``
    columns once indented by ``indent`` (see the module docstring).

    Args:
        headers: the column headers.
        rows: the cells, one sequence per row (names are made printable here).
        right: the indices of the right-aligned (number) columns.
        width: the columns available.
        indent: the columns the caller puts before each line.
    """
    rows = [[printable(c) for c in r] for r in rows]  # names (and kinds) cut, escaped
    room = max(width - indent, 20)
    gaps = len(_GAP) * (len(headers) - 1)
    widths = _widths(headers, rows, False)
    if sum(widths) + gaps <= room:
        return _render(headers, rows, widths, right)
    widths = _widths(headers, rows, True)
    text = [i for i in range(len(headers)) if i not in right]
    excess = sum(widths) + gaps - room
    while excess > 0 and text:  # narrow the widest text column, a column at a time
        widest = max(text, key=lambda i: widths[i])
        if widths[widest] <= MIN_TEXT:
            break
        widths[widest] -= 1
        excess -= 1
    if excess <= 0:
        return _render(headers, rows, widths, right)
    # 3: the text cells above, the numbers below
    numbers = sorted(right)
    head = _GAP.join(headers[i] for i in text)
    out = wrap_cell(head, room) if head else []
    sub_widths = _widths(
        [headers[i] for i in numbers], [[r[i] for i in numbers] for r in rows], True
    )
    sub = _render(
        [headers[i] for i in numbers],
        [],
        sub_widths,
        set(range(len(numbers))),
    )
    out += ["  " + line for line in sub]
    for r in rows:
        label = _GAP.join(r[i] for i in text)
        out += wrap_cell(label, room)
        out += [
            "  " + line
            for line in _render([], [[r[i] for i in numbers]], sub_widths, set(range(len(numbers))))
        ]
    return out


def fit(lines: Iterable[str], width: int = DEFAULT_WIDTH) -> list[str]:
    """Every line at most ``width`` columns: a longer one wrapped at its spaces (a word longer
    than the width cut), continued under its indent and four more columns. Colour codes take no
    column: a coloured line wraps where the same line without them does, its style carried onto
    the continuation."""
    out = []
    for line in lines:
        plain = _SGR.sub("", line)
        if len(plain) <= width:
            out.append(line)
            continue
        indent = " " * (len(plain) - len(plain.lstrip(" ")))
        wrapped = textwrap.wrap(
            plain,
            width,
            initial_indent="",
            subsequent_indent=indent + "    ",
            break_long_words=True,
            break_on_hyphens=False,
        ) or [plain[:width]]
        out += wrapped if plain == line else _restyled(line, wrapped, len(indent) + 4)
    return out


_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _restyled(line: str, wrapped: list[str], added: int) -> list[str]:
    """The lines ``wrapped`` (of ``line`` without its colour codes; each after the first begins
    with ``added`` columns of indent of its own) with ``line``'s codes put back: each before the
    character it preceded, the style in force at a break closed at its end and opened again on
    the next line. (Without them, should the wrap have changed a character: the lines as they
    are.)"""
    cells: list[tuple[bool, str]] = []  # (a code?, the code or the character)
    at = 0
    for found in _SGR.finditer(line):
        cells += [(False, c) for c in line[at : found.start()]]
        cells.append((True, found.group()))
        at = found.end()
    cells += [(False, c) for c in line[at:]]
    out: list[str] = []
    style = ""  # the code in force (none after a reset)
    i = 0
    for n, text in enumerate(wrapped):
        parts = [text[:added], style] if n else []
        for char in text[added:] if n else text:
            while i < len(cells) and (cells[i][0] or cells[i][1] != char):
                is_code, value = cells[i]
                if is_code:
                    parts.append(value)
                    style = "" if value == _RESET else value
                i += 1  # a code, or a space the wrap dropped at the break
            if i == len(cells):
                return wrapped
            parts.append(char)
            i += 1
        if n < len(wrapped) - 1:
            while i < len(cells) and cells[i][0]:  # the codes right after its last character
                parts.append(cells[i][1])
                style = "" if cells[i][1] == _RESET else cells[i][1]
                i += 1
            parts.append(_RESET if style else "")
        else:  # the codes after the last character (a closing reset)
            parts += [value for is_code, value in cells[i:] if is_code]
        out.append("".join(parts))
    return out


_RESET = "\x1b[0m"
