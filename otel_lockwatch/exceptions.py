"""The exceptions otel-lockwatch raises.

Every class here is public and re-exported from :mod:`otel_lockwatch`. Each
docstring says when it is raised. Errors about a caller's arguments are the
built-in ``TypeError`` / ``ValueError`` with a message naming the value.
"""

from __future__ import annotations

__all__ = [
    "LockwatchError",
    "ManifestError",
    "PotentialDeadlockError",
    "SectionReentryError",
    "SectionTimeout",
]


class LockwatchError(Exception):
    """Base class of the errors that are otel-lockwatch's own."""


class SectionTimeout(LockwatchError, TimeoutError):
    """Raised by ``lock()`` / ``lock_many()`` when a section is not acquired within ``timeout``."""

    def __init__(self, name: str, index: int, timeout: float) -> None:
        self.name = name
        self.index = index
        self.timeout = timeout
        super().__init__(f"section {index} of {name!r} not acquired within {timeout!r} s")

    def __reduce__(self):  # keep pickling (multiprocessing) exact
        return (type(self), (self.name, self.index, self.timeout))


class SectionReentryError(LockwatchError, RuntimeError):
    """Raised when a thread (or task) blocks on a section it already holds, instead of hanging.

    The key may be the same one, or another key whose hash collides into the same section.
    """

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        super().__init__(
            f"section {index} of {name!r} is already held by the caller; "
            "acquiring it again would deadlock"
        )

    def __reduce__(self):
        return (type(self), (self.name, self.index))


class PotentialDeadlockError(LockwatchError, RuntimeError):
    """Raised, under ``OTEL_PYTHON_LOCKWATCH_ON_CYCLE=raise``, before a blocking acquire that would
    close a cycle in the lock-order graph. The lock is left not acquired.

    ``cycle`` holds the lock names; ``report`` the lockdep-style text of the message.
    """

    def __init__(self, report: str, cycle: tuple[str, ...] = ()) -> None:
        self.report = report
        self.cycle = tuple(cycle)
        super().__init__(report)

    def __reduce__(self):
        return (type(self), (self.report, self.cycle))


class ManifestError(LockwatchError, ValueError):
    """Raised by ``load_manifest`` (and ``merge_manifests`` for its inputs) when a manifest
    cannot be trusted: a missing or unreadable file; not a regular file (a FIFO, a device, a
    directory); larger than ``max_bytes``; not UTF-8 JSON; a duplicate key, nesting past 32
    levels, a number out of range, a lone surrogate; another schema or a missing field; a digest
    that does not match its content (an edited manifest); malformed data; or derived fields that
    its data does not give. Also by ``merge_manifests`` when merged counts would leave the range
    a manifest may hold. The message is one printable line naming the file and the field or
    value; the command line reports it with exit status 2."""
