"""The manifest's file: written atomically with the umask's mode, read back only as written.

Writing. :func:`dump_manifest` writes the JSON to a temporary file in the same directory,
flushes and fsyncs it, then renames it over the target (``os.replace``): a reader sees the
previous manifest or the new one, never a truncated file, and a write interrupted at any point
leaves the previous one intact. The temporary file is created with ``O_CREAT | O_EXCL`` (a
symlink planted at its name is refused, never followed) and mode ``0o666``, so the kernel
applies the process's umask (and a directory's default ACL) as for any file the program
creates: under umask 077 the manifest is ``0600``, and it is never more open while it is
written than when it is done.

Reading. A manifest is read back by orchestrators (``recommended_workers``, ``otel-lockwatch
check``) that size pools from it, and by people (``otel-lockwatch report``); lock and thread
names in it often come from request data, and whoever can write the file can recompute its
digest, which has no key. So :func:`load_manifest` treats the file as hostile and refuses, with
one :class:`ManifestError` line naming the file and the value or field, anything it cannot
trust:

- a file that is not a regular file (a FIFO, ``/dev/zero``, a directory: refused from its
  ``stat``, before it is opened for reading), or larger than ``max_bytes`` (at most
  ``max_bytes + 1`` bytes are ever read);
- a text that would build more than :data:`MAX_EXPANSION` times its size in objects (estimated
  from its punctuation before it is parsed: a line of ``{},`` builds 30 times its size);
- bytes that are not UTF-8 JSON; an object with a duplicate key (other parsers keep the first
  value where Python keeps the last); nesting deeper than :data:`MAX_DEPTH`; an integer outside
  ``(-2**63, 2**63)``; a float that is not finite (``1e999``, ``NaN``); a lone surrogate;
- then, as ``_check.check_doc``: another schema, a missing field, a digest that does not match
  the content (an edit by hand), data of the wrong type or shape anywhere, and derived fields
  that evaluating the data again (under the manifest's own thresholds and pool-size source)
  does not give, floats included.

What the reader cannot know is whether the data itself is what a run measured: a writer who
can write the file can write any self-consistent manifest. The file's mode is what keeps other
users from writing it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Union

try:  # the merge's faster parser, optional (the `merge` extra)
    import orjson
except ImportError:  # pragma: no cover - the test extra installs it
    orjson = None  # type: ignore[assignment]

from ..exceptions import ManifestError
from ..record._histogram import MERGE_SPEEDUPS
from ..record._witness import printable
from ._check import (
    INT_LIMIT,
    MAX_DEPTH,
    check_depth,
    check_document,
    check_json,
    check_mergeable,
    shown,
)
from ._model import Manifest

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_EXPANSION",
    "PathLike",
    "compact_sealed",
    "parse_sealed",
    "dump_manifest",
    "load_manifest",
    "load_mergeable",
    "open_regular",
    "parse_cost",
    "parse_json",
    "write_atomically",
    "COSTS",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The largest manifest file :func:`load_manifest` reads by default (64 MiB).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_READ_CHUNK = 1 << 20
# A JSON escape of a UTF-16 surrogate: only these can put a lone surrogate into a parsed str.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: The most one parse may build, in bytes of objects per byte of its text: a text whose
#: estimated cost (:func:`parse_cost`) passes it is refused before it is parsed. What this library
#: writes costs 2 to 9 times its size by the estimate (an indented manifest, a record's compact
#: body, a Collector's line), and builds less; a line of ``{},`` (30 times, as parsed) is refused.
MAX_EXPANSION = 12
# The estimate: the most the parser builds for one byte of punctuation (an object's dict, an
# array's list, a member's or element's slot and value, a string's object), counted wherever the
# byte is (in strings too: an over-estimate that needs no parse). The C fast path's cost() counts
# the same (record/_merge_speedups.c).
COSTS = ((b"{", 160), (b"[", 64), (b",", 16), (b":", 16), (b'"', 25))
# A text this small is never refused for its cost (it builds a few dozen MiB at most).
_SMALL_TEXT = 1 << 20
# Without a run of 19 digits anywhere, every integer of the text is below 10**18 < 2**63: the
# parser's own int() is safe and in range, and its hook (a Python call per integer) is skipped.
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9999999999")


# --------------------------------------------------------------------------------------------
# Writing


def _create_temp(target: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``target``, created ``0o666 & ~umask``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {target}")  # pragma: no cover


def write_atomically(target: Path, payload: bytes) -> None:
    """Write ``payload`` to ``target`` through a temporary file in the same directory, fsynced,
    then ``os.replace``: a reader sees the old file or the whole new one. On any error the
    temporary file is removed and the old file survives. The file's mode is ``0o666`` less the
    umask, as for any file the program creates.

    Raises:
        OSError: the file could not be written (its directory must exist).
    """
    directory = target.parent
    fd, tmp = _create_temp(target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable; best effort (not every platform opens directories)
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


def dump_manifest(manifest: Manifest, path: PathLike) -> Path:
    """Write ``manifest`` to ``path`` atomically and return the path written.

    The JSON goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over ``path`` (``os.replace``): a reader sees the previous manifest or the new one,
    never a truncated file. On any error the temporary file is removed and the previous
    manifest survives. The file is created ``0o666 & ~umask``. ``{pid}`` in ``path`` is replaced
    by the process id.

    Args:
        manifest: the manifest to write.
        path: the destination; its directory must exist.

    Raises:
        TypeError: ``manifest`` is not a :class:`Manifest`.
        OSError: the file could not be written.
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
    target = Path(os.fspath(path).replace("{pid}", str(os.getpid())))
    write_atomically(target, manifest.to_json().encode("utf-8"))
    return target


# --------------------------------------------------------------------------------------------
# Reading: the bytes


class _Refused(ValueError):
    """A value the JSON parser's hooks refuse (caught by :func:`parse_json`)."""


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"  # pragma: no cover


def open_regular(path: PathLike, where: str, max_bytes: int) -> int:
    """A descriptor open for reading on ``path``, refusing what is not a regular file or is
    larger than ``max_bytes``.

    The kind and size are checked on ``stat`` before the file is opened (opening a FIFO would
    block, reading ``/dev/zero`` would never end), then again on the open descriptor (the path
    may have been replaced in between).

    Raises:
        ManifestError: naming ``where``.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ManifestError(f"{where} does not exist") from None
    except OSError as e:
        raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
    _check_stat(st, where, max_bytes)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        _check_stat(os.fstat(fd), where, max_bytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(path: PathLike, where: str, max_bytes: int) -> bytearray:
    """The file's bytes (:func:`open_regular`); at most ``max_bytes + 1`` bytes are read, so a
    file that lies about its size (or grows) is refused too."""
    fd = open_regular(path, where, max_bytes)
    try:
        data = bytearray()
        while len(data) <= max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ManifestError(f"{where} is larger than {max_bytes} bytes (max_bytes)")
    return data


def _check_stat(st: os.stat_result, where: str, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(f"{where} is not a regular file: it is {_file_kind(st.st_mode)}")
    if st.st_size > max_bytes:
        raise ManifestError(f"{where} is {st.st_size} bytes, more than max_bytes={max_bytes}")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"has a duplicate key {shown(key)} in one object")
            seen.add(key)
    return obj


def _int(text: str) -> int:
    # Length first: int() of a few thousand digits is refused (or slow) before any range check.
    if len(text) > 20:
        raise _Refused(f"has an integer of {len(text)} digits, out of range: {printable(text, 20)}")
    value = int(text)
    if not -INT_LIMIT < value < INT_LIMIT:
        raise _Refused(f"has an integer out of range (-2**63, 2**63): {value}")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"has a number out of range: {shown(text)}")
    return value


def _constant(text: str) -> Any:
    raise _Refused(f"has {text}, which is not a JSON number")


def parse_cost(data: bytes | bytearray) -> int:
    """What parsing ``data`` may build at most, in bytes, estimated from its punctuation
    (:data:`MAX_EXPANSION`)."""
    if MERGE_SPEEDUPS is not None:
        return int(MERGE_SPEEDUPS.cost(data))
    return sum(data.count(byte) * weight for byte, weight in COSTS)


def _max_cost(size: int) -> int:
    return MAX_EXPANSION * max(size, _SMALL_TEXT)


def parse_json(data: bytes | bytearray, where: str, *, vetted: bool = False) -> Any:
    """Parse untrusted JSON bytes within the limits of the module docstring (duplicate keys,
    nesting, numbers, surrogates), or raise one :class:`ManifestError` line naming ``where``.

    ``vetted``: the bytes are :func:`compact_sealed`'s, whose keys are distinct in every object,
    whose nesting is within :data:`MAX_DEPTH` and whose integers are below 10**18 already: none
    of that is checked again, and with orjson installed (the ``merge`` extra) they are parsed by
    it, which refuses the rest (a float out of range, ``NaN``, a lone surrogate: the caller then
    reads the file the long way, which names it).

    A text that would build more than :data:`MAX_EXPANSION` times its size (by
    :func:`parse_cost`) is refused before it is parsed (vetted bytes were costed as they were
    compacted).
    """
    if not vetted:
        cost = parse_cost(data)
        if cost > _max_cost(len(data)):
            raise ManifestError(
                f"{where} would build about {cost} bytes of objects from its {len(data)} bytes, "
                f"more than {MAX_EXPANSION} times its size: refused before it is parsed"
            )
    if vetted and orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{where} is not valid JSON: {e}") from None
    long_digits = not vetted and b"9" * 19 in data.translate(_DIGITS_AS_NINES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{where} is not UTF-8 text (byte {e.start})") from None
    del data  # the bytes are not needed past here: free them before the objects are built
    try:
        doc = json.loads(
            text,
            object_pairs_hook=None if vetted else _object,
            parse_int=_int if long_digits else None,
            parse_float=_float,
            parse_constant=_constant,
        )
    except _Refused as e:
        raise ManifestError(f"{where} {e}") from None
    except json.JSONDecodeError as e:
        raise ManifestError(
            f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:  # the parser's own stack: far deeper than MAX_DEPTH
        raise ManifestError(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    if _SURROGATE_ESCAPE.search(text):
        check_json(doc, where)
    elif not vetted:  # the hooks and the digit runs answered for every number; the nesting is left
        check_depth(doc, where)
    return doc


def parse_sealed(data: bytes | bytearray, where: str, member: str) -> tuple[Any, bool]:
    """``(document, sealed)``: the document parsed from its bytes compacted and vetted when its
    digest (its top-level ``member``) holds on them (:func:`compact_sealed`; ``sealed``: the
    digest need not be computed again), else parsed the long way (:func:`parse_json`), which
    names whatever is wrong.

    Raises:
        ManifestError: the long way refuses the bytes (one line naming ``where``).
    """
    compact = compact_sealed(data, member)
    if compact is not None:
        try:
            return parse_json(compact, where, vetted=True), True
        except ManifestError:  # named from the text itself, as the long way reads it
            pass
    return parse_json(data, where), False


def compact_sealed(data: bytes | bytearray, member: str) -> bytes | None:
    """The text of a document as this library writes it, compacted and vetted, when its digest
    holds; else None, and the caller reads it the long way (:func:`parse_json`, then the digest
    recomputed from the parsed document), which names whatever is wrong.

    A manifest file is ``json.dumps(sort_keys=True, indent=2, ensure_ascii=False)`` of its
    document, and a Collector record's body the canonical JSON itself; without whitespace, either
    is the canonical JSON its digest was computed over, but for the digest's own top-level member
    (``"manifest_digest"`` or ``"digest"``: ``member``). So the digest is checked on the bytes,
    at the cost of one hash, instead of on the document encoded again (which costs as much as
    parsing it). The compacting is the merge's C fast path (``record._merge_speedups.compact``),
    which also vets what the parser would have to check otherwise: every object's keys strictly
    ascending without escapes (so distinct), the nesting within :data:`MAX_DEPTH`, no integer of
    19 digits or more (so every one is in range), no whitespace inside a token (dropped, it would
    join two), and its cost within :data:`MAX_EXPANSION` times its size. The bytes
    hashed are the bytes then parsed (:func:`parse_json` with ``vetted``), so a document whose
    text does not compact to what its digest says is never taken this way. Without the C fast
    path this returns None.
    """
    if MERGE_SPEEDUPS is None:
        return None
    compact: bytes | None = MERGE_SPEEDUPS.compact(data, MAX_DEPTH, _max_cost(len(data)))
    if compact is None:
        return None
    key = b'"' + member.encode("ascii") + b'"'
    at = compact.find(b"," + key + b':"')
    if at < 0 or compact.count(key) != 1:  # the one such key: the document's own member
        return None
    start = at + len(key) + 3
    end = start + 64
    if compact[end : end + 1] != b'"':
        return None
    digest = hashlib.sha256(memoryview(compact)[:at])
    digest.update(memoryview(compact)[end + 1 :])
    if digest.hexdigest().encode() != compact[start:end]:
        return None
    return compact


def load_manifest(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Manifest:
    """Read a manifest back, refusing anything this library did not write as it is.

    See the module docstring for what is refused and why.

    Args:
        path: the manifest file.
        max_bytes: the largest file accepted (default :data:`DEFAULT_MAX_BYTES`, 64 MiB); at
            most ``max_bytes + 1`` bytes are read.

    Raises:
        ManifestError: (one line naming the path and the value or field) the file is missing,
            unreadable, not a regular file, larger than ``max_bytes``, not UTF-8 JSON, has a
            duplicate key, nests too deep, has a number out of range, is of another schema,
            lacks fields, was edited (its digest does not match its content), has malformed
            data, or derived fields that its data does not give.
        TypeError: ``max_bytes`` is not an int.
        ValueError: ``max_bytes`` < 1.
    """
    _check_max_bytes(max_bytes)
    where = f"manifest {printable(os.fspath(path), None)}"
    return check_document(parse_json(_read(path, where, max_bytes), where), where)


def _check_max_bytes(max_bytes: object) -> None:
    if type(max_bytes) is not int:  # noqa: E721
        raise TypeError(f"max_bytes must be an int, got {max_bytes!r}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")


def load_mergeable(
    path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[dict[str, Any], dict[str, float]]:
    """What a merge needs of a manifest file: its normalized data and its two thresholds.

    The file is read and checked as :func:`load_manifest` does, its derived fields evaluated
    again from its data too (a merge uses none of them, but refuses what ``report`` and
    ``check`` refuse); then its data is normalized again for the merge to take over.

    Raises:
        ManifestError: as :func:`load_manifest`.
    """
    _check_max_bytes(max_bytes)
    where = f"manifest {printable(os.fspath(path), None)}"
    doc, sealed = parse_sealed(_read(path, where, max_bytes), where, "manifest_digest")
    return check_mergeable(doc, where, sealed=sealed)
