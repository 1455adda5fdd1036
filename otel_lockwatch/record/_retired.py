"""Ended workers' states, folded into one retired state per worker name and published in one step.

A process that starts a thread per request would keep a state per ended thread; the recorder
folds an ended worker's statistics into its name's retired state instead. Readers (a snapshot,
the emitter's totals and timeline samples) take no lock: they read the recorder's states in one
step, then each state's statistics. So a fold never changes a state a reader may hold: it makes
a new retired state (:func:`folded`: the old retired state's statistics and the ended worker's,
the objects neither changes shared, the ones both have merged into copies), and the recorder
puts it in the place of both at once (:func:`replaced`: in the retired state's place, whose
key the recorder keeps with the object that had it, so that no new state gets that key). A
reader that took the states before counts the old ones, one that took them after counts the
new one: each statistic once. The recorder folds ended workers in batches (one new retired state
a name a batch, each later one of the batch folded into that copy with :func:`fold`).
Folding in place, a reader between the ended worker's removal and the fold counted it nowhere,
and one after the fold that still held it counted it twice; the timeline, sampled from such
totals, then passed the lock's totals, and an evaluation refused the data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._handoff_stats import merge_handoffs

__all__ = ["Fold", "compacted", "fold", "fold_batch", "folded", "folded_copies", "replaced"]

#: A faster fold's common case (the C path's ``_speedups.fold``): ``common(into, other)`` folds
#: and returns True, or changes nothing and returns False. The recorder keeps the one its path
#: gives (``Recorder.use_fold``) and passes it to each fold; None: the Python fold alone.
Fold = Callable[[Any, Any], bool]


def fold(into: Any, other: Any, common: Fold | None = None) -> None:
    """Add an ended worker's statistics to a retired state that no reader has yet (a copy):
    at the cost of what the ended worker wrote (a thread that took one lock once: one
    ``Stats``); ``common`` first, when given (:data:`Fold`)."""
    if common is not None and common(into, other):
        return
    into.retired += max(0, other.last_event_ns() - other.first) + other.retired
    stats = into.stats
    for cls, s in other.stats.items():
        mine = stats.get(cls)
        if mine is None:
            stats[cls] = s  # the ended worker's own: nobody writes it any more
        else:
            mine.merge(s)
    if other.spans:
        for key, n in other.spans.items():
            into.spans[key] = into.spans.get(key, 0) + n
    if other.handoffs:
        merge_handoffs(into.handoffs, other.handoffs)


def folded(target: Any, other: Any, common: Fold | None = None) -> Any:
    """A new retired state: ``target``'s (a retired state) statistics and the ended worker
    ``other``'s; neither is changed. What only one of them has is shared (nobody writes an ended
    worker's statistics); what both have is merged into a copy."""
    new = type(target)(target.worker, dict(target.stats))
    new.thread = target.thread  # the retired states' owner: a worker that has ended
    new.first, new.last, new.retired = target.first, target.last, target.retired
    new.spans = dict(target.spans)
    for cls in other.stats.keys() & new.stats.keys():
        copy = type(new.stats[cls])()
        copy.merge(new.stats[cls])
        new.stats[cls] = copy
    merge_handoffs(new.handoffs, target.handoffs)  # copies, merged into below
    fold(new, other, common)
    return new


def replaced(by_id: dict[Any, Any], new: dict[Any, Any], gone: list[Any], nothing: Any) -> None:
    """Put each of ``new`` (key -> a new retired state) in ``by_id`` (the recorder's states) at
    its key (its name's retired state's place) and take the states of ``gone`` out, in one step
    for a reader: one ``dict.update`` (a C call: under the interpreter lock no reader's copy of
    the values comes between its stores, and on the free-threaded build it holds the dict's
    lock) sets every place, ``gone``'s to ``nothing`` (a state with no statistics: it counts
    nothing), whose places are then dropped. A copy of the dict in place of all (one
    assignment) would cost a walk of every state per fold: with 1,024 worker names, 60-70 us.
    """
    update = dict.fromkeys(map(id, gone), nothing)
    update.update(new)
    by_id.update(update)
    for state in gone:
        del by_id[id(state)]


def folded_copies(
    ended: list[Any], retired: dict[str, Any], common: Fold | None = None
) -> dict[str, Any]:
    """A new retired state for each name of ``ended`` (ended states whose names have a retired
    state in ``retired``): the first of a name into a copy of its retired state (:func:`folded`),
    the rest into that copy (:func:`fold`: nobody reads it yet). Name -> copy; nothing given is
    changed."""
    copies: dict[str, Any] = {}
    for state in ended:
        copy = copies.get(state.worker)
        if copy is None:
            copies[state.worker] = folded(retired[state.worker], state, common)
        elif common is None or not common(copy, state):  # (not through fold: a call fewer)
            fold(copy, state)
    return copies


def fold_batch(
    ended: list[Any],
    retired: dict[str, Any],
    keys: dict[str, Any],
    by_id: dict[Any, Any],
    nothing: Any,
    common: Fold | None = None,
) -> None:
    """Fold a batch of ended states (each in ``by_id``, its name's retired state in ``retired``,
    the state whose id is that retired state's key in ``keys``) into a new retired state a name
    (:func:`folded_copies`); then the copies take their names' places and the ended states
    leave, in one step for a reader (:func:`replaced`)."""
    copies = folded_copies(ended, retired, common)
    replaced(by_id, {id(keys[name]): copy for name, copy in copies.items()}, ended, nothing)
    retired.update(copies)


def compacted(
    states: list[Any], retired: dict[str, Any], common: Fold | None = None
) -> tuple[list[Any], dict[str, Any]]:
    """The states to keep of ``states`` (the recorder's, in order) and the retired states by
    name, once every ended worker's state that holds nothing is folded away: a name's first is
    retired in place, the rest go into a new retired state (:func:`folded_copies`), which takes
    the old one's place in the list. ``retired`` is not changed; an ended worker's state is
    written by nobody."""
    keep: list[Any] = []
    ended: list[Any] = []
    retired = dict(retired)
    kept = {id(state) for state in retired.values()}  # (not `in values()`: one compare each)
    for state in states:
        if id(state) in kept or state.alive() or state.held:
            keep.append(state)
        elif state.worker not in retired:
            state.retire()
            retired[state.worker] = state
            keep.append(state)
        else:
            ended.append(state)
    copies = folded_copies(ended, retired, common)
    replacing = {id(retired[name]): copy for name, copy in copies.items()}
    retired.update(copies)
    return [replacing.get(id(state), state) for state in keep], retired
