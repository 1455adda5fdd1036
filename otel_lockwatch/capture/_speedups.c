/* otel_lockwatch.capture._speedups: the uncontended lock path, in C.
 *
 * The pure-Python path (_bookkeeping.py, _threading.py, _sections.py) is the reference
 * implementation and stays in use for everything unusual; this module only takes over the common
 * case, where a Python function call costs more than the bookkeeping it runs. The contract
 * between the two (what this file takes over and hands back, what it calls back, the held stack's
 * entries and their push point, the fields it reads and writes, what it owns, its clock, its
 * state) is written once, in the docstring of capture/_fast_path.py: read it first.
 * tests/test_fast_path_contract.py holds both paths to it.
 *
 * The free-threaded build (PEP 703, Py_GIL_DISABLED): the module declares Py_MOD_GIL_NOT_USED, so
 * importing it leaves the GIL off, and every place below that relied on the GIL for atomicity
 * does something else there, under `#ifdef Py_GIL_DISABLED` (the GIL build compiles the code it
 * always did):
 *   - a field another thread may read or write (a lock proxy's hold, read by a waiter charging
 *     its wait to the holder; its class, which a rename replaces; a slot of WorkerState, Stats,
 *     Hold, ArrayTrack, HandoffStats) is read and written as CPython's own members are:
 *     PyMember_GetOne / PyMember_SetOne (an atomic load with a checked incref; a store under the
 *     object's critical section), and a proxy's hold as well: its stores exchanged under the
 *     proxy's critical section (hold_set, entry_released), a waiter's read under it too
 *     (hold_entry: a plain load and incref once took a reference to an entry freed between the
 *     two), the old value released after the store;
 *   - a held-stack entry is never reused (reused_entry): "its reference count is 1" does not
 *     mean "nobody can reach it" when a waiter may be reading the proxy's _lw_entry at that
 *     moment. A new entry is made before the raw acquire instead, as the Python path does, so
 *     the uncontended acquisition still allocates nothing with the lock held; and it is one of
 *     the thread's spares (spare_entry), made while it held nothing, so that the thread's count
 *     of tracked objects, from which that build's collector sets a collection off, does not
 *     rise inside critical sections (where it would run finalizers under the program's lock);
 *   - the collection deferral's count and the collector switch (collection_defer) run under a
 *     PyMutex of the module's state: a count and its switch are one step on every thread;
 *   - a StatsBase's counters are changed with atomic adds (a Lock may be released by a thread
 *     that is not its holder, which then writes the holder's Stats), and its hold histogram
 *     (the dense buckets and the dict, which the snapshot reads and Python may replace) under
 *     the Stats' critical section;
 *   - a held stack's compound steps (is the entry on top? pop it; find it and cut it out; the
 *     order check's walk) run under the list's critical section (a releasing thread may edit
 *     the holder's stack), and so does the held-sections counter's pop; a list's or dict's item
 *     is taken as a strong reference (PyList_GetItemRef, PyDict_GetItemRef), never borrowed;
 *   - a module-state object replaced by a later setup call is kept (in `retired`) until the
 *     module goes, not released: another thread may be calling the one it read a moment ago.
 *     Re-running setup() with other classes than before while other threads take watched locks
 *     is not supported there (a slot's class and offset are two words); with the same classes,
 *     as every re-import passes, the tables are left as they are.
 *   - a thread's registration and end (registered_state, ThreadEnd) write the recorder's tables
 *     under the recorder's lock, as the Python path does, and count the peak's live states on
 *     a copy of them (a start or an end on another thread may change them meanwhile).
 * The rest needs nothing: a thread's WorkerState cache is its own (a pthread key), the ended
 * threads' queue was already atomic, and a raw lock's own acquire and release order the hold's
 * notes between holders.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#error "otel_lockwatch.capture._speedups needs CPython 3.11 or later (PyFrame_GetLasti)"
#endif
#ifndef __linux__
#error "otel_lockwatch.capture._speedups reads CLOCK_MONOTONIC, which is perf_counter_ns on Linux only"
#endif

/* -- what the free-threaded build does differently (the header says why) --------------------
 * FT_LOAD / FT_STORE: a word another thread may write or read at the same time (relaxed: the
 * value alone matters). The GIL build reads and writes it plainly. */
#ifdef Py_GIL_DISABLED
#define FT_LOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define FT_STORE(field, value) __atomic_store_n(&(field), (value), __ATOMIC_RELAXED)
#define FT_ADD(field, delta) ((void)__atomic_fetch_add(&(field), (delta), __ATOMIC_RELAXED))
#else
#define FT_LOAD(field) (field)
#define FT_STORE(field, value) ((field) = (value))
#define FT_ADD(field, delta) ((void)((field) += (delta)))
#endif

/* A critical section (the object's own lock) on the free-threaded build; nothing under the GIL
 * (3.13 defines these as a block there; 3.11 and 3.12 do not define them). */
#ifndef Py_BEGIN_CRITICAL_SECTION
#define Py_BEGIN_CRITICAL_SECTION(op) {
#define Py_END_CRITICAL_SECTION() }
#endif
#ifndef Py_BEGIN_CRITICAL_SECTION2
#define Py_BEGIN_CRITICAL_SECTION2(a, b) {
#define Py_END_CRITICAL_SECTION2() }
#endif

/* seq[i] (new reference) of a list, i in range when read: another thread may shrink the list
 * meanwhile on the free-threaded build (then NULL with an IndexError). */
static inline PyObject *
list_item(PyObject *seq, Py_ssize_t i)
{
#ifdef Py_GIL_DISABLED
    return PyList_GetItemRef(seq, i);
#else
    return Py_NewRef(PyList_GET_ITEM(seq, i));
#endif
}

/* d[key] as a new reference in *out: 1 found, 0 not (*out NULL), -1 error. */
static inline int
dict_get_ref(PyObject *d, PyObject *key, PyObject **out)
{
#ifdef Py_GIL_DISABLED
    return PyDict_GetItemRef(d, key, out);
#else
    *out = Py_XNewRef(PyDict_GetItemWithError(d, key));
    return *out != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
#endif
}

/* -- slots read like the interpreter reads them -------------------------------------------
 * The Python objects the hot path touches (WorkerState, Stats, Hold, ArrayTrack,
 * StripedSections, HandoffStats) are __slots__ classes. A generic PyObject_GetAttr on one costs a
 * type lookup and a descriptor call; the interpreter's own LOAD_ATTR_SLOT reads the slot at its
 * offset. So does this, for an object of exactly the class whose member descriptor the setup
 * call resolved (any other object, a subclass included, takes the generic path and gets the same
 * answer). Each field is named here, beside the constant this file reads it by: a field's place
 * in the Python class's table is nobody's business but the class's. */
typedef struct {
    PyObject *name;     /* interned attribute name */
    PyTypeObject *type; /* the exact class resolved, or NULL: always generic */
    Py_ssize_t offset;
    PyMemberDef *member; /* its member (the free-threaded build reads and writes through it) */
} Slot;

enum {
    WORKER_HELD, WORKER_STATS, WORKER_IN_LOCKWATCH, WORKER_LAST, WORKER_HANDOFFS, WORKER_CHAIN,
    WORKER_WAITING, WORKER_FIRST, WORKER_WORKER, WORKER_SPANS, WORKER_THREAD, WORKER_RETIRED,
    WORKER_USED
};
static const char *const WORKER_NAMES[WORKER_USED] = {
    [WORKER_HELD] = "held",     [WORKER_STATS] = "stats",
    [WORKER_IN_LOCKWATCH] = "in_lockwatch", [WORKER_LAST] = "last",
    [WORKER_HANDOFFS] = "handoffs", [WORKER_CHAIN] = "chain", [WORKER_WAITING] = "waiting",
    /* (a state made here, registered_state, and one retired, retire_state) */
    [WORKER_FIRST] = "first", [WORKER_WORKER] = "worker", [WORKER_SPANS] = "spans",
    [WORKER_THREAD] = "thread", [WORKER_RETIRED] = "retired",
};
/* What a thread's registration and end read of the recorder (record._recorder.Recorder) and of
 * its peak (record._peak.PeakWorkers), by these names, which their THREAD_FIELDS declare
 * (setup_threads checks), and of record._recorder's globals (LIMIT_NAMES). Attributes of
 * ordinary instances, read generically: each may be replaced (a reset, a fork). */
enum {
    REC_LOCK, REC_BY_ID, REC_NAMES, REC_COMPACT_AT, REC_RETIRED, REC_RETIRED_KEYS, REC_ENDED,
    REC_PEAK, REC_FOLD_ENDED, REC_USED
};
static const char *const RECORDER_NAMES[REC_USED] = {
    [REC_LOCK] = "_lock", [REC_BY_ID] = "_by_id", [REC_NAMES] = "_names",
    [REC_COMPACT_AT] = "_compact_at", [REC_RETIRED] = "_retired",
    [REC_RETIRED_KEYS] = "_retired_keys", [REC_ENDED] = "_ended", [REC_PEAK] = "peak",
    [REC_FOLD_ENDED] = "_fold_ended",
};
enum { PEAK_LIVE, PEAK_GENERATION, PEAK_PEAK, PEAK_KEPT, PEAK_ENDED, PEAK_USED };
static const char *const PEAK_NAMES[PEAK_USED] = {
    [PEAK_LIVE] = "_live", [PEAK_GENERATION] = "_generation", [PEAK_PEAK] = "_peak",
    [PEAK_KEPT] = "_kept", [PEAK_ENDED] = "ended",
};
enum {
    LIMIT_MAX_WORKERS, LIMIT_FOLD_BATCH, LIMIT_ENDED, LIMIT_NOTHING_HELD, LIMIT_NO_CHAIN,
    LIMIT_NOTHING_WRITTEN, LIMIT_USED
};
static const char *const LIMIT_NAMES[LIMIT_USED] = {
    [LIMIT_MAX_WORKERS] = "MAX_WORKERS", [LIMIT_FOLD_BATCH] = "FOLD_BATCH",
    /* what a retired state keeps in place of what only a live worker writes (retire_state):
     * constants, read at setup_threads(), in this order */
    [LIMIT_ENDED] = "_ended", [LIMIT_NOTHING_HELD] = "_NOTHING_HELD",
    [LIMIT_NO_CHAIN] = "_NO_CHAIN", [LIMIT_NOTHING_WRITTEN] = "_NOTHING_WRITTEN",
};
/* The Stats fields a pair and a lock proxy's wait write: StatsBase owns them on this path (C
 * integers, and the hold histogram's dense buckets). */
enum {
    STATS_ACQUISITIONS, STATS_TRY_ACQUISITIONS, STATS_SKIPPED, STATS_HOLD_TOTAL,
    STATS_HOLD_HISTOGRAM, STATS_HOLD_MIN, STATS_HOLD_MAX, STATS_CONTENTIONS, STATS_TIMEOUTS,
    STATS_WAIT_TOTAL, STATS_WAIT_MIN, STATS_WAIT_MAX, STATS_LAST_RELEASE, STATS_USED
};
static const char *const STATS_NAMES[STATS_USED] = {
    [STATS_ACQUISITIONS] = "acquisitions", [STATS_TRY_ACQUISITIONS] = "try_acquisitions",
    [STATS_SKIPPED] = "skipped",           [STATS_HOLD_TOTAL] = "hold_total_ns",
    [STATS_HOLD_HISTOGRAM] = "hold_histogram", [STATS_HOLD_MIN] = "hold_min_ns",
    [STATS_HOLD_MAX] = "hold_max_ns",      [STATS_CONTENTIONS] = "contentions",
    [STATS_TIMEOUTS] = "timeouts",         [STATS_WAIT_TOTAL] = "wait_total_ns",
    [STATS_WAIT_MIN] = "wait_min_ns",      [STATS_WAIT_MAX] = "wait_max_ns",
    [STATS_LAST_RELEASE] = "last_release_ns",
};
/* _bookkeeping.HOLD_FIELDS: what an object that keeps a hold notes (LockBase has them as
 * members of these names). */
enum { HOLD_HOLDER, HOLD_ENTRY, HOLD_STATS, HOLD_START, HOLD_CONTEXT, HOLD_USED };
static const char *const HOLD_NAMES[HOLD_USED] = {
    [HOLD_HOLDER] = "_lw_holder", [HOLD_ENTRY] = "_lw_entry", [HOLD_STATS] = "_lw_stats",
    [HOLD_START] = "_lw_start_ns", [HOLD_CONTEXT] = "_lw_context",
};
enum { TRACK_SLOTS, TRACK_HELD_SECTIONS, TRACK_MAX_HELD, TRACK_LOCK_CLASS, TRACK_NAME, TRACK_USED };
static const char *const TRACK_NAMES[TRACK_USED] = {
    [TRACK_SLOTS] = "slots", [TRACK_HELD_SECTIONS] = "held_sections",
    [TRACK_MAX_HELD] = "max_held", [TRACK_LOCK_CLASS] = "lock_class", [TRACK_NAME] = "name",
};
enum { ARRAY_TRACK, ARRAY_NAME, ARRAY_LOCKS, ARRAY_OWNERS, ARRAY_KEYS, ARRAY_USED };
static const char *const ARRAY_NAMES[ARRAY_USED] = {
    [ARRAY_TRACK] = "_lw", [ARRAY_NAME] = "_name", [ARRAY_LOCKS] = "_locks",
    [ARRAY_OWNERS] = "_owners", [ARRAY_KEYS] = "_keys",
};
/* record/_handoff_stats.py's HandoffStats: the fields a take and a give write. */
enum {
    HANDOFF_TAKES, HANDOFF_GIVES, HANDOFF_MOST, HANDOFF_FEWEST, HANDOFF_PENDING, HANDOFF_HOLD_TOTAL,
    HANDOFF_HOLD_HISTOGRAM, HANDOFF_HOLD_MIN, HANDOFF_HOLD_MAX, HANDOFF_USED
};
static const char *const HANDOFF_NAMES[HANDOFF_USED] = {
    [HANDOFF_TAKES] = "takes", [HANDOFF_GIVES] = "gives", [HANDOFF_MOST] = "most",
    [HANDOFF_FEWEST] = "fewest", [HANDOFF_PENDING] = "pending",
    [HANDOFF_HOLD_TOTAL] = "hold_total_ns", [HANDOFF_HOLD_HISTOGRAM] = "hold_histogram",
    [HANDOFF_HOLD_MIN] = "hold_min_ns", [HANDOFF_HOLD_MAX] = "hold_max_ns",
};

/* One class the C path reads: the setup keyword that passes it, its fields' names here, and its
 * resolved fields (in the module's state). */
typedef struct {
    const char *keyword;
    const char *const *names;
    int used;
} TableSpec;

enum {
    TABLE_WORKER, TABLE_STATS, TABLE_HOLD, TABLE_TRACK, TABLE_ARRAY, TABLE_HANDOFF, TABLE_COUNT
};
static const TableSpec TABLE_SPECS[TABLE_COUNT] = {
    [TABLE_WORKER] = {"worker_state", WORKER_NAMES, WORKER_USED},
    [TABLE_STATS] = {"stats", STATS_NAMES, STATS_USED},
    [TABLE_HOLD] = {"hold", HOLD_NAMES, HOLD_USED},
    [TABLE_TRACK] = {"track", TRACK_NAMES, TRACK_USED},
    [TABLE_ARRAY] = {"array", ARRAY_NAMES, ARRAY_USED},
    [TABLE_HANDOFF] = {"fields", HANDOFF_NAMES, HANDOFF_USED},
};

typedef struct {
    const TableSpec *spec;
    Slot *slots;
    PyObject *type; /* a strong reference: a resolved offset stays valid */
} Table;

struct ModuleState;

/* A thread's cached WorkerState (see "the calling thread's WorkerState, cached in C"). */
#ifdef Py_GIL_DISABLED
/* How many spare held entries a thread keeps (see spare_entry). */
#define SPARES 8
#endif

typedef struct ThreadCache {
    PyThreadState *tstate; /* the thread state the entry was read in, and its id: a new thread */
    uint64_t tstate_id;    /* state on the same OS thread (PyGILState_Ensure) reads it anew */
    unsigned long generation;
    PyObject *st;                /* strong reference, or NULL */
    struct ModuleState *owner;   /* whose queue it joins when its thread ends */
    struct ThreadCache *next;    /* on the queue of ended threads' entries */
#ifdef Py_GIL_DISABLED
    PyObject *spares[SPARES]; /* strong references, never shown to anyone: spare_entry */
    int nspare;
#endif
} ThreadCache;

/* -- the module's state ---------------------------------------------------------------------
 * Everything this file keeps is here, one per module object (PEP 3121 / 489): no mutable static
 * at file level. Lock proxies and section functions keep a pointer to it (their type keeps the
 * module alive), read on the hot path without a lookup; module functions get it from their
 * module. Under the GIL every field is written with the GIL held, except `ended` (atomic: a
 * pthread key destructor pushes onto it without the GIL); the free-threaded build's differences
 * are in the header. */
typedef struct ModuleState {
    /* setup(), from _bookkeeping.py */
    PyObject *tls;          /* RECORDER.tls */
    PyObject *context;      /* the current OpenTelemetry context: context() */
    PyObject *context_var;  /* the ContextVar whose get() context is, else NULL */
    PyObject *failed;       /* OUTBOX.failed(exc) */
    PyObject *check_order;  /* check_order(Acquisition) */
    PyObject *waits_queue;  /* RECORDER.waits.queue (record._waits: never replaced) */
    PyObject *waits_append; /* its append */
    PyObject *waits_add;    /* RECORDER.waits.add: a wait when the queue is at its limit */
    long long waits_limit;  /* UnfiledWaits.LIMIT */
    PyObject *threads;      /* threading._active: a span's thread name */
    PyObject *record_hold;  /* record_hold(Release) */
    PyObject *new_state;    /* RECORDER.new_thread_state(): a thread's first state */
    PyObject *new_stats;    /* _fast_path.new_stats(): a worker's first Stats of a class */
    /* setup_threads(), from _bookkeeping: a thread's registration and end in C */
    PyObject *recorder;       /* RECORDER, or NULL: new_state's */
    PyObject *limits;         /* record._recorder's globals (LIMIT_NAMES) */
    /* and what a retired state keeps in their place (retire_state), constants read from there */
    PyObject *retired_thread, *nothing_held, *no_chain, *nothing_written;
    PyObject *rec_names[REC_USED], *peak_names[PEAK_USED], *limit_names[LIMIT_USED];
    PyObject *outbox;       /* OUTBOX: a hold's record, queued here (hold_queued) */
    long long outbox_size;  /* Outbox.QUEUE_SIZE */
    long long hold_span_ns; /* set_thresholds(): THRESHOLDS.hold_span_ns */
    long long wait_span_ns; /* and THRESHOLDS.wait_span_ns */
    int ready;
    /* setup_locks(), from _threading.py */
    PyObject *python_acquire;       /* the Python LockProxy.acquire */
    PyObject *python_rlock_acquire; /* the Python RLockProxy.acquire */
    PyObject *skip_frames;          /* module globals whose frames are not a lock's site */
    PyObject *window; /* window(Acquisition) -> bool: taken by yielding to a holder inside
                       * lockwatch's window (_switched_out.window_event) */
    int locks_ready;
    /* setup_sections(), from _sections.py */
    PyObject *section_wait; /* section_wait(Acquisition) -> bool */
    int sections_ready;
    /* setup_handoffs(), from _handoffs.py */
    PyObject *handoff_stats; /* handoff_stats(st, cls): the HandoffStats, made on first use */
    PyObject *deque_type, *deque_append, *deque_pop; /* collections.deque's */
    /* set_thresholds(), from _bookkeeping: the session's THRESHOLDS.hold_metric_ns */
    long long hold_metric_ns;
    /* the raw locks' types and methods */
    PyObject *lock_type, *lock_acquire, *lock_release;    /* _thread.LockType's */
    PyObject *rlock_type, *rlock_acquire, *rlock_release; /* _thread.RLock's */
    /* Their C functions, called directly where their calling convention is the one expected
     * (else NULL: the descriptor is called): no argument vector converted to a tuple per call. */
    PyCFunctionWithKeywords lock_acquire_fn, rlock_acquire_fn;
    PyCFunction lock_release_fn, rlock_release_fn;
    int raw_lock_layout;  /* 1: a _thread.lock is a RawLock */
    int raw_rlock_layout; /* 1: a _thread.RLock is a RawRLock */
    PyObject *false_args; /* (False,) */
    PyObject *one, *minus_one;
    /* interned attribute names */
    PyObject *str_accepting, *str_started, *str_queue, *str_lock_hold; /* the outbox's */
    PyObject *str_dunder_dict;
    PyObject *str_wait_histogram, *str_begin; /* a wait's */
    PyObject *str_dunder_name, *str_st, *str_acquire, *str_release, *str_append, *str_pop,
        *str_lockwatch_class, *str_value, *str_lw_capacity, *str_waiters, *str_is_owned;
    /* the collector held off (collection_defer) */
    long deferrals;
    int collection_was_enabled;
    /* CPython 3.12 only (SCHEDULED_COLLECTIONS_IGNORE_DISABLE): gc.get_threshold and
     * gc.set_threshold, the thresholds a deferral raised (NULL: none), and the raised ones */
    PyObject *gc_get_threshold, *gc_set_threshold, *saved_thresholds, *raised_thresholds;
#ifdef Py_GIL_DISABLED
    PyMutex deferral_lock; /* a count and its switch, as one step */
    PyObject *retired;     /* the objects later setup calls replaced (a list, or NULL) */
#endif
    /* the threads' cached WorkerStates */
    pthread_key_t cache_key;
    int cache_key_made;
    unsigned long generation;
    ThreadCache *_Atomic ended; /* entries of ended threads, to release */
    /* the classes read at their slots' offsets */
    Slot worker[WORKER_USED], stats[STATS_USED], hold[HOLD_USED], track[TRACK_USED],
        array[ARRAY_USED], handoff[HANDOFF_USED];
    Table tables[TABLE_COUNT];
    /* the types */
    PyTypeObject *held_entry_type, *acquisition_type, *release_type, *stats_base_type, *lock_base_type, *rlock_base_type,
        *section_acquire_type, *section_release_type, *semaphore_acquire_type,
        *semaphore_release_type, *condition_notify_type, *creation_gate_type, *creation_call_type,
        *thread_end_type;
    PyObject *str_name, *str_alive, *str_other;
} ModuleState;

static struct PyModuleDef speedups_module;

static inline ModuleState *
module_state(PyObject *module)
{
    return (ModuleState *)PyModule_GetState(module);
}

static inline long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

/* -- a held-stack entry: _fast_path.HELD_ENTRY_FIELDS, in order -----------------------------
 * A struct sequence (a tuple whose fields have names, as os.stat_result): made here without a
 * call, read by name in Python. The pure path's PyHeldEntry has the same fields. */
enum { ENTRY_LOCK_CLASS, ENTRY_FRAME, ENTRY_LASTI, ENTRY_LOCK, ENTRY_CANONICAL, ENTRY_FIELDS };
static const PyStructSequence_Field held_entry_fields[] = {
    [ENTRY_LOCK_CLASS] = {"lock_class", "The lock's class (LockClass)."},
    [ENTRY_FRAME] = {"frame", "The frame that acquired it."},
    [ENTRY_LASTI] = {"lasti", "Its instruction offset then (f_lasti)."},
    [ENTRY_LOCK] = {"lock", "The object that keeps the hold (its identity)."},
    [ENTRY_CANONICAL] = {"canonical", "Taken by lock_many in canonical order."},
    [ENTRY_FIELDS] = {NULL, NULL},
};
static const PyStructSequence_Desc held_entry_desc = {
    "otel_lockwatch.capture._speedups.HeldEntry",
    "HeldEntry((lock_class, frame, lasti, lock, canonical)): a held-stack entry "
    "(_fast_path.HELD_ENTRY_FIELDS).",
    (PyStructSequence_Field *)held_entry_fields,
    ENTRY_FIELDS,
};

#define ENTRY_GET(entry, field) PyStructSequence_GET_ITEM((entry), (field))

#ifdef Py_GIL_DISABLED
/* The free-threaded build's collector counts each thread's allocations of the objects it tracks
 * (less its frees) and, at every 512th, may set a collection off: on that thread, at its next
 * eval-breaker check. The program's own short-lived objects come from free lists and are not
 * counted; a held entry made per acquisition (this build reuses none: reused_entry) is, and,
 * alive for the hold, made the thread's critical sections the highs of its count, where the
 * 512th allocation falls: a collection set off there ran the finalizers under the program's
 * lock, and one that takes that lock waited for itself forever (tests/test_finalizers.py; plain,
 * never). So a thread keeps a few spare entries, made while it held nothing and never shown to
 * anyone, and an acquisition fills one in instead of making one: the count stays where the
 * program left it. The spares are made again after a release that leaves the thread holding
 * nothing, where the count rises and a collection it sets off runs with no lock of the program
 * held: one allocation per hold, as before, moved out of the critical section. */
static PyObject *
spare_entry(ModuleState *S)
{
    ThreadCache *c = pthread_getspecific(S->cache_key);
    if (c == NULL || c->nspare == 0)
        return NULL;
    PyObject *entry = c->spares[--c->nspare];
    c->spares[c->nspare] = NULL;
    return entry; /* (its items NULL: new_entry fills them in) */
}

/* The calling thread's spares made again, when `st` is its state and holds nothing. */
static void
spares_fill(ModuleState *S, PyObject *st, PyObject *held)
{
    ThreadCache *c = pthread_getspecific(S->cache_key);
    if (c == NULL || c->st != st || c->nspare == SPARES || PyList_GET_SIZE(held) != 0)
        return;
    while (c->nspare < SPARES) {
        PyObject *entry = PyStructSequence_New(S->held_entry_type); /* (its items NULL) */
        if (entry == NULL) {
            PyErr_Clear();
            return;
        }
        c->spares[c->nspare++] = entry;
    }
}

/* A thread's spares, freed with its cache entry. */
static void
spares_free(ThreadCache *c)
{
    while (c->nspare > 0)
        Py_CLEAR(c->spares[--c->nspare]);
}
#endif

/* A new entry (what HeldEntry((cls, f, f.f_lasti, lock, canonical)) makes), or NULL with an
 * error. */
static PyObject *
new_entry(ModuleState *S, PyObject *cls, PyObject *f, PyObject *lock, PyObject *canonical)
{
    PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti((PyFrameObject *)f));
    if (lasti == NULL)
        return NULL;
#ifdef Py_GIL_DISABLED
    PyObject *entry = spare_entry(S);
    if (entry == NULL)
        entry = PyStructSequence_New(S->held_entry_type);
#else
    PyObject *entry = PyStructSequence_New(S->held_entry_type);
#endif
    if (entry == NULL) {
        Py_DECREF(lasti);
        return NULL;
    }
    PyStructSequence_SET_ITEM(entry, ENTRY_LOCK_CLASS, Py_NewRef(cls));
    PyStructSequence_SET_ITEM(entry, ENTRY_FRAME, Py_NewRef(f));
    PyStructSequence_SET_ITEM(entry, ENTRY_LASTI, lasti);
    PyStructSequence_SET_ITEM(entry, ENTRY_LOCK, Py_NewRef(lock));
    PyStructSequence_SET_ITEM(entry, ENTRY_CANONICAL, Py_NewRef(canonical));
    if (!PyObject_GC_IsTracked(entry)) /* it refers to its lock, which refers to it */
        PyObject_GC_Track(entry);
    return entry;
}

/* -- the slow paths' events: _fast_path.ACQUISITION_FIELDS and RELEASE_FIELDS ----------------
 * A slow path (the order check on a chain-cache miss, a wait, a hold at or above the metric
 * floor) is called with one event whose fields have names (a struct sequence), never with an
 * argument list whose order both sides would have to agree on. A field a path has no use for is
 * None. */
enum {
    ACQ_WORKER, ACQ_STATS, ACQ_LOCK_CLASS, ACQ_FRAME, ACQ_LOCK, ACQ_HOLD, ACQ_CANONICAL,
    ACQ_TIMEOUT, ACQ_INDEX, ACQ_KEY, ACQ_ORIGINAL, ACQ_FIELDS
};
static const PyStructSequence_Field acquisition_fields[] = {
    [ACQ_WORKER] = {"worker", "The worker's WorkerState."},
    [ACQ_STATS] = {"stats", "Its Stats for the lock's class (None for the order check)."},
    [ACQ_LOCK_CLASS] = {"lock_class", "The lock's class."},
    [ACQ_FRAME] = {"frame", "The acquisition site's frame."},
    [ACQ_LOCK] = {"lock", "The raw lock to wait on (None for a section or the order check)."},
    [ACQ_HOLD] = {"hold", "The object that keeps the hold: a lock proxy, or a section array."},
    [ACQ_CANONICAL] = {"canonical", "Taken by lock_many in canonical order."},
    [ACQ_TIMEOUT] = {"timeout", "The acquire's timeout (a wait)."},
    [ACQ_INDEX] = {"index", "The section's index (a section's wait)."},
    [ACQ_KEY] = {"key", "The section's key (a section's wait)."},
    [ACQ_ORIGINAL] = {"original", "The array's own _acquire (a section's wait)."},
    [ACQ_FIELDS] = {NULL, NULL},
};
static const PyStructSequence_Desc acquisition_desc = {
    "otel_lockwatch.capture._speedups.Acquisition",
    "An acquisition that takes a slow path (_fast_path.ACQUISITION_FIELDS).",
    (PyStructSequence_Field *)acquisition_fields,
    ACQ_FIELDS,
};
enum { REL_WORKER, REL_ENTRY, REL_START_NS, REL_END_NS, REL_CONTEXT, REL_INDEX, REL_FIELDS };
static const PyStructSequence_Field release_fields[] = {
    [REL_WORKER] = {"worker", "The worker's WorkerState."},
    [REL_ENTRY] = {"entry", "The hold's HeldEntry."},
    [REL_START_NS] = {"start_ns", "When the hold began (perf_counter_ns)."},
    [REL_END_NS] = {"end_ns", "When it ended."},
    [REL_CONTEXT] = {"context", "The OpenTelemetry context at the acquisition."},
    [REL_INDEX] = {"index", "The section's index, or None."},
    [REL_FIELDS] = {NULL, NULL},
};
static const PyStructSequence_Desc release_desc = {
    "otel_lockwatch.capture._speedups.Release",
    "A release whose hold takes the slow path (_fast_path.RELEASE_FIELDS).",
    (PyStructSequence_Field *)release_fields,
    REL_FIELDS,
};

/* -- the cyclic collector held off while lockwatch allocates under a lock ------------------
 * (_collection.py is the reference.) A collection runs finalizers on the thread whose allocation
 * set it off; one that lockwatch's own bookkeeping set off while the thread holds a lock runs a
 * finalizer that may wait for that very lock (a plain program that allocates nothing under its
 * locks never does). So lockwatch's allocations under a held lock run with the collector off:
 * the first of nested deferrals (on any thread) notes whether it was on and turns it off, the
 * last turns it back on if it was; the objects they counted are collected at the program's next
 * allocation, wherever the program's own would have been. Under the GIL, with no Python code
 * between the count and the switch, a deferral is atomic; on the free-threaded build the count
 * and the switch run under the state's deferral lock (else a first deferral's switch and a
 * last's could interleave, and the collector stay off for good). */
#ifdef Py_GIL_DISABLED
#define DEFERRAL_LOCK(S) PyMutex_Lock(&(S)->deferral_lock)
#define DEFERRAL_UNLOCK(S) PyMutex_Unlock(&(S)->deferral_lock)
#else
#define DEFERRAL_LOCK(S) ((void)0)
#define DEFERRAL_UNLOCK(S) ((void)0)
#endif

/* CPython 3.12 schedules a collection at an allocation and runs it at the interpreter's next
 * check (a Python call, a loop's jump), and runs it there even while the collector is disabled
 * (3.12.1: gc.disable() after the scheduling allocation, then a Python call, collects; 3.11
 * collects inside the allocation, 3.13 and later skip a scheduled collection while disabled).
 * A slow path's Python callback under a held lock would run it, and its finalizers, there. So
 * on 3.12 a deferral that calls Python (python_ahead) also raises the collector's thresholds: a
 * scheduled collection that runs meanwhile finds no generation due and collects nothing; the
 * thresholds come back with the last resume, and the next allocation sets the collection off
 * again. (Only then: C alone runs no check, and the two gc calls cost about 3,000 instructions,
 * twice a nested acquisition's own.) */
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define SCHEDULED_COLLECTIONS_IGNORE_DISABLE 1
#endif

/* fn(args...) of the gc module (a C function: no interpreter check), its error swallowed and
 * the caller's kept; the result, or NULL. */
static PyObject *
gc_call(PyObject *fn, PyObject *args)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = args != NULL ? PyObject_Call(fn, args, NULL) : PyObject_CallNoArgs(fn);
    if (r == NULL)
        PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return r;
}

/* (3.12: a deferral's thresholds noted and raised before Python runs; the last resume's put
 * back) */
#ifdef SCHEDULED_COLLECTIONS_IGNORE_DISABLE
static void
thresholds_raise(ModuleState *S)
{
    if (S->gc_set_threshold == NULL || S->saved_thresholds != NULL)
        return;
    S->saved_thresholds = gc_call(S->gc_get_threshold, NULL);
    if (S->saved_thresholds != NULL)
        Py_XDECREF(gc_call(S->gc_set_threshold, S->raised_thresholds));
}
#endif

static void
thresholds_restore(ModuleState *S)
{
    PyObject *saved = S->saved_thresholds;
    if (saved == NULL)
        return;
    S->saved_thresholds = NULL;
    Py_XDECREF(gc_call(S->gc_set_threshold, saved));
    Py_DECREF(saved);
}

/* Before Python code runs from C: inside a deferral, on 3.12, the thresholds raised. */
static inline void
python_ahead(ModuleState *S)
{
#ifdef SCHEDULED_COLLECTIONS_IGNORE_DISABLE
    if (S->deferrals > 0)
        thresholds_raise(S);
#else
    (void)S;
#endif
}

/* fn(event), the event of `type` made of `values` (NULL: None); the result, or NULL. */
static PyObject *
call_with_event(ModuleState *S, PyObject *fn, PyTypeObject *type, PyObject *const *values, int n)
{
    python_ahead(S);
    PyObject *event = PyStructSequence_New(type);
    if (event == NULL)
        return NULL;
    for (int i = 0; i < n; i++)
        PyStructSequence_SET_ITEM(event, i, Py_NewRef(values[i] != NULL ? values[i] : Py_None));
    if (!PyObject_GC_IsTracked(event))
        PyObject_GC_Track(event);
    PyObject *r = PyObject_CallOneArg(fn, event);
    Py_DECREF(event);
    return r;
}

static __attribute__((noinline)) void
collection_defer(ModuleState *S)
{
    DEFERRAL_LOCK(S);
    if (S->deferrals++ == 0)
        S->collection_was_enabled = PyGC_Disable();
    DEFERRAL_UNLOCK(S);
}

static __attribute__((noinline)) void
collection_resume(ModuleState *S)
{
    DEFERRAL_LOCK(S);
    /* (none open: a forked child started again while a deferral was open) */
    if (S->deferrals > 0 && --S->deferrals == 0) {
        thresholds_restore(S);
        if (S->collection_was_enabled)
            PyGC_Enable();
    }
    DEFERRAL_UNLOCK(S);
}

/* obj.name (new reference), or NULL with AttributeError */
static inline PyObject *
slot_get(Slot *sl, PyObject *obj)
{
#ifdef Py_GIL_DISABLED
    if (Py_TYPE(obj) == sl->type) /* another thread may store into it meanwhile */
        return PyMember_GetOne((const char *)obj, sl->member);
#else
    if (Py_TYPE(obj) == sl->type) {
        PyObject *v = *(PyObject **)((char *)obj + sl->offset);
        if (v != NULL)
            return Py_NewRef(v);
        PyErr_SetObject(PyExc_AttributeError, sl->name);
        return NULL;
    }
#endif
    return PyObject_GetAttr(obj, sl->name);
}

static inline int
slot_set(Slot *sl, PyObject *obj, PyObject *value)
{
#ifdef Py_GIL_DISABLED
    if (Py_TYPE(obj) == sl->type) /* under the object's critical section, as a member's store */
        return PyMember_SetOne((char *)obj, sl->member, value);
#else
    if (Py_TYPE(obj) == sl->type) {
        PyObject **p = (PyObject **)((char *)obj + sl->offset);
        PyObject *old = *p;
        *p = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
#endif
    return PyObject_SetAttr(obj, sl->name, value);
}

/* Resolve the field `name` on `type` to a T_OBJECT_EX member's offset; otherwise the slot stays
 * generic. */
static int
slot_resolve(Slot *sl, PyObject *type, const char *name)
{
    PyObject *interned = PyUnicode_InternFromString(name);
    if (interned == NULL)
        return -1;
    PyObject *descr = PyObject_GetAttr(type, interned);
    PyMemberDef *member = NULL;
    if (descr == NULL)
        PyErr_Clear();
    else if (Py_TYPE(descr) == &PyMemberDescr_Type) {
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            member = m;
    }
    Py_XDECREF(descr);
#ifdef Py_GIL_DISABLED
    /* Another thread may be reading this slot: what a re-import passes again stays untouched. */
    if (sl->name == interned && member != NULL && sl->type == (PyTypeObject *)type &&
        sl->member == member) {
        Py_DECREF(interned);
        return 0;
    }
#endif
    Py_XSETREF(sl->name, interned);
    sl->type = NULL;
    if (member != NULL) {
        sl->offset = member->offset;
        sl->member = member;
        sl->type = (PyTypeObject *)type;
    }
    return 0;
}

/* Resolve a class's fields, as this file names them, on the class given as `given`: the class,
 * or (class, its table of field names), which must then name every field read here. */
static int
table_resolve(Table *t, PyObject *given)
{
    const TableSpec *spec = t->spec;
    PyObject *type = given, *names = NULL;
    if (PyTuple_Check(given) && PyTuple_GET_SIZE(given) == 2) {
        type = PyTuple_GET_ITEM(given, 0);
        names = PyTuple_GET_ITEM(given, 1);
    }
    if (!PyType_Check(type) || (names != NULL && !PyTuple_Check(names))) {
        PyErr_Format(PyExc_TypeError,
                     "otel_lockwatch: %s must be a class or (class, tuple of field names)",
                     spec->keyword);
        return -1;
    }
    for (int i = 0; names != NULL && i < spec->used; i++) {
        PyObject *name = PyUnicode_FromString(spec->names[i]);
        int has = name != NULL ? PySequence_Contains(names, name) : -1;
        Py_XDECREF(name);
        if (has < 0)
            return -1;
        if (!has) {
            PyErr_Format(PyExc_ValueError, "otel_lockwatch: %s has no field %s, which the C path reads",
                         spec->keyword, spec->names[i]);
            return -1;
        }
    }
    Py_XSETREF(t->type, Py_NewRef(type));
    for (int i = 0; i < spec->used; i++)
        if (slot_resolve(&t->slots[i], type, spec->names[i]) < 0)
            return -1;
    return 0;
}

static inline int
as_ll(PyObject *v, long long *out)
{
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "otel_lockwatch: counter out of range");
        return -1;
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
slot_get_ll(Slot *sl, PyObject *obj, long long *out)
{
    PyObject *v = slot_get(sl, obj);
    if (v == NULL)
        return -1;
    int r = as_ll(v, out);
    Py_DECREF(v);
    return r;
}

static int
slot_set_ll(Slot *sl, PyObject *obj, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int r = slot_set(sl, obj, v);
    Py_DECREF(v);
    return r;
}

/* obj.name += delta */
static int
slot_bound(Slot *sl, PyObject *obj, long long v, int less)
{
    long long cur;
    if (slot_get_ll(sl, obj, &cur) < 0)
        return -1;
    if (less ? v < cur : v > cur)
        return slot_set_ll(sl, obj, v);
    return 0;
}

static int
slot_add(Slot *sl, PyObject *obj, long long delta)
{
    long long v;
    if (slot_get_ll(sl, obj, &v) < 0)
        return -1;
    return slot_set_ll(sl, obj, v + delta);
}

/* Whether obj is a `type` (a subclass will do); if not, a TypeError naming `what`. */
static int
is_type(PyObject *obj, PyTypeObject *type, const char *what)
{
    if (PyObject_TypeCheck(obj, type))
        return 1;
    PyErr_Format(PyExc_TypeError, "otel_lockwatch: %s is a %.100s, not a %.100s", what,
                 Py_TYPE(obj)->tp_name, type->tp_name);
    return 0;
}

/* An error in the bookkeeping: to OUTBOX.failed, never to the host. */
static void
swallow(ModuleState *S)
{
    if (!PyErr_Occurred())
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    if (S->failed != NULL && value != NULL) {
        PyObject *r = PyObject_CallOneArg(S->failed, value);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* The truth of a slow path's result (consumed): 1 or 0; a result without one counts as 0, its
 * error swallowed (they return bools). */
static int
consume_truth(ModuleState *S, PyObject *r)
{
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (ok < 0) {
        swallow(S);
        return 0;
    }
    return ok;
}

/* record/_histogram.py bucket_of, in C */
static inline long long
bucket_of(long long v)
{
    unsigned long long mag = v < 0 ? (unsigned long long)(-v) : (unsigned long long)v;
    int bl = mag ? 64 - __builtin_clzll(mag) : 0;
    return bl > 5 ? ((long long)(bl - 5) << 4) + (v >> (bl - 5)) : v;
}

/* hist[b] += n */
static int
bucket_add(PyObject *hist, long long b, long long n)
{
    PyObject *key = PyLong_FromLongLong(b);
    if (key == NULL)
        return -1;
    PyObject *count;
    long long had = 0;
    if (dict_get_ref(hist, key, &count) < 0) {
        Py_DECREF(key);
        return -1;
    }
    if (count != NULL) {
        had = PyLong_AsLongLong(count);
        Py_DECREF(count);
        if (had == -1 && PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    PyObject *nv = PyLong_FromLongLong(had + n);
    if (nv == NULL) {
        Py_DECREF(key);
        return -1;
    }
    int r = PyDict_SetItem(hist, key, nv);
    Py_DECREF(key);
    Py_DECREF(nv);
    return r;
}

/* hist[bucket_of(v)] += 1 */
static int
hist_add(PyObject *hist, long long v)
{
    return bucket_add(hist, bucket_of(v), 1);
}

/* ==========================================================================================
 * StatsBase: a worker's Stats with the counters the uncontended path writes owned by C
 * ------------------------------------------------------------------------------------------
 * Written as Python ints, each pair's counters cost an allocation apiece. Here they are C
 * integers, and a hold's histogram bucket is counted in place in a fixed array of the first
 * DENSE buckets (every hold under 2^35 ns, 34 s), allocated past the Stats' first few
 * acquisitions (dense_made): however many holds a worker records, its histogram holds no more
 * memory. The dict keeps the rest (the first few holds, a longer hold, a count that would wrap)
 * and what Python assigned; reading `hold_histogram` gives a new dict of both, assigning it
 * replaces both (Python code adds a hold or merges by reading, adding and assigning back).
 * Python reads and writes these under the Stats fields' names (STATS_NAMES), so the Python
 * code, the snapshot and the merge see one Stats whichever path made it. _fast_path derives the
 * class the C path's process uses from this one (no slot of its own: the rest of the Stats
 * table is members here).
 * ========================================================================================== */
enum { DENSE = 512 }; /* bucket_of(2 ** 35) */
/* The minimum of no sample: record._recorder.NO_SAMPLE (_fast_path checks they agree). */
#define NO_SAMPLE (1LL << 62)

/* The rest of the Stats table lives here too, as members of the same names (Python writes them;
 * the C path reads wait_histogram by name): a new Stats is made whole by StatsBase_new, with no
 * Python __init__ (about 5,000 instructions a thread's first Stats of a class, callgrind). */
typedef struct {
    PyObject_HEAD
    long long counts[STATS_USED]; /* indexed by STATS_*; STATS_HOLD_HISTOGRAM's is unused */
    PyObject *hold_histogram;     /* bucket -> count: those not in `dense` */
    uint32_t *dense;              /* DENSE bucket counts; NULL until made (dense_made) */
    PyObject *wait_histogram;     /* bucket -> count */
    PyObject *sites;              /* None, or the SiteTable of its contended waits */
    long long collisions;         /* contended waits on a colliding key (sections) */
} StatsBase;

static inline StatsBase *
c_stats(ModuleState *S, PyObject *s)
{
    PyTypeObject *t = Py_TYPE(s);
    return (t->tp_base == S->stats_base_type || t == S->stats_base_type) ? (StatsBase *)s : NULL;
}

/* The histogram's dict, or NULL with a TypeError. */
static inline PyObject *
histogram_dict(StatsBase *self)
{
    PyObject *hist = self->hold_histogram;
    if (hist != NULL && PyDict_Check(hist))
        return hist;
    PyErr_Format(PyExc_TypeError, "otel_lockwatch: a hold histogram is a dict, got %.100s",
                 hist ? Py_TYPE(hist)->tp_name : "nothing");
    return NULL;
}

/* The dense buckets, made at a Stats' first hold past its FEW-th acquisition (so its first holds
 * go to the dict): a thread that takes a lock once or twice, a thread per request, neither
 * allocates nor frees their 2 KiB (about 2,000 instructions a thread, callgrind), nor keeps them
 * in its name's retired state. NULL (a MemoryError) when they could not be made. */
enum { FEW = 4 };

static uint32_t *
dense_made(StatsBase *self)
{
    if (self->dense == NULL && (self->dense = PyMem_Calloc(DENSE, sizeof(uint32_t))) == NULL)
        PyErr_NoMemory();
    return self->dense;
}

/* One hold of h ns into the histogram. */
static inline int
hold_add(StatsBase *self, long long h)
{
    PyObject *hist = histogram_dict(self); /* the histogram is one while it is a dict */
    if (hist == NULL)
        return -1;
    long long b = bucket_of(h);
    if (b >= 0 && b < DENSE) {
        if (self->dense == NULL) {
            if (FT_LOAD(self->counts[STATS_ACQUISITIONS]) <= FEW)
                return bucket_add(hist, b, 1);
            if (dense_made(self) == NULL)
                return -1;
        }
        if (self->dense[b] < UINT32_MAX) {
            self->dense[b]++;
            return 0;
        }
        if (bucket_add(hist, b, (long long)UINT32_MAX + 1) < 0) /* it would wrap: to the dict */
            return -1;
        self->dense[b] = 0;
        return 0;
    }
    return bucket_add(hist, b, 1);
}

static PyObject *
StatsBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    StatsBase *self = (StatsBase *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->counts[STATS_HOLD_MIN] = self->counts[STATS_WAIT_MIN] = NO_SAMPLE;
    self->sites = Py_NewRef(Py_None);
    self->hold_histogram = PyDict_New();
    self->wait_histogram = self->hold_histogram != NULL ? PyDict_New() : NULL;
    if (self->wait_histogram == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
StatsBase_traverse(StatsBase *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->hold_histogram);
    Py_VISIT(self->wait_histogram);
    Py_VISIT(self->sites);
    return 0;
}

static int
StatsBase_clear(StatsBase *self)
{
    Py_CLEAR(self->hold_histogram);
    Py_CLEAR(self->wait_histogram);
    Py_CLEAR(self->sites);
    return 0;
}

static void
StatsBase_dealloc(StatsBase *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    StatsBase_clear(self);
    PyMem_Free(self->dense);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* The histogram: a new dict, the dict's buckets and the counted ones. */
static PyObject *
StatsBase_get_histogram(StatsBase *self, void *Py_UNUSED(closure))
{
    PyObject *out = NULL;
    Py_BEGIN_CRITICAL_SECTION(self); /* (the holder's release may be counting meanwhile) */
    if (self->hold_histogram == NULL) /* cleared by the collector */
        PyErr_SetString(PyExc_AttributeError, "hold_histogram");
    else if (!PyDict_Check(self->hold_histogram)) /* what was assigned, as assigned */
        out = Py_NewRef(self->hold_histogram);
    else {
        out = PyDict_Copy(self->hold_histogram);
        for (int b = 0; out != NULL && self->dense != NULL && b < DENSE; b++) {
            if (self->dense[b] != 0 && bucket_add(out, b, self->dense[b]) < 0)
                Py_CLEAR(out);
        }
    }
    Py_END_CRITICAL_SECTION();
    return out;
}

/* A new histogram, in place of the whole of the old one (a slot's assignment: any value; a
 * release then fails, and is counted, until it is a dict again). */
static int
StatsBase_set_histogram(StatsBase *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "otel_lockwatch: a Stats keeps its hold histogram");
        return -1;
    }
    PyObject *old;
    Py_BEGIN_CRITICAL_SECTION(self);
    if (self->dense != NULL)
        memset(self->dense, 0, DENSE * sizeof(uint32_t));
    old = self->hold_histogram;
    self->hold_histogram = Py_NewRef(value);
    Py_END_CRITICAL_SECTION();
    Py_XDECREF(old);
    return 0;
}

#define STATS_COUNTER(FIELD)                                                                   \
    {STATS_NAMES_##FIELD, T_LONGLONG, offsetof(StatsBase, counts) + FIELD * sizeof(long long), 0, \
     NULL}
/* (the names again, as constants a member table can hold) */
#define STATS_NAMES_STATS_ACQUISITIONS "acquisitions"
#define STATS_NAMES_STATS_TRY_ACQUISITIONS "try_acquisitions"
#define STATS_NAMES_STATS_SKIPPED "skipped"
#define STATS_NAMES_STATS_HOLD_TOTAL "hold_total_ns"
#define STATS_NAMES_STATS_HOLD_MIN "hold_min_ns"
#define STATS_NAMES_STATS_HOLD_MAX "hold_max_ns"
#define STATS_NAMES_STATS_CONTENTIONS "contentions"
#define STATS_NAMES_STATS_TIMEOUTS "timeouts"
#define STATS_NAMES_STATS_WAIT_TOTAL "wait_total_ns"
#define STATS_NAMES_STATS_WAIT_MIN "wait_min_ns"
#define STATS_NAMES_STATS_WAIT_MAX "wait_max_ns"
#define STATS_NAMES_STATS_LAST_RELEASE "last_release_ns"
static PyMemberDef StatsBase_members[] = {
    STATS_COUNTER(STATS_ACQUISITIONS), STATS_COUNTER(STATS_TRY_ACQUISITIONS),
    STATS_COUNTER(STATS_SKIPPED),      STATS_COUNTER(STATS_HOLD_TOTAL),
    STATS_COUNTER(STATS_HOLD_MIN),     STATS_COUNTER(STATS_HOLD_MAX),
    STATS_COUNTER(STATS_CONTENTIONS),  STATS_COUNTER(STATS_TIMEOUTS),
    STATS_COUNTER(STATS_WAIT_TOTAL),   STATS_COUNTER(STATS_WAIT_MIN),
    STATS_COUNTER(STATS_WAIT_MAX),     STATS_COUNTER(STATS_LAST_RELEASE),
    {"wait_histogram", T_OBJECT_EX, offsetof(StatsBase, wait_histogram), 0, NULL},
    {"sites", T_OBJECT_EX, offsetof(StatsBase, sites), 0, NULL},
    {"collisions", T_LONGLONG, offsetof(StatsBase, collisions), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};
/* The counters' merge (STATS_TABLE's "sum", "min", "max"), other's into self's. */
static void
counts_add(StatsBase *self, StatsBase *other)
{
    for (int i = 0; i < STATS_USED; i++) {
        long long theirs = FT_LOAD(other->counts[i]), mine = FT_LOAD(self->counts[i]);
        switch (i) {
        case STATS_HOLD_HISTOGRAM:
            break;
        case STATS_HOLD_MIN:
        case STATS_WAIT_MIN:
            if (theirs < mine)
                FT_STORE(self->counts[i], theirs);
            break;
        case STATS_HOLD_MAX:
        case STATS_WAIT_MAX:
        case STATS_LAST_RELEASE:
            if (theirs > mine)
                FT_STORE(self->counts[i], theirs);
            break;
        default:
            if (theirs != 0)
                FT_ADD(self->counts[i], theirs);
        }
    }
}

/* self.add_holds(other): other's hold histogram added to self's, bucket by bucket, where both
 * are StatsBase with their histograms as dicts (True); else nothing is done (False) and the
 * caller adds them as dicts. Stats.merge's for the C path's Stats: an ended thread's holds are
 * added without building a dict of 512 buckets for each side and zeroing one. With counts
 * (add_owned): the counters StatsBase owns too, in the same step (STATS_OWNED: an ended
 * thread folded into its name's retired state pays no Python read of each). */
static PyObject *
holds_added(StatsBase *self, PyObject *arg, int counts)
{
    if (Py_TYPE(arg)->tp_dealloc != Py_TYPE(self)->tp_dealloc || arg == (PyObject *)self)
        Py_RETURN_FALSE;
    StatsBase *other = (StatsBase *)arg;
    int added = 0, failed = 0;
    Py_BEGIN_CRITICAL_SECTION2(self, other);
    PyObject *mine = self->hold_histogram, *theirs = other->hold_histogram;
    if (mine != NULL && theirs != NULL && PyDict_Check(mine) && PyDict_Check(theirs)) {
        added = 1;
        if (other->dense != NULL && dense_made(self) == NULL)
            failed = 1; /* (before anything is added) */
        else if (counts)
            counts_add(self, other);
        for (int b = 0; !failed && other->dense != NULL && b < DENSE; b++) {
            unsigned long long sum = (unsigned long long)self->dense[b] + other->dense[b];
            if (sum <= UINT32_MAX)
                self->dense[b] = (uint32_t)sum;
            else if (bucket_add(mine, b, (long long)sum) < 0) /* it would wrap: to the dict */
                failed = 1;
            else
                self->dense[b] = 0;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *count;
        while (!failed && PyDict_Next(theirs, &pos, &key, &count)) {
            long long b = PyLong_AsLongLong(key), n = PyLong_AsLongLong(count);
            if (((b == -1 || n == -1) && PyErr_Occurred()) || bucket_add(mine, b, n) < 0)
                failed = 1;
        }
    }
    Py_END_CRITICAL_SECTION2();
    if (failed)
        return NULL;
    return Py_NewRef(added ? Py_True : Py_False);
}

static PyObject *
StatsBase_add_holds(StatsBase *self, PyObject *arg)
{
    return holds_added(self, arg, 0);
}

static PyObject *
StatsBase_add_owned(StatsBase *self, PyObject *arg)
{
    return holds_added(self, arg, 1);
}

static PyMethodDef StatsBase_methods[] = {
    {"add_holds", (PyCFunction)StatsBase_add_holds, METH_O,
     "add_holds(other): other's hold histogram added to this one's (True), or nothing done "
     "(False: not two C Stats with dict histograms)."},
    {"add_owned", (PyCFunction)StatsBase_add_owned, METH_O,
     "add_owned(other): as add_holds, and other's counters of STATS_OWNED merged into these "
     "(sums, minimums, maximums) in the same step (True); or nothing done (False)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef StatsBase_getset[] = {
    {"hold_histogram", (getter)StatsBase_get_histogram, (setter)StatsBase_set_histogram,
     "Holds: bucket_of(ns) -> count (a new dict; assigning replaces the whole).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyType_Slot StatsBase_slots[] = {
    {Py_tp_doc, "The counters of a worker's Stats that the uncontended path writes, owned by C."},
    {Py_tp_traverse, StatsBase_traverse},
    {Py_tp_clear, StatsBase_clear},
    {Py_tp_dealloc, StatsBase_dealloc},
    {Py_tp_new, StatsBase_new},
    {Py_tp_members, StatsBase_members},
    {Py_tp_getset, StatsBase_getset},
    {Py_tp_methods, StatsBase_methods},
    {0, NULL},
};
static PyType_Spec StatsBase_spec = {
    .name = "otel_lockwatch.capture._speedups.StatsBase",
    .basicsize = sizeof(StatsBase),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = StatsBase_slots,
};

/* s.<field> += delta, for a counter of the Stats table */
static inline int
stats_add(ModuleState *S, PyObject *s, int field, long long delta)
{
    StatsBase *c = c_stats(S, s);
    if (c != NULL) {
        FT_ADD(c->counts[field], delta); /* (atomic on the free-threaded build) */
        return 0;
    }
    return slot_add(&S->stats[field], s, delta);
}

/* s.<field> = value when value is beyond it (less: below; else above), for a counter of the
 * Stats table */
static int
stats_bound(ModuleState *S, PyObject *s, int field, long long value, int less)
{
    StatsBase *c = c_stats(S, s);
    if (c == NULL)
        return slot_bound(&S->stats[field], s, value, less);
#ifdef Py_GIL_DISABLED
    long long had = __atomic_load_n(&c->counts[field], __ATOMIC_RELAXED);
    while (less ? value < had : value > had) {
        if (__atomic_compare_exchange_n(&c->counts[field], &had, value, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            break;
    }
#else
    if (less ? value < c->counts[field] : value > c->counts[field])
        c->counts[field] = value;
#endif
    return 0;
}

/* A try-acquire's counts (_bookkeeping.record_try). */
static void
count_try(ModuleState *S, PyObject *s, int ok)
{
    if (stats_add(S, s, ok ? STATS_ACQUISITIONS : STATS_SKIPPED, 1) < 0 ||
        (ok && stats_add(S, s, STATS_TRY_ACQUISITIONS, 1) < 0))
        swallow(S);
}

/* The current OpenTelemetry context (new reference), or NULL with an error. */
static inline PyObject *
current_context(ModuleState *S)
{
    if (S->context_var != NULL) {
        PyObject *value;
        if (PyContextVar_Get(S->context_var, NULL, &value) < 0)
            return NULL;
        if (value != NULL)
            return value;
    }
    return PyObject_CallNoArgs(S->context);
}

/* -- the calling thread's WorkerState, cached in C ---------------------------------------
 * RECORDER.tls.st costs a threading.local lookup (two dict lookups) per call; a thread's state
 * never changes once made, except in a forked child, whose recorder gives the forking thread a
 * fresh one. So each OS thread keeps, under the module's pthread key, the state it last read
 * with the thread state (PyThreadState id) and the generation it was read under; a fork bumps the
 * generation (forget_states(), which the child calls after the recorder's own after-fork
 * routine), and so does setup(). The cache holds a strong reference: a thread that ends leaves
 * its entry to the key's destructor, which queues it on its module's state (no GIL there) for
 * the next refresh to release. */
static void
cache_thread_ended(void *entry)
{
    ThreadCache *c = entry;
    ModuleState *S = c->owner;
    ThreadCache *head = atomic_load(&S->ended);
    do
        c->next = head;
    while (!atomic_compare_exchange_weak(&S->ended, &head, c));
}

/* Release the entries of threads that ended (with the GIL). */
static void
release_ended(ModuleState *S)
{
    if (atomic_load(&S->ended) == NULL)
        return;
    ThreadCache *c = atomic_exchange(&S->ended, NULL);
    while (c != NULL) {
        ThreadCache *next = c->next;
#ifdef Py_GIL_DISABLED
        spares_free(c);
#endif
        Py_XDECREF(c->st);
        PyMem_RawFree(c);
        c = next;
    }
}

/* Read RECORDER.tls.st into the cache: borrowed (the cache holds it), or NULL (no error set)
 * when the thread has no state yet. */
static PyObject *
refresh_state(ModuleState *S, PyThreadState *ts)
{
    release_ended(S);
    ThreadCache *c = pthread_getspecific(S->cache_key);
    if (c == NULL) {
        c = PyMem_RawCalloc(1, sizeof(ThreadCache));
        if (c == NULL)
            return NULL;
        c->owner = S;
        if (pthread_setspecific(S->cache_key, c) != 0) {
            PyMem_RawFree(c);
            return NULL;
        }
    }
    /* tls.st, read in the thread's dict of the local: a thread with none yet raises nothing
     * (an AttributeError made and dropped per new thread: its message formatted). */
    PyObject *d = S->tls != NULL ? PyObject_GetAttr(S->tls, S->str_dunder_dict) : NULL, *st = NULL;
    if (d != NULL && PyDict_Check(d))
        (void)dict_get_ref(d, S->str_st, &st);
    Py_XDECREF(d);
    if (st == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_XSETREF(c->st, st);
    c->tstate = ts;
    c->tstate_id = PyThreadState_GetID(ts);
    c->generation = FT_LOAD(S->generation);
    return st;
}

/* The calling thread's WorkerState (borrowed: valid until the next Python code runs on this
 * thread), or NULL (no error set) when it has none yet. The cache is found under the module's
 * pthread key rather than in a file-level __thread variable (one per process, which a second
 * module object, a subinterpreter's, would share): pthread_getspecific costs 17 instructions a
 * call (callgrind, 50,000 pairs), about 0.6 % of an instrumented `L.acquire(); L.release()`. */
static inline PyObject *
thread_state(ModuleState *S)
{
    PyThreadState *ts = PyThreadState_Get();
    ThreadCache *c = pthread_getspecific(S->cache_key);
    if (c != NULL && c->st != NULL && c->generation == FT_LOAD(S->generation) && c->tstate == ts &&
        c->tstate_id == PyThreadState_GetID(ts))
        return c->st;
    return refresh_state(S, ts);
}

/* A thread's first WorkerState, made by RECORDER.new_thread_state() (as the Python path makes
 * it): the thread's first acquisition stays on this path. Borrowed as thread_state's; NULL (no
 * error set) when it could not be made: the Python path tries again, and reports. */
static PyObject *
registered_state(ModuleState *S, PyThreadState *ts); /* (below, with the ThreadEnd) */

static __attribute__((noinline)) PyObject *
first_state(ModuleState *S)
{
    PyObject *st = registered_state(S, PyThreadState_Get()); /* (its common case, in C) */
    if (st != NULL)
        return st;
    if (S->new_state == NULL)
        return NULL;
    PyObject *made = PyObject_CallNoArgs(S->new_state);
    if (made == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(made); /* the thread's local keeps it */
    return refresh_state(S, PyThreadState_Get());
}

/* The calling thread's WorkerState, made on its first use, or NULL (no error set) when it could
 * not be made or lockwatch itself is running on this thread: the Python path handles both. */
static PyObject *
usable_state(ModuleState *S)
{
    PyObject *st = thread_state(S);
    if (st == NULL && (st = first_state(S)) == NULL)
        return NULL;
    Py_INCREF(st);
    PyObject *in_lockwatch = slot_get(&S->worker[WORKER_IN_LOCKWATCH], st);
    if (in_lockwatch == NULL) {
        PyErr_Clear();
        Py_DECREF(st);
        return NULL;
    }
    int inside = in_lockwatch == Py_False ? 0 : PyObject_IsTrue(in_lockwatch);
    Py_DECREF(in_lockwatch);
    if (inside != 0) {
        PyErr_Clear();
        Py_DECREF(st);
        return NULL;
    }
    return st;
}

/* The worker's Stats for cls (new reference), made on its first use of the class as the Python
 * path makes it (_bookkeeping.stats_of: new_stats()), or NULL with no error: the Python path's. */
static PyObject *
stats_of(ModuleState *S, PyObject *st, PyObject *cls)
{
    PyObject *stats = slot_get(&S->worker[WORKER_STATS], st);
    if (stats == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *s = NULL;
    if (PyDict_Check(stats) && dict_get_ref(stats, cls, &s) == 0 && S->new_stats != NULL) {
        /* (only the worker's own thread adds to its stats; other locks may be held: the
         * allocations run with the collector off, _collection) */
        collection_defer(S);
        python_ahead(S);
        s = PyObject_CallNoArgs(S->new_stats);
        if (s != NULL && PyDict_SetItem(stats, cls, s) < 0)
            Py_CLEAR(s);
        collection_resume(S);
    }
    Py_DECREF(stats);
    if (s == NULL)
        PyErr_Clear();
    return s;
}

/* Whether a frame runs in one of the modules whose frames are not a lock's acquisition site
 * (_threading: RLockProxy calling LockProxy; threading: a Condition calling its lock). */
static int
skipped_frame(ModuleState *S, PyFrameObject *f)
{
    PyObject *g = PyFrame_GetGlobals(f);
    int skip = 0;
    for (Py_ssize_t i = 0; g != NULL && i < PyTuple_GET_SIZE(S->skip_frames); i++)
        skip |= g == PyTuple_GET_ITEM(S->skip_frames, i);
    Py_XDECREF(g);
    return skip;
}

/* The acquisition site's frame (new reference), as _threading._caller() finds it: the caller, or
 * the first frame above it outside the skipped modules (the caller itself when there is none). */
static PyObject *
site_frame(ModuleState *S)
{
    /* The caller's frame (a C call pushes none). PyThreadState_GetFrame, unlike PyEval_GetFrame,
     * skips a frame still in its prologue, as sys._getframe does. */
    PyFrameObject *first = PyThreadState_GetFrame(PyThreadState_Get()); /* new reference */
    if (first == NULL || !skipped_frame(S, first))
        return (PyObject *)first;
    PyFrameObject *f = PyFrame_GetBack(first);
    while (f != NULL && skipped_frame(S, f)) {
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    if (f == NULL)
        return (PyObject *)first;
    Py_DECREF(first);
    return (PyObject *)f;
}

/* The method descriptor of a _thread.lock's or _thread.RLock's method, else NULL (look it up). */
static inline PyObject *
known_method(ModuleState *S, PyObject *lock, PyObject *for_lock, PyObject *for_rlock)
{
    PyObject *type = (PyObject *)Py_TYPE(lock);
    if (type == S->lock_type)
        return for_lock;
    if (type == S->rlock_type)
        return for_rlock;
    return NULL;
}

/* lock.release() */
static PyObject *
release_lock(ModuleState *S, PyObject *lock)
{
    PyObject *args[1] = {lock};
    PyTypeObject *type = Py_TYPE(lock);
    PyCFunction fn = type == (PyTypeObject *)S->lock_type    ? S->lock_release_fn
                     : type == (PyTypeObject *)S->rlock_type ? S->rlock_release_fn
                                                            : NULL;
    if (fn != NULL)
        return fn(lock, NULL);
    PyObject *m = known_method(S, lock, S->lock_release, S->rlock_release);
    if (m != NULL)
        return PyObject_Vectorcall(m, args, 1, NULL);
    return PyObject_VectorcallMethod(S->str_release, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* The C function behind a method descriptor, if it has exactly the calling convention `flags`. */
static PyCFunction
c_function(PyObject *descr, int flags)
{
    if (!PyObject_TypeCheck(descr, &PyMethodDescr_Type))
        return NULL;
    PyMethodDef *def = ((PyMethodDescrObject *)descr)->d_method;
    return def->ml_flags == flags ? def->ml_meth : NULL;
}

/* A _thread.lock's try-acquire without its argument parsing (which cost as much as the rest of
 * the raw acquire): on 3.11 and 3.12 the lock object is this (Modules/_threadmodule.c), and
 * acquire(False) is PyThread_acquire_lock_timed(lock, 0, 0) then `locked = 1`. The layout is
 * CPython's, not a public one: check_lock_layout(S) verifies it at import, on a real lock, and
 * anything that does not match keeps the lock's own method. (3.13 made the lock a PyMutex.) */
#if PY_VERSION_HEX < 0x030D0000
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock_lock;
    PyObject *in_weakreflist;
    char locked;
} RawLock;
/* _thread.RLock's, likewise: acquire(False) by a thread that does not own it is the same
 * try, then `owner = me, count = 1`. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock rlock_lock;
    unsigned long rlock_owner;
    unsigned long rlock_count;
    PyObject *in_weakreflist;
} RawRLock;
#endif

static void
check_lock_layout(ModuleState *S)
{
#if PY_VERSION_HEX < 0x030D0000
    PyTypeObject *type = (PyTypeObject *)S->lock_type;
    if (type->tp_basicsize != sizeof(RawLock) ||
        type->tp_weaklistoffset != offsetof(RawLock, in_weakreflist) || S->lock_acquire_fn == NULL ||
        S->lock_release_fn == NULL)
        return;
    PyObject *thread = PyImport_ImportModule("_thread");
    PyObject *lock = thread ? PyObject_CallMethod(thread, "allocate_lock", NULL) : NULL;
    Py_XDECREF(thread);
    if (lock == NULL || Py_TYPE(lock) != type) {
        Py_XDECREF(lock);
        PyErr_Clear();
        return;
    }
    RawLock *raw = (RawLock *)lock;
    int ok = raw->locked == 0 && raw->lock_lock != NULL;
    PyObject *r = ok ? S->lock_acquire_fn(lock, S->false_args, NULL) : NULL;
    ok = ok && r == Py_True && raw->locked == 1 &&
         PyThread_acquire_lock_timed(raw->lock_lock, 0, 0) == PY_LOCK_FAILURE;
    Py_XDECREF(r);
    r = ok ? S->lock_release_fn(lock, NULL) : NULL;
    ok = ok && r != NULL && raw->locked == 0 &&
         PyThread_acquire_lock_timed(raw->lock_lock, 0, 0) == PY_LOCK_ACQUIRED;
    if (ok)
        PyThread_release_lock(raw->lock_lock);
    Py_XDECREF(r);
    PyErr_Clear();
    Py_DECREF(lock);
    S->raw_lock_layout = ok;
#endif
}

static void
check_rlock_layout(ModuleState *S)
{
#if PY_VERSION_HEX < 0x030D0000
    PyTypeObject *type = (PyTypeObject *)S->rlock_type;
    if (type->tp_basicsize != sizeof(RawRLock) ||
        type->tp_weaklistoffset != offsetof(RawRLock, in_weakreflist) ||
        S->rlock_acquire_fn == NULL || S->rlock_release_fn == NULL)
        return;
    PyObject *rlock = PyObject_CallNoArgs(S->rlock_type);
    if (rlock == NULL || Py_TYPE(rlock) != type) {
        Py_XDECREF(rlock);
        PyErr_Clear();
        return;
    }
    RawRLock *raw = (RawRLock *)rlock;
    unsigned long me = PyThread_get_thread_ident();
    int ok = raw->rlock_count == 0 && raw->rlock_lock != NULL;
    for (int depth = 1; ok && depth <= 2; depth++) { /* taken, then re-entered */
        PyObject *r = S->rlock_acquire_fn(rlock, S->false_args, NULL);
        ok = r == Py_True && raw->rlock_owner == me && raw->rlock_count == (unsigned long)depth &&
             PyThread_acquire_lock_timed(raw->rlock_lock, 0, 0) == PY_LOCK_FAILURE;
        Py_XDECREF(r);
    }
    for (int depth = 1; ok && depth >= 0; depth--) {
        PyObject *r = S->rlock_release_fn(rlock, NULL);
        ok = r != NULL && raw->rlock_count == (unsigned long)depth;
        Py_XDECREF(r);
    }
    ok = ok && PyThread_acquire_lock_timed(raw->rlock_lock, 0, 0) == PY_LOCK_ACQUIRED;
    if (ok)
        PyThread_release_lock(raw->rlock_lock);
    PyErr_Clear();
    Py_DECREF(rlock);
    S->raw_rlock_layout = ok;
#endif
}

/* lock.acquire(False) as a C truth value: 1 taken, 0 not, -1 error. */
static inline __attribute__((always_inline)) int
try_acquire(ModuleState *S, PyObject *lock)
{
    PyObject *args[2] = {lock, Py_False};
    PyTypeObject *type = Py_TYPE(lock);
#if PY_VERSION_HEX < 0x030D0000
    if (type == (PyTypeObject *)S->lock_type && S->raw_lock_layout) {
        RawLock *raw = (RawLock *)lock;
        if (PyThread_acquire_lock_timed(raw->lock_lock, 0, 0) != PY_LOCK_ACQUIRED)
            return 0;
        raw->locked = 1;
        return 1;
    }
    if (type == (PyTypeObject *)S->rlock_type && S->raw_rlock_layout) {
        RawRLock *raw = (RawRLock *)lock;
        unsigned long me = PyThread_get_thread_ident();
        if (raw->rlock_count == 0 || raw->rlock_owner != me) { /* (the owner's re-entry: below) */
            if (PyThread_acquire_lock_timed(raw->rlock_lock, 0, 0) != PY_LOCK_ACQUIRED)
                return 0;
            raw->rlock_owner = me;
            raw->rlock_count = 1;
            return 1;
        }
    }
#endif
    PyCFunctionWithKeywords fn = type == (PyTypeObject *)S->lock_type    ? S->lock_acquire_fn
                                 : type == (PyTypeObject *)S->rlock_type ? S->rlock_acquire_fn
                                                                        : NULL;
    PyObject *m = fn != NULL ? NULL : known_method(S, lock, S->lock_acquire, S->rlock_acquire);
    PyObject *r =
        fn != NULL  ? fn(lock, S->false_args, NULL)
        : m != NULL ? PyObject_Vectorcall(m, args, 2, NULL)
                  : PyObject_VectorcallMethod(S->str_acquire, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                              NULL);
    if (r == NULL)
        return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* list.pop() of a non-empty list, result dropped: what list.pop does, without its call, its
 * argument parsing or a reallocation (a list may keep more room than it uses). */
static inline void
pop_last(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *item = PyList_GET_ITEM(list, n - 1);
    Py_SET_SIZE(list, n - 1);
    Py_DECREF(item);
}

/* Remove `entry` from a held stack where it is not on top (_bookkeeping.discard); under the
 * stack's critical section on the free-threaded build (PyList_SetSlice takes it again: a
 * critical section the thread holds already is taken again, not waited for). */
static int
discard(PyObject *held, PyObject *entry)
{
    if (!is_type(held, &PyList_Type, "a held stack"))
        return -1;
    for (Py_ssize_t i = PyList_GET_SIZE(held) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(held, i) == entry)
            return PyList_SetSlice(held, i, i + 1, NULL);
    return 0;
}

/* ==========================================================================================
 * A thread's state registered from C, and its end
 * ------------------------------------------------------------------------------------------
 * A thread per request pays for its registration and its end once each; in Python
 * (Recorder.new_thread_state, ThreadEnd.__del__ -> Recorder._thread_ended) they were three
 * quarters of what lockwatch added to a thread that takes one lock once. Here they are the same
 * steps on the recorder's own tables (RECORDER_NAMES, PEAK_NAMES, LIMIT_NAMES):
 *   - registered_state: the thread's name (its Thread's); under the recorder's lock, the name
 *     given out (past MAX_WORKERS names, "(other)") and a WorkerState made with every field as
 *     its __init__ sets it, put in the recorder's table; the peak's start (the state among the
 *     live ones, then its generation read); a ThreadEnd of this module and the state stored in
 *     the thread's locals (`alive`, `st`), as the Python path stores them.
 *   - ThreadEnd's deallocation, when the interpreter clears the locals of a thread that ends:
 *     _thread_ended's common case. The peak's end (when the live workers that recorded may pass
 *     the peak: the Python PeakWorkers.ended, which takes the exact count under its lock); then,
 *     if the recorder's lock is free, the state leaves: dropped if it recorded nothing, its
 *     name's retired state if it is the name's first ended, else put with the ended ones (a
 *     full batch folded by the Python Recorder._fold_ended).
 * Everything else is left to the Python path, which does all of it: a thread that threading
 * does not know (its ForeignThread token), a compaction due, the first "(other)" (its warning),
 * a WorkerState class with a field not at its slot. No error leaves here: a registration that
 * fails hands the thread to new_thread_state (tests/test_thread_churn.py holds the two to the
 * same tables), an end that fails leaves its state to a compaction. Both run with the GIL (the
 * interpreter clears a thread's locals with it); on the free-threaded build the recorder's lock
 * orders them against its other writers, as in Python, and the peak's live states are read on
 * a copy, as in Python.
 * ========================================================================================== */
typedef struct {
    PyObject_HEAD
    PyObject *state;      /* the ended thread's WorkerState */
    PyObject *generation; /* the peak's, at its start */
} ThreadEnd;

/* An ordinary instance (the recorder, its peak) whose attributes are read in its __dict__: a
 * generic lookup costs a type lookup and a descriptor check, about 190 instructions a read,
 * and a registration and an end read 17. */
typedef struct {
    PyObject *obj;
    PyObject *dict; /* its __dict__, or NULL: the generic lookup */
} Attrs;

static Attrs
attrs_open(PyObject *obj)
{
    PyObject *d = obj != NULL ? PyObject_GenericGetDict(obj, NULL) : NULL;
    if (d != NULL && !PyDict_Check(d))
        Py_CLEAR(d);
    PyErr_Clear();
    return (Attrs){obj, d};
}

static void
attrs_close(Attrs *a)
{
    Py_CLEAR(a->dict);
}

/* a.obj.<name> (new reference), or NULL with an error */
static PyObject *
attr(Attrs *a, PyObject *name)
{
    PyObject *v = NULL;
    if (a->obj == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    if (a->dict != NULL && dict_get_ref(a->dict, name, &v) < 0)
        return NULL;
    return v != NULL ? v : PyObject_GetAttr(a->obj, name); /* (not in it: the class's) */
}

#define REC_GET(S, i) attr(rec, (S)->rec_names[i])

/* record._recorder.<name> (borrowed: the module's globals keep it), or NULL with an error. */
static PyObject *
limit(ModuleState *S, int i)
{
    PyObject *v = PyDict_GetItemWithError(S->limits, S->limit_names[i]);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, S->limit_names[i]);
    return v;
}

/* The truth of obj.<slot> (1, 0; -1 with an error). */
static int
slot_truth(Slot *sl, PyObject *obj)
{
    PyObject *v = slot_get(sl, obj);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A new WorkerState for the worker `name` of the thread `thread`, every field as
 * WorkerState.__init__(name, None, thread) sets it (new reference; NULL with an error). */
static PyObject *
new_worker_state(ModuleState *S, PyObject *name, PyObject *thread)
{
    PyTypeObject *type = (PyTypeObject *)S->tables[TABLE_WORKER].type;
    PyObject *st = type->tp_alloc(type, 0);
    if (st == NULL)
        return NULL;
    PyObject *v[WORKER_USED] = {NULL};
    v[WORKER_HELD] = PyList_New(0);
    v[WORKER_STATS] = PyDict_New();
    v[WORKER_IN_LOCKWATCH] = Py_NewRef(Py_False);
    v[WORKER_FIRST] = PyLong_FromLongLong(now_ns());
    v[WORKER_LAST] = Py_XNewRef(v[WORKER_FIRST]);
    v[WORKER_WORKER] = Py_NewRef(name);
    v[WORKER_CHAIN] = PySet_New(NULL);
    v[WORKER_SPANS] = PyDict_New();
    v[WORKER_THREAD] = PyWeakref_NewRef(thread, NULL);
    v[WORKER_RETIRED] = PyLong_FromLong(0);
    v[WORKER_WAITING] = Py_NewRef(Py_None);
    v[WORKER_HANDOFFS] = PyDict_New();
    int ok = 1;
    for (int i = 0; i < WORKER_USED; i++)
        ok = ok && v[i] != NULL && slot_set(&S->worker[i], st, v[i]) == 0;
    for (int i = 0; i < WORKER_USED; i++)
        Py_XDECREF(v[i]);
    if (!ok)
        Py_CLEAR(st);
    return st;
}

/* Recorder.register(name, thread)'s common case, under the recorder's lock: 1 with the new
 * state in *out; 0 when the Python path's (a compaction due, the first "(other)"); -1 error. */
static int
register_locked(ModuleState *S, Attrs *rec, PyObject *name, PyObject *thread, PyObject **out)
{
    PyObject *by_id = REC_GET(S, REC_BY_ID), *compact_at = NULL, *names = NULL, *key = NULL;
    PyObject *retired = NULL, *worker = Py_NewRef(name), *st = NULL;
    int r = -1;
    if (by_id == NULL || !is_type(by_id, &PyDict_Type, "the recorder's states"))
        goto done;
    if ((compact_at = REC_GET(S, REC_COMPACT_AT)) == NULL ||
        (retired = REC_GET(S, REC_RETIRED)) == NULL ||
        !is_type(retired, &PyDict_Type, "the retired states"))
        goto done;
    /* (the states besides the retired ones, as Recorder.register counts them) */
    Py_ssize_t n = PyDict_GET_SIZE(by_id) - PyDict_GET_SIZE(retired);
    Py_ssize_t at = PyLong_AsSsize_t(compact_at);
    if (at == -1 && PyErr_Occurred())
        goto done;
    if (n >= at) {
        r = 0; /* a compaction: Python's */
        goto done;
    }
    if ((names = REC_GET(S, REC_NAMES)) == NULL || !is_type(names, &PySet_Type, "the names"))
        goto done;
    int has = PySet_Contains(names, worker);
    if (has < 0)
        goto done;
    if (!has) {
        PyObject *most = limit(S, LIMIT_MAX_WORKERS);
        Py_ssize_t m = most != NULL ? PyLong_AsSsize_t(most) : -1;
        if (m == -1 && PyErr_Occurred())
            goto done;
        if (PySet_GET_SIZE(names) >= m) {
            int other = PySet_Contains(names, S->str_other);
            if (other <= 0) {
                r = other == 0 ? 0 : -1; /* the first "(other)": its warning is Python's */
                goto done;
            }
            Py_SETREF(worker, Py_NewRef(S->str_other));
        }
        else if (PySet_Add(names, worker) < 0)
            goto done;
    }
    if ((st = new_worker_state(S, worker, thread)) == NULL ||
        (key = PyLong_FromVoidPtr(st)) == NULL || PyDict_SetItem(by_id, key, st) < 0)
        goto done;
    *out = Py_NewRef(st);
    r = 1;
done:
    Py_XDECREF(by_id);
    Py_XDECREF(compact_at);
    Py_XDECREF(retired);
    Py_XDECREF(names);
    Py_XDECREF(key);
    Py_XDECREF(worker);
    Py_XDECREF(st);
    return r;
}

/* The recorder's lock, taken as Recorder.register takes it (blocking): 0, or -1 with an error. */
static int
recorder_lock_take(ModuleState *S, PyObject *lock)
{
    int got = try_acquire(S, lock);
    if (got != 0)
        return got > 0 ? 0 : -1;
    PyObject *r = PyObject_CallMethodNoArgs(lock, S->str_acquire); /* (waits without the GIL) */
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* lock.release(), its error swallowed (the bookkeeping's own lock: nothing to report to). */
static void
recorder_lock_let_go(ModuleState *S, PyObject *lock)
{
    PyObject *r = release_lock(S, lock);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
}

/* The calling thread's first WorkerState, made and registered here (Recorder.new_thread_state
 * in C): borrowed as thread_state's, or NULL (no error set) when it is the Python path's to
 * make (see the section's head). `ts`: the calling thread's. */
static PyObject *
registered_state(ModuleState *S, PyThreadState *ts)
{
    if (S->recorder == NULL || S->threads == NULL || S->tls == NULL)
        return NULL;
    for (int i = 0; i < WORKER_USED; i++) /* (else a field WorkerState.__init__ may set otherwise) */
        if (S->worker[i].type == NULL || S->worker[i].type != (PyTypeObject *)S->tables[TABLE_WORKER].type)
            return NULL;
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    PyObject *thread = NULL, *name = NULL, *lock = NULL, *st = NULL, *peak = NULL, *live = NULL;
    PyObject *key = NULL, *generation = NULL, *d = NULL, *made = NULL;
    ThreadEnd *end = NULL;
    Attrs recorder = attrs_open(S->recorder), *rec = &recorder, pk = {NULL, NULL};
    if (ident == NULL || dict_get_ref(S->threads, ident, &thread) <= 0)
        goto fail; /* a thread threading does not know: Python's (its ForeignThread) */
    if ((name = PyObject_GetAttr(thread, S->str_name)) == NULL ||
        (lock = REC_GET(S, REC_LOCK)) == NULL || recorder_lock_take(S, lock) < 0)
        goto fail;
    int r = register_locked(S, &recorder, name, thread, &st);
    recorder_lock_let_go(S, lock);
    if (r <= 0)
        goto fail;
    /* PeakWorkers.started: the state among the live ones, then the generation read */
    if ((peak = REC_GET(S, REC_PEAK)) == NULL)
        goto fail;
    pk = attrs_open(peak);
    if ((live = attr(&pk, S->peak_names[PEAK_LIVE])) == NULL ||
        !is_type(live, &PyDict_Type, "the live workers") || (key = PyLong_FromVoidPtr(st)) == NULL ||
        PyDict_SetItem(live, key, st) < 0 ||
        (generation = attr(&pk, S->peak_names[PEAK_GENERATION])) == NULL)
        goto fail;
    if ((end = PyObject_New(ThreadEnd, S->thread_end_type)) == NULL)
        goto fail;
    end->state = Py_NewRef(st);
    end->generation = Py_NewRef(generation);
    /* the thread's locals: its end, then its state (tls.alive, tls.st) */
    d = PyObject_GetAttr(S->tls, S->str_dunder_dict);
    if (d == NULL || !is_type(d, &PyDict_Type, "a thread's locals") ||
        PyDict_SetItem(d, S->str_alive, (PyObject *)end) < 0 || PyDict_SetItem(d, S->str_st, st) < 0)
        goto fail;
    ThreadCache *c = pthread_getspecific(S->cache_key); /* (thread_state made it) */
    if (c != NULL) {
        Py_XSETREF(c->st, Py_NewRef(st));
        c->tstate = ts;
        c->tstate_id = PyThreadState_GetID(ts);
        c->generation = FT_LOAD(S->generation);
        made = st;
    }
    else
        made = refresh_state(S, ts);
fail:
    if (made == NULL)
        PyErr_Clear(); /* (a state registered without its end: a compaction's, once its thread is gone) */
    Py_XDECREF(ident);
    Py_XDECREF(thread);
    Py_XDECREF(name);
    Py_XDECREF(lock);
    Py_XDECREF(st);
    Py_XDECREF(peak);
    Py_XDECREF(live);
    Py_XDECREF(key);
    Py_XDECREF(generation);
    Py_XDECREF(d);
    Py_XDECREF((PyObject *)end);
    attrs_close(&recorder);
    attrs_close(&pk);
    return made;
}

/* PeakWorkers.ended(state, generation), in C while the count stays below the peak: the live
 * workers that recorded (an upper bound: a copy of the live ones, and the kept ones unasked)
 * counted, and the state taken from the live ones; past the peak, the Python ended (the exact
 * count under the peak's lock). 0, or -1 with an error. */
static int
peak_ended(ModuleState *S, Attrs *rec, PyObject *state, PyObject *generation)
{
    PyObject *peak = REC_GET(S, REC_PEAK), *now = NULL, *live = NULL, *copy = NULL, *kept = NULL;
    PyObject *most = NULL, *key = NULL;
    Attrs pk = attrs_open(peak);
    int r = -1;
    if (peak == NULL || (now = attr(&pk, S->peak_names[PEAK_GENERATION])) == NULL)
        goto done;
    int same = PyObject_RichCompareBool(generation, now, Py_EQ);
    if (same <= 0) {
        r = same; /* registered before a reset: not counted */
        goto done;
    }
    if ((live = attr(&pk, S->peak_names[PEAK_LIVE])) == NULL ||
        !is_type(live, &PyDict_Type, "the live workers") ||
#ifdef Py_GIL_DISABLED
        (copy = PyDict_Copy(live)) == NULL || /* (a start or an end may change it meanwhile) */
#else
        (copy = Py_NewRef(live)) == NULL || /* (no Python code runs while it is read) */
#endif
        (kept = attr(&pk, S->peak_names[PEAK_KEPT])) == NULL ||
        !is_type(kept, &PyList_Type, "the kept workers") ||
        (most = attr(&pk, S->peak_names[PEAK_PEAK])) == NULL)
        goto done;
    long long n = 0, m = PyLong_AsLongLong(most);
    if (m == -1 && PyErr_Occurred())
        goto done;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(copy, &pos, &k, &v)) {
        int t = slot_truth(&S->worker[WORKER_STATS], v);
        if (t < 0)
            goto done;
        n += t;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kept); i++) {
        PyObject *w = list_item(kept, i);
        int t = w != NULL ? slot_truth(&S->worker[WORKER_STATS], w) : -1;
        Py_XDECREF(w);
        if (t < 0)
            goto done;
        n += t;
    }
    if (n > m) { /* the peak may grow: counted exactly, in Python */
        PyObject *args[3] = {peak, state, generation};
        PyObject *res = PyObject_VectorcallMethod(S->peak_names[PEAK_ENDED], args,
                                                  3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(res);
        r = res != NULL ? 0 : -1;
        goto done;
    }
    if ((key = PyLong_FromVoidPtr(state)) == NULL)
        goto done;
    if (PyDict_DelItem(live, key) < 0) { /* _live.pop(id(state), None) */
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            goto done;
        PyErr_Clear();
    }
    r = 0;
done:
    Py_XDECREF(peak);
    Py_XDECREF(now);
    Py_XDECREF(live);
    Py_XDECREF(copy);
    Py_XDECREF(kept);
    Py_XDECREF(most);
    Py_XDECREF(key);
    attrs_close(&pk);
    return r;
}

/* WorkerState.last_event_ns() of a state not retired, in C: the later of its `last` and its
 * Stats' last_release_ns (a release notes its time in the Stats it writes anyway). 0, or -1
 * with an error. */
static int
last_event(ModuleState *S, PyObject *st, long long *out)
{
    long long last, t;
    if (slot_get_ll(&S->worker[WORKER_LAST], st, &last) < 0)
        return -1;
    PyObject *stats = slot_get(&S->worker[WORKER_STATS], st), *cls, *s;
    if (stats == NULL || !is_type(stats, &PyDict_Type, "a worker's stats")) {
        Py_XDECREF(stats);
        return -1;
    }
    Py_ssize_t pos = 0;
    int r = 0;
    while (r == 0 && PyDict_Next(stats, &pos, &cls, &s)) {
        StatsBase *c = c_stats(S, s);
        if (c != NULL)
            t = FT_LOAD(c->counts[STATS_LAST_RELEASE]);
        else if ((r = slot_get_ll(&S->stats[STATS_LAST_RELEASE], s, &t)) < 0)
            break;
        if (t > last)
            last = t;
    }
    Py_DECREF(stats);
    *out = last;
    return r;
}

/* WorkerState.retire(), in C: its observed life's end fixed (last_event), and what only a live
 * worker writes goes (the shared stand-ins). */
static int
retire_state(ModuleState *S, PyObject *st)
{
    PyObject *nothing = S->nothing_written;
    long long last;
    if (last_event(S, st, &last) < 0 || slot_set_ll(&S->worker[WORKER_LAST], st, last) < 0 ||
        slot_set(&S->worker[WORKER_THREAD], st, S->retired_thread) < 0 ||
        slot_set(&S->worker[WORKER_HELD], st, S->nothing_held) < 0 ||
        slot_set(&S->worker[WORKER_CHAIN], st, S->no_chain) < 0)
        return -1;
    int fields[2] = {WORKER_SPANS, WORKER_HANDOFFS};
    for (int i = 0; i < 2; i++) {
        int t = slot_truth(&S->worker[fields[i]], st);
        if (t < 0 || (t == 0 && slot_set(&S->worker[fields[i]], st, nothing) < 0))
            return -1;
    }
    return 0;
}

/* Recorder._thread_ended's part under the recorder's lock (see there): 0, or -1 with an error. */
static int
leave_locked(ModuleState *S, Attrs *rec, PyObject *st)
{
    PyObject *by_id = NULL, *key = NULL, *found = NULL, *worker = NULL, *retired = NULL;
    PyObject *keys = NULL, *ended = NULL;
    int r = -1, t;
    if ((t = slot_truth(&S->worker[WORKER_HELD], st)) != 0) {
        r = t; /* it ended holding a lock: kept (to report it) until a compaction */
        goto done;
    }
    if ((by_id = REC_GET(S, REC_BY_ID)) == NULL || !is_type(by_id, &PyDict_Type, "the states") ||
        (key = PyLong_FromVoidPtr(st)) == NULL || dict_get_ref(by_id, key, &found) < 0)
        goto done;
    if (found != st) {
        r = 0; /* gone already: a reset, a compaction, a fork */
        goto done;
    }
    int wrote = 0, fields[3] = {WORKER_STATS, WORKER_SPANS, WORKER_HANDOFFS};
    for (int i = 0; i < 3 && !wrote; i++)
        if ((wrote = slot_truth(&S->worker[fields[i]], st)) < 0)
            goto done;
    if (!wrote) { /* it recorded nothing (lockwatch's own threads) */
        r = PyDict_DelItem(by_id, key);
        goto done;
    }
    if ((worker = slot_get(&S->worker[WORKER_WORKER], st)) == NULL ||
        (retired = REC_GET(S, REC_RETIRED)) == NULL ||
        !is_type(retired, &PyDict_Type, "the retired states") ||
        (t = PyDict_Contains(retired, worker)) < 0)
        goto done;
    if (!t) { /* the name's first ended: its retired state, in place */
        r = retire_state(S, st) < 0 || PyDict_SetItem(retired, worker, st) < 0 ||
                    (keys = REC_GET(S, REC_RETIRED_KEYS)) == NULL ||
                    PyObject_SetItem(keys, worker, st) < 0
                ? -1
                : 0;
        goto done;
    }
    PyObject *batch = limit(S, LIMIT_FOLD_BATCH);
    Py_ssize_t full = batch != NULL ? PyLong_AsSsize_t(batch) : -1;
    if ((full == -1 && PyErr_Occurred()) || (ended = REC_GET(S, REC_ENDED)) == NULL ||
        !is_type(ended, &PyList_Type, "the ended states") || PyList_Append(ended, st) < 0)
        goto done;
    r = 0;
    if (PyList_GET_SIZE(ended) >= full) { /* a batch: folded in Python */
        PyObject *res = PyObject_CallMethodNoArgs(S->recorder, S->rec_names[REC_FOLD_ENDED]);
        r = res != NULL ? 0 : -1;
        Py_XDECREF(res);
    }
done:
    Py_XDECREF(by_id);
    Py_XDECREF(key);
    Py_XDECREF(found);
    Py_XDECREF(worker);
    Py_XDECREF(retired);
    Py_XDECREF(keys);
    Py_XDECREF(ended);
    return r;
}

/* Recorder._thread_ended(state, generation), in C (errors cleared: a thread's end reports
 * nothing; at the interpreter's end nothing is left to count). */
static void
thread_ended(ModuleState *S, PyObject *st, PyObject *generation)
{
    Attrs recorder = attrs_open(S->recorder), *rec = &recorder;
    if (peak_ended(S, rec, st, generation) < 0)
        PyErr_Clear();
    PyObject *lock = REC_GET(S, REC_LOCK);
    int got = lock != NULL ? try_acquire(S, lock) : -1;
    if (got > 0) { /* (else another thread has the recorder: the state waits for a compaction) */
        if (leave_locked(S, rec, st) < 0)
            PyErr_Clear();
        recorder_lock_let_go(S, lock);
    }
    Py_XDECREF(lock);
    attrs_close(&recorder);
    PyErr_Clear();
}

/* Whether the interpreter is finalizing (the public name since 3.13). */
#if PY_VERSION_HEX >= 0x030D0000
#define interpreter_finalizing() Py_IsFinalizing()
#else
#define interpreter_finalizing() _Py_IsFinalizing()
#endif

/* A thread's end, counted; not while the interpreter finalizes (the main thread's locals are
 * freed then): nothing is left to count, and the count's lock may be held by a thread that can
 * never run again (the free-threaded build parks a thread that tries to attach then, forever:
 * the main thread waited for it, a hang at exit). record._peak.ThreadEnd does the same. */
static void
ThreadEnd_dealloc(PyObject *self)
{
    ThreadEnd *end = (ThreadEnd *)self;
    PyTypeObject *type = Py_TYPE(self);
    ModuleState *S = PyType_GetModuleState(type);
    if (end->state != NULL && S != NULL && S->recorder != NULL && !interpreter_finalizing()) {
        PyObject *exc_type, *exc, *tb; /* (a deallocation may run while an error is set) */
        PyErr_Fetch(&exc_type, &exc, &tb);
        thread_ended(S, end->state, end->generation);
        PyErr_Restore(exc_type, exc, tb);
    }
    Py_CLEAR(end->state);
    Py_CLEAR(end->generation);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *
ThreadEnd_repr(PyObject *self)
{
    ThreadEnd *end = (ThreadEnd *)self;
    return PyUnicode_FromFormat("<ThreadEnd of %R>", end->state);
}

static PyMemberDef ThreadEnd_members[] = {
    {"state", T_OBJECT, offsetof(ThreadEnd, state), READONLY, "the thread's WorkerState"},
    {"generation", T_OBJECT, offsetof(ThreadEnd, generation), READONLY, "the peak's, at its start"},
    {NULL},
};

static PyType_Slot ThreadEnd_slots[] = {
    {Py_tp_doc, "A thread's end, kept in its locals by a registration from C: its deallocation "
                "does Recorder._thread_ended(state, generation) (no Python __del__)."},
    {Py_tp_dealloc, ThreadEnd_dealloc},
    {Py_tp_repr, ThreadEnd_repr},
    {Py_tp_members, ThreadEnd_members},
    {0, NULL},
};

static PyType_Spec ThreadEnd_spec = {
    .name = "otel_lockwatch.capture._speedups.ThreadEnd",
    .basicsize = sizeof(ThreadEnd),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = ThreadEnd_slots,
};

/* After a hold's release and its bookkeeping: the entry its lock (or section slot) keeps, at
 * `*field`, no longer keeps the frame that acquired. A frame object still alive when its call
 * returns keeps the call's locals, so an object the program let go of at the return lived on,
 * instrumented only, until the lock's next acquisition (tests/test_lifetimes.py). With nothing
 * but the field and the release (`entry`, its own reference) referring to the entry, the frame
 * goes in place and the entry stays for its reuse (GIL build); else the field lets go of the
 * entry (a waiter that arrived during the hold keeps its own reference, and so the holder's
 * site), and holds None. A hold taken since (the bookkeeping may switch threads) is left alone. */
static void
entry_released(ModuleState *S, PyObject *owner, PyObject **field, PyObject *entry)
{
#ifdef Py_GIL_DISABLED
    PyObject *expected = entry;
    int swapped;
    Py_BEGIN_CRITICAL_SECTION(owner); /* (a waiter may be reading the field: hold_entry) */
    swapped = __atomic_compare_exchange_n(field, &expected, Py_None, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE); /* (None is immortal: no reference) */
    Py_END_CRITICAL_SECTION();
    if (swapped)
        Py_DECREF(entry); /* the field's reference */
#else
    (void)owner;
    if (*field != entry)
        return;
    if (Py_TYPE(entry) == S->held_entry_type && Py_REFCNT(entry) == 2) {
        PyObject *frame = ENTRY_GET(entry, ENTRY_FRAME);
        if (frame != Py_None) {
            PyStructSequence_SET_ITEM(entry, ENTRY_FRAME, Py_NewRef(Py_None));
            Py_DECREF(frame); /* (its locals' finalizers may run: the entry is ours meanwhile) */
        }
        return;
    }
    *field = Py_NewRef(Py_None);
    Py_DECREF(entry); /* the field's reference */
#endif
}

/* The bookkeeping of a release (_bookkeeping.untrack): pop the held entry, record the hold.
 * `index`: the section's, or NULL. Errors are swallowed: the lock is already released. */
/* Whether `name` of the outbox is True (-1: an error). */
static int
outbox_flag(ModuleState *S, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(S->outbox, name);
    if (v == NULL)
        return -1;
    int r = v == Py_True;
    Py_DECREF(v);
    return r;
}

/* The common slow path of a release, queued from here: a hold at or above the metric floor and
 * below the span threshold, of a lock (not a section), once the process's outbox has started. Its
 * record is the one Outbox.put makes for it (_outbox.RECORD_FIELDS; tests/test_outbox_records.py
 * holds the two paths to it); nothing of Python runs, so nothing here can be recorded or re-enter.
 * 1: queued (or, the outbox not accepting, nothing to queue); 0: the Python slow path's (the
 * first record, a span, a section, a full queue); -1: an error. */
static int
hold_queued(ModuleState *S, PyObject *entry, long long t0, long long t1, PyObject *ctx,
            PyObject *index)
{
    if (S->outbox == NULL || (index != NULL && index != Py_None) ||
        t1 - t0 >= FT_LOAD(S->hold_span_ns) || !Py_IS_TYPE(entry, S->held_entry_type))
        return 0;
    int accepting = outbox_flag(S, S->str_accepting);
    if (accepting <= 0)
        return accepting == 0 ? 1 : -1; /* Outbox.put: nothing while nothing consumes */
    int started = outbox_flag(S, S->str_started);
    if (started <= 0)
        return started; /* the first record: Outbox.put starts the emitter */
    PyObject *queue = PyObject_GetAttr(S->outbox, S->str_queue);
    if (queue == NULL)
        return -1;
    int r = 0;
    if (!Py_IS_TYPE(queue, (PyTypeObject *)S->deque_type))
        goto done;
    Py_ssize_t n = PyObject_Size(queue);
    if (n < 0) {
        r = -1;
        goto done;
    }
    if (n >= FT_LOAD(S->outbox_size))
        goto done; /* full: the Python path counts the drop */
    collection_defer(S); /* it allocates, maybe under other held locks: _collection */
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1), *record = NULL;
    if (a != NULL && b != NULL)
        record = PyTuple_Pack(12, S->str_lock_hold,
                              PyStructSequence_GET_ITEM(entry, ENTRY_LOCK_CLASS), a, b,
                              ctx == NULL ? Py_None : ctx, Py_None, Py_False, Py_None, Py_None,
                              Py_None, Py_None, Py_None);
    Py_XDECREF(a);
    Py_XDECREF(b);
    PyObject *appended = record == NULL ? NULL
                         : PyObject_Vectorcall(S->deque_append, (PyObject *[]){queue, record}, 2,
                                               NULL);
    Py_XDECREF(record);
    collection_resume(S);
    if (appended == NULL)
        r = -1;
    else {
        Py_DECREF(appended);
        r = 1;
    }
done:
    Py_DECREF(queue);
    return r;
}

static void
untrack(ModuleState *S, PyObject *st, PyObject *entry, PyObject *s, long long t0, PyObject *ctx, PyObject *index)
{
    long long t1 = now_ns();
    long long h = t1 - t0;
    PyObject *held = slot_get(&S->worker[WORKER_HELD], st);
    PyObject *hist = NULL;
    if (held == NULL)
        goto fail;
    int popped;
    /* (a releasing thread may edit the holder's stack: one step, on the free-threaded build) */
    Py_BEGIN_CRITICAL_SECTION(held);
    Py_ssize_t n = PyList_Check(held) ? PyList_GET_SIZE(held) : -1;
    popped = n > 0 && PyList_GET_ITEM(held, n - 1) == entry;
    if (popped)
        pop_last(held);
    else
        popped = discard(held, entry);
    Py_END_CRITICAL_SECTION();
    if (popped < 0)
        goto fail;
#ifdef Py_GIL_DISABLED
    if (popped)
        spares_fill(S, st, held); /* (the lock is free: a collection it sets off runs outside) */
#endif
    StatsBase *c = c_stats(S, s);
    if (c != NULL) {
        int r;
        Py_BEGIN_CRITICAL_SECTION(c); /* (another thread may release the holder's other lock) */
        c->counts[STATS_HOLD_TOTAL] += h;
        if (h > c->counts[STATS_HOLD_MAX])
            c->counts[STATS_HOLD_MAX] = h;
        if (h < c->counts[STATS_HOLD_MIN])
            c->counts[STATS_HOLD_MIN] = h;
        c->counts[STATS_LAST_RELEASE] = t1; /* (the worker's `last`: WorkerState.last_event_ns) */
        r = hold_add(c, h);
        Py_END_CRITICAL_SECTION();
        if (r < 0)
            goto fail;
    }
    else {
        if (slot_add(&S->stats[STATS_HOLD_TOTAL], s, h) < 0)
            goto fail;
        hist = slot_get(&S->stats[STATS_HOLD_HISTOGRAM], s);
        if (hist == NULL || !is_type(hist, &PyDict_Type, "a hold histogram") ||
            hist_add(hist, h) < 0)
            goto fail;
        long long max, min;
        if (slot_get_ll(&S->stats[STATS_HOLD_MAX], s, &max) < 0)
            goto fail;
        if (h > max && slot_set_ll(&S->stats[STATS_HOLD_MAX], s, h) < 0)
            goto fail;
        if (slot_get_ll(&S->stats[STATS_HOLD_MIN], s, &min) < 0)
            goto fail;
        if (h < min && slot_set_ll(&S->stats[STATS_HOLD_MIN], s, h) < 0)
            goto fail;
        if (slot_set_ll(&S->stats[STATS_LAST_RELEASE], s, t1) < 0)
            goto fail;
    }
    if (h >= FT_LOAD(S->hold_metric_ns)) {
        int queued = hold_queued(S, entry, t0, t1, ctx, index);
        if (queued < 0)
            goto fail;
        if (queued)
            goto done;
        PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1);
        PyObject *r = NULL;
        PyObject *release[REL_FIELDS] = {[REL_WORKER] = st, [REL_ENTRY] = entry,
                                         [REL_START_NS] = a, [REL_END_NS] = b,
                                         [REL_CONTEXT] = ctx, [REL_INDEX] = index};
        if (a != NULL && b != NULL)
            r = call_with_event(S, S->record_hold, S->release_type, release, REL_FIELDS);
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
done:
    Py_DECREF(held);
    Py_XDECREF(hist);
    return;
fail:
    swallow(S);
    Py_XDECREF(held);
    Py_XDECREF(hist);
}

/* ==========================================================================================
 * LockBase: the C half of _threading.LockProxy
 * ========================================================================================== */
typedef struct {
    PyObject_HEAD
    ModuleState *state; /* its module's (the type keeps the module alive) */
    PyObject *lock;     /* _lw_lock: the real lock */
    PyObject *cls;      /* _lockwatch_class */
    /* The hold (_bookkeeping.HOLD_FIELDS: the members of HOLD_NAMES) */
    PyObject *holder;   /* the holder's WorkerState while tracked, else None */
    PyObject *entry;    /* the held-stack entry */
    PyObject *stats;    /* the holder's Stats for this class */
    long long start_ns; /* when the hold began */
    PyObject *context;  /* the OpenTelemetry context at the acquisition */
    PyObject *weakreflist;
} LockBase;

static int
LockBase_traverse(LockBase *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->lock);
    Py_VISIT(self->cls);
    Py_VISIT(self->holder);
    Py_VISIT(self->entry);
    Py_VISIT(self->stats);
    Py_VISIT(self->context);
    return 0;
}

static int
LockBase_clear(LockBase *self)
{
    Py_CLEAR(self->lock);
    Py_CLEAR(self->cls);
    Py_CLEAR(self->holder);
    Py_CLEAR(self->entry);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->context);
    return 0;
}

static void
LockBase_dealloc(LockBase *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    LockBase_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* The module state of a type defined here, or of a class derived from one (NULL with an error
 * otherwise). */
static ModuleState *
state_of_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &speedups_module);
    return module != NULL ? module_state(module) : NULL;
}

static PyObject *
LockBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ModuleState *S = state_of_type(type);
    if (S == NULL)
        return NULL;
    LockBase *self = (LockBase *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->state = S;
    return (PyObject *)self;
}

/* Hand the call to the Python LockProxy.acquire: self, then the arguments as given. */
static PyObject *
delegate(PyObject *fn, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t total = nargs + nkw;
    PyObject *small[8];
    PyObject **stack = small;
    if (total + 1 > 8) {
        stack = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (stack == NULL)
            return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < total; i++)
        stack[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(fn, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return r;
}

/* Whether setup_locks() ran (else a RuntimeError): the Python path is needed for this call. */
static int
locks_ready(ModuleState *S)
{
    if (S->locks_ready)
        return 1;
    PyErr_SetString(PyExc_RuntimeError,
                    "otel_lockwatch.capture._speedups: setup_locks() has not run (import "
                    "otel_lockwatch.capture._threading)");
    return 0;
}

static int
is_default_timeout(PyObject *timeout)
{
    if (PyLong_CheckExact(timeout)) {
        int overflow;
        long v = PyLong_AsLongAndOverflow(timeout, &overflow);
        return !overflow && v == -1;
    }
    if (PyFloat_CheckExact(timeout))
        return PyFloat_AS_DOUBLE(timeout) == -1.0;
    return 0;
}

/* The hold's last held-stack entry (new reference), made to say what a new one would: same class,
 * lock and `canonical`, its frame and instruction set in place when they differ. An entry is
 * compared by identity only while on a held stack, and it leaves the stack at its release; when
 * nothing else refers to it (the hold's note of it aside: a witness keeps what it needs of it)
 * it can serve again, as enumerate's result tuple does: no object (none for the collector to
 * count) and no integer allocated per acquisition, whichever frame acquires (a pool's task is a
 * new frame each time). `entry` is borrowed. Else NULL (no error). */
static inline PyObject *
reused_entry(ModuleState *S, PyObject *entry, PyObject *cls, PyObject *f, PyObject *self,
             PyObject *canonical)
{
#ifdef Py_GIL_DISABLED
    /* Never: a waiter may be reading the hold's _lw_entry (a count of 1 proves nothing). */
    return NULL;
#endif
    if (entry == NULL || Py_TYPE(entry) != S->held_entry_type ||
        ENTRY_GET(entry, ENTRY_LOCK_CLASS) != cls || ENTRY_GET(entry, ENTRY_LOCK) != self ||
        ENTRY_GET(entry, ENTRY_CANONICAL) != canonical || Py_REFCNT(entry) != 1)
        return NULL;
    int lasti = PyFrame_GetLasti((PyFrameObject *)f);
    PyObject *had = ENTRY_GET(entry, ENTRY_LASTI);
    int overflow;
    if (!PyLong_CheckExact(had) || PyLong_AsLongAndOverflow(had, &overflow) != lasti ||
        overflow) {
        PyObject *now = PyLong_FromLong(lasti);
        if (now == NULL) {
            PyErr_Clear();
            return NULL;
        }
        PyStructSequence_SET_ITEM(entry, ENTRY_LASTI, now);
        Py_DECREF(had);
    }
    PyObject *was = ENTRY_GET(entry, ENTRY_FRAME);
    Py_INCREF(entry); /* ours while the old frame goes: whatever its locals' finalizers do */
    if (was != f) {
        PyStructSequence_SET_ITEM(entry, ENTRY_FRAME, Py_NewRef(f));
        Py_DECREF(was);
    }
    return entry;
}

/* Whether the order check (_order_check.check_order) of acquiring `cls` under the worker's held
 * stack would add nothing: every (held class, cls) pair is in the worker's chain cache. Then it
 * is not called (a Python call is most of a nested acquisition's cost). An entry of `obj` itself
 * (the holder waiting for its own hand-over), or anything unusual, is left to the check. */
static __attribute__((noinline)) int
order_known(ModuleState *S, PyObject *st, PyObject *held, PyObject *cls, PyObject *obj)
{
    PyObject *chain = slot_get(&S->worker[WORKER_CHAIN], st);
    if (chain == NULL) {
        PyErr_Clear();
        return 0;
    }
    int known = PySet_CheckExact(chain);
    Py_BEGIN_CRITICAL_SECTION(held); /* (a releasing thread may edit it: its items stay ours) */
    for (Py_ssize_t i = 0; known && i < PyList_GET_SIZE(held); i++) {
        PyObject *entry = PyList_GET_ITEM(held, i);
        if (Py_TYPE(entry) != S->held_entry_type || ENTRY_GET(entry, ENTRY_LOCK) == obj) {
            known = 0;
            break;
        }
        PyObject *pair = PyTuple_Pack(2, ENTRY_GET(entry, ENTRY_LOCK_CLASS), cls);
        int r = pair != NULL ? PySet_Contains(chain, pair) : -1;
        Py_XDECREF(pair);
        if (r != 1) {
            if (r < 0)
                PyErr_Clear();
            known = 0;
        }
    }
    Py_END_CRITICAL_SECTION();
    Py_DECREF(chain);
    return known;
}

/* The tracked acquisition. Returns a new reference to True/False, NULL with an error (the
 * lock's own, or PotentialDeadlockError from the order check), or NULL with no error set:
 * "not handled here, ask the Python path" (nothing has been done then). */
#ifdef Py_GIL_DISABLED
/* _lw_lock's and _lockwatch_class's members (as in LockBase_members), read through. */
static const PyMemberDef LOCK_MEMBER = {"_lw_lock", T_OBJECT_EX, offsetof(LockBase, lock), 0, NULL};
static const PyMemberDef CLASS_MEMBER = {"_lockwatch_class", T_OBJECT_EX, offsetof(LockBase, cls), 0,
                                         NULL};
#endif

/* The proxy's hold's entry (a new reference, or NULL), read by a waiter, which does not hold the
 * lock: on the free-threaded build the holder's release lets go of that entry meanwhile, so it is
 * read under the proxy's critical section, which the stores take (hold_set, entry_released); a
 * plain load and incref took a reference to an entry freed between the two, and reused (once a
 * builtin method, whose `frame` the wait's filing then asked for). */
static inline PyObject *
hold_entry(LockBase *self)
{
    PyObject *entry;
#ifdef Py_GIL_DISABLED
    Py_BEGIN_CRITICAL_SECTION(self);
    entry = Py_XNewRef(__atomic_load_n(&self->entry, __ATOMIC_ACQUIRE));
    Py_END_CRITICAL_SECTION();
#else
    entry = Py_XNewRef(self->entry);
#endif
    return entry;
}

/* The hold noted on the proxy (each a new reference, stolen; the old values released after), which
 * a waiter may read meanwhile (hold_entry; a member descriptor, whose checked incref falls back
 * to the same section): four stores in one critical section on the free-threaded build. */
static inline void
hold_set(LockBase *self, PyObject *entry, PyObject *stats, PyObject *context, PyObject *holder)
{
    PyObject *old[4];
#ifdef Py_GIL_DISABLED
    Py_BEGIN_CRITICAL_SECTION(self);
    old[0] = __atomic_exchange_n(&self->entry, entry, __ATOMIC_ACQ_REL);
    old[1] = __atomic_exchange_n(&self->stats, stats, __ATOMIC_ACQ_REL);
    old[2] = __atomic_exchange_n(&self->context, context, __ATOMIC_ACQ_REL);
    old[3] = __atomic_exchange_n(&self->holder, holder, __ATOMIC_ACQ_REL);
    Py_END_CRITICAL_SECTION();
#else
    old[0] = self->entry, self->entry = entry;
    old[1] = self->stats, self->stats = stats;
    old[2] = self->context, self->context = context;
    old[3] = self->holder, self->holder = holder;
#endif
    for (int i = 0; i < 4; i++)
        Py_XDECREF(old[i]);
}

/* -- a lock proxy's wait (_bookkeeping.timed_wait and record_wait, for a lock's own blocking
 * acquire) -----------------------------------------------------------------------------------
 * The waiter runs this with the lock it waited for held, on everyone's critical path under
 * contention, right after its wake-up (cold caches: Python code there ran about ten times as
 * long as in a loop, docs/performance.md). So it is C, and it does only what must be current at
 * once: the counts of the worker's Stats, and one tuple for record._waits (UNFILED_FIELDS),
 * whose sites and record for OpenTelemetry are filed off the lock path. */

/* A wait of w ns that got the lock, counted on the worker's Stats (record_wait's counts). */
static int
wait_counted(ModuleState *S, PyObject *s, long long w)
{
    PyObject *hist = PyObject_GetAttr(s, S->str_wait_histogram); /* (a dict slot: in place) */
    int r = hist == NULL || !PyDict_Check(hist) ? -1 : hist_add(hist, w);
    Py_XDECREF(hist);
    if (r < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "otel_lockwatch: a wait histogram is a dict");
        return -1;
    }
    if (stats_add(S, s, STATS_CONTENTIONS, 1) < 0 || stats_add(S, s, STATS_WAIT_TOTAL, w) < 0 ||
        stats_bound(S, s, STATS_WAIT_MAX, w, 0) < 0 || stats_bound(S, s, STATS_WAIT_MIN, w, 1) < 0 ||
        stats_add(S, s, STATS_ACQUISITIONS, 1) < 0)
        return -1;
    return 0;
}

/* (code, lasti) of a frame, or NULL with an error. */
static PyObject *
code_key(PyFrameObject *frame, int lasti)
{
    PyObject *code = (PyObject *)PyFrame_GetCode(frame);
    PyObject *offset = PyLong_FromLong(lasti);
    PyObject *key = code != NULL && offset != NULL ? PyTuple_Pack(2, code, offset) : NULL;
    Py_XDECREF(code);
    Py_XDECREF(offset);
    return key;
}

/* The holder's (code, lasti) from its held-stack entry (a HeldEntry, or the pure path's entry,
 * read by name), or None when it has none (released before the look) or is unknown. */
static PyObject *
holder_key(ModuleState *S, PyObject *held_by)
{
    if (held_by == NULL || held_by == Py_None)
        return Py_NewRef(Py_None);
    PyObject *frame, *lasti;
    if (Py_IS_TYPE(held_by, S->held_entry_type)) {
        frame = Py_NewRef(ENTRY_GET(held_by, ENTRY_FRAME));
        lasti = Py_NewRef(ENTRY_GET(held_by, ENTRY_LASTI));
    }
    else {
        frame = PyObject_GetAttrString(held_by, "frame");
        lasti = frame ? PyObject_GetAttrString(held_by, "lasti") : NULL;
    }
    PyObject *key = NULL;
    if (frame != NULL && lasti != NULL) {
        if (!PyFrame_Check(frame))
            key = Py_NewRef(Py_None);
        else {
            PyObject *code = (PyObject *)PyFrame_GetCode((PyFrameObject *)frame);
            key = code ? PyTuple_Pack(2, code, lasti) : NULL;
            Py_XDECREF(code);
        }
    }
    Py_XDECREF(frame);
    Py_XDECREF(lasti);
    return key;
}

/* A span's (thread, thread id) for the calling thread: its threading.Thread (the filer reads
 * its name: record._waits), or its name for a thread threading does not know. */
static PyObject *
thread_key(ModuleState *S)
{
    unsigned long ident = PyThread_get_thread_ident();
    PyObject *id = PyLong_FromUnsignedLong(ident);
    if (id == NULL)
        return NULL;
    PyObject *thread = NULL;
    if (dict_get_ref(S->threads, id, &thread) < 0) {
        Py_DECREF(id);
        return NULL;
    }
    if (thread == NULL)
        thread = PyUnicode_FromFormat("Dummy-%lu", ident);
    PyObject *key = thread != NULL ? PyTuple_Pack(2, thread, id) : NULL;
    Py_XDECREF(thread);
    Py_DECREF(id);
    return key;
}

/* The emitter started, when the outbox accepts and has not (Outbox.begin: it files the waits). */
static int
outbox_begun(ModuleState *S)
{
    int accepting = outbox_flag(S, S->str_accepting);
    if (accepting <= 0)
        return accepting;
    int started = outbox_flag(S, S->str_started);
    if (started != 0)
        return started < 0 ? -1 : 0;
    python_ahead(S);
    PyObject *r = PyObject_CallMethodNoArgs(S->outbox, S->str_begin);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The wait's tuple for record._waits (UNFILED_FIELDS), queued. */
static int
wait_unfiled(ModuleState *S, PyObject *s, PyObject *cls, long long t0, long long t1,
             PyObject *ctx, PyObject *f, PyObject *held_by)
{
    long long span_ns = FT_LOAD(S->wait_span_ns);
    int lasti = PyFrame_GetLasti((PyFrameObject *)f);
    PyObject *waiter = code_key((PyFrameObject *)f, lasti);
    PyObject *holder = waiter ? holder_key(S, held_by) : NULL;
    PyObject *site = NULL, *thread = NULL, *wait = NULL;
    if (holder == NULL)
        goto done;
    if (t1 - t0 >= span_ns) { /* its span names both sites and the thread */
        PyObject *globals = PyFrame_GetGlobals((PyFrameObject *)f), *module = NULL;
        if (globals == NULL || dict_get_ref(globals, S->str_dunder_name, &module) < 0) {
            Py_XDECREF(globals);
            goto done;
        }
        Py_DECREF(globals);
        site = PyTuple_Pack(3, module ? module : Py_None, PyTuple_GET_ITEM(waiter, 0),
                            PyTuple_GET_ITEM(waiter, 1));
        Py_XDECREF(module);
        if (site == NULL || (thread = thread_key(S)) == NULL)
            goto done;
    }
    if (outbox_begun(S) < 0)
        goto done;
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1);
    PyObject *span = PyLong_FromLongLong(span_ns);
    if (a != NULL && b != NULL && span != NULL)
        wait = PyTuple_Pack(12, s, cls, a, b, Py_True, ctx, Py_None, span, waiter, holder,
                            site ? site : Py_None, thread ? thread : Py_None);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(span);
    if (wait == NULL)
        goto done;
    Py_ssize_t queued = PyObject_Size(S->waits_queue);
    PyObject *r = queued < 0 ? NULL
                  : PyObject_CallOneArg(queued < FT_LOAD(S->waits_limit) ? S->waits_append
                                                                         : S->waits_add, wait);
    Py_CLEAR(wait);
    if (r != NULL) {
        Py_DECREF(r);
        wait = Py_None; /* (done) */
    }
done:
    Py_XDECREF(waiter);
    Py_XDECREF(holder);
    Py_XDECREF(site);
    Py_XDECREF(thread);
    return wait == NULL ? -1 : 0;
}

/* How often a waiter on the free-threaded build looks again for a holder not published yet. */
#define HOLDER_LOOKS 16

/* The blocking wait of a lock proxy whose try failed: the window first (a holder switched out
 * inside lockwatch is yielded to, S->window), else the lock's own blocking acquire, timed from
 * the window's end (from the failed try without the GIL), with the worker's `waiting` noted
 * meanwhile (the live gauges); then the wait counted and left to file. 1: taken; 0: not (the
 * acquire said so); -1: an error (the acquire's own, as KeyboardInterrupt from a signal
 * handler: raised to the caller, as the lock's acquire raises it). */
static int
lock_wait_here(ModuleState *S, LockBase *self, PyObject *st, PyObject *s, PyObject *cls,
               PyObject *f, PyObject *lock)
{
    long long t0 = now_ns();
    PyObject *event[ACQ_FIELDS] = {[ACQ_WORKER] = st,      [ACQ_STATS] = s,
                                   [ACQ_LOCK_CLASS] = cls, [ACQ_FRAME] = f,
                                   [ACQ_LOCK] = lock,      [ACQ_HOLD] = (PyObject *)self,
                                   [ACQ_CANONICAL] = Py_False,
                                   [ACQ_TIMEOUT] = S->minus_one};
    PyObject *r = call_with_event(S, S->window, S->acquisition_type, event, ACQ_FIELDS);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1; /* (KeyboardInterrupt from a signal handler during a yield: the host's) */
        swallow(S); /* lockwatch's: counted, and the wait goes on */
    }
    else if (consume_truth(S, r))
        return 1; /* taken by yielding (counted there): not a wait of the program's */
#ifndef Py_GIL_DISABLED
    /* The yields waited for the interpreter, not the lock: the program's wait begins here
     * (_switched_out.window_wait times the pure path's alike). */
    t0 = now_ns();
#endif
    PyObject *ctx = current_context(S);
    if (ctx == NULL) {
        swallow(S);
        ctx = Py_NewRef(Py_None);
    }
    PyObject *held_by = hold_entry(self); /* the holder at the arrival */
#ifdef Py_GIL_DISABLED
    /* Without the GIL a holder runs beside its waiters: one that has taken the lock but not yet
     * published its entry (a few microseconds of bookkeeping, or a preemption right there) is
     * given up to HOLDER_LOOKS yields of the processor, so that the wait is charged to its site
     * (the GIL build's window does this by yielding the interpreter). The wait is timed from
     * the failed try: the looks are part of it. */
    for (int look = 0; look < HOLDER_LOOKS && (held_by == NULL || held_by == Py_None); look++) {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
        Py_XSETREF(held_by, hold_entry(self));
    }
#endif
    PyObject *before = slot_get(&S->worker[WORKER_WAITING], st);
    if (before == NULL || slot_set(&S->worker[WORKER_WAITING], st, cls) < 0) {
        swallow(S);
        Py_CLEAR(before);
    }
    PyObject *m = known_method(S, lock, S->lock_acquire, S->rlock_acquire);
    PyObject *got = m != NULL ? PyObject_CallOneArg(m, lock)
                              : PyObject_CallMethodNoArgs(lock, S->str_acquire);
    long long t1 = now_ns();
    if (before != NULL) {
        PyObject *type, *value, *tb; /* (the acquire's error, kept) */
        PyErr_Fetch(&type, &value, &tb);
        if (slot_set(&S->worker[WORKER_WAITING], st, before) < 0)
            swallow(S);
        PyErr_Restore(type, value, tb);
        Py_DECREF(before);
    }
    int ok = got == NULL ? -1 : PyObject_IsTrue(got);
    Py_XDECREF(got);
    if (ok > 0) {
        if (wait_counted(S, s, t1 - t0) < 0)
            swallow(S);
        PyObject *in_lockwatch = slot_get(&S->worker[WORKER_IN_LOCKWATCH], st);
        collection_defer(S); /* it allocates under the lock it took: _collection */
        if (in_lockwatch == NULL || slot_set(&S->worker[WORKER_IN_LOCKWATCH], st, Py_True) < 0 ||
            wait_unfiled(S, s, cls, t0, t1, ctx, f, held_by) < 0)
            swallow(S);
        if (in_lockwatch != NULL && slot_set(&S->worker[WORKER_IN_LOCKWATCH], st, in_lockwatch) < 0)
            swallow(S);
        collection_resume(S);
        Py_XDECREF(in_lockwatch);
    }
    Py_DECREF(ctx);
    Py_XDECREF(held_by);
    return ok;
}

static PyObject *
lock_acquire_fast(LockBase *self, int blocking)
{
    ModuleState *S = self->state;
    if (!S->locks_ready || self->lock == NULL || self->cls == NULL)
        return NULL;
    PyObject *st = usable_state(S);
    if (st == NULL)
        return NULL;
    /* Our own references: the Python code called below may rename (name_lock) the lock (on the
     * free-threaded build, another thread may, meanwhile: read as its member reads it). */
#ifdef Py_GIL_DISABLED
    PyObject *lock = PyMember_GetOne((const char *)self, (PyMemberDef *)&LOCK_MEMBER);
    PyObject *cls = lock ? PyMember_GetOne((const char *)self, (PyMemberDef *)&CLASS_MEMBER) : NULL;
    if (cls == NULL) {
        PyErr_Clear();
        Py_XDECREF(lock);
        Py_DECREF(st);
        return NULL;
    }
#else
    PyObject *lock = Py_NewRef(self->lock), *cls = Py_NewRef(self->cls);
#endif
    PyObject *s = stats_of(S, st, cls);
    PyObject *f = NULL, *held = NULL, *result = NULL, *entry = NULL;
    int deferred = 0; /* whether this call holds the collector off (collection_defer) */
    if (s == NULL)
        goto not_here;
    held = slot_get(&S->worker[WORKER_HELD], st);
    if (held == NULL || !PyList_Check(held)) {
        PyErr_Clear();
        goto not_here;
    }
    /* _bookkeeping.acquire_tracked. Under a held lock, the frame object (made on first use) and
     * the order check allocate: with the collector off, until the wait or the hold. */
    if (PyList_GET_SIZE(held) > 0) {
        collection_defer(S);
        deferred = 1;
    }
    f = site_frame(S);
    if (f == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto not_here;
    }
#ifdef Py_GIL_DISABLED
    /* No entry is reused here: the new one is made before the acquire (as the Python path makes
     * it), not with the lock held. */
    entry = new_entry(S, cls, f, (PyObject *)self, Py_False);
    if (entry == NULL) {
        PyErr_Clear();
        goto not_here;
    }
#endif
    if (blocking) {
        if (PyList_GET_SIZE(held) > 0 && !order_known(S, st, held, cls, (PyObject *)self)) {
            PyObject *order[ACQ_FIELDS] = {[ACQ_WORKER] = st, [ACQ_LOCK_CLASS] = cls,
                                           [ACQ_FRAME] = f, [ACQ_HOLD] = (PyObject *)self,
                                           [ACQ_CANONICAL] = Py_False};
            PyObject *r = call_with_event(S, S->check_order, S->acquisition_type, order, ACQ_FIELDS);
            if (r == NULL)
                goto error;
            Py_DECREF(r);
        }
        int ok = try_acquire(S, lock);
        if (ok < 0)
            goto error;
        if (ok) {
            if (stats_add(S, s, STATS_ACQUISITIONS, 1) < 0)
                swallow(S);
        }
        else {
            if (deferred) { /* never while it blocks: the wait records under its own */
                collection_resume(S);
                deferred = 0;
            }
            /* the wait, charged to the holder this proxy keeps (its HOLD_* members) */
            int taken = lock_wait_here(S, self, st, s, cls, f, lock);
            if (taken < 0)
                goto error;
            if (!taken) {
                result = Py_NewRef(Py_False);
                goto done;
            }
        }
    }
    else {
        int ok = try_acquire(S, lock);
        if (ok < 0)
            goto error;
        count_try(S, s, ok);
        if (!ok) {
            result = Py_NewRef(Py_False);
            goto done;
        }
    }
    /* Taken: track the hold (_bookkeeping.track_hold). From here on nothing reaches the host
     * but True. */
    {
        if (entry == NULL)
            entry = reused_entry(S, self->entry, cls, f, (PyObject *)self, Py_False);
        if (entry == NULL) {
            if (!deferred) { /* a new entry, under the lock just taken */
                collection_defer(S);
                deferred = 1;
            }
            entry = new_entry(S, cls, f, (PyObject *)self, Py_False);
        }
        if (entry == NULL || PyList_Append(held, entry) < 0) {
            Py_CLEAR(entry);
            swallow(S);
        }
        else {
            PyObject *ctx = current_context(S);
            if (ctx == NULL) {
                swallow(S);
                ctx = Py_NewRef(Py_None);
            }
            hold_set(self, entry, Py_NewRef(s), ctx, Py_NewRef(st));
            entry = NULL;
            FT_STORE(self->start_ns, now_ns());
        }
    }
    result = Py_NewRef(Py_True);
    goto done;
not_here:
    result = NULL;
    goto done;
error:
    result = NULL;
    if (!PyErr_Occurred()) /* keep "NULL with no error" meaning "not here" */
        PyErr_SetString(PyExc_SystemError, "otel_lockwatch.capture._speedups: lost error");
done:
    Py_DECREF(st);
    Py_DECREF(lock);
    Py_DECREF(cls);
    Py_XDECREF(s);
    Py_XDECREF(f);
    Py_XDECREF(held);
    Py_XDECREF(entry); /* (the free-threaded build's, not taken) */
    if (deferred)
        collection_resume(S);
    return result;
}

static PyObject *
LockBase_acquire(LockBase *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ModuleState *S = self->state;
    PyObject *blocking = Py_True, *timeout = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2)
        goto python;
    if (nargs >= 1)
        blocking = args[0];
    if (nargs == 2)
        timeout = args[1];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (nargs < 1 && PyUnicode_CompareWithASCIIString(name, "blocking") == 0)
            blocking = args[nargs + i];
        else if (nargs < 2 && PyUnicode_CompareWithASCIIString(name, "timeout") == 0)
            timeout = args[nargs + i];
        else
            goto python; /* the Python path raises the lock's TypeError */
    }
    if (timeout != NULL && !is_default_timeout(timeout))
        goto python;
    int b = PyObject_IsTrue(blocking);
    if (b < 0)
        return NULL;
    PyObject *r = lock_acquire_fast(self, b);
    if (r != NULL || PyErr_Occurred())
        return r;
python:
    if (!locks_ready(S))
        return NULL;
    return delegate(S->python_acquire, (PyObject *)self, args, nargs, kwnames);
}

static PyObject *
LockBase_enter(LockBase *self, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = self->state;
    PyObject *r = lock_acquire_fast(self, 1);
    if (r != NULL || PyErr_Occurred())
        return r;
    if (!locks_ready(S))
        return NULL;
    return PyObject_CallOneArg(S->python_acquire, (PyObject *)self);
}

static PyObject *
LockBase_release(LockBase *self, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = self->state;
    if (self->lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_lw_lock");
        return NULL;
    }
    PyObject *st = FT_LOAD(self->holder);
    if (st == NULL || st == Py_None || !S->ready)
        return release_lock(S, self->lock);
    /* Everything the bookkeeping needs, read before the lock is free. */
#ifdef Py_GIL_DISABLED
    /* (two releases at once, one of them wrong: one takes the holder, the other finds None) */
    Py_BEGIN_CRITICAL_SECTION(self); /* (a waiter may be reading _lw_holder) */
    st = __atomic_exchange_n(&self->holder, Py_NewRef(Py_None), __ATOMIC_ACQ_REL);
    Py_END_CRITICAL_SECTION();
    if (st == NULL || st == Py_None) {
        Py_XDECREF(st);
        return release_lock(S, self->lock);
    }
#else
    self->holder = Py_NewRef(Py_None); /* the reference to st is ours now */
#endif
    PyObject *entry = Py_XNewRef(FT_LOAD(self->entry));
    PyObject *s = Py_XNewRef(FT_LOAD(self->stats));
    PyObject *ctx = Py_XNewRef(FT_LOAD(self->context));
    long long t0 = FT_LOAD(self->start_ns);
    PyObject *r = release_lock(S, self->lock);
    if (r != NULL && entry != NULL && s != NULL)
        untrack(S, st, entry, s, t0, ctx ? ctx : Py_None, NULL);
    if (r != NULL && entry != NULL)
        entry_released(S, (PyObject *)self, &self->entry, entry);
    Py_DECREF(st);
    Py_XDECREF(entry);
    Py_XDECREF(s);
    Py_XDECREF(ctx);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* Any arguments, as the lock's own __exit__ takes (it is its release). */
static PyObject *
LockBase_exit(LockBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    return LockBase_release(self, NULL);
}

static PyMethodDef LockBase_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))LockBase_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool: the lock's acquire, recorded."},
    {"acquire_lock", (PyCFunction)(void (*)(void))LockBase_acquire,
     METH_FASTCALL | METH_KEYWORDS, "An alias of acquire()."},
    {"__enter__", (PyCFunction)LockBase_enter, METH_NOARGS, "acquire()"},
    {"release", (PyCFunction)LockBase_release, METH_NOARGS,
     "release(): the lock's release, recorded."},
    {"release_lock", (PyCFunction)LockBase_release, METH_NOARGS, "An alias of release()."},
    {"__exit__", (PyCFunction)(void (*)(void))LockBase_exit, METH_FASTCALL, "release()"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef LockBase_members[] = {
    {"_lw_lock", T_OBJECT_EX, offsetof(LockBase, lock), 0, NULL},
    {"_lockwatch_class", T_OBJECT_EX, offsetof(LockBase, cls), 0, NULL},
    /* the hold: HOLD_NAMES, as a Python hold keeps them (the Python code reads and writes a C
     * proxy's hold as it does a Python one's) */
    {"_lw_holder", T_OBJECT_EX, offsetof(LockBase, holder), 0, NULL},
    {"_lw_entry", T_OBJECT_EX, offsetof(LockBase, entry), 0, NULL},
    {"_lw_stats", T_OBJECT_EX, offsetof(LockBase, stats), 0, NULL},
    {"_lw_start_ns", T_LONGLONG, offsetof(LockBase, start_ns), 0, NULL},
    {"_lw_context", T_OBJECT_EX, offsetof(LockBase, context), 0, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(LockBase, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};
static PyType_Slot LockBase_slots[] = {
    {Py_tp_doc, "The C half of _threading.LockProxy: its slots and its uncontended path."},
    {Py_tp_traverse, LockBase_traverse},
    {Py_tp_clear, LockBase_clear},
    {Py_tp_dealloc, LockBase_dealloc},
    {Py_tp_methods, LockBase_methods},
    {Py_tp_members, LockBase_members},
    {Py_tp_new, LockBase_new},
    {0, NULL},
};
static PyType_Spec LockBase_spec = {
    .name = "otel_lockwatch.capture._speedups.LockBase",
    .basicsize = sizeof(LockBase),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = LockBase_slots,
};

/* ==========================================================================================
 * RLockBase: the C half of _threading.RLockProxy (re-entry by the owner is neither a wait nor an
 * order edge: the lock's own acquire, and a depth)
 * ========================================================================================== */
typedef struct {
    LockBase base;
    Py_ssize_t depth; /* _lw_depth: re-entries beyond the tracked acquisition */
} RLockBase;

/* Whether the calling thread's state is `st` (the owner's, while tracked). */
static int
is_current_state(ModuleState *S, PyObject *st)
{
    if (st == NULL || st == Py_None || !S->ready)
        return 0;
    return thread_state(S) == st;
}

static PyObject *
RLockBase_acquire(RLockBase *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ModuleState *S = self->base.state;
    if (!locks_ready(S))
        return NULL;
    PyObject *st = self->base.lock != NULL ? thread_state(S) : NULL; /* borrowed */
    if (st == NULL) /* no state yet: the Python path creates it */
        return delegate(S->python_rlock_acquire, (PyObject *)self, args, nargs, kwnames);
    int owner = FT_LOAD(self->base.holder) == st;
    if (owner) {
        /* Re-entry by the owner: the lock's own acquire, with the arguments as given. */
        PyObject *lock = Py_NewRef(self->base.lock);
        PyObject *m = known_method(S, lock, S->lock_acquire, S->rlock_acquire);
        PyObject *r = m != NULL ? delegate(m, lock, args, nargs, kwnames) : NULL;
        if (m == NULL) {
            PyObject *bound = PyObject_GetAttr(lock, S->str_acquire);
            r = bound ? PyObject_Vectorcall(bound, args, nargs, kwnames) : NULL;
            Py_XDECREF(bound);
        }
        Py_DECREF(lock);
        if (r == NULL)
            return NULL;
        int ok = PyObject_IsTrue(r);
        if (ok < 0) {
            Py_DECREF(r);
            return NULL;
        }
        if (ok)
            self->depth++;
        return r;
    }
    return LockBase_acquire((LockBase *)self, args, nargs, kwnames);
}

static PyObject *
RLockBase_enter(RLockBase *self, PyObject *Py_UNUSED(ignored))
{
    return RLockBase_acquire(self, NULL, 0, NULL);
}

static PyObject *
RLockBase_release(RLockBase *self, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = self->base.state;
    if (self->base.lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_lw_lock");
        return NULL;
    }
    if (!is_current_state(S, FT_LOAD(self->base.holder))) /* not tracked, or not the owner: the lock decides */
        return release_lock(S, self->base.lock);
    if (self->depth) {
        PyObject *r = release_lock(S, self->base.lock);
        if (r != NULL)
            self->depth--;
        return r;
    }
    return LockBase_release((LockBase *)self, NULL);
}

static PyObject *
RLockBase_exit(RLockBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    return RLockBase_release(self, NULL);
}

static PyMethodDef RLockBase_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))RLockBase_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool: the lock's acquire, recorded."},
    {"__enter__", (PyCFunction)RLockBase_enter, METH_NOARGS, "acquire()"},
    {"release", (PyCFunction)RLockBase_release, METH_NOARGS,
     "release(): the lock's release, recorded."},
    {"__exit__", (PyCFunction)(void (*)(void))RLockBase_exit, METH_FASTCALL, "release()"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RLockBase_members[] = {
    {"_lw_depth", T_PYSSIZET, offsetof(RLockBase, depth), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot RLockBase_slots[] = {
    {Py_tp_doc, "The C half of _threading.RLockProxy: its depth and its uncontended path."},
    {Py_tp_traverse, LockBase_traverse},
    {Py_tp_clear, LockBase_clear},
    {Py_tp_dealloc, LockBase_dealloc},
    {Py_tp_methods, RLockBase_methods},
    {Py_tp_members, RLockBase_members},
    {Py_tp_new, LockBase_new},
    {0, NULL},
};
static PyType_Spec RLockBase_spec = {
    .name = "otel_lockwatch.capture._speedups.RLockBase",
    .basicsize = sizeof(RLockBase),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = RLockBase_slots,
};

/* ==========================================================================================
 * ForwardingCall: a C callable installed in place of an original method or factory. It runs the
 * common case itself and forwards every other call, arguments unchanged, to the Python wrapper
 * (`python`, the pure path's implementation) or, when there is nothing to record, to the
 * original (`original`, its __wrapped__). Every such type shares this layout and its slots
 * (FORWARDING_CALL_TYPE): SectionAcquire / SectionRelease, SemaphoreAcquire / SemaphoreRelease,
 * ConditionNotify, CreationGate / CreationCall. To Python it looks like the function it replaces
 * (its attributes, __doc__ and pickling are the original's or the installed name's).
 * ========================================================================================== */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* what the type's calls run (FORWARDING_CALL_TYPE's CALL) */
    ModuleState *state; /* its module's (the type keeps the module alive) */
    PyObject *original; /* the replaced method or factory: __wrapped__ */
    PyObject *python;   /* the Python wrapper, for every call not handled here */
    PyObject *extra;    /* what the calls read besides, by type: vars(sections._array), the
                         * frames to skip to find a section's acquisition site (SectionAcquire);
                         * the condition (ConditionNotify); _naming's answers so far
                         * (CreationGate / CreationCall); None (the others) */
    int mirror;         /* SectionRelease: do the array's release inline; ConditionNotify: the
                         * instance's notify is threading.Condition's own */
    PyObject *dict;     /* __module__ / __qualname__ as installed (_patches), for pickle */
} ForwardingCall;

static int
ForwardingCall_traverse(ForwardingCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->original);
    Py_VISIT(self->python);
    Py_VISIT(self->extra);
    Py_VISIT(self->dict);
    return 0;
}

static int
ForwardingCall_clear(ForwardingCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->python);
    Py_CLEAR(self->extra);
    Py_CLEAR(self->dict);
    return 0;
}

static void
ForwardingCall_dealloc(ForwardingCall *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ForwardingCall_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *
ForwardingCall_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* Attributes a function has (__name__, __doc__, __qualname__, ...): the original's. */
static PyObject *
ForwardingCall_getattro(ForwardingCall *self, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr((PyObject *)self, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError) || self->original == NULL)
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(self->original, name);
}

static PyObject *
ForwardingCall_doc(ForwardingCall *self, void *Py_UNUSED(closure))
{
    return PyObject_GetAttrString(self->original, "__doc__");
}

static PyGetSetDef ForwardingCall_getset[] = {
    {"__doc__", (getter)ForwardingCall_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* pickle saves it as a reference to where it is installed (the name _patches gave it), as it
 * saves the function or builtin it replaced; unpickling looks the name up again. */
static PyObject *
ForwardingCall_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef ForwardingCall_methods[] = {
    {"__reduce__", ForwardingCall_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef ForwardingCall_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(ForwardingCall, original), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ForwardingCall, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(ForwardingCall, dict), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
ForwardingCall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    /* (the third argument's keyword is SectionAcquire's name for it, kept as it was) */
    static char *kwlist[] = {"original", "python", "globals", "mirror", NULL};
    PyObject *original, *python, *extra = Py_None;
    int mirror = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|Op", kwlist, &original, &python, &extra,
                                     &mirror))
        return NULL;
    ModuleState *S = state_of_type(type);
    if (S == NULL)
        return NULL;
    ForwardingCall *self = (ForwardingCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->state = S;
    self->original = Py_NewRef(original);
    self->python = Py_NewRef(python);
    self->extra = Py_NewRef(extra);
    self->mirror = mirror;
    return (PyObject *)self;
}

/* A ForwardingCall type NAME (its spec NAME##_spec) whose calls run CALL (a vectorcallfunc taking
 * the ForwardingCall); DESCR: Py_tp_descr_get, to bind like a method, or 0, to be no descriptor. */
#define FORWARDING_CALL_TYPE(NAME, DOC, CALL, DESCR)                                           \
    static PyObject *NAME##_new(PyTypeObject *type, PyObject *args, PyObject *kwds)            \
    {                                                                                          \
        ForwardingCall *self = (ForwardingCall *)ForwardingCall_new(type, args, kwds);         \
        if (self != NULL)                                                                      \
            self->vectorcall = (vectorcallfunc)CALL;                                           \
        return (PyObject *)self;                                                               \
    }                                                                                          \
    static PyType_Slot NAME##_slots[] = {                                                      \
        /* no Py_tp_doc: an instance's __doc__ is the original's (ForwardingCall_getset) */    \
        {Py_tp_traverse, ForwardingCall_traverse},                                             \
        {Py_tp_clear, ForwardingCall_clear},                                                   \
        {Py_tp_dealloc, ForwardingCall_dealloc},                                               \
        {Py_tp_call, PyVectorcall_Call},                                                       \
        {Py_tp_getattro, ForwardingCall_getattro},                                             \
        {Py_tp_methods, ForwardingCall_methods},                                               \
        {Py_tp_members, ForwardingCall_members},                                               \
        {Py_tp_getset, ForwardingCall_getset},                                                 \
        {Py_tp_new, NAME##_new},                                                               \
        {DESCR, DESCR ? (void *)ForwardingCall_get : NULL}, /* last: 0 ends the table */       \
        {0, NULL},                                                                             \
    };                                                                                         \
    static PyType_Spec NAME##_spec = {                                                         \
        .name = "otel_lockwatch.capture._speedups." #NAME,                                     \
        .basicsize = sizeof(ForwardingCall),                                                   \
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |        \
                 (DESCR ? Py_TPFLAGS_METHOD_DESCRIPTOR : 0),                                   \
        .slots = NAME##_slots,                                                                 \
    }

/* ==========================================================================================
 * SectionAcquire / SectionRelease: the instrumented StripedSections._acquire / _release
 * ========================================================================================== */

/* seq[index] for a list and an in-range int index: the position, else -1 (no error set; the
 * caller then takes the generic path, which raises what the array would raise). */
static inline Py_ssize_t
list_index(PyObject *seq, PyObject *index)
{
    if (!PyList_CheckExact(seq) || !PyLong_CheckExact(index))
        return -1;
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return (i >= 0 && i < PyList_GET_SIZE(seq)) ? i : -1;
}

static PyObject *
section_item(PyObject *arr, Slot *attr, PyObject *index)
{
    PyObject *seq = slot_get(attr, arr);
    if (seq == NULL)
        return NULL;
    Py_ssize_t i = list_index(seq, index);
    if (i >= 0) {
        PyObject *r = list_item(seq, i);
        Py_DECREF(seq);
        return r;
    }
    PyObject *r = PyObject_GetItem(seq, index);
    Py_DECREF(seq);
    return r;
}

static int
section_set(PyObject *arr, Slot *attr, PyObject *index, PyObject *value)
{
    PyObject *seq = slot_get(attr, arr);
    if (seq == NULL)
        return -1;
    Py_ssize_t i = list_index(seq, index);
    if (i >= 0) {
#ifdef Py_GIL_DISABLED
        int r = PyList_SetItem(seq, i, Py_NewRef(value)); /* (a reader may hold the old one) */
        Py_DECREF(seq);
        return r;
#else
        PyObject *old = PyList_GET_ITEM(seq, i);
        PyList_SET_ITEM(seq, i, Py_NewRef(value));
        Py_DECREF(old);
        Py_DECREF(seq);
        return 0;
#endif
    }
    int r = PyObject_SetItem(seq, index, value);
    Py_DECREF(seq);
    return r;
}

/* The array's per-array state, when ready for the fast path (new reference), else NULL. */
static PyObject *
ready_track(ModuleState *S, PyObject *arr)
{
    PyObject *track = slot_get(&S->array[ARRAY_TRACK], arr);
    if (track == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (track == Py_None) {
        Py_DECREF(track);
        return NULL;
    }
    PyObject *tname = slot_get(&S->track[TRACK_NAME], track);
    PyObject *aname = tname ? slot_get(&S->array[ARRAY_NAME], arr) : NULL;
    int same = 0;
    if (aname != NULL)
        same = tname == aname ? 1 : PyObject_RichCompareBool(tname, aname, Py_EQ);
    Py_XDECREF(tname);
    Py_XDECREF(aname);
    if (same != 1) {
        PyErr_Clear();
        Py_DECREF(track);
        return NULL;
    }
    return track;
}

static PyObject *
section_acquire(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!S->sections_ready || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs < 3 ||
        nargs > 6)
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    PyObject *arr = args[0], *index = args[1], *key = args[2];
    PyObject *blocking = nargs > 3 ? args[3] : Py_True;
    PyObject *timeout = nargs > 4 ? args[4] : S->minus_one;
    PyObject *canonical = nargs > 5 ? args[5] : Py_False;

    PyObject *st = usable_state(S);
    if (st == NULL)
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    PyObject *track = NULL, *cls = NULL, *s = NULL, *f = NULL, *held = NULL, *result = NULL;
    int handled = 1, deferred = 0; /* deferred: as in lock_acquire_fast */
    track = ready_track(S, arr);
    if (track == NULL)
        goto not_here;
    cls = slot_get(&S->track[TRACK_LOCK_CLASS], track);
    if (cls == NULL) {
        PyErr_Clear();
        goto not_here;
    }
    s = stats_of(S, st, cls);
    if (s == NULL)
        goto not_here;
    held = slot_get(&S->worker[WORKER_HELD], st);
    if (held == NULL || !PyList_Check(held)) {
        PyErr_Clear();
        goto not_here;
    }
    if (PyList_GET_SIZE(held) > 0) {
        collection_defer(S);
        deferred = 1;
    }
    {
        /* The site: the first frame outside _sections (lock() / __enter__ live there). */
        PyFrameObject *cur = PyThreadState_GetFrame(PyThreadState_Get()); /* as site_frame(S) */
        if (cur == NULL)
            goto not_here;
        for (;;) {
            PyObject *g = PyFrame_GetGlobals(cur);
            int inside = g == fn->extra;
            Py_XDECREF(g);
            if (!inside)
                break;
            PyFrameObject *back = PyFrame_GetBack(cur);
            if (back == NULL)
                break;
            Py_DECREF(cur);
            cur = back;
        }
        f = (PyObject *)cur;
    }
    int b = PyObject_IsTrue(blocking);
    if (b < 0)
        goto error;
    if (b) {
        if (PyList_GET_SIZE(held) > 0 &&
            !(canonical == Py_False && order_known(S, st, held, cls, arr))) {
            PyObject *order[ACQ_FIELDS] = {[ACQ_WORKER] = st, [ACQ_LOCK_CLASS] = cls,
                                           [ACQ_FRAME] = f,   [ACQ_HOLD] = arr,
                                           [ACQ_CANONICAL] = canonical};
            PyObject *r = call_with_event(S, S->check_order, S->acquisition_type, order, ACQ_FIELDS);
            if (r == NULL)
                goto error;
            Py_DECREF(r);
        }
        PyObject *lock = section_item(arr, &S->array[ARRAY_LOCKS], index);
        if (lock == NULL)
            goto error;
        int ok = try_acquire(S, lock);
        Py_DECREF(lock);
        if (ok < 0)
            goto error;
        if (ok) {
            /* The array's uncontended path, mirrored (StripedSections._acquire). */
            PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
            if (ident == NULL || section_set(arr, &S->array[ARRAY_OWNERS], index, ident) < 0 ||
                section_set(arr, &S->array[ARRAY_KEYS], index, key) < 0 ||
                stats_add(S, s, STATS_ACQUISITIONS, 1) < 0)
                swallow(S);
            Py_XDECREF(ident);
        }
        else {
            if (deferred) {
                collection_resume(S);
                deferred = 0;
            }
            PyObject *wait[ACQ_FIELDS] = {
                [ACQ_WORKER] = st, [ACQ_STATS] = s,     [ACQ_LOCK_CLASS] = cls,
                [ACQ_FRAME] = f,   [ACQ_HOLD] = arr,    [ACQ_CANONICAL] = canonical,
                [ACQ_TIMEOUT] = timeout, [ACQ_INDEX] = index, [ACQ_KEY] = key,
                [ACQ_ORIGINAL] = fn->original};
            PyObject *r = call_with_event(S, S->section_wait, S->acquisition_type, wait, ACQ_FIELDS);
            if (r == NULL)
                goto error;
            if (!consume_truth(S, r)) {
                result = Py_NewRef(Py_False);
                goto done;
            }
        }
    }
    else {
        PyObject *call[6] = {arr, index, key, Py_False, S->minus_one, canonical};
        PyObject *r = PyObject_Vectorcall(fn->original, call, 6, NULL);
        if (r == NULL)
            goto error;
        int ok = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (ok < 0)
            goto error;
        count_try(S, s, ok);
        if (!ok) {
            result = Py_NewRef(Py_False);
            goto done;
        }
    }
    /* Taken: track the hold (_sections.hold_section), under the lock: the collector off. */
    if (!deferred) {
        collection_defer(S);
        deferred = 1;
    }
    {
        PyObject *slots = NULL, *slot = NULL, *entry = NULL, *ctx = NULL, *counter = NULL;
        slots = slot_get(&S->track[TRACK_SLOTS], track);
        if (slots == NULL)
            goto track_failed;
        Py_ssize_t si = list_index(slots, index);
        slot = si >= 0 ? list_item(slots, si) : PyObject_GetItem(slots, index);
        if (slot == NULL)
            goto track_failed;
        if (slot == Py_None) {
            Py_DECREF(slot);
            slot = PyObject_CallNoArgs(S->tables[TABLE_HOLD].type);
            if (slot == NULL || PyObject_SetItem(slots, index, slot) < 0)
                goto track_failed;
        }
        /* the section's last entry, when nothing else refers to it (as a Lock's) */
#ifdef Py_GIL_DISABLED
        PyObject *last = NULL; /* (never reused there: reused_entry) */
#else
        PyObject *last = Py_TYPE(slot) == S->hold[HOLD_ENTRY].type
                             ? *(PyObject **)((char *)slot + S->hold[HOLD_ENTRY].offset)
                             : NULL;
#endif
        entry = reused_entry(S, last, cls, f, arr, canonical);
        if (entry == NULL)
            entry = new_entry(S, cls, f, arr, canonical);
        if (entry == NULL || PyList_Append(held, entry) < 0)
            goto track_failed;
        ctx = current_context(S);
        if (ctx == NULL)
            goto track_failed;
        if (slot_set(&S->hold[HOLD_ENTRY], slot, entry) < 0 ||
            slot_set(&S->hold[HOLD_STATS], slot, s) < 0 ||
            slot_set(&S->hold[HOLD_CONTEXT], slot, ctx) < 0 ||
            slot_set(&S->hold[HOLD_HOLDER], slot, st) < 0)
            goto track_failed;
        counter = slot_get(&S->track[TRACK_HELD_SECTIONS], track);
        if (counter == NULL || !is_type(counter, &PyList_Type, "a held-sections counter") ||
            PyList_Append(counter, S->one) < 0)
            goto track_failed;
        long long max_held;
        int bad = 0;
        /* (sections of one array are held by several threads at once: the compare and the store
         * as one step on the free-threaded build, whose member store takes the section again) */
        Py_BEGIN_CRITICAL_SECTION(track);
        Py_ssize_t now_held = PyList_GET_SIZE(counter);
        bad = slot_get_ll(&S->track[TRACK_MAX_HELD], track, &max_held) < 0 ||
              (now_held > max_held &&
               slot_set_ll(&S->track[TRACK_MAX_HELD], track, now_held) < 0);
        Py_END_CRITICAL_SECTION();
        if (bad)
            goto track_failed;
        if (slot_set_ll(&S->hold[HOLD_START], slot, now_ns()) < 0)
            goto track_failed;
        goto tracked;
    track_failed:
        swallow(S);
    tracked:
        Py_XDECREF(slots);
        Py_XDECREF(slot);
        Py_XDECREF(entry);
        Py_XDECREF(ctx);
        Py_XDECREF(counter);
    }
    result = Py_NewRef(Py_True);
    goto done;
not_here: /* nothing done yet: after the cleanup, the Python path takes the call */
    handled = 0;
    goto done;
error:
    result = NULL;
done:
    Py_DECREF(st);
    Py_XDECREF(track);
    Py_XDECREF(cls);
    Py_XDECREF(s);
    Py_XDECREF(f);
    Py_XDECREF(held);
    if (deferred)
        collection_resume(S);
    return handled ? result : PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
}

static PyObject *
section_release(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!S->sections_ready || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs != 2)
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    PyObject *arr = args[0], *index = args[1];
    PyObject *track = NULL, *slot = NULL, *st = NULL, *entry = NULL, *s = NULL, *ctx = NULL;
    PyObject *result = NULL;
    int tracked = 1;
    long long t0 = 0;
    track = slot_get(&S->array[ARRAY_TRACK], arr);
    if (track == NULL) {
        PyErr_Clear();
        goto untracked;
    }
    if (track != Py_None) {
        PyObject *slots = slot_get(&S->track[TRACK_SLOTS], track);
        Py_ssize_t si = slots ? list_index(slots, index) : -1;
        slot = si >= 0 ? list_item(slots, si) : (slots ? PyObject_GetItem(slots, index) : NULL);
        Py_XDECREF(slots);
        if (slot == NULL) {
            PyErr_Clear();
            goto untracked;
        }
    }
    if (slot == NULL || slot == Py_None)
        goto untracked;
    st = slot_get(&S->hold[HOLD_HOLDER], slot);
    if (st == NULL || st == Py_None) {
        PyErr_Clear();
        goto untracked;
    }
    /* Everything the bookkeeping needs, read before the section is free. */
    entry = slot_get(&S->hold[HOLD_ENTRY], slot);
    s = entry ? slot_get(&S->hold[HOLD_STATS], slot) : NULL;
    ctx = s ? slot_get(&S->hold[HOLD_CONTEXT], slot) : NULL;
    if (ctx == NULL || slot_get_ll(&S->hold[HOLD_START], slot, &t0) < 0) {
        PyErr_Clear();
        goto untracked;
    }
    if (fn->mirror) {
        /* Tracked, so held: the array's release, mirrored (StripedSections._release). */
        if (slot_set(&S->hold[HOLD_HOLDER], slot, Py_None) < 0 ||
            section_set(arr, &S->array[ARRAY_OWNERS], index, Py_None) < 0 ||
            section_set(arr, &S->array[ARRAY_KEYS], index, Py_None) < 0)
            goto error;
        PyObject *lock = section_item(arr, &S->array[ARRAY_LOCKS], index);
        if (lock == NULL)
            goto error;
        PyObject *r = release_lock(S, lock);
        Py_DECREF(lock);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    else {
        PyObject *call[2] = {arr, index};
        PyObject *r = PyObject_Vectorcall(fn->original, call, 2, NULL);
        if (r == NULL) /* not held: nothing changed */
            goto error;
        Py_DECREF(r);
        if (slot_set(&S->hold[HOLD_HOLDER], slot, Py_None) < 0)
            swallow(S);
    }
    {
        PyObject *counter = slot_get(&S->track[TRACK_HELD_SECTIONS], track);
        if (counter != NULL && PyList_Check(counter)) {
            Py_BEGIN_CRITICAL_SECTION(counter); /* (other sections' acquires append meanwhile) */
            if (PyList_GET_SIZE(counter) > 0)
                pop_last(counter);
            Py_END_CRITICAL_SECTION();
        }
        else if (counter == NULL)
            swallow(S);
        Py_XDECREF(counter);
    }
    untrack(S, st, entry, s, t0, ctx, index);
    if (Py_TYPE(slot) == S->hold[HOLD_ENTRY].type) /* (a subclass's slot keeps its entry) */
        entry_released(S, slot, (PyObject **)((char *)slot + S->hold[HOLD_ENTRY].offset), entry);
    result = Py_NewRef(Py_None);
    goto done;
untracked: /* not tracked here: after the cleanup, the array's own release */
    tracked = 0;
    goto done;
error:
    result = NULL;
done:
    Py_XDECREF(track);
    Py_XDECREF(slot);
    Py_XDECREF(st);
    Py_XDECREF(entry);
    Py_XDECREF(s);
    Py_XDECREF(ctx);
    if (tracked)
        return result;
    PyObject *call[2] = {arr, index};
    return PyObject_Vectorcall(fn->original, call, 2, NULL);
}

FORWARDING_CALL_TYPE(SectionAcquire,
                     "SectionAcquire(original, python, globals): the instrumented "
                     "StripedSections._acquire.",
                     section_acquire, Py_tp_descr_get);
FORWARDING_CALL_TYPE(SectionRelease,
                     "SectionRelease(original, python, globals, mirror=True): the "
                     "instrumented StripedSections._release.",
                     section_release, Py_tp_descr_get);

/* ==========================================================================================
 * The hand-off paths: a take and a give (_handoffs.took / gave), a semaphore's acquire and
 * release, a condition's notify
 * ========================================================================================== */
/* A semaphore's acquire and release and a queue's get and put call these on every operation
 * (a checkout and a checkin), after the operation ran; only the bookkeeping is here, so the
 * Python wrappers stay the one place that decides what an operation is. An error goes to
 * OUTBOX.failed, as in Python; both return None. */

/* obj.name (new reference), or NULL with no error when it has none. Unlike reading its __dict__,
 * this never makes the instance's dictionary, which would slow every later attribute access
 * of the object (the standard library's own code included). */
static PyObject *
optional_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyObject_GetOptionalAttr(obj, name, &v) < 0)
#else
    if (_PyObject_LookupAttr(obj, name, &v) < 0)
#endif
        PyErr_Clear();
    return v;
}

/* The worker's HandoffStats for the class (new reference), made by the Python routine when new. */
static PyObject *
handoff_stats_of(ModuleState *S, PyObject *st, PyObject *cls)
{
    PyObject *handoffs = slot_get(&S->worker[WORKER_HANDOFFS], st);
    if (handoffs == NULL)
        return NULL;
    PyObject *s = NULL;
    int found = PyDict_CheckExact(handoffs) ? dict_get_ref(handoffs, cls, &s) : 0;
    Py_DECREF(handoffs);
    if (found != 0)
        return s; /* (or NULL with the error) */
    python_ahead(S);
    return PyObject_CallFunctionObjArgs(S->handoff_stats, st, cls, NULL);
}

/* obj.field = min(obj.field, v) (less: 1) or max (less: 0) */
static int
handoff_args(ModuleState *S, const char *name, Py_ssize_t nargs, PyObject *const *args, long long *a, long long *b,
            Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    if (!S->ready || S->handoff_stats == NULL) {
        PyErr_Format(PyExc_RuntimeError, "otel_lockwatch: %s() before setup_handoffs()", name);
        return -1;
    }
    if (as_ll(args[2], a) < 0)
        return -1;
    return b == NULL ? 0 : as_ll(args[3], b);
}

/* A take (a checkout) by worker st of class cls at `now`: left items or permits remain. */
static void
handoff_took(ModuleState *S, PyObject *st, PyObject *cls, long long left, long long capacity, long long now)
{
    PyObject *s = handoff_stats_of(S, st, cls), *pending = NULL, *stamp = NULL, *r = NULL;
    if (s == NULL || slot_add(&S->handoff[HANDOFF_TAKES], s, 1) < 0 ||
        (pending = slot_get(&S->handoff[HANDOFF_PENDING], s)) == NULL ||
        (stamp = PyLong_FromLongLong(now)) == NULL ||
        (r = Py_TYPE(pending) == (PyTypeObject *)S->deque_type
                 ? PyObject_Vectorcall(S->deque_append, (PyObject *[]){pending, stamp}, 2, NULL)
                 : PyObject_CallMethodOneArg(pending, S->str_append, stamp)) == NULL ||
        slot_bound(&S->handoff[HANDOFF_FEWEST], s, left, 1) < 0 ||
        slot_bound(&S->handoff[HANDOFF_MOST], s, capacity, 0) < 0 ||
        slot_set(&S->worker[WORKER_LAST], st, stamp) < 0)
        swallow(S);
    Py_XDECREF(r);
    Py_XDECREF(stamp);
    Py_XDECREF(pending);
    Py_XDECREF(s);
}

/* took(st, cls, left, capacity): a take (a checkout); left items or permits remain. */
static PyObject *
speedups_took(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ModuleState *S = module_state(module);
    long long now = now_ns(), left, capacity;
    if (handoff_args(S, "took", nargs, args, &left, &capacity, 4) < 0)
        return NULL; /* a caller's mistake, as the Python routine's TypeError */
    handoff_took(S, args[0], args[1], left, capacity, now);
    Py_RETURN_NONE;
}

/* The hold from the last pending take to `now`, if there is one. */
static int
handoff_hold(ModuleState *S, PyObject *s, long long now)
{
    PyObject *pending = slot_get(&S->handoff[HANDOFF_PENDING], s);
    if (pending == NULL)
        return -1;
    Py_ssize_t n = PyObject_Length(pending);
    if (n <= 0) {
        Py_DECREF(pending);
        return (int)n;
    }
    PyObject *start = Py_TYPE(pending) == (PyTypeObject *)S->deque_type
                          ? PyObject_Vectorcall(S->deque_pop, &pending, 1, NULL)
                          : PyObject_CallMethodNoArgs(pending, S->str_pop);
    Py_DECREF(pending);
    long long t0;
    if (start == NULL || as_ll(start, &t0) < 0) {
        Py_XDECREF(start);
        return -1;
    }
    Py_DECREF(start);
    long long h = now - t0;
    PyObject *hist = slot_get(&S->handoff[HANDOFF_HOLD_HISTOGRAM], s);
    int r = hist != NULL && is_type(hist, &PyDict_Type, "a hold histogram") &&
                    hist_add(hist, h) == 0 && slot_add(&S->handoff[HANDOFF_HOLD_TOTAL], s, h) == 0 &&
                    slot_bound(&S->handoff[HANDOFF_HOLD_MAX], s, h, 0) == 0 &&
                    slot_bound(&S->handoff[HANDOFF_HOLD_MIN], s, h, 1) == 0
                ? 0
                : -1;
    Py_XDECREF(hist);
    return r;
}

/* A give (a checkin, a notify) by worker st of class cls at `now`: held items are queued now
 * (-1: not a queue). */
static void
handoff_gave(ModuleState *S, PyObject *st, PyObject *cls, long long held, long long now)
{
    PyObject *s = handoff_stats_of(S, st, cls);
    if (s == NULL || slot_add(&S->handoff[HANDOFF_GIVES], s, 1) < 0 || handoff_hold(S, s, now) < 0 ||
        slot_bound(&S->handoff[HANDOFF_MOST], s, held, 0) < 0 ||
        slot_set_ll(&S->worker[WORKER_LAST], st, now) < 0)
        swallow(S);
    Py_XDECREF(s);
}

/* gave(st, cls, held): a give (a checkin, a notify); held items are queued now (-1: not a queue). */
static PyObject *
speedups_gave(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ModuleState *S = module_state(module);
    long long now = now_ns(), held;
    if (handoff_args(S, "gave", nargs, args, &held, NULL, 3) < 0)
        return NULL;
    handoff_gave(S, args[0], args[1], held, now);
    Py_RETURN_NONE;
}

/* ==========================================================================================
 * SemaphoreAcquire / SemaphoreRelease: a watched threading.Semaphore's acquire (and __enter__)
 * and release (_semaphores.threading_acquire_factory / threading_release_factory), when called
 * with no argument but the semaphore: `with sem:`, `sem.acquire()`, `sem.release()`. Every other
 * call, and one whose permit is not free (it will wait), goes to the Python wrapper unchanged;
 * a semaphore nobody watches (a pool executor's own) goes straight to the original, with any
 * arguments, as the Python wrapper would send it.
 * Both are ForwardingCalls: the original method and the Python wrapper.
 * ========================================================================================== */

/* An int attribute as a long long, else `fallback` (no error). */
static long long
attr_ll(PyObject *obj, PyObject *name, long long fallback)
{
    PyObject *v = optional_attr(obj, name);
    long long out;
    if (v == NULL || !PyLong_Check(v) || as_ll(v, &out) < 0) {
        PyErr_Clear();
        out = fallback;
    }
    Py_XDECREF(v);
    return out;
}

static PyObject *
sem_acquire(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *cls = n >= 1 ? optional_attr(args[0], S->str_lockwatch_class) : NULL;
    if (n >= 1 && cls == NULL) /* not watched (an executor's own): the original, as Python does */
        return PyObject_Vectorcall(fn->original, args, nargsf, kwnames);
    if (n != 1 || kwnames != NULL || !S->ready || S->handoff_stats == NULL) {
        Py_XDECREF(cls);
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    }
    PyObject *sem = args[0], *st = NULL, *s = NULL;
    if ((st = usable_state(S)) == NULL || (s = stats_of(S, st, cls)) == NULL) {
        Py_XDECREF(st);
        Py_XDECREF(cls);
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    }
    PyObject *call[2] = {sem, Py_False};
    PyObject *r = PyObject_Vectorcall(fn->original, call, 2, NULL);
    int ok = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (ok == 1) {
        if (stats_add(S, s, STATS_ACQUISITIONS, 1) < 0)
            swallow(S);
        handoff_took(S, st, cls, attr_ll(sem, S->str_value, -1), attr_ll(sem, S->str_lw_capacity, -1),
                    now_ns());
    }
    Py_DECREF(cls);
    Py_DECREF(s);
    Py_DECREF(st);
    if (ok == 1)
        Py_RETURN_TRUE;
    if (ok < 0)
        return NULL; /* the semaphore's own error, unchanged */
    /* No permit free: the Python wrapper waits for one (and times the wait). */
    return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
}

static PyObject *
sem_release(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *cls = n >= 1 ? optional_attr(args[0], S->str_lockwatch_class) : NULL, *st = NULL;
    if (n >= 1 && cls == NULL) /* not watched: the original, as Python does */
        return PyObject_Vectorcall(fn->original, args, nargsf, kwnames);
    if (n != 1 || kwnames != NULL || !S->ready || S->handoff_stats == NULL) {
        Py_XDECREF(cls);
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    }
    if ((st = usable_state(S)) == NULL) {
        Py_XDECREF(cls);
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    }
    PyObject *r = PyObject_Vectorcall(fn->original, args, 1, NULL);
    if (r != NULL) /* released (a bounded semaphore released too often raises: no checkin) */
        handoff_gave(S, st, cls, -1, now_ns());
    Py_DECREF(cls);
    Py_DECREF(st);
    return r;
}

FORWARDING_CALL_TYPE(SemaphoreAcquire,
                     "SemaphoreAcquire(original, python): a watched threading.Semaphore's acquire.",
                     sem_acquire, Py_tp_descr_get);
FORWARDING_CALL_TYPE(SemaphoreRelease,
                     "SemaphoreRelease(original, python): a watched threading.Semaphore's release.",
                     sem_release, Py_tp_descr_get);

/* A watched threading.Condition's own notify (_conditions._notify_hooks): a ForwardingCall,
 * with `extra` the condition (its class is read on every call, as in Python) and `mirror` set
 * when the instance's notify is threading.Condition's own. The bound original's result and
 * errors pass through; a notify that raised handed nothing over.
 *
 * A notify with no waiter (the common case of a pool that is not exhausted) checks that the
 * lock is held and does nothing else, in every version of threading.Condition.notify: with
 * `mirror`, the default n (or an int >= 0) and an empty waiters deque, it runs here, asking the
 * condition's own _is_owned(); every other call runs the original. */
static int
notify_nobody(ModuleState *S, ForwardingCall *fn, PyObject *const *args, Py_ssize_t n,
              PyObject *kwnames)
{
    if (!fn->mirror || kwnames != NULL || n > 1 ||
        (n == 1 && (!PyLong_CheckExact(args[0]) || _PyLong_Sign(args[0]) < 0)))
        return 0;
    PyObject *waiters = optional_attr(fn->extra, S->str_waiters);
    int empty = waiters != NULL && Py_TYPE(waiters) == (PyTypeObject *)S->deque_type &&
                PyObject_Length(waiters) == 0;
    Py_XDECREF(waiters);
    PyObject *is_owned = empty ? optional_attr(fn->extra, S->str_is_owned) : NULL;
    if (is_owned == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(is_owned);
    Py_DECREF(is_owned);
    int owned = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (owned < 0)
        PyErr_Clear();
    return owned == 1; /* not owned (or unknown): the original raises as it always did */
}

static PyObject *
cond_notify(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    PyObject *cls = NULL, *st = NULL;
    if (S->ready && S->handoff_stats != NULL &&
        (cls = optional_attr(fn->extra, S->str_lockwatch_class)) != NULL)
        st = usable_state(S);
    PyErr_Clear();
    if (st == NULL) {
        Py_XDECREF(cls);
        return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
    }
    PyObject *r = notify_nobody(S, fn, args, PyVectorcall_NARGS(nargsf), kwnames)
                      ? Py_NewRef(Py_None)
                      : PyObject_Vectorcall(fn->original, args, nargsf, kwnames);
    if (r != NULL) { /* a give: no clock (a notify is made under the lock, whose release reads it) */
        PyObject *s = handoff_stats_of(S, st, cls);
        if (s == NULL || slot_add(&S->handoff[HANDOFF_GIVES], s, 1) < 0)
            swallow(S);
        Py_XDECREF(s);
    }
    Py_DECREF(cls);
    Py_DECREF(st);
    return r;
}

FORWARDING_CALL_TYPE(ConditionNotify,
                     "ConditionNotify(original, python, condition, mirror): a watched "
                     "threading.Condition's notify.",
                     cond_notify, Py_tp_descr_get);

/* ==========================================================================================
 * CreationGate: a patched lock factory or __init__ (_threading.proxy_factory's, the patched
 * threading.Condition.__init__) for a creator that is the standard library's own concurrency
 * machinery (_naming.made_by_machinery: a pool's Future makes a Condition, which makes an RLock,
 * for every task). A ForwardingCall, with `extra` _naming's answers so far (module name ->
 * whether it is machinery): when the calling Python frame's module is answered True, the call
 * goes straight to the original, arguments unchanged, as the Python wrapper would send it, with
 * no Python frame made; every other call (a module not answered yet, no Python caller) goes to
 * the Python wrapper, which answers (and notes the answer).
 * ========================================================================================== */
static PyObject *
creation_gate(ForwardingCall *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleState *S = fn->state;
    PyObject *g = PyEval_GetGlobals(); /* borrowed: the caller's, without making its frame */
    if (g != NULL && PyDict_Check(g) && PyDict_Check(fn->extra)) {
        PyObject *name = NULL, *machinery = NULL;
        if (dict_get_ref(g, S->str_dunder_name, &name) > 0)
            (void)dict_get_ref(fn->extra, name, &machinery);
        Py_XDECREF(name);
        Py_XDECREF(machinery); /* (compared, not read: True is immortal) */
        if (machinery == Py_True)
            return PyObject_Vectorcall(fn->original, args, nargsf, kwnames);
        if (PyErr_Occurred())
            PyErr_Clear(); /* an odd __name__: the Python wrapper decides */
    }
    return PyObject_Vectorcall(fn->python, args, nargsf, kwnames);
}

FORWARDING_CALL_TYPE(CreationGate,
                     "CreationGate(original, python, answers): a patched __init__ that sends the "
                     "standard library machinery's calls straight to the original.",
                     creation_gate, Py_tp_descr_get);
/* The same for a factory (threading.Lock is a builtin, which a class attribute does not bind:
 * neither may its replacement, so this one is no descriptor; set up at the module's init). */
FORWARDING_CALL_TYPE(CreationCall,
                     "CreationCall(original, python, answers): a patched lock factory that sends "
                     "the standard library machinery's calls straight to the original.",
                     creation_gate, 0);

/* ==========================================================================================
 * Module
 * ========================================================================================== */
/* S->field = value (borrowed; NULL: none), for a setup call. The GIL build releases the old
 * value; the free-threaded build keeps it in `retired` until the module goes: another thread may
 * be calling it (read a moment ago, borrowed). */
static int
state_set(ModuleState *S, PyObject **field, PyObject *value)
{
    PyObject *old = *field;
    if (old == value)
        return 0;
#ifdef Py_GIL_DISABLED
    if (old != NULL) {
        if (S->retired == NULL && (S->retired = PyList_New(0)) == NULL)
            return -1;
        if (PyList_Append(S->retired, old) < 0)
            return -1;
    }
    __atomic_store_n(field, Py_XNewRef(value), __ATOMIC_RELEASE);
#else
    *field = Py_XNewRef(value);
#endif
    Py_XDECREF(old);
    return 0;
}

/* A later setup call may run: setup() ran (else an error). */
static int
after_setup(ModuleState *S)
{
    if (!S->ready) {
        PyErr_SetString(PyExc_RuntimeError, "otel_lockwatch.capture._speedups: setup() first");
        return 0;
    }
    return 1;
}

static PyObject *
speedups_setup_handoffs(PyObject *module, PyObject *args, PyObject *kwds)
{
    ModuleState *S = module_state(module);
    static char *kwlist[] = {"handoff_stats", "fields", NULL};
    PyObject *make, *fields;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OO", kwlist, &make, &fields))
        return NULL;
    if (!after_setup(S))
        return NULL;
    if (table_resolve(&S->tables[TABLE_HANDOFF], fields) < 0)
        return NULL;
    if (state_set(S, &S->handoff_stats, make) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
speedups_setup(PyObject *module, PyObject *args, PyObject *kwds)
{
    ModuleState *S = module_state(module);
    static char *kwlist[] = {"tls", "context", "failed", "check_order", "record_hold",
                             "worker_state", "stats", "hold", "outbox", "waits", "threads",
                             "new_state", "new_stats", NULL};
    PyObject *tls, *context, *failed, *check_order, *record_hold, *ws, *stats, *hold, *outbox,
        *waits, *threads, *new_state, *new_stats;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOOOOOOOOOO!OO", kwlist, &tls, &context,
                                     &failed, &check_order, &record_hold, &ws, &stats, &hold,
                                     &outbox, &waits, &PyDict_Type, &threads, &new_state,
                                     &new_stats))
        return NULL;
    /* The unfiled waits (record._waits.UnfiledWaits): its queue, that queue's append, its
     * add and its limit. */
    PyObject *waits_queue = PyObject_GetAttrString(waits, "queue");
    PyObject *waits_append = waits_queue ? PyObject_GetAttr(waits_queue, S->str_append) : NULL;
    PyObject *waits_add = waits_append ? PyObject_GetAttrString(waits, "add") : NULL;
    PyObject *limit = waits_add ? PyObject_GetAttrString(waits, "LIMIT") : NULL;
    long long waits_limit = limit == NULL ? -1 : PyLong_AsLongLong(limit);
    Py_XDECREF(limit);
    int taken = waits_limit >= 0 && state_set(S, &S->waits_queue, waits_queue) == 0 &&
                state_set(S, &S->waits_append, waits_append) == 0 &&
                state_set(S, &S->waits_add, waits_add) == 0;
    Py_XDECREF(waits_queue);
    Py_XDECREF(waits_append);
    Py_XDECREF(waits_add);
    if (!taken) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "otel_lockwatch: waits.LIMIT must be >= 0");
        return NULL;
    }
    FT_STORE(S->waits_limit, waits_limit);
    PyObject *size = PyObject_GetAttrString(outbox, "QUEUE_SIZE");
    long long outbox_size = size == NULL ? -1 : PyLong_AsLongLong(size);
    Py_XDECREF(size);
    if (outbox_size == -1 && PyErr_Occurred())
        return NULL;
    if (table_resolve(&S->tables[TABLE_WORKER], ws) < 0 ||
        table_resolve(&S->tables[TABLE_STATS], stats) < 0 ||
        table_resolve(&S->tables[TABLE_HOLD], hold) < 0)
        return NULL;
    if (state_set(S, &S->tls, tls) < 0)
        return NULL;
    if (state_set(S, &S->context, context) < 0)
        return NULL;
    /* context is ContextVar.get, bound: read the variable without the call. */
    PyObject *var = PyCFunction_Check(context) ? PyCFunction_GET_SELF(context) : NULL;
    if (state_set(S, &S->context_var, var != NULL && PyContextVar_CheckExact(var) ? var : NULL) < 0)
        return NULL;
    struct {
        PyObject **field, *value;
    } given[] = {
        {&S->failed, failed},           {&S->check_order, check_order}, {&S->threads, threads},
        {&S->record_hold, record_hold}, {&S->outbox, outbox},           {&S->new_state, new_state},
        {&S->new_stats, new_stats},
    };
    for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++) {
        if (state_set(S, given[i].field, given[i].value) < 0)
            return NULL;
    }
    FT_STORE(S->outbox_size, outbox_size);
    FT_STORE(S->ready, 1);
    FT_ADD(S->generation, 1); /* another tls: read it anew */
    Py_RETURN_NONE;
}

/* Whether every name of `names` (count n) is in `given` (a container): else a ValueError. */
static int
names_given(PyObject *const *names, int n, PyObject *given, const char *what)
{
    for (int i = 0; i < n; i++) {
        int has = PySequence_Contains(given, names[i]);
        if (has < 0)
            return -1;
        if (!has) {
            PyErr_Format(PyExc_ValueError, "otel_lockwatch: %s has no %U, which the C path reads",
                         what, names[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *
speedups_setup_threads(PyObject *module, PyObject *args, PyObject *kwds)
{
    ModuleState *S = module_state(module);
    static char *kwlist[] = {"recorder", "fields", "peak_fields", "limits", NULL};
    PyObject *recorder, *fields, *peak_fields, *limits;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OO!O!O!", kwlist, &recorder, &PyTuple_Type,
                                     &fields, &PyTuple_Type, &peak_fields, &PyDict_Type, &limits))
        return NULL;
    if (!after_setup(S))
        return NULL;
    if (names_given(S->rec_names, REC_USED, fields, "the recorder") < 0 ||
        names_given(S->peak_names, PEAK_USED, peak_fields, "the peak") < 0 ||
        names_given(S->limit_names, LIMIT_USED, limits, "record._recorder") < 0)
        return NULL;
    PyObject **constants[4] = {&S->retired_thread, &S->nothing_held, &S->no_chain,
                               &S->nothing_written};
    for (int i = 0; i < 4; i++)
        if (state_set(S, constants[i], PyDict_GetItem(limits, S->limit_names[LIMIT_ENDED + i])) < 0)
            return NULL;
    if (state_set(S, &S->limits, limits) < 0 || state_set(S, &S->recorder, recorder) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
speedups_setup_locks(PyObject *module, PyObject *args, PyObject *kwds)
{
    ModuleState *S = module_state(module);
    static char *kwlist[] = {"python_acquire", "python_rlock_acquire", "skip_frames", "window",
                             NULL};
    PyObject *acquire, *rlock_acquire, *skip, *window;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOO!O", kwlist, &acquire, &rlock_acquire,
                                     &PyTuple_Type, &skip, &window))
        return NULL;
    if (!after_setup(S))
        return NULL;
    /* Before a lock proxy's wait (lock_wait_here): a failed try first yields to a holder still
     * inside lockwatch's window (3.14's check after a `with`'s call). */
    if (state_set(S, &S->window, window) < 0)
        return NULL;
    if (state_set(S, &S->python_acquire, acquire) < 0)
        return NULL;
    if (state_set(S, &S->python_rlock_acquire, rlock_acquire) < 0)
        return NULL;
    if (state_set(S, &S->skip_frames, skip) < 0)
        return NULL;
    FT_STORE(S->locks_ready, 1);
    Py_RETURN_NONE;
}

static PyObject *
speedups_setup_sections(PyObject *module, PyObject *args, PyObject *kwds)
{
    ModuleState *S = module_state(module);
    static char *kwlist[] = {"section_wait", "track", "array", NULL};
    PyObject *section_wait, *track, *array;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOO", kwlist, &section_wait, &track, &array))
        return NULL;
    if (!after_setup(S))
        return NULL;
    if (table_resolve(&S->tables[TABLE_TRACK], track) < 0 ||
        table_resolve(&S->tables[TABLE_ARRAY], array) < 0)
        return NULL;
    if (state_set(S, &S->section_wait, section_wait) < 0)
        return NULL;
    FT_STORE(S->sections_ready, 1);
    Py_RETURN_NONE;
}

/* Which fields are read at their slot's offset (for the tests): {"Class.field": bool}, every
 * table in setup order, each in its order. */
static PyObject *
speedups_direct_slots(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = module_state(module);
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (int t = 0; t < TABLE_COUNT; t++) {
        if (S->tables[t].type == NULL)
            continue; /* not set up */
        for (int i = 0; i < S->tables[t].spec->used; i++) {
            Slot *sl = &S->tables[t].slots[i];
            PyObject *k = PyUnicode_FromFormat("%s.%U", ((PyTypeObject *)S->tables[t].type)->tp_name,
                                               sl->name);
            if (k == NULL || PyDict_SetItem(d, k, sl->type ? Py_True : Py_False) < 0) {
                Py_XDECREF(k);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
        }
    }
    return d;
}

static PyObject *
speedups_set_thresholds(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ModuleState *S = module_state(module);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "set_thresholds(hold_metric_ns, hold_span_ns, wait_span_ns)");
        return NULL;
    }
    long long metric = PyLong_AsLongLong(args[0]), span = PyLong_AsLongLong(args[1]);
    long long wait_span = PyLong_AsLongLong(args[2]);
    if ((metric == -1 || span == -1 || wait_span == -1) && PyErr_Occurred())
        return NULL;
    FT_STORE(S->hold_metric_ns, metric);
    FT_STORE(S->hold_span_ns, span);
    FT_STORE(S->wait_span_ns, wait_span);
    Py_RETURN_NONE;
}

/* fold(into, other): record._retired.fold's common case in C (the ended worker `other` added to
 * the retired state `into`, which no reader has yet): both WorkerStates, `other` with no spans
 * and no hand-offs, each of its Stats either new to `into` (taken as it is) or a C Stats with no
 * contended wait, added to `into`'s with add_owned. True: folded; False: nothing was changed
 * (checked before anything is), the Python fold's to do. A thread per request is folded into
 * "(other)" once past MAX_WORKERS names: about 13,000 instructions a thread in Python. */
static PyObject *
speedups_fold(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ModuleState *S = module_state(module);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fold(into, other)");
        return NULL;
    }
    PyObject *into = args[0], *other = args[1];
    PyTypeObject *ws = (PyTypeObject *)S->tables[TABLE_WORKER].type;
    if (ws == NULL || Py_TYPE(into) != ws || Py_TYPE(other) != ws || into == other)
        Py_RETURN_FALSE;
    PyObject *mine = slot_get(&S->worker[WORKER_STATS], into), *theirs = NULL, *result = NULL;
    long long first, last, retired, into_retired;
    int t;
    if (mine == NULL || (theirs = slot_get(&S->worker[WORKER_STATS], other)) == NULL)
        goto done;
    if (!PyDict_CheckExact(mine) || !PyDict_CheckExact(theirs) || mine == theirs ||
        (t = slot_truth(&S->worker[WORKER_SPANS], other)) != 0 ||
        (t = slot_truth(&S->worker[WORKER_HANDOFFS], other)) != 0) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_False);
        goto done;
    }
    Py_ssize_t pos = 0;
    PyObject *cls, *s;
    int common = 1;
    /* (`theirs` is an ended worker's, which nobody writes: its items read borrowed) */
    while (common && PyDict_Next(theirs, &pos, &cls, &s)) {
        PyObject *m;
        int found = dict_get_ref(mine, cls, &m);
        if (found <= 0) {
            if (found < 0)
                goto done;
            continue;
        }
        Py_DECREF(m); /* (`mine` keeps it: only its folder, this thread, writes it) */
        StatsBase *a = c_stats(S, m), *b = c_stats(S, s);
        common = a != NULL && b != NULL && a != b && Py_TYPE(m) == Py_TYPE(s) &&
                 a->hold_histogram != NULL && PyDict_Check(a->hold_histogram) &&
                 b->hold_histogram != NULL && PyDict_Check(b->hold_histogram) &&
                 b->wait_histogram != NULL && PyDict_Check(b->wait_histogram) &&
                 PyDict_GET_SIZE(b->wait_histogram) == 0 && b->collisions == 0 &&
                 (b->sites == NULL || b->sites == Py_None);
    }
    if (!common) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (slot_get_ll(&S->worker[WORKER_FIRST], other, &first) < 0 ||
        last_event(S, other, &last) < 0 ||
        slot_get_ll(&S->worker[WORKER_RETIRED], other, &retired) < 0 ||
        slot_get_ll(&S->worker[WORKER_RETIRED], into, &into_retired) < 0 ||
        slot_set_ll(&S->worker[WORKER_RETIRED], into,
                    into_retired + (last > first ? last - first : 0) + retired) < 0)
        goto done;
    pos = 0;
    while (PyDict_Next(theirs, &pos, &cls, &s)) {
        PyObject *m;
        int found = dict_get_ref(mine, cls, &m);
        if (found <= 0) {
            if (found < 0 || PyDict_SetItem(mine, cls, s) < 0)
                goto done; /* (a new key of `mine`: the loop over `theirs` goes on) */
            continue;
        }
        PyObject *added = holds_added((StatsBase *)m, s, 1);
        Py_DECREF(m);
        if (added == NULL)
            goto done;
        Py_DECREF(added);
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return result;
}

static PyObject *
speedups_raw_lock_layout(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = module_state(module);
    return Py_BuildValue("(OO)", S->raw_lock_layout ? Py_True : Py_False,
                         S->raw_rlock_layout ? Py_True : Py_False);
}

static PyObject *
speedups_forget_states(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = module_state(module);
    FT_ADD(S->generation, 1);
    /* a forked child: the threads whose deferrals were open are gone */
#ifdef Py_GIL_DISABLED
    S->deferral_lock = (PyMutex){0}; /* as the fork left it: maybe held by a thread now gone */
#endif
    DEFERRAL_LOCK(S);
    if (S->deferrals > 0) {
        S->deferrals = 0;
        thresholds_restore(S);
        if (S->collection_was_enabled)
            PyGC_Enable();
    }
    DEFERRAL_UNLOCK(S);
    Py_RETURN_NONE;
}

static PyObject *
speedups_defer_collection(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = module_state(module);
    collection_defer(S);
    python_ahead(S); /* (Python called it: Python runs next) */
    Py_RETURN_NONE;
}

static PyObject *
speedups_resume_collection(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ModuleState *S = module_state(module);
    collection_resume(S);
    Py_RETURN_NONE;
}

static PyObject *
speedups_now_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(now_ns());
}

/* thread_frame(ident): the innermost frame of the thread ``ident``, or None. What
 * ``sys._current_frames().get(ident)`` gives, without a frame object made for every other thread:
 * a waiter's look at its lock's holder (``_switched_out.in_window``) runs on every failed try. On
 * the free-threaded build another thread's frames change under the reader: None there, and the
 * caller looks through ``sys._current_frames()``, which stops the world to read them. */
static PyObject *
speedups_thread_frame(PyObject *module, PyObject *arg)
{
#ifdef Py_GIL_DISABLED
    Py_RETURN_NONE;
#else
    unsigned long ident = PyLong_AsUnsignedLong(arg);
    if (ident == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    /* Under the interpreter lock, which every thread state's frames change under. */
    PyThreadState *ts = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
    for (; ts != NULL; ts = PyThreadState_Next(ts)) {
        if (ts->thread_id != ident)
            continue;
        PyFrameObject *f = PyThreadState_GetFrame(ts);
        if (f == NULL) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        return (PyObject *)f;
    }
    Py_RETURN_NONE;
#endif
}

static PyMethodDef speedups_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))speedups_setup, METH_VARARGS | METH_KEYWORDS,
     "The recorder's tables and the shared slow paths (from _bookkeeping)."},
    {"setup_threads", (PyCFunction)(void (*)(void))speedups_setup_threads,
     METH_VARARGS | METH_KEYWORDS,
     "A thread's registration and end in C, on the recorder's tables (from _bookkeeping)."},
    {"fold", (PyCFunction)(void (*)(void))speedups_fold, METH_FASTCALL,
     "fold(into, other): record._retired.fold's common case (True), or nothing done (False)."},
    {"setup_locks", (PyCFunction)(void (*)(void))speedups_setup_locks,
     METH_VARARGS | METH_KEYWORDS, "The lock proxies' Python paths (from _threading)."},
    {"setup_sections", (PyCFunction)(void (*)(void))speedups_setup_sections,
     METH_VARARGS | METH_KEYWORDS, "The section arrays' tables and slow path (from _sections)."},
    {"setup_handoffs", (PyCFunction)(void (*)(void))speedups_setup_handoffs,
     METH_VARARGS | METH_KEYWORDS, "The hand-off paths' table and HandoffStats maker (from _handoffs)."},
    {"took", (PyCFunction)(void (*)(void))speedups_took, METH_FASTCALL,
     "took(st, cls, left, capacity): a take (_handoffs.took)."},
    {"gave", (PyCFunction)(void (*)(void))speedups_gave, METH_FASTCALL,
     "gave(st, cls, held): a give (_handoffs.gave)."},
    {"set_thresholds", (PyCFunction)(void (*)(void))speedups_set_thresholds,
     METH_FASTCALL,
     "set_thresholds(hold_metric_ns, hold_span_ns, wait_span_ns): the hold from which a release "
     "takes the slow path, from which a hold is a span, and from which a wait is (the session's "
     "THRESHOLDS, from _bookkeeping)."},
    {"direct_slots", speedups_direct_slots, METH_NOARGS,
     "Which attributes the C path reads at their slot's offset: {'Class.attr': bool}."},
    {"raw_lock_layout", speedups_raw_lock_layout, METH_NOARGS,
     "(lock, rlock): whether a _thread.lock's and a _thread.RLock's try-acquire run without their "
     "methods (the layouts checked at import)."},
    {"forget_states", speedups_forget_states, METH_NOARGS,
     "Read every thread's WorkerState anew and close the deferrals of threads that are gone: a "
     "forked child calls it after the recorder's own after-fork routine."},
    {"defer_collection", speedups_defer_collection, METH_NOARGS,
     "Hold the cyclic collector off (nested, across threads): _collection.defer_collection."},
    {"resume_collection", speedups_resume_collection, METH_NOARGS,
     "End a deferral: the collector is on again after the last, if it was before the first."},
    {"now_ns", speedups_now_ns, METH_NOARGS,
     "The clock the C path reads (time.perf_counter_ns on Linux)."},
    {"thread_frame", speedups_thread_frame, METH_O,
     "thread_frame(ident): the thread's innermost frame, or None (on the free-threaded build, "
     "always None: read sys._current_frames() there)."},
    {NULL, NULL, 0, NULL},
};

/* -- the module's state: made by exec, visited, cleared and freed with the module ---------- */
#define STATE_OBJECTS(X)                                                                       \
    X(tls) X(context) X(context_var) X(failed) X(check_order) X(window) X(record_hold)        \
    X(waits_queue) X(waits_append) X(waits_add) X(threads) X(str_wait_histogram) X(str_begin)  \
    X(python_acquire) X(python_rlock_acquire) X(skip_frames) X(section_wait) X(handoff_stats)   \
    X(deque_type) X(deque_append) X(deque_pop) X(lock_type) X(lock_acquire) X(lock_release)   \
    X(rlock_type) X(rlock_acquire) X(rlock_release) X(false_args) X(one) X(minus_one)          \
    X(str_dunder_name) X(str_st) X(str_acquire) X(str_release) X(str_append) X(str_pop)        \
    X(str_lockwatch_class) X(str_value) X(str_lw_capacity) X(str_waiters) X(str_is_owned)     \
    X(held_entry_type) X(acquisition_type) X(release_type) X(stats_base_type) X(lock_base_type) X(rlock_base_type)                 \
    X(section_acquire_type) X(section_release_type) X(semaphore_acquire_type)                  \
    X(semaphore_release_type) X(condition_notify_type) X(creation_gate_type)                   \
    X(creation_call_type)                                                                      \
    X(outbox) X(str_accepting) X(str_started) X(str_queue) X(str_lock_hold) X(new_state)       \
    X(str_dunder_dict) X(new_stats) X(recorder) X(limits) X(thread_end_type) X(str_name)      \
    X(str_alive) X(str_other) X(retired_thread) X(nothing_held) X(no_chain) X(nothing_written) \
    X(gc_get_threshold) X(gc_set_threshold) X(saved_thresholds) X(raised_thresholds)

static int
speedups_traverse(PyObject *module, visitproc visit, void *arg)
{
    ModuleState *S = module_state(module);
    if (S == NULL)
        return 0;
#define VISIT(field) Py_VISIT(S->field);
    STATE_OBJECTS(VISIT)
#undef VISIT
#ifdef Py_GIL_DISABLED
    Py_VISIT(S->retired);
#endif
    for (int t = 0; t < TABLE_COUNT; t++)
        Py_VISIT(S->tables[t].type);
    for (int i = 0; i < REC_USED; i++)
        Py_VISIT(S->rec_names[i]);
    for (int i = 0; i < PEAK_USED; i++)
        Py_VISIT(S->peak_names[i]);
    for (int i = 0; i < LIMIT_USED; i++)
        Py_VISIT(S->limit_names[i]);
    return 0;
}

static int
speedups_clear(PyObject *module)
{
    ModuleState *S = module_state(module);
    if (S == NULL)
        return 0;
#define CLEAR(field) Py_CLEAR(S->field);
    STATE_OBJECTS(CLEAR)
#undef CLEAR
#ifdef Py_GIL_DISABLED
    Py_CLEAR(S->retired);
#endif
    for (int t = 0; t < TABLE_COUNT; t++) {
        Py_CLEAR(S->tables[t].type);
        for (int i = 0; S->tables[t].slots != NULL && i < S->tables[t].spec->used; i++) {
            Py_CLEAR(S->tables[t].slots[i].name);
            S->tables[t].slots[i].type = NULL;
        }
    }
    for (int i = 0; i < REC_USED; i++)
        Py_CLEAR(S->rec_names[i]);
    for (int i = 0; i < PEAK_USED; i++)
        Py_CLEAR(S->peak_names[i]);
    for (int i = 0; i < LIMIT_USED; i++)
        Py_CLEAR(S->limit_names[i]);
    S->ready = S->locks_ready = S->sections_ready = 0;
    return 0;
}

static void
speedups_free(void *module)
{
    ModuleState *S = module_state((PyObject *)module);
    if (S == NULL)
        return;
    speedups_clear((PyObject *)module);
    if (S->cache_key_made) {
        /* The threads still running keep their entries (no destructor runs for a deleted key):
         * the module goes at the interpreter's end. */
        pthread_key_delete(S->cache_key);
        S->cache_key_made = 0;
    }
    release_ended(S);
}

/* A type from its spec, in the module's state and the module (NULL: an error). */
static PyTypeObject *
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject *base)
{
    PyTypeObject *type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, (PyObject *)base);
    if (type == NULL || PyModule_AddType(module, type) < 0) {
        Py_XDECREF(type);
        return NULL;
    }
    return type;
}

#define INTERN(field, text)                                                                    \
    do {                                                                                       \
        if ((S->field = PyUnicode_InternFromString(text)) == NULL)                             \
            return -1;                                                                         \
    } while (0)

static int
speedups_exec(PyObject *m)
{
    ModuleState *S = module_state(m);
    S->hold_metric_ns = 100000;
    S->hold_span_ns = 10000000;
    S->generation = 1;
    Slot *slots[TABLE_COUNT] = {
        [TABLE_WORKER] = S->worker, [TABLE_STATS] = S->stats, [TABLE_HOLD] = S->hold,
        [TABLE_TRACK] = S->track,   [TABLE_ARRAY] = S->array, [TABLE_HANDOFF] = S->handoff,
    };
    for (int t = 0; t < TABLE_COUNT; t++) {
        S->tables[t].spec = &TABLE_SPECS[t];
        S->tables[t].slots = slots[t];
    }
    INTERN(str_st, "st");
    INTERN(str_dunder_name, "__name__");
    INTERN(str_acquire, "acquire");
    INTERN(str_release, "release");
    INTERN(str_append, "append");
    INTERN(str_pop, "pop");
    INTERN(str_lockwatch_class, "_lockwatch_class");
    INTERN(str_value, "_value");
    INTERN(str_lw_capacity, "_lw_capacity");
    INTERN(str_waiters, "_waiters");
    INTERN(str_is_owned, "_is_owned");
    INTERN(str_accepting, "accepting");
    INTERN(str_started, "started");
    INTERN(str_queue, "queue");
    INTERN(str_lock_hold, "lock.hold");
    INTERN(str_dunder_dict, "__dict__");
    INTERN(str_wait_histogram, "wait_histogram");
    INTERN(str_begin, "begin");
    INTERN(str_name, "name");
    INTERN(str_alive, "alive");
    INTERN(str_other, "(other)");
    struct {
        PyObject **names;
        const char *const *text;
        int n;
    } tables[] = {{S->rec_names, RECORDER_NAMES, REC_USED},
                  {S->peak_names, PEAK_NAMES, PEAK_USED},
                  {S->limit_names, LIMIT_NAMES, LIMIT_USED}};
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (int i = 0; i < tables[t].n; i++)
            if ((tables[t].names[i] = PyUnicode_InternFromString(tables[t].text[i])) == NULL)
                return -1;
    if (pthread_key_create(&S->cache_key, cache_thread_ended) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "otel_lockwatch: no thread-local key");
        return -1;
    }
    S->cache_key_made = 1;
    S->one = PyLong_FromLong(1);
    S->minus_one = PyLong_FromLong(-1);
    if (S->one == NULL || S->minus_one == NULL)
        return -1;
#ifdef SCHEDULED_COLLECTIONS_IGNORE_DISABLE
    PyObject *gc = PyImport_ImportModule("gc");
    if (gc == NULL)
        return -1;
    S->gc_get_threshold = PyObject_GetAttrString(gc, "get_threshold");
    S->gc_set_threshold = PyObject_GetAttrString(gc, "set_threshold");
    Py_DECREF(gc);
    S->raised_thresholds = Py_BuildValue("(iii)", INT_MAX, INT_MAX, INT_MAX);
    if (S->gc_get_threshold == NULL || S->gc_set_threshold == NULL || S->raised_thresholds == NULL)
        return -1;
#endif
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return -1;
    S->lock_type = PyObject_GetAttrString(thread, "LockType");
    S->rlock_type = PyObject_GetAttrString(thread, "RLock");
    Py_DECREF(thread);
    if (S->lock_type == NULL || S->rlock_type == NULL)
        return -1;
    S->lock_acquire = PyObject_GetAttr(S->lock_type, S->str_acquire);
    S->lock_release = PyObject_GetAttr(S->lock_type, S->str_release);
    S->rlock_acquire = PyObject_GetAttr(S->rlock_type, S->str_acquire);
    S->rlock_release = PyObject_GetAttr(S->rlock_type, S->str_release);
    if (S->lock_acquire == NULL || S->lock_release == NULL || S->rlock_acquire == NULL ||
        S->rlock_release == NULL)
        return -1;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return -1;
    S->deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (S->deque_type == NULL ||
        (S->deque_append = PyObject_GetAttr(S->deque_type, S->str_append)) == NULL ||
        (S->deque_pop = PyObject_GetAttr(S->deque_type, S->str_pop)) == NULL)
        return -1;
    int with_keywords = METH_VARARGS | METH_KEYWORDS;
    S->lock_acquire_fn = (PyCFunctionWithKeywords)c_function(S->lock_acquire, with_keywords);
    S->rlock_acquire_fn = (PyCFunctionWithKeywords)c_function(S->rlock_acquire, with_keywords);
    S->lock_release_fn = c_function(S->lock_release, METH_NOARGS);
    S->rlock_release_fn = c_function(S->rlock_release, METH_NOARGS);
    S->false_args = PyTuple_Pack(1, Py_False);
    if (S->false_args == NULL)
        return -1;
    check_lock_layout(S);
    check_rlock_layout(S);
    S->held_entry_type = PyStructSequence_NewType((PyStructSequence_Desc *)&held_entry_desc);
    S->acquisition_type = PyStructSequence_NewType((PyStructSequence_Desc *)&acquisition_desc);
    S->release_type = PyStructSequence_NewType((PyStructSequence_Desc *)&release_desc);
    if (S->held_entry_type == NULL || S->acquisition_type == NULL || S->release_type == NULL ||
        PyModule_AddObjectRef(m, "HeldEntry", (PyObject *)S->held_entry_type) < 0 ||
        PyModule_AddObjectRef(m, "Acquisition", (PyObject *)S->acquisition_type) < 0 ||
        PyModule_AddObjectRef(m, "Release", (PyObject *)S->release_type) < 0)
        return -1;
    if ((S->lock_base_type = add_type(m, &LockBase_spec, NULL)) == NULL ||
        (S->rlock_base_type = add_type(m, &RLockBase_spec, S->lock_base_type)) == NULL ||
        (S->stats_base_type = add_type(m, &StatsBase_spec, NULL)) == NULL ||
        (S->section_acquire_type = add_type(m, &SectionAcquire_spec, NULL)) == NULL ||
        (S->section_release_type = add_type(m, &SectionRelease_spec, NULL)) == NULL ||
        (S->semaphore_acquire_type = add_type(m, &SemaphoreAcquire_spec, NULL)) == NULL ||
        (S->semaphore_release_type = add_type(m, &SemaphoreRelease_spec, NULL)) == NULL ||
        (S->condition_notify_type = add_type(m, &ConditionNotify_spec, NULL)) == NULL ||
        (S->creation_gate_type = add_type(m, &CreationGate_spec, NULL)) == NULL ||
        (S->creation_call_type = add_type(m, &CreationCall_spec, NULL)) == NULL ||
        (S->thread_end_type = add_type(m, &ThreadEnd_spec, NULL)) == NULL)
        return -1;
    /* The Stats fields StatsBase owns, by name (_fast_path gives its class the others). */
    PyObject *owned = PyTuple_New(STATS_USED);
    for (int i = 0; owned != NULL && i < STATS_USED; i++) {
        PyObject *name = PyUnicode_FromString(STATS_NAMES[i]);
        if (name == NULL)
            Py_CLEAR(owned);
        else
            PyTuple_SET_ITEM(owned, i, name);
    }
    if (owned == NULL || PyModule_AddObject(m, "STATS_OWNED", owned) < 0) {
        Py_XDECREF(owned);
        return -1;
    }
    PyObject *no_sample = PyLong_FromLongLong(NO_SAMPLE);
    int added = PyModule_AddObjectRef(m, "NO_SAMPLE", no_sample);
    Py_XDECREF(no_sample);
    if (added < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, speedups_exec},
#ifdef Py_GIL_DISABLED
    /* Safe without the GIL (the header says how): importing it leaves the GIL off. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "otel_lockwatch.capture._speedups",
    .m_doc = "The uncontended lock path of otel_lockwatch, in C (see _fast_path.py).",
    .m_size = sizeof(ModuleState),
    .m_methods = speedups_methods,
    .m_slots = speedups_slots,
    .m_traverse = speedups_traverse,
    .m_clear = speedups_clear,
    .m_free = speedups_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
