"""What only a distributed lock has: key templates, leases that ran out, releases that failed.

A Redis lock or a file lock is recorded like any other lock (per-thread ``Stats``: waits, holds,
acquisitions, contentions, timeouts; the held stack; the lock order). Three things have no
counterpart in a local lock, and are kept here, per lock class:

- the **key templates** of its keys (``lock:order:*``): the key with its ids collapsed, never the
  key itself; at most :data:`MAX_TEMPLATES` per class;
- its **lease overruns**: a hold that outlived the lease the lock was taken with (Redis expired
  the key while the holder still worked, so a second worker may have held it too), per worker;
- its **release failures**: a release the lock refused (``LockNotOwnedError``: the lease was
  gone; ``LockError``: nothing to release).

These are rare events on the slow path (an overrun or a failure is already a fault), so they are
counted under one lock, unlike the per-thread statistics of the hot path. :meth:`attach` adds
them to the recorder's snapshot: a lock entry gains ``key_templates``, ``lease`` and
``release_failures`` (``docs/manifest.md``).
"""

from __future__ import annotations

import _thread
from typing import Any

from ._data import FAILURE_KINDS, LEASE_WORKER_FIELDS, MAX_TEMPLATES, WorkerTotals
from ._histogram import LogHistogram
from ._lock_class import LockClass

__all__ = [
    "FAILURE_KINDS",
    "LEASE_WORKER_FIELDS",
    "MAX_TEMPLATES",
    "DistributedRecord",
    "empty_lease",
    "empty_lock",
]

# MAX_TEMPLATES: the key templates kept per lock class. FAILURE_KINDS: how a release failed:
# the lock was not owned any more (its lease ran out, or another client deleted it), or there
# was nothing to release (a LockError). LEASE_WORKER_FIELDS: a worker's overruns on one class.


class _ClassRecord:
    __slots__ = (
        "templates",
        "leased",
        "overruns",
        "overrun_ns",
        "overrun_max_ns",
        "workers",
        "failures",
    )

    def __init__(self) -> None:
        self.templates: set[str] = set()
        self.leased = False  # taken with a lease (a Redis lock with a timeout)
        self.overruns = 0
        self.overrun_ns = 0
        self.overrun_max_ns = 0
        self.workers: dict[str, list[int]] = {}  # worker -> [overruns, overrun_ns]
        self.failures = dict.fromkeys(FAILURE_KINDS, 0)


def empty_lease() -> dict[str, Any]:
    """A lease entry with nothing recorded."""
    return {"overruns": 0, "overrun_ns": 0, "overrun_max_ns": 0, "workers": {}}


def empty_lock(kind: str) -> dict[str, Any]:
    """A lock entry with nothing recorded (a class that only failed to release)."""
    return {
        "kind": kind,
        "acquisitions": 0,
        "contentions": 0,
        "skipped": 0,
        "timeouts": 0,
        "wait_ns": LogHistogram(),
        "hold_ns": LogHistogram(),
        "workers": WorkerTotals({}),
    }


class DistributedRecord:
    """The distributed-lock events of this process, per lock class (the recorder's
    ``distributed``; ``_session.DISTRIBUTED``)."""

    def __init__(self) -> None:
        self._lock = _thread.RLock()
        self._classes: dict[LockClass, _ClassRecord] = {}
        self.leased_classes: set[LockClass] = set()

    def after_fork_in_child(self) -> None:
        """In a forked child (the session's fork handler)."""
        self._lock = _thread.RLock()  # another thread may have held it at the fork
        self._classes = {}  # the child's manifest holds only the child's work
        self.leased_classes.clear()  # the same set: the acquire path keeps a reference to it

    def reset(self) -> None:
        """Forget everything (with the recorder)."""
        with self._lock:
            self._classes = {}
            self.leased_classes.clear()

    def _of(self, cls: LockClass) -> _ClassRecord:
        rec = self._classes.get(cls)
        if rec is None:
            rec = self._classes[cls] = _ClassRecord()
        return rec

    def template(self, cls: LockClass, template: str) -> None:
        """Note a key template of ``cls`` (beyond :data:`MAX_TEMPLATES`, nothing is noted)."""
        with self._lock:
            rec = self._of(cls)
            if template not in rec.templates and len(rec.templates) < MAX_TEMPLATES:
                rec.templates.add(template)

    def leased(self, cls: LockClass) -> None:
        """``cls`` was taken with a lease (noted once per class: :attr:`leased_classes` says
        which are, and is read without the lock on the acquire path)."""
        with self._lock:
            self._of(cls).leased = True
            self.leased_classes.add(cls)

    def overrun(self, cls: LockClass, worker: str, over_ns: int) -> None:
        """A hold of ``cls`` by ``worker`` outlived its lease by ``over_ns``."""
        over_ns = max(0, over_ns)
        with self._lock:
            rec = self._of(cls)
            rec.overruns += 1
            rec.overrun_ns += over_ns
            rec.overrun_max_ns = max(rec.overrun_max_ns, over_ns)
            row = rec.workers.setdefault(worker, [0, 0])
            row[0] += 1
            row[1] += over_ns

    def release_failed(self, cls: LockClass, kind: str) -> None:
        """A release of ``cls`` failed (``kind``: one of :data:`FAILURE_KINDS`)."""
        with self._lock:
            self._of(cls).failures[kind] += 1

    def totals(self) -> dict[tuple[str, str, str], int]:
        """``(lock name, kind, event) -> count`` of ``lease_overrun`` and each failure kind."""
        out: dict[tuple[str, str, str], int] = {}
        with self._lock:
            items = list(self._classes.items())
        for cls, rec in items:
            for event, n in (("lease_overrun", rec.overruns), *rec.failures.items()):
                if n:
                    key = (cls.name, cls.kind, event)
                    out[key] = out.get(key, 0) + n
        return out

    def attach(self, locks: dict[str, Any]) -> None:
        """Add the distributed fields to the lock entries of a snapshot, in place (classes that
        share a name add up)."""
        with self._lock:
            items = [(cls, rec) for cls, rec in self._classes.items()]
        for cls, rec in items:
            entry = locks.get(cls.name)
            if entry is None:
                entry = locks[cls.name] = empty_lock(cls.kind)
            templates = set(entry.get("key_templates", ())) | rec.templates
            entry["key_templates"] = sorted(templates)[:MAX_TEMPLATES]
            failures = entry.setdefault("release_failures", dict.fromkeys(FAILURE_KINDS, 0))
            for kind, n in rec.failures.items():
                failures[kind] += n
            if not (rec.leased or rec.overruns):
                continue  # a lock without a lease (a file lock)
            lease = entry.setdefault("lease", empty_lease())
            lease["overruns"] += rec.overruns
            lease["overrun_ns"] += rec.overrun_ns
            lease["overrun_max_ns"] = max(lease["overrun_max_ns"], rec.overrun_max_ns)
            for worker, (n, ns) in rec.workers.items():
                row = lease["workers"].setdefault(worker, dict.fromkeys(LEASE_WORKER_FIELDS, 0))
                row["overruns"] += n
                row["overrun_ns"] += ns
