"""The manifest survives every way a real process ends (real subprocesses, real signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from otel_lockwatch import load_manifest

PRELUDE = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from opentelemetry.sdk.trace import TracerProvider
    from otel_lockwatch import LockwatchInstrumentor, name_lock

    provider = TracerProvider()
    LockwatchInstrumentor().instrument(tracer_provider=provider, manifest_path=sys.argv[1],
                                       checkpoint_interval_s=float(sys.argv[2]))
    lock = name_lock(threading.Lock(), "exit-lock")
    for _ in range(10):
        with lock:
            pass
    """
)


def spawn(tmp_path: Path, body: str, interval: float = 0.0) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "app.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    manifest = tmp_path / "manifest-{pid}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(manifest), str(interval)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, tmp_path / f"manifest-{proc.pid}.json"


def wait_ready(proc: subprocess.Popen) -> None:
    """Block until the child prints 'ready' (it has installed what the test needs)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")


def assert_valid(path: Path, acquisitions: int = 10) -> None:
    manifest = load_manifest(path)  # checks schema and digest
    assert manifest.locks["exit-lock"]["acquisitions"] == acquisitions
    assert not list(path.parent.glob(".*.tmp*")), "no temporary file left behind"


def test_normal_exit(tmp_path):
    proc, manifest = spawn(tmp_path, "")
    assert proc.wait(60) == 0
    assert_valid(manifest)


def test_sys_exit(tmp_path):
    proc, manifest = spawn(tmp_path, "sys.exit(3)\n")
    assert proc.wait(60) == 3
    assert_valid(manifest)


def test_unhandled_exception(tmp_path):
    proc, manifest = spawn(tmp_path, "raise RuntimeError('boom')\n")
    assert proc.wait(60) == 1
    assert "RuntimeError: boom" in proc.stderr.read()
    assert_valid(manifest)


def test_sigterm_default_action_kept(tmp_path):
    """SIGTERM writes the manifest, then the process still dies of SIGTERM."""
    proc, manifest = spawn(tmp_path, "print('ready', flush=True)\nthreading.Event().wait(60)\n")
    wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM
    assert_valid(manifest)


def test_a_lost_sigterm_is_sent_again_in_a_child_forked_right_after_another(tmp_path):
    """A SIGTERM whose handler never ran (it arrived just before the main thread blocked) is sent
    again to the main thread; in a child too, even one forked within a second of the last (a
    pool's workers): the parent's quiet time after a fork is not the child's."""
    body = """
        from otel_lockwatch.telemetry._exit_hooks import ExitHooks, exit_hooks
        first = os.fork()
        if first == 0:
            os._exit(0)
        os.waitpid(first, 0)
        second = os.fork()
        if second == 0:
            ExitHooks.LOST_SIGTERM_S = 0.0
            wakeup = signal.set_wakeup_fd(-1)  # the child's own pipe, set by its fork routine
            signal.set_wakeup_fd(wakeup)
            os.write(wakeup, bytes([signal.SIGTERM]))  # as the C-level handler does
            exit_hooks().check_lost_sigterm()  # the emitter's look: lost, so sent again
            for _ in range(1000):  # where the main thread runs its handler
                pass
            os._exit(0)  # only when nothing was sent
        _, status = os.waitpid(second, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status, flush=True)
        """
    proc, _ = spawn(tmp_path, body)
    out, err = proc.communicate(timeout=60)
    assert out.split()[0] == "True", (out, err)


FORKING_WHILE_TERMINATED = textwrap.dedent(
    """
    import os, signal, sys, threading, time

    # Registered before lockwatch's own fork routines, so it runs first in a forked child: a
    # SIGTERM handled there is one that reached a pool's worker as it was being forked (the
    # executor terminating its workers), while lockwatch's state in the child is the parent's.
    # (The fork blocks SIGTERM until lockwatch's routines have run; this routine lets it in.)
    def terminated_as_forked():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        signal.raise_signal(signal.SIGTERM)

    os.register_at_fork(after_in_child=terminated_as_forked)

    from otel_lockwatch import LockwatchInstrumentor, name_lock
    from otel_lockwatch._session import RECORDER

    LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
    lock = name_lock(threading.Lock(), "exit-lock")
    for _ in range(10):
        with lock:
            pass
    # Another thread has the recorder as the child is forked (the emitter, say): the child's
    # copy of its lock is held by a thread the child does not have.
    holding, release = threading.Event(), threading.Event()

    def hold():
        with RECORDER.exclusive():
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # only if the SIGTERM did not end the child
    deadline = time.monotonic() + 30
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("the child was still running 30 s after its SIGTERM", flush=True)
    else:
        status = ended[1]
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status, flush=True)
    print(os.path.exists(sys.argv[1]), flush=True)
    release.set()
    holder.join()
    """
)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
def test_a_child_terminated_while_it_is_forked_ends_by_the_sigterm(tmp_path):
    """A SIGTERM handled in a forked child before lockwatch's fork routines have run (a pool's
    worker terminated as it is forked: its handler runs in the finalizers of the parent's
    threads' locals) ends the child as the default action would, at once, without lockwatch's
    exit work: that work would find the parent's state (a recorder lock held by a thread the
    child does not have: the child hung there, its parent joining it for good) and write the
    parent's manifest path."""
    script = tmp_path / "app.py"
    script.write_text(FORKING_WHILE_TERMINATED)
    manifest = tmp_path / "manifest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(script), str(manifest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ended, written_by_the_child = proc.stdout.splitlines()
    assert ended.split()[0] == "True", (ended, proc.stderr)
    assert written_by_the_child == "False", "the child wrote its parent's manifest"
    assert_valid(manifest)  # the parent's, at its own exit


SIGTERM_DURING_FORK = textwrap.dedent(
    """
    import os, signal, sys

    def early():  # registered before lockwatch's fork routines: runs first in a forked child
        os.kill(os.getpid(), signal.SIGTERM)  # a SIGTERM that reaches the child as it is forked
        print("pending" if signal.SIGTERM in signal.sigpending() else "delivered", flush=True)

    os.register_at_fork(after_in_child=early)

    from otel_lockwatch import LockwatchInstrumentor

    LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)

    def fork_and_wait():
        pid = os.fork()
        if pid == 0:
            blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
            print(f"child survived, SIGTERM blocked: {blocked}", flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        ended = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        print(f"ended by SIGTERM: {ended}, parent blocks it: {blocked}", flush=True)

    fork_and_wait()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # the program's own block
    fork_and_wait()
    """
)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
def test_a_sigterm_sent_as_a_child_is_forked_waits_for_its_fork_routines(tmp_path):
    """A SIGTERM that reaches a forked child before its interpreter resumed is cleared by
    CPython (it may be the parent's), and the default action would have ended the child: the
    forking thread blocks SIGTERM across the fork, so one sent then stays pending until the
    child's fork routines have run, and ends the child then. A program's own block of SIGTERM
    stays, in the parent and the child."""
    script = tmp_path / "app.py"
    script.write_text(SIGTERM_DURING_FORK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "pending",
        "ended by SIGTERM: True, parent blocks it: False",
        "pending",
        "child survived, SIGTERM blocked: True",
        "ended by SIGTERM: False, parent blocks it: True",
    ], proc.stderr


def test_sigterm_chains_the_handler_installed_before(tmp_path):
    """A SIGTERM handler installed before instrument() still runs, after the manifest is written."""
    script_prelude = PRELUDE.replace(
        "provider = TracerProvider()",
        "def mine(signum, frame):\n    print('user handler', flush=True)\n"
        "    sys.exit(7)\nsignal.signal(signal.SIGTERM, mine)\nprovider = TracerProvider()",
    )
    script = tmp_path / "app.py"
    # In 50 ms sleeps, as test_sigint's app: a SIGTERM landing just before one long wait begins
    # is handled only when it returns (CPython's race; without lockwatch, 3.13t's plain
    # ``threading.Event().wait(60)`` missed the SIGTERM sent as it printed 'ready' 1 run in 2).
    script.write_text(
        script_prelude + "print('ready', flush=True)\nfor _ in range(1200):\n    time.sleep(0.05)\n"
    )
    manifest = tmp_path / "m.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(manifest), "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 7
    assert "user handler" in proc.stdout.read()
    assert_valid(manifest)


def test_sigint(tmp_path):
    # The app waits in 50 ms sleeps, not in one long wait: a SIGINT landing after the
    # interpreter's last check for signals and before a blocking call wakes nothing, and its
    # handler runs only when that call returns (CPython's own race, widened by any thread that
    # wants the interpreter then: lockwatch's emitter; 4 hung runs in 300 with one 60 s
    # ``Event.wait`` on 3.12). Each sleep's end is a check: the SIGINT is handled within 50 ms.
    body = "print('ready', flush=True)\nfor _ in range(1200):\n    time.sleep(0.05)\n"
    proc, manifest = spawn(tmp_path, body)
    wait_ready(proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) != 0
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert_valid(manifest)


def test_checkpoint_survives_sigkill(tmp_path):
    """With checkpoints every 0.1 s, a SIGKILL loses at most one interval."""
    proc, manifest = spawn(
        tmp_path, "print('ready', flush=True)\nthreading.Event().wait(60)\n", interval=0.1
    )
    wait_ready(proc)
    deadline = time.monotonic() + 30
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # ok: polling with a deadline
    proc.kill()
    assert proc.wait(60) == -signal.SIGKILL
    assert_valid(manifest)


def test_interrupted_write_keeps_the_previous_manifest(tmp_path, monkeypatch):
    """A write that fails half-way leaves the previous manifest whole and no temporary file."""
    from otel_lockwatch import evaluate
    from otel_lockwatch.manifest import _io

    target = tmp_path / "m.json"
    _io.dump_manifest(evaluate({}), target)
    before = target.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(_io.os, "replace", broken_replace)
    with pytest.raises(OSError):
        _io.dump_manifest(evaluate({}), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_without_an_sdk_tracer_provider(tmp_path):
    """No SDK tracer provider (the API's no-op one): the manifest is still written at exit."""
    script = tmp_path / "app.py"
    script.write_text(
        PRELUDE.replace("provider = TracerProvider()", "provider = None").replace(
            "from opentelemetry.sdk.trace import TracerProvider\n", ""
        )
    )
    manifest = tmp_path / "m.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(script), str(manifest), "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert_valid(manifest)


def test_lock_called_from_c_with_no_python_caller(tmp_path):
    """atexit calls watched locks' acquire straight from C: no Python frame above it, no error."""
    body = (
        "import atexit\n"
        "from otel_lockwatch import StripedSections\n"
        "rlock = threading.RLock()\n"
        "sections = StripedSections(4, name='s')\n"
        "atexit.register(lock.acquire)\n"
        "atexit.register(rlock.acquire)\n"
        "atexit.register(sections.acquire, 'key')\n"
    )
    proc, manifest = spawn(tmp_path, body)
    assert proc.wait(60) == 0
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert_valid(manifest, acquisitions=11)


def test_uninstrumented_write_takes_the_path_option_from_the_environment(tmp_path, monkeypatch):
    """Without instrument(), write_manifest() resolves ``manifest_path`` as instrument() would:
    the environment's, else the declared default (in the working directory)."""
    from otel_lockwatch import _session, write_manifest
    from otel_lockwatch._settings import SETTINGS

    assert _session.current() is None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH", str(tmp_path / "from-env.json"))
    assert write_manifest() == tmp_path / "from-env.json"
    monkeypatch.delenv("OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH")
    assert write_manifest() == Path(SETTINGS["manifest_path"].default)
    load_manifest(tmp_path / SETTINGS["manifest_path"].default)
