"""``otel-lockwatch`` end to end: ``main([...])`` with real manifest files, each exit status.

Manifests are evaluated from the recorder snapshots in ``tests/data`` and written with
``dump_manifest``, so their digests are real: ``snapshot_billing.json`` gives
CYCLIC_ORDERING_DETECTED with a nominal pool of 16 and a recommended one of 8 (see
``test_report.py`` for its ground truth); ``snapshot_calm.json`` gives LOW_CONTENTION, 4 kept.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_lockwatch._version import __version__
from otel_lockwatch.cli._main import SUBCOMMANDS, main
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import dump_manifest, load_manifest

DATA = Path(__file__).parent / "data"
ANSI = re.compile(r"\x1b\[")
ERROR_LINE = re.compile(r"^otel-lockwatch: error: [^\n]+\n$")


def _manifest(tmp_path: Path, snapshot: str, name: str | None = None) -> Path:
    path = tmp_path / (name or snapshot.replace("snapshot_", "manifest_"))
    dump_manifest(evaluate(json.loads((DATA / snapshot).read_text())), path)
    return path


@pytest.fixture
def billing(tmp_path: Path) -> Path:
    return _manifest(tmp_path, "snapshot_billing.json")


@pytest.fixture
def calm(tmp_path: Path) -> Path:
    return _manifest(tmp_path, "snapshot_calm.json")


def _one_error(capsys: pytest.CaptureFixture[str], rc: int) -> str:
    """Assert a user error: status 2, nothing on stdout, one error line and no traceback."""
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert ERROR_LINE.match(err), err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------------------------
# report


def test_report_prints_the_summary_in_plain_text(billing, capsys, monkeypatch):
    """Under pytest stdout is not a tty: no colour codes, every part of the report present (in
    a terminal wide enough for each on one line)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["report", str(billing)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert not ANSI.search(out)
    assert out.startswith(f"otel-lockwatch contention report: {billing}\n")
    assert re.search(r"^verdict +CYCLIC_ORDERING_DETECTED$", out, re.M)
    assert re.search(r"^pool size +nominal 16 -> recommended 8", out, re.M)
    assert re.search(r"^  config +4\.1 s +93\.1 % +1200 +1\.5 ms ", out, re.M)
    assert "  worker-7 waited 2 s on config (median 300 ms, 6.7x)\n" in out
    assert "  possible circular locking dependency: accounts -> ledger -> accounts\n" in out
    assert re.search(r"^    accounts -> ledger: worker 'worker-3' held accounts", out, re.M)


class _Tty:
    """A stdout that says it is a terminal."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_report_colours_a_tty_unless_no_color(billing, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    assert main(["report", str(billing)]) == 0
    assert "\x1b[1;31mCYCLIC_ORDERING_DETECTED\x1b[0m" in "".join(tty.parts)

    monkeypatch.setenv("NO_COLOR", "1")
    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    assert main(["report", str(billing)]) == 0
    assert not ANSI.search("".join(tty.parts))


def test_report_json_is_sorted_and_matches_the_manifest(billing, capsys):
    assert main(["report", str(billing), "--json"]) == 0
    out, _ = capsys.readouterr()
    data = json.loads(out)
    assert out == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    manifest = load_manifest(billing).to_dict()
    assert data["verdict"] == manifest["verdict"] == "CYCLIC_ORDERING_DETECTED"
    assert data["recommended_pool_size"] == 8
    assert data["manifest_digest"] == manifest["manifest_digest"]
    assert [h["lock"] for h in data["hot_locks"]] == ["config"]
    assert [c["cycle"] for c in data["cycles"]] == [["accounts", "ledger"]]


def test_report_writes_html_and_dot(billing, tmp_path, capsys):
    page, dot = tmp_path / "r.html", tmp_path / "g.dot"
    assert main(["report", str(billing), "--html", str(page), "--dot", str(dot), "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # stdout stays pure JSON; the notes go to stderr
    assert err == (
        f"otel-lockwatch: wrote the HTML report to {page}\n"
        f"otel-lockwatch: wrote the lock-order graph to {dot}\n"
    )
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert 'id="wait-share-chart"' in html and 'class="hold-chart"' in html
    assert html.count('class="edge cycle"') == 2
    text = dot.read_text()
    assert text.startswith("digraph lock_order {\n")
    assert '  n1 [label="ledger", color="#c62828", penwidth=2];\n' in text
    assert '  n1 -> n0 [label="worker-5", color="#c62828"' in text
    assert sorted(os.listdir(tmp_path)) == sorted(["manifest_billing.json", "r.html", "g.dot"])


def test_report_to_an_unwritable_place_is_one_error_and_no_file(billing, tmp_path, capsys):
    missing = tmp_path / "no-such-dir" / "r.html"
    dot = tmp_path / "g.dot"
    rc = main(["report", str(billing), "--html", str(missing), "--dot", str(dot)])
    err = _one_error(capsys, rc)
    assert err == (
        f"otel-lockwatch: error: cannot write the HTML report to {missing}: "
        "No such file or directory\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["manifest_billing.json"]


def test_report_of_a_missing_manifest(tmp_path, capsys):
    rc = main(["report", str(tmp_path / "nope.json")])
    err = _one_error(capsys, rc)
    assert err == f"otel-lockwatch: error: manifest {tmp_path / 'nope.json'} does not exist\n"


def test_report_of_invalid_json(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    err = _one_error(capsys, main(["report", str(bad)]))
    assert err.startswith(f"otel-lockwatch: error: manifest {bad} is not valid JSON: ")


def test_report_of_an_edited_manifest(billing, capsys):
    """A manifest whose content no longer matches its digest is refused (exit 2)."""
    doc = json.loads(billing.read_text())
    doc["recommended_pool_size"] = 16  # someone "fixes" the pool size by hand
    billing.write_text(json.dumps(doc, sort_keys=True, indent=2))
    err = _one_error(capsys, main(["report", str(billing)]))
    assert err == (
        f"otel-lockwatch: error: manifest {billing} was edited: "
        "its manifest_digest does not match its content\n"
    )


# --------------------------------------------------------------------------------------------
# check


@pytest.mark.parametrize("n", [1, 8])
def test_check_admissible_exits_0(billing, capsys, n):
    assert main(["check", str(billing), "--pool-size", str(n)]) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"POOL_SIZE_ADMISSIBLE: Requested {n} is within recommended 8 "
        "(measured: config supports 7.11 workers; verdict CYCLIC_ORDERING_DETECTED).\n"
    )
    assert err == ""


def test_check_violation_exits_1(billing, capsys):
    assert main(["check", str(billing), "-p", "16"]) == 1
    out, err = capsys.readouterr()
    assert out == (
        "POOL_SIZE_VIOLATION: Requested 16 exceeds recommended 8 "
        "(measured: config supports 7.11 workers; verdict CYCLIC_ORDERING_DETECTED).\n"
    )
    assert err == ""


def test_check_calm_pool_keeps_its_size(calm, capsys):
    assert main(["check", str(calm), "-p", "4"]) == 0
    assert main(["check", str(calm), "-p", "5"]) == 1
    out, _ = capsys.readouterr()
    assert out.splitlines()[1].startswith("POOL_SIZE_VIOLATION: Requested 5 exceeds recommended 4")


def test_check_missing_or_edited_manifest_exits_2(billing, tmp_path, capsys):
    err = _one_error(capsys, main(["check", str(tmp_path / "gone.json"), "-p", "4"]))
    assert "does not exist" in err
    doc = json.loads(billing.read_text())
    doc["verdict"] = "LOW_CONTENTION"
    billing.write_text(json.dumps(doc))
    err = _one_error(capsys, main(["check", str(billing), "-p", "4"]))
    assert "was edited" in err


def test_check_of_another_schema_exits_2(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else/2"}))
    err = _one_error(capsys, main(["check", str(other), "-p", "4"]))
    assert err == (
        f"otel-lockwatch: error: manifest {other} has schema 'something/else/2', "
        "expected 'otel-lockwatch/manifest/4'\n"
    )


@pytest.mark.parametrize("bad", ["0", "-3", "four", "2.5"])
def test_check_pool_size_must_be_a_positive_int(billing, capsys, bad):
    err = _one_error(capsys, main(["check", str(billing), f"--pool-size={bad}"]))
    assert err == (
        f"otel-lockwatch: error: argument -p/--pool-size: must be a positive integer, "
        f"got {bad!r} (see 'otel-lockwatch check --help')\n"
    )


def test_check_without_pool_size(billing, capsys):
    err = _one_error(capsys, main(["check", str(billing)]))
    assert "the following arguments are required: -p/--pool-size" in err


# --------------------------------------------------------------------------------------------
# merge


def test_merge_combines_processes_and_writes_a_loadable_manifest(billing, calm, tmp_path, capsys):
    out_path = tmp_path / "merged.json"
    assert main(["merge", str(billing), str(calm), "-o", str(out_path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    merged = load_manifest(out_path).to_dict()  # the digest is real
    assert merged["verdict"] == "CYCLIC_ORDERING_DETECTED"
    assert merged["process"]["pids"] == [4242, 5151]
    assert set(merged["locks"]) == {"config", "accounts", "ledger", "metrics", "emitter", "cache"}
    assert out == (
        f"merged 2 manifests into {out_path}: verdict CYCLIC_ORDERING_DETECTED, 2 processes, "
        f"6 locks, recommended pool size {merged['recommended_pool_size']}\n"
    )
    # The merged manifest reads back through report and check like any other.
    assert main(["report", str(out_path)]) == 0
    assert "merged from 2 processes (pids 4242, 5151)" in capsys.readouterr().out


def test_merge_refuses_an_edited_input_and_writes_nothing(billing, calm, tmp_path, capsys):
    doc = json.loads(calm.read_text())
    doc["nominal_pool_size"] = 64
    calm.write_text(json.dumps(doc))
    out_path = tmp_path / "merged.json"
    err = _one_error(capsys, main(["merge", str(billing), str(calm), "-o", str(out_path)]))
    assert f"manifest {calm} was edited" in err
    assert not out_path.exists()


def test_merge_to_an_unwritable_place(billing, tmp_path, capsys):
    target = tmp_path / "missing" / "merged.json"
    err = _one_error(capsys, main(["merge", str(billing), "-o", str(target)]))
    assert err == (
        f"otel-lockwatch: error: cannot write the manifest to {target}: No such file or directory\n"
    )


def test_merge_needs_an_output(billing, capsys):
    err = _one_error(capsys, main(["merge", str(billing)]))
    assert "the following arguments are required: -o/--output" in err


# --------------------------------------------------------------------------------------------
# The command itself


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"otel-lockwatch {__version__}\n"


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["demo", "--help"], ["run", "-h"], ["report", "--help"], ["check", "-h"],
     ["merge", "-h"]],
)  # fmt: skip
def test_help_on_every_subcommand(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: otel-lockwatch")
    if argv == ["--help"]:
        for command in SUBCOMMANDS:
            assert f"    {command.name}" in out
        assert "Exit status: 0 success" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND (see 'otel-lockwatch --help')"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        (["report"], "the following arguments are required: MANIFEST"),
        (["report", "m.json", "--colour"], "unrecognized arguments: --colour"),
        (["demo", "--workers", "0"], "argument -w/--workers: must be a positive integer, got '0'"),
        (["demo", "-s", "nan"], "argument -s/--seconds: must be a positive number, got 'nan'"),
        (["demo", "--seconds", "-1"], "argument -s/--seconds: must be a positive number, got '-1'"),
        (["demo", "-w", "3"], "argument -w/--workers: the demo needs at least 4 workers"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(capsys, argv, message):
    err = _one_error(capsys, main(argv))
    assert message in err


def test_python_dash_m_runs_the_command(billing):
    """``python -m otel_lockwatch`` is the same command, with the same exit statuses."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "otel_lockwatch", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    ok = run("check", str(billing), "-p", "8")
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout.startswith("POOL_SIZE_ADMISSIBLE: ")
    violation = run("check", str(billing), "-p", "9")
    assert violation.returncode == 1
    missing = run("report", str(billing) + ".missing")
    assert missing.returncode == 2
    assert ERROR_LINE.match(missing.stderr) and missing.stdout == ""


def test_merge_of_a_merged_manifest_counts_processes_not_files(billing, calm, tmp_path, capsys):
    """Merging (billing + calm) with another process counts three processes from two files."""
    first = tmp_path / "first.json"
    assert main(["merge", str(billing), str(calm), "-o", str(first)]) == 0
    third = tmp_path / "third.json"
    doc = json.loads((DATA / "snapshot_calm.json").read_text())
    doc["process"]["pid"] = 6161
    dump_manifest(evaluate(doc), third)
    capsys.readouterr()
    final = tmp_path / "final.json"
    assert main(["merge", str(first), str(third), "-o", str(final)]) == 0
    out, _ = capsys.readouterr()
    assert f"merged 2 manifests into {final}: verdict CYCLIC_ORDERING_DETECTED, 3 processes" in out
    assert load_manifest(final).to_dict()["process"]["pids"] == [4242, 5151, 6161]


def test_a_closed_pipe_ends_quietly(billing, monkeypatch, capsys):
    """``otel-lockwatch report m.json | head -1``: the reader goes away; no traceback, 141."""

    class ClosedPipe:
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["report", str(billing)]) == 141
    assert capsys.readouterr().err == ""
