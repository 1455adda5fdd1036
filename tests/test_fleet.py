"""A fleet's manifests: the ``lockwatch.manifest`` log record each process sends, the
Collector's file of them read back by ``otel-lockwatch merge``, its other inputs (directories,
globs), its refusals of crafted input, and the bounded streaming merge.

The records are encoded to OTLP JSON here by the OTLP exporter's own encoder and protobuf's JSON
mapping, the encoding the Collector's file exporter writes (``tests/e2e/test_collector_fleet.py``
runs the real Collector).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import threading

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

from otel_lockwatch import _session, load_manifest, merge_manifests, name_lock
from otel_lockwatch._session import OUTBOX
from otel_lockwatch.cli._main import main
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest import _fleet as merge_inputs
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._fleet import EVENT_NAME, read_collector_file
from otel_lockwatch.manifest._io import dump_manifest
from otel_lockwatch.manifest._merge import ManifestFold
from otel_lockwatch.manifest._model import canonical_json
from otel_lockwatch.record._data import DATA_FIELDS, OTHER_WORKERS, DataFold

MS = 1_000_000


def data_digest(doc: dict) -> str:
    return hashlib.sha256(canonical_json({k: doc[k] for k in DATA_FIELDS})).hexdigest()


def collector_line(records) -> str:
    """One line as the Collector's file exporter writes it: an ExportLogsServiceRequest in
    protobuf's JSON mapping, compact."""
    request = encode_logs(list(records))
    return json.dumps(MessageToDict(request), separators=(",", ":"))


def process_manifest(pid: int, waits: list[tuple[str, str, int]]):
    """A single-process manifest of ``(worker, lock, wait_ns)`` acquisitions."""
    from _snapshots import locks_and_workers

    locks, workers = locks_and_workers([(w, lock, wait, MS) for w, lock, wait in waits])
    return evaluate(
        {
            "locks": locks,
            "workers": workers,
            "process": {
                "pid": pid,
                "service.name": "svc",
                "start": "2026-12-01T08:00:00.000Z",
                "end": "2026-12-01T09:00:00.000Z",
            },
        }
    )


@pytest.fixture
def logs():
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return provider, exporter


# ---------------------------------------------------------------------------------------------
# The record


def test_each_write_sends_the_manifest_record_and_the_final_one_once(make_watched, logs, tmp_path):
    """A checkpoint and the final write each send one ``lockwatch.manifest`` record whose body
    carries the manifest's data as written to the file; the final one says so, and a later
    sequence."""
    provider, exporter = logs
    path = tmp_path / "manifest.json"
    make_watched(manifest=True, manifest_path=str(path), logger_provider=provider)
    lock = name_lock(threading.Lock(), "fleet-lock")
    with lock:
        pass
    writer = _session.current().exporter
    assert writer is not None
    writer.write(final=False)
    checkpoint = load_manifest(path)
    with lock:
        pass
    writer.write(final=True)
    final = load_manifest(path)

    records = [r.log_record for r in exporter.get_finished_logs()]
    assert [r.event_name for r in records] == [EVENT_NAME, EVENT_NAME]
    bodies = [json.loads(r.body) for r in records]
    assert [b["final"] for b in bodies] == [False, True]
    assert bodies[0]["sequence"] < bodies[1]["sequence"]
    assert bodies[0]["instance"] == bodies[1]["instance"]
    assert data_digest(bodies[0]["data"]) == data_digest(checkpoint.to_dict())
    assert data_digest(bodies[1]["data"]) == data_digest(final.to_dict())
    assert bodies[1]["data"]["locks"]["fleet-lock"]["acquisitions"] == 2
    assert dict(records[1].attributes) == {
        "lockwatch.manifest.instance": bodies[1]["instance"],
        "lockwatch.manifest.sequence": bodies[1]["sequence"],
        "lockwatch.manifest.final": True,
        "lockwatch.verdict": str(final.verdict),
    }


def test_the_record_can_be_turned_off(make_watched, logs, tmp_path):
    """``manifest_log_record=False``: the file is written, no record is sent."""
    provider, exporter = logs
    path = tmp_path / "manifest.json"
    make_watched(
        manifest=True, manifest_path=str(path), logger_provider=provider, manifest_log_record=False
    )
    assert _session.current().exporter.write(final=False) == path
    assert _session.current().exporter.write(final=True) == path
    assert exporter.get_finished_logs() == ()


def test_a_failing_logger_provider_never_reaches_the_host(make_watched, tmp_path):
    """A logger provider that raises: the manifest is still written, the error is counted."""

    class Broken:
        def get_logger(self, *args, **kwargs):
            raise RuntimeError("no logs today")

    path = tmp_path / "manifest.json"
    make_watched(manifest=True, manifest_path=str(path), logger_provider=Broken())
    before = OUTBOX.errors
    assert _session.current().exporter.write(final=False) == path
    assert OUTBOX.errors == before + 1
    load_manifest(path)


def test_a_lost_final_manifest_is_said_even_after_an_earlier_internal_error(
    make_watched, tmp_path, monkeypatch, caplog
):
    """Internal errors are logged once a process; a final write that fails is said whatever
    came before it: the manifest is the run's last word, and its absence needs a reason."""
    from otel_lockwatch.telemetry import _exit

    class Broken:
        def get_logger(self, *args, **kwargs):
            raise RuntimeError("no logs today")

    path = tmp_path / "manifest.json"
    make_watched(manifest=True, manifest_path=str(path), logger_provider=Broken())
    writer = _session.current().exporter
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        assert writer.write(final=False) == path  # the first internal error: logged
        assert sum("internal error" in r.getMessage() for r in caplog.records) == 1

        def refused(*args, **kwargs):
            raise ValueError("a recording the manifest refuses")

        monkeypatch.setattr(_exit, "evaluate_recording", refused)
        caplog.clear()
        assert writer.write(final=True) is None
    assert [r.getMessage() for r in caplog.records] == [
        "otel-lockwatch: the manifest was not written: "
        "ValueError('a recording the manifest refuses')"
    ]


def test_a_timeline_ahead_of_the_totals_costs_the_timeline_not_the_manifest(
    make_watched, tmp_path, monkeypatch, caplog
):
    """The exit's evaluation of the process's own recording: a timeline that passes its lock's
    totals (which the data refuses) is left out, said in one line, and the manifest written."""
    from otel_lockwatch._session import RECORDER

    path = tmp_path / "manifest.json"
    make_watched(manifest=True, manifest_path=str(path))
    lock = name_lock(threading.Lock(), "ahead")
    with lock:
        pass
    snapshot = RECORDER.snapshot

    def ahead():
        data = snapshot()
        data["timeline"]["locks"]["ahead"]["hold_ns"][-1] += 10**12
        return data

    monkeypatch.setattr(RECORDER, "snapshot", ahead)
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        assert _session.current().exporter.write(final=True) == path
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("otel-lockwatch: the manifest leaves its timeline out: timeline.locks")
    written = load_manifest(path).to_dict()
    assert written["locks"]["ahead"]["acquisitions"] == 1
    assert "timeline" not in written


# ---------------------------------------------------------------------------------------------
# The Collector's file


def records_of(manifests, logs, *, checkpoints=0):
    """Send each manifest as its own process would (``checkpoints`` earlier, smaller records
    first); return the SDK's log records."""
    from otel_lockwatch.telemetry._fleet import ManifestRecords

    provider, exporter = logs
    for manifest in manifests:
        sender = ManifestRecords(provider)  # each manifest another process: a new instance
        for sequence in range(1, checkpoints + 1):
            sender.send(process_manifest(9, [("w", "early", MS)]), sequence, False)
        sender.send(manifest, checkpoints + 1, True)
    return exporter.get_finished_logs()


@pytest.mark.parametrize("event_name", [True, False], ids=["event-name", "older-api"])
def test_merge_of_the_collector_file_equals_the_merge_of_the_files(
    logs, tmp_path, monkeypatch, event_name
):
    """The latest record of each process, read from the Collector's JSON lines (several per
    line, out of order), merges into the manifest the files merge into; a record sent through an
    API without event names is named by its ``event.name`` attribute."""
    from otel_lockwatch.telemetry import _fleet

    if _fleet.HAS_EVENT_NAME and not event_name:
        monkeypatch.setattr(_fleet, "HAS_EVENT_NAME", False)
    elif not _fleet.HAS_EVENT_NAME and event_name:
        pytest.skip("this opentelemetry-api has no event names")
    manifests = [process_manifest(pid, [("w1", "L", pid * MS), ("w2", "M", 0)]) for pid in range(4)]
    records = list(records_of(manifests, logs, checkpoints=2))
    assert all((r.log_record.event_name == EVENT_NAME) is event_name for r in records)
    lines = [collector_line(records[i : i + 5]) for i in range(0, len(records), 5)]
    collector = tmp_path / "lockwatch-manifests.jsonl"
    collector.write_text("\n".join(reversed(lines)) + "\n")
    paths = [dump_manifest(m, tmp_path / f"m{i}.json") for i, m in enumerate(manifests)]

    from_files = merge_manifests(paths)
    fold = ManifestFold()
    for data, thresholds in read_collector_file(collector):
        fold.add_data(data, thresholds)
    assert fold.count == 4
    from_records = fold.result()
    assert data_digest(from_records.to_dict()) == data_digest(from_files.to_dict())
    assert from_records.manifest_digest == from_files.manifest_digest

    out = tmp_path / "merged.json"
    assert main(["merge", str(collector), "-o", str(out)]) == 0
    assert load_manifest(out).manifest_digest == from_files.manifest_digest


def test_directories_and_globs(tmp_path, capsys):
    manifests = [process_manifest(pid, [("w", "L", MS)]) for pid in range(3)]
    (tmp_path / "d").mkdir()
    for i, m in enumerate(manifests):
        dump_manifest(m, tmp_path / "d" / f"manifest.{i}.json")
    expected = merge_manifests(manifests)
    for argument in (str(tmp_path / "d"), str(tmp_path / "d" / "manifest.*.json")):
        out = tmp_path / "out.json"
        assert main(["merge", argument, "-o", str(out)]) == 0
        assert load_manifest(out) == expected
    assert "merged 3 manifests" in capsys.readouterr().out


def test_jobs_fold_contiguous_shares_in_spawned_processes(tmp_path, capsys, monkeypatch):
    """``--jobs 3`` over 7 files (one share a file is enough here): the same manifest as one job,
    and the error of a bad input is that of the first bad input of all, whichever process met
    it first."""
    monkeypatch.setattr(merge_inputs, "FILES_PER_JOB", 1)
    paths = []
    for pid in range(7):
        paths.append(tmp_path / f"manifest.{pid}.json")
        dump_manifest(process_manifest(pid, [(f"w{pid % 3}", f"L{pid % 2}", pid * MS)]), paths[-1])
    one, three = tmp_path / "one.json", tmp_path / "three.json"
    assert main(["merge", *map(str, paths), "-o", str(one), "--jobs", "1"]) == 0
    assert main(["merge", *map(str, paths), "-o", str(three), "--jobs", "3"]) == 0
    assert three.read_bytes() == one.read_bytes()
    assert "merged 7 manifests" in capsys.readouterr().out
    # Shares [0, 1], [2, 3], [4, 5, 6]: the last is this process's own.
    for bad in ([5], [3, 6], [1, 3, 6]):
        for k in bad:
            paths[k].write_text(paths[k].read_text().replace('"pid": ', '"pid": 1', 1))
        out = tmp_path / "bad.json"
        assert main(["merge", *map(str, paths), "-o", str(out), "--jobs", "3"]) == 2
        err = capsys.readouterr().err
        edited = "was edited: its manifest_digest does not match its content"
        assert err == f"otel-lockwatch: error: manifest {paths[bad[0]]} {edited}\n"
        assert not out.exists()


def test_folding_pauses_the_cyclic_collector_and_restores_it(tmp_path):
    """The collector is off while the inputs are read, and as it was after (an error too)."""
    path = tmp_path / "m.json"
    dump_manifest(process_manifest(1, [("w", "L", MS)]), path)
    seen = []
    real = merge_inputs.ManifestFold.add_data

    def add_data(self, data, thresholds):
        seen.append(gc.isenabled())
        real(self, data, thresholds)

    merge_inputs.ManifestFold.add_data = add_data
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert merge_inputs.fold_inputs([str(path)]).count == 1
            assert gc.isenabled() is enabled
            with pytest.raises(ManifestError):
                merge_inputs.fold_inputs([str(path), str(tmp_path / "missing.json")])
            assert gc.isenabled() is enabled
    finally:
        merge_inputs.ManifestFold.add_data = real
        gc.enable()
    assert seen and not any(seen)


def refused(tmp_path, capsys, argv, message):
    out = tmp_path / "never.json"
    assert main(["merge", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("otel-lockwatch: error: "), err
    assert message in err, err
    assert not out.exists() and not list(tmp_path.glob(".never.json*")), "no partial output"


def test_crafted_collector_files_are_refused_in_one_line(logs, tmp_path, capsys):
    """Exit status 2, one line naming the file and line, no traceback, no output file."""
    [record] = records_of([process_manifest(1, [("w", "L", MS)])], logs)
    good = collector_line([record])
    bad = tmp_path / "bad.jsonl"

    bad.write_text(good + "\n" + '{"resourceLogs": [ broken\n')
    refused(tmp_path, capsys, [str(bad)], f"collector file {bad} line 2 is not valid JSON")

    edited = good.replace('\\"acquisitions\\":1', '\\"acquisitions\\":7', 1)
    assert edited != good
    bad.write_text(edited + "\n")
    refused(tmp_path, capsys, [str(bad)], f"collector file {bad} line 1 resourceLogs[0]")
    refused(tmp_path, capsys, [str(bad)], "body was edited: its digest does not match")

    doc = json.loads(good)
    doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["attributes"] = []
    bad.write_text(json.dumps(doc) + "\n")
    refused(tmp_path, capsys, [str(bad)], "lacks the attribute lockwatch.manifest.instance")

    bad.write_text('{"resourceLogs": {"no": "list"}}\n')
    refused(tmp_path, capsys, [str(bad)], "line 1 is not an OTLP logs request")

    bad.write_text(good + "\n")
    refused(tmp_path, capsys, ["--max-bytes", "100", str(bad)], "line 1 is longer than 100 bytes")

    bad.write_text('{"resourceLogs": []}\n')
    refused(tmp_path, capsys, [str(bad)], "nothing to merge")


def test_inputs_that_name_nothing_are_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    refused(tmp_path, capsys, [str(tmp_path / "empty")], "holds no *.json or *.jsonl file")
    refused(tmp_path, capsys, [str(tmp_path / "x*.json")], "matches no file")
    truncated = tmp_path / "m.json"
    truncated.write_text(process_manifest(1, [("w", "L", MS)]).to_json()[:-40])
    refused(tmp_path, capsys, [str(truncated)], f"manifest {truncated} is not valid JSON")


# ---------------------------------------------------------------------------------------------
# The bounded fold


def part(worker: str, wait: int) -> dict:
    return {
        "locks": {
            "L": {
                "kind": "threading.Lock",
                "acquisitions": 1,
                "contentions": 1,
                "skipped": 0,
                "timeouts": 0,
                "wait_ns": evaluate_hist(wait),
                "hold_ns": evaluate_hist(MS),
                "workers": {
                    worker: {"acquisitions": 1, "contentions": 1, "wait_ns": wait, "hold_ns": MS}
                },
            }
        },
        "workers": {worker: {"observed_ns": 10 * wait + MS, "wait_ns": wait}},
    }


def evaluate_hist(value: int):
    from otel_lockwatch.record._histogram import LogHistogram

    return LogHistogram([value])


def test_a_bounded_fold_keeps_the_longest_waits_and_exact_sums_in_any_order():
    """Past ``max_workers`` the longest waits are kept and the rest is one exact row; with one
    worker per part, the result is the same in every order."""
    parts = [part(f"p{i}/w", (i + 1) * MS) for i in range(7)]
    results = set()
    for order in _some_orders(parts):
        fold = DataFold(max_workers=2)
        for p in order:
            fold.add(p)
        merged = fold.result()
        rows = merged["locks"]["L"]["workers"].rows
        assert set(rows) == {"p6/w", "p5/w", OTHER_WORKERS}
        assert rows[OTHER_WORKERS] == (5, 5, 15 * MS, 5 * MS)
        assert sum(r[2] for r in rows.values()) == merged["locks"]["L"]["wait_ns"].sum
        results.add(json.dumps(canonical_json(merged).decode()))
    assert len(results) == 1
    unbounded = DataFold()
    for p in parts:
        unbounded.add(p)
    assert len(unbounded.result()["locks"]["L"]["workers"].rows) == 7


def _some_orders(parts):
    yield parts
    yield list(reversed(parts))
    yield parts[3:] + parts[:3]
    yield parts[1::2] + parts[::2]


def test_the_other_row_is_no_starving_worker():
    """The summed row of a bounded merge is never reported as a starved worker, however much
    the workers in it waited together."""
    manifests = [process_manifest(pid, [("w", "L", 30 * MS)]) for pid in (1, 2)]
    manifests += [process_manifest(pid, [("w", "L", 10 * MS)]) for pid in range(10, 60)]
    merged = merge_manifests(manifests, max_workers=2)
    assert merged.locks["L"]["workers"][OTHER_WORKERS]["wait_ns"] == 500 * MS
    assert all(s["worker"] != OTHER_WORKERS for s in merged.starvation_signatures)


# ---------------------------------------------------------------------------------------------
# A record's attributes: strictly typed, unique, and what its body says


def edited_record(good: str, edit) -> str:
    """``good`` (one line of one record) with ``edit(attributes)`` applied to its attributes."""
    doc = json.loads(good)
    record = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    edit(record["attributes"])
    return json.dumps(doc, separators=(",", ":"))


def attribute(attributes: list, key: str) -> dict:
    return next(a for a in attributes if a["key"] == key)


@pytest.mark.parametrize(
    "value",
    [
        {"intValue": True},
        {"intValue": 1.5},
        {"intValue": 1.0},
        {"intValue": " 1 "},
        {"intValue": "1_0"},
        {"intValue": "+1"},
        {"intValue": "01"},
        {"intValue": "1", "stringValue": "1"},
        {"stringValue": "1"},
        {"intValue": str(2**63)},
    ],
    ids=repr,
)
def test_a_sequence_attribute_that_is_not_an_int_is_refused(logs, tmp_path, capsys, value):
    """An OTLP intValue is an int64 (a JSON integer, or its decimal string as protobuf's JSON
    writes it): a bool, a float, padded or underscored digits are not one (``int()`` takes
    them)."""
    [record] = records_of([process_manifest(1, [("w", "L", MS)])], logs)
    good = collector_line([record])

    def edit(attributes):
        attribute(attributes, "lockwatch.manifest.sequence")["value"] = value

    bad = tmp_path / "bad.jsonl"
    bad.write_text(edited_record(good, edit) + "\n")
    refused(tmp_path, capsys, [str(bad)], f"collector file {bad} line 1 resourceLogs[0]")
    refused(tmp_path, capsys, [str(bad)], "malformed attribute lockwatch.manifest.sequence")


def test_a_sequence_written_as_a_json_integer_is_read(logs, tmp_path):
    """protobuf's JSON mapping reads an int64 from a JSON integer too."""
    [record] = records_of([process_manifest(1, [("w", "L", MS)])], logs)

    def edit(attributes):
        attribute(attributes, "lockwatch.manifest.sequence")["value"] = {"intValue": 1}

    good = tmp_path / "good.jsonl"
    good.write_text(edited_record(collector_line([record]), edit) + "\n")
    assert len(list(read_collector_file(good))) == 1


def test_attributes_that_contradict_the_body_or_repeat_are_refused(logs, tmp_path, capsys):
    """The record's ``final`` attribute is its body's; an attribute key given twice is refused
    (which one would count?)."""
    [record] = records_of([process_manifest(1, [("w", "L", MS)])], logs)
    good = collector_line([record])
    bad = tmp_path / "bad.jsonl"

    def not_final(attributes):
        attribute(attributes, "lockwatch.manifest.final")["value"] = {"boolValue": False}

    bad.write_text(edited_record(good, not_final) + "\n")
    refused(tmp_path, capsys, [str(bad)], "its body and attributes disagree on final")

    def final_twice(attributes):
        attributes.append({"key": "lockwatch.manifest.final", "value": {"boolValue": True}})

    bad.write_text(edited_record(good, final_twice) + "\n")
    refused(tmp_path, capsys, [str(bad)], "has the attribute 'lockwatch.manifest.final' twice")

    def no_final(attributes):
        attributes.remove(attribute(attributes, "lockwatch.manifest.final"))

    bad.write_text(edited_record(good, no_final) + "\n")
    refused(tmp_path, capsys, [str(bad)], "lacks the attribute lockwatch.manifest.final")


# ---------------------------------------------------------------------------------------------
# The output is never an input, now or at the next merge


def test_merge_never_writes_over_an_input(logs, tmp_path, capsys):
    """``merge X.jsonl -o X.jsonl`` replaced the Collector's file by the merged manifest; a
    process's manifest (or a link to it) likewise: refused, the input unchanged."""
    [record] = records_of([process_manifest(1, [("w", "L", MS)])], logs)
    collector = tmp_path / "fleet.jsonl"
    collector.write_text(collector_line([record]) + "\n")
    manifest = dump_manifest(process_manifest(2, [("w", "L", MS)]), tmp_path / "m.json")
    (tmp_path / "link.json").symlink_to(manifest)
    before = {p: p.read_bytes() for p in (collector, manifest)}
    for inputs, output in (
        ([collector], collector),
        ([manifest, collector], manifest),
        ([manifest], tmp_path / "link.json"),
        ([tmp_path / "link.json"], manifest),
        ([str(tmp_path / "m.*")], manifest),
    ):
        assert main(["merge", *map(str, inputs), "-o", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"the output {output} is an input of the merge" in err
    assert {p: p.read_bytes() for p in before} == before


def test_merge_never_reads_its_own_output_back(tmp_path, capsys):
    """An output among the ``*.json`` files of an input directory, or matching an input
    pattern, was read back by the next merge of the same inputs (4 processes counted for 2):
    refused before anything is read; a name the directory's expansion skips is taken."""
    (tmp_path / "d").mkdir()
    for pid in (1, 2):
        dump_manifest(process_manifest(pid, [("w", "L", MS)]), tmp_path / "d" / f"m{pid}.json")
    inside = tmp_path / "d" / "merged.json"
    assert main(["merge", str(tmp_path / "d"), "-o", str(inside)]) == 2
    assert "is in the input directory" in capsys.readouterr().err
    assert (
        main(["merge", str(tmp_path / "d" / "m*.json"), "-o", str(tmp_path / "d" / "m3.json")]) == 2
    )
    assert "matches the input pattern" in capsys.readouterr().err
    assert not list((tmp_path / "d").glob("*3*")) and not inside.exists()
    # Elsewhere, or under a name a merge of the directory does not read: merged twice, the
    # same two processes.
    for output in (tmp_path / "merged.json", tmp_path / "d" / "merged.out"):
        for _ in range(2):
            assert main(["merge", str(tmp_path / "d"), "-o", str(output)]) == 0
            assert load_manifest(output).process["merged"] == 2


# ---------------------------------------------------------------------------------------------
# Memory: a parse bounded by a multiple of its text, and out of memory is one line


# Runs argv[2:] under an address-space limit of argv[1] bytes, its stdout to /dev/null, and
# prints its peak resident memory (KiB, wait4). A small process forks it: the peak of a process
# forked from a large one (pytest) counts the pages it shared before its exec.
LAUNCHER = """
import os, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_limited(argv: list[str], limit: int) -> tuple[int, str, int]:
    """``otel-lockwatch`` run in a subprocess under an address-space limit of ``limit`` bytes:
    its exit status, its stderr and its peak resident memory in bytes (its own)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(limit), sys.executable, "-m", "otel_lockwatch", *argv],
        capture_output=True,
        text=True,
    )
    return done.returncode, done.stderr, int(done.stdout) * 1024


MIB = 1 << 20


def test_a_line_that_would_parse_into_30_times_its_size_is_refused_unparsed(tmp_path):
    """A 60 MB line of ``{},`` (below the 64 MiB line cap) took 1.8 GB and 15 s to parse, and
    under a 1 GiB address-space limit ended in a MemoryError traceback: its estimated cost is
    refused before it is parsed, one line, exit 2, in about twice its size."""
    line = tmp_path / "fleet.jsonl"
    n = 20_000_000
    line.write_bytes(b'{"resourceLogs":[' + b"{}," * (n - 1) + b"{}]}\n")
    size = line.stat().st_size
    status, err, peak = run_limited(["merge", str(line), "-o", str(tmp_path / "o.json")], 1 << 30)
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"collector file {line} line 1 would build about" in err
    assert "more than 12 times its size: refused before it is parsed" in err
    assert peak < 2 * size + 64 * MIB, f"{peak / MIB:.0f} MiB for {size / MIB:.0f} MiB"


def test_out_of_memory_is_one_line_and_exit_2(tmp_path):
    """A manifest whose parse fits its cost but not the process's memory (60 MB of integers
    under a 256 MiB limit): MemoryError was a traceback and exit 1."""
    big = tmp_path / "big.json"
    big.write_bytes(b'{"a": [' + b"1000," * 11_999_999 + b"1000]}")
    status, err, _ = run_limited(["merge", str(big), "-o", str(tmp_path / "o.json")], 256 * MIB)
    assert status == 2, err
    assert err == (
        f"otel-lockwatch: error: manifest {big} cannot be read: out of memory (the process's "
        "memory is limited, or the input is too large for it)\n"
    )
    assert not (tmp_path / "o.json").exists()


def test_what_the_library_writes_costs_well_within_the_bound(logs):
    """A manifest file, a record's body and a Collector's line of it are estimated at 2 to 9
    times their size (the bound is 12): nothing written here is refused for its cost."""
    from otel_lockwatch.manifest._fleet import record_body
    from otel_lockwatch.manifest._io import MAX_EXPANSION, parse_cost

    waits = [(f"w{i % 7}", f"L{i % 50}", (i * 7919 % 1000) * MS) for i in range(2000)]
    manifest = process_manifest(1, waits)
    [record] = records_of([manifest], logs)
    for text in (
        manifest.to_json().encode(),
        record_body(manifest, "a" * 32, 1, True).encode(),
        collector_line([record]).encode(),
    ):
        assert 2 <= parse_cost(text) / len(text) <= 9 < MAX_EXPANSION


def test_a_verdict_attribute_its_body_does_not_give_is_refused(logs, tmp_path, capsys):
    """The verdict attribute is derived from the body's data: one that says otherwise is
    refused, as a manifest file's derived fields are."""
    manifest = process_manifest(1, [("w", "L", MS)])
    [record] = records_of([manifest], logs)
    assert str(manifest.verdict) != "LOW_CONTENTION"

    def calm(attributes):
        attribute(attributes, "lockwatch.verdict")["value"] = {"stringValue": "LOW_CONTENTION"}

    bad = tmp_path / "bad.jsonl"
    bad.write_text(edited_record(collector_line([record]), calm) + "\n")
    refused(tmp_path, capsys, [str(bad)], "its body and attributes disagree on verdict")
