"""The manifest read back as an adversary writes it, and names as an adversary chooses them.

Whoever can write a manifest file can recompute its digest (it has no key), and lock and thread
names often come from request data. These tests attack the reader (``load_manifest``,
``recommended_workers``, ``merge_manifests``) and every command that reads a manifest
(``report`` as text, JSON, DOT and HTML, ``check``, ``merge``) the way such a writer would: deep
nesting, huge numbers, duplicate keys, special files, wrong types with recomputed digests,
derived fields that contradict the data, and names full of terminal escapes. What must hold:
one ``ManifestError`` line (exit 2 from the command, one ``otel-lockwatch: error:`` line on
stderr, never a traceback), bounded memory, and no control character from a name on a
terminal or in a DOT file. Plus the mode the manifest is written with.

The hypothesis runs are kept small (the whole file takes well under a minute).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_lockwatch import name_lock
from otel_lockwatch.cli._main import main
from otel_lockwatch.cli._report_text import render_dot, render_json, render_text
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest import _io
from otel_lockwatch.manifest._admission import recommended_workers
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import DEFAULT_MAX_BYTES, dump_manifest, load_manifest
from otel_lockwatch.manifest._merge import merge_manifests
from otel_lockwatch.manifest._model import compute_digest
from otel_lockwatch.record._witness import NAME_LIMIT, Cycle, EdgeWitness, printable

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
ERROR = "otel-lockwatch: error: "
#: What may reach a terminal besides printable characters: the report's own line breaks.
ALLOWED = {"\n"}
#: Hostile names: terminal escapes (clear screen, set title), a forged line, NUL, C1 CSI,
#: a bidirectional override, a line separator, DEL.
EVIL = "acc\x1b[2J\x1b]0;pwned\x07\nworker-1 waited 0 on config\r\x00\x9b\u202eX\u2028\x7f"
MB = 1 << 20


def billing_doc() -> dict[str, Any]:
    """The billing snapshot's manifest as a JSON dict (CYCLIC_ORDERING_DETECTED, 16 -> 8)."""
    return evaluate(json.loads((DATA / "snapshot_billing.json").read_text())).to_dict()


BILLING = billing_doc()


def resealed(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its digest recomputed, as anyone who can write the file can do."""
    doc = dict(doc)
    doc["manifest_digest"] = compute_digest(doc)
    return doc


def write(path: Path, content: dict[str, Any] | str | bytes) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def nested(depth: int, leaf: Any = 0) -> Any:
    """``[[[...leaf...]]]``, ``depth`` lists deep, built without recursion."""
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_printable(text: str) -> None:
    """No character a terminal would act on: every character printable or a line break."""
    bad = {c for c in text if not c.isprintable()} - ALLOWED
    assert not bad, f"non-printable characters reached the output: {sorted(map(repr, bad))}"


def assert_one_error(rc: int, out: str, err: str) -> str:
    """A refused input: exit 2, nothing on stdout, exactly one error line, no traceback."""
    assert rc == 2, (rc, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR) and err.endswith("\n"), err
    assert_printable(err)
    return lines[0]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


# --------------------------------------------------------------------------------------------
# What the reader refuses, one line each


REFUSED = [
    ("json nested 100,000 deep", deep_json(100_000), r"nests deeper than 32 levels$"),
    ("json nested 40 deep", deep_json(40), r"nests deeper than 32 levels at "),
    (
        "5,000-digit integer",
        '{"schema": ' + "9" * 5000 + "}",
        r"has an integer of 5000 digits, out of range: 99999999999999999999\.\.\.\(\+4980 chars\)$",
    ),
    ("2**63", '{"a": 9223372036854775808}', r"has an integer out of range \(-2\*\*63, 2\*\*63\): "),
    ("1e999", '{"a": 1e999}', r"has a number out of range: '1e999'$"),
    ("NaN", '{"a": NaN}', r"has NaN, which is not a JSON number$"),
    ("-Infinity", '{"a": -Infinity}', r"has -Infinity, which is not a JSON number$"),
    (
        "duplicate key",
        '{"verdict": "LOW_CONTENTION", "verdict": "CYCLIC_ORDERING_DETECTED"}',
        r"has a duplicate key 'verdict' in one object$",
    ),
    ("lone surrogate", '{"schema": "\\udc00"}', r"has a lone surrogate at schema: '\\udc00'$"),
    ("empty", b"", r"is not valid JSON: Expecting value at line 1 column 1$"),
    ("truncated", json.dumps(BILLING)[:-40], r"is not valid JSON: "),
    ("not UTF-8", b'{"a": "\xff"}', r"is not UTF-8 text \(byte 7\)$"),
]


@pytest.mark.parametrize(
    ("content", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_hostile_bytes_are_refused_in_one_line(tmp_path, content, message):
    """Each is one ManifestError naming the file and the value, never a RecursionError, a
    ValueError from int() or a manifest taken on its last duplicate key."""
    path = write(tmp_path / "m.json", content)
    with pytest.raises(ManifestError, match=rf"^manifest {re.escape(str(path))} {message}") as info:
        load_manifest(path)
    assert_printable(str(info.value))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("command", ["report", "check", "merge"])
@pytest.mark.parametrize("content", [r[1] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_every_command_refuses_hostile_bytes_in_one_line(tmp_path, capsys, command, content):
    """The same inputs through the command line: exit 2, one ``otel-lockwatch: error:`` line,
    no traceback, no output file."""
    path = write(tmp_path / "m.json", content)
    argv = {
        "report": ["report", str(path), "--dot", str(tmp_path / "g.dot")],
        "check": ["check", str(path), "-p", "1000000000"],
        "merge": ["merge", str(path), "-o", str(tmp_path / "out.json")],
    }[command]
    rc, out, err = run_main(capsys, *argv)
    assert assert_one_error(rc, out, err).startswith(f"{ERROR}manifest {path} ")
    assert sorted(os.listdir(tmp_path)) == ["m.json"]


def test_deep_nesting_inside_lock_order_with_a_valid_digest(tmp_path):
    """600 to 900 levels inside ``lock_order.edges``, digest recomputed: refused at the
    nesting, before anything copies it (a deepcopy raised RecursionError)."""
    limit = sys.getrecursionlimit()
    for depth in (600, 900):
        doc = copy.deepcopy(BILLING)
        doc["lock_order"]["edges"].append(nested(depth))
        sys.setrecursionlimit(depth + 2000)  # for this test's own json.dumps
        try:
            path = write(tmp_path / "m.json", json.dumps(resealed(doc)))
        finally:
            sys.setrecursionlimit(limit)
        # The parser may give up first (its stack), or the check of the nesting names the place.
        with pytest.raises(
            ManifestError,
            match=r"^manifest .*m\.json nests deeper than 32 levels( at lock_order\.edges\[3\]|$)",
        ):
            load_manifest(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(thresholds=[]),
            r"is invalid: thresholds must be an object, got list$",
        ),
        (
            lambda d: d.update(thresholds=None),
            r"is invalid: thresholds must be an object, got NoneType$",
        ),
        (
            lambda d: d["thresholds"].update(starvation_ratio="5"),
            r"is invalid: thresholds\.starvation_ratio must be a number, got '5'$",
        ),
        (
            lambda d: d["thresholds"].pop("hot_lock_threshold_pct"),
            r"is invalid: thresholds lacks hot_lock_threshold_pct$",
        ),
        (
            lambda d: d["sections"]["emitter"].update(max_held=2**63 - 1 + 1),
            r"has an integer out of range \(-2\*\*63, 2\*\*63\): 9223372036854775808$",
        ),
        (
            lambda d: d["locks"]["config"].update(kind=["threading.Lock"]),
            r"is invalid: locks\['config'\]\.kind must be a str, got \['threading\.Lock'\]$",
        ),
        (
            lambda d: d["locks"]["config"].update(acquisitions=True),
            r"is invalid: locks\['config'\]\.acquisitions must be an int >= 0, got True$",
        ),
        (
            lambda d: d.update(process=[1]),
            r"is invalid: process must be an object, got list$",
        ),
        (
            lambda d: d["process"].update(pid={"nested": {}}),
            r"is invalid: process\.pid must be an int >= 0, got \{'nested': \{\}\}$",
        ),
        (
            lambda d: d["process"].update(extra={"a": 1}),
            r"is invalid: process\.extra must be a str, number, bool or null, got \{'a': 1\}$",
        ),
        (
            lambda d: d["lock_order"]["edges"][0].pop("worker"),
            r"is invalid: lock_order\.edges\[0\]: edge witness must have the keys ",
        ),
        (
            lambda d: d["lock_order"].update(cycles=[]),
            r"is invalid: lock_order\.cycles is empty but its edges close a cycle$",
        ),
        (
            lambda d: d["lock_order"]["edges"].append(copy.deepcopy(d["lock_order"]["edges"][0])),
            r"is invalid: lock_order\.edges\[3\] repeats the edge \('config', 'metrics'\)$",
        ),
        (
            lambda d: d.update(pool={"nominal": 2**62, "source": "executor"}),
            r"is invalid: pool\.nominal is 4611686018427387904, above the largest pool size "
            r"1048576$",
        ),
    ],
)
def test_wrong_types_and_values_with_a_recomputed_digest_are_refused(tmp_path, change, message):
    """The digest matches (recomputed), so the field itself must be refused, by name."""
    doc = copy.deepcopy(BILLING)
    change(doc)
    path = write(tmp_path / "m.json", resealed(doc))
    with pytest.raises(ManifestError, match=rf"^manifest {re.escape(str(path))} {message}"):
        load_manifest(path)


# --------------------------------------------------------------------------------------------
# Derived fields that contradict the data


def forged() -> dict[str, Any]:
    """CYCLIC_ORDERING_DETECTED with a recommended pool of 10**18, digest recomputed."""
    doc = copy.deepcopy(BILLING)
    assert doc["verdict"] == "CYCLIC_ORDERING_DETECTED"
    doc["recommended_pool_size"] = 10**18
    return resealed(doc)


def test_forged_recommendation_is_refused_by_load_manifest(tmp_path):
    with pytest.raises(
        ManifestError,
        match=r"^manifest .*m\.json does not agree with its data: recommended_pool_size is "
        r"1000000000000000000, its data gives 8$",
    ):
        load_manifest(write(tmp_path / "m.json", forged()))


def test_forged_recommendation_is_not_trusted_by_recommended_workers(tmp_path, caplog):
    path = write(tmp_path / "m.json", forged())
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        assert recommended_workers(path, 4) == 4
    [record] = caplog.records
    assert "does not agree with its data: recommended_pool_size" in record.getMessage()


def test_a_legacy_schema_cannot_smuggle_a_forged_recommendation(tmp_path, capsys):
    """Schema 1 manifests are read with their derived fields evaluated again, so claiming the
    old schema gains a forger nothing: the recommendation is the data's, and check refuses."""
    doc = forged()
    doc["schema"] = "otel-lockwatch/manifest/1"
    path = write(tmp_path / "m.json", resealed(doc))
    assert load_manifest(path).recommended_pool_size == 8
    assert recommended_workers(path, 4) == 8
    rc, out, err = run_main(capsys, "check", str(path), "-p", "1000000000")
    assert rc == 1 and err == ""


def test_forged_recommendation_is_refused_by_check(tmp_path, capsys):
    """``check -p 1000000000`` admitted it; now the gate exits 2 without a verdict."""
    path = write(tmp_path / "m.json", forged())
    rc, out, err = run_main(capsys, "check", str(path), "-p", "1000000000")
    line = assert_one_error(rc, out, err)
    assert line.endswith("does not agree with its data: recommended_pool_size is "
                         "1000000000000000000, its data gives 8")  # fmt: skip


def test_forged_recommendation_never_survives_a_merge(tmp_path, capsys):
    """A manifest, as a dict or a file, is checked whole, derived fields included: a merge
    refuses the forgery as report and check do."""
    path = write(tmp_path / "m.json", forged())
    with pytest.raises(ManifestError, match=r"does not agree with its data"):
        merge_manifests([forged()])
    rc, out, err = run_main(capsys, "merge", str(path), "-o", str(tmp_path / "out.json"))
    assert rc == 2 and "does not agree with its data: recommended_pool_size" in err, err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(verdict="LOW_CONTENTION"), "verdict is 'LOW_CONTENTION'"),
        (lambda d: d.update(nominal_pool_size=16.0), "nominal_pool_size is 16.0"),
        (lambda d: d.update(pool_size_source="argument"), "pool_size_source is 'argument'"),
        (
            lambda d: d.update(effective_throughput_pct=d["effective_throughput_pct"] + 1e-9),
            "effective_throughput_pct is ",
        ),
        (lambda d: d.update(hot_lock_register=[]), "hot_lock_register is []"),
        (lambda d: d["locks"]["config"]["wait"].update(p95_ms=1.0), "locks.config.wait.p95_ms"),
        (lambda d: d["thresholds"].update(starvation_min_wait_ms=0.5), "thresholds."),
        (lambda d: d.update(comment="hand-tuned"), "comment is not a field its data gives"),
        (lambda d: d["sections"]["emitter"].update(recommended_count=1), "sections.emitter."),
    ],
)
def test_derived_fields_must_be_what_the_data_gives(tmp_path, change, field):
    """Every derived field is evaluated again from the data under the manifest's own
    thresholds and pool-size source, and compared exactly (floats by their JSON text)."""
    doc = copy.deepcopy(BILLING)
    change(doc)
    with pytest.raises(ManifestError, match=r"does not agree with its data: ") as info:
        load_manifest(write(tmp_path / "m.json", resealed(doc)))
    assert field in str(info.value)


def test_a_manifest_evaluated_under_other_inputs_still_loads(tmp_path):
    """Thresholds and a pool size given at evaluation are read back from the manifest's own
    fields: a manifest is refused for what it says, not for how it was configured."""
    data = json.loads((DATA / "snapshot_billing.json").read_text())
    data["pool"] = {"nominal": None, "source": None}
    for kwargs in ({"pool_size": 12}, {"hot_lock_threshold_pct": 90.0, "starvation_ratio": 50}, {}):
        m = evaluate(data, **kwargs)
        assert load_manifest(dump_manifest(m, tmp_path / "m.json")) == m


# --------------------------------------------------------------------------------------------
# Files that are not manifests at all; size


def test_special_files_are_refused_before_reading(tmp_path):
    """A FIFO (whose open would block), /dev/zero (endless) and a directory: refused from
    their stat, at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory")):  # fmt: skip
        with pytest.raises(
            ManifestError,
            match=rf"^manifest {re.escape(str(path))} is not a regular file: it is {kind}$",
        ):
            load_manifest(path)


def test_size_cap_is_a_keyword_with_a_documented_default(tmp_path):
    path = dump_manifest(evaluate({}), tmp_path / "m.json")
    size = path.stat().st_size
    assert DEFAULT_MAX_BYTES == 64 * MB
    assert load_manifest(path, max_bytes=size)
    with pytest.raises(
        ManifestError,
        match=rf"^manifest .*m\.json is {size} bytes, more than max_bytes={size - 1}$",
    ):
        load_manifest(path, max_bytes=size - 1)
    with pytest.raises(ValueError, match=r"^max_bytes must be >= 1, got 0$"):
        load_manifest(path, max_bytes=0)
    assert recommended_workers(path, 3, max_bytes=size - 1) == 3


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="a /proc file")
def test_at_most_max_bytes_plus_one_are_read_whatever_the_size_says(monkeypatch):
    """A file whose size is not told (``/proc``: 0 bytes, as a file that grows after the look
    at its size) is read up to the cap and one byte more, then refused."""
    path = "/proc/self/maps"  # this process's mappings: several KB, its size 0
    assert os.stat(path).st_size == 0 and len(Path(path).read_bytes()) > 4096
    read = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        read.append(len(chunk))
        return chunk

    monkeypatch.setattr(_io.os, "read", counting_read)
    with pytest.raises(ManifestError, match=r"^manifest .*maps is larger than 4096 bytes"):
        load_manifest(path, max_bytes=4096)
    assert sum(read) == 4096 + 1


def test_cli_max_bytes_option(tmp_path, capsys):
    path = dump_manifest(evaluate({}), tmp_path / "m.json")
    rc, out, err = run_main(capsys, "report", str(path), "--max-bytes", "64K")
    assert rc == 0
    rc, out, err = run_main(capsys, "check", str(path), "-p", "1", "--max-bytes", "100")
    assert assert_one_error(rc, out, err).endswith("more than max_bytes=100")
    rc, out, err = run_main(
        capsys, "merge", str(path), "-o", str(tmp_path / "o"), "--max-bytes", "0"
    )
    assert "must be a positive number of bytes (such as 64M), got '0'" in assert_one_error(
        rc, out, err
    )


MEMORY_PROBE = textwrap.dedent(
    """
    import resource, subprocess, sys
    reader = (
        "import sys\\n"
        "from otel_lockwatch.exceptions import ManifestError\\n"
        "from otel_lockwatch.manifest._io import load_manifest\\n"
        "try:\\n"
        "    load_manifest(sys.argv[1])\\n"
        "except ManifestError as e:\\n"
        "    print(e)\\n"
        "else:\\n"
        "    print('accepted')\\n"
    )
    done = subprocess.run([sys.executable, "-c", reader, sys.argv[1]], capture_output=True,
                          text=True, timeout=120)
    # The reader is this process's only child: its peak RSS is the children's maximum.
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(done.returncode)
    print(done.stdout.strip())
    print(done.stderr.strip())
    """
)


@pytest.mark.parametrize("target", ["sparse", "/dev/zero"])
def test_reading_a_huge_input_stays_under_200_mb(tmp_path, target):
    """A 1 GB (sparse) file and /dev/zero are refused, and the reading process's peak RSS stays
    under 200 MB (``/dev/zero`` grew to 23 GB)."""
    if target == "sparse":
        path = tmp_path / "huge.json"
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    else:
        path = Path(target)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(path)],
        capture_output=True, text=True, timeout=180, env=env, check=True,
    )  # fmt: skip
    maxrss_kb, returncode, message, stderr = (done.stdout.split("\n") + [""] * 4)[:4]
    assert (returncode, stderr) == ("0", ""), done.stdout
    assert message.startswith(f"manifest {path} ")
    assert "more than max_bytes" in message or "not a regular file" in message
    assert int(maxrss_kb) < 200 * 1024


# --------------------------------------------------------------------------------------------
# Merge


def test_merge_refuses_wrong_types_in_dicts_and_files(tmp_path, capsys):
    """The merge's inputs are checked as load_manifest checks them: these raised
    ``'NoneType' object has no attribute 'get'`` and ``OverflowError``."""
    good = tmp_path / "good.json"
    dump_manifest(evaluate(json.loads((DATA / "snapshot_calm.json").read_text())), good)
    for change in (
        lambda d: d.update(thresholds=None),
        lambda d: d["sections"]["emitter"].update(max_held=10**300),
        lambda d: d["process"].update(pids="1,2"),
        lambda d: d.update(lock_order={"edges": None}),
    ):
        doc = copy.deepcopy(BILLING)
        change(doc)
        with pytest.raises(ManifestError):
            merge_manifests([resealed(doc)])
        bad = write(tmp_path / "bad.json", resealed(doc))
        rc, out, err = run_main(
            capsys, "merge", str(good), str(bad), "-o", str(tmp_path / "o.json")
        )
        assert_one_error(rc, out, err)
        assert not (tmp_path / "o.json").exists()


def test_merge_whose_sums_leave_the_range_is_refused(tmp_path):
    """Counts below 2**63 each may add up past it: such a merge could not be read back."""
    data = json.loads((DATA / "snapshot_calm.json").read_text())
    lock = next(iter(data["locks"].values()))
    lock["skipped"] = 2**62
    m = evaluate(data)
    with pytest.raises(
        ManifestError,
        match=r"^the merged manifest has an integer out of range at locks.*skipped: "
        r"9223372036854775808$",
    ):
        merge_manifests([m, m])


# --------------------------------------------------------------------------------------------
# Names on a terminal, in DOT, in JSON


def hostile_manifest(name: str, worker: str) -> dict[str, Any]:
    """The billing manifest with ``accounts`` renamed ``name`` + "1", ``ledger`` ``name`` + "2"
    and worker-3 ``worker``: a hot lock table, a cycle and a worker, all hostile."""
    text = (DATA / "snapshot_billing.json").read_text()
    data = json.loads(text)

    def rename(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {rename(k): rename(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [rename(v) for v in obj]
        if obj == "accounts":
            return name + "1"
        if obj == "ledger":
            return name + "2"
        if obj == "worker-3":
            return worker
        return obj

    data = rename(data)
    data["process"]["service.name"] = name
    return evaluate(data).to_dict()


def test_printable_escapes_what_a_terminal_acts_on_and_cuts_long_names():
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("x\ny\rz\x00\x07\x7f\x9b") == "x\\ny\\rz\\x00\\x07\\x7f\\x9b"
    assert (
        printable("\u202eevil\u2028\u2029\ufeff\udc00") == "\\u202eevil\\u2028\\u2029\\ufeff\\udc00"
    )
    assert printable("верёвка:acquire:12") == "верёвка:acquire:12"
    assert printable(printable(EVIL)) == printable(EVIL)  # idempotent: a backslash is kept
    long = "L" * (NAME_LIMIT + 5)
    assert printable(long) == "L" * NAME_LIMIT + "...(+5 chars)"
    assert printable(long, None) == long
    assert_printable(printable(EVIL))


def test_report_text_shows_no_control_character_from_a_name(tmp_path, capsys, monkeypatch):
    """Before: ESC[2J cleared the terminal, OSC set its title, a newline forged report lines."""
    monkeypatch.setenv("COLUMNS", "1000")  # the escaped name on one line, whatever the terminal
    path = dump_manifest(evaluate(hostile_manifest(EVIL, EVIL + "w")), tmp_path / "m.json")
    rc, out, err = run_main(capsys, "report", str(path))
    assert rc == 0 and err == ""
    assert_printable(out)
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\nworker-1 waited 0 on config\\r\\x00\\x9b\\u202eX" in out
    assert not any(line.startswith("worker-1 waited 0") for line in out.splitlines())
    assert_printable(render_text(hostile_manifest(EVIL, EVIL), color=True).replace("\x1b[", ""))


def test_report_json_escapes_but_keeps_every_character(capsys):
    manifest = hostile_manifest(EVIL, EVIL)
    text = render_json(manifest)
    assert_printable(text)
    data = json.loads(text)
    assert EVIL + "1" in {row["lock"] for row in data["locks"]}


def test_cycle_text_is_printable():
    """``Cycle.format()`` is the warning on stderr, the report's cycle and the exception's
    message: one header and one line per edge, whatever the names."""

    def w(a: str, b: str) -> EdgeWitness:
        return EdgeWitness(a, b, EVIL, (EVIL, "m:f:1"), "2026-01-01T00:00:00.000Z")

    cycle = Cycle.from_edges([w(EVIL + "1", EVIL + "2"), w(EVIL + "2", EVIL + "1")])
    text = cycle.format()
    assert_printable(text)
    assert len(text.splitlines()) == 3
    recursive = Cycle.from_edges([w("A" * MB, "A" * MB)]).format()
    assert f"...(+{MB - NAME_LIMIT} chars)" in recursive and len(recursive) < 2000


def test_the_cycle_warning_on_stderr_is_printable(watched, caplog):
    """The warning capture logs when a cycle closes carries the text of ``Cycle.format()``."""
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    a, b = threading.Lock(), threading.Lock()
    name_lock(a, EVIL + "a")
    name_lock(b, EVIL + "b")

    def nest(first: Any, second: Any) -> None:
        with first, second:
            pass

    for first, second, worker in ((a, b, EVIL + "1"), (b, a, EVIL + "2")):
        t = threading.Thread(target=nest, args=(first, second), name=worker)
        t.start()
        t.join(10)
        assert not t.is_alive()
    [record] = [r for r in caplog.records if "circular locking" in r.getMessage()]
    message = record.getMessage()
    assert_printable(message)
    assert len(message.splitlines()) == 3
    assert "\\x1b[2J" in message


def dot_program() -> str:
    dot = shutil.which("dot")
    if dot:
        return dot
    if os.environ.get("CI"):
        pytest.fail("CI is set but Graphviz's dot is not installed (Debian package graphviz)")
    pytest.skip("Graphviz's dot is not installed (apt-get install graphviz); CI installs it")


def test_dot_of_megabyte_names_renders_with_graphviz(tmp_path, capsys):
    """Names of a megabyte with NUL and ESC in them: the DOT stays under Graphviz's
    16,384-character string limit and NUL-free, and the real ``dot`` renders it; two names cut
    to the same text are still two nodes."""
    dot = dot_program()
    big = "N" * MB + "\x00\x1b"
    path = dump_manifest(evaluate(hostile_manifest(big, big + "w")), tmp_path / "m.json")
    graph = tmp_path / "g.dot"
    rc, out, err = run_main(capsys, "report", str(path), "--dot", str(graph))
    assert rc == 0
    text = graph.read_text(encoding="utf-8")
    assert_printable(text)
    assert len(text) < 16_384
    assert text.count("[label=") == 4 + 3  # four locks, three edges
    assert text.count(f"...(+{MB + 3 - NAME_LIMIT} chars)") == 3  # two locks, one worker
    done = subprocess.run([dot, "-Tsvg", str(graph), "-o", str(tmp_path / "g.svg")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "g.svg").read_text().count('class="node"') == 4


def test_html_report_still_escapes(tmp_path, capsys):
    path = dump_manifest(evaluate(hostile_manifest("<script>" + EVIL, "<w>")), tmp_path / "m.json")
    page = tmp_path / "r.html"
    rc, out, err = run_main(capsys, "report", str(path), "--html", str(page))
    assert rc == 0
    html = page.read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_error_lines_show_paths_and_names_printable(tmp_path, capsys):
    """A path or a refused key with a newline or ESC in it cannot add a line to stderr."""
    path = write(tmp_path / "evil\n\x1b[31mname.json", '{"a\\u001b\\n": 1, "a\\u001b\\n": 2}')
    rc, out, err = run_main(capsys, "report", str(path))
    line = assert_one_error(rc, out, err)
    assert "evil\\n\\x1b[31mname.json has a duplicate key 'a\\x1b\\n'" in line


# --------------------------------------------------------------------------------------------
# The file's mode

UMASK_PROBE = textwrap.dedent(
    """
    import os, stat, sys
    from otel_lockwatch.manifest import _io
    from otel_lockwatch.manifest._evaluate import evaluate
    os.umask(int(sys.argv[2], 8))
    modes = []
    real_fsync = os.fsync
    def fsync(fd):  # while the temporary file is being written
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fsync(fd)
    _io.os.fsync = fsync
    path = _io.dump_manifest(evaluate({}), sys.argv[1])
    print(oct(modes[0]), oct(stat.S_IMODE(os.stat(path).st_mode)))
    """
)


@pytest.mark.parametrize(("umask", "mode"), [("077", "0o600"), ("022", "0o644"), ("002", "0o664")])
def test_manifest_mode_honours_the_umask(tmp_path, umask, mode):
    """The manifest is created 0666 & ~umask like any file the program creates, and the
    temporary file is never more open than that while it is written (it was 0644 always)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", UMASK_PROBE, str(tmp_path / "m.json"), umask],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    )  # fmt: skip
    assert done.stdout.split() == [mode, mode]


def test_write_replaces_a_symlink_instead_of_following_it(tmp_path):
    """Still symlink-safe: a symlink planted at the manifest's path is replaced, its target
    untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "m.json"
    link.symlink_to(victim)
    dump_manifest(evaluate({}), link)
    assert victim.read_text() == "precious"
    assert not link.is_symlink()
    assert load_manifest(link).verdict == "LOW_CONTENTION"


# --------------------------------------------------------------------------------------------
# Fuzzing: fields of a real manifest, and raw bytes


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*prefix, i))
    return out


FUZZ_BASE = evaluate(json.loads((DATA / "snapshot_billing.json").read_text())).to_dict()
# Histogram buckets are many and alike: a few of them stand for all.
FIELD_PATHS = [p for p in _paths(FUZZ_BASE) if "buckets" not in p or p[-1] == "buckets"]
FIELD_PATHS += [p for p in _paths(FUZZ_BASE) if "buckets" in p][:6]
# A field first (each as likely: locks hold most of the paths), then a place inside it.
field_paths = st.sampled_from(sorted(FUZZ_BASE)).flatmap(
    lambda field: st.sampled_from([p for p in FIELD_PATHS if p[0] == field])
)

names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12
) | st.sampled_from([EVIL, "", "\x00", "\x1b[2J", "a" * 300])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, -(2**63), 10**18, 10**300])
    | st.floats(allow_nan=False, allow_infinity=False)
    | names
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
) | st.builds(nested, st.sampled_from([33, 600, 900]))


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    for key in path[:-1]:
        doc = doc[key]
    if delete:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


def _drive(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path) -> None:
    """Every reader of a manifest on one file: a ManifestError or a result, and from every
    command exit 0/1 with printable output or exit 2 with one error line."""
    try:
        load_manifest(path)
    except ManifestError as e:
        assert "\n" not in str(e)
    assert recommended_workers(path, 3) >= 1
    good = tmp_path / "good.json"
    if not good.exists():
        dump_manifest(evaluate(json.loads((DATA / "snapshot_calm.json").read_text())), good)
    out_path = tmp_path / "merged.json"
    for argv in (
        ["report", str(path)],
        ["report", str(path), "--json"],
        ["report", str(path), "--dot", str(tmp_path / "g.dot"), "--html", str(tmp_path / "r.html")],
        ["check", str(path), "-p", "1000000000"],
        ["merge", str(good), str(path), "-o", str(out_path)],
    ):
        rc, out, err = run_main(capsys, *argv)
        if rc == 2:
            assert_one_error(rc, out, err)
        else:
            assert rc in (0, 1) and "Traceback" not in err
            assert_printable(out)
            assert_printable(err)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=field_paths, value=json_values, delete=st.booleans())
def test_fuzz_fields_of_a_real_manifest(tmp_path_factory, capsys, path, value, delete):
    """A field of a real manifest given another type or value (or removed), the digest
    recomputed: every reader refuses it in one line or copes; nothing raises anything else."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    doc = copy.deepcopy(FUZZ_BASE)
    _set(doc, path, value, delete)
    doc.pop("manifest_digest", None)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2000)  # so that this test can write 900 levels for the reader
    try:
        doc["manifest_digest"] = compute_digest(doc)
        text = json.dumps(doc)
    except ValueError:  # a value JSON cannot hold: nothing to read back
        return
    finally:
        sys.setrecursionlimit(limit)
    _drive(tmp_path, capsys, write(tmp_path / "m.json", text))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    raw=st.binary(max_size=64)
    | st.builds(
        lambda cut, junk: json.dumps(FUZZ_BASE).encode()[:cut] + junk,
        st.integers(0, 4000),
        st.binary(max_size=16),
    )
)
def test_fuzz_raw_bytes(tmp_path_factory, capsys, raw):
    """Arbitrary bytes, and a real manifest cut anywhere with junk after it."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    _drive(tmp_path, capsys, write(tmp_path / "m.json", raw))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=names, worker=names)
def test_fuzz_names_reach_no_terminal_unescaped(tmp_path_factory, capsys, name, worker):
    """Any lock, worker and service name: the manifest is accepted, and what every command
    prints or writes as DOT is printable."""
    tmp_path = tmp_path_factory.mktemp("names")
    if not name or name + "1" == "config" or worker in ("worker-5",):
        return
    path = dump_manifest(evaluate(hostile_manifest(name, worker or "w")), tmp_path / "m.json")
    assert load_manifest(path)
    _drive(tmp_path, capsys, path)
    assert_printable((tmp_path / "g.dot").read_text(encoding="utf-8"))
    assert_printable(render_dot(load_manifest(path).to_dict()))
