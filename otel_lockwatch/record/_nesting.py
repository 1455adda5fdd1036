"""The address order of each lock class's nestings: two distinct locks of one class held at once.

Code that must hold two locks of one class orders them by a key every worker agrees on, most
often ``id()`` (multidict's pure-Python ``MultiDict.extend`` takes two dicts' ``RLock`` so; a
transfer takes two account locks so). Such code cannot deadlock on them. So for the in-process
primitives (``capture._order_check.ADDRESS_ORDERED_KINDS``) the order check notes the address
order of each nesting (the second lock acquired at a higher address than the first, or a lower
one): while every nesting of a class took one order the class is ordered and adds no edge; the
first nesting the other way is recursive locking, the self-edge ``A -> A``, reported with the
first witness of each order (docs/lock-order.md).

Per process: addresses mean nothing in another one, so the notes are never serialized or merged.
"""

from __future__ import annotations

from ._witness import EdgeWitness

__all__ = ["NestingOrders"]


class NestingOrders:
    """The first address order (and its witness) of each lock class's nestings; at most
    ``max_classes`` classes are noted (a later one is not: :meth:`note` answers None for it).

    Thread-safe without a lock: one ``dict.setdefault`` decides which order is a class's first,
    atomically with or without the GIL, and a signal handler or a finalizer that re-enters here
    finds the dict whole."""

    __slots__ = ("_first", "_max_classes")

    def __init__(self, max_classes: int) -> None:
        self._max_classes = max_classes
        self._first: dict[str, tuple[bool, EdgeWitness]] = {}

    def order(self, name: str) -> bool | None:
        """The address order every nesting of class ``name`` has taken so far (True: ascending,
        False: descending), or None when none is noted."""
        first = self._first.get(name)
        return None if first is None else first[0]

    def note(self, name: str, ascending: bool, witness: EdgeWitness) -> EdgeWitness | None:
        """Note a nesting of two distinct locks of class ``name``, the second acquired at a higher
        address than the first (``ascending``) or a lower one.

        Returns None while every nesting of the class took one order (the first one's witness is
        kept), else the first witness of the other order: the class is not ordered, and the
        caller records the self-edge ``name -> name``.

        Raises:
            ValueError: ``witness`` is not for ``name -> name``.
        """
        if witness.holding != name or witness.acquiring != name:
            raise ValueError(
                f"witness is for {witness.holding!r} -> {witness.acquiring!r}, "
                f"not {name!r} -> {name!r}"
            )
        if name not in self._first and len(self._first) >= self._max_classes:
            return None
        first = self._first.setdefault(name, (ascending, witness))
        return None if first[0] == ascending else first[1]
