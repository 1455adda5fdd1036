"""Which thread is calling: its ``Thread``, or a token for a thread ``threading`` does not know.

The recorder names a worker after its thread and keeps its state while the thread lives; a
thread started by ``_thread`` or by C has no ``Thread``, and asking ``threading`` for one would
register a ``_DummyThread`` that outlives it. :func:`current_thread_or_none` asks without
registering anything, and a :class:`ForeignThread` stands in for such a thread.
"""

from __future__ import annotations

import _thread
import threading

__all__ = ["ForeignThread", "current_thread_name", "current_thread_or_none"]


class ForeignThread:
    """Stands for a thread that ``threading`` does not know (started by ``_thread`` or by C).

    ``threading.current_thread()`` would register a ``_DummyThread`` for it, which stays in
    ``threading.enumerate()`` after the thread ends (for good on Python 3.10): a change the host
    could see. This token lives in the thread's own locals instead, and dies with the thread, so
    the worker's state is folded away like an ended ``Thread``'s.
    """

    __slots__ = ("name", "__weakref__")

    def __init__(self, ident: int) -> None:
        self.name = f"Dummy-{ident}"

    def is_alive(self) -> bool:
        return True  # while it exists: the thread's locals (which hold it) outlive the thread


def current_thread_or_none(ident: int | None = None) -> threading.Thread | None:
    """The calling thread's ``Thread``, or None for a thread ``threading`` does not know
    (without registering a ``_DummyThread`` for it, as ``threading.current_thread()`` would).
    ``ident``: the calling thread's, when the caller has it."""
    active = getattr(threading, "_active", None)
    if active is None:  # not CPython's threading: ask it (it may register a dummy thread)
        return threading.current_thread()
    return active.get(_thread.get_ident() if ident is None else ident)


def current_thread_name(ident: int) -> str:
    """The name of the thread ``ident`` (the calling thread's, or one alive), ``Dummy-<id>`` for
    a thread ``threading`` does not know."""
    thread = current_thread_or_none(ident)
    return thread.name if thread is not None else f"Dummy-{ident}"
