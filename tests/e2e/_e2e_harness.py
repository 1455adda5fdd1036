"""The end-to-end harness: real Jaeger v2 and collector processes on loopback.

The binaries are built from the Go module proxy by ``scripts/build-jaeger.sh`` and
``scripts/build-otelcol.sh`` (minutes, once; cached under
``${LOCKWATCH_CACHE:-~/.cache/otel-lockwatch}/bin``). A test finds them in this order: the
environment variable (``LOCKWATCH_JAEGER_BIN``, ``LOCKWATCH_OTELCOL_BIN``), the cache, ``PATH``.
When a binary is missing the tests skip, saying how to build it, except under CI (``CI`` set),
where a skipped end-to-end test would hide a broken pipeline: there they fail.

Each process runs its configuration from ``collector-config/`` unchanged; only the
``${env:...}`` addresses are set, to ports found free on 127.0.0.1 at start. Readiness is
polled with a deadline, and every process is stopped (terminate, wait, kill) whatever the test
did; its log is attached to any failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "collector-config"
WORKLOAD = Path(__file__).with_name("workload.py")
CACHE_BIN = (
    Path(os.environ.get("LOCKWATCH_CACHE") or Path.home() / ".cache" / "otel-lockwatch") / "bin"
)

START_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


# ----------------------------------------------------------------------------------------------
# Finding the binaries


def _pinned_version(go_mod: Path, module: str) -> str | None:
    for line in go_mod.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    return None


def _missing(what: str, how: str) -> None:
    """Skip (or, under CI, fail) because a binary is missing."""
    reason = f"{what}; {how}"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: end-to-end tests must run, not skip)", pytrace=False)
    if shutil.which("go") is None:
        reason = f"Go is not installed and {reason}"
    pytest.skip(reason)


def find_binary(
    env_var: str, cached: Callable[[], Path | None], path_name: str, script: str
) -> Path:
    """Return the binary from ``env_var``, the cache or PATH, or skip / fail saying why not.

    Args:
        env_var: environment variable naming the binary; wins when set.
        cached: returns the cached binary for the pinned version, or None.
        path_name: the program's name on PATH.
        script: the script that builds it, named in the skip reason.

    Raises:
        pytest.fail.Exception: ``env_var`` names no executable file, or the binary is missing
            while ``CI`` is set.
    """
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"{env_var}={explicit} is not an executable file", pytrace=False)
        return path
    candidate = cached()
    if candidate is not None and os.access(candidate, os.X_OK):
        return candidate
    on_path = shutil.which(path_name)
    if on_path:
        return Path(on_path)
    _missing(
        f"no {path_name} binary (not in {env_var}, {CACHE_BIN} or PATH)",
        f"build it with {script}",
    )
    raise AssertionError("unreachable")


def cached_jaeger() -> Path | None:
    """The Jaeger scripts/build-jaeger.sh caches for the version pinned in tools/jaeger."""
    version = _pinned_version(
        ROOT / "tools" / "jaeger" / "go.mod", "github.com/jaegertracing/jaeger"
    )
    return CACHE_BIN / f"jaeger-{version}" if version else None


def cached_otelcol() -> Path | None:
    """The collector scripts/build-otelcol.sh caches for the current manifest: keyed by its
    ``dist.version`` and the first 12 hex digits of its SHA-256, as the script does."""
    manifest = ROOT / "tools" / "otelcol" / "manifest.yaml"
    data = manifest.read_bytes()
    versions = [
        line.split()[1] for line in data.decode().splitlines() if line.split()[:1] == ["version:"]
    ]
    if not versions:
        return None
    digest = hashlib.sha256(data).hexdigest()[:12]
    return CACHE_BIN / f"otelcol-lockwatch-{versions[0]}-{digest}"


# ----------------------------------------------------------------------------------------------
# Processes


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports free on 127.0.0.1 right now.

    The sockets are held open together so the ports differ; another program may still take
    one before the caller binds it, which then shows as a start-up failure in the log.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; return (status, body), HTTP errors included, without raising for them."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def collector_env(ports: list[int], jaeger_otlp: str, tempo_otlp: str) -> dict[str, str]:
    """The addresses collector-config/otel-collector.yaml reads, on 127.0.0.1: ``ports`` are
    the OTLP/gRPC, OTLP/HTTP, Prometheus, health-check and own-metrics ports; the two trace
    exporters send to ``jaeger_otlp`` and ``tempo_otlp``."""
    grpc, http, prometheus, health, metrics = ports
    return {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prometheus}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
        "OTELCOL_METRICS_PORT": str(metrics),
        "JAEGER_OTLP_ENDPOINT": jaeger_otlp,
        "TEMPO_OTLP_ENDPOINT": tempo_otlp,
    }


@dataclass
class Service:
    """A process started from a collector-config file, with its log and addresses."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    addresses: dict[str, str] = field(default_factory=dict)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the process's combined stdout/stderr."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def diagnose(self) -> str:
        """A failure message suffix: exit status (if it died) and the log tail."""
        status = self.process.poll()
        state = "running" if status is None else f"exited with status {status}"
        return f"\n--- {self.name} ({state}), log {self.log_path}:\n{self.log_tail()}"

    def wait_until(self, probe: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll ``probe`` until it returns True; fail with the log if the deadline passes or
        the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited while waiting for {what}{self.diagnose()}")
            with contextlib.suppress(OSError):
                if probe():
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: no {what} within {timeout:.0f} s{self.diagnose()}")
            time.sleep(0.1)  # ok: polling with a deadline

    def stop(self) -> None:
        """Terminate, wait, kill if it does not exit."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def run_service(
    name: str, argv: list[str], env: Mapping[str, str], log_path: Path
) -> Iterator[Service]:
    """Start ``argv`` with ``env`` added to the environment, yield it, always stop it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_path.parent,
        )
    service = Service(name, process, log_path, dict(env))
    try:
        yield service
    finally:
        service.stop()


@dataclass
class Jaeger:
    """A running Jaeger v2 all-in-one and the ways to reach it."""

    service: Service
    otlp_grpc: str  # host:port
    otlp_http: str
    query_url: str  # http://host:port

    def get_json(self, path: str, **params: str) -> Any:
        """GET ``path`` of the query API with ``params``; the decoded JSON.

        Raises:
            AssertionError: the answer is not 200.
        """
        url = self.query_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, body = http_get(url)
        assert status == 200, f"GET {url}: {status} {body[:300]!r}{self.service.diagnose()}"
        return json.loads(body)

    def services(self) -> list[str]:
        """The service names Jaeger has seen (``/api/services``)."""
        return self.get_json("/api/services")["data"] or []

    def wait_for_traces(
        self,
        service: str,
        ready: Callable[[list[dict[str, Any]]], bool],
        timeout: float = QUERY_TIMEOUT_S,
        **params: str,
    ) -> list[dict[str, Any]]:
        """Poll ``/api/traces?service=...`` until ``ready(traces)``; return the traces.

        Spans are batched on both sides, so they become queryable some time after the
        workload exits; the poll waits for the data instead of guessing that time.

        Raises:
            pytest.fail.Exception: the deadline passed; the message holds what was seen.
        """
        deadline = time.monotonic() + timeout
        traces: list[dict[str, Any]] = []
        while True:
            if service in self.services():
                traces = (
                    self.get_json(
                        "/api/traces", service=service, limit="100", lookback="1h", **params
                    )["data"]
                    or []
                )
                if ready(traces):
                    return traces
            if time.monotonic() > deadline:
                summary = [sorted({s["operationName"] for s in t["spans"]}) for t in traces]
                pytest.fail(
                    f"Jaeger: service {service!r} has not the expected traces within "
                    f"{timeout:.0f} s; services {self.services()}, traces {summary}"
                    f"{self.service.diagnose()}"
                )
            time.sleep(0.2)  # ok: polling with a deadline


def start_jaeger(binary: Path, log_path: Path) -> contextlib.AbstractContextManager[Jaeger]:
    """Start Jaeger with collector-config/jaeger.yaml on free loopback ports; wait until its
    health check reports every component up and the query API answers."""

    @contextlib.contextmanager
    def manager() -> Iterator[Jaeger]:
        grpc, http, query, query_grpc, health, metrics = free_ports(6)
        env = {
            "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
            "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
            "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{query}",
            "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{query_grpc}",
            "JAEGER_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
            "JAEGER_METRICS_HOST": "127.0.0.1",
            "JAEGER_METRICS_PORT": str(metrics),
        }
        argv = [str(binary), "--config", str(CONFIG_DIR / "jaeger.yaml")]
        with run_service("jaeger", argv, env, log_path) as service:
            jaeger = Jaeger(
                service, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", f"http://127.0.0.1:{query}"
            )
            service.wait_until(
                lambda: http_get(f"http://127.0.0.1:{health}/status", timeout=1)[0] == 200,
                "healthy status",
                START_TIMEOUT_S,
            )
            service.wait_until(
                lambda: http_get(jaeger.query_url + "/api/services", timeout=1)[0] == 200,
                "query API",
                START_TIMEOUT_S,
            )
            yield jaeger

    return manager()


# ----------------------------------------------------------------------------------------------
# The workload


def unique_service(prefix: str) -> str:
    """A service name no other test (or earlier run against the same Jaeger) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_workload(
    mode: str,
    service: str,
    otlp_grpc: str,
    cwd: Path,
    tasks: int = 3,
    metrics: bool = False,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run tests/e2e/workload.py in ``cwd`` exporting OTLP/gRPC to ``otlp_grpc`` as ``service``
    (metrics too when ``metrics``; ``rounds`` of checkouts in the pool mode; lockwatch writes its
    manifest file there).

    Returns:
        The workload's JSON summary (``task_traces``: task name -> trace id).

    Raises:
        AssertionError: the workload failed; the message holds its output.
    """
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp_grpc}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    result = subprocess.run(
        [sys.executable, str(WORKLOAD), "--mode", mode, "--tasks", str(tasks)]
        + (["--metrics"] if metrics else [])
        + (["--rounds", str(rounds)] if rounds != 1 else []),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"workload exited with {result.returncode}\nstdout:\n{result.stdout}\n"
        f"stderr:\n{result.stderr}"
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# Reading Jaeger's trace JSON


def tags(span: Mapping[str, Any]) -> dict[str, Any]:
    """A Jaeger API span's tags as a dict."""
    return {tag["key"]: tag["value"] for tag in span.get("tags", [])}


def parent_id(span: Mapping[str, Any]) -> str | None:
    """The span id of a Jaeger API span's parent (its CHILD_OF reference), or None."""
    for ref in span.get("references", []):
        if ref.get("refType") == "CHILD_OF":
            return ref["spanID"]
    return None


def service_of(trace: Mapping[str, Any], span: Mapping[str, Any]) -> str:
    """The service name of a span of ``trace``."""
    return trace["processes"][span["processID"]]["serviceName"]
