"""The process's exit hooks: one ``atexit`` registration and one SIGTERM handler, serving every
live manifest exporter (``_exit.ManifestExporter``).

The SIGTERM handler writes the final manifests, then chains to the handler installed before it
(the default one ends the process by SIGTERM, as it would have). Once the final manifest is on
disk a second SIGINT or SIGTERM ends the process at once. A SIGTERM that lands inside
lockwatch's own exit work on the main thread is handled when that work ends
(:meth:`_Hooks.signals_deferred`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["HOOKS"]


def _exit_now(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


class _Hooks:
    """atexit and SIGTERM: one registration for the process, serving the live exporters."""

    def __init__(self) -> None:
        self._exporters: list[Any] = []  # ManifestExporter
        self._installed = False
        self._previous: Any = None
        self._armed = False

    def register(self, exporter: Any) -> None:
        if exporter not in self._exporters:
            self._exporters.append(exporter)
        if not self._installed:
            self._installed = True
            atexit.register(self._at_exit)
            self._install_sigterm()

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
        """Once the final manifest is on disk, a second SIGINT or SIGTERM ends the process at
        once (exit status 128 + the signal), whatever is still flushing: ours, or the SDK's own
        exit hooks retrying a collector that is down."""
        if self._armed or threading.current_thread() is not threading.main_thread():
            return
        self._armed = True
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, _exit_now)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            self._previous = None

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

    def after_fork_in_child(self) -> None:
        # The forking thread is the child's main thread; it may not be the one that was busy.
        self._main_depth = 0
        self._deferred = None

    def _inside_exit_work(self, frame: Any) -> bool:
        codes = self.exit_work_code
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._main_depth and self._inside_exit_work(frame):
            self._deferred = (signum, frame)
            return
        self._at_exit()
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


#: The process's one registration.
HOOKS = _Hooks()
