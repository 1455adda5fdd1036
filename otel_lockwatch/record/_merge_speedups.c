/*
 * otel_lockwatch.record._merge_speedups: the C fast path of reading data parts back and merging
 * them (``otel-lockwatch merge`` of thousands of manifests).
 *
 * Loops that Python runs a bytecode at a time. Each but compact() has its pure-Python reference
 * beside the code that calls it, which runs when this module is absent; without compact(), a
 * manifest is read the long way (manifest._io.compact_sealed):
 *
 * - compact(text, max_depth): a JSON text without its whitespace, vetted on the way: every
 *   object's keys strictly ascending in byte order, none with an escape, no nesting deeper
 *   than max_depth, no run of 19 digits outside strings (every integer below 10**18), and no
 *   whitespace between two bytes of literals (dropping it would join two tokens), and (given
 *   max_cost) its cost() at most max_cost. For
 *   a text json.loads accepts, that makes the keys of each object distinct strings (distinct
 *   UTF-8 bytes without escapes decode to distinct strings), so the parser needs no
 *   duplicate-key hook, the document no nesting walk and no integer a range check. A manifest as this library
 *   writes it (sorted keys, indented) compacts to its canonical JSON, the digest's input. None
 *   when the text is not so (the caller then reads it the long way, which names the fault);
 *   nothing here judges whether the text is JSON: the parser does.
 * - cost(text): what parsing the text may build at most, in bytes, estimated from its
 *   punctuation (manifest._io.COSTS: a weight per byte of `{ [ , : "`, wherever it is);
 *   refused past a multiple of the text's size before it is parsed.
 * - same_json(built, parsed): whether an evaluated document and a parsed one have the same
 *   canonical JSON (manifest._check's comparison of a manifest with what its data gives; its
 *   reference there compares their digests).
 * - bucket_counts(buckets, limit): a histogram's JSON buckets [[index, count], ...] as
 *   {index: count} when every pair is a list of two ints, the indices strictly ascending within
 *   [0, limit) and every count > 0; None when one is not (record._histogram.checked_buckets).
 * - histogram_parts(obj, sub_bits, limit): a histogram's JSON form as (counts, count, sum, min,
 *   max) when LogHistogram.from_json would take it and every number of it is below 2**63; None
 *   otherwise (from_json then checks it, and names what is wrong).
 * - add_counts(into, other): into[k] = into.get(k, 0) + v for every (k, v) of the dict other
 *   (LogHistogram.merge's loop).
 * - worker_rows(per_worker, fields): a lock's {worker: {field: count}} as {worker: (count, ...)}
 *   when every count is an int in [0, 2**63) (manifest._data.lock_workers's common case).
 * - add_rows(into, other): the rows of other added into into, element by element
 *   (record._data._merge_lock's loop over a lock's workers).
 *
 * Nothing here keeps state between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* The deepest nesting compact() follows; a larger max_depth is taken as this. */
#define MAX_LEVELS 64
/* A run of this many digits outside strings is refused: without one, every integer of the text
 * is below 10**18 < 2**63, and the parser's own int() is safe and in range. */
#define MAX_DIGITS 19

/* What the parser may build for one byte of punctuation, counted wherever it appears (in strings
 * too): manifest._io.COSTS, the same numbers (a test compares the two). */
static long long cost_of[256];

static void
init_costs(void)
{
    cost_of['{'] = 160;
    cost_of['['] = 64;
    cost_of[','] = 16;
    cost_of[':'] = 16;
    cost_of['"'] = 25;
}

static long long
cost_of_bytes(const unsigned char *s, Py_ssize_t n)
{
    long long cost = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        cost += cost_of[s[k]];
    return cost;
}

static PyObject *
cost(PyObject *module, PyObject *text)
{
    Py_buffer view;
    if (PyObject_GetBuffer(text, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    long long total = cost_of_bytes((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(total);
}

/* A byte of a literal (a number, true, false, null) or of no JSON token: not punctuation, not
 * a quote (whitespace never reaches it). */
static inline int
is_literal(unsigned char c)
{
    return !(c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == ':' || c == '"');
}

typedef struct {
    int is_object;
    int expect_key;
    const unsigned char *key; /* the previous key of this object, NULL before the first */
    Py_ssize_t key_len;
} Level;

static PyObject *
compact(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "compact(text, max_depth[, max_cost]) takes 2 or 3 "
                                         "arguments");
        return NULL;
    }
    long max_depth = PyLong_AsLong(args[1]);
    if (max_depth == -1 && PyErr_Occurred())
        return NULL;
    long long max_cost = LLONG_MAX, spent = 0;
    if (nargs == 3) {
        max_cost = PyLong_AsLongLong(args[2]);
        if (max_cost == -1 && PyErr_Occurred())
            return NULL;
    }
    if (max_depth > MAX_LEVELS)
        max_depth = MAX_LEVELS;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *s = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, i = 0, j = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Level levels[MAX_LEVELS + 1];
    int depth = 0, digits = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= '0' && c <= '9') {
            if (++digits >= MAX_DIGITS)
                goto refused;
        }
        else {
            digits = 0;
        }
        spent += cost_of[c];
        switch (c) {
        case ' ':
        case '\n':
        case '\r':
        case '\t':
            i++;
            while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
                i++;
            /* Whitespace between two bytes of literals is a separator (`1 2`, `t rue`, a digit
             * run cut by a space): dropped, it would join them into one token the parser takes. */
            if (j > 0 && i < n && is_literal(o[j - 1]) && is_literal(s[i]))
                goto refused;
            continue;
        case '{':
        case '[':
            if (depth >= max_depth)
                goto refused;
            depth++;
            levels[depth].is_object = levels[depth].expect_key = (c == '{');
            levels[depth].key = NULL;
            levels[depth].key_len = 0;
            break;
        case '}':
        case ']':
            if (depth == 0)
                goto refused;
            depth--;
            break;
        case ',':
            if (depth > 0 && levels[depth].is_object)
                levels[depth].expect_key = 1;
            break;
        case '"': {
            Py_ssize_t start = i++;
            int escaped = 0;
            const unsigned char *quote = memchr(s + i, '"', (size_t)(n - i));
            if (quote != NULL && memchr(s + i, '\\', (size_t)(quote - (s + i))) == NULL) {
                i = quote - s; /* no escape: the string ends at the next quote */
            }
            else {
                while (i < n && s[i] != '"') {
                    if (s[i] == '\\') {
                        escaped = 1;
                        i += 2;
                    }
                    else {
                        i++;
                    }
                }
                if (i >= n)
                    goto refused; /* an unterminated string */
            }
            i++;
            spent += cost_of_bytes(s + start + 1, i - start - 1); /* the closing quote's too */
            if (depth > 0 && levels[depth].expect_key) {
                Level *lv = &levels[depth];
                const unsigned char *key = s + start + 1;
                Py_ssize_t len = i - start - 2;
                if (escaped)
                    goto refused;
                if (lv->key != NULL) {
                    Py_ssize_t common = len < lv->key_len ? len : lv->key_len;
                    int cmp = memcmp(lv->key, key, (size_t)common);
                    if (cmp > 0 || (cmp == 0 && lv->key_len >= len))
                        goto refused; /* not strictly ascending: maybe a duplicate */
                }
                lv->key = key;
                lv->key_len = len;
                lv->expect_key = 0;
            }
            memcpy(o + j, s + start, (size_t)(i - start));
            j += i - start;
            continue;
        }
        default:
            break;
        }
        o[j++] = c;
        i++;
    }
    PyBuffer_Release(&view);
    if (spent > max_cost) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&out, j) < 0)
        return NULL;
    return out;
refused:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyObject *
bucket_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "bucket_counts(buckets, limit) takes 2 arguments");
        return NULL;
    }
    PyObject *buckets = args[0];
    long long limit = PyLong_AsLongLong(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(buckets))
        Py_RETURN_NONE;
    PyObject *counts = PyDict_New();
    if (counts == NULL)
        return NULL;
    long long previous = -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(buckets); k++) {
        PyObject *pair = PyList_GET_ITEM(buckets, k);
        if (!PyList_CheckExact(pair) || PyList_GET_SIZE(pair) != 2)
            goto refused;
        PyObject *index = PyList_GET_ITEM(pair, 0), *count = PyList_GET_ITEM(pair, 1);
        if (!PyLong_CheckExact(index) || !PyLong_CheckExact(count))
            goto refused; /* a bool, a float or a str */
        int overflow;
        long long i = PyLong_AsLongLongAndOverflow(index, &overflow);
        if (overflow || i <= previous || i >= limit)
            goto refused;
        long long c = PyLong_AsLongLongAndOverflow(count, &overflow);
        if (overflow < 0 || (!overflow && c <= 0))
            goto refused; /* (a count past 2**63 is left to the histogram's own checks) */
        if (PyDict_SetItem(counts, index, count) < 0) {
            Py_DECREF(counts);
            return NULL;
        }
        previous = i;
    }
    return counts;
refused:
    Py_DECREF(counts);
    Py_RETURN_NONE;
}

/* A non-negative exact int below 2**63 into *out; 0 when it is not one. */
static int
count_of(PyObject *v, long long *out)
{
    int overflow;
    if (!PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && *out >= 0;
}

/* record._histogram.bucket_of for a value below 2**63. */
static long long
bucket_of(long long v, int sub_bits)
{
    int bits = 0;
    for (unsigned long long u = (unsigned long long)v; u; u >>= 1)
        bits++;
    int kept = sub_bits + 1;
    if (bits <= kept)
        return v;
    int shift = bits - kept;
    return ((long long)shift << sub_bits) + (v >> shift);
}

static PyObject *
histogram_parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[] = {"sub_bits", "buckets", "count", "sum", "min", "max"};
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "histogram_parts(obj, sub_bits, limit) takes 3 arguments");
        return NULL;
    }
    long sub_bits = PyLong_AsLong(args[1]);
    if (sub_bits == -1 && PyErr_Occurred())
        return NULL;
    if (!PyDict_CheckExact(args[0]))
        Py_RETURN_NONE;
    PyObject *fields[6];
    for (int k = 0; k < 6; k++) {
        fields[k] = PyDict_GetItemString(args[0], names[k]); /* borrowed */
        if (fields[k] == NULL)
            Py_RETURN_NONE;
    }
    long long sb, count, sum, min, max;
    if (!count_of(fields[0], &sb) || sb != sub_bits || !count_of(fields[2], &count) ||
        !count_of(fields[3], &sum) || !count_of(fields[4], &min) || !count_of(fields[5], &max))
        Py_RETURN_NONE;
    PyObject *pair_args[2] = {fields[1], args[2]};
    PyObject *counts = bucket_counts(module, pair_args, 2);
    if (counts == NULL || counts == Py_None)
        return counts;
    /* The buckets' total is the count; min and max fall in the first and last buckets; the sum
     * is possible for count samples in [min, max]. */
    long long total = 0, first = -1, last = -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(counts, &pos, &key, &value)) {
        long long c, i;
        if (!count_of(value, &c) || !count_of(key, &i) || __builtin_add_overflow(total, c, &total))
            goto refused;
        if (first < 0)
            first = i;
        last = i;
    }
    if (total != count)
        goto refused;
    if (count) {
        __int128 lo = (__int128)min * count, hi = (__int128)max * count;
        if (bucket_of(min, (int)sub_bits) != first || bucket_of(max, (int)sub_bits) != last ||
            !(lo <= sum && sum <= hi))
            goto refused;
    }
    else if (sum || min || max) {
        goto refused;
    }
    return Py_BuildValue("(NLLLL)", counts, count, sum, min, max);
refused:
    Py_DECREF(counts);
    Py_RETURN_NONE;
}

/* Add every value of the dict other into the dict into under its key (a new key takes the value
 * itself), summing two values with add: the one loop of add_counts and add_rows. */
static PyObject *
add_into(PyObject *const *args, Py_ssize_t nargs, const char *usage,
         PyObject *(*add)(PyObject *, PyObject *))
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    PyObject *into = args[0], *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(args[1], &pos, &key, &value)) {
        PyObject *mine = PyDict_GetItemWithError(into, key); /* borrowed */
        if (mine == NULL) {
            if (PyErr_Occurred() || PyDict_SetItem(into, key, value) < 0)
                return NULL;
            continue;
        }
        PyObject *sum = add(mine, value);
        if (sum == NULL)
            return NULL;
        int failed = PyDict_SetItem(into, key, sum);
        Py_DECREF(sum);
        if (failed < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
add_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return add_into(args, nargs, "add_counts(into, other) takes two dicts", PyNumber_Add);
}

static PyObject *
worker_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "worker_rows(per_worker, fields) takes a dict and a tuple");
        return NULL;
    }
    PyObject *per_worker = args[0], *fields = args[1], *name, *entry;
    Py_ssize_t width = PyTuple_GET_SIZE(fields), pos = 0;
    if (!PyDict_CheckExact(per_worker))
        Py_RETURN_NONE;
    PyObject *rows = PyDict_New();
    if (rows == NULL)
        return NULL;
    while (PyDict_Next(per_worker, &pos, &name, &entry)) {
        if (!PyUnicode_CheckExact(name) || !PyDict_CheckExact(entry))
            goto refused;
        PyObject *row = PyTuple_New(width);
        if (row == NULL)
            goto failed;
        for (Py_ssize_t k = 0; k < width; k++) {
            PyObject *value = PyDict_GetItemWithError(entry, PyTuple_GET_ITEM(fields, k));
            long long n;
            if (value == NULL || !count_of(value, &n)) {
                Py_DECREF(row);
                if (PyErr_Occurred())
                    goto failed;
                goto refused;
            }
            Py_INCREF(value);
            PyTuple_SET_ITEM(row, k, value);
        }
        int failed = PyDict_SetItem(rows, name, row);
        Py_DECREF(row);
        if (failed < 0)
            goto failed;
    }
    return rows;
refused:
    Py_DECREF(rows);
    Py_RETURN_NONE;
failed:
    Py_DECREF(rows);
    return NULL;
}

/* Two rows (tuples of one length) added element by element, as a new tuple. */
static PyObject *
row_sum(PyObject *mine, PyObject *row)
{
    if (!PyTuple_CheckExact(mine) || !PyTuple_CheckExact(row) ||
        PyTuple_GET_SIZE(mine) != PyTuple_GET_SIZE(row)) {
        PyErr_SetString(PyExc_TypeError, "add_rows adds tuples of one length");
        return NULL;
    }
    Py_ssize_t width = PyTuple_GET_SIZE(row);
    PyObject *sum = PyTuple_New(width);
    if (sum == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < width; k++) {
        PyObject *v = PyNumber_Add(PyTuple_GET_ITEM(mine, k), PyTuple_GET_ITEM(row, k));
        if (v == NULL) {
            Py_DECREF(sum);
            return NULL;
        }
        PyTuple_SET_ITEM(sum, k, v);
    }
    return sum;
}

static PyObject *
add_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return add_into(args, nargs, "add_rows(into, other) takes two dicts", row_sum);
}

/* The JSON kind of a value: what its canonical JSON is written as (a str enum as a string, a
 * tuple as an array); OTHER for a value that has a to_json() (a histogram, a worker table). */
enum { K_NULL, K_BOOL, K_INT, K_FLOAT, K_STR, K_ARRAY, K_OBJECT, K_OTHER };

static int
kind_of(PyObject *v)
{
    if (v == Py_None)
        return K_NULL;
    if (PyBool_Check(v))
        return K_BOOL;
    if (PyLong_Check(v))
        return K_INT;
    if (PyFloat_Check(v))
        return K_FLOAT;
    if (PyUnicode_Check(v))
        return K_STR;
    if (PyList_Check(v) || PyTuple_Check(v))
        return K_ARRAY;
    if (PyDict_Check(v))
        return K_OBJECT;
    return K_OTHER;
}

/* 1 when a (a document as evaluate() builds it) and b (one parsed from JSON) have the same
 * canonical JSON, 0 when not, -1 on an error. */
static int
same(PyObject *a, PyObject *b, int depth)
{
    if (depth > MAX_LEVELS * 2) {
        PyErr_SetString(PyExc_RecursionError, "same_json: too deep");
        return -1;
    }
    int ka = kind_of(a);
    if (ka == K_OTHER) { /* its JSON form, then compared as JSON */
        PyObject *json = PyObject_CallMethod(a, "to_json", NULL);
        if (json == NULL)
            return -1;
        int result = kind_of(json) == K_OTHER ? 0 : same(json, b, depth + 1);
        Py_DECREF(json);
        return result;
    }
    if (ka != kind_of(b))
        return 0;
    switch (ka) {
    case K_NULL:
        return 1;
    case K_BOOL:
        return a == b;
    case K_INT:
    case K_STR:
        return PyObject_RichCompareBool(a, b, Py_EQ);
    case K_FLOAT: {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return x == y && signbit(x) == signbit(y); /* -0.0 is written "-0.0" */
    }
    case K_ARRAY: {
        PyObject *fa = PySequence_Fast(a, ""), *fb = PySequence_Fast(b, "");
        int result = -1;
        if (fa != NULL && fb != NULL) {
            Py_ssize_t n = PySequence_Fast_GET_SIZE(fa);
            result = n == PySequence_Fast_GET_SIZE(fb);
            for (Py_ssize_t k = 0; result == 1 && k < n; k++)
                result = same(PySequence_Fast_GET_ITEM(fa, k), PySequence_Fast_GET_ITEM(fb, k),
                              depth + 1);
        }
        Py_XDECREF(fa);
        Py_XDECREF(fb);
        return result;
    }
    default: { /* K_OBJECT */
        if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
            return 0;
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(a, &pos, &key, &value)) {
            if (!PyUnicode_Check(key))
                return 0;
            PyObject *other = PyDict_GetItemWithError(b, key); /* borrowed */
            if (other == NULL)
                return PyErr_Occurred() ? -1 : 0;
            int result = same(value, other, depth + 1);
            if (result != 1)
                return result;
        }
        return 1;
    }
    }
}

static PyObject *
same_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "same_json(built, parsed) takes 2 arguments");
        return NULL;
    }
    int result = same(args[0], args[1], 0);
    if (result < 0)
        return NULL;
    return PyBool_FromLong(result);
}

static PyMethodDef methods[] = {
    {"same_json", (PyCFunction)(void (*)(void))same_json, METH_FASTCALL,
     "same_json(built, parsed) -> bool: whether a document as evaluate() builds it (its "
     "histograms and worker tables as objects with a to_json()) and one parsed from JSON have "
     "the same canonical JSON: kinds exact (1, 1.0 and true differ), floats bit for bit."},
    {"worker_rows", (PyCFunction)(void (*)(void))worker_rows, METH_FASTCALL,
     "worker_rows(per_worker, fields) -> dict | None: {name: {field: count, ...}} as {name: "
     "(count, ...)} in the order of fields, when every name is a str and every count an int in "
     "[0, 2**63)."},
    {"add_rows", (PyCFunction)(void (*)(void))add_rows, METH_FASTCALL,
     "add_rows(into, other): add the rows (tuples) of the dict other into the dict into, "
     "element by element."},
    {"compact", (PyCFunction)(void (*)(void))compact, METH_FASTCALL,
     "compact(text, max_depth[, max_cost]) -> bytes | None: the JSON text without whitespace, "
     "when every object's keys ascend strictly without escapes, it nests at most max_depth deep "
     "and its cost() is at most max_cost."},
    {"cost", (PyCFunction)cost, METH_O,
     "cost(text) -> int: what parsing the text may build at most, estimated from its "
     "punctuation (manifest._io.COSTS)."},
    {"bucket_counts", (PyCFunction)(void (*)(void))bucket_counts, METH_FASTCALL,
     "bucket_counts(buckets, limit) -> dict | None: [[index, count], ...] as {index: count} "
     "when well formed."},
    {"histogram_parts", (PyCFunction)(void (*)(void))histogram_parts, METH_FASTCALL,
     "histogram_parts(obj, sub_bits, limit) -> (counts, count, sum, min, max) | None: a "
     "histogram's JSON form when it is consistent and every number is below 2**63."},
    {"add_counts", (PyCFunction)(void (*)(void))add_counts, METH_FASTCALL,
     "add_counts(into, other): add the counts of the dict other into the dict into."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef merge_speedups_module = {
    PyModuleDef_HEAD_INIT,
    "otel_lockwatch.record._merge_speedups",
    "The C fast path of reading data parts back and merging them.",
    0,
    methods,
};

PyMODINIT_FUNC
PyInit__merge_speedups(void)
{
    init_costs();
    return PyModule_Create(&merge_speedups_module);
}
