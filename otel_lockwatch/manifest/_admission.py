"""The successor's side: how many workers may the next pool spawn, given the last manifest.

:func:`may_spawn_pool_size` checks a requested size against a manifest's recommendation and says
why, in one line a log or a deployment check can show; :func:`recommended_workers` is the size to
spawn, from the manifest file if one exists and can be trusted.
"""

from __future__ import annotations

import logging
import os

from ..exceptions import ManifestError
from ._io import DEFAULT_MAX_BYTES, PathLike, load_manifest
from ._model import Manifest

__all__ = ["may_spawn_pool_size", "recommended_workers"]

_log = logging.getLogger(__name__)


def may_spawn_pool_size(manifest: Manifest, requested: int) -> tuple[bool, str]:
    """The successor's admission check: may it spawn ``requested`` workers?

    Args:
        manifest: the predecessor's manifest.
        requested: the pool size the successor wants, an int >= 1.

    Returns:
        ``(True, "POOL_SIZE_ADMISSIBLE: ...")`` when ``requested`` is at most the recommended
        size, else ``(False, "POOL_SIZE_VIOLATION: Requested 16 exceeds recommended 5
        (measured: app.db:make_pool:12 supports 4 workers; verdict HOT_LOCK_DETECTED).")``:
        how the size was derived (``sizing``), and the verdict.

    Raises:
        TypeError: ``manifest`` is not a Manifest or ``requested`` is not an int.
        ValueError: ``requested`` < 1.
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
    if type(requested) is not int:  # noqa: E721
        raise TypeError(f"requested must be an int, got {requested!r}")
    if requested < 1:
        raise ValueError(f"requested must be >= 1, got {requested}")
    rec, verdict = manifest.recommended_pool_size, manifest.verdict.value
    sizing = manifest.sizing
    why = f"verdict {verdict}"
    if isinstance(sizing, dict) and sizing.get("reason"):
        basis = "measured" if sizing.get("basis") == "measured" else "the verdict's share"
        why = f"{basis}: {sizing['reason']}; {why}"
    if requested > rec:
        return False, (
            f"POOL_SIZE_VIOLATION: Requested {requested} exceeds recommended {rec} ({why})."
        )
    return True, f"POOL_SIZE_ADMISSIBLE: Requested {requested} is within recommended {rec} ({why})."


def recommended_workers(path: PathLike, default: int, *, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """The pool size a successor should spawn, from the last manifest at ``path``.

    Returns the manifest's ``recommended_pool_size``; ``default`` when no file exists. A file
    that exists but cannot be trusted (anything :func:`load_manifest` refuses: corrupt, too
    large, not a regular file, another schema, edited, derived fields its data does not give)
    is not trusted and does not crash the successor: a warning naming the reason is logged and
    ``default`` is returned.

    Args:
        path: the manifest file.
        default: the size to use without a (valid) manifest, an int >= 1.
        max_bytes: the largest manifest file read (as for :func:`load_manifest`).

    Raises:
        TypeError: ``default`` is not an int.
        ValueError: ``default`` < 1.
    """
    if type(default) is not int:  # noqa: E721
        raise TypeError(f"default must be an int, got {default!r}")
    if default < 1:
        raise ValueError(f"default must be >= 1, got {default}")
    if not os.path.exists(path):
        return default
    try:
        return load_manifest(path, max_bytes=max_bytes).recommended_pool_size
    except ManifestError as e:
        _log.warning("not trusting the last manifest, using %d workers: %s", default, e)
        return default
