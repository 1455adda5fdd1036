"""Held locks that are gone: lockdep's "held lock freed", found by reference counting.

A held-stack entry keeps its lock object alive, so a lock dropped while held (``lock.acquire();
del lock``, an object discarded on an error path, a test that returns holding a local lock) is
never freed, and nobody can release it any more. Left on the stack it would order every later
acquisition of its thread. The order check asks :func:`dropped` about an entry before it adds an
edge from it: only then, so a repeated nesting (answered by the chain cache) pays nothing.

The answer counts references. The lock is gone when nothing refers to it but its entry and what
only the frame that acquired it leads to, once that frame has returned (the entry keeps the
frame, and a returned frame keeps its locals: the lock itself, the cells of its closures, the
closures, objects and dicts that only they refer to). That is the cycle collector's reasoning, on
the few objects the frame reaches rather than the whole heap: count the references each of them
gets from inside the set, subtract them from its reference count; what is left is referred to
from outside, and so is everything it leads to. If nothing referred to from outside leads to the
lock, and every reference to the lock comes from inside the set, nobody can release it. Classes,
modules, code, other frames, a function's globals and a method's function are shared, and never
walked: a lock they lead to has references the walk does not count, so it is not gone.

It is conservative: a weak reference, a live object's attribute, a global, a frame still running
or suspended (a generator, a coroutine), more than a bounded number of objects to walk: the lock
is not gone. CPython lists a frame's locals among its referents only once it has returned (from
3.11 on); a frame on the calling thread's stack is running on every version.

The free-threaded build (no GIL) counts the same: a reference count there is split between the
owning thread's share and the others', and ``sys.getrefcount`` adds the two. What it counts
differently, it overcounts: an object with a deferred count (a module-level function, code, a
module, a class) carries one reference that nothing refers to, and is made immortal once a
second thread starts, so it always looks referred to from outside, and what it leads to is not
gone; those are never the way to a dropped lock (code, modules and classes are shared, a
module-level function has no closure).

A lock that a reference cycle keeps alive (a frame held by an exception's traceback) is not
gone by that count. Before an edge that would close a cycle is reported, the question is asked
again of every object that leads to the lock (:func:`collected_gone`): the collector's reasoning,
without a collection, which would run finalizers on a thread that holds watched locks. An edge
that closes no cycle is added without it, so until the collector frees such a lock it orders as
a held lock.
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from sys import getrefcount
from typing import Any
from weakref import getweakrefcount

from ._fast_path import HeldEntry

__all__ = ["collected_gone", "dropped"]

_getframe = sys._getframe


def _count(container: Any, index: int) -> int:
    """The reference count of ``container[index]``, taken the one way every count here is taken:
    the item is never held in a variable. How many references a call's argument and a local add
    changed across versions (3.14 lends a local to a call without a reference of its own, a
    variable a closure captures still owns one), so a count is compared only with one taken by
    the same code."""
    return getrefcount(container[index])


def _lock_count(entry: Any) -> int:
    """The reference count of a held entry's lock, taken as :func:`_count` takes its counts."""
    return getrefcount(entry.lock)


#: What :func:`_count` answers when the container is the only reference to the item: the list of
#: members for :func:`_reached_only_from`.
_ONLY_IN_CONTAINER = _count((object(),), 0)
#: What :func:`_lock_count` answers when the entry is the only reference to its lock.
_ONLY_IN_ENTRY = _lock_count(HeldEntry((None, None, 0, object(), False)))
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_SHARED = (type, types.ModuleType, types.CodeType, types.FrameType)
_MAX_MEMBERS = 128
#: Whether :func:`_kept_by_garbage` decides alone (a lock it does not find gone is not): on
#: CPython 3.11 and 3.12, where it finds a lock kept only by a reference cycle gone.
_WALK_DECIDES = sys.version_info < (3, 13)
_MAX_LEVELS = 8  # levels of referrers walked by _kept_by_garbage: one walk of the heap each


def dropped(entry: Any, held: list) -> bool:
    """Whether the lock of a held entry is gone: nothing refers to it but the held stack and what
    only the returned frame that acquired it reaches (its locals, the cells of its closures, the
    objects they alone refer to). Nobody can release it.

    Conservative: a lock that might still be reached (a weak reference, a global, an object
    anything else refers to, a frame still running or suspended) is not gone.
    """
    if getweakrefcount(entry.lock):
        return False
    extra = _lock_count(entry) - _ONLY_IN_ENTRY  # before a variable here refers to the lock
    obj = entry.lock
    extra -= sum(1 for other in held if other.lock is obj and other is not entry)
    if extra <= 0:
        return True
    frame = entry.frame
    if frame.f_code.co_flags & _SUSPENDABLE or not _reached_only_from(frame, obj, extra):
        return False
    return not _running(frame)  # a running frame's locals can still release it


def collected_gone(entry: Any, held: list) -> bool:
    """:func:`dropped`, for a lock that only cyclic garbage may keep: asked before a new edge
    from a held entry is reported as closing a cycle. A lock that only a reference cycle keeps
    (an object that refers to itself, an exception's traceback holding a frame) is gone: the
    collector would free it. Decided without a collection, which would run finalizers
    (``__del__``, weakref callbacks) here, on a thread that holds watched locks: one that takes
    such a lock would wait for this thread forever (:func:`_kept_by_garbage`). Not while the
    frame that acquired the lock is running (it may still release it); the order check asks
    nowhere else (it walks the heap, and a cycle is rare).
    """
    if _running(entry.frame):
        return False
    if _kept_by_garbage(entry, held):
        return True
    if _WALK_DECIDES:
        return False
    # 3.13 and later: the walk finds such a lock still referred to from outside the set (what
    # holds a counted reference there differs; not found yet), so the collector decides, as it
    # did everywhere before, with the hazard it had: a finalizer run here may take a lock this
    # thread holds (tests/test_dropped.py skips that case there).
    gc.collect()
    return dropped(entry, held)


def _kept_by_garbage(entry: Any, held: list) -> bool:
    """Whether nothing but the held stack and unreachable objects refer to the entry's lock: the
    cycle collector's reasoning on the lock's referrers, without collecting. The referrers are
    found level by level (``gc.get_referrers``: one walk of the heap per level, running no
    finalizer), up to :data:`_MAX_MEMBERS` objects and :data:`_MAX_LEVELS` levels: the set of
    objects that lead to the lock.
    Count the references each gets from inside the set (and from the held stack's entries),
    subtract them from its reference count: if anything is left for any of them, something
    outside refers to it, and through it to the lock: not gone. So is a lock reached from a
    class, a module, code, a weak reference, a running frame's local (a running frame lists no
    referents), or a set too large to walk."""
    if getweakrefcount(entry.lock):
        return False
    entries = {id(other) for other in held}
    members = [entry.lock]
    index = {id(entry.lock): 0}
    level = [entry.lock]
    depth = 0
    while level:
        if depth == _MAX_LEVELS:
            return False  # deeper: each level walks the heap once
        depth += 1
        found = gc.get_referrers(*level)
        asked, level = level, []
        for ref in found:
            if ref is members or ref is asked or ref is level or ref is found or id(ref) in entries:
                continue
            if id(ref) not in index:
                if (
                    isinstance(ref, _SHARED[:3])  # (a returned frame is a member)
                    or len(members) == _MAX_MEMBERS
                    or getweakrefcount(ref)
                ):
                    return False
                index[id(ref)] = len(members)
                members.append(ref)
                level.append(ref)
        found = asked = ref = None  # type: ignore[assignment]
    internal = [0] * len(members)  # references to each member from members and held entries
    for source in (*members, *held):
        for ref in gc.get_referents(source):
            k = index.get(id(ref))
            if k is not None:
                internal[k] += 1
    source = ref = None
    return all(_count(members, k) - _ONLY_IN_CONTAINER == internal[k] for k in range(len(members)))


def _running(frame: Any) -> bool:
    """Whether ``frame`` is on the calling thread's stack."""
    current: Any = _getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


def _reached_only_from(frame: Any, obj: Any, extra: int) -> bool:
    """Whether the ``extra`` references to ``obj`` all come from objects the returned ``frame``
    reaches that nothing else reaches: CPython's cycle collector's reasoning (count references
    from inside a set, subtract them from reference counts; what is left is referred to from
    outside, and so is all it reaches), on the few objects a frame keeps. Never through a class,
    a module, code, another frame, a function's globals or a method's function: they are shared,
    and a lock referred to from them has references this does not count."""
    members = [frame]
    seen = {id(frame): 0}
    internal = [0]  # references to each member from members
    out: list[list[int]] = [[]]  # the members each member refers to
    refers_to_obj = [False]
    to_obj = 0
    i = 0
    while i < len(members):
        refs = _referents(members[i], frame)
        for ref in refs:
            if ref is obj:
                to_obj += 1
                refers_to_obj[i] = True
            elif gc.is_tracked(ref) and not isinstance(ref, _SHARED):
                k = seen.get(id(ref))
                if k is None:
                    if len(members) == _MAX_MEMBERS:
                        return False
                    seen[id(ref)] = k = len(members)
                    members.append(ref)
                    internal.append(0)
                    out.append([])
                    refers_to_obj.append(False)
                internal[k] += 1
                out[i].append(k)
        i += 1
    ref = refs = None
    if to_obj != extra:  # something outside the set refers to the lock
        return False
    outside = []
    for k in range(1, len(members)):
        if _count(members, k) - _ONLY_IN_CONTAINER > internal[k]:
            outside.append(k)
    reached = set(outside)
    while outside:
        k = outside.pop()
        if refers_to_obj[k]:
            return False
        for j in out[k]:
            if j not in reached:
                reached.add(j)
                outside.append(j)
    return True


def _referents(m: Any, frame: Any) -> Any:
    t = type(m)
    if t is types.FunctionType:  # its closure; not its globals
        return () if m.__closure__ is None else (m.__closure__,)
    if t is types.MethodType or t is types.BuiltinMethodType:  # the object it is bound to
        bound = getattr(m, "__self__", None)
        return () if bound is None else (bound,)
    refs = gc.get_referents(m)
    if m is frame:
        # CPython lists a frame's locals among its referents once it has returned (from 3.11
        # on): a running or suspended frame reaches nothing here. Not its own function, nor its
        # globals and builtins (3.10 lists them too): shared, as a function's globals are.
        shared = (m.f_globals, m.f_builtins)
        return [
            r
            for r in refs
            if not (type(r) is types.FunctionType and r.__code__ is m.f_code)
            and not any(r is namespace for namespace in shared)
        ]
    return refs
