"""`opentelemetry-instrument` loads lockwatch with no code change (a real subprocess)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_lockwatch import load_manifest

SCRIPT = textwrap.dedent(
    """
    import threading, time
    from concurrent.futures import ThreadPoolExecutor
    from opentelemetry import trace

    tracer = trace.get_tracer("app")
    shared = threading.Lock()

    def task(i):
        with tracer.start_as_current_span("task"):
            for _ in range(25):
                with shared:
                    time.sleep(0.002)  # hold: make the other workers wait

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(task, range(4)))
    print("done")
    """
)


def instrument_command() -> list[str]:
    # This interpreter's own first: a leg run without its venv on the PATH (the matrix's) found
    # another Python's, which cannot import this checkout.
    own = Path(sys.executable).parent / "opentelemetry-instrument"
    exe = str(own) if own.exists() else shutil.which("opentelemetry-instrument") or str(own)
    if not os.path.exists(exe):
        pytest.fail(
            "opentelemetry-instrument is missing (it comes with opentelemetry-instrumentation)"
        )
    return [exe]


def run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    manifest = tmp_path / "manifest.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(
        OTEL_SERVICE_NAME="auto-app",
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="console",
        OTEL_LOGS_EXPORTER="none",
        OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH=str(manifest),
    )
    environ.update(env)
    proc = subprocess.run(
        instrument_command() + [sys.executable, str(script)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, manifest


def console_objects(stdout: str) -> list[dict]:
    """The JSON objects the console exporters print (one pretty-printed object after another)."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    while True:
        start = stdout.find("{", i)
        if start < 0:
            return out
        try:
            obj, end = decoder.raw_decode(stdout, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        out.append(obj)
        i = end


def test_opentelemetry_instrument_loads_lockwatch(tmp_path):
    proc, manifest_path = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    objects = console_objects(proc.stdout)
    spans = [o for o in objects if "context" in o and "name" in o]
    waits = [s for s in spans if s["name"] == "lock.wait"]
    tasks = {s["context"]["span_id"]: s for s in spans if s["name"] == "task"}
    assert waits, proc.stdout[-2000:]
    for wait in waits:
        assert wait["attributes"]["lockwatch.lock.name"] == "__main__:<module>:7"
        assert wait["attributes"]["lockwatch.lock.kind"] == "threading.Lock"
        assert wait["parent_id"] in tasks  # parented to the task that waited
    (manifest_span,) = [s for s in spans if s["name"] == "lockwatch.manifest"]

    manifest = load_manifest(manifest_path)
    lock = manifest.locks["__main__:<module>:7"]
    assert lock["acquisitions"] == 100  # 4 tasks x 25, exactly
    assert manifest.nominal_pool_size == 4
    assert manifest_span["attributes"]["lockwatch.verdict"] == str(manifest.verdict)

    metrics = [o for o in objects if "resource_metrics" in o]
    values = [
        dp["value"]
        for m in metrics
        for rm in m["resource_metrics"]
        for sm in rm["scope_metrics"]
        for metric in sm["metrics"]
        if metric["name"] == "lockwatch.lock.acquisitions"
        for dp in metric["data"]["data_points"]
        if dp["attributes"].get("lockwatch.lock.name") == "__main__:<module>:7"
    ]
    assert values and values[-1] == 100


def test_disabled_instrumentation_leaves_nothing(tmp_path):
    proc, manifest_path = run(tmp_path, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="lockwatch")
    assert proc.returncode == 0, proc.stderr
    assert "lock.wait" not in proc.stdout
    assert not manifest_path.exists()


def test_options_are_opentelemetry_instrument_flags():
    """Each OTEL_PYTHON_LOCKWATCH_* variable is registered as an opentelemetry-instrument flag."""
    proc = subprocess.run(
        instrument_command() + ["--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    for flag in ("--lockwatch_on_cycle", "--lockwatch_manifest_path", "--lockwatch_pool_size"):
        assert flag in proc.stdout
