"""The session: one owner of lockwatch's state, one fork handler in a documented order.

``otel_lockwatch._session`` holds the process's parts (the recorder, the outbox) and the session
of the ``instrument()`` in force; nothing else in the package keeps a module-level instance of
its own classes, and nothing else registers a fork handler.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otel_lockwatch import LockwatchInstrumentor, _session
from otel_lockwatch._session import DISTRIBUTED, OUTBOX, RECORDER
from otel_lockwatch.capture._fast_path import SPEEDUPS
from otel_lockwatch.record._lock_class import lock_class

PACKAGE = Path(__file__).resolve().parent.parent / "otel_lockwatch"
#: Module-level instances of the package's own classes that are constants: sentinels.
CONSTANTS = {("manifest/_merge.py", "_DIFFER")}


def _modules() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE)): ast.parse(p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
        if "_bootstrap" not in p.parts
    }


def _package_classes(modules: dict[str, ast.Module]) -> set[str]:
    return {
        node.name
        for tree in modules.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def test_no_module_level_instance_of_a_package_class_outside_the_session():
    """``NAME = SomeClass()`` at a module's top level, for a class of this package, is state with
    an owner of its own: only the session module has such (the recorder, the outbox)."""
    modules = _modules()
    classes = _package_classes(modules)
    found = []
    for path, tree in modules.items():
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not isinstance(value, ast.Call):
                continue
            func = value.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in classes:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and (path, target.id) not in CONSTANTS:
                    found.append(f"{path}: {target.id} = {name}()")
    assert [f for f in found if not f.startswith("_session.py")] == []
    assert sorted(f.split(":")[1].split("=")[0].strip() for f in found) == [
        "OUTBOX",
        "PROCESS",
        "RECORDER",
        "THRESHOLDS",
    ]


def test_one_fork_handler():
    """``os.register_at_fork`` is called once in the package: by the session module."""
    calls = []
    for path, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "register_at_fork":
                calls.append((path, node.lineno))
    assert [path for path, _ in calls] == ["_session.py"]


FORK_PARTS_SCRIPT = """
import sys
# The exit hooks, the collection, then the rest: an import order unlike the fork order.
from otel_lockwatch.telemetry import _exit_hooks
from otel_lockwatch.capture import _collection, _multiprocess
from otel_lockwatch.telemetry import _exit
from otel_lockwatch import _session
print(",".join(_session.fork_parts()))
"""


def test_the_fork_order_is_the_documented_one_whatever_the_import_order():
    out = subprocess.run(
        [sys.executable, "-c", FORK_PARTS_SCRIPT], capture_output=True, text=True, check=True
    ).stdout.strip()
    expected = [
        "recorder",
        "lock classes",
        "outbox",
        "distributed",
        "fast path" if SPEEDUPS else "collection",
        "multiprocess",
        "exit hooks",
        "exporter",
    ]
    assert out.split(",") == expected
    assert [p for p in _session.FORK_ORDER if p in expected] == expected


def test_an_unknown_fork_part_is_refused():
    with pytest.raises(ValueError, match="'cache'"):
        _session.at_fork("cache", after_in_child=lambda: None)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_runs_every_part():
    """In the child: one worker (the forking thread, its held stack kept), nothing recorded by
    the parent's other threads, the session's exporter with no write of its own yet."""
    code = """
import os, sys, threading
from otel_lockwatch import LockwatchInstrumentor, _session
from otel_lockwatch._session import RECORDER
LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
lock = threading.Lock()
other = threading.Thread(target=lambda: [lock.acquire(), lock.release()], name="other")
other.start(); other.join()
held = threading.Lock()
held.acquire()
pid = os.fork()
if pid == 0:
    names = sorted({s.worker for s in RECORDER.states})
    ok = names == [threading.current_thread().name]
    ok = ok and len(RECORDER.thread_state().held) == 1
    exporter = _session.current().exporter
    ok = ok and exporter.writes == 0 and exporter.last_path is None
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
held.release()
print(os.waitstatus_to_exitcode(status))
"""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run(
        [sys.executable, "-c", code, os.devnull + ".json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.stdout.strip() == "0", out.stderr


def test_a_session_per_instrument(tmp_path):
    """instrument() begins a session holding its options, emitter, exporter and processors;
    uninstrument() ends it; the next instrument() has a session of its own over the same
    recorder and outbox (the process's)."""
    from opentelemetry.test.test_base import TestBase

    tracer_provider, _ = TestBase.create_tracer_provider()
    instrumentor = LockwatchInstrumentor()
    assert _session.current() is None
    instrumentor.instrument(
        tracer_provider=tracer_provider,
        manifest_path=str(tmp_path / "m.json"),
        checkpoint_interval_s=0,
        pool_size=3,
    )
    try:
        first = _session.current()
        assert first is not None
        assert first.options.pool_size == 3 and instrumentor.options is first.options
        assert first.recorder is RECORDER and first.outbox is OUTBOX
        assert first.distributed is DISTRIBUTED and first.graph is RECORDER.graph
        assert first.emitter.running and first.exporter is not None
        assert len(first.processors) == 2  # the held-lock span processor and the front one
    finally:
        instrumentor.uninstrument()
    assert _session.current() is None and instrumentor.options is None
    assert not first.emitter.running and first.exporter is None and first.processors == []
    instrumentor.instrument(tracer_provider=tracer_provider, manifest=False)
    try:
        second = _session.current()
        assert second is not first and second.recorder is RECORDER
    finally:
        instrumentor.uninstrument()
        _session.discard()


def test_discard_forgets_every_part(watched):
    """discard(): the recorder (with its graph and distributed record) and the outbox's counts."""
    lock = threading.Lock()
    with lock:
        pass
    DISTRIBUTED.release_failed(lock_class("a-redis-lock", "redis.Lock"), "not_owned")
    OUTBOX.failed(RuntimeError("counted"))
    assert RECORDER.snapshot()["locks"] and OUTBOX.errors
    _session.discard()
    snapshot = RECORDER.snapshot()
    assert snapshot["locks"] == {} and OUTBOX.errors == 0
