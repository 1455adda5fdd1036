"""A fleet's manifests through the real collector: four processes send their
``lockwatch.manifest`` log records to collector-config/otel-collector.yaml, whose manifests
pipeline (a filter on the event name, the file exporter) writes them to a file of JSON lines;
``otel-lockwatch merge`` over that file gives the manifest that merging the four processes'
manifest files gives, digest for digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from _e2e_harness import (
    CONFIG_DIR,
    START_TIMEOUT_S,
    collector_env,
    free_ports,
    http_get,
    run_service,
)

from otel_lockwatch import load_manifest
from otel_lockwatch.cli._main import main
from otel_lockwatch.manifest._model import canonical_json
from otel_lockwatch.record._data import DATA_FIELDS

PROCESSES = 4
FILE_TIMEOUT_S = 30.0
WORKER = Path(__file__).with_name("fleet_worker.py")


def data_digest(doc: dict) -> str:
    return hashlib.sha256(canonical_json({k: doc[k] for k in DATA_FIELDS})).hexdigest()


def final_instances(path: Path) -> set[str]:
    """The instances whose final record the collector's file holds so far (its complete lines:
    the collector may be writing the last one as it is read)."""
    found = set()
    if not path.exists():
        return found
    for line in path.read_text().split("\n")[:-1]:
        if not line.strip():
            continue
        for resource in json.loads(line)["resourceLogs"]:
            for scope in resource["scopeLogs"]:
                for record in scope["logRecords"]:
                    attrs = {a["key"]: a["value"] for a in record.get("attributes", [])}
                    if attrs.get("lockwatch.manifest.final", {}).get("boolValue"):
                        found.add(attrs["lockwatch.manifest.instance"]["stringValue"])
    return found


def test_merge_of_the_collector_file_equals_the_merge_of_the_manifest_files(
    otelcol_binary: Path, tmp_path: Path
) -> None:
    *ports, closed = free_ports(6)
    grpc, health = ports[0], ports[3]
    records = tmp_path / "lockwatch-manifests.jsonl"
    nowhere = f"127.0.0.1:{closed}"  # no traces are sent to the trace exporters
    env = collector_env(ports, nowhere, nowhere)
    env["OTELCOL_LOCKWATCH_MANIFESTS"] = str(records)
    argv = [str(otelcol_binary), "--config", str(CONFIG_DIR / "otel-collector.yaml")]
    (tmp_path / "otelcol").mkdir()
    with run_service("collector", argv, env, tmp_path / "otelcol" / "otelcol.log") as service:
        service.wait_until(
            lambda: http_get(f"http://127.0.0.1:{health}/", timeout=1)[0] == 200,
            "healthy status",
            START_TIMEOUT_S,
        )
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        workers = [
            subprocess.Popen(
                [sys.executable, str(WORKER), f"127.0.0.1:{grpc}", str(tmp_path / "m.{pid}.json")],
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        for w in workers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0 and out.strip() == "done", err
        service.wait_until(
            lambda: len(final_instances(records)) == PROCESSES,
            f"the final records of {PROCESSES} processes in {records}",
            FILE_TIMEOUT_S,
        )

    manifests = sorted(tmp_path.glob("m.*.json"))
    assert len(manifests) == PROCESSES
    from_files, from_collector = tmp_path / "from-files.json", tmp_path / "from-collector.json"
    assert main(["merge", *map(str, manifests), "-o", str(from_files)]) == 0
    assert main(["merge", str(records), "-o", str(from_collector)]) == 0
    a, b = load_manifest(from_files).to_dict(), load_manifest(from_collector).to_dict()
    assert b["process"]["merged"] == PROCESSES
    assert b["locks"]["fleet-shared"]["acquisitions"] == PROCESSES * 4 * 500
    assert data_digest(b) == data_digest(a)
    assert b["manifest_digest"] == a["manifest_digest"]
    # The file holds the checkpoints too, which the merge skipped.
    lines = records.read_text().count("lockwatch.manifest.sequence")
    assert lines >= 2 * PROCESSES
