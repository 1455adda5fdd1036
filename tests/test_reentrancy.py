"""Signal handlers and finalizers that re-enter lockwatch never hang the host program.

Python runs a signal handler, a ``__del__`` or a weakref callback on a thread between any two
bytecodes, inside lockwatch's own bookkeeping too. Each test runs a real subprocess
(``data/reentrancy_stress.py``) that provokes that for seconds and must end by itself; a hang is
a failure (the subprocess is killed at the deadline).

``handler-evaluates`` is the regression test of a deadlock: a handler evaluating the manifest
(as the SIGTERM handler does) that landed inside the main thread's own read of the lock-order
graph waited forever for the graph's lock, which that thread held (SIGTERM then could not end the
process either).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

STRESS = Path(__file__).parent / "data" / "reentrancy_stress.py"
pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    return env


# The stress processes of these two tests take thousands of involuntary context switches a
# second on the free-threaded build, where any process beside them runs several times slower
# (docs/development.md): its leg runs them alone, after the rest (`alone`).
@pytest.mark.alone
@pytest.mark.parametrize("mode", ["handler-evaluates", "signals", "finalizers"])
def test_reentry_never_hangs(mode, tmp_path):
    manifest = tmp_path / "m.json"
    try:
        done = subprocess.run(
            [sys.executable, str(STRESS), mode, "3", str(manifest)],
            capture_output=True,
            text=True,
            timeout=90,  # a hang ends here, as a failure
            env=_env(),
        )
    except subprocess.TimeoutExpired as hung:  # with the stacks the script dumped at 60 s
        stderr = hung.stderr.decode(errors="replace") if isinstance(hung.stderr, bytes) else ""
        pytest.fail(f"{mode}: still running after 90 s\n{stderr[-6000:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[0] == "done"
    rounds, handled, finalized = map(int, last[1:])
    assert rounds > 0
    if mode != "finalizers":
        assert handled > 0, "no signal handler ran: the test proves nothing"
    else:
        assert finalized > 0, "no finalizer ran: the test proves nothing"
    assert json.loads(manifest.read_text())["locks"]


def _sigterm_trial(i: int, workdir: Path) -> str | None:
    """Start the loop, SIGTERM it at a random moment; None when it ended with its manifest."""
    manifest = workdir / f"m{i}.json"
    proc = subprocess.Popen(
        [sys.executable, str(STRESS), "sigterm", "60", str(manifest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready": the loop runs
        random_delay = random.Random(i).uniform(0.0, 0.3)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=random_delay)  # ok: a random moment in the loop to interrupt
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            return f"trial {i}: still running 20 s after SIGTERM"
        if status != -signal.SIGTERM:
            return f"trial {i}: ended with status {status}: {proc.stderr.read()[-1000:]}"
        if not manifest.exists():  # its stderr says where the handler was (1 in 100, pure path)
            return f"trial {i}: no manifest: {proc.stderr.read()[-1000:]}"
        return None
    finally:
        proc.kill()
        proc.wait()


# Each trial has its own deadline (20 s after its SIGTERM); the 100 of them, four at a time, take
# 46 s on 3.11 here and more than pytest-timeout's 180 s on the free-threaded 3.13t at load
# (its interpreter starts each trial slower): the bound of the whole is the trials'.
@pytest.mark.alone
@pytest.mark.timeout(900)
def test_sigterm_during_evaluation_ends_the_process_in_100_trials(tmp_path):
    """SIGTERM at a random moment while the main thread evaluates and writes the manifest and
    another thread nests 50 instrumented locks: every trial ends, by SIGTERM, manifest written."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(lambda i: _sigterm_trial(i, tmp_path), range(100)) if f]
    assert failures == []


@pytest.mark.parametrize("mode", ["close", "stop"])
def test_sigterm_inside_exit_work_is_handled_after_it(mode, tmp_path):
    """The handler does not redo the exit work it interrupted (that waited forever on a lock the
    main thread held); it runs when the work ends, writes the manifest, and the process ends by
    the SIGTERM as it would have. (During ``uninstrument()`` the exporter is already leaving, so
    whether the manifest is written depends on where the signal landed: only the end is
    asserted.)"""
    manifest = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, str(STRESS.with_name("sigterm_in_exit_work.py")), mode, str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,  # a hang ends here, as a failure
        env=_env(),
    )
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert "survived" not in done.stdout
    if mode == "close":
        assert json.loads(manifest.read_text())["locks"]


def test_sigterm_inside_the_recorder_while_a_checkpoint_writes(tmp_path):
    """The checkpoint never holds the exporter's lock while it waits for a recorder lock, so the
    handler on a main thread holding that recorder lock writes the manifest and the process
    ends by the SIGTERM (found by the 100-trial test above: 1 trial in 500 hung)."""
    manifest = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, str(STRESS.with_name("sigterm_while_checkpointing.py")), str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,  # a hang ends here, as a failure
        env=_env(),
    )
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert "survived" not in done.stdout
    assert json.loads(manifest.read_text())["locks"]


def test_a_sigterm_the_main_thread_misses_is_sent_again(tmp_path):
    """A SIGTERM that arrives just before the main thread blocks interrupts nothing, and its
    handler would never run: the emitter sees it arrive and sends it again to the main thread,
    so the process ends as the default action would have ended it (a terminated pool worker
    blocked on its queue's lock once waited forever instead)."""
    manifest = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, str(STRESS.with_name("lost_sigterm.py")), str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,  # a hang ends here, as a failure
        env=_env(),
    )
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert json.loads(manifest.read_text())["locks"]


def test_a_sigterm_a_forked_pool_worker_misses_is_sent_again(tmp_path):
    """The same in a forked ``multiprocessing`` worker (a pool's worker terminated as it blocks
    on its call queue again: on the free-threaded build, 1 executor shutdown in 300 of a loop of
    CPython's test_crash_at_task_unpickle's steps waited for one). The worker's emitter, which
    sends it again, starts with the worker, not at its first record: the worker ends by the
    SIGTERM, with its manifest written."""
    manifest = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, str(STRESS.with_name("lost_sigterm.py")), str(manifest), "worker"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"worker exit {-signal.SIGTERM}", done.stderr[-3000:]
    (written,) = [p for p in tmp_path.glob("m*.json") if p != manifest]
    assert json.loads(written.read_text())["locks"]
