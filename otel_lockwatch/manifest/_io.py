"""The manifest's file: written atomically, read back only as written.

:func:`dump_manifest` writes the JSON to a temporary file in the same directory, flushes and
fsyncs it, then renames it over the target (``os.replace``): a reader sees the previous manifest
or the new one, never a truncated file, and a write interrupted at any point leaves the previous
one intact. :func:`load_manifest` refuses, in one line naming the file, anything this library did
not write as-is: not JSON, another schema, a missing field, a digest that does not match the
content (an edited file), or data that does not check out.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Union

from ..exceptions import ManifestError
from ._data import normalize
from ._model import REQUIRED_FIELDS, SCHEMA, Manifest, Verdict, compute_digest

__all__ = ["PathLike", "check_doc", "dump_manifest", "load_manifest", "write_atomically"]

PathLike = Union[str, "os.PathLike[str]"]


def write_atomically(target: Path, payload: bytes) -> None:
    """Write ``payload`` to ``target`` through a temporary file in the same directory, fsynced,
    then ``os.replace``: a reader sees the old file or the whole new one. On any error the
    temporary file is removed and the old file survives.

    Raises:
        OSError: the file could not be written (its directory must exist).
    """
    directory = target.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with contextlib.suppress(AttributeError, OSError):  # not every platform has fchmod
            os.fchmod(fd, 0o644)
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
    manifest survives. ``{pid}`` in ``path`` is replaced by the process id.

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


def check_doc(doc: object, where: str) -> Manifest:
    """Validate a manifest document (schema, fields, digest, data) and wrap it."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"{where} has schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    missing = [k for k in REQUIRED_FIELDS if k not in doc]
    if missing:
        raise ManifestError(f"{where} lacks field(s): {', '.join(missing)}")
    digest = doc["manifest_digest"]
    try:
        actual = compute_digest(doc)
    except ValueError:  # NaN / Infinity in the document
        actual = None
    if digest != actual:
        raise ManifestError(f"{where} was edited: its manifest_digest does not match its content")
    try:
        normalize(doc)
        Verdict(doc["verdict"])
        rec = doc["recommended_pool_size"]
        if type(rec) is not int or rec < 1:  # noqa: E721
            raise ValueError(f"recommended_pool_size must be an int >= 1, got {rec!r}")
    except ValueError as e:
        raise ManifestError(f"{where} is invalid: {e}") from None
    body = {k: v for k, v in doc.items() if k != "manifest_digest"}
    return Manifest._from_doc(body, digest)


def load_manifest(path: PathLike) -> Manifest:
    """Read a manifest back, refusing anything this library did not write as-is.

    Args:
        path: the manifest file.

    Raises:
        ManifestError: (one line naming the path) the file is missing or unreadable, is not
            JSON, not an object, of another schema, lacks fields, or its digest does not match
            its content (it was edited).
    """
    where = f"manifest {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ManifestError(f"{where} does not exist") from None
    except OSError as e:
        raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ManifestError(
            f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    return check_doc(doc, where)
