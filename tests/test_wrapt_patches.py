"""The patch table through wrapt: what is wrapped, that ``uninstrument()`` unwraps exactly that,
and that lockwatch's wrappers compose with another instrumentation's (the OpenTelemetry
instrumentors patch the same way).

A target of ``via=WRAPT`` is wrapped by ``wrapt.wrap_object`` with a ``PatchWrapper`` and
removed by ``wrapt.unwrap_object``; a ``via=SETATTR`` one (the lock path of the in-process
primitives, the C path's callables) is set and put back by the table itself.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import pytest
import wrapt

from otel_lockwatch import LockwatchInstrumentor, _session
from otel_lockwatch._session import RECORDER
from otel_lockwatch.capture import _patches
from otel_lockwatch.manifest._evaluate import evaluate

filelock = pytest.importorskip("filelock")
pytest.importorskip("redis")

ABSENT = object()


def every_patch() -> list[_patches.Patch]:
    """The table and the optional libraries' targets (both are installed here)."""
    return [*_patches.PATCHES, *(_patches.Patch(*t) for _, ts in _patches.OPTIONAL for t in ts())]


def where_defined(owner: Any, name: str) -> Any:
    """The attribute as the class (or module) defines it, unbound: what wrapt wraps."""
    for klass in getattr(owner, "__mro__", (owner,)):
        if name in vars(klass):
            return vars(klass)[name]
    return ABSENT


def attributes(patches: list[_patches.Patch]) -> list[Any]:
    return [vars(p.owner).get(p.name, ABSENT) for p in patches]


def label(patch: _patches.Patch) -> str:
    return f"{getattr(patch.owner, '__qualname__', patch.owner.__name__)}.{patch.name}"


@pytest.fixture
def instrumentor():
    inst = LockwatchInstrumentor()
    yield inst
    if _session.current() is not None:
        inst.uninstrument()
    _session.discard()


def test_the_distributed_and_cross_process_targets_are_wrapped_through_wrapt(instrumentor):
    """Each ``WRAPT`` target becomes a wrapt ``FunctionWrapper`` around the very object the class
    defines (up its MRO); each ``SETATTR`` target is no wrapt proxy. Redis, filelock and
    multiprocessing are among the wrapped ones."""
    patches = every_patch()
    originals = [where_defined(p.owner, p.name) for p in patches]
    instrumentor.instrument(manifest=False)
    wrapped = []
    for patch, original in zip(patches, originals, strict=True):
        now = vars(patch.owner)[patch.name]
        if patch.via == _patches.WRAPT:
            assert isinstance(now, wrapt.FunctionWrapper), label(patch)
            assert now.__wrapped__ is original, label(patch)
            wrapped.append(label(patch))
        else:
            assert not isinstance(now, wrapt.ObjectProxy), label(patch)
    expected = {"Lock.__init__", "Lock.extend", "BaseFileLock.__init__", "SemLock.__init__"}
    assert expected | {"Pool.__init__", "ProcessPoolExecutor.__init__"} <= set(wrapped)


def test_uninstrument_unwraps_to_the_very_objects_and_instrument_works_again(
    instrumentor, tmp_path
):
    """After ``uninstrument()`` every patched attribute is the object that was there (an
    inherited one is inherited again: no copy left on the subclass); a second ``instrument()``
    wraps anew, and a file lock is watched again."""
    patches = every_patch()
    before = attributes(patches)
    for round_ in range(2):
        instrumentor.instrument(manifest=False)
        during = attributes(patches)
        assert [label(p) for p, b, d in zip(patches, before, during, strict=True) if b is d] == []
        lock = filelock.FileLock(str(tmp_path / f"round-{round_}.lock"))
        with lock:
            pass
        instrumentor.uninstrument()
        after = attributes(patches)
        changed = [label(p) for p, b, a in zip(patches, before, after, strict=True) if a is not b]
        assert changed == [], f"round {round_}"
        assert _session.current() is None  # the session, and its patches, ended
        entry = evaluate(RECORDER.snapshot()).to_dict()["locks"]["round-*.lock"]
        assert entry["acquisitions"] == round_ + 1  # the second round's lock shares the class
    # An attribute patched where it was inherited is inherited again.
    assert "release" not in vars(filelock.BaseFileLock)


def test_another_instrumentation_s_wrapper_on_top_survives_uninstrument(instrumentor, tmp_path):
    """A wrapt wrapper put on ``BaseFileLock.__init__`` after lockwatch's stays in place when
    lockwatch uninstruments (lockwatch's is spliced out from under it) and still runs; removing
    it then leaves the original."""
    original = vars(filelock.BaseFileLock)["__init__"]
    calls: list[Any] = []

    def theirs(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        calls.append(instance)
        return wrapped(*args, **kwargs)

    instrumentor.instrument(manifest=False)
    handle = wrapt.wrap_function_wrapper(filelock.BaseFileLock, "__init__", theirs)
    try:
        instrumentor.uninstrument()
        assert vars(filelock.BaseFileLock)["__init__"] is handle
        assert handle.__wrapped__ is original  # lockwatch's wrapper is gone from the chain
        lock = filelock.FileLock(str(tmp_path / "theirs.lock"))
        assert calls == [lock]
        assert "_lockwatch_class" not in vars(lock)  # not watched: lockwatch's wrapper is gone
    finally:
        wrapt.unwrap_object(filelock.BaseFileLock, "__init__", handle)
    assert vars(filelock.BaseFileLock)["__init__"] is original


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_wrapped_methods_pickle_by_reference(instrumentor, protocol):
    """A wrapped method pickles as the function it wraps does, by reference (here: to the
    attribute of its class), and loads back as that attribute; a plain wrapt proxy would refuse
    to be pickled."""
    instrumentor.instrument(manifest=False)
    for patch in (p for p in every_patch() if p.via == _patches.WRAPT):
        for obj in (vars(patch.owner)[patch.name], getattr(patch.owner, patch.name)):
            loaded = pickle.loads(pickle.dumps(obj, protocol))
            assert loaded == getattr(patch.owner, patch.name), label(patch)
            assert loaded.__wrapped__ is obj.__wrapped__, label(patch)


def test_a_patch_names_how_it_is_installed():
    """A misspelt ``via`` is refused when the table is built, not when it is installed."""
    with pytest.raises(ValueError, match="'wrap'"):
        _patches.Patch(object, "name", lambda original: original, (), "wrap")


CREATION_SITES = """
import multiprocessing, os, sys, tempfile
import filelock, redis, wrapt
from otel_lockwatch import LockwatchInstrumentor

assert wrapt.FunctionWrapper.__module__ == "wrapt.wrappers"  # the pure-Python wrappers
LockwatchInstrumentor().instrument(manifest=False)

def make():
    return (
        filelock.FileLock(os.path.join(tempfile.mkdtemp(), "site.lock")),
        redis.Redis().lock("site:1"),
        multiprocessing.Lock(),
    )

for lock in make():
    print(lock.__dict__["_lockwatch_class"].site)
"""


def test_creation_sites_are_the_caller_s_without_wrapt_s_c_extension(tmp_path):
    """wrapt's pure-Python wrappers (``WRAPT_DISABLE_EXTENSIONS=1``) add a frame between the
    creating code and lockwatch's wrapper: a lock is still named by the code that made it."""
    script = tmp_path / "sites.py"
    script.write_text(CREATION_SITES, encoding="utf-8")
    env = {**os.environ, "WRAPT_DISABLE_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["__main__:make:11", "__main__:make:12", "__main__:make:13"]


def test_a_method_saved_and_put_back_through_the_class_is_still_unwrapped(instrumentor):
    """``saved = Class.method; Class.method = other; Class.method = saved`` while instrumented
    (a test's or a benchmark's stub) puts back lockwatch's wrapper bound to the class, which
    wrapt's ``unwrap_object`` does not find: ``uninstrument()`` restores the original all the
    same."""
    import redis.lock

    original = vars(redis.lock.Lock)["extend"]
    instrumentor.instrument(manifest=False)
    saved = redis.lock.Lock.extend
    redis.lock.Lock.extend = lambda self, *args: True  # type: ignore[method-assign]
    redis.lock.Lock.extend = saved  # type: ignore[method-assign]
    instrumentor.uninstrument()
    assert vars(redis.lock.Lock)["extend"] is original
