"""The merge's C fast path (``record._merge_speedups``) against its references: the compacting
against ``json.dumps`` and a parse, the bucket functions against their pure-Python code; and the
manifest reader's use of it (the digest checked on the bytes), which must refuse what the long
way refuses."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest import _check, _io
from otel_lockwatch.manifest._check import MAX_DEPTH
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import compact_sealed, load_mergeable
from otel_lockwatch.record import _histogram
from otel_lockwatch.record._histogram import MAX_BUCKETS, MERGE_SPEEDUPS, LogHistogram

pytestmark = pytest.mark.skipif(
    MERGE_SPEEDUPS is None, reason="the merge's C fast path is not built"
)

# JSON documents whose strings are anything (quotes, backslashes, whitespace, non-ASCII).
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63) + 1, 2**63 - 1), st.text(max_size=12)
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def depth(doc: object) -> int:
    if isinstance(doc, dict):
        return 1 + max(map(depth, doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max(map(depth, doc), default=0)
    return 0


def has_escaped_key(doc: object) -> bool:
    """Whether a key of ``doc`` is written with an escape (a quote, backslash or control)."""
    if isinstance(doc, dict):
        return any(
            json.dumps(k, ensure_ascii=False) != f'"{k}"' or has_escaped_key(v)
            for k, v in doc.items()
        )
    return isinstance(doc, list) and any(map(has_escaped_key, doc))


def has_long_integer(doc: object) -> bool:
    """Whether ``doc`` holds an integer of 19 digits or more (the parser's range check's)."""
    if isinstance(doc, dict):
        return any(map(has_long_integer, doc.values()))
    if isinstance(doc, list):
        return any(map(has_long_integer, doc))
    return type(doc) is int and abs(doc) >= 10**18


@given(documents)
@example([10**18, {"k": -(10**18)}])
@example({"a\\b": 1})
def test_compact_is_the_canonical_json_of_an_indented_sorted_document(doc):
    """The text this library writes compacts to the canonical JSON, unless a key needs an
    escape or an integer has 19 digits (then None: the long way reads it)."""
    text = json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False).encode()
    got = MERGE_SPEEDUPS.compact(text, MAX_DEPTH)
    if has_escaped_key(doc) or has_long_integer(doc):
        assert got is None
    else:
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert got == canonical.encode()
        assert json.loads(got) == doc


@given(st.dictionaries(st.text(max_size=4), st.integers(), min_size=2, max_size=6))
def test_compact_refuses_keys_out_of_order(doc):
    """Keys not strictly ascending in byte order are refused (a duplicate among them)."""
    keys = sorted(doc, key=lambda k: k.encode())
    if any(json.dumps(k, ensure_ascii=False) != f'"{k}"' for k in keys):
        return
    members = [f'"{k}": {doc[k]}' for k in reversed(keys)]
    assert MERGE_SPEEDUPS.compact(("{" + ", ".join(members) + "}").encode(), 8) is None
    duplicated = [f'"{keys[0]}": 1', f'"{keys[0]}": 2']
    assert MERGE_SPEEDUPS.compact(("{" + ", ".join(duplicated) + "}").encode(), 8) is None


def test_compact_refuses_escaped_keys_deep_nesting_and_broken_text():
    """A key with an escape ("a" and "\\u0061" are one key), nesting past the limit, an
    unterminated string or a stray closing bracket: None."""
    assert MERGE_SPEEDUPS.compact(b'{"\\u0061": 1, "b": 2}', 8) is None
    assert MERGE_SPEEDUPS.compact(b'{"a": 1, "\\u0061": 2}', 8) is None
    assert MERGE_SPEEDUPS.compact(b"[" * 9 + b"]" * 9, 8) is None
    assert MERGE_SPEEDUPS.compact(b"[" * 8 + b"]" * 8, 8) == b"[" * 8 + b"]" * 8
    assert MERGE_SPEEDUPS.compact(b'{"a": "open', 8) is None
    assert MERGE_SPEEDUPS.compact(b'{"a": "\\', 8) is None
    assert MERGE_SPEEDUPS.compact(b"[]]", 8) is None
    # Values are never keys: strings in arrays and as values may repeat and be in any order.
    assert MERGE_SPEEDUPS.compact(b'{"a": ["z", "z"], "b": {"y": " x "}}', 8) == (
        b'{"a":["z","z"],"b":{"y":" x "}}'
    )


pairs = st.lists(
    st.one_of(
        st.tuples(st.integers(-3, MAX_BUCKETS + 3), st.integers(-2, 2**64)).map(list),
        st.sampled_from([[1], [1, 2, 3], (1, 2), [True, 1], [1, 1.0], ["1", 1], None]),
    ),
    max_size=8,
)


@given(pairs)
def test_bucket_counts_agrees_with_its_reference(buckets):
    """The C check of a histogram's buckets gives what the pure-Python one gives."""
    got = MERGE_SPEEDUPS.bucket_counts(buckets, MAX_BUCKETS)
    saved, _histogram.MERGE_SPEEDUPS = _histogram.MERGE_SPEEDUPS, None
    try:
        expected = _histogram.checked_buckets(buckets)
    finally:
        _histogram.MERGE_SPEEDUPS = saved
    assert got == expected
    assert got is None or list(got) == [pair[0] for pair in buckets]


def test_bucket_counts_of_ascending_pairs():
    """Sorted, in range, positive: taken; a repeat, a zero count or a bool: not."""
    assert MERGE_SPEEDUPS.bucket_counts([[0, 1], [975, 2**70]], MAX_BUCKETS) == {0: 1, 975: 2**70}
    assert MERGE_SPEEDUPS.bucket_counts([[3, 1], [3, 1]], MAX_BUCKETS) is None
    assert MERGE_SPEEDUPS.bucket_counts([[3, 0]], MAX_BUCKETS) is None
    assert MERGE_SPEEDUPS.bucket_counts([[True, 1]], MAX_BUCKETS) is None
    assert MERGE_SPEEDUPS.bucket_counts([[976, 1]], MAX_BUCKETS) is None
    assert MERGE_SPEEDUPS.bucket_counts("[[1, 1]]", MAX_BUCKETS) is None


@given(
    st.dictionaries(st.integers(0, 975), st.integers(1, 2**70)),
    st.dictionaries(st.integers(0, 975), st.integers(1, 2**70)),
)
def test_add_counts_is_the_merge_loop(into, other):
    expected = dict(into)
    for k, v in other.items():
        expected[k] = expected.get(k, 0) + v
    MERGE_SPEEDUPS.add_counts(into, other)
    assert into == expected


@given(st.lists(st.integers(0, 2**40), max_size=50), st.lists(st.integers(0, 2**40), max_size=50))
def test_histogram_merge_on_both_paths(a, b):
    fast = LogHistogram(a).merge(LogHistogram(b))
    saved, _histogram.MERGE_SPEEDUPS = _histogram.MERGE_SPEEDUPS, None
    try:
        slow = LogHistogram(a).merge(LogHistogram(b))
    finally:
        _histogram.MERGE_SPEEDUPS = saved
    assert fast.to_json() == slow.to_json() == LogHistogram(a + b).to_json()


# --------------------------------------------------------------------------------------------
# The manifest reader


def manifest_text() -> str:
    waits = [0, 5_000, 70_000, 1_200_000]
    data = {
        "locks": {
            "app/db.py:10": {
                "kind": "threading.Lock",
                "acquisitions": 4,
                "contentions": 3,
                "skipped": 0,
                "timeouts": 0,
                "wait_ns": LogHistogram(waits),
                "hold_ns": LogHistogram([9_000, 9_500, 12_000, 40_000]),
                "workers": {
                    "w0": {
                        "acquisitions": 4,
                        "contentions": 3,
                        "wait_ns": 1_275_000,
                        "hold_ns": 70_500,
                    }
                },
            }
        },
        "workers": {"w0": {"observed_ns": 10**9, "wait_ns": 1_275_000}},
        "process": {"pid": 7, "service.name": 'svc: a "quoted"  name'},
    }
    return evaluate(data).to_json()


@pytest.fixture
def long_way_counted(monkeypatch):
    """How many times the digest is computed again from a parsed document."""
    calls = []
    real = _check.compute_digest

    def counted(doc):
        calls.append(1)
        return real(doc)

    monkeypatch.setattr(_check, "compute_digest", counted)
    return calls


def test_a_written_manifest_is_read_by_its_bytes(tmp_path, long_way_counted):
    """The file this library writes: its digest is checked on its bytes, and what is read is
    what the long way reads."""
    path = tmp_path / "m.json"
    path.write_text(manifest_text())
    assert compact_sealed(path.read_bytes(), "manifest_digest") is not None
    fast = load_mergeable(path)
    assert long_way_counted == []
    saved, _io.MERGE_SPEEDUPS = _io.MERGE_SPEEDUPS, None
    try:
        slow = load_mergeable(path)
    finally:
        _io.MERGE_SPEEDUPS = saved
    assert long_way_counted == [1]
    assert fast == slow


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('"acquisitions": 4', '"acquisitions": 5', 1), "was edited"),
        (lambda t: t.replace('"pid": 7', '"pid": 7, "pid": 8', 1), "has a duplicate key 'pid'"),
        (lambda t: t.replace('"pid": 7', '"pid": 70', 1), "was edited"),
        (lambda t: t.replace('"quoted\\"  name', '"quoted\\" name', 1), "was edited"),
    ],
    ids=["a count", "a duplicate key", "the pid", "a space inside a string"],
)
def test_an_edited_manifest_is_refused_as_the_long_way_refuses_it(tmp_path, edit, message):
    path = tmp_path / "m.json"
    text = manifest_text()
    path.write_text(edit(text))
    assert edit(text) != text
    with pytest.raises(ManifestError, match=rf"^manifest {re.escape(str(path))} {message}"):
        load_mergeable(path)


def test_a_manifest_reindented_still_reads(tmp_path, long_way_counted):
    """Whitespace between tokens is not content: a manifest indented otherwise is the same."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(json.loads(manifest_text()), sort_keys=True, indent=7))
    load_mergeable(path)
    assert long_way_counted == []


def python_from_json(obj):
    saved, _histogram.MERGE_SPEEDUPS = _histogram.MERGE_SPEEDUPS, None
    try:
        return LogHistogram.from_json(obj)
    finally:
        _histogram.MERGE_SPEEDUPS = saved


def perturbed(draw_key, draw_value, obj):
    obj = dict(obj)
    obj[draw_key] = draw_value
    return obj


histogram_json = st.lists(st.integers(0, 2**62), max_size=30).map(
    lambda values: LogHistogram(values).to_json()
)
perturbations = st.tuples(
    st.sampled_from(["sub_bits", "buckets", "count", "sum", "min", "max"]),
    st.one_of(
        st.integers(-2, 2**64),
        st.sampled_from([True, 4.0, "4", None, [], [[0, 1]], [[5, 1], [3, 1]], [[32, 2]]]),
    ),
)


@given(histogram_json, st.one_of(st.none(), perturbations))
def test_histogram_parts_agrees_with_from_json(obj, change):
    """What the C check takes, the Python check takes, as the same histogram; what the Python
    check refuses, the C check leaves to it (None)."""
    if change is not None:
        obj = perturbed(*change, obj)
    parts = MERGE_SPEEDUPS.histogram_parts(obj, 4, MAX_BUCKETS)
    try:
        expected = python_from_json(obj)
    except ValueError:
        assert parts is None
        return
    if parts is not None:
        counts, count, total, low, high = parts
        assert (counts, count, total, low, high) == (
            expected.counts,
            expected.count,
            expected.sum,
            expected.min,
            expected.max,
        )
    else:  # only what is past the C check's range: a number of 2**63 or more
        assert max(expected.count, expected.sum, expected.max) >= 2**63 or any(
            c >= 2**63 for c in expected.counts.values()
        )


def test_histogram_parts_takes_what_is_written():
    for values in ([], [0], [5, 70, 3_000_000], [2**61] * 3):
        obj = LogHistogram(values).to_json()
        assert MERGE_SPEEDUPS.histogram_parts(obj, 4, MAX_BUCKETS) is not None
        assert LogHistogram.from_json(obj) == python_from_json(obj) == LogHistogram(values)


FIELDS = ("acquisitions", "contentions", "wait_ns", "hold_ns")
worker_entries = st.dictionaries(
    st.one_of(st.text(max_size=5), st.integers(0, 3)),
    st.one_of(
        st.fixed_dictionaries({k: st.integers(0, 2**64) for k in FIELDS}),
        st.fixed_dictionaries({k: st.integers(0, 9) for k in FIELDS[:3]}),
        st.fixed_dictionaries({**{k: st.integers(0, 9) for k in FIELDS}, "extra": st.just("x")}),
        st.fixed_dictionaries({k: st.sampled_from([True, 1.0, -1, "1", 7]) for k in FIELDS}),
    ),
    max_size=4,
)


@given(worker_entries)
def test_worker_rows_agrees_with_its_reference(per_worker):
    """What the C check takes is what the pure-Python check gives; what it leaves (None), the
    pure-Python check refuses or takes only past 2**63 (where it names the value)."""
    from otel_lockwatch.manifest import _data

    got = MERGE_SPEEDUPS.worker_rows(per_worker, FIELDS)
    saved, _data.MERGE_SPEEDUPS = _data.MERGE_SPEEDUPS, None
    try:
        expected = _data.lock_workers(per_worker, "w").rows
    except ValueError:
        expected = None
    finally:
        _data.MERGE_SPEEDUPS = saved
    if got is not None:
        assert got == expected
    else:
        assert expected is None or any(max(r) >= 2**63 for r in expected.values())


rows = st.dictionaries(st.sampled_from("abcd"), st.tuples(*[st.integers(0, 2**70)] * 4))


@given(rows, rows)
def test_add_rows_is_the_fold_loop(into, other):
    expected = dict(into)
    for w, r in other.items():
        mine = expected.get(w)
        expected[w] = r if mine is None else tuple(a + b for a, b in zip(mine, r, strict=True))
    MERGE_SPEEDUPS.add_rows(into, other)
    assert into == expected


def test_compact_refuses_integers_of_19_digits_outside_strings():
    """Without such a run every integer is below 10**18 (the parser's int() is then safe)."""
    assert MERGE_SPEEDUPS.compact(b'{"a": 999999999999999999}', 8) == b'{"a":999999999999999999}'
    assert MERGE_SPEEDUPS.compact(b'{"a": 9999999999999999999}', 8) is None
    assert MERGE_SPEEDUPS.compact(b'{"a": 1.0000000000000000001}', 8) is None
    assert MERGE_SPEEDUPS.compact(b'{"a": "99999999999999999999"}', 8) is not None


def sealed_text(doc: dict, edit: tuple[str, str]) -> str:
    """``doc`` written as this library writes a manifest, with ``edit`` made to its text and
    its digest then recomputed over its compacted bytes: a crafted file, sealed as the fast
    path checks."""
    import hashlib

    placeholder = "0" * 64
    text = json.dumps({**doc, "manifest_digest": placeholder}, sort_keys=True, indent=2)
    text = text.replace(*edit, 1)
    compact = MERGE_SPEEDUPS.compact(text.encode(), MAX_DEPTH)
    member = f',"manifest_digest":"{placeholder}"'.encode()
    return text.replace(placeholder, hashlib.sha256(compact.replace(member, b"")).hexdigest())


def test_both_parsers_of_the_vetted_path_read_the_same(tmp_path, monkeypatch):
    """With orjson (the ``merge`` extra) and without it, a sealed manifest reads the same."""
    pytest.importorskip("orjson")
    path = tmp_path / "m.json"
    path.write_text(manifest_text())
    with_orjson = load_mergeable(path)
    monkeypatch.setattr(_io, "orjson", None)
    assert load_mergeable(path) == with_orjson


@pytest.mark.parametrize("parser", ["orjson", "json"])
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('"marker-value"', "1e999"), r"has a number out of range: '1e999'$"),
        (('"marker-value"', '"\\udc00"'), r"has a lone surrogate at process\.marker: '\\udc00'$"),
        (('"marker-value"', "NaN"), r"has NaN, which is not a JSON number$"),
    ],
    ids=["1e999", "a lone surrogate", "NaN"],
)
def test_what_the_vetted_parse_refuses_is_named_the_long_way(
    tmp_path, monkeypatch, parser, edit, message
):
    """A sealed manifest with a float out of range, a lone surrogate or NaN (which neither the
    compacting nor the digest refuses): the long way's message, whichever parser ran."""
    if parser == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(_io, "orjson", None)
    doc = json.loads(manifest_text())
    doc["process"]["marker"] = "marker-value"
    path = tmp_path / "m.json"
    path.write_text(sealed_text(doc, edit))
    assert compact_sealed(path.read_bytes(), "manifest_digest") is not None  # sealed indeed
    with pytest.raises(ManifestError, match=rf"^manifest {re.escape(str(path))} {message}"):
        load_mergeable(path)


# --------------------------------------------------------------------------------------------
# The compacting against the standard parser: the same value or the same refusal


def read_long_way(text: bytes) -> str | None:
    """What the long way reads of ``text``: its value as type-exact JSON, or None (refused)."""
    try:
        return json.dumps(_io.parse_json(text, "t"), sort_keys=True)
    except ManifestError:
        return None


def read_compacted(text: bytes, parser: str) -> str | None:
    """What the vetted path reads of ``text`` when ``compact`` takes it (else the long way, as
    ``parse_sealed`` falls back to it), with orjson or the standard parser."""
    compact = MERGE_SPEEDUPS.compact(text, MAX_DEPTH)
    if compact is None:
        return read_long_way(text)
    saved = _io.orjson
    if parser == "json":
        _io.orjson = None
    try:
        return json.dumps(_io.parse_json(compact, "t", vetted=True), sort_keys=True)
    except ManifestError:
        return read_long_way(text)  # parse_sealed's fallback
    finally:
        _io.orjson = saved


# Bytes that, put anywhere in a JSON text, make it hostile: whitespace inside a token, a digit
# beside a digit run, a quote, an escape, punctuation.
_HOSTILE = [b" ", b"\n", b"\t", b"\r", b"\x0c", b"", b'"', b"\\", b",", b":", b"0", b"9", b"-"]
_HOSTILE += [b"e", b".", b"{", b"}", b"[", b"]", b"true", b"\xff", b"\\u0061", b"\xc3\xa9"]


@st.composite
def hostile_texts(draw) -> bytes:
    """A generated document written as the library writes it (or otherwise), then edited at
    random places with :data:`_HOSTILE` bytes."""
    doc = draw(documents)
    indent = draw(st.sampled_from([None, 0, 2]))
    text = json.dumps(doc, sort_keys=draw(st.booleans()), indent=indent, ensure_ascii=False)
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        cut = draw(st.integers(0, 2))
        data = data[:at] + draw(st.sampled_from(_HOSTILE)) + data[at + cut :]
    return data


@pytest.mark.parametrize("parser", ["orjson", "json"])
@given(st.one_of(hostile_texts(), st.binary(max_size=40)))
@example(b'{"a": 1, "zz": 1 2}')
@example(b'{"a": [1234567890 123456789]}')
@example(b"[123456789012345678 9]")
@example(b"[t rue, nu ll, 1. 5, - 1, 1 e5]")
@example(b"1 2")
@example(b'["a" "b"]')
def test_compact_reads_the_value_the_long_way_reads_or_refuses_as_it_does(parser, text):
    """Whatever the bytes, the vetted path (compacting, then orjson or the standard parser)
    gives the value the standard parser gives, type for type, or refuses where it refuses:
    whitespace the compacting drops never joins two tokens into one (``1 2`` is not ``12``,
    nor a 19-digit run hidden by a space in range)."""
    if parser == "orjson":
        pytest.importorskip("orjson")
    assert read_compacted(text, parser) == read_long_way(text)


def test_compact_refuses_whitespace_inside_a_token():
    """Whitespace between two bytes of literals (numbers, true, false, null) is a separator
    the compacting cannot drop: None, and the long way refuses the text."""
    for text in (b'{"zz": 1 2}', b"[1234567890 123456789]", b"[t rue]", b"[1. 5]", b"- 1"):
        assert MERGE_SPEEDUPS.compact(text, 8) is None, text
        assert read_long_way(text) is None
    assert MERGE_SPEEDUPS.compact(b"[1 ,\n 2 ] ", 8) == b"[1,2]"
    assert MERGE_SPEEDUPS.compact(b'{"a" : "b c" , "d":true }', 8) == b'{"a":"b c","d":true}'


@given(st.one_of(hostile_texts(), st.binary(max_size=60)))
def test_cost_is_the_long_ways_estimate(text):
    """The C cost() counts the punctuation the long way counts (``_io.COSTS``), so the fast
    path refuses for its cost exactly what the long way refuses."""
    assert MERGE_SPEEDUPS.cost(text) == sum(text.count(b) * w for b, w in _io.COSTS)


@given(hostile_texts(), st.integers(0, 3000))
def test_compact_refuses_a_text_past_its_cost(text, max_cost):
    got = MERGE_SPEEDUPS.compact(text, MAX_DEPTH, max_cost)
    if MERGE_SPEEDUPS.cost(text) > max_cost:
        assert got is None
    else:
        assert got == MERGE_SPEEDUPS.compact(text, MAX_DEPTH)


# --------------------------------------------------------------------------------------------
# same_json: a manifest against what its data gives, as the digests compare them


def json_paths(doc, path=()):
    """Every place of a JSON document, with its value."""
    yield path, doc
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in items:
        yield from json_paths(value, (*path, key))


_REPLACEMENTS = [0, 1, -1, 1.0, -0.0, 0.0, True, False, None, "", "1", [], {}, 2**62, 0.1]


@given(st.data())
def test_same_json_is_the_digests_comparison(data):
    """Whatever one value of a manifest is replaced by (an int by the same float, a bool, -0.0,
    a container), the C walk says "the same" exactly when the digests are equal."""
    from otel_lockwatch.manifest._check import evaluate_again
    from otel_lockwatch.manifest._model import compute_digest

    doc = json.loads(manifest_text())
    built = evaluate_again(doc)._doc
    places = [p for p, _ in json_paths(doc) if p and p != ("manifest_digest",)]
    path = data.draw(st.sampled_from(places))
    value = data.draw(st.sampled_from(_REPLACEMENTS))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    stored = {k: v for k, v in doc.items() if k != "manifest_digest"}
    assert MERGE_SPEEDUPS.same_json(built, stored) is (
        compute_digest(built) == compute_digest(stored)
    )


def test_same_json_of_a_manifest_and_its_text():
    from otel_lockwatch.manifest._check import evaluate_again

    doc = json.loads(manifest_text())
    stored = {k: v for k, v in doc.items() if k != "manifest_digest"}
    assert MERGE_SPEEDUPS.same_json(evaluate_again(doc)._doc, stored) is True
    assert stored["verdict"] == "LOW_CONTENTION"
    stored["verdict"] = "HOT_LOCK_DETECTED"
    assert MERGE_SPEEDUPS.same_json(evaluate_again(doc)._doc, stored) is False
