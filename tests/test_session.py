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
from otel_lockwatch._settings import Options
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
        "exporter",
        "exit hooks",
    ]
    assert out.split(",") == expected
    assert [p for p in _session.FORK_ORDER if p in expected] == expected


def test_an_unknown_fork_part_is_refused():
    with pytest.raises(ValueError, match="'cache'"):
        _session.at_fork("cache", after_in_child=lambda: None)


def _forking_script(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` (a script that forks, and prints its child's exit status) on this checkout."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_child_forked_while_the_emitter_emits_still_flushes():
    """The emitter thread holds its emit lock while it emits a record; a child forked meanwhile
    (where that thread does not exist) flushes all the same: the lock is made anew there."""
    code = """
import os, sys, threading
from otel_lockwatch import LockwatchInstrumentor, _session
from otel_lockwatch.telemetry._emitter import Telemetry
entered, release = threading.Event(), threading.Event()
emit = Telemetry.emit
parent = os.getpid()
def slow_emit(self, *record):
    # The parent's emitter thread only: the child's own emitter (started by its first record)
    # must not wait for a release that only the parent sets, or its flush would wait for it.
    if threading.current_thread().name == "otel-lockwatch-emitter" and os.getpid() == parent:
        entered.set()
        release.wait(30)
    emit(self, *record)
Telemetry.emit = slow_emit
LockwatchInstrumentor().instrument(manifest=False, hold_span_threshold_ms=0)
lock = threading.Lock()
with lock:
    pass
entered.wait(30)  # the emitter thread is inside an emit, its lock held
pid = os.fork()
if pid == 0:
    with lock:
        pass
    ok = _session.current().emitter.flush(timeout_s=10)
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
release.set()
print(os.waitstatus_to_exitcode(status))
"""
    out = _forking_script(code)
    assert out.stdout.strip() == "0", out.stderr


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
    out = _forking_script(code, os.devnull + ".json")
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
        assert (RECORDER.pool_size, RECORDER.pool_source) == (3, "env")  # note_pool_size
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


# -- state held outside the session --------------------------------------------------------
#: Module globals a function of their own module rebinds (``global``), with the reason each is
#: not the session's: the process's state of a mechanism below or beside the session, which the
#: C path keeps in its module's state. Options of an ``instrument()`` never: those are the
#: session's (``THRESHOLDS``).
REBOUND = {
    ("capture/_collection.py", "_deferrals"): "the pure path's collector deferrals (the process's)",
    ("capture/_collection.py", "_was_enabled"): "whether the collector was on at the first one",
    ("capture/_collection.py", "_saved_thresholds"): "(3.12) the collector's, while raised",
    ("capture/_collection.py", "_lock"): "the deferrals' lock, made anew in a forked child",
    ("record/_lock_class.py", "_classes_lock"): "the class table's lock, anew in a forked child",
}


def _package_modules_imported(path: str, tree: ast.Module) -> set[str]:
    """The names a module binds to modules of the package (``from . import _order_check``)."""
    here = (PACKAGE / path).parent
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            for part in (node.module or "").split(".") if node.module else []:
                base = base / part
            for alias in node.names:
                if (base / f"{alias.name}.py").exists() or (base / alias.name).is_dir():
                    names.add(alias.asname or alias.name)
    return names


def rebound_globals(modules: dict[str, ast.Module]) -> list[str]:
    """``global X`` assigned in a function, and ``module.X = ...`` (or ``setattr``) on a module
    of the package from another module: state rebound outside the session."""
    found = []
    for path, tree in modules.items():
        if path == "_session.py":
            continue
        imported = _package_modules_imported(path, tree)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            declared = {
                n for node in ast.walk(func) if isinstance(node, ast.Global) for n in node.names
            }
            assigned = {
                target.id
                for node in ast.walk(func)
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)
            }
            for name in sorted(declared & assigned):
                if (path, name) not in REBOUND:
                    found.append(f"{path}: global {name} (in {func.name})")
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
            ):
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in imported
                ):
                    found.append(f"{path}: {target.value.id}.{target.attr} = ...")
    return found


def test_no_module_global_is_rebound_outside_the_session():
    """The options of an ``instrument()`` live in the session (the lock paths read
    ``THRESHOLDS``): no module of another layer keeps a copy in a global it rebinds (``global
    X`` in a function), and none rebinds another module's global (``module.X = ...``)."""
    assert rebound_globals(_modules()) == []


def test_the_rebound_global_check_finds_both_forms():
    """The check above finds what it looks for (so that its empty answer means something)."""
    tree = ast.parse(
        "from . import _order_check\n"
        "KEEP = 32\n"
        "def set_keep(n):\n    global KEEP\n    KEEP = n\n"
        "def set_policy(p):\n    _order_check.ON_CYCLE = p\n"
    )
    assert rebound_globals({"capture/_bookkeeping.py": tree}) == [
        "capture/_bookkeeping.py: global KEEP (in set_keep)",
        "capture/_bookkeeping.py: _order_check.ON_CYCLE = ...",
    ]


def test_a_session_sets_the_thresholds_the_lock_paths_read():
    """instrument()'s options reach the lock paths through the session's THRESHOLDS."""
    instrumentor = LockwatchInstrumentor()
    instrumentor.instrument(
        manifest=False,
        wait_span_threshold_ms=2,
        hold_span_threshold_ms=0.5,
        hold_metric_floor_ms=3,
        on_cycle="ignore",
        contention_points=5,
    )
    try:
        thresholds = _session.current().thresholds
        assert thresholds is _session.THRESHOLDS
        assert (thresholds.wait_span_ns, thresholds.hold_span_ns) == (2_000_000, 500_000)
        assert thresholds.hold_metric_ns == 500_000  # never above the span threshold
        assert thresholds.on_cycle == "ignore" and thresholds.sites_kept == 20
    finally:
        instrumentor.uninstrument()
        _session.THRESHOLDS.set(Options())


# -- tests keep to the layers' public hand-offs --------------------------------------------
TESTS = Path(__file__).resolve().parent
#: Private attributes of the package's modules and objects a test may reach, each with why.
REACHED = {
    # The section arrays' documented hand-off to the instrumentation (ARCHITECTURE.md,
    # "Sections -> instrumentation"): every entry point goes through these two, which the
    # instrumentor replaces on the class; these tests hold the arrays to that.
    ("test_sections.py", "StripedSections._acquire"): "the sections' hand-off",
    ("test_sections.py", "StripedSections._release"): "the sections' hand-off",
    ("test_async_sections.py", "AsyncStripedSections._acquire"): "the sections' hand-off",
    ("test_async_sections.py", "AsyncStripedSections._release"): "the sections' hand-off",
}


def _is_package_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _package_names(tree: ast.Module) -> dict[str, tuple[str, bool]]:
    """The names a test binds to the package's modules and objects: each to its dotted path,
    and whether every access counts (an import, an object the test module makes at its top
    level: ``RECORDER = Recorder()``) or only a store (what a test function makes of a package
    callable, ``s = StripedSections(4)``, is that test's own to read)."""
    names: dict[str, tuple[str, bool]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "otel_lockwatch":
                    bound = alias.asname or alias.name.split(".")[0]
                    names[bound] = (alias.name if alias.asname else "otel_lockwatch", True)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_lockwatch"):
            for alias in node.names:
                names[alias.asname or alias.name] = (f"{node.module}.{alias.name}", True)
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            root = node.value.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in names:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in names:
                        names[target.id] = (f"{names[root.id][0]}()", id(node) in top)
    return names


def private_reaches(name: str, tree: ast.Module) -> list[str]:
    """Where a test file reaches a private attribute (``_x``, not a dunder, not a submodule) of
    a module or object of the package: ``from m import _x``; ``X._x``, ``X.y._x``; ``setattr``
    / ``getattr`` / ``monkeypatch.setattr`` / ``delattr`` of ``(X, "_x")`` or of
    ``"otel_lockwatch....._x"`` (of an object a test function made: a store only)."""
    names = _package_names(tree)

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    def reach(node: ast.AST, attr: str, store: bool) -> str | None:
        chain = [attr]
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in names:
            return None
        dotted, strict = names[node.id]
        if not (strict or store):
            return None
        for i, part in enumerate(chain):
            dotted = f"{dotted}.{part}"
            if private(part) and not _is_package_module(dotted):
                return ".".join([node.id, *chain[: i + 1]])
        return None

    found = set()
    for node in ast.walk(tree):
        hit = None
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_lockwatch"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if private(alias.name) and not _is_package_module(dotted):
                    hit = dotted
        elif isinstance(node, ast.Attribute):
            hit = reach(node.value, node.attr, not isinstance(node.ctx, ast.Load))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("setattr", "getattr", "delattr", "hasattr"):
                first, rest = node.args[0], node.args[1:]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    target = first.value
                    if target.startswith("otel_lockwatch.") and private(target.rsplit(".")[-1]):
                        hit = target
                elif rest and isinstance(rest[0], ast.Constant) and private(str(rest[0].value)):
                    hit = reach(first, str(rest[0].value), called in ("setattr", "delattr"))
        if hit is not None and (name, hit) not in REACHED:
            found.add(f"{name}:{node.lineno}: {hit}")
    return sorted(found)


def test_no_test_reaches_a_private_attribute_of_the_package():
    """A test uses a layer's public hand-offs (a method, a constructor's argument, a table it
    documents), never a private field of another layer's module or object: the owner of a
    piece of state is free to change how it keeps it."""
    found = []
    for path in sorted(TESTS.glob("*.py")):
        found += private_reaches(path.name, ast.parse(path.read_text()))
    assert found == []


def test_the_private_reach_check_finds_each_form():
    tree = ast.parse(
        "from otel_lockwatch._session import RECORDER\n"
        "from otel_lockwatch.telemetry import _emitter\n"
        "from otel_lockwatch.record._recorder import Recorder\n"
        "import otel_lockwatch.capture._collection\n"
        "mine = Recorder()\n"
        "RECORDER._register('w')\n"
        "mine.graph._edges\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(_emitter, '_pc', None)\n"
        "    monkeypatch.setattr('otel_lockwatch.telemetry._emitter._sleep', None)\n"
        "    otel_lockwatch.capture._collection._lock\n"
        "    _emitter.Telemetry, RECORDER.__class__, RECORDER.snapshot()\n"
        "    from otel_lockwatch.manifest._data import _lock_order\n"
        "    own = Recorder()\n"
        "    own._by_id, own.tls\n"
        "    own._lock = None\n"
        "    monkeypatch.setattr(own, '_names', set())\n"
    )
    assert private_reaches("test_x.py", tree) == [
        "test_x.py:10: otel_lockwatch.telemetry._emitter._sleep",
        "test_x.py:11: otel_lockwatch.capture._collection._lock",
        "test_x.py:13: otel_lockwatch.manifest._data._lock_order",
        "test_x.py:16: own._lock",
        "test_x.py:17: own._names",
        "test_x.py:6: RECORDER._register",
        "test_x.py:7: mine.graph._edges",
        "test_x.py:9: _emitter._pc",
    ]
