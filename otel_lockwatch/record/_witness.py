"""The values of the lock-order graph: an edge's first witness, a cycle, and their JSON forms.

An :class:`EdgeWitness` is the first example of the order ``holding -> acquiring``: who took the
second lock while holding the first, at which two sites, when, and in which trace. A
:class:`Cycle` is a closed chain of such edges, written from its smallest lock name, and is what
a potential deadlock is reported as (``Cycle.format()`` is the lockdep-style text that
``PotentialDeadlockError``, the reports and the pytest plugin all show).

These are immutable values: the graph that collects them is ``_order.LockOrderGraph``, whose
module docstring holds the design notes; the offline cycle search and merge are ``_cycles``.
The JSON checks are strict (exact keys, types and shapes), because a manifest is data that
crossed a process boundary and is read back by another version of this code.

Lock and thread names often come from request data, and the text of a cycle goes to a terminal
(the warning on stderr, the report) and into CI logs. So every name, site and time in that text
goes through :func:`printable`: a character that ``str.isprintable()`` refuses (ESC, a newline,
a bidirectional override, a lone surrogate) is written as its Python escape (``\\x1b``), and a
name past :data:`NAME_LIMIT` characters is cut with a visible marker. The text can neither
move the cursor, clear the screen, set a title, nor forge a line; the values themselves (and
their JSON) keep every character.

Public surface::

    EdgeWitness(holding, acquiring, worker, sites, at, trace_id, span_id)
        .to_json() -> dict            .from_json(d) -> EdgeWitness     .describe() -> str
    Cycle(locks, edges)               # edge i goes locks[i] -> locks[(i + 1) % n]
        .to_json() -> {"cycle": [...], "edges": [...]}     .from_json(d)
        .from_edges(witnesses)        # validates the chain, rotates to the canonical start
        .format() -> str              # lockdep-style report (also str(cycle))
    read_order_data(d) -> (witnesses, cycles)              # the "lock_order" part, checked
    utc_timestamp(ns=None) -> str     # "2026-11-30T02:40:00.123Z"
    printable(text, limit=NAME_LIMIT) -> str                # safe for a terminal, a log, DOT
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NAME_LIMIT", "Cycle", "EdgeWitness", "printable", "read_order_data", "utc_timestamp"]

_WITNESS_KEYS = frozenset({"holding", "acquiring", "worker", "sites", "at", "trace_id", "span_id"})
_CYCLE_KEYS = frozenset({"cycle", "edges"})

_RECURSIVE_NOTE = (
    "(two locks of one class held at once; a second worker taking them in the other order "
    "deadlocks)"
)


#: The most characters of one name that :func:`printable` shows; the rest is cut, visibly.
NAME_LIMIT = 200


def _escape(char: str) -> str:
    """A character that is not printable, as its Python escape: ``\\x1b``, ``\\n``,
    ``\\u202e``, ``\\ud800``."""
    return repr(char)[1:-1]


def printable(text: str, limit: int | None = NAME_LIMIT) -> str:
    """``text`` made safe for a terminal, a log line or a Graphviz string.

    Every character that ``str.isprintable()`` refuses (control characters such as ESC, CR, LF
    and NUL; C1 controls; format characters such as bidirectional overrides; line and paragraph
    separators; lone surrogates) is replaced by its Python escape, ``\\x1b`` for ESC. A
    backslash is kept as it is, so text that went through once is unchanged by a second pass.
    Past ``limit`` characters the text is cut and ``...(+N chars)`` says how many were left out.

    Args:
        text: any string (another object is shown as its ``str``).
        limit: the most characters of ``text`` kept, or None for no cut.
    """
    if not isinstance(text, str):
        text = str(text)
    cut = 0
    if limit is not None and len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    return f"{text}...(+{cut} chars)" if cut else text


def utc_timestamp(ns: int | None = None) -> str:
    """Format a wall-clock time as ISO-8601 UTC with milliseconds: ``2026-11-30T02:40:00.123Z``.

    Args:
        ns: nanoseconds since the epoch (``time.time_ns()``); now when ``None``.
    """
    if ns is None:
        ns = time.time_ns()
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1_000_000:03d}Z"


def _check_str(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


def _check_hex_or_none(what: str, value: Any, digits: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != digits or value.strip("0123456789abcdef") != "":
        raise ValueError(f"{what} must be {digits} lowercase hex digits or null, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class EdgeWitness:
    """The first example of the lock order ``holding -> acquiring``.

    Attributes:
        holding: the lock class held.
        acquiring: the lock class acquired (blocking) while ``holding`` was held.
        worker: the thread name, or ``task:<name>`` for an asyncio task.
        sites: ``(holding lock's acquisition site, acquiring site)``, each
            ``"module:function:line"``.
        at: when, ISO-8601 UTC with milliseconds (:func:`utc_timestamp`).
        trace_id: the current span's trace id (32 hex digits), or ``None``.
        span_id: the current span's id (16 hex digits), or ``None``.
    """

    holding: str
    acquiring: str
    worker: str
    sites: tuple[str, str]
    at: str
    trace_id: str | None = None
    span_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the witness as a JSON-ready dict with exactly the keys ``holding``,
        ``acquiring``, ``worker``, ``sites`` (a list), ``at``, ``trace_id`` and ``span_id``."""
        return {
            "holding": self.holding,
            "acquiring": self.acquiring,
            "worker": self.worker,
            "sites": list(self.sites),
            "at": self.at,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
        }

    @classmethod
    def from_json(cls, d: Any) -> EdgeWitness:
        """Read back :meth:`to_json`'s output.

        Args:
            d: a dict with exactly the keys of :meth:`to_json`.

        Raises:
            ValueError: a key is missing or extra, or a value has the wrong type or shape.
        """
        if not isinstance(d, dict):
            raise ValueError(f"edge witness must be an object, got {d!r}")
        if d.keys() != _WITNESS_KEYS:
            raise ValueError(
                f"edge witness must have the keys {sorted(_WITNESS_KEYS)}, got {sorted(d)}"
            )
        sites = d["sites"]
        if (
            not isinstance(sites, (list, tuple))
            or len(sites) != 2
            or not all(isinstance(s, str) for s in sites)
        ):
            raise ValueError(f"edge witness sites must be two strings, got {sites!r}")
        return cls(
            holding=_check_str("edge witness holding", d["holding"]),
            acquiring=_check_str("edge witness acquiring", d["acquiring"]),
            worker=_check_str("edge witness worker", d["worker"]),
            sites=(sites[0], sites[1]),
            at=_check_str("edge witness at", d["at"]),
            trace_id=_check_hex_or_none("edge witness trace_id", d["trace_id"], 32),
            span_id=_check_hex_or_none("edge witness span_id", d["span_id"], 16),
        )

    def describe(self) -> str:
        """One line for a report: ``A -> B: worker 'w1' held A (acquired at m:f:10) and
        acquired B (at m:f:12), 2026-11-30T02:40:00.123Z``, plus the trace when known.

        Names, sites and time go through :func:`printable`: the line is one line, whatever
        they hold."""
        holding, acquiring = printable(self.holding), printable(self.acquiring)
        line = (
            f"{holding} -> {acquiring}: worker '{printable(self.worker)}' held {holding} "
            f"(acquired at {printable(self.sites[0])}) and acquired {acquiring} "
            f"(at {printable(self.sites[1])}), {printable(self.at)}"
        )
        if self.trace_id is not None:
            line += f", trace {self.trace_id}"
            if self.span_id is not None:
                line += f" span {self.span_id}"
        return line


@dataclass(frozen=True, slots=True)
class Cycle:
    """A cycle in the lock-order graph: a potential deadlock.

    Attributes:
        locks: the lock classes in order, starting with the lexicographically smallest
            (canonical rotation). Length 1 for a self-edge (recursive locking of one class).
        edges: the witnesses; ``edges[i]`` is the edge ``locks[i] -> locks[(i + 1) % n]``.
    """

    locks: tuple[str, ...]
    edges: tuple[EdgeWitness, ...]

    @classmethod
    def from_edges(cls, edges: Sequence[EdgeWitness]) -> Cycle:
        """Build a cycle from its edges, in order from any starting edge.

        Args:
            edges: witnesses chaining head to tail and closing (the last edge's ``acquiring`` is
                the first edge's ``holding``), visiting no lock class twice.

        Raises:
            ValueError: the edges are empty, do not chain, do not close, or repeat a lock class.
        """
        if not edges:
            raise ValueError("a cycle needs at least one edge, got none")
        n = len(edges)
        for i, edge in enumerate(edges):
            nxt = edges[(i + 1) % n]
            if edge.acquiring != nxt.holding:
                raise ValueError(
                    f"cycle edges do not chain: {edge.holding} -> {edge.acquiring} "
                    f"is followed by {nxt.holding} -> {nxt.acquiring}"
                )
        locks = [edge.holding for edge in edges]
        if len(set(locks)) != n:
            raise ValueError(f"a cycle visits each lock class once, got {' -> '.join(locks)}")
        start = locks.index(min(locks))
        return cls(
            locks=tuple(locks[start:] + locks[:start]),
            edges=tuple(edges[start:]) + tuple(edges[:start]),
        )

    def to_json(self) -> dict[str, Any]:
        """Return ``{"cycle": [lock names], "edges": [witness dicts]}``."""
        return {"cycle": list(self.locks), "edges": [edge.to_json() for edge in self.edges]}

    @classmethod
    def from_json(cls, d: Any) -> Cycle:
        """Read back :meth:`to_json`'s output.

        Args:
            d: ``{"cycle": [...], "edges": [...]}``.

        Raises:
            ValueError: the keys are wrong, a witness is malformed, the edges do not form the
                cycle, or the cycle is not in canonical rotation.
        """
        if not isinstance(d, dict) or d.keys() != _CYCLE_KEYS:
            got = sorted(d) if isinstance(d, dict) else repr(d)
            raise ValueError(
                f"a cycle must be an object with the keys ['cycle', 'edges'], got {got}"
            )
        if not isinstance(d["edges"], list) or not isinstance(d["cycle"], list):
            raise ValueError(f"a cycle's 'cycle' and 'edges' must be lists, got {d!r}")
        cycle = cls.from_edges([EdgeWitness.from_json(e) for e in d["edges"]])
        if list(cycle.locks) != d["cycle"] or [e.to_json() for e in cycle.edges] != d["edges"]:
            raise ValueError(
                f"cycle {d['cycle']!r} does not match its edges, which give "
                f"{list(cycle.locks)!r} in canonical rotation"
            )
        return cycle

    def format(self) -> str:
        """Return the lockdep-style report: a header naming the cycle, then one line per edge
        saying which worker held what where, and when. Every name is :func:`printable` (safe
        for a terminal and a log, cut past :data:`NAME_LIMIT` characters).

        ::

            possible circular locking dependency: A -> B -> A
              A -> B: worker 'w1' held A (acquired at m:f:10) and acquired B (at m:f:12), ...
              B -> A: worker 'w2' held B (acquired at m:g:20) and acquired A (at m:g:21), ...
        """
        if len(self.locks) == 1:
            header = f"possible recursive locking: {printable(self.locks[0])} {_RECURSIVE_NOTE}"
        else:
            path = " -> ".join(printable(name) for name in self.locks + self.locks[:1])
            header = f"possible circular locking dependency: {path}"
        return "\n".join([header] + ["  " + edge.describe() for edge in self.edges])

    def __str__(self) -> str:
        return self.format()


def read_order_data(d: Any) -> tuple[list[EdgeWitness], list[Cycle]]:
    """Read the ``lock_order`` part of a snapshot or manifest: its witnesses and its cycles.

    Args:
        d: ``{"edges": [witness dicts], "cycles": [cycle dicts]}`` (other keys are ignored).

    Raises:
        ValueError: the data, a witness or a cycle is malformed.
    """
    if not isinstance(d, dict) or not {"edges", "cycles"} <= d.keys():
        got = sorted(d) if isinstance(d, dict) else repr(d)
        raise ValueError(f"lock-order data must be an object with 'edges' and 'cycles', got {got}")
    if not isinstance(d["edges"], list) or not isinstance(d["cycles"], list):
        raise ValueError(
            "lock-order data's 'edges' and 'cycles' must be lists, got "
            f"{type(d['edges']).__name__} and {type(d['cycles']).__name__}"
        )
    return (
        [EdgeWitness.from_json(e) for e in d["edges"]],
        [Cycle.from_json(c) for c in d["cycles"]],
    )
