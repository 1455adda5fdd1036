"""The hot path: what runs on every watched acquire and release.

wrapt installs and removes the patches (see ``_instrumentor``); what they install is here, and it
is kept lean, because an instrumentation that is slow becomes the contention it measures:

- A stdlib ``Lock`` / ``RLock`` created while instrumented is a ``__slots__`` proxy around the
  real lock (not a ``wrapt.ObjectProxy``: a method on one costs about 0.6 us more).
- The non-blocking acquire is tried first; the clock is read for a wait only when it fails
  (lock_stat and Abseil record contention only on the slow path).
- Counters and histograms go to the calling thread's :class:`~._recorder.Stats`: no process-wide
  lock. OpenTelemetry is reached only on the slow path (``_telemetry``).
- A blocking acquire made while other locks are held checks the lock order; the per-thread chain
  cache makes a repeated nesting cost about one set lookup.
- Nothing here raises into the host program except what the lock itself raises, and, when the
  ``raise`` policy is chosen, :class:`~.exceptions.PotentialDeadlockError` before blocking.
- The uncontended path also exists in C (``_speedups.c``: ``LockBase``, ``RLockBase``,
  ``SectionAcquire`` / ``SectionRelease``), used when it is built; the Python code here is the
  reference, serves every call the C path hands back (a timeout, a new thread, ...), and owns
  every slow path. ``LOCKWATCH_DISABLE_EXTENSIONS=1`` keeps to Python.

A held-stack entry is a tuple ``(lock class, frame, lasti, lock object, canonical)``; the frame's
code and the instruction offset at the acquisition give its site later, when a lock-order edge
needs it, without reading ``f_lineno`` now (which costs more than the rest of the entry).
"""

from __future__ import annotations

import _thread
import logging
import os
import sys
import threading
from time import perf_counter_ns as _pc
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ..exceptions import PotentialDeadlockError
from ..record._outbox import OUTBOX
from ..record._recorder import RECORDER, Stats, WorkerState
from ..record._witness import EdgeWitness, utc_timestamp
from ..sections._threaded import StripedSections
from ._naming import LockClass, site_of

__all__ = [
    "LockProxy",
    "RLockProxy",
    "configure",
    "section_acquire_factory",
    "section_release_factory",
]

logger = logging.getLogger("otel_lockwatch")

_getframe = sys._getframe
_get_ident = threading.get_ident
_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_TIMEOUT_MAX = threading.TIMEOUT_MAX
_NO_HOLD = 1 << 62

try:  # the ContextVar behind opentelemetry.context.get_current(): one C call on the hot path
    from opentelemetry.context import _RUNTIME_CONTEXT

    _ctx_get = _RUNTIME_CONTEXT._current_context.get  # type: ignore[attr-defined]
except Exception:  # another runtime context: the public (slower) call
    _ctx_get = otel_context.get_current

# Thresholds in nanoseconds and the cycle policy; set by configure() at instrument().
WAIT_SPAN_NS = 1_000_000
HOLD_SPAN_NS = 10_000_000
HOLD_METRIC_NS = 100_000
ON_CYCLE = "warn"


def _load_speedups() -> Any:
    """The C fast path (``_speedups``), or None: not built (no compiler, another interpreter or
    platform), or turned off with ``LOCKWATCH_DISABLE_EXTENSIONS=1`` (like wrapt's
    ``WRAPT_DISABLE_EXTENSIONS``). Read once, at import."""
    if os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS", "").strip().lower() in ("1", "true", "yes"):
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    # Its state is process-wide: one interpreter has it, a subinterpreter runs in Python.
    return _speedups if _speedups.claim() else None


_speedups = _load_speedups()
#: True when the uncontended path runs in C (``_speedups``); False for the pure-Python path.
SPEEDUPS = _speedups is not None


def configure(*, wait_span_ns: int, hold_span_ns: int, hold_metric_ns: int, on_cycle: str) -> None:
    """Set the thresholds the wrappers read (called by the instrumentor)."""
    global WAIT_SPAN_NS, HOLD_SPAN_NS, HOLD_METRIC_NS, ON_CYCLE
    WAIT_SPAN_NS = wait_span_ns
    HOLD_SPAN_NS = hold_span_ns
    HOLD_METRIC_NS = min(hold_metric_ns, hold_span_ns)
    ON_CYCLE = on_cycle
    if _speedups is not None:
        _speedups.set_hold_metric_ns(HOLD_METRIC_NS)


def _line_of(code: Any, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def entry_site(entry: tuple) -> str:
    """``module:function:line`` where a held lock was acquired."""
    code, lasti = entry[1].f_code, entry[2]
    return f"{_module_of_code(code)}:{code.co_name}:{_line_of(code, lasti)}"


_code_modules: dict[Any, str] = {}


def _module_of_code(code: Any) -> str:
    # The code object does not know its module; the file does. Map the file to a module name once.
    name = _code_modules.get(code.co_filename)
    if name is None:
        name = code.co_filename
        for mod_name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == code.co_filename:
                name = mod_name
                break
        _code_modules[code.co_filename] = name
    return name


# Frames that are not the acquisition site: RLockProxy.acquire / _acquire_restore calling
# LockProxy.acquire, and threading.Condition's __enter__ / wait() calling its lock's methods.
_OWN_GLOBALS = globals()
_THREADING_GLOBALS = vars(threading)


def _caller(f: Any) -> Any:
    """The first frame at or above ``f`` outside this module and ``threading`` (``f`` itself when
    there is none: C called in)."""
    first = f
    while f is not None and (f.f_globals is _OWN_GLOBALS or f.f_globals is _THREADING_GLOBALS):
        f = f.f_back
    return f if f is not None else first


# -- the lock-order check ------------------------------------------------------------------
def _check_order(st: Any, cls: LockClass, frame: Any, obj: Any, canonical: bool) -> None:
    """Called before a blocking acquire made while locks are held: add the new edges."""
    chain = st.chain
    for entry in st.held:
        hcls = entry[0]
        if (
            canonical
            and entry[4]
            and hcls is cls
            and entry[1] is frame
            and entry[2] == frame.f_lasti
        ):
            continue  # one lock_many call (same frame and position) is ascending: canonical
        pair = (hcls, cls)
        if pair in chain:
            continue
        _new_edge(st, entry, cls, frame, pair)


def _new_edge(st: Any, entry: tuple, cls: LockClass, frame: Any, pair: tuple) -> None:
    st.busy = True
    try:
        span_ctx = trace.get_current_span().get_span_context()
        trace_id = f"{span_ctx.trace_id:032x}" if span_ctx.is_valid else None
        span_id = f"{span_ctx.span_id:016x}" if span_ctx.is_valid else None
        hcls = entry[0]
        witness = EdgeWitness(
            hcls.name,
            cls.name,
            st.worker,
            (entry_site(entry), site_of(frame)),
            utc_timestamp(),
            trace_id,
            span_id,
        )
        graph = RECORDER.graph
        if ON_CYCLE == "raise":
            cycle = graph.would_close_cycle(hcls.name, cls.name, witness)
            if cycle is not None:
                # Recorded for the manifest, refused now and on every later attempt (the pair
                # never enters the chain cache, and would_close_cycle answers every time).
                graph.add_edge(hcls.name, cls.name, witness)
                raise PotentialDeadlockError(cycle.format(), cycle.locks)
        cycle = graph.add_edge(hcls.name, cls.name, witness)
        st.chain.add(pair)
        if cycle is not None and ON_CYCLE == "warn":
            text = cycle.format()
            logger.warning("otel-lockwatch: %s", text)
            OUTBOX.cycle_event(text, cycle.locks)
    except PotentialDeadlockError:
        raise
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        st.busy = False


# -- shared slow paths -----------------------------------------------------------------------
def _record_wait(
    st: Any,
    s: Stats,
    cls: LockClass,
    t0: int,
    t1: int,
    ok: bool,
    ctx: Any,
    frame: Any,
    extra: dict[str, Any] | None,
) -> None:
    w = t1 - t0
    s.cont += 1
    s.wait += w
    b = w.bit_length()
    b = ((b - 5) << 4) + (w >> (b - 5)) if b > 5 else w
    wh = s.whist
    wh[b] = wh.get(b, 0) + 1
    if w > s.wmax:
        s.wmax = w
    if w < s.wmin:
        s.wmin = w
    if ok:
        s.acq += 1
    else:
        s.tmo += 1
    st.busy = True
    try:
        OUTBOX.wait(
            cls,
            t0,
            t1,
            ctx,
            "acquired" if ok else "timed_out",
            WAIT_SPAN_NS,
            extra,
            site_of(frame) if w >= WAIT_SPAN_NS else None,
        )
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        st.busy = False


def _record_hold(
    st: Any, s: Stats, entry: tuple, t0: int, t1: int, ctx: Any, extra: dict[str, Any] | None
) -> None:
    # Only holds at or above HOLD_METRIC_NS get here (the slow path of a release).
    st.busy = True
    try:
        OUTBOX.hold(
            entry[0],
            t0,
            t1,
            ctx,
            HOLD_SPAN_NS,
            extra,
            entry_site(entry) if t1 - t0 >= HOLD_SPAN_NS else None,
        )
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        st.busy = False


def _discard(held: list, entry: tuple) -> None:
    for i in range(len(held) - 1, -1, -1):
        if held[i] is entry:
            del held[i]
            return


def _valid(blocking: Any, timeout: Any) -> bool:
    """True when (blocking, timeout) is a call the fast path reproduces exactly."""
    if timeout == -1:
        return True
    return bool(blocking) and type(timeout) in (int, float) and 0 <= timeout <= _TIMEOUT_MAX


def _untrack(
    st: Any, entry: tuple, s: Stats, t0: int, ctx: Any, extra: dict[str, Any] | None
) -> None:
    """Bookkeeping of a release: pop the held entry, record the hold."""
    t1 = _pc()
    h = t1 - t0
    held = st.held
    if held and held[-1] is entry:
        held.pop()
    else:
        _discard(held, entry)
    s.hold += h
    b = h.bit_length()
    b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
    hh = s.hhist
    hh[b] = hh.get(b, 0) + 1
    if h > s.hmax:
        s.hmax = h
    if h < s.hmin:
        s.hmin = h
    st.last = t1
    if h >= HOLD_METRIC_NS:
        _record_hold(st, s, entry, t0, t1, ctx, extra)


def _lock_wait(lock: Any, st: Any, s: Stats, cls: LockClass, f: Any, timeout: float = -1) -> bool:
    """The slow path of a blocking acquire whose try failed: wait, timed, and record the wait."""
    ctx = _ctx_get()
    t0 = _pc()
    ok = lock.acquire(True, timeout)
    _record_wait(st, s, cls, t0, _pc(), ok, ctx, f, None)
    return ok


# -- threading.Lock ------------------------------------------------------------------------
class _PyLockBase:
    """The pure-Python hot path of :class:`LockProxy`: the reference implementation.

    With the C extension built, ``LockProxy`` derives from ``_speedups.LockBase`` instead, whose
    methods run the same steps in C and hand every unusual call (a timeout, a new thread, no
    Python caller) to :meth:`acquire` here.
    """

    __slots__ = (
        "_lw_lock",
        "_lockwatch_class",
        "_lw_st",
        "_lw_entry",
        "_lw_s",
        "_lw_t0",
        "_lw_ctx",
        "__weakref__",
    )
    _lw_lock: Any
    _lockwatch_class: LockClass
    _lw_st: Any
    _lw_entry: tuple
    _lw_s: Stats
    _lw_t0: int
    _lw_ctx: Any

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        lock = self._lw_lock
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.busy or (timeout != -1 and not _valid(blocking, timeout)):
            return lock.acquire(blocking, timeout)
        cls = self._lockwatch_class
        s = st.stats.get(cls)
        if s is None:
            s = st.stats[cls] = Stats()
        try:
            f = _getframe(1)
        except ValueError:  # called straight from C (an atexit or C callback): no Python caller
            f = _getframe(0)
        g = f.f_globals
        if g is _OWN_GLOBALS or g is _THREADING_GLOBALS:
            f = _caller(f)  # an RLock or a Condition: the site is their caller's
        if blocking:
            if st.held:
                _check_order(st, cls, f, self, False)
            if lock.acquire(False):
                s.acq += 1
            elif not _lock_wait(lock, st, s, cls, f, timeout):
                return False
        elif lock.acquire(False):
            s.acq += 1
            s.tryok += 1
        else:
            s.skip += 1
            return False
        entry = (cls, f, f.f_lasti, self, False)
        st.held.append(entry)
        self._lw_entry = entry
        self._lw_s = s
        self._lw_ctx = _ctx_get()
        self._lw_st = st
        self._lw_t0 = _pc()
        return True

    __enter__ = acquire
    acquire_lock = acquire

    def release(self) -> None:
        st = self._lw_st
        if st is None:
            self._lw_lock.release()
            return
        # What the bookkeeping needs is read before the lock is free: from then on another
        # thread may take it and overwrite these slots.
        self._lw_st = None
        t0 = self._lw_t0
        entry = self._lw_entry
        s = self._lw_s
        ctx = self._lw_ctx
        self._lw_lock.release()
        # _untrack(), inlined: this is the hottest function of the package.
        t1 = _pc()
        h = t1 - t0
        held = st.held
        if held and held[-1] is entry:
            held.pop()
        else:
            _discard(held, entry)
        s.hold += h
        b = h.bit_length()
        b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
        hh = s.hhist
        hh[b] = hh.get(b, 0) + 1
        if h > s.hmax:
            s.hmax = h
        if h < s.hmin:
            s.hmin = h
        st.last = t1
        if h >= HOLD_METRIC_NS:
            _record_hold(st, s, entry, t0, t1, ctx, None)

    release_lock = release

    def __exit__(self, *args: Any) -> None:
        # release(), inlined (a `with` block is the common case: one call less per pair); any
        # arguments, as the lock's own __exit__ takes.
        st = self._lw_st
        if st is None:
            self._lw_lock.release()
            return
        # What the bookkeeping needs is read before the lock is free: from then on another
        # thread may take it and overwrite these slots.
        self._lw_st = None
        t0 = self._lw_t0
        entry = self._lw_entry
        s = self._lw_s
        ctx = self._lw_ctx
        self._lw_lock.release()
        # _untrack(), inlined: this is the hottest function of the package.
        t1 = _pc()
        h = t1 - t0
        held = st.held
        if held and held[-1] is entry:
            held.pop()
        else:
            _discard(held, entry)
        s.hold += h
        b = h.bit_length()
        b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
        hh = s.hhist
        hh[b] = hh.get(b, 0) + 1
        if h > s.hmax:
            s.hmax = h
        if h < s.hmin:
            s.hmin = h
        st.last = t1
        if h >= HOLD_METRIC_NS:
            _record_hold(st, s, entry, t0, t1, ctx, None)


if TYPE_CHECKING:
    _LockBase = _PyLockBase
else:
    _LockBase = _PyLockBase if _speedups is None else _speedups.LockBase


class LockProxy(_LockBase):
    """A watched ``threading.Lock``: the same methods, results, exceptions and ``repr``.

    ``acquire`` / ``__enter__`` / ``release`` / ``__exit__`` come from the base: the C
    ``_speedups.LockBase`` when it is built, else :class:`_PyLockBase`.
    """

    __slots__ = ()

    def __init__(self, lock: Any, cls: LockClass) -> None:
        self._lw_lock = lock
        self._lockwatch_class = cls
        self._lw_st = None

    def locked(self) -> bool:
        return self._lw_lock.locked()

    locked_lock = locked

    def _at_fork_reinit(self) -> None:
        self._lw_lock._at_fork_reinit()
        self._lw_st = None

    def __repr__(self) -> str:
        return repr(self._lw_lock)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy, deepcopy and pickle refuse a lock: the proxy refuses them the same way.
        return self._lw_lock.__reduce_ex__(protocol)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lw_lock, name)

    # For Condition: whether the calling thread holds this lock, without a try-acquire.
    def _lw_is_owned(self) -> bool:
        st = self._lw_st
        if st is not None:
            return st is getattr(RECORDER.tls, "st", None)
        if self._lw_lock.acquire(False):
            self._lw_lock.release()
            return False
        return True


# -- threading.RLock -----------------------------------------------------------------------
class _PyRLockBase(_PyLockBase):
    """The pure-Python hot path of :class:`RLockProxy` (``_speedups.RLockBase`` in C)."""

    __slots__ = ("_lw_depth",)
    _lw_depth: int

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if self._lw_st is st:  # re-entry by the owner: immediate
            ok = self._lw_lock.acquire(blocking, timeout)
            if ok:
                self._lw_depth += 1
            return ok
        return LockProxy.acquire(self, blocking, timeout)

    __enter__ = acquire

    def release(self) -> None:
        st = self._lw_st
        if st is None or st is not getattr(RECORDER.tls, "st", None):
            self._lw_lock.release()  # not tracked, or not the owner: the lock decides (and raises)
            return
        if self._lw_depth:
            self._lw_lock.release()
            self._lw_depth -= 1
            return
        LockProxy.release(self)

    def __exit__(self, *args: Any) -> None:
        self.release()


if TYPE_CHECKING:
    _RLockBase = _PyRLockBase
else:
    _RLockBase = _PyRLockBase if _speedups is None else _speedups.RLockBase


class RLockProxy(_RLockBase, LockProxy):
    """A watched ``threading.RLock``. Re-entry by the owner is neither a wait nor an order edge.

    ``acquire`` / ``__enter__`` / ``release`` / ``__exit__`` come from the base: the C
    ``_speedups.RLockBase`` when it is built, else :class:`_PyRLockBase`.
    """

    __slots__ = ()

    def __init__(self, lock: Any, cls: LockClass) -> None:
        LockProxy.__init__(self, lock, cls)
        self._lw_depth = 0

    def _is_owned(self) -> bool:
        return self._lw_lock._is_owned()

    def _recursion_count(self) -> int:
        return self._lw_lock._recursion_count()

    def _release_save(self) -> Any:
        # Condition.wait(): release completely; the depth travels in the lock's own state.
        st = self._lw_st
        if st is None or st is not getattr(RECORDER.tls, "st", None):
            return self._lw_lock._release_save()  # not tracked, or not the owner (it raises)
        # Untracked before the lock is free (another thread may take it at once, and track it).
        entry, s, t0, ctx, depth = (
            self._lw_entry,
            self._lw_s,
            self._lw_t0,
            self._lw_ctx,
            self._lw_depth,
        )
        self._lw_st = None
        self._lw_depth = 0
        try:
            state = self._lw_lock._release_save()
        except BaseException:  # it raised: nothing changed
            self._lw_st = st
            self._lw_depth = depth
            raise
        _untrack(st, entry, s, t0, ctx, None)
        return state

    def _acquire_restore(self, state: Any) -> None:
        # The owner re-acquires after Condition.wait(): a blocking acquire (waits and order are
        # recorded), then the re-entries the state had.
        count = state[0] if isinstance(state, tuple) and state and isinstance(state[0], int) else 1
        self.acquire()
        for _ in range(count - 1):
            self.acquire()

    def _at_fork_reinit(self) -> None:
        self._lw_lock._at_fork_reinit()
        self._lw_st = None
        self._lw_depth = 0


class _Absent:
    """A name the wrapped lock's type does not have: reading it raises ``AttributeError``, so
    ``hasattr`` and ``getattr`` answer for the proxy as for the lock."""

    def __init__(self, owner: str, name: str) -> None:
        self.message = f"{owner!r} object has no attribute {name!r}"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        raise AttributeError(self.message)


# An RLock lacks some of Lock's names (``locked`` until Python 3.14, the ``*_lock`` aliases):
# so does its proxy, which inherits them from LockProxy.
for _name, _present in (
    ("locked", LockProxy.locked),
    ("locked_lock", LockProxy.locked),
    ("acquire_lock", RLockProxy.acquire),
    ("release_lock", RLockProxy.release),
):
    if hasattr(_thread.RLock, _name):
        setattr(RLockProxy, _name, _present)
    else:
        setattr(RLockProxy, _name, _Absent("_thread.RLock", _name))
del _name, _present


# -- section arrays ------------------------------------------------------------------------
class _SectionSlot:
    """Per-section tracking of the current hold (one per section, created on first use)."""

    __slots__ = ("st", "entry", "s", "t0", "ctx", "index")

    def __init__(self, index: int) -> None:
        self.st: Any = None
        self.entry: tuple = ()
        self.s: Any = None
        self.t0 = 0
        self.ctx: Any = None
        self.index = index


class ArrayTrack:
    """What lockwatch keeps about one section array, in the array's ``_lw`` slot."""

    __slots__ = ("slots", "held", "max_held", "cls", "name", "count", "__weakref__")

    def __init__(self, array: Any) -> None:
        from ._naming import lock_class

        self.name = array._name
        self.count = array._count
        self.cls = lock_class(self.name, "section")
        self.slots: list[_SectionSlot | None] = [None] * self.count
        self.held: list[int] = []  # a counter whose append/pop/len are atomic under the GIL
        self.max_held = 0
        RECORDER.note_array(self)


def track_of(array: Any) -> ArrayTrack:
    track = array._lw
    if track is None or track.name != array._name:  # first use, or renamed by name_lock
        track = array._lw = ArrayTrack(array)
    return track


def _hold_section(track: ArrayTrack, index: int, st: Any, s: Stats, entry: tuple) -> None:
    slot = track.slots[index]
    if slot is None:
        slot = track.slots[index] = _SectionSlot(index)
    st.held.append(entry)
    slot.entry = entry
    slot.s = s
    slot.ctx = _ctx_get()
    slot.st = st
    held = track.held
    held.append(1)
    if len(held) > track.max_held:
        track.max_held = len(held)
    slot.t0 = _pc()


def _section_wait(
    original: Any,
    self: Any,
    index: int,
    key: Any,
    timeout: float,
    canonical: bool,
    st: Any,
    s: Stats,
    cls: LockClass,
    f: Any,
) -> bool:
    """The slow path of a blocking section acquire whose try failed: wait through the array's
    own ``_acquire``, timed, and record the wait (and whether it was a key collision)."""
    owner = self._owners[index]
    if owner is not None and owner == _get_ident():
        return original(self, index, key, True, timeout, canonical)  # raises the reentry error
    holder_key = self._keys[index]
    collision = holder_key is not None and holder_key != key
    ctx = _ctx_get()
    t0 = _pc()
    ok = original(self, index, key, True, timeout, canonical)
    if collision:
        s.coll += 1
    _record_wait(
        st,
        s,
        cls,
        t0,
        _pc(),
        ok,
        ctx,
        f,
        {"lockwatch.section.index": index, "lockwatch.section.collision": collision},
    )
    return ok


def section_acquire_factory(original: Any, sections_module_globals: dict) -> Any:
    """The instrumented ``StripedSections._acquire``; ``original`` is the uninstrumented one."""

    def _acquire(
        self: Any,
        index: int,
        key: Any,
        blocking: bool = True,
        timeout: float = -1,
        canonical: bool = False,
    ) -> bool:
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.busy:
            return original(self, index, key, blocking, timeout, canonical)
        track = self._lw
        if track is None or track.name != self._name:
            track = track_of(self)
        cls = track.cls
        s = st.stats.get(cls)
        if s is None:
            s = st.stats[cls] = Stats()
        try:
            f: Any = _getframe(1)
        except ValueError:  # called straight from C: no Python caller
            f = _getframe(0)
        while f.f_globals is sections_module_globals and f.f_back is not None:
            f = f.f_back
        if blocking:
            if st.held:
                _check_order(st, cls, f, self, canonical)
            # The array's own uncontended path, mirrored (StripedSections._acquire's first lines):
            # one Python call less on every acquisition. Everything else goes through `original`.
            if self._locks[index].acquire(False):
                self._owners[index] = _get_ident()
                self._keys[index] = key
                s.acq += 1
            elif not _section_wait(original, self, index, key, timeout, canonical, st, s, cls, f):
                return False
        elif original(self, index, key, False, -1, canonical):
            s.acq += 1
            s.tryok += 1
        else:
            s.skip += 1
            return False
        # _hold_section(), inlined.
        slot = track.slots[index]
        if slot is None:
            slot = track.slots[index] = _SectionSlot(index)
        entry = (cls, f, f.f_lasti, self, canonical)
        st.held.append(entry)
        slot.entry = entry
        slot.s = s
        slot.ctx = _ctx_get()
        slot.st = st
        held = track.held
        held.append(1)
        if len(held) > track.max_held:
            track.max_held = len(held)
        slot.t0 = _pc()
        return True

    _acquire.__wrapped__ = original  # type: ignore[attr-defined]
    if _speedups is not None:  # the same steps in C; unusual calls come back to _acquire
        return _speedups.SectionAcquire(original, _acquire, sections_module_globals)
    return _acquire


def section_release_factory(original: Any, mirror: bool = True) -> Any:
    """The instrumented ``StripedSections._release`` (``mirror``: do the array's release inline)."""

    def _release(self: Any, index: int) -> None:
        track = self._lw
        slot = track.slots[index] if track is not None else None
        if slot is None or slot.st is None:
            original(self, index)
            return
        # What the bookkeeping needs is read before the section is free.
        st = slot.st
        t0 = slot.t0
        entry = slot.entry
        s = slot.s
        ctx = slot.ctx
        if mirror:
            # Tracked, so held: the array's release, mirrored (StripedSections._release).
            slot.st = None
            self._owners[index] = None
            self._keys[index] = None
            self._locks[index].release()
        else:
            original(self, index)  # raises if not held: then nothing changed
            slot.st = None
        if track.held:
            track.held.pop()
        # _untrack(), inlined: the event path's release.
        t1 = _pc()
        h = t1 - t0
        held = st.held
        if held and held[-1] is entry:
            held.pop()
        else:
            _discard(held, entry)
        s.hold += h
        b = h.bit_length()
        b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
        hh = s.hhist
        hh[b] = hh.get(b, 0) + 1
        if h > s.hmax:
            s.hmax = h
        if h < s.hmin:
            s.hmin = h
        st.last = t1
        if h >= HOLD_METRIC_NS:
            _record_hold(st, s, entry, t0, t1, ctx, {"lockwatch.section.index": index})

    _release.__wrapped__ = original  # type: ignore[attr-defined]
    if _speedups is not None:  # the same steps in C; unusual calls come back to _release
        return _speedups.SectionRelease(original, _release, None, mirror)
    return _release


# -- threading.Semaphore / BoundedSemaphore ------------------------------------------------
# A semaphore counts permits and has no owner: any thread may release it. It is timed for its
# waits and counted, but it has no hold time and takes no part in the lock order.
def semaphore_acquire_factory(original: Any) -> Any:
    """The instrumented ``Semaphore.acquire`` (for instances created while instrumented)."""

    def acquire(self: Any, blocking: bool = True, timeout: float | None = None) -> bool:
        cls = self.__dict__.get("_lockwatch_class")
        if cls is None or (timeout is not None and not blocking):
            return original(self, blocking, timeout)
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.busy:
            return original(self, blocking, timeout)
        s = st.stats.get(cls)
        if s is None:
            s = st.stats[cls] = Stats()
        if original(self, False):
            s.acq += 1
            if not blocking:
                s.tryok += 1
            return True
        if not blocking:
            s.skip += 1
            return False
        ctx = _ctx_get()
        t0 = _pc()
        ok = original(self, True, timeout)
        _record_wait(st, s, cls, t0, _pc(), ok, ctx, _getframe(0), None)
        return ok

    acquire.__wrapped__ = original  # type: ignore[attr-defined]
    acquire.__doc__ = original.__doc__
    return acquire


def semaphore_release_factory(original: Any) -> Any:
    """The instrumented ``Semaphore.release``: it ends the worker's observed time."""

    def release(self: Any, n: int = 1) -> None:
        original(self, n)
        if "_lockwatch_class" in self.__dict__:
            st = getattr(RECORDER.tls, "st", None)
            if st is not None:
                st.last = _pc()

    release.__wrapped__ = original  # type: ignore[attr-defined]
    release.__doc__ = original.__doc__
    return release


if _speedups is not None:
    _speedups.setup(
        tls=_tls,
        py_acquire=_PyLockBase.acquire,
        py_rlock_acquire=_PyRLockBase.acquire,
        caller=_caller,
        check_order=_check_order,
        lock_wait=_lock_wait,
        section_wait=_section_wait,
        discard=_discard,
        record_hold=_record_hold,
        ctx_get=_ctx_get,
        failed=OUTBOX.failed,
        new_slot=_SectionSlot,
        own_globals=_OWN_GLOBALS,
        threading_globals=_THREADING_GLOBALS,
        worker_state=WorkerState,
        stats=Stats,
        track=ArrayTrack,
        sections=StripedSections,
    )
    _speedups.set_hold_metric_ns(HOLD_METRIC_NS)
