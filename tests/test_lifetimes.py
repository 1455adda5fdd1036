"""A watched lock keeps nothing of its holder alive once it is released.

A hold's held-stack entry names the frame that acquired (the order check's and the contention
points' site). Kept by the lock after the release, it kept that frame alive, and a frame object
that outlives its call keeps its locals: an object the program let go of at a function's
return (a file to close, a connection to give back, anything with a ``__del__``) lived on,
instrumented only, until the lock's next acquisition, which for a lock taken once is never.
Each primitive is checked on both paths, in a fresh interpreter (the path is chosen at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import asyncio, json, multiprocessing, sys, threading, weakref
    from otel_lockwatch import AsyncStripedSections, LockwatchInstrumentor, StripedSections
    from otel_lockwatch.capture import _fast_path

    LockwatchInstrumentor().instrument(manifest=False)

    class Resource:  # what a program lets go of at a function's return
        pass

    def kept(hold):
        # Whether a local of the function that held `hold` outlives the function's return.
        def work():
            resource = Resource()
            with hold():
                pass
            return weakref.ref(resource)
        return work()() is not None

    def kept_async(hold):
        async def work():
            resource = Resource()
            async with hold():
                pass
            return weakref.ref(resource)
        return asyncio.run(work())() is not None

    lock, rlock, condition = threading.Lock(), threading.RLock(), threading.Condition()
    sections, async_sections = StripedSections(8), AsyncStripedSections(8)
    mp_lock = multiprocessing.get_context("spawn").Lock()
    alock = []

    def asyncio_lock():
        if not alock:
            alock.append(asyncio.Lock())
        return alock[0]

    print(json.dumps({
        "path": "C" if _fast_path.SPEEDUPS else "pure",
        "kept": {
            "threading.Lock": kept(lambda: lock),
            "threading.RLock": kept(lambda: rlock),
            "threading.Condition": kept(lambda: condition),
            "StripedSections": kept(lambda: sections.lock("entity-1")),
            "multiprocessing.Lock": kept(lambda: mp_lock),
            "asyncio.Lock": kept_async(asyncio_lock),
            "AsyncStripedSections": kept_async(lambda: async_sections.lock("entity-1")),
        },
    }))
    """
)


@pytest.mark.parametrize("path", ["C", "pure"])
def test_a_released_lock_keeps_no_local_of_its_holder_alive(path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if path == "pure":
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if path == "C" and result["path"] != "C":
        pytest.skip("the C path is not built here")
    assert result["path"] == path
    assert not [name for name, kept in result["kept"].items() if kept], result
