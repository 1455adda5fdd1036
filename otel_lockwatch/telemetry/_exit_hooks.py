"""The process's exit hooks: one ``atexit`` registration and one SIGTERM handler, serving every
live manifest exporter (``_exit.ManifestExporter``).

The SIGTERM handler writes the final manifests, then chains to the handler installed before it
(the default one ends the process by SIGTERM, as it would have). Once the final manifest is on
disk a second SIGINT or SIGTERM ends the process at once (one that lands while the final
manifest is being written ends it as soon as the file is on disk). A SIGTERM that lands inside
lockwatch's own exit work on the main thread is handled when that work ends
(:meth:`ExitHooks.signals_deferred`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._session import PROCESS, at_fork
from ._bounded import standby

__all__ = ["ExitHooks", "exit_hooks"]


class ExitHooks:
    """atexit and SIGTERM: one registration for the process, serving the live exporters (the
    process's one is :func:`exit_hooks`)."""

    def __init__(self) -> None:
        self._exporters: list[Any] = []  # ManifestExporter
        self._installed = False
        self._previous: Any = None
        self._armed = False
        self._on_disk = False  # the final manifest is written: a second signal ends the process
        self._pending = 0  # a second signal that came while it was being written
        self._pid = os.getpid()  # the process whose state this is (see _on_sigterm)

    def register(self, exporter: Any) -> None:
        if exporter not in self._exporters:
            self._exporters.append(exporter)
        if not self._installed:
            self._installed = True
            atexit.register(self._at_exit)
            self._install_sigterm()
        standby().ensure()  # the exit work's helper when no thread can be started then

    def unregister(self, exporter: Any) -> None:
        if exporter in self._exporters:
            self._exporters.remove(exporter)

    #: Set when the process has begun to exit (atexit, or a SIGTERM we handle).
    exiting = False

    def _at_exit(self) -> None:
        self.exiting = True
        for exporter in list(self._exporters):
            exporter.close()

    def arm_second_signal(self) -> None:
        """Before the final manifest is written: from now on a second SIGINT or SIGTERM ends the
        process (exit status 128 + the signal), whatever is still flushing (ours, or the SDK's
        own exit hooks retrying a collector that is down): at once when the manifest is on disk
        (:meth:`manifest_on_disk`), else as soon as it is. Armed after the write, a signal
        landing between the file's appearance and the arming raised KeyboardInterrupt into the
        exit hooks, and the process hung on the flush (seen on 3.10)."""
        if self._armed or threading.current_thread() is not threading.main_thread():
            return
        self._armed = True
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, self._second_signal)

    def manifest_on_disk(self) -> None:
        """The final manifest is written: a second signal, pending or to come, ends the process."""
        self._on_disk = True
        if self._pending:
            os._exit(128 + self._pending)

    def _second_signal(self, signum: int, frame: Any) -> None:
        if self._on_disk:
            os._exit(128 + signum)
        self._pending = self._pending or signum

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            self._previous = None
            return
        self._watch_wakeups()

    # -- a SIGTERM the main thread never sees ------------------------------------------------
    # A Python-level handler runs only when the main thread next checks for signals. A SIGTERM
    # that arrives after its last check and before it enters a blocking call (a pool worker
    # about to wait on its queue's lock, held by the parent for good) interrupts nothing: the
    # handler never runs and the process, which the default action would have ended, waits
    # forever. So the handler's arrival is also written to a pipe (``signal.set_wakeup_fd``,
    # when the host has none set), which the emitter thread reads (:meth:`check_lost_sigterm`);
    # a SIGTERM not handled 200 ms after its arrival is sent again, to the main thread itself,
    # which interrupts its wait. Only while the handler would end the process (the handler
    # before it was the default): a host's own handler keeps its own semantics.
    _wakeup: tuple[int, int] | None = None
    _wakeup_pid = 0
    _sigterm_seen = 0.0  # when a SIGTERM's byte was read, its handler not yet run
    _sigterm_handled = False
    _quiet_until = 0.0  # bytes read before this may be a just-forked child's

    LOST_SIGTERM_S = 0.2

    def _ends_the_process(self) -> bool:
        """Whether lockwatch's handler ends the process (the one before it was the default):
        only then is a SIGTERM it might miss worth guarding (a host's handler keeps its own)."""
        return self._previous in (signal.SIG_DFL, None)

    def _watch_wakeups(self) -> None:
        if self._wakeup_pid == os.getpid() or not self._ends_the_process():
            return
        try:
            r, w = os.pipe()
        except OSError:
            return
        try:
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        if old != -1:  # the host listens already (asyncio, say): its fd stays
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._close_wakeup()
        self._wakeup, self._wakeup_pid = (r, w), os.getpid()
        self._sigterm_seen, self._sigterm_handled = 0.0, False

    def _close_wakeup(self) -> None:
        if self._wakeup is not None:
            for fd in self._wakeup:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wakeup = None

    def check_lost_sigterm(self) -> None:
        """Called by the emitter thread every few tens of milliseconds."""
        wakeup = self._wakeup
        if wakeup is None or self._wakeup_pid != os.getpid() or self._sigterm_handled:
            return
        try:
            data = os.read(wakeup[0], 512)
        except OSError:  # nothing to read (BlockingIOError), or closed
            data = b""
        now = time.monotonic()
        if signal.SIGTERM in data and now >= self._quiet_until and not self._sigterm_seen:
            self._sigterm_seen = now
        if self._sigterm_seen and now - self._sigterm_seen >= self.LOST_SIGTERM_S:
            self._sigterm_seen = now  # and again later, while it is still not handled
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                main = threading.main_thread().ident
                if main is not None:
                    signal.pthread_kill(main, signal.SIGTERM)

    def _unwatch_wakeups(self) -> None:
        wakeup = self._wakeup
        if wakeup is None or self._wakeup_pid != os.getpid():
            return
        try:
            current = signal.set_wakeup_fd(-1)
            if current != wakeup[1]:  # set by the host since: its fd stays
                signal.set_wakeup_fd(current)
        except (ValueError, OSError):  # not on the main thread: the pipe stays, unread
            return
        self._close_wakeup()
        self._wakeup_pid = 0

    # -- a SIGTERM that reaches a child as it is forked --------------------------------------
    # CPython clears the signals a forked child received before its interpreter resumed (they
    # may be the parent's: _PySignal_AfterFork), and until the child's own wake-up pipe is made
    # their arrival is written to the parent's: a pool's worker terminated as it was forked
    # missed the SIGTERM for good, where the default action would have ended it. So while the
    # handler is the one that ends the process, the forking thread blocks SIGTERM across the
    # fork, and the child unblocks it once its fork routines have run: one sent meanwhile stays
    # pending, then is handled by the child's own state.
    _fork_mask = threading.local()  # per forking thread: whether the fork blocked SIGTERM

    def before_fork(self) -> None:
        """Before a fork, in the forking thread (the session's fork handler)."""
        if (
            not self._installed
            or not self._ends_the_process()
            or signal.getsignal(signal.SIGTERM) != self._on_sigterm
        ):
            return
        try:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM,))
        except (AttributeError, OSError, ValueError):  # no pthread_sigmask here
            return
        self._fork_mask.unblock = signal.SIGTERM not in blocked  # (the host's own block stays)

    def _unblock_after_fork(self) -> None:
        if getattr(self._fork_mask, "unblock", False):
            self._fork_mask.unblock = False
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM,))

    def after_fork_in_parent(self) -> None:
        """After a fork, in the parent (the session's fork handler)."""
        # A child writes into the parent's pipe until its own at-fork hook gives it one.
        self._quiet_until = time.monotonic() + 1.0
        self._unblock_after_fork()

    def after_fork_in_child(self) -> None:
        """In a forked child (the session's fork handler, last of the parts)."""
        # Every other part has its child's state now: a SIGTERM handled from here on does the
        # child's exit work (before, it only ends the child: see _on_sigterm).
        self._pid = os.getpid()
        try:
            self._own_wakeups_after_fork()
        finally:  # a SIGTERM that came during the fork is handled now, by the child's pipe too
            self._unblock_after_fork()

    def _own_wakeups_after_fork(self) -> None:
        # The forking thread is the child's main thread; it may not be the one that was busy.
        self._main_depth = 0
        self._deferred = None
        # The parent's quiet time is the parent's: the child's pipe is its own (a pool's next
        # worker, forked within a second of the last, ignored a lost SIGTERM and never ended).
        self._quiet_until = 0.0
        if self._wakeup is None:
            return
        self._close_wakeup()
        self._wakeup_pid = 0
        try:
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            return
        self._watch_wakeups()

    # The SIGTERM handler runs on the main thread between any two bytecodes, so it can land
    # inside lockwatch's own exit work on that thread: a write holding the exporter's lock, or
    # ``Event.set()`` holding its condition's lock in ``close()``/``stop()`` (a pool worker's
    # final write when ``Pool.terminate()`` signals it). Doing that work again from the handler
    # would wait forever on a lock this thread holds, so the signal is kept until the work ends,
    # then handled; the process must not die with its manifest half written either.
    _main_depth = 0
    _deferred: tuple[int, Any] | None = None
    #: The code of the functions that run exit work inside :meth:`signals_deferred`: a signal
    #: is deferred only when the frame it interrupted is inside one of them, so a count left
    #: behind (copied into a forked child, say) can never swallow a SIGTERM.
    exit_work_code: frozenset[Any] = frozenset()

    @contextlib.contextmanager
    def signals_deferred(self) -> Iterator[None]:
        """Run lockwatch's exit work: a SIGTERM landing on this thread meanwhile is handled
        when the outermost such block ends (only the main thread receives signals)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._main_depth += 1
        try:
            yield
        finally:
            self._main_depth -= 1
            if not self._main_depth:
                deferred, self._deferred = self._deferred, None
                if deferred is not None:
                    self._on_sigterm(*deferred)

    def _inside_exit_work(self, frame: Any) -> bool:
        codes = self.exit_work_code
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._pid != os.getpid():
            # A forked child whose fork routines have not run yet, though the fork blocked
            # SIGTERM (a fork routine registered before lockwatch's let it in, or the fork
            # found another handler: see before_fork). Its lockwatch state is still the
            # parent's copy: its locks may be held by threads the child does not have (a
            # flush waited 5 s on one and dropped the spans) and its manifest path is the
            # parent's. The child has recorded nothing of its own: it ends as it would have
            # without lockwatch.
            self._end_as_before(signum, frame)
            return
        self._sigterm_handled = True
        if self._main_depth and self._inside_exit_work(frame):
            self._deferred = (signum, frame)
            return
        self._at_exit()
        self._end_as_before(signum, frame)

    def _end_as_before(self, signum: int, frame: Any) -> None:
        """What the handler installed before lockwatch's would have done with the SIGTERM."""
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        # The default action: end the process by SIGTERM, as it would have been.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def uninstall_if_idle(self) -> None:
        """With no exporter left, take back the atexit hook and the SIGTERM handler (when it is
        still ours: a handler installed after it stays, and keeps chaining to it)."""
        if self._exporters or not self._installed:
            return
        self._installed = False
        atexit.unregister(self._at_exit)
        self._unwatch_wakeups()
        if self._previous is None:
            return
        try:
            if (
                threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == self._on_sigterm
            ):
                signal.signal(signal.SIGTERM, self._previous)
        except (ValueError, OSError):
            pass
        self._previous = None


def exit_hooks() -> ExitHooks:
    """The process's one registration (``_session.PROCESS.exit_hooks``), made on first use."""
    hooks: ExitHooks = PROCESS.part("exit_hooks", ExitHooks)
    return hooks


def _before_fork() -> None:
    if PROCESS.exit_hooks is not None:
        PROCESS.exit_hooks.before_fork()


def _after_fork_in_parent() -> None:
    if PROCESS.exit_hooks is not None:
        PROCESS.exit_hooks.after_fork_in_parent()


def _after_fork_in_child() -> None:
    if PROCESS.exit_hooks is not None:
        PROCESS.exit_hooks.after_fork_in_child()


at_fork(
    "exit hooks",
    before=_before_fork,
    after_in_child=_after_fork_in_child,
    after_in_parent=_after_fork_in_parent,
)
