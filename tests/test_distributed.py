"""Distributed locks without a server: patching, and the manifest's new fields.

The behaviour against the real parts (a ``redis-server``, files shared by processes) is in
``test_redis_locks.py`` and ``test_filelock_locks.py``, key templates in
``test_key_templates.py``; here, what can be pinned down exactly.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_lockwatch import LockwatchInstrumentor, Verdict, load_manifest, merge_manifests
from otel_lockwatch._session import OUTBOX
from otel_lockwatch.capture import _patches
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._model import compute_digest
from otel_lockwatch.record._data import merge_data
from otel_lockwatch.record._histogram import LogHistogram
from otel_lockwatch.record._witness import EdgeWitness


def _optional_patches() -> list[Any]:
    return [_patches.Patch(*t) for _, targets in _patches.OPTIONAL for t in targets()]


def test_instrument_uninstrument_patches_redis_and_filelock_and_restores_them():
    """instrument() replaces every redis-py and filelock target; uninstrument() puts back the
    very object that was there (or removes one that was not)."""
    pytest.importorskip("redis")
    pytest.importorskip("filelock")
    absent = object()
    patches = _optional_patches()
    before = [vars(p.owner).get(p.name, absent) for p in patches]
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        during = [vars(p.owner).get(p.name, absent) for p in patches]
        assert all(new is not old for old, new in zip(before, during, strict=True))
    finally:
        inst.uninstrument()
    after = [vars(p.owner).get(p.name, absent) for p in patches]
    assert all(a is b for a, b in zip(before, after, strict=True))


def test_a_library_that_is_not_installed_is_not_patched(monkeypatch):
    """The optional libraries are never required: a missing one is skipped, and one whose
    targets cannot be built (another version) is counted as an internal error and skipped."""

    def broken() -> tuple:
        raise AttributeError("no such class in this version")

    monkeypatch.setattr(
        _patches,
        "OPTIONAL",
        (("otel_lockwatch_no_such_module", broken), ("json", broken)),
    )
    errors = OUTBOX.errors
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        assert OUTBOX.errors == errors + 1  # json is importable: its broken targets counted
    finally:
        inst.uninstrument()


# -- the manifest --------------------------------------------------------------------------------
def _lock(kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "acquisitions": 2,
        "contentions": 1,
        "skipped": 0,
        "timeouts": 0,
        "wait_ns": LogHistogram([0, 5_000_000]),
        "hold_ns": LogHistogram([1_000_000, 1_500_000_000]),
        "workers": {
            "w1": {"acquisitions": 2, "contentions": 1, "wait_ns": 5_000_000, "hold_ns": 0}
        },
        **extra,
    }


def _leased(overruns: int = 1) -> dict[str, Any]:
    return {
        "key_templates": ["lock:order:*"],
        "lease": {
            "overruns": overruns,
            "overrun_ns": 500_000_000 * overruns,
            "overrun_max_ns": 500_000_000 if overruns else 0,
            "workers": {"w1": {"overruns": overruns, "overrun_ns": 500_000_000 * overruns}}
            if overruns
            else {},
        },
        "release_failures": {"not_owned": overruns, "lock_error": 0},
    }


def _data(**locks: dict[str, Any]) -> dict[str, Any]:
    return {
        "locks": locks,
        "workers": {"w1": {"observed_ns": 2_000_000_000, "wait_ns": 5_000_000}},
        "process": {"pid": 7, "service.name": "svc"},
    }


def test_an_overrun_outranks_a_cycle():
    """LEASE_OVERRUN_DETECTED is the verdict whenever an overrun is recorded, above a cycle (an
    exclusion that failed outranks one that might). Nobody waited, so the size is the nominal
    one: a smaller pool would not make the lease longer."""
    data = _data(**{"lock:order:*": _lock("redis.Lock", **_leased())})
    a_b = EdgeWitness("a", "b", "w1", ("m:f:1", "m:f:2"), "2026-01-01T00:00:00.000Z", None, None)
    b_a = EdgeWitness("b", "a", "w1", ("m:g:1", "m:g:2"), "2026-01-01T00:00:00.000Z", None, None)
    data["lock_order"] = merge_data(
        [{"lock_order": {"edges": [a_b.to_json(), b_a.to_json()], "cycles": []}}]
    )["lock_order"]
    m = evaluate(data, pool_size=8)
    assert m.verdict is Verdict.LEASE_OVERRUN_DETECTED
    assert (m.recommended_pool_size, m.sizing["basis"]) == (8, "measured")
    assert m.lease_overruns == [
        {"lock": "lock:order:*", "worker": "w1", "overruns": 1, "overrun_ms": 500.0}
    ]
    assert m.release_failures == [{"lock": "lock:order:*", "not_owned": 1, "lock_error": 0}]
    assert m.pre_deadlock_ordering_witness  # the cycle is still reported


def test_a_lease_without_overruns_changes_nothing():
    data = _data(**{"lock:order:*": _lock("redis.Lock", **_leased(0))})
    m = evaluate(data)
    assert m.verdict is not Verdict.LEASE_OVERRUN_DETECTED
    assert m.lease_overruns == [] and m.release_failures == []


def test_merging_qualifies_overrun_workers_and_adds_the_fields(tmp_path):
    """Two processes' overruns on one class: counts add, templates unite, each worker keeps its
    process; the merged manifest names both."""
    paths = []
    for pid, template in ((11, "lock:order:*"), (12, "lock:order:v*")):
        lock = _lock("redis.Lock", **_leased())
        lock["key_templates"] = [template]
        data = _data(**{"orders": lock})
        data["process"]["pid"] = pid
        path = tmp_path / f"m{pid}.json"
        path.write_text(evaluate(data).to_json(), encoding="utf-8")
        paths.append(path)
    merged = merge_manifests(paths)
    entry = merged.locks["orders"]
    assert entry["key_templates"] == ["lock:order:*", "lock:order:v*"]
    assert entry["lease"]["overruns"] == 2 and entry["release_failures"]["not_owned"] == 2
    assert [o["worker"] for o in merged.lease_overruns] == ["11/w1", "12/w1"]
    assert merged.verdict is Verdict.LEASE_OVERRUN_DETECTED


@given(st.permutations([0, 1, 2]))
def test_merging_the_new_fields_does_not_depend_on_order(order):
    parts = []
    for i in range(3):
        lock = _lock("redis.Lock", **_leased(i % 2))
        lock["key_templates"] = [f"t{i}"]
        parts.append({"locks": {"x": lock}})
    ref = merge_data(parts)["locks"]["x"]
    got = merge_data([parts[i] for i in order])["locks"]["x"]
    for key in ("key_templates", "lease", "release_failures"):
        assert got[key] == ref[key]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda e: e["lease"].update(overrun_max_ns=10**12),
            r"locks\['l'\]\.lease\.overrun_max_ns must be at most its overrun_ns",
        ),
        (
            lambda e: e["lease"]["workers"]["w1"].update(overruns=-1),
            r"locks\['l'\]\.lease\.workers\['w1'\]\.overruns must be an int in \[0, 2\*\*63\), "
            r"got -1",
        ),
        (
            lambda e: e.update(key_templates=["b", "a"]),
            r"locks\['l'\]\.key_templates must be at most 16 distinct str, sorted",
        ),
        (
            lambda e: e["release_failures"].pop("lock_error"),
            r"locks\['l'\]\.release_failures\.lock_error must be an int in \[0, 2\*\*63\), "
            r"got None",
        ),
    ],
)
def test_malformed_distributed_fields_are_refused_with_one_line(tmp_path, change, message):
    doc = evaluate(_data(l=_lock("redis.Lock", **_leased()))).to_dict()
    change(doc["locks"]["l"])
    doc["manifest_digest"] = compute_digest(doc)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ManifestError, match=rf"^manifest .*m\.json is invalid: {message}$"):
        load_manifest(path)


def test_a_schema_2_manifest_still_loads_and_is_evaluated_again(tmp_path):
    """A manifest written before distributed locks (schema 2, no lease fields) loads: its
    derived fields are evaluated again under today's rules, and it is returned as schema 3."""
    doc = evaluate(_data(l=_lock("threading.Lock"))).to_dict()
    for field in ("lease_overruns", "release_failures"):
        del doc[field]
    doc["schema"] = "otel-lockwatch/manifest/2"
    doc["manifest_digest"] = compute_digest(doc)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    m = load_manifest(path)
    assert m.schema == "otel-lockwatch/manifest/4"
    assert m.verdict.value == doc["verdict"] and m.lease_overruns == []


def test_a_forged_verdict_without_overruns_is_refused(tmp_path):
    """The verdict is derived again from the data: claiming an overrun the data lacks fails."""
    doc = copy.deepcopy(evaluate(_data(l=_lock("redis.Lock", **_leased(0)))).to_dict())
    doc["verdict"] = "LEASE_OVERRUN_DETECTED"
    doc["manifest_digest"] = compute_digest(doc)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ManifestError, match=r"does not agree with its data: verdict is"):
        load_manifest(path)


def test_the_report_shows_overruns_and_release_failures(tmp_path, capsys, monkeypatch):
    """``otel-lockwatch report`` names the verdict, each overrun's worker and lock, and the
    refused releases (in a terminal wide enough for each on one line)."""
    monkeypatch.setenv("COLUMNS", "1000")
    from otel_lockwatch.cli import main

    path = tmp_path / "m.json"
    path.write_text(
        evaluate(_data(**{"lock:order:*": _lock("redis.Lock", **_leased())})).to_json(),
        encoding="utf-8",
    )
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "LEASE_OVERRUN_DETECTED" in out
    assert "two workers may have held it at once" in out
    assert "  w1 held lock:order:* past its lease 1 time, 500 ms in all\n" in out
    assert "  lock:order:*: 1 not owned, 0 lock errors\n" in out


def test_the_template_overflow_is_no_node_of_the_lock_order_graph():
    """``(other)`` stands for many unrelated locks: the graph records no edge to or from it,
    and answers no cycle through it (a self-edge included), under either policy."""
    from otel_lockwatch.record._order import OVERFLOW, LockOrderGraph

    def witness(a: str, b: str) -> EdgeWitness:
        return EdgeWitness(a, b, "w", ("m:f:1", "m:f:2"), "2026-01-01T00:00:00.000Z", None, None)

    graph = LockOrderGraph()
    for a, b in ((OVERFLOW, OVERFLOW), (OVERFLOW, "cache"), ("cache", OVERFLOW)):
        assert graph.would_close_cycle(a, b, witness(a, b)) is None
        assert graph.add_edge(a, b, witness(a, b)) is None
    assert graph.edges() == [] and graph.cycles() == [] and len(graph) == 0
    assert graph.add_edge("a", "b", witness("a", "b")) is None
    assert graph.add_edge("b", "a", witness("b", "a")) is not None  # others as before
