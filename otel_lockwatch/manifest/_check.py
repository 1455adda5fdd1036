"""Checking a manifest document: is it what this library writes, and does it hold together?

:func:`check_doc` takes a parsed document (``load_manifest`` reads and parses the file, see
``_io``; ``merge_manifests`` passes the dicts it is given) and returns it as a
:class:`Manifest`, or raises one :class:`ManifestError` line naming the field or value:

- plain JSON within the limits (:func:`check_json`): nesting at most :data:`MAX_DEPTH` levels,
  str keys, integers in ``(-2**63, 2**63)``, finite floats, no lone surrogate. Iterative, so no
  input exhausts the stack, and checked before anything recursive (the digest's encoder) runs;
- the schema and every field;
- the digest: a mismatch is an edit by hand or a damaged file;
- the data, strictly typed (``_data.normalize``), its pool sizes at most
  :data:`MAX_POOL_SIZE`;
- the derived fields. They are a pure function of the data, the thresholds and the nominal pool
  size, and the digest has no key (anyone who can write the file can recompute it), so the data
  is evaluated again under the manifest's own thresholds and pool-size source and the result
  must be the document, field for field. Floats are compared exactly, as their JSON text (so
  ``1``, ``1.0`` and ``true`` differ): evaluation is deterministic IEEE-754 arithmetic made of
  correctly rounded operations (division, ``round``), and JSON writes a float as its shortest
  repr, which reads back to the same float; a manifest this library wrote always agrees with
  its data bit for bit, and any other float was not computed from this data.

What cannot be checked is whether the data is what a run measured: a writer who can write the
file can write any self-consistent manifest. The file's mode is what keeps others from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .._settings import MAX_POOL_SIZE, SETTINGS
from ..exceptions import ManifestError
from ..record._histogram import MERGE_SPEEDUPS
from ..record._witness import printable
from ._data import normalize
from ._evaluate import evaluate_normalized
from ._model import LEGACY_SCHEMAS, REQUIRED_FIELDS, SCHEMA, Manifest, compute_digest

__all__ = [
    "INT_LIMIT",
    "MAX_DEPTH",
    "MAX_POOL_SIZE",
    "check_depth",
    "check_doc",
    "check_document",
    "check_json",
    "check_mergeable",
    "check_mergeable_parts",
    "check_pool_sizes",
    "evaluate_again",
    "shown",
    "verdict_of",
]

#: The deepest nesting of objects and arrays a manifest may have (a manifest nests 7 deep).
MAX_DEPTH = 32
#: Every integer in a manifest is in ``(-INT_LIMIT, INT_LIMIT)``.
INT_LIMIT = 2**63

#: How much of a refused value or of a message a one-line error shows.
_SHOWN = 80
_MESSAGE_LIMIT = 1000
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTAINERS = (dict, list)


def shown(value: Any) -> str:
    """A refused value in a message: its repr, one line, cut past a few dozen characters."""
    if type(value) is int and value.bit_length() > 64:  # repr() may refuse a huge int
        return f"<an int of {value.bit_length()} bits>"
    return printable(repr(value), _SHOWN)


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
                raise ManifestError(f"{where} has an invalid key at {_at(path)}: {shown(key)}")
            kind = type(value)
            if kind is dict or kind is list:
                stack.append((value, depth + 1, () if path is None else (*path, key)))
            elif kind is str:
                if surrogates and _SURROGATE.search(value):
                    raise ManifestError(
                        f"{where} has a lone surrogate at {_at(path, key)}: {shown(value)}"
                    )
            elif kind is int:
                if not -INT_LIMIT < value < INT_LIMIT:
                    raise ManifestError(
                        f"{where} has an integer out of range at {_at(path, key)}: {shown(value)}"
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


def check_depth(doc: Any, where: str) -> None:
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
        raise ValueError(f"thresholds.{key} must be a number, got {shown(value)}")
    return SETTINGS[key].resolve(value)


def check_pool_sizes(norm: Mapping[str, Any]) -> None:
    """Refuse a normalized data part whose pool sizes are above :data:`MAX_POOL_SIZE`.

    Raises:
        ValueError: naming the field and the value.
    """
    pool = norm["pool"]
    for key in ("nominal", "peak_workers"):
        value = pool.get(key)
        if value is not None and value > MAX_POOL_SIZE:
            raise ValueError(f"pool.{key} is {value}, above the largest pool size {MAX_POOL_SIZE}")


def evaluate_again(doc: Mapping[str, Any]) -> Manifest:
    """The manifest that ``evaluate()`` makes of ``doc``'s data under ``doc``'s thresholds and
    pool-size source: what ``doc`` must be.

    Raises:
        ValueError: the data or the inputs of the evaluation (thresholds, pool size) are
            malformed; the message names the field.
    """
    norm = normalize(doc)
    check_pool_sizes(norm)
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
        if type(nominal) is not int or not 1 <= nominal <= MAX_POOL_SIZE:  # noqa: E721
            raise ValueError(
                f"nominal_pool_size must be an int in [1, {MAX_POOL_SIZE}], got {shown(nominal)}"
            )
        if not isinstance(source, str):
            raise ValueError(f"pool_size_source must be a str, got {shown(source)}")
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
    return f"{_path_text(path)} is {shown(stored)}, its data gives {shown(expected)}"


def check_doc(doc: object, where: str) -> Manifest:
    """Check a manifest document and return it as a :class:`Manifest` (see the module
    docstring for the checks, in their order).

    Args:
        doc: the parsed JSON (or a dict given to ``merge_manifests``).
        where: how messages name it (``manifest path/to/file.json``).

    Raises:
        ManifestError: one line naming ``where`` and the offending field or value.
    """
    check_json(doc, where)
    return check_document(doc, where)


def _check_envelope(doc: Any, where: str, *, sealed: bool = False) -> bool:
    """Check a document's type, schema, fields and digest (unless ``sealed``: checked on its
    bytes, ``_io.compact_sealed``); return whether its schema is a legacy one."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object")
    legacy = doc.get("schema") in LEGACY_SCHEMAS
    if doc.get("schema") != SCHEMA and not legacy:
        raise ManifestError(f"{where} has schema {shown(doc.get('schema'))}, expected {SCHEMA!r}")
    missing = [k for k in REQUIRED_FIELDS if k not in doc]
    if missing:
        raise ManifestError(f"{where} lacks field(s): {', '.join(missing)}")
    if not sealed and doc["manifest_digest"] != compute_digest(doc):
        raise ManifestError(f"{where} was edited: its manifest_digest does not match its content")
    return legacy


def check_mergeable_parts(
    data: Mapping[str, Any], thresholds: object, where: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """A data part, normalized, and the two thresholds a merge carries over, checked.

    Raises:
        ManifestError: one line naming ``where`` and the offending field or value.
    """
    try:
        if not isinstance(thresholds, dict):
            raise ValueError(f"thresholds must be an object, got {type(thresholds).__name__}")
        keys = ("hot_lock_threshold_pct", "starvation_ratio")
        norm = normalize(data)
        check_pool_sizes(norm)
        return norm, {k: _threshold(thresholds, k) for k in keys}
    except (ValueError, TypeError) as e:
        raise ManifestError(printable(f"{where} is invalid: {e}", _MESSAGE_LIMIT)) from None


def verdict_of(data: Mapping[str, Any], thresholds: Mapping[str, float], where: str) -> str:
    """The verdict ``evaluate()`` gives a data part that :func:`check_mergeable_parts` took,
    under its two thresholds (it depends on no pool size)."""
    try:
        manifest = evaluate_normalized(
            normalize(data),
            thresholds["hot_lock_threshold_pct"],
            thresholds["starvation_ratio"],
            None,
            "observed",
        )
    except (ValueError, TypeError) as e:  # pragma: no cover - checked by check_mergeable_parts
        raise ManifestError(printable(f"{where} is invalid: {e}", _MESSAGE_LIMIT)) from None
    return str(manifest.verdict)


def check_mergeable(
    doc: Any, where: str, *, sealed: bool = False
) -> tuple[dict[str, Any], dict[str, float]]:
    """What a merge takes of a document whose JSON is checked already: its data, normalized,
    and its two thresholds, after every check of :func:`check_document` (its derived fields
    too, which a merge does not use: it refuses what ``report`` and ``check`` refuse).
    ``sealed``: its digest was checked on its bytes (``_io.compact_sealed``).

    Raises:
        ManifestError: one line naming ``where`` and the offending field or value.
    """
    _check_agreement(doc, where, _check_envelope(doc, where, sealed=sealed))
    return check_mergeable_parts(doc, doc["thresholds"], where)


def check_document(doc: Any, where: str) -> Manifest:
    """:func:`check_doc` of a document whose JSON is checked already (by :func:`check_json`,
    or by the parser's hooks and :func:`check_depth`)."""
    return _check_agreement(doc, where, _check_envelope(doc, where))


def _check_agreement(doc: Any, where: str, legacy: bool) -> Manifest:
    """The manifest a document's data gives, refusing the document unless it is that manifest
    (a legacy schema's derived fields are derived again, not compared)."""
    digest = doc["manifest_digest"]
    try:
        manifest = evaluate_again(doc)
    except (ValueError, TypeError) as e:
        raise ManifestError(printable(f"{where} is invalid: {e}", _MESSAGE_LIMIT)) from None
    if legacy:
        return manifest  # derived again under today's rules: nothing stored is trusted
    stored = {k: v for k, v in doc.items() if k != "manifest_digest"}
    if MERGE_SPEEDUPS is not None:  # one C walk of both, instead of encoding the manifest again
        agrees = MERGE_SPEEDUPS.same_json(manifest._doc, stored)
    else:
        agrees = manifest.manifest_digest == digest
    if agrees:  # the same canonical JSON: the same digest, the stored one (checked)
        return Manifest._from_doc(manifest._doc, digest)
    expected = manifest.to_dict()
    del expected["manifest_digest"]
    found = _difference(stored, expected, ()) or "a field differs from what its data gives"
    raise ManifestError(printable(f"{where} does not agree with its data: {found}", _MESSAGE_LIMIT))
