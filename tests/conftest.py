"""Shared fixtures: an instrumented process with in-memory OpenTelemetry exporters."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from opentelemetry.test.test_base import TestBase

from otel_lockwatch import LockwatchInstrumentor, _session

# Machines here are shared and noisy: a property is judged on its examples, not on their speed.
settings.register_profile("lockwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lockwatch")

# A suite started in the background by a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and so would every program it starts: the exit tests' Ctrl-C would reach none of them (they
# time out). Python's own handler here is reset to the default in a child at exec, as a
# terminal's suite has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class Watched:
    """What a test needs to look at: the providers, the in-memory exporter and metric reader."""

    tracer_provider: Any
    spans: Any  # InMemorySpanExporter
    meter_provider: Any
    metrics: Any  # InMemoryMetricReader
    instrumentor: LockwatchInstrumentor
    session: _session.Session  # the instrument()'s: its options, recorder, emitter, exporter

    def finished(self, name: str | None = None) -> list[Any]:
        self.session.emitter.flush()
        spans = self.spans.get_finished_spans()
        return [s for s in spans if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        self.session.emitter.flush()
        data = self.metrics.get_metrics_data()
        out = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out


def instrument(**options: Any) -> Watched:
    tracer_provider, spans = TestBase.create_tracer_provider()
    meter_provider, metrics = TestBase.create_meter_provider()
    _session.discard()  # a fresh recording: nothing of an earlier test's
    instrumentor = LockwatchInstrumentor()
    options.setdefault("manifest", False)
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, **options
    )
    session = _session.current()
    assert session is not None
    return Watched(tracer_provider, spans, meter_provider, metrics, instrumentor, session)


@pytest.fixture
def watched():
    """Instrumented for one test (no manifest file), uninstrumented after it."""
    w = instrument()
    try:
        yield w
    finally:
        w.instrumentor.uninstrument()  # ends the session
        _session.discard()


@pytest.fixture
def make_watched():
    """``make_watched(**options)`` instruments with those options; uninstrumented after the test."""
    made: list[Watched] = []

    def make(**options: Any) -> Watched:
        w = instrument(**options)
        made.append(w)
        return w

    try:
        yield make
    finally:
        for w in made:
            w.instrumentor.uninstrument()  # ends the session
        _session.discard()
