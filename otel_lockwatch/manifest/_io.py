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
- bytes that are not UTF-8 JSON; an object with a duplicate key (other parsers keep the first
  value where Python keeps the last); nesting deeper than :data:`MAX_DEPTH`; an integer outside
  ``(-2**63, 2**63)``; a float that is not finite (``1e999``, ``NaN``); a lone surrogate;
- another schema, a missing field, a digest that does not match the content (an edit by hand);
- data of the wrong type or shape anywhere (``_data.normalize``, strict);
- derived fields that do not agree with the data: the data is evaluated again under the
  manifest's own thresholds and pool-size source, and the result must be the manifest, field
  for field, floats included (see :func:`check_doc`).

What the reader cannot know is whether the data itself is what a run measured: a writer who
can write the file can write any self-consistent manifest. The file's mode is what keeps other
users from writing it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from .._settings import SETTINGS
from ..exceptions import ManifestError
from ..record._witness import printable
from ._data import normalize
from ._evaluate import evaluate_normalized
from ._model import REQUIRED_FIELDS, SCHEMA, Manifest, compute_digest

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_DEPTH",
    "PathLike",
    "check_doc",
    "check_json",
    "dump_manifest",
    "load_manifest",
    "write_atomically",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The largest manifest file :func:`load_manifest` reads by default (64 MiB).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: The deepest nesting of objects and arrays a manifest may have (a manifest nests 7 deep).
MAX_DEPTH = 32
#: Every integer in a manifest is in ``(-INT_LIMIT, INT_LIMIT)``.
INT_LIMIT = 2**63

_READ_CHUNK = 1 << 20
#: How much of a refused value or of a message a one-line error shows.
_SHOWN = 80
_MESSAGE_LIMIT = 1000
# A JSON escape of a UTF-16 surrogate: only these can put a lone surrogate into a parsed str.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Without a run of 19 digits anywhere, every integer of the text is below 10**18 < 2**63: the
# parser's own int() is safe and in range, and its hook (a Python call per integer) is skipped.
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9999999999")
_CONTAINERS = (dict, list)


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
    """A value the JSON parser's hooks refuse (caught by :func:`_parse`)."""


def _shown(value: Any) -> str:
    """A refused value in a message: its repr, one line, cut past a few dozen characters."""
    if type(value) is int and value.bit_length() > 64:  # repr() may refuse a huge int
        return f"<an int of {value.bit_length()} bits>"
    return printable(repr(value), _SHOWN)


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


def _read(path: PathLike, where: str, max_bytes: int) -> bytearray:
    """The file's bytes, refusing what is not a regular file or is larger than ``max_bytes``.

    The kind and size are checked on ``stat`` before the file is opened (opening a FIFO would
    block, reading ``/dev/zero`` would never end), then again on the open descriptor (the path
    may have been replaced in between); at most ``max_bytes + 1`` bytes are read, so a file
    that lies about its size (or grows) is refused too.
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
                raise _Refused(f"has a duplicate key {_shown(key)} in one object")
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
        raise _Refused(f"has a number out of range: {_shown(text)}")
    return value


def _constant(text: str) -> Any:
    raise _Refused(f"has {text}, which is not a JSON number")


def _parse(data: bytearray, where: str) -> Any:
    long_digits = b"9" * 19 in data.translate(_DIGITS_AS_NINES)  # faster than a regex
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{where} is not UTF-8 text (byte {e.start})") from None
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_object,
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
    else:  # the hooks checked every number; only the nesting is left to check
        _check_depth(doc, where)
    return doc


# --------------------------------------------------------------------------------------------
# Reading: the document


def _path_text(path: tuple[Any, ...]) -> str:
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif out and key.isidentifier():
            out += f".{key}"
        else:
            out += f"[{printable(repr(key), _SHOWN)}]" if out else printable(key, _SHOWN)
    return out or "the document"


def check_json(doc: Any, where: str, *, surrogates: bool = True) -> None:
    """Check that ``doc`` is plain JSON a manifest can be: nesting at most :data:`MAX_DEPTH`,
    objects with str keys, integers in ``(-2**63, 2**63)``, finite floats, and (unless
    ``surrogates`` is False: the text had no surrogate escape) no lone surrogate.

    Iterative, so no input can exhaust the stack here.

    Raises:
        ManifestError: naming ``where`` and the place of the first offending value.
    """
    # The document is the only value of a wrapper at depth 0 whose path is None.
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [([doc], 0, None)]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            at = printable(_at(path), 2 * _SHOWN)
            raise ManifestError(f"{where} nests deeper than {MAX_DEPTH} levels at {at}")
        is_dict = type(node) is dict
        for key, value in node.items() if is_dict else enumerate(node):
            if is_dict and (type(key) is not str or (surrogates and _SURROGATE.search(key))):
                raise ManifestError(f"{where} has an invalid key at {_at(path)}: {_shown(key)}")
            kind = type(value)
            if kind is dict or kind is list:
                stack.append((value, depth + 1, () if path is None else (*path, key)))
            elif kind is str:
                if surrogates and _SURROGATE.search(value):
                    raise ManifestError(
                        f"{where} has a lone surrogate at {_at(path, key)}: {_shown(value)}"
                    )
            elif kind is int:
                if not -INT_LIMIT < value < INT_LIMIT:
                    raise ManifestError(
                        f"{where} has an integer out of range at {_at(path, key)}: {_shown(value)}"
                    )
            elif kind is float:
                if not math.isfinite(value):
                    raise ManifestError(
                        f"{where} has a number out of range at {_at(path, key)}: {value}"
                    )
            elif value is not None and kind is not bool:
                raise ManifestError(
                    f"{where} has a {kind.__name__} at {_at(path, key)}, not a JSON value"
                )


def _check_depth(doc: Any, where: str) -> None:
    """The nesting part of :func:`check_json` alone, walking containers only."""
    level = [doc] if type(doc) in _CONTAINERS else []
    depth = 0
    while level:  # one level of containers at a time, in one comprehension (C-level loops)
        depth += 1
        if depth > MAX_DEPTH:
            check_json(doc, where)  # names the place
        level = [
            v
            for node in level
            for v in (node.values() if type(node) is dict else node)
            if type(v) in _CONTAINERS
        ]


def _at(path: tuple[Any, ...] | None, *key: Any) -> str:
    """The place of a value for a message: ``path`` (None: the wrapper of the document), and
    ``key`` in it."""
    if path is None:
        return "the document"
    return _path_text((*path, *key))


def _threshold(thresholds: Mapping[str, Any], key: str) -> Any:
    if key not in thresholds:
        raise ValueError(f"thresholds lacks {key}")
    value = thresholds[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"thresholds.{key} must be a number, got {_shown(value)}")
    return SETTINGS[key].resolve(value)


def _evaluate_again(doc: Mapping[str, Any]) -> Manifest:
    """The manifest that ``evaluate()`` makes of ``doc``'s data under ``doc``'s thresholds and
    pool-size source: what ``doc`` must be.

    Raises:
        ValueError: the data or the inputs of the evaluation (thresholds, pool size) are
            malformed; the message names the field.
    """
    norm = normalize(doc)
    thresholds = doc["thresholds"]
    if not isinstance(thresholds, dict):
        raise ValueError(f"thresholds must be an object, got {type(thresholds).__name__}")
    hot_pct = _threshold(thresholds, "hot_lock_threshold_pct")
    ratio = _threshold(thresholds, "starvation_ratio")
    # The nominal size is the data's (an executor's) when it has one; else it was an argument
    # or the environment's at evaluation, which only the manifest's own fields still say; else
    # the workers observed.
    nominal, source = doc["nominal_pool_size"], doc["pool_size_source"]
    pool_size: int | None = None
    if norm["pool"]["nominal"] is None and source != "observed":
        if type(nominal) is not int or nominal < 1:  # noqa: E721
            raise ValueError(f"nominal_pool_size must be an int >= 1, got {_shown(nominal)}")
        if not isinstance(source, str):
            raise ValueError(f"pool_size_source must be a str, got {_shown(source)}")
        pool_size = nominal
    return evaluate_normalized(norm, hot_pct, ratio, pool_size, str(source))


# The fields a disagreement is reported on first: what a successor acts on.
_FIRST = ("verdict", "recommended_pool_size", "nominal_pool_size", "pool_size_source")


def _difference(stored: Any, expected: Any, path: tuple[Any, ...]) -> str | None:
    """The first place where ``stored`` differs from ``expected`` (JSON values), as a phrase;
    None when they are the same JSON (type-exact: ``1`` is not ``1.0``, nor ``true``)."""
    if type(stored) is dict and type(expected) is dict:
        keys = sorted(set(stored) | set(expected))
        if not path:
            keys = [k for k in _FIRST if k in keys] + [k for k in keys if k not in _FIRST]
        for key in keys:
            if key not in expected:
                return f"{_path_text((*path, key))} is not a field its data gives"
            if key not in stored:
                return f"{_path_text((*path, key))} is missing"
            found = _difference(stored[key], expected[key], (*path, key))
            if found:
                return found
        return None
    if type(stored) is list and type(expected) is list:
        for i, (a, b) in enumerate(zip(stored, expected, strict=False)):
            found = _difference(a, b, (*path, i))
            if found:
                return found
        if len(stored) == len(expected):
            return None
    elif type(stored) is type(expected) and repr(stored) == repr(expected):
        return None
    return f"{_path_text(path)} is {_shown(stored)}, its data gives {_shown(expected)}"


def check_doc(doc: object, where: str) -> Manifest:
    """Check a manifest document and return it as a :class:`Manifest`.

    In order: plain JSON within the limits (:func:`check_json`), the schema, every field, the
    digest, the data (strictly typed), then the derived fields: the data is evaluated again
    under the manifest's own thresholds and pool-size source, and the result must equal the
    document exactly. Floats are compared exactly (as their JSON text): evaluation is
    deterministic IEEE-754 arithmetic (correctly rounded division and ``round``), and JSON
    writes a float's shortest round-tripping repr, so a manifest read back gives the very same
    floats; any other value was not computed from this data.

    Args:
        doc: the parsed JSON (or a dict given to ``merge_manifests``).
        where: how messages name it (``manifest path/to/file.json``).

    Raises:
        ManifestError: one line naming ``where`` and the offending field or value.
    """
    check_json(doc, where)
    return _check_document(doc, where)


def _check_document(doc: Any, where: str) -> Manifest:
    """:func:`check_doc` of a document whose JSON is checked already."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"{where} has schema {_shown(doc.get('schema'))}, expected {SCHEMA!r}")
    missing = [k for k in REQUIRED_FIELDS if k not in doc]
    if missing:
        raise ManifestError(f"{where} lacks field(s): {', '.join(missing)}")
    digest = doc["manifest_digest"]
    if digest != compute_digest(doc):
        raise ManifestError(f"{where} was edited: its manifest_digest does not match its content")
    try:
        manifest = _evaluate_again(doc)
    except (ValueError, TypeError) as e:
        raise ManifestError(printable(f"{where} is invalid: {e}", _MESSAGE_LIMIT)) from None
    if manifest.manifest_digest != digest:
        expected = manifest.to_dict()
        del expected["manifest_digest"]
        stored = {k: v for k, v in doc.items() if k != "manifest_digest"}
        found = _difference(stored, expected, ()) or "a field differs from what its data gives"
        raise ManifestError(
            printable(f"{where} does not agree with its data: {found}", _MESSAGE_LIMIT)
        )
    return manifest


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
    if type(max_bytes) is not int:  # noqa: E721
        raise TypeError(f"max_bytes must be an int, got {max_bytes!r}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    where = f"manifest {printable(os.fspath(path), None)}"
    data = _read(path, where, max_bytes)
    return _check_document(_parse(data, where), where)
