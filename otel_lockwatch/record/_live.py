"""Who waits on and who holds each lock class right now (the live gauges' reading), and the
counters' totals (the acquisition and contention counters' reading).

Dashboards want a pile-up while it happens, not only in the manifest at exit. The answer is read
when a metric reader collects, from what the lock paths keep anyway, so the uncontended path
does nothing more for it:

- *holders*: every worker's held stack (kept for the lock-order graph) lists the locks it holds;
  a worker holding two locks of one class (two sections of an array) counts once for it;
- *waiting*: the contended path notes on the worker's state the class it blocks on
  (``WorkerState.waiting``) for as long as the wait lasts; a worker that took the lock at once
  never writes it.

Other threads change both while they are read: each is copied in one C-level step, and the
answer is a moment's view, as a gauge's value is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["counter_totals", "live_counts"]


def live_counts(states: Iterable[Any]) -> dict[tuple[str, str], tuple[int, int]]:
    """``(waiting, holders)`` per ``(lock name, kind)`` over the worker states, with ``(0, 0)``
    for a class that a worker used before and nobody waits on or holds now (so a gauge reads 0
    after a pile-up rather than keeping its last value)."""
    out: dict[tuple[str, str], list[int]] = {}
    for state in states:
        for cls in list(state.stats):
            out.setdefault((cls.name, cls.kind), [0, 0])
        waiting = state.waiting
        if waiting is not None:
            out.setdefault((waiting.name, waiting.kind), [0, 0])[0] += 1
        for key in {(e.lock_class.name, e.lock_class.kind) for e in list(state.held)}:
            out.setdefault(key, [0, 0])[1] += 1
    return {key: (w, h) for key, (w, h) in out.items()}


def counter_totals(states: Iterable[Any]) -> dict[tuple[str, str, str], int]:
    """Counter totals over the worker states by ``(lock name, kind, outcome)``: acquired,
    skipped, timed_out, and the contentions as ``contended``."""
    out: dict[tuple[str, str, str], int] = {}
    for state in states:
        for cls, s in list(state.stats.items()):
            for outcome, n in (
                ("acquired", s.acquisitions),
                ("skipped", s.skipped),
                ("timed_out", s.timeouts),
                ("contended", s.contentions),
            ):
                if n:
                    key = (cls.name, cls.kind, outcome)
                    out[key] = out.get(key, 0) + n
    return out
