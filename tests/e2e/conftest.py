"""Fixtures of the end-to-end tests: the binaries, one Jaeger v2 for the session, and one run of
the demo into a collector and Prometheus for the metrics tests.

The machinery (finding binaries, starting processes on free loopback ports, polling with a
deadline, reading Jaeger's JSON) lives in ``_e2e_harness.py``, which the test modules import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _e2e_harness import (
    Jaeger,
    cached_jaeger,
    cached_otelcol,
    find_binary,
    start_jaeger,
)
from _e2e_metrics import MetricsRun, cached_prometheus, metrics_run_in


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e with ``e2e``."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def jaeger_binary() -> Path:
    """The Jaeger v2 binary (``LOCKWATCH_JAEGER_BIN``, the cache, or ``jaeger`` on PATH)."""
    return find_binary("LOCKWATCH_JAEGER_BIN", cached_jaeger, "jaeger", "scripts/build-jaeger.sh")


@pytest.fixture(scope="session")
def otelcol_binary() -> Path:
    """The collector built from tools/otelcol/manifest.yaml (``LOCKWATCH_OTELCOL_BIN``, the
    cache, or ``otelcol-lockwatch`` on PATH)."""
    return find_binary(
        "LOCKWATCH_OTELCOL_BIN", cached_otelcol, "otelcol-lockwatch", "scripts/build-otelcol.sh"
    )


@pytest.fixture(scope="session")
def jaeger(jaeger_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    """One Jaeger v2 all-in-one for the session, stopped at the end whatever happened."""
    log_path = tmp_path_factory.mktemp("jaeger") / "jaeger.log"
    with start_jaeger(jaeger_binary, log_path) as running:
        yield running


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    """The Prometheus server (``LOCKWATCH_PROMETHEUS_BIN``, the cache, or ``prometheus`` on
    PATH)."""
    return find_binary(
        "LOCKWATCH_PROMETHEUS_BIN", cached_prometheus, "prometheus", "scripts/build-prometheus.sh"
    )


@pytest.fixture(scope="session")
def metrics_run(
    otelcol_binary: Path,
    prometheus_binary: Path,
    jaeger: Jaeger,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[MetricsRun]:
    """One collector and Prometheus for the session, with the demo and the pool workload
    exported through them (the query and dashboard tests read the same data)."""
    work = tmp_path_factory.mktemp("metrics")
    with metrics_run_in(otelcol_binary, prometheus_binary, jaeger, work) as run:
        yield run
