"""Lock classes: the key under which everything about a lock is recorded.

Lockdep's rule: every lock created at one code site is one *class*. Statistics, spans, metrics
and the lock-order graph are kept per class, so their cardinality is bounded by the code, never
by the data. How a lock gets its class name (its creation site, or ``name_lock``) is decided by
``capture._naming``; this module only interns the classes, and keeps their *roles*: what the
standard library made a class for when it made it on the user's behalf (``queue.Queue.__init__``
creating a lock for the ``Queue()`` the user built), an attribute beside the name, never in it.
"""

from __future__ import annotations

import _thread

__all__ = ["ROLES", "LockClass", "after_fork_in_child", "lock_class", "note_role"]


class LockClass:
    """One class of locks: a name, a kind, and the site that created the first of them."""

    __slots__ = ("name", "kind", "site", "attrs")

    def __init__(self, name: str, kind: str, site: str) -> None:
        self.name = name
        self.kind = kind
        self.site = site
        # Metric attributes, built once: the hot path never builds a dict.
        self.attrs = {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind}

    def __repr__(self) -> str:
        return f"<LockClass {self.name!r} {self.kind}>"


_classes: dict[tuple[str, str], LockClass] = {}
# Re-entrant: a signal handler or a finalizer that creates a lock may run while this thread is
# inside the critical section below (inserting another class is safe there).
_classes_lock = _thread.RLock()


def after_fork_in_child() -> None:
    """In a forked child (the session's fork handler)."""
    # Another thread of the parent may have held it at the fork: it would stay held forever.
    global _classes_lock
    _classes_lock = _thread.RLock()


def lock_class(name: str, kind: str, site: str = "") -> LockClass:
    """The one LockClass of ``name`` and ``kind``, created on first use."""
    key = (name, kind)
    cls = _classes.get(key)
    if cls is None:
        with _classes_lock:
            cls = _classes.get(key)
            if cls is None:
                cls = _classes[key] = LockClass(name, kind, site or name)
    return cls


#: class name -> role. Kept for the life of the process, like the classes; when one name was
#: given several, the least is kept, so the choice does not depend on the order of creation.
ROLES: dict[str, str] = {}


def note_role(name: str, role: str) -> None:
    """Remember that the class ``name`` was created by the standard library as ``role``."""
    known = ROLES.get(name)
    if known is None or role < known:
        ROLES[name] = role
