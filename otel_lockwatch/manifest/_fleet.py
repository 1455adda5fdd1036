"""A fleet's manifests: the OTLP log record each process sends, the Collector's file of them,
and the inputs of a merge (manifest files, directories, globs, Collector files).

The record. Besides its manifest file, a process sends its manifest's mergeable part as one
OTLP log record whose event name is :data:`EVENT_NAME`; its body is a string, the canonical
JSON (sorted keys, no whitespace) of::

    {"schema": "otel-lockwatch/manifest-record/1",
     "manifest_schema": "otel-lockwatch/manifest/3",
     "instance": "<32 hex digits, new in every process>", "sequence": 1, 2, ...,
     "final": false | true,
     "thresholds": {...the manifest's...}, "data": {...the manifest's data fields...},
     "digest": "<SHA-256 of the canonical JSON of every other field>"}

A process sends one at every checkpoint and one (``final``) at exit, each the whole data so far:
only the latest ``sequence`` of an ``instance`` counts, so a merge keeps that one. The record's
attributes repeat ``instance``, ``sequence`` and ``final`` (so a reader finds each process's
latest record without parsing every body) and add the verdict; none is a lock's key or a path.
A reader takes them typed strictly (an ``intValue`` is an int64, a ``boolValue`` a boolean),
each key once, and refuses a record whose attributes and body disagree.

The Collector's ``file`` exporter writes one JSON line per batch: an OTLP
``ExportLogsServiceRequest`` in protobuf JSON (``resourceLogs[].scopeLogs[].logRecords[]``,
``eventName``, ``body.stringValue``, ``attributes[{key, value}]``; 64-bit integers as strings).
:func:`read_collector_file` reads it in two passes, one line at a time: the first notes the
latest sequence of each instance (a few hundred bytes per process), the second checks and yields
the bodies of those records only. Its memory is one line, what it parses into (refused past
``_io.MAX_EXPANSION`` times its size, before it is parsed) and that index.

Every byte of these inputs is untrusted, as a manifest file is (``_io``): a line, a body or a
field that is not what this module writes stops the merge with one :class:`ManifestError` line
naming the file and the line.
"""

from __future__ import annotations

import fnmatch
import gc
import glob
import hashlib
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, cast

from ..exceptions import ManifestError
from ..record._data import DATA_FIELDS, OPTIONAL_DATA_FIELDS
from ..record._witness import printable
from ._check import check_mergeable_parts, verdict_of
from ._io import (
    DEFAULT_MAX_BYTES,
    PathLike,
    load_mergeable,
    open_regular,
    parse_json,
    parse_sealed,
)
from ._merge import MAX_MERGED_WORKERS, ManifestFold
from ._model import LEGACY_SCHEMAS, SCHEMA, Manifest, canonical_json
from ._otlp import record_attributes_of

__all__ = [
    "ATTR_EVENT_NAME",
    "EVENT_NAME",
    "FILES_PER_JOB",
    "RECORD_SCHEMA",
    "check_output",
    "expand_inputs",
    "fold_inputs",
    "read_collector_file",
    "read_inputs",
    "record_attributes",
    "record_body",
]

#: The event name of a manifest's log record.
EVENT_NAME = "lockwatch.manifest"
#: The schema of a record's body.
RECORD_SCHEMA = "otel-lockwatch/manifest-record/1"
#: The record's attributes.
ATTR_INSTANCE = "lockwatch.manifest.instance"
ATTR_SEQUENCE = "lockwatch.manifest.sequence"
ATTR_FINAL = "lockwatch.manifest.final"
ATTR_VERDICT = "lockwatch.verdict"
#: Where a record sent through opentelemetry-api before 1.35 (no event name) carries it.
ATTR_EVENT_NAME = "event.name"
_BODY_FIELDS = (
    "data",
    "digest",
    "final",
    "instance",
    "manifest_schema",
    "schema",
    "sequence",
    "thresholds",
)
# What a Collector file's lines start with (a manifest file starts otherwise).
_COLLECTOR_PREFIX = b'{"resourceLogs"'


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        canonical_json({k: v for k, v in body.items() if k != "digest"})
    ).hexdigest()


def record_body(manifest: Manifest, instance: str, sequence: int, final: bool) -> str:
    """The body of ``manifest``'s log record (see the module docstring)."""
    doc = manifest.to_dict()
    body: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "manifest_schema": doc["schema"],
        "instance": instance,
        "sequence": sequence,
        "final": final,
        "thresholds": doc["thresholds"],
        "data": {key: doc[key] for key in DATA_FIELDS}
        | {key: doc[key] for key in OPTIONAL_DATA_FIELDS if key in doc},
    }
    body["digest"] = _digest(body)
    return canonical_json(body).decode("utf-8")


def record_attributes(
    manifest: Manifest, instance: str, sequence: int, final: bool
) -> dict[str, Any]:
    """The attributes of ``manifest``'s log record."""
    return {
        ATTR_INSTANCE: instance,
        ATTR_SEQUENCE: sequence,
        ATTR_FINAL: final,
        ATTR_VERDICT: str(manifest.verdict),
    }


# --------------------------------------------------------------------------------------------
# Reading the Collector's file


def _is_hex(text: object, length: int) -> bool:
    return (
        isinstance(text, str) and len(text) == length and all(c in "0123456789abcdef" for c in text)
    )


#: What a record's body and its attributes both say: they must agree.
_SAID = (
    ("instance", ATTR_INSTANCE),
    ("sequence", ATTR_SEQUENCE),
    ("final", ATTR_FINAL),
    ("verdict", ATTR_VERDICT),
)


def _check_body(
    text: object, where: str
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """A record's body checked: ``(normalized data, thresholds, {name: value})`` of the fields
    its attributes repeat (:data:`_SAID`)."""
    if not isinstance(text, str):
        raise ManifestError(f"{where} has no string body")
    raw = text.encode("utf-8", "surrogatepass")
    body, sealed = parse_sealed(raw, f"{where}'s body", "digest")
    if not isinstance(body, dict) or body.get("schema") != RECORD_SCHEMA:
        got = body.get("schema") if isinstance(body, dict) else None
        raise ManifestError(
            f"{where}'s body has schema {printable(repr(got), 80)}, expected {RECORD_SCHEMA!r}"
        )
    missing = [k for k in _BODY_FIELDS if k not in body]
    if missing:
        raise ManifestError(f"{where}'s body lacks field(s): {', '.join(missing)}")
    if body["manifest_schema"] != SCHEMA and body["manifest_schema"] not in LEGACY_SCHEMAS:
        raise ManifestError(
            f"{where}'s body has manifest_schema {printable(repr(body['manifest_schema']), 80)}"
        )
    if not sealed and body["digest"] != _digest(body):
        raise ManifestError(f"{where}'s body was edited: its digest does not match its content")
    instance, sequence = body["instance"], body["sequence"]
    if not _is_hex(instance, 32) or type(sequence) is not int or sequence < 1:  # noqa: E721
        raise ManifestError(f"{where}'s body has an invalid instance or sequence")
    if type(body["final"]) is not bool:  # noqa: E721
        raise ManifestError(f"{where}'s body has a final that is not a boolean")
    if not isinstance(body["data"], dict):
        raise ManifestError(f"{where}'s body has data that is not an object")
    data, thresholds = check_mergeable_parts(body["data"], body["thresholds"], where)
    said = {name: body.get(name) for name, _ in _SAID}
    # The verdict is the data's, evaluated again (as a manifest file's derived fields are); a
    # legacy manifest_schema's is derived under today's rules, so not compared.
    legacy = body["manifest_schema"] != SCHEMA
    said["verdict"] = None if legacy else verdict_of(body["data"], thresholds, where)
    return data, thresholds, said


def _records(doc: Any, where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(place, record)`` of every log record of one line that carries :data:`EVENT_NAME`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceLogs"), list):
        raise ManifestError(f"{where} is not an OTLP logs request (no resourceLogs list)")
    for i, resource in enumerate(doc["resourceLogs"]):
        scopes = resource.get("scopeLogs", []) if isinstance(resource, dict) else None
        if not isinstance(scopes, list):
            raise ManifestError(f"{where}: resourceLogs[{i}] has no scopeLogs list")
        for j, scope in enumerate(scopes):
            records = scope.get("logRecords", []) if isinstance(scope, dict) else None
            if not isinstance(records, list):
                raise ManifestError(f"{where}: resourceLogs[{i}].scopeLogs[{j}] has no logRecords")
            for k, record in enumerate(records):
                if isinstance(record, dict) and _is_manifest_record(record):
                    yield f"resourceLogs[{i}].scopeLogs[{j}].logRecords[{k}]", record


_NAMED = {"key": ATTR_EVENT_NAME, "value": {"stringValue": EVENT_NAME}}


def _is_manifest_record(record: Mapping[str, Any]) -> bool:
    """Named :data:`EVENT_NAME` by its event name, or (sent through an older API) by its
    ``event.name`` attribute."""
    if record.get("eventName") == EVENT_NAME:
        return True
    attributes = record.get("attributes")
    return isinstance(attributes, list) and _NAMED in attributes


def _lines(path: PathLike, where: str, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """The file's non-empty lines, numbered from 1, each refused past ``max_bytes``."""
    fd = open_regular(path, where, 2**63 - 1)
    with os.fdopen(fd, "rb") as f:
        number = 0
        while True:
            try:
                line = f.readline(max_bytes + 1)
            except OSError as e:
                raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
            if not line:
                return
            number += 1
            if len(line) > max_bytes and not line.endswith(b"\n"):
                raise ManifestError(f"{where} line {number} is longer than {max_bytes} bytes")
            if not line.isspace():  # (strip() would copy it)
                yield number, line  # not copied: a line may be 64 MiB


def read_collector_file(
    path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Iterator[tuple[dict[str, Any], dict[str, float]]]:
    """The latest record of each process in a Collector ``file`` exporter's output, as
    ``(normalized data, thresholds)``, one at a time (see the module docstring).

    Args:
        path: the file of JSON lines.
        max_bytes: the longest line read.

    Raises:
        ManifestError: (one line naming the file, the line and the record) the file cannot be
            read, a line is not JSON or not an OTLP logs request, or a manifest record is not
            what a process sends.
    """
    where = f"collector file {printable(os.fspath(path), None)}"
    latest: dict[str, tuple[int, int, str]] = {}  # instance -> (sequence, line, place)
    for number, line in _lines(path, where, max_bytes):
        at = f"{where} line {number}"
        for place, record in _records(parse_json(line, at), at):
            attrs = record_attributes_of(record, f"{at} {place}")
            instance, sequence = attrs.get(ATTR_INSTANCE), attrs.get(ATTR_SEQUENCE)
            for key, valid in (
                (ATTR_INSTANCE, _is_hex(instance, 32)),
                (ATTR_SEQUENCE, type(sequence) is int),  # noqa: E721
                (ATTR_FINAL, type(attrs.get(ATTR_FINAL)) is bool),  # noqa: E721
                (ATTR_VERDICT, type(attrs.get(ATTR_VERDICT)) is str),  # noqa: E721
            ):
                if not valid:
                    fault = "has a malformed attribute" if key in attrs else "lacks the attribute"
                    raise ManifestError(f"{at} {place} {fault} {key}")
            rank = (cast(int, sequence), number, place)  # checked above
            seen = latest.get(cast(str, instance))
            if seen is None or rank > seen:
                latest[cast(str, instance)] = rank
    wanted = {(number, place): instance for instance, (_, number, place) in latest.items()}
    del latest  # (the second pass needs only where each latest record is)
    lines = {number for number, _ in wanted}
    for number, line in _lines(path, where, max_bytes):
        if number not in lines:
            continue
        at = f"{where} line {number}"
        for place, record in _records(parse_json(line, at), at):
            instance = wanted.get((number, place))
            if instance is None:
                continue
            body = record.get("body")
            text = body.get("stringValue") if isinstance(body, dict) else None
            data, thresholds, said = _check_body(text, f"{at} {place}")
            attrs = record_attributes_of(record, f"{at} {place}")
            for name, key in _SAID:
                if said[name] is not None and said[name] != attrs[key]:
                    raise ManifestError(f"{at} {place}: its body and attributes disagree on {name}")
            yield data, thresholds


# --------------------------------------------------------------------------------------------
# The inputs of a merge


def expand_inputs(arguments: Iterable[str]) -> list[str]:
    """The files named by a merge's arguments, in order: a file as itself; a directory as its
    ``*.json`` and ``*.jsonl`` files (sorted, not recursive); a pattern that names no file as
    its matches (``glob``, sorted).

    Raises:
        ManifestError: a directory without such files, or a pattern that matches nothing.
    """
    files: list[str] = []
    for argument in arguments:
        shown = printable(argument, None)
        if os.path.isdir(argument):
            found = sorted(
                os.path.join(argument, name)
                for name in os.listdir(argument)
                if name.endswith((".json", ".jsonl"))
                and os.path.isfile(os.path.join(argument, name))
            )
            if not found:
                raise ManifestError(f"directory {shown} holds no *.json or *.jsonl file")
            files.extend(found)
        elif not os.path.lexists(argument) and glob.has_magic(argument):
            matches = sorted(glob.glob(argument))
            if not matches:
                raise ManifestError(f"{shown} matches no file")
            files.extend(matches)
        else:
            files.append(argument)
    return files


def check_output(arguments: Iterable[str], files: Iterable[str], output: str) -> None:
    """Refuse an output that a merge of ``arguments`` (whose files are ``files``) reads: one of
    its files (the merged manifest would replace an input: a Collector's file, a process's
    manifest), or a ``*.json`` / ``*.jsonl`` file in one of its directories or matching one of
    its patterns (the next merge of the same inputs would read the merged manifest back and
    count its processes twice).

    Raises:
        ManifestError: naming the output and the input it collides with.
    """
    shown = printable(output, None)
    # Where the output will be: its directory resolved, its own name kept (a rename replaces a
    # symbolic link there, not what it points to), and what it resolves to now.
    placed = os.path.join(
        os.path.realpath(os.path.dirname(os.path.abspath(output))), os.path.basename(output)
    )
    places = {placed, os.path.realpath(output)}
    for path in files:
        if os.path.realpath(path) in places or (
            os.path.exists(output) and os.path.samefile(path, output)
        ):
            raise ManifestError(
                f"the output {shown} is an input of the merge ({printable(path, None)}): "
                "write the merged manifest elsewhere"
            )
    if not output.endswith((".json", ".jsonl")):
        return  # no directory nor pattern of a merge reads it
    for argument in arguments:
        where = printable(argument, None)
        if os.path.isdir(argument):
            if os.path.dirname(placed) == os.path.realpath(argument):
                raise ManifestError(
                    f"the output {shown} is in the input directory {where}: the next merge of "
                    "it would read the merged manifest back; write it elsewhere"
                )
        elif not os.path.lexists(argument) and glob.has_magic(argument):
            pattern = os.path.abspath(argument)
            if any(
                fnmatch.fnmatchcase(place, pattern) for place in (placed, os.path.abspath(output))
            ):
                raise ManifestError(
                    f"the output {shown} matches the input pattern {where}: the next merge of "
                    "it would read the merged manifest back; write it elsewhere"
                )


def _is_collector_file(path: str) -> bool:
    where = f"manifest {printable(path, None)}"
    fd = open_regular(path, where, 2**63 - 1)
    try:
        return os.read(fd, len(_COLLECTOR_PREFIX)) == _COLLECTOR_PREFIX
    finally:
        os.close(fd)


#: The fewest files a job of :func:`fold_inputs` takes (a spawned process costs about as much
#: as reading a few dozen manifests).
FILES_PER_JOB = 64


def fold_inputs(
    files: Sequence[str],
    *,
    max_workers: int | None = MAX_MERGED_WORKERS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    jobs: int = 1,
) -> ManifestFold:
    """Every manifest of ``files`` (:func:`read_inputs`) folded into one :class:`ManifestFold`
    (``max_workers``: as for it).

    With ``jobs`` > 1 (and at least :data:`FILES_PER_JOB` files a job), the files are cut into
    ``jobs`` contiguous shares: this process folds the last while as many spawned processes (no
    state of the caller is copied into them) fold the others, then adds their folds to its own
    (:meth:`ManifestFold.add_fold`: a merge depends neither on the order of its inputs nor on
    their grouping). Each holds one fold, so memory is ``jobs`` times a fold's. A share stops at
    its first invalid input; the error raised is the first share's that has one, which is the
    first invalid input of all.

    Raises:
        ManifestError: an input is unreadable or invalid (one line naming it).
    """
    jobs = max(1, min(jobs, len(files) // FILES_PER_JOB))
    if jobs == 1:
        return _fold_share(files, max_workers, max_bytes)
    cuts = [len(files) * k // jobs for k in range(jobs + 1)]
    shares = [files[cuts[k] : cuts[k + 1]] for k in range(jobs)]
    folds: list[ManifestFold | ManifestError] = []
    with ProcessPoolExecutor(jobs - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_fold_share, share, max_workers, max_bytes) for share in shares[:-1]]
        try:
            own: ManifestFold | ManifestError = _fold_share(shares[-1], max_workers, max_bytes)
        except ManifestError as exc:
            own = exc
        for future in futures:
            try:
                folds.append(future.result())
            except ManifestError as exc:
                folds.append(exc)
        folds.append(own)
    for fold in folds:
        if isinstance(fold, ManifestError):
            raise fold
    first = folds[0]
    assert isinstance(first, ManifestFold)
    for fold in folds[1:]:
        first.add_fold(fold)  # type: ignore[arg-type]  # no error among them
    return first


def _fold_share(files: Sequence[str], max_workers: int | None, max_bytes: int) -> ManifestFold:
    # The cyclic collector is paused while the share is read: the parser's tens of thousands of
    # containers per manifest set off its passes, which cost a fifth of the merge's CPU, and
    # what is read is acyclic (freed by reference counting as each manifest is folded).
    collecting = gc.isenabled()
    gc.disable()
    try:
        fold = ManifestFold(max_workers)
        for data, thresholds in read_inputs(files, max_bytes=max_bytes):
            fold.add_data(data, thresholds)
        return fold
    finally:
        if collecting:
            gc.enable()


def read_inputs(
    files: Iterable[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Iterator[tuple[dict[str, Any], dict[str, float]]]:
    """Every manifest of ``files`` as ``(normalized data, thresholds)``, one at a time: a
    manifest file as itself, a Collector file as the latest record of each process in it.

    Raises:
        ManifestError: an input is unreadable or invalid (one line naming it), or reading it
            runs out of memory (a ``MemoryError``: under a limit on the process's memory).
    """
    for path in files:
        collector = _is_collector_file(path)
        try:
            if collector:
                yield from read_collector_file(path, max_bytes=max_bytes)
            else:
                yield load_mergeable(path, max_bytes=max_bytes)
            continue
        except MemoryError:
            pass
        # Raised past the handler, when what the failed read built is freed.
        kind = "collector file" if collector else "manifest"
        raise ManifestError(
            f"{kind} {printable(path, None)} cannot be read: out of memory (the process's memory "
            "is limited, or the input is too large for it)"
        )
