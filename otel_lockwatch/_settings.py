"""Options: ``instrument()`` arguments first, then ``OTEL_PYTHON_LOCKWATCH_*``, then defaults.

An argument that makes no sense raises ``ValueError`` naming it; the same nonsense in an
environment variable logs one warning and keeps the default (the instrumentation never stops a
host program from starting).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import environment_variables as ev

__all__ = ["Options", "load_options"]

logger = logging.getLogger("otel_lockwatch")


def _number(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if math.isnan(number) or number > hi or number < lo or (lo_open and number == lo):
            raise ValueError
        return number

    return parse


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError
        return text

    return parse


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _positive_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, str):
        value = value.strip()
    number = int(value)
    if number < 1 or (isinstance(value, float) and value != number):
        raise ValueError
    return number


def _path(value: Any) -> str:
    text = os.fspath(value)
    if not text:
        raise ValueError
    return text


# name: (environment variable, parser, default, what a valid value is)
_SPEC: dict[str, tuple[str, Callable[[Any], Any], Any, str]] = {
    "wait_span_threshold_ms": (
        ev.OTEL_PYTHON_LOCKWATCH_WAIT_SPAN_THRESHOLD_MS,
        _number(0),
        1.0,
        "a number >= 0",
    ),
    "hold_span_threshold_ms": (
        ev.OTEL_PYTHON_LOCKWATCH_HOLD_SPAN_THRESHOLD_MS,
        _number(0),
        10.0,
        "a number >= 0",
    ),
    "hold_metric_floor_ms": (
        ev.OTEL_PYTHON_LOCKWATCH_HOLD_METRIC_FLOOR_MS,
        _number(0),
        0.1,
        "a number >= 0",
    ),
    "on_cycle": (
        ev.OTEL_PYTHON_LOCKWATCH_ON_CYCLE,
        _choice("warn", "raise", "ignore"),
        "warn",
        "one of warn, raise, ignore",
    ),
    "manifest_path": (
        ev.OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH,
        _path,
        "lockwatch-manifest.json",
        "a file path",
    ),
    "manifest": (ev.OTEL_PYTHON_LOCKWATCH_MANIFEST, _bool, True, "true or false"),
    "checkpoint_interval_s": (
        ev.OTEL_PYTHON_LOCKWATCH_CHECKPOINT_INTERVAL_S,
        _number(0),
        30.0,
        "a number >= 0",
    ),
    "pool_size": (ev.OTEL_PYTHON_LOCKWATCH_POOL_SIZE, _positive_int, None, "an integer >= 1"),
    "hot_lock_threshold_pct": (
        ev.OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT,
        _number(0, 100, lo_open=True),
        20.0,
        "a percentage in (0, 100]",
    ),
    "starvation_ratio": (
        ev.OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO,
        _number(1, lo_open=True),
        5.0,
        "a number > 1",
    ),
}


@dataclass(frozen=True)
class Options:
    """The options in force. See ``environment_variables`` for each one's meaning."""

    wait_span_threshold_ms: float = 1.0
    hold_span_threshold_ms: float = 10.0
    hold_metric_floor_ms: float = 0.1
    on_cycle: str = "warn"
    manifest_path: str = "lockwatch-manifest.json"
    manifest: bool = True
    checkpoint_interval_s: float = 30.0
    pool_size: int | None = None
    hot_lock_threshold_pct: float = 20.0
    starvation_ratio: float = 5.0


def load_options(
    overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> Options:
    """Resolve every option.

    Args:
        overrides: ``instrument()`` keyword arguments; unknown keys are ignored (the
            instrumentor also receives ``tracer_provider`` and friends).
        environ: the environment (``os.environ`` by default).

    Raises:
        ValueError: an override that is not a valid value, naming it.
    """
    overrides = overrides or {}
    env: Mapping[str, str] = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (var, parse, default, valid) in _SPEC.items():
        if name in overrides and overrides[name] is not None:
            try:
                values[name] = parse(overrides[name])
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be {valid}, got {overrides[name]!r}") from None
            continue
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            values[name] = default
            continue
        try:
            values[name] = parse(raw)
        except (TypeError, ValueError):
            logger.warning(
                "otel-lockwatch: %s must be %s, got %r; using the default %r",
                var,
                valid,
                raw,
                default,
            )
            values[name] = default
    return Options(**values)
