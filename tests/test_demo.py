"""``otel-lockwatch demo`` and ``otel-lockwatch run`` end to end: ``main([...])`` with ``tmp_path``
and ``capsys``, real manifests read back with ``load_manifest``.

The demo's workload is built so that each finding is caused, not hoped for: ``global_config``
is held 1 ms by every publish (hot), the reporter waits behind 20 ms holds of ``stats_snapshot``
while the compactor that holds them never waits (starved: 5x a median of 0), and the compactor
and publisher-03 take ``accounts`` and ``ledger`` in opposite orders, one after the other
(a cycle, no deadlock). The verdict follows from the precedence cycle > starvation > hot.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_lockwatch import LockwatchInstrumentor, load_manifest
from otel_lockwatch._session import RECORDER
from otel_lockwatch.cli import _demo, _report_text, _run
from otel_lockwatch.cli._main import main

ANSI = re.compile(r"\x1b\[")
ERROR_LINE = re.compile(r"^otel-lockwatch: error: [^\n]+\n$")
#: The shared demo run's workers: the sweeper, the reporter, the compactor and two publishers.
#: Two, not one: with a single publisher, ``global_config``'s waits are its collisions with the
#: sweeper, which publishes only between sweeps, and a sweep slowed down (a loaded machine, the
#: pure-Python path) left too few of them to outweigh the reporter's waits on
#: ``stats_snapshot`` (80.9 ms, on the free-threaded build's pure-Python path, December 2026);
#: two publishers collide whatever the sweeper does.
DEMO_WORKERS = 5
#: Who takes ``global_config`` and the sections in that run: the sweeper and the publishers.
DEMO_PUBLISHERS = {"sweeper", "publisher-03", "publisher-04"}
#: How long that run lasts. Three seconds, not one: once (the free-threaded build's pure-Python
#: path, in a whole run, December 2026) every thread of a 1 s run crawled for the whole second
#: (101 acquisitions of global_config and 22 of stats_snapshot, against about 800 and 57), so
#: that the reporter's sleep-bound waits outweighed the publishers' collisions. The cause was
#: not found (a whole run of that leg showed the demo's process clean: one thread, the GIL off;
#: this machine's virtual CPUs are stolen by their host now and then). A stall must now last
#: most of three seconds to turn a finding.
#: The tests that read it are marked ``alone``: a free-threaded leg runs them after the rest,
#: serially. Beside the other xdist worker's tests there, the run crawled for its whole 3 s
#: (298 and 368 acquisitions of ``global_config`` against about 2,400: as if each of the
#: publishers' 1 ms and 0.5 ms sleeps returned about 10 ms late, which the compactor's 20 ms holds
#: barely feel), so that the reporter's waits on them (18.7 and 17.5 ms each) outweighed the
#: publishers' collisions: two quiet legs in a row at ``2909a0f``, December 2026. The demo's
#: findings are about its threads' timing, which a busy neighbour rewrites on that build.
DEMO_SECONDS = 3


def _one_error(capsys: pytest.CaptureFixture[str], rc: int) -> str:
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert ERROR_LINE.match(err), err
    assert "Traceback" not in err
    return err


@pytest.fixture
def no_otlp(monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------------------------
# demo


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One demo run (DEMO_WORKERS workers, DEMO_SECONDS) shared by the tests that read it."""
    saved = {
        v: os.environ.pop(v, None) for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME")
    }
    path = tmp_path_factory.mktemp("demo") / "manifest.json"
    out, err = io.StringIO(), io.StringIO()
    saved_streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = main(
            ["demo", "--workers", str(DEMO_WORKERS), "--seconds", str(DEMO_SECONDS)]
            + ["--manifest", str(path)]
        )
    finally:
        sys.stdout, sys.stderr = saved_streams
        for var, value in saved.items():
            if value is not None:
                os.environ[var] = value
    return rc, path, out.getvalue(), err.getvalue()


@pytest.mark.alone
def test_demo_exits_0_and_its_manifest_loads_back_with_the_verdict(demo_run):
    """A lock-order cycle outranks starvation, which outranks a hot lock."""
    rc, path, out, err = demo_run
    assert rc == 0, err
    doc = load_manifest(path).to_dict()
    assert doc["verdict"] == "CYCLIC_ORDERING_DETECTED"
    assert doc["nominal_pool_size"] == DEMO_WORKERS
    assert doc["pool_size_source"] == "executor"
    # The size is the measured one: all the workers, or what global_config supports when its waits
    # cost the workers 10 % of their time (it is the only lock they queue on).
    sizing = doc["sizing"]
    assert sizing["basis"] == "measured"
    assert [b["name"] for b in sizing["bottlenecks"]] in ([], ["global_config"])
    if sizing["bottlenecks"]:
        supported = sizing["workers_supported"]
        assert doc["recommended_pool_size"] == min(DEMO_WORKERS, math.ceil(supported * 1.1 - 1e-9))
    else:
        assert doc["recommended_pool_size"] == DEMO_WORKERS
    assert doc["process"]["service.name"] == "otel-lockwatch-demo"


@pytest.mark.alone
def test_demo_global_config_is_the_most_waited_on_lock(demo_run):
    """It is also hot when its waits cost the workers a material share of their time (at 5
    workers for 1 s, 25-27 % in five runs on 3.11, 1.27-1.32 s of waits against 107-124 ms on
    ``stats_snapshot``; with one publisher it was about 9 %, hot in some runs only)."""
    doc = load_manifest(demo_run[1]).to_dict()
    waits = {name: lock["wait_ms_total"] for name, lock in doc["locks"].items()}
    # What a failure shows (it failed once on the free-threaded build's pure-Python path in a
    # whole run with no wait on any lock but stats_snapshot): each lock's counts and workers, the
    # window's yields (taken without a wait), the run's own counts.
    said = json.dumps(
        {
            "locks": {
                name: [lock["acquisitions"], lock["contentions"], lock["wait_ms_total"]]
                + [sorted(lock["workers"])]
                for name, lock in doc["locks"].items()
            },
            "window_yields": RECORDER.window_yields,
            "out": demo_run[2][-600:],
        },
        sort_keys=True,
    )
    assert max(waits, key=waits.__getitem__) == "global_config", said
    observed = sum(w["observed_ns"] for w in doc["workers"].values()) / 1e6
    hot = [h["lock"] for h in doc["hot_lock_register"]]
    assert hot == (["global_config"] if waits["global_config"] >= 0.1 * observed else []), hot
    assert doc["locks"]["global_config"]["workers"].keys() == DEMO_PUBLISHERS
    assert ("global_config" in doc["hold_time_distribution"]) == bool(hot)


@pytest.mark.alone
def test_demo_the_reporter_starves_on_stats_snapshot(demo_run):
    doc = load_manifest(demo_run[1]).to_dict()
    starved = {(s["worker"], s["lock"]) for s in doc["starvation_signatures"]}
    assert ("reporter", "stats_snapshot") in starved
    assert {w for w, _ in starved} == {"reporter"}, starved


def _demo_site(function: str, code: str) -> str:
    """``lockwatch_demo:function:line`` of the workload's line holding ``code``."""
    source = Path(_demo.__file__).with_name("_demo_workload.py").read_text().splitlines()
    (line,) = [i for i, text in enumerate(source, 1) if code in text]
    return f"lockwatch_demo:{function}:{line}"


def _top(points: dict) -> str:
    """The site with the most wait of a contention or contending points table."""
    return max(
        points, key=lambda s: points[s]["sum"] if "sum" in points[s] else points[s]["wait_ns"]
    )


@pytest.mark.alone
def test_demo_global_config_points_name_the_publishers_waiting_and_holding_site(demo_run):
    """Who waits for the hot lock, and who held it meanwhile: the publishers' re-read of the
    configuration, on both sides, with most of the wait."""
    lock = load_manifest(demo_run[1]).to_dict()["locks"]["global_config"]
    site = _demo_site("publish_event", "with self.config_lock:")
    waits, holds = lock["contention_points"], lock["contending_points"]
    assert _top(waits) == site and _top(holds) == site
    assert waits[site]["sum"] > 0.5 * lock["wait_ns"]["sum"]
    assert holds[site]["wait_ns"] > 0.5 * lock["wait_ns"]["sum"]


@pytest.mark.alone
def test_demo_the_starved_reporters_wait_names_the_compactors_hold(demo_run):
    """The reporter waits at its snapshot, and the site that held ``stats_snapshot`` meanwhile
    is the compactor's long hold; the report says both."""
    lock = load_manifest(demo_run[1]).to_dict()["locks"]["stats_snapshot"]
    reporter = _demo_site("reporter", 'with self._task("snapshot"), self.stats_lock:')
    compactor = _demo_site("compactor", 'with self._task("compact"), self.stats_lock:')
    assert _top(lock["contention_points"]) == reporter
    assert _top(lock["contending_points"]) == compactor
    out = demo_run[2]
    section = out[out.index("\ncontention points") : out.index("\nlocks (most waited-on first)")]
    assert reporter in section and compactor in section


@pytest.mark.alone
def test_demo_html_report_shows_the_points_and_the_timeline(demo_run, tmp_path, capsys):
    html_path = tmp_path / "r.html"
    assert main(["report", "--html", str(html_path), str(demo_run[1])]) == 0
    capsys.readouterr()
    page = html_path.read_text()
    assert '<div class="points" data-lock="global_config">' in page
    assert '<svg id="timeline-chart"' in page and 'data-lock="global_config"' in page


@pytest.mark.alone
def test_demo_the_accounts_ledger_cycle_has_its_witnesses(demo_run):
    doc = load_manifest(demo_run[1]).to_dict()
    (cycle,) = doc["pre_deadlock_ordering_witness"]
    assert sorted(cycle["cycle"]) == ["accounts", "ledger"]
    edges = {(e["holding"], e["acquiring"]): e for e in cycle["edges"]}
    assert edges[("accounts", "ledger")]["worker"] == "compactor"
    assert edges[("ledger", "accounts")]["worker"] == "publisher-03"
    for edge in edges.values():
        holding_site, acquiring_site = edge["sites"]
        assert holding_site.startswith("lockwatch_demo:") and acquiring_site.startswith(
            "lockwatch_demo:"
        )
        assert holding_site != acquiring_site  # nested `with`, one line each


@pytest.mark.alone
def test_demo_sections_serialize_publishes_and_the_subscriber_never_regresses(demo_run):
    rc, path, out, _ = demo_run
    doc = load_manifest(path).to_dict()
    assert doc["sections"]["entity_sections"]["count"] == 64
    entity = doc["locks"]["entity_sections"]
    assert entity["kind"] == "section"
    assert entity["acquisitions"] > 0
    assert set(entity["workers"]) == DEMO_PUBLISHERS
    (subscriber,) = [line for line in out.splitlines() if line.startswith("  subscriber")]
    assert re.search(r"sends received for 256 entities, 0 regressions ", subscriber), subscriber
    assert re.search(r"^  sweeper +\d+ sweeps of 256 entities with try_lock", out, re.M)


@pytest.mark.alone
def test_demo_reports_its_connection_pool(demo_run):
    """Two users of a LifoQueue of two connections: a resource pool that never runs dry, listed
    with what its capacity supports, and no finding of its own."""
    rc, path, out, _ = demo_run
    doc = load_manifest(path).to_dict()
    (pool,) = doc["resource_pools"]
    assert (pool["name"], pool["kind"], pool["capacity"]) == ("connections", "queue.LifoQueue", 2)
    assert pool["waits"]["count"] == 0 and not pool["hot"]
    # (An idle wait may be listed: publisher-03 waits for the compactor's first reconcile on an
    # Event, which blocks when it gets there first, as under load; never one of the pool's.)
    assert [w for w in doc["idle_waits"] if w["name"] == "connections"] == []
    assert pool["checkouts"] > 0 and pool["hold"]["count"] > 0
    assert pool["workers_supported"] >= 2
    assert re.search(r"^resource pools\n  pool +kind", out, re.M)
    # Its mutex is the queue's own, never watched: no row of zeros in the locks table.
    table = out[out.index("\nlocks (most waited-on first)\n") :].split("\n\n")[0]
    never = table.splitlines()[-1]  # (the ordering Event's too, when publisher-03 waited on it)
    assert never.startswith("  never taken as a mutex: ")
    assert "connections" in never.removeprefix("  never taken as a mutex: ").split(", ")
    assert "  connections " not in table


@pytest.mark.alone
def test_demo_prints_the_report_exactly_as_report_does(demo_run, capsys):
    rc, path, out, _ = demo_run
    assert "CYCLIC_ORDERING_DETECTED" in out
    assert main(["report", str(path)]) == 0
    report = capsys.readouterr().out
    assert out.endswith("\n" + report)
    assert report == _report_text.render_text(load_manifest(path).to_dict(), source=str(path))


@pytest.mark.alone
def test_demo_output_is_plain_text_when_not_a_tty(demo_run):
    """No colour, no progress animation: start, the live cycle finding, and the end."""
    _, path, out, err = demo_run
    assert not ANSI.search(out) and not ANSI.search(err) and "\r" not in err
    assert err.splitlines() == [
        f"otel-lockwatch demo: {DEMO_WORKERS} workers for {DEMO_SECONDS} s "
        f"(the manifest goes to {path})",
        "  otel-lockwatch: possible circular locking dependency: accounts -> ledger -> accounts",
        err.splitlines()[-1],
    ]
    assert re.match(r"^otel-lockwatch demo: done in \d+\.\d s$", err.splitlines()[-1])
    assert "OTLP" not in err  # no endpoint: nothing said about exporters


@pytest.mark.alone
def test_demo_undoes_its_instrumentation(demo_run):
    """Other tests in this process must see plain locks and an empty recorder."""
    assert not LockwatchInstrumentor().is_instrumented_by_opentelemetry
    assert type(threading.Lock()).__module__ == "_thread"
    assert RECORDER.snapshot()["locks"] == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2"], "argument -w/--workers: the demo needs at least 4 workers (a "
         "sweeper, a reporter, a compactor and a publisher), got 2"),
        (["--manifest", "/nonexistent-dir/m.json"],
         "cannot write the manifest to /nonexistent-dir/m.json: no directory /nonexistent-dir"),
    ],
)  # fmt: skip
def test_demo_user_errors_before_any_work(capsys, no_otlp, argv, message):
    err = _one_error(capsys, main(["demo", *argv]))
    assert err == f"otel-lockwatch: error: {message}\n"


def test_demo_unknown_otlp_protocol(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    err = _one_error(capsys, main(["demo", "--manifest", str(tmp_path / "m.json")]))
    assert err == (
        "otel-lockwatch: error: OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, "
        "got 'carrier-pigeon'\n"
    )
    assert not (tmp_path / "m.json").exists()


def test_demo_grpc_without_its_extra_is_one_line(tmp_path):
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc where the gRPC exporter is not installed (the ``grpc``
    extra): one line naming the extra, exit 2, no manifest. A real process whose import of the
    gRPC exporter fails as it does when the package is absent."""
    manifest = tmp_path / "m.json"
    script = (
        "import sys\n"
        "sys.modules['opentelemetry.exporter.otlp.proto.grpc'] = None  # not installed\n"
        "from otel_lockwatch.cli._main import main\n"
        f"sys.exit(main(['demo', '--manifest', {str(manifest)!r}]))\n"
    )
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "otel-lockwatch: error: OTEL_EXPORTER_OTLP_PROTOCOL is grpc, which needs the grpc "
        "extra: pip install 'otel-lockwatch[grpc]'\n"
    )
    assert not manifest.exists()


class _Collector(BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP receiver: keeps every request body by path."""

    received: dict[str, list[bytes]] = {}

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_demo_exports_traces_and_metrics_over_otlp_http(tmp_path, monkeypatch, capsys):
    """With an endpoint, the spans (lock.wait, lockwatch.manifest) and the metrics reach it,
    over HTTP/protobuf when no protocol is set (the specification's default, and the exporter
    the package depends on)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    _Collector.received = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "demo-under-test")
    try:
        rc = main(["demo", "-w", "4", "-s", "0.5", "--manifest", str(tmp_path / "m.json")])
    finally:
        server.shutdown()
        server.server_close()
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"exporting traces and metrics over OTLP to {endpoint} (http/protobuf)" in err
    spans = set()
    services = set()
    for body in _Collector.received.get("/v1/traces", []):
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            services |= {
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            }
            spans |= {s.name for ss in rs.scope_spans for s in ss.spans}
    assert {"lock.wait", "lockwatch.manifest"} <= spans
    assert services == {"demo-under-test"}
    metrics = set()
    for body in _Collector.received.get("/v1/metrics", []):
        request = ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            metrics |= {m.name for sm in rm.scope_metrics for m in sm.metrics}
    assert any(name.startswith("lockwatch.") for name in metrics), metrics
    assert load_manifest(tmp_path / "m.json").to_dict()["process"]["service.name"] == (
        "demo-under-test"
    )


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_tty_and_silent_otherwise():
    counts = {"published": 1234, "sweeps": 5, "snapshots": 7, "regressions": 0}
    tty = _Tty()
    progress = _demo.Progress(tty, 2.0)
    progress.update(1.0, counts)
    assert tty.getvalue() == (
        "\r\x1b[K  [############------------]  1.0/2 s  events 1,234  sweeps 5  snapshots 7"
        "  regressions 0"
    )
    progress.line("a finding")
    assert tty.getvalue().endswith("regressions 0\r\x1b[Ka finding\n")
    progress.update(2.5, counts)
    progress.clear()
    assert tty.getvalue().endswith("\r\x1b[K")
    plain = io.StringIO()
    quiet = _demo.Progress(plain, 2.0)
    quiet.update(1.0, counts)
    quiet.clear()
    quiet.line("a finding")
    assert plain.getvalue() == "a finding\n"


# --------------------------------------------------------------------------------------------
# run

CONTENDED = textwrap.dedent(
    """\
    import threading, time
    from concurrent.futures import ThreadPoolExecutor

    shared = threading.Lock()


    def work(i):
        for _ in range(10):
            with shared:
                time.sleep(0.002)  # hold


    with ThreadPoolExecutor(max_workers=4) as executor:
        list(executor.map(work, range(4)))
    print("script done")
    raise SystemExit({status})
    """
)
#: The lock class of ``shared`` above: created at line 4 of the script's module.
SHARED = "__main__:<module>:4"


def _script(tmp_path: Path, status: int = 0) -> Path:
    script = tmp_path / "app.py"
    script.write_text(CONTENDED.format(status=status))
    return script


def test_run_prints_the_report_of_the_manifest_the_program_left(tmp_path, capsys, no_otlp):
    manifest = tmp_path / "m.json"
    rc = main(["run", "--manifest", str(manifest), "--", sys.executable, str(_script(tmp_path))])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = load_manifest(manifest).to_dict()
    lock = doc["locks"][SHARED]
    assert lock["kind"] == "threading.Lock"
    assert lock["acquisitions"] == 40
    assert lock["contentions"] > 0
    assert doc["nominal_pool_size"] == 4 and doc["pool_size_source"] == "executor"
    assert doc["process"]["service.name"] == "app"
    assert out == "\n" + _report_text.render_text(doc, source=str(manifest))
    assert not ANSI.search(out)


def test_run_exits_with_the_program_status(tmp_path, capsys, no_otlp, monkeypatch):
    """The manifest is written on the way out of a failing program too; the temporary one is
    removed."""
    monkeypatch.setenv("COLUMNS", "1000")  # the report's title on one line
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("otel-lockwatch-run-*"))
    rc = main(["run", sys.executable, str(_script(tmp_path, status=3))])
    out, err = capsys.readouterr()
    assert rc == 3, err
    assert f"contention report: {sys.executable} {tmp_path / 'app.py'}\n" in out
    assert SHARED in out
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("otel-lockwatch-run-*")) == before


@pytest.mark.parametrize("argv", [[], ["--"], ["--manifest", "m.json", "--"]])
def test_run_without_a_program(capsys, argv):
    err = _one_error(capsys, main(["run", *argv]))
    assert err == (
        "otel-lockwatch: error: no program to run "
        "(usage: otel-lockwatch run [--manifest PATH] -- python app.py ...)\n"
    )


def test_run_of_a_program_that_does_not_exist(capsys):
    err = _one_error(capsys, main(["run", "--", "no-such-program-lockwatch"]))
    assert err == (
        "otel-lockwatch: error: program 'no-such-program-lockwatch' not found (or not executable)\n"
    )


def test_run_of_a_program_that_leaves_no_manifest(tmp_path, capsys, no_otlp):
    """``python -S`` skips sitecustomize, so lockwatch never starts: exit 2, one line, and a
    stale manifest at the path is not taken for this run's."""
    stale = tmp_path / "m.json"
    stale.write_text("{}")
    rc = main(["run", "-m", str(stale), "--", sys.executable, "-S", "-c", "pass"])
    err = _one_error(capsys, rc)
    assert err == (
        f"otel-lockwatch: error: {sys.executable} -S -c pass exited with status 0 and left no "
        "manifest (is it a Python program whose Python has otel-lockwatch installed?)\n"
    )


def test_run_refuses_when_lockwatch_is_disabled(capsys, monkeypatch):
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "redis, lockwatch")
    err = _one_error(capsys, main(["run", "--", sys.executable, "-c", "pass"]))
    assert err == (
        "otel-lockwatch: error: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS='redis, lockwatch' "
        "disables lockwatch\n"
    )


WAITS_FOR_SIGTERM = textwrap.dedent(
    """\
    import sys, threading, time
    lock = threading.Lock()
    with lock:
        pass
    open(sys.argv[1], "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)  # ok: the child idles until the test signals it
    """
)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_run_forwards_sigterm_and_reports_what_was_written(tmp_path, capsys, no_otlp):
    """SIGTERM to ``run`` reaches the program, whose lockwatch writes the manifest before it
    dies of SIGTERM; ``run`` reports it and exits 128 + 15."""
    script = tmp_path / "wait.py"
    script.write_text(WAITS_FOR_SIGTERM)
    ready = tmp_path / "ready"
    manifest = tmp_path / "m.json"

    def terminate_when_ready() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # ok: polling with a deadline
        os.kill(os.getpid(), signal.SIGTERM)

    # If forwarding were broken, SIGTERM must not end the test process itself.
    fallback = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        killer = threading.Thread(target=terminate_when_ready, daemon=True)
        killer.start()
        rc = main(["run", "-m", str(manifest), "--", sys.executable, str(script), str(ready)])
        killer.join(5)
    finally:
        restored = signal.signal(signal.SIGTERM, fallback)
    out, err = capsys.readouterr()
    assert rc == 128 + signal.SIGTERM, err
    assert "__main__:<module>:2" in load_manifest(manifest).to_dict()["locks"]
    assert "contention report" in out
    assert getattr(restored, "__name__", None) == "<lambda>"  # run put our handler back


def test_child_environment():
    base = {"PATH": "/bin", "OTEL_LOGS_EXPORTER": "console"}
    env = _run.child_environment(base, "/tmp/m.json", ["python3", "-u", "app.py"])
    assert env["OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH"] == "/tmp/m.json"
    assert env["OTEL_PYTHON_LOCKWATCH_MANIFEST"] == "true"
    assert (env["OTEL_TRACES_EXPORTER"], env["OTEL_METRICS_EXPORTER"]) == ("none", "none")
    assert env["OTEL_LOGS_EXPORTER"] == "console"  # the user's choice stays
    assert env["OTEL_SERVICE_NAME"] == "app"
    assert base == {"PATH": "/bin", "OTEL_LOGS_EXPORTER": "console"}  # not modified
    otlp = _run.child_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SERVICE_NAME": "billing"},
        "/tmp/m.json",
        ["./serve"],
    )
    assert [otlp[f"OTEL_{s}_EXPORTER"] for s in ("TRACES", "METRICS", "LOGS")] == ["otlp"] * 3
    # The package's own exporter (the distro would pick grpc, an extra), unless the user chose.
    assert otlp["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in env
    chosen = _run.child_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        "/tmp/m.json",
        ["./serve"],
    )
    assert chosen["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert otlp["OTEL_SERVICE_NAME"] == "billing"


@pytest.mark.parametrize(
    ("program", "name"),
    [
        (["python", "app.py", "--jobs", "8"], "app"),
        (["/usr/bin/python3.11", "-X", "dev", "-m", "pkg.worker"], "pkg.worker"),
        (["python3", "-c", "pass"], "python3"),
        (["./bin/serve", "--port", "8000"], "serve"),
    ],
)
def test_program_name(program, name):
    assert _run.program_name(program) == name
