"""The lock-order graph (``record._order``), its witnesses and cycles (``record._witness``) and
the offline search and merge (``record._cycles``): edges, first witnesses, cycles, caps, JSON,
merge, and cycle detection checked against ``graphlib`` over simulated workers."""

from __future__ import annotations

import graphlib
import json
import logging
import threading
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from otel_lockwatch.record._cycles import find_cycles, merge_order_data
from otel_lockwatch.record._order import LockOrderGraph
from otel_lockwatch.record._witness import Cycle, EdgeWitness, utc_timestamp

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def wit(
    a: str,
    b: str,
    worker: str = "w1",
    line: int = 10,
    at: str = "2026-11-30T02:40:00.123Z",
    trace_id: str | None = None,
    span_id: str | None = None,
) -> EdgeWitness:
    return EdgeWitness(
        holding=a,
        acquiring=b,
        worker=worker,
        sites=(f"m:f:{line}", f"m:f:{line + 2}"),
        at=at,
        trace_id=trace_id,
        span_id=span_id,
    )


def recorded(g: LockOrderGraph) -> set[tuple[str, str]]:
    """The edges a graph records, as its JSON (what the manifest gets) lists them."""
    return {(e["holding"], e["acquiring"]) for e in g.to_json()["edges"]}


def classes(g: LockOrderGraph) -> set[str]:
    """The lock classes on a recorded edge."""
    return {name for pair in recorded(g) for name in pair}


def is_cyclic(pairs: Iterable[tuple[str, str]]) -> bool:
    """The offline reference: graphlib's topological sort (a self-edge is a cycle too)."""
    ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for a, b in pairs:
        ts.add(b, a)
    try:
        ts.prepare()
    except graphlib.CycleError:
        return True
    return False


def distances(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """All-pairs shortest path lengths (Floyd-Warshall), an independent reachability reference."""
    pairs = set(pairs)
    nodes = sorted({n for p in pairs for n in p})
    dist = {p: 1 for p in pairs}
    for k in nodes:
        for i in nodes:
            if (i, k) not in dist:
                continue
            for j in nodes:
                if (k, j) in dist:
                    d = dist[(i, k)] + dist[(k, j)]
                    if d < dist.get((i, j), 1 << 30):
                        dist[(i, j)] = d
    return dist


def assert_well_formed(cycle: Cycle, edge_set: set[tuple[str, str]]) -> None:
    """A cycle's edges exist, chain head to tail, and it starts at its smallest name."""
    n = len(cycle.locks)
    assert len(cycle.edges) == n >= 1
    assert len(set(cycle.locks)) == n
    assert cycle.locks[0] == min(cycle.locks)
    for i, e in enumerate(cycle.edges):
        assert (e.holding, e.acquiring) == (cycle.locks[i], cycle.locks[(i + 1) % n])
        assert (e.holding, e.acquiring) in edge_set


# -- cycles --------------------------------------------------------------------------------


def test_two_lock_inversion_is_reported_by_the_closing_edge() -> None:
    """A->B then B->A (another worker): the second edge returns the cycle with both witnesses."""
    g = LockOrderGraph()
    ab, ba = wit("A", "B", "w1", 10), wit("B", "A", "w2", 20)
    assert g.add_edge("A", "B", ab) is None
    cycle = g.add_edge("B", "A", ba)
    assert cycle == Cycle(("A", "B"), (ab, ba))
    assert g.cycles() == [cycle]
    assert cycle.format() == (
        "possible circular locking dependency: A -> B -> A\n"
        "  A -> B: worker 'w1' held A (acquired at m:f:10) and acquired B (at m:f:12), "
        "2026-11-30T02:40:00.123Z\n"
        "  B -> A: worker 'w2' held B (acquired at m:f:20) and acquired A (at m:f:22), "
        "2026-11-30T02:40:00.123Z"
    )


def test_three_lock_cycle_across_three_workers() -> None:
    """A->B, B->C, C->A by three workers: no pair is inverted, the three together are a cycle."""
    g = LockOrderGraph()
    ab, bc, ca = wit("A", "B", "w1"), wit("B", "C", "w2"), wit("C", "A", "w3")
    assert g.add_edge("A", "B", ab) is None
    assert g.add_edge("B", "C", bc) is None
    cycle = g.add_edge("C", "A", ca)
    assert cycle is not None
    assert cycle.locks == ("A", "B", "C")
    assert cycle.edges == (ab, bc, ca)
    assert cycle.format().splitlines()[0] == (
        "possible circular locking dependency: A -> B -> C -> A"
    )


def test_consistent_order_reports_nothing() -> None:
    """A->B, B->C, A->C (one global order) is acyclic."""
    g = LockOrderGraph()
    for a, b in [("A", "B"), ("B", "C"), ("A", "C")]:
        assert g.add_edge(a, b, wit(a, b)) is None
    assert g.cycles() == []
    assert len(g) == 3
    assert classes(g) == {"A", "B", "C"}


def test_the_shortest_of_several_closed_cycles_is_reported() -> None:
    """D->B closes D->B->D and D->B->C->D; the report is the two-lock one."""
    g = LockOrderGraph()
    for a, b in [("B", "C"), ("C", "D"), ("B", "D")]:
        assert g.add_edge(a, b, wit(a, b)) is None
    cycle = g.add_edge("D", "B", wit("D", "B"))
    assert cycle is not None
    assert cycle.locks == ("B", "D")


def test_the_shortest_cycle_wins_over_a_longer_one_found_deeper_first() -> None:
    """Regression guard for a depth-first search: from B the last-inserted branch leads to A in
    three steps (B->X2->Y->A), the first in two (B->X1->A); the report is the shorter cycle."""
    g = LockOrderGraph()
    for a, b in [("B", "X1"), ("B", "X2"), ("X2", "Y"), ("Y", "A"), ("X1", "A")]:
        assert g.add_edge(a, b, wit(a, b)) is None
    cycle = g.add_edge("A", "B", wit("A", "B"))
    assert cycle is not None
    assert cycle.locks == ("A", "B", "X1")
    assert g.would_close_cycle("A", "B", wit("A", "B")) == cycle


def test_nesting_orders_keep_each_class_first_address_order() -> None:
    """A class nested in one address order answers None each time, keeping its first witness;
    the other order answers that witness; classes past the cap are not noted; the graph records
    no edge for any of it (the caller adds the self-edge)."""
    g = LockOrderGraph(max_classes=2)
    up, up_again, down = wit("A", "A", "w1", 10), wit("A", "A", "w2", 20), wit("A", "A", "w3", 30)
    assert g.nestings.order("A") is None
    assert g.nestings.note("A", True, up) is None
    assert g.nestings.note("A", True, up_again) is None
    assert g.nestings.order("A") is True
    assert g.nestings.note("A", False, down) is up  # the first witness of the other order
    assert g.nestings.order("A") is True  # the first order stays
    assert g.nestings.note("B", False, wit("B", "B")) is None
    assert g.nestings.note("C", True, wit("C", "C")) is None  # past max_classes: not noted
    assert g.nestings.order("C") is None
    assert recorded(g) == set()
    with pytest.raises(ValueError, match=r"^witness is for 'A' -> 'B', not 'A' -> 'A'$"):
        g.nestings.note("A", True, wit("A", "B"))


def test_self_edge_is_recursive_locking() -> None:
    """Two locks of one class held at once: a cycle of length 1 with its own wording."""
    g = LockOrderGraph()
    aa = wit("sections:emitter", "sections:emitter", "w1", 30)
    cycle = g.add_edge("sections:emitter", "sections:emitter", aa)
    assert cycle == Cycle(("sections:emitter",), (aa,))
    assert cycle.format() == (
        "possible recursive locking: sections:emitter (two locks of one class held at once; "
        "a second worker taking them in the other order deadlocks)\n"
        "  sections:emitter -> sections:emitter: worker 'w1' held sections:emitter "
        "(acquired at m:f:30) and acquired sections:emitter (at m:f:32), 2026-11-30T02:40:00.123Z"
    )
    assert recorded(g) == {("sections:emitter", "sections:emitter")}


def test_format_names_the_trace_when_known() -> None:
    """The edge line ends with the trace and span ids of the acquisition when it had a span."""
    w = wit("A", "B", trace_id=TRACE, span_id=SPAN)
    assert w.describe().endswith(f", 2026-11-30T02:40:00.123Z, trace {TRACE} span {SPAN}")


def test_first_witness_is_kept() -> None:
    """A repeated edge returns None and keeps its first witness; the edge count does not grow."""
    g = LockOrderGraph()
    first, later = wit("A", "B", "w1", 10), wit("A", "B", "w9", 90)
    assert g.add_edge("A", "B", first) is None
    assert g.add_edge("A", "B", later) is None
    assert g.witness("A", "B") is first
    assert g.edges() == [first]
    assert len(g) == 1


def test_a_cycle_is_reported_once() -> None:
    """Seeing the inverted edge again (any worker) reports nothing new."""
    g = LockOrderGraph()
    g.add_edge("A", "B", wit("A", "B"))
    assert g.add_edge("B", "A", wit("B", "A", "w2")) is not None
    assert g.add_edge("B", "A", wit("B", "A", "w3")) is None
    assert g.add_edge("A", "B", wit("A", "B", "w4")) is None
    assert len(g.cycles()) == 1


def test_a_restored_cycle_is_not_reported_again() -> None:
    """A graph read back from JSON knows its cycles: no duplicates in cycles()."""
    g = LockOrderGraph()
    g.add_edge("A", "B", wit("A", "B"))
    g.add_edge("B", "A", wit("B", "A"))
    restored = LockOrderGraph.from_json(g.to_json())
    assert restored.cycles() == g.cycles()
    assert restored.add_edge("B", "A", wit("B", "A", "w7")) is None
    assert len(restored.cycles()) == 1


def test_canonical_rotation_makes_one_cycle_from_either_side() -> None:
    """The same cycle closed from A or from B starts at A both times."""
    one, two = LockOrderGraph(), LockOrderGraph()
    one.add_edge("B", "C", wit("B", "C"))
    one.add_edge("C", "A", wit("C", "A"))
    c1 = one.add_edge("A", "B", wit("A", "B"))
    two.add_edge("A", "B", wit("A", "B"))
    two.add_edge("C", "A", wit("C", "A"))
    c2 = two.add_edge("B", "C", wit("B", "C"))
    assert c1 is not None and c2 is not None
    assert c1.locks == c2.locks == ("A", "B", "C")
    assert c1 == c2


def test_opposite_directions_are_different_cycles() -> None:
    """A->B->C->A and A->C->B->A share no edge: rotation never turns one into the other."""
    g = LockOrderGraph()
    found = [
        g.add_edge(a, b, wit(a, b))
        for a, b in [("A", "B"), ("B", "C"), ("C", "A"), ("C", "B"), ("B", "A"), ("A", "C")]
    ]
    assert [c.locks for c in found if c is not None] == [
        ("A", "B", "C"),
        ("B", "C"),
        ("A", "B"),
        ("A", "C"),
    ]
    one, two = LockOrderGraph(), LockOrderGraph()
    for a, b in [("A", "B"), ("B", "C")]:
        one.add_edge(a, b, wit(a, b))
    for a, b in [("A", "C"), ("C", "B")]:
        two.add_edge(a, b, wit(a, b))
    c1, c2 = one.add_edge("C", "A", wit("C", "A")), two.add_edge("B", "A", wit("B", "A"))
    assert c1 is not None and c2 is not None
    assert (c1.locks, c2.locks) == (("A", "B", "C"), ("A", "C", "B"))


def test_would_close_cycle_does_not_record() -> None:
    """The raise policy's question: it answers the cycle, records nothing, and answers again."""
    g = LockOrderGraph()
    g.add_edge("A", "B", wit("A", "B"))
    attempt = wit("B", "A", "w2")
    for _ in range(2):
        cycle = g.would_close_cycle("B", "A", attempt)
        assert cycle == Cycle(("A", "B"), (g.edges()[0], attempt))
    assert ("B", "A") not in recorded(g)
    assert len(g) == 1
    assert g.cycles() == []
    assert g.would_close_cycle("A", "C", wit("A", "C")) is None
    assert g.would_close_cycle("C", "C", wit("C", "C")) == Cycle(("C",), (wit("C", "C"),))
    assert classes(g) == {"A", "B"}


def test_would_close_cycle_still_answers_for_a_recorded_cyclic_edge() -> None:
    """After the refused edge is recorded (for the manifest), later attempts are refused too."""
    g = LockOrderGraph()
    g.add_edge("A", "B", wit("A", "B"))
    assert g.add_edge("B", "A", wit("B", "A")) is not None
    again = wit("B", "A", "w5", 50)
    cycle = g.would_close_cycle("B", "A", again)
    assert cycle is not None
    assert cycle.edges[1] is again


def test_witness_for_another_pair_is_refused() -> None:
    """The witness must describe the edge it is added with."""
    g = LockOrderGraph()
    with pytest.raises(ValueError, match=r"^witness is for 'A' -> 'B', not 'A' -> 'C'$"):
        g.add_edge("A", "C", wit("A", "B"))
    with pytest.raises(ValueError, match=r"^witness is for 'A' -> 'B', not 'B' -> 'A'$"):
        g.would_close_cycle("B", "A", wit("A", "B"))
    assert len(g) == 0


def test_cycle_from_edges_validates_and_rotates() -> None:
    """from_edges accepts any starting edge, refuses broken chains and repeated classes."""
    bc, ca, ab = wit("B", "C"), wit("C", "A"), wit("A", "B")
    assert Cycle.from_edges([bc, ca, ab]) == Cycle(("A", "B", "C"), (ab, bc, ca))
    with pytest.raises(ValueError, match=r"^a cycle needs at least one edge, got none$"):
        Cycle.from_edges([])
    with pytest.raises(
        ValueError, match=r"^cycle edges do not chain: A -> B is followed by C -> A$"
    ):
        Cycle.from_edges([ab, ca])
    with pytest.raises(
        ValueError, match=r"^a cycle visits each lock class once, got A -> B -> A -> B$"
    ):
        Cycle.from_edges([ab, wit("B", "A"), ab, wit("B", "A")])


# -- bounds --------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", ["max_classes", "max_edges", "max_cycles"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_caps_must_be_positive_integers(cap: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{cap} must be a positive integer, got {value!r}$"):
        LockOrderGraph(**{cap: value})  # type: ignore[arg-type]


def test_class_cap_drops_new_classes_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Past max_classes a new class is not recorded, truncated is set, one warning says so;
    edges between known classes are still recorded and checked."""
    g = LockOrderGraph(max_classes=3)
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    g.add_edge("A", "B", wit("A", "B"))
    g.add_edge("B", "C", wit("B", "C"))
    assert not g.truncated
    assert g.add_edge("C", "D", wit("C", "D")) is None
    assert g.add_edge("D", "E", wit("D", "E")) is None
    assert g.add_edge("A", "Z", wit("A", "Z")) is None
    assert g.truncated
    assert classes(g) == {"A", "B", "C"}
    assert ("C", "D") not in recorded(g)
    assert g.add_edge("C", "A", wit("C", "A")) is not None
    records = [r for r in caplog.records if r.name == "otel_lockwatch"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.WARNING,
            "lock-order graph reached max_classes=3; new lock classes are not recorded "
            "and cycles through them are not reported",
        )
    ]


def test_edge_cap_drops_new_edges_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Past max_edges a new edge is not recorded (nor its cycle); one warning names the cap."""
    g = LockOrderGraph(max_edges=2)
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    g.add_edge("A", "B", wit("A", "B"))
    g.add_edge("B", "C", wit("B", "C"))
    assert g.add_edge("C", "A", wit("C", "A")) is None
    assert g.add_edge("C", "B", wit("C", "B")) is None
    assert g.truncated
    assert len(g) == 2
    assert g.cycles() == []
    # the raise policy's check still sees the closing edge
    assert g.would_close_cycle("C", "A", wit("C", "A")) is not None
    messages = [r.getMessage() for r in caplog.records if r.name == "otel_lockwatch"]
    assert messages == [
        "lock-order graph reached max_edges=2; new lock-order edges are not recorded "
        "and cycles through them are not reported"
    ]


def test_cycle_cap_returns_but_does_not_keep(caplog: pytest.LogCaptureFixture) -> None:
    """Past max_cycles a new cycle still reaches the policy (returned) but is not kept."""
    g = LockOrderGraph(max_cycles=1)
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    assert g.add_edge("A", "A", wit("A", "A")) is not None
    assert g.add_edge("B", "B", wit("B", "B")) == Cycle(("B",), (wit("B", "B"),))
    assert g.add_edge("C", "C", wit("C", "C")) is not None
    assert [c.locks for c in g.cycles()] == [("A",)]
    assert len(g) == 3
    assert g.truncated
    assert [r.getMessage() for r in caplog.records if r.name == "otel_lockwatch"] == [
        "lock-order graph reached max_cycles=1; further cycles are still reported to the "
        "on-cycle policy but not kept"
    ]
    assert LockOrderGraph.from_json(g.to_json(), max_cycles=1).to_json() == g.to_json()


def test_each_cap_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """Two different caps reached: one warning each, in the order they were reached."""
    g = LockOrderGraph(max_classes=2, max_edges=2)
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    for a, b in [("A", "B"), ("B", "C"), ("B", "A"), ("A", "A"), ("C", "D"), ("B", "B")]:
        g.add_edge(a, b, wit(a, b))
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "lock-order graph reached max_classes=2",
        "lock-order graph reached max_edges=2",
    ]
    assert [(w.holding, w.acquiring) for w in g.edges()] == [("A", "B"), ("B", "A")]


def test_cap_warning_is_logged_outside_the_graph_lock() -> None:
    """Regression: a logging handler that takes locks (every handler does) must not deadlock
    against the graph's own, non-re-entrant lock."""
    g = LockOrderGraph(max_edges=1)
    g.add_edge("A", "B", wit("A", "B"))
    seen: list[int] = []

    class Reader(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(len(g.edges()))  # takes the graph lock

    handler = Reader()
    logger = logging.getLogger("otel_lockwatch")
    logger.addHandler(handler)
    try:
        worker = threading.Thread(target=g.add_edge, args=("B", "C", wit("B", "C")), daemon=True)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "add_edge deadlocked logging the cap warning"
    finally:
        logger.removeHandler(handler)
    assert seen == [1]


def test_graph_does_not_use_the_patchable_lock_factories(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph's lock comes from _thread, so the instrumentation never observes the graph."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the lock-order graph used a threading lock factory")

    monkeypatch.setattr(threading, "Lock", forbidden)
    monkeypatch.setattr(threading, "RLock", forbidden)
    g = LockOrderGraph()
    g.add_edge("A", "B", wit("A", "B"))
    assert g.add_edge("B", "A", wit("B", "A")) is not None
    assert g.would_close_cycle("B", "A", wit("B", "A")) is not None
    LockOrderGraph.from_json(g.to_json())


def test_concurrent_adds_record_every_edge_and_report_each_cycle_once() -> None:
    """Eight threads adding overlapping edge lists at once: the union is recorded, each edge
    once, and the inversions are reported exactly once each."""
    g = LockOrderGraph()
    names = [f"L{i}" for i in range(12)]
    # every thread adds the forward chain, thread t also adds one backward edge
    forward = [(names[i], names[i + 1]) for i in range(11)]
    backward = [(names[t + 3], names[t]) for t in range(8)]
    barrier = threading.Barrier(8)
    results: list[list[Cycle | None]] = [[] for _ in range(8)]

    def run(t: int) -> None:
        barrier.wait()
        for a, b in [*forward, backward[t], *reversed(forward)]:
            results[t].append(g.add_edge(a, b, wit(a, b, f"w{t}")))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert {(w.holding, w.acquiring) for w in g.edges()} == set(forward) | set(backward)
    assert len(g) == 19
    reported = [c for r in results for c in r if c is not None]
    assert len(reported) == len({c.locks for c in reported}) == len(g.cycles())
    assert len(reported) >= 1
    for c in g.cycles():
        assert_well_formed(c, set(forward) | set(backward))


# -- JSON ----------------------------------------------------------------------------------


def test_witness_json_has_exactly_the_contract_keys() -> None:
    w = wit("A", "B", trace_id=TRACE, span_id=SPAN)
    assert w.to_json() == {
        "holding": "A",
        "acquiring": "B",
        "worker": "w1",
        "sites": ["m:f:10", "m:f:12"],
        "at": "2026-11-30T02:40:00.123Z",
        "trace_id": TRACE,
        "span_id": SPAN,
    }
    assert EdgeWitness.from_json(json.loads(json.dumps(w.to_json()))) == w


def test_witness_from_json_refuses_malformed_data() -> None:
    good = wit("A", "B").to_json()
    with pytest.raises(
        ValueError,
        match=r"^edge witness must have the keys \['acquiring', 'at', 'holding', 'sites', "
        r"'span_id', 'trace_id', 'worker'\], got \['acquiring', 'at', 'holding', 'sites', "
        r"'span_id', 'trace_id'\]$",
    ):
        EdgeWitness.from_json({k: v for k, v in good.items() if k != "worker"})
    with pytest.raises(
        ValueError,
        match=r"^edge witness trace_id must be 32 lowercase hex digits or null, "
        r"got 'xyz'$",
    ):
        EdgeWitness.from_json({**good, "trace_id": "xyz"})
    with pytest.raises(ValueError, match=r"^edge witness sites must be two strings, got \['a'\]$"):
        EdgeWitness.from_json({**good, "sites": ["a"]})
    with pytest.raises(ValueError, match=r"^edge witness worker must be a string, got 3$"):
        EdgeWitness.from_json({**good, "worker": 3})
    with pytest.raises(ValueError, match=r"^edge witness must be an object, got \[\]$"):
        EdgeWitness.from_json([])


def test_graph_json_round_trip() -> None:
    """to_json -> JSON text -> from_json -> to_json is the identity, order included."""
    g = LockOrderGraph()
    for i, (a, b) in enumerate([("A", "B"), ("B", "C"), ("C", "A"), ("D", "D"), ("C", "B")]):
        g.add_edge(a, b, wit(a, b, f"w{i}", i * 10, trace_id=TRACE if i % 2 else None))
    data = g.to_json()
    assert set(data) == {"edges", "cycles"}
    assert len(data["cycles"]) == 3
    text = json.dumps(data, sort_keys=True)
    back = LockOrderGraph.from_json(json.loads(text))
    assert back.to_json() == data
    assert back.edges() == g.edges()
    assert back.cycles() == g.cycles()
    assert Cycle.from_json(data["cycles"][0]) == g.cycles()[0]


def test_cycle_json_must_be_canonical_and_match_its_edges() -> None:
    ab, ba = wit("A", "B"), wit("B", "A")
    with pytest.raises(
        ValueError,
        match=r"^cycle \['B', 'A'\] does not match its edges, which give \['A', 'B'\] "
        r"in canonical rotation$",
    ):
        Cycle.from_json({"cycle": ["B", "A"], "edges": [ba.to_json(), ab.to_json()]})
    with pytest.raises(
        ValueError,
        match=r"^a cycle must be an object with the keys \['cycle', 'edges'\], got \['cycle'\]$",
    ):
        Cycle.from_json({"cycle": ["A"]})


def test_graph_from_json_refuses_a_cycle_over_missing_edges() -> None:
    ab, ba = wit("A", "B"), wit("B", "A")
    data = {"edges": [ab.to_json()], "cycles": [Cycle(("A", "B"), (ab, ba)).to_json()]}
    with pytest.raises(
        ValueError, match=r"^cycle A -> B uses the edge B -> A, which is not among the edges$"
    ):
        LockOrderGraph.from_json(data)
    with pytest.raises(ValueError, match=r"^edge A -> B is listed twice$"):
        LockOrderGraph.from_json({"edges": [ab.to_json(), ab.to_json()], "cycles": []})
    with pytest.raises(
        ValueError,
        match=r"^lock-order data must be an object with 'edges' and 'cycles', "
        r"got \['edges'\]$",
    ):
        LockOrderGraph.from_json({"edges": []})


# -- merge ---------------------------------------------------------------------------------


def test_merge_finds_the_cross_process_cycle() -> None:
    """A->B in one process, B->A in another: neither saw a cycle, the merge does."""
    p1, p2 = LockOrderGraph(), LockOrderGraph()
    ab = wit("A", "B", "p1-w1", at="2026-11-30T02:40:00.100Z")
    ba = wit("B", "A", "p2-w1", at="2026-11-30T02:40:00.200Z")
    p1.add_edge("A", "B", ab)
    p2.add_edge("B", "A", ba)
    assert p1.cycles() == p2.cycles() == []
    merged = merge_order_data([p1.to_json(), p2.to_json()])
    assert merged == {
        "edges": [ab.to_json(), ba.to_json()],
        "cycles": [Cycle(("A", "B"), (ab, ba)).to_json()],
    }
    assert LockOrderGraph.from_json(merged).cycles() == [Cycle(("A", "B"), (ab, ba))]


def test_merge_keeps_the_earliest_witness() -> None:
    """One edge seen by two processes keeps the example with the earliest time."""
    late = wit("A", "B", "p1", at="2026-11-30T02:40:00.900Z")
    early = wit("A", "B", "p2", at="2026-11-30T02:40:00.100Z")
    merged = merge_order_data(
        [{"edges": [late.to_json()], "cycles": []}, {"edges": [early.to_json()], "cycles": []}]
    )
    assert merged["edges"] == [early.to_json()]


def test_merge_shows_every_cyclic_edge() -> None:
    """Offline, each edge on some cycle appears in a reported cycle (A->X->B->A included even
    though the shorter A->B->A exists)."""
    pairs = [("A", "B"), ("B", "A"), ("A", "X"), ("X", "B")]
    merged = merge_order_data([{"edges": [wit(a, b).to_json() for a, b in pairs], "cycles": []}])
    assert [c["cycle"] for c in merged["cycles"]] == [["A", "B"], ["A", "X", "B"]]


def test_find_cycles_bound_stops_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    edges = [wit(a, b) for a, b in [("A", "B"), ("B", "A"), ("C", "D"), ("D", "C"), ("E", "E")]]
    assert [c.locks for c in find_cycles(edges, max_cycles=2)] == [("A", "B"), ("C", "D")]
    assert [r.getMessage() for r in caplog.records if r.name == "otel_lockwatch"] == [
        "lock-order cycle search stopped at max_cycles=2; some cyclic edges are not shown "
        "in a cycle"
    ]
    with pytest.raises(ValueError, match=r"^max_cycles must be a positive integer, got 0$"):
        find_cycles(edges, max_cycles=0)


# -- properties ----------------------------------------------------------------------------

CLASSES = "ABCDE"
AT = [f"2026-11-30T02:40:00.{ms:03d}Z" for ms in (100, 200, 300)]

witnesses = st.builds(
    wit,
    a=st.sampled_from(CLASSES),
    b=st.sampled_from(CLASSES),
    worker=st.sampled_from(["w1", "w2", "w3"]),
    line=st.integers(1, 3),
    at=st.sampled_from(AT),
)


def process_data(ws: list[EdgeWitness]) -> dict:
    """One process's lock_order data, as its live graph would write it."""
    g = LockOrderGraph()
    for w in ws:
        g.add_edge(w.holding, w.acquiring, w)
    return g.to_json()


processes = st.lists(st.lists(witnesses, max_size=8).map(process_data), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(datas=processes, data=st.data())
def test_merge_is_order_independent(datas: list[dict], data: st.DataObject) -> None:
    """merge is commutative, associative and idempotent: permutations, groupings and repeats
    of the inputs give the same result."""
    merged = merge_order_data(datas)
    assert merge_order_data(data.draw(st.permutations(datas))) == merged
    k = data.draw(st.integers(0, len(datas)))
    left, right = merge_order_data(datas[:k]), merge_order_data(datas[k:])
    assert merge_order_data([left, right]) == merged
    assert merge_order_data([right, left]) == merged
    assert merge_order_data([merged]) == merged
    assert merge_order_data([*datas, merged]) == merged


@settings(max_examples=150, deadline=None)
@given(datas=processes)
def test_merged_cycles_match_the_offline_check(datas: list[dict]) -> None:
    """The merge has a cycle exactly when graphlib finds one in the union of edges, its cycles
    use the merged witnesses, and every edge on any cycle is shown in one."""
    merged = merge_order_data(datas)
    union = {(e["holding"], e["acquiring"]) for d in datas for e in d["edges"]}
    assert {(e["holding"], e["acquiring"]) for e in merged["edges"]} == union
    assert bool(merged["cycles"]) == is_cyclic(union)
    edge_json = {(e["holding"], e["acquiring"]): e for e in merged["edges"]}
    shown = set()
    for c in merged["cycles"]:
        cycle = Cycle.from_json(c)
        assert_well_formed(cycle, union)
        for e in c["edges"]:
            assert e == edge_json[(e["holding"], e["acquiring"])]
            shown.add((e["holding"], e["acquiring"]))
    dist = distances(union)
    on_a_cycle = {(a, b) for a, b in union if a == b or (b, a) in dist}
    assert shown == on_a_cycle


# Simulated workers. A lock *instance* has a class; two instances may share one (two locks
# created at one site), which is how a self-edge arises. Ops: ("acquire", i) blocks, ("try", i)
# cannot block, ("release", k) releases the k-th held lock (any order).
INSTANCES = 5
ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "acquire", "try", "release"]), st.integers(0, 7)
    ),
    max_size=16,
)


def simulate(worker: str, program: list[tuple[str, int]], cls: list[str]) -> list[EdgeWitness]:
    """The edges the caller derives from one worker's held stack (the rules in the _order
    module docstring): a blocking acquire orders every held lock before the new one; a try adds
    no edge to the tried lock but holds it; re-entry adds nothing; a released lock orders
    nothing."""
    held: list[int] = []
    edges = []
    for step, (op, n) in enumerate(program):
        if op == "release":
            if held:
                held.pop(n % len(held))
            continue
        inst = n % INSTANCES
        if inst in held:  # re-entry (an RLock): nothing
            continue
        if op == "acquire":
            edges += [wit(cls[h], cls[inst], worker, step) for h in held]
        held.append(inst)
    return edges


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cls=st.one_of(  # one class per instance, or shared classes (self-edges)
        st.permutations("ABCDE"),
        st.lists(st.sampled_from("ABCDE"), min_size=INSTANCES, max_size=INSTANCES),
    ),
    programs=st.lists(ops, min_size=2, max_size=5),
    data=st.data(),
)
def test_cycle_reported_exactly_when_offline_check_finds_one(
    cls: list[str], programs: list[list[tuple[str, int]]], data: st.DataObject
) -> None:
    """THE property: feeding the simulated workers' edges in any interleaving, after each edge
    "some cycle was reported" equals graphlib's verdict on the edges so far; an edge reports a
    cycle exactly when it is new and closes one, and that cycle is a shortest one through it."""
    produced = [e for i, p in enumerate(programs) for e in simulate(f"w{i}", p, cls)]
    reported = check_feed(data.draw(st.permutations(produced)))
    event(
        f"cyclic={bool(reported)} self={any(len(c.locks) == 1 for c in reported)} "
        f"long={any(len(c.locks) > 2 for c in reported)}"
    )


@settings(max_examples=300, deadline=None)
@given(feed=st.lists(witnesses, max_size=24))
def test_cycle_reported_exactly_when_offline_check_finds_one_dense(
    feed: list[EdgeWitness],
) -> None:
    """The same property over dense random edge lists, where long cycles are common."""
    reported = check_feed(feed)
    event(f"cyclic={bool(reported)} long={any(len(c.locks) > 2 for c in reported)}")


def check_feed(feed: list[EdgeWitness]) -> list[Cycle]:
    """Feed edges to a graph one by one, checking each answer against the references."""
    g = LockOrderGraph()
    seen: set[tuple[str, str]] = set()
    reported: list[Cycle] = []
    for w in feed:
        pair = (w.holding, w.acquiring)
        new = pair not in seen
        dist = distances(seen)
        seen.add(pair)
        cycle = g.add_edge(w.holding, w.acquiring, w)
        closes = new and (w.holding == w.acquiring or (w.acquiring, w.holding) in dist)
        assert (cycle is not None) == closes
        if cycle is not None:
            reported.append(cycle)
            assert_well_formed(cycle, seen)
            assert w in cycle.edges
            expected_len = 1 if w.holding == w.acquiring else 1 + dist[(w.acquiring, w.holding)]
            assert len(cycle.locks) == expected_len
            assert all(e == g.witness(e.holding, e.acquiring) for e in cycle.edges)
        assert bool(reported) == is_cyclic(seen)
    assert {(e.holding, e.acquiring) for e in g.edges()} == seen
    assert g.cycles() == reported
    assert len({c.locks for c in reported}) == len(reported)
    return reported


# -- helpers -------------------------------------------------------------------------------


def test_utc_timestamp_has_milliseconds_and_z() -> None:
    assert utc_timestamp(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123Z"
    assert utc_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert len(utc_timestamp()) == 24


def test_repr_shows_live_state() -> None:
    g = LockOrderGraph(max_edges=2)
    for a, b in [("A", "B"), ("B", "A"), ("B", "C")]:
        g.add_edge(a, b, wit(a, b))
    assert repr(g) == "<LockOrderGraph 2 classes, 2 edges, 1 cycles, truncated>"
