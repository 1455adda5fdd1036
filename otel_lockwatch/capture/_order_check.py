"""The lock-order check: the edges a blocking acquire adds while other locks are held (lockdep).

Called by every lock path (``_bookkeeping``, the sections, ``asyncio``, distributed locks, and the
C path on a chain-cache miss) before a blocking acquire made while the worker holds locks. Each
(held class, acquired class) pair the worker has already added is in its chain cache
(``WorkerState.chain``): a repeated nesting costs one set lookup. A new pair goes to the
process's graph (``record._order``) with its first witness; an edge that closes a cycle is logged
(``warn``) or refused before the acquire blocks (``raise``: :class:`~..exceptions.
PotentialDeadlockError`, the one exception lockwatch raises into the host).

A held-stack entry is a ``HeldEntry`` (``_fast_path``); its site is read from its frame's code and
instruction offset only here, when an edge needs it.
"""

from __future__ import annotations

import _thread
import logging
from typing import Any

from opentelemetry import trace

from .._session import OUTBOX, RECORDER, THRESHOLDS
from ..exceptions import PotentialDeadlockError
from ..record._recorder import WorkerState
from ..record._sites import code_site
from ..record._witness import Cycle, EdgeWitness, utc_timestamp
from ._collection import defer_collection, resume_collection
from ._dropped import collected_gone, dropped
from ._naming import LockClass, site_of

__all__ = ["ADDRESS_ORDERED_KINDS", "check_order", "discard", "entry_site"]

#: The kinds (prefixes) whose two distinct locks of one class, held at once, are ordered by
#: their addresses while every nesting of the class took one address order: the in-process
#: primitives, whose object is the lock (code that takes them in ``id()`` order, as multidict's
#: ``_PairLock`` does, cannot deadlock on them). Not the sections of an array (a key's section
#: follows its hash: colliding keys deadlock on one thread), nor the locks of other processes
#: (distributed and ``multiprocessing`` locks: a lock object per call, and other address spaces).
ADDRESS_ORDERED_KINDS = ("threading.", "asyncio.")

logger = logging.getLogger("otel_lockwatch")


def entry_site(entry: Any) -> str:
    """``module:function:line`` where a held lock was acquired."""
    return code_site(entry.frame.f_code, entry.lasti)


# -- the lock order --------------------------------------------------------------------------
def check_order(
    state: WorkerState, lock_class: LockClass, frame: Any, lock: Any, canonical: bool
) -> None:
    """Called before a blocking acquire made while locks are held: add the new edges.

    A held entry whose pair is not in the chain cache adds no edge when its lock is the one being
    acquired (the holder waits for another thread's release: a hand-over, not an order), or when
    its lock is gone (``_dropped``: nobody can release it), which then leaves the stack and is
    reported (:func:`_held_lock_freed`). Both cost a cache miss only. A miss allocates under the
    held locks: from the first one on, the collector is off (``_collection``).
    """
    chain = state.chain
    gone = None
    deferred = False
    try:
        for entry in state.held:
            held_class = entry.lock_class
            if (
                canonical
                and entry.canonical
                and held_class is lock_class
                and entry.frame is frame
                and entry.lasti == frame.f_lasti
            ):
                continue  # one lock_many call (same frame and position) is ascending: canonical
            pair = (held_class, lock_class)
            if pair in chain:
                continue
            if (
                entry.lock is lock and lock_class.kind != "section"
            ):  # (an array's sections share it)
                continue
            if not deferred:
                defer_collection()
                deferred = True
            earlier = None
            if held_class is lock_class and lock_class.kind.startswith(ADDRESS_ORDERED_KINDS):
                ascending = id(lock) > id(entry.lock)
                noted = RECORDER.graph.nestings.order(lock_class.name)
                if noted == ascending:
                    continue  # the address order of every nesting of the class so far
                # The class's first order, kept for the life of the process, or the other one:
                # never from a lock that is gone (only cyclic garbage may keep it: asked once).
                freed = dropped(entry, state.held) or (
                    noted is None and collected_gone(entry, state.held)
                )
                if not freed:
                    earlier = _note_nesting(state, entry, lock_class, frame, ascending)
                    if earlier is None:
                        continue
            else:
                freed = dropped(entry, state.held)
            if freed or not _new_edge(state, entry, lock_class, frame, pair, earlier):
                gone = [entry] if gone is None else [*gone, entry]
        if gone is not None:
            _held_lock_freed(state, gone)
    finally:
        if deferred:
            resume_collection()


def _held_lock_freed(state: WorkerState, entries: list) -> None:
    """Take the entries of gone locks off the worker's stack; count each by lock class in the
    recorder, and warn once per class (lockdep's "held lock freed")."""
    state.in_lockwatch = True
    try:
        for entry in entries:
            discard(state.held, entry)
            name = entry.lock_class.name
            counts = RECORDER.held_locks_freed
            first = name not in counts
            counts[name] = counts.get(name, 0) + 1
            if first:
                logger.warning(
                    "otel-lockwatch: held lock freed: %s (acquired at %s by worker %r) is gone "
                    "while held; it orders no later acquisition",
                    name,
                    entry_site(entry),
                    state.worker,
                )
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        state.in_lockwatch = False


def _witness(state: WorkerState, entry: Any, lock_class: LockClass, frame: Any) -> EdgeWitness:
    """The witness of acquiring a lock of ``lock_class`` at ``frame`` while ``entry`` is held."""
    span_ctx = trace.get_current_span().get_span_context()
    return EdgeWitness(
        entry.lock_class.name,
        lock_class.name,
        state.worker,
        (entry_site(entry), site_of(frame)),
        utc_timestamp(),
        f"{span_ctx.trace_id:032x}" if span_ctx.is_valid else None,
        f"{span_ctx.span_id:016x}" if span_ctx.is_valid else None,
    )


def _note_nesting(
    state: WorkerState, entry: Any, lock_class: LockClass, frame: Any, ascending: bool
) -> EdgeWitness | None:
    """Note a lock of ``entry``'s own class acquired while ``entry`` is held (two distinct
    locks), in ``ascending`` address order or not: the first witness of the class's nestings in
    the other order, or None while every nesting of the class took one
    (``record._nesting``)."""
    state.in_lockwatch = True
    try:
        return RECORDER.graph.nestings.note(
            lock_class.name, ascending, _witness(state, entry, lock_class, frame)
        )
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
        return None
    finally:
        state.in_lockwatch = False


def _new_edge(
    state: WorkerState,
    entry: Any,
    lock_class: LockClass,
    frame: Any,
    pair: tuple,
    earlier: EdgeWitness | None = None,
) -> bool:
    """Add the edge from a held entry; False when, the edge closing a cycle, the collector found
    the held lock gone (kept only by a reference cycle: see ``collected_gone``). ``earlier``: for
    a self-edge of a class nested in both address orders, the first nesting in the other order
    (its report names both)."""
    state.in_lockwatch = True
    try:
        held_class = entry.lock_class
        witness = _witness(state, entry, lock_class, frame)
        graph = RECORDER.graph
        cycle = graph.would_close_cycle(held_class.name, lock_class.name, witness)
        if cycle is not None:
            if graph.witness(held_class.name, lock_class.name) is None and collected_gone(
                entry, state.held
            ):
                return False
            if THRESHOLDS.on_cycle == "raise":  # the session's cycle policy
                # Recorded for the manifest, refused now and on every later attempt (the pair
                # never enters the chain cache, and would_close_cycle answers every time).
                graph.add_edge(held_class.name, lock_class.name, witness)
                raise PotentialDeadlockError(_report(cycle, earlier), cycle.locks)
        cycle = graph.add_edge(held_class.name, lock_class.name, witness)
        state.chain.add(pair)
        if cycle is not None and THRESHOLDS.on_cycle == "warn":
            text = _report(cycle, earlier)
            logger.warning("otel-lockwatch: %s", text)
            OUTBOX.cycle(text, cycle.locks)
    except PotentialDeadlockError:
        raise
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        state.in_lockwatch = False
    return True


def _report(cycle: Cycle, earlier: EdgeWitness | None) -> str:
    """A cycle's report; for a class nested in both address orders, with the first nesting in
    the other order than the one that closed it."""
    text = cycle.format()
    if earlier is None:
        return text
    return f"{text}\n  in the other address order before: {earlier.describe()}"


#: What every removal from a held stack but its holder's pop of its own top entry holds (an
#: out-of-order release, a release by another thread, a lock gone while held), one per stack's
#: stripe: a removal finds its entry's index, then deletes there, and two at once on one stack
#: would shift each other's index (without the GIL they run at once). The holder's own pushes
#: and pops take none: they change the stack above every other entry, moving no index found
#: here. Re-entrant: a signal handler or a finalizer may release a lock on a thread inside one.
_REMOVALS = tuple(_thread.RLock() for _ in range(16))


def discard(held: list, entry: Any) -> None:
    """Remove ``entry`` from a held stack where it is not on top (an out-of-order release), or
    from another thread's (a ``Lock`` released by another thread than its holder, who may push
    and pop meanwhile); found by identity. Not there (gone already): nothing."""
    with _REMOVALS[(id(held) >> 4) % len(_REMOVALS)]:
        i = len(held) - 1
        while i >= 0:
            try:
                found = held[i]
            except IndexError:  # the holder popped its own entries above meanwhile
                i = len(held) - 1
                continue
            if found is entry:
                del held[i]
                return
            i -= 1
