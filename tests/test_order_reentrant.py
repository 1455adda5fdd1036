"""The lock-order graph read by a reader that runs inside its own thread's update.

A signal handler or a finalizer runs between any two bytecodes; the graph's lock is re-entrant,
so such a reader (the SIGTERM handler evaluating the manifest) can see the graph mid-update, or
an update can complete between the reader's copies. Every snapshot must still satisfy what the
manifest's reader checks: each cycle's edges are among the edges, and the edges close a cycle
exactly when a cycle is reported (the stress test in test_reentrancy once broke it).
"""

from __future__ import annotations

import sys

from otel_lockwatch.manifest._data import lock_order
from otel_lockwatch.record._order import LockOrderGraph
from otel_lockwatch.record._witness import EdgeWitness


def witness(a: str, b: str) -> EdgeWitness:
    return EdgeWitness(a, b, "worker", (f"m:{a}:1", f"m:{b}:2"), "2026-12-01T00:00:00.000Z")


class ReadsInsideRecord(LockOrderGraph):
    """Reads itself right after an edge is inserted, before its cycle is kept: where a handler
    lands when the signal arrives inside ``add_edge``."""

    __slots__ = ("snapshots",)

    def _record(self, holding, acquiring, w):
        super()._record(holding, acquiring, w)
        self.snapshots.append(self.to_json())


def test_a_reader_inside_add_edge_sees_a_consistent_graph():
    graph = ReadsInsideRecord()
    graph.snapshots = []
    graph.add_edge("A", "B", witness("A", "B"))
    assert graph.add_edge("B", "A", witness("B", "A")) is not None  # closes A -> B -> A
    inside = graph.snapshots[-1]
    lock_order(inside)  # raises on an inconsistent snapshot
    assert [(e["holding"], e["acquiring"]) for e in inside["edges"]] == [("A", "B")]
    assert inside["cycles"] == []
    after = graph.to_json()
    lock_order(after)
    assert len(after["edges"]) == 2 and len(after["cycles"]) == 1


def test_an_update_between_the_readers_copies_is_not_half_seen():
    """A whole add_edge runs between the reader's copy of the cycles and its copy of the
    edges, as a handler does between two bytecodes: placed there by a trace function, on the
    first line of ``to_json`` that runs with the cycles copied and the edges not yet."""
    graph = LockOrderGraph()
    graph.add_edge("A", "B", witness("A", "B"))
    graph.add_edge("B", "A", witness("B", "A"))
    graph.add_edge("C", "D", witness("C", "D"))
    added = []

    def between_the_copies(frame, event, arg):
        names = frame.f_locals
        if event == "line" and not added and "cycles" in names and "witnesses" not in names:
            added.append(graph.add_edge("D", "C", witness("D", "C")))  # closes C -> D -> C
        return between_the_copies

    def calls(frame, event, arg):
        return between_the_copies if frame.f_code is LockOrderGraph.to_json.__code__ else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        snapshot = graph.to_json()
    finally:
        sys.settrace(before)
    assert len(added) == 1 and added[0] is not None  # the update ran during the copy
    lock_order(snapshot)
    assert len(snapshot["edges"]) == 4 and len(snapshot["cycles"]) == 2
