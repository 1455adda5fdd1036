"""Every option, declared once: its keyword, environment variable, parser, default, valid values
and meaning.

An option is one field of :class:`Options`, declared with ``_option(...)``; the field's name is
the ``instrument()`` keyword, and its environment variable is that name upper-cased after
``OTEL_PYTHON_LOCKWATCH_`` (the rule that also gives ``opentelemetry-instrument`` its flag,
``--lockwatch_<keyword>``). Everything else is derived from these declarations:

- :data:`SETTINGS`, one :class:`Setting` per option, in declaration order;
- :func:`load_options`, the options of ``instrument()``;
- :meth:`Setting.resolve`, one option read where ``instrument()`` did not resolve it (the
  manifest's thresholds and pool size, the exit writer's manifest path);
- ``environment_variables``, the constants OpenTelemetry's entry point reads;
- :func:`docs_table_rows`, the options table of the documentation.

A value comes from the argument, else from the environment, else from the default. An argument
that makes no sense raises ``ValueError`` naming it; the same nonsense in the environment logs one
warning (once per variable and value) and the default is used: the instrumentation never stops a
host program from starting. An empty variable counts as unset.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

__all__ = [
    "DISABLE_EXTENSIONS_ENV",
    "ENV_PREFIX",
    "MAX_CONTENTION_POINTS",
    "MAX_POOL_SIZE",
    "SETTINGS",
    "Options",
    "Setting",
    "docs_table_rows",
    "extensions_disabled",
    "load_options",
    "WARNED",
]

logger = logging.getLogger("otel_lockwatch")

#: What every option's environment variable starts with.
ENV_PREFIX = "OTEL_PYTHON_LOCKWATCH_"
#: Set to 1 (wrapt's convention) to keep to the pure-Python paths: the C extensions are then
#: neither built (``setup.py`` reads it too) nor loaded.
DISABLE_EXTENSIONS_ENV = "LOCKWATCH_DISABLE_EXTENSIONS"


def extensions_disabled() -> bool:
    """Whether :data:`DISABLE_EXTENSIONS_ENV` keeps the package to its pure-Python paths."""
    return os.environ.get(DISABLE_EXTENSIONS_ENV, "").strip().lower() in ("1", "true", "yes")


# -- parsers: each takes an argument or an environment variable's text, returns the value, and
# raises ValueError or TypeError for anything else --------------------------------------------


def _number(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[Any], float]:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``); not a bool."""

    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not math.isfinite(number) or number > hi or number < lo or (lo_open and number == lo):
            raise ValueError
        return number

    return parse


def _choice(*choices: str) -> Callable[[Any], str]:
    """One of ``choices``, case and surrounding spaces ignored."""

    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError
        return text

    return parse


def _bool(value: Any) -> bool:
    """A bool, or one of 1/true/yes/on, 0/false/no/off (case and surrounding spaces ignored)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _integer_at_least_one(value: Any) -> int:
    """An integer >= 1: an int, a float without a fraction, or decimal text; not a bool."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, str):
        value = value.strip()
    number = int(value)
    if number < 1 or (isinstance(value, float) and value != number):
        raise ValueError
    return number


#: The largest pool size: a ``pool_size`` setting, and what a manifest may hold or imply
#: (``manifest._check`` refuses a larger one as a forgery).
MAX_POOL_SIZE = 2**20


def _pool_size(value: Any) -> int:
    """A pool size: an integer in ``[1, MAX_POOL_SIZE]``."""
    number = _integer_at_least_one(value)
    if number > MAX_POOL_SIZE:
        raise ValueError
    return number


#: The largest ``contention_points`` setting (a manifest keeps 4 x it sites per lock class).
MAX_CONTENTION_POINTS = 64


def _points(value: Any) -> int:
    """An integer in ``[1, MAX_CONTENTION_POINTS]``."""
    number = _integer_at_least_one(value)
    if number > MAX_CONTENTION_POINTS:
        raise ValueError
    return number


def _path(value: Any) -> str:
    """A non-empty path, as a str or an ``os.PathLike``."""
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError
    return text


# -- the declarations ---------------------------------------------------------------------------

_DECLARATION = "otel_lockwatch.setting"


def _option(*, parse: Callable[[Any], Any], default: Any, valid: str, doc: str) -> Any:
    """Declare an option: the field of :class:`Options` it is assigned to.

    Args:
        parse: turns an argument or the variable's text into the value; raises ValueError or
            TypeError for anything else.
        default: the value when neither the argument nor the variable gives one.
        valid: what a valid value is, as messages say it (``must be <valid>``).
        doc: its meaning, one line (the documentation's table shows it).
    """
    return field(
        default=default, metadata={_DECLARATION: {"parse": parse, "valid": valid, "doc": doc}}
    )


@dataclass(frozen=True)
class Options:
    """The options in force: one field per option, each declared here and nowhere else."""

    wait_span_threshold_ms: float = _option(
        parse=_number(0),
        default=1.0,
        valid="a number >= 0",
        doc="a wait at least this long becomes a `lock.wait` span",
    )
    hold_span_threshold_ms: float = _option(
        parse=_number(0),
        default=10.0,
        valid="a number >= 0",
        doc="a hold at least this long becomes a `lock.hold` span",
    )
    hold_metric_floor_ms: float = _option(
        parse=_number(0),
        default=0.1,
        valid="a number >= 0",
        doc="holds at least this long go into the hold histogram",
    )
    on_cycle: str = _option(
        parse=_choice("warn", "raise", "ignore"),
        default="warn",
        valid="one of warn, raise, ignore",
        doc="a new lock-order cycle: `warn`, `raise` or `ignore`",
    )
    manifest: bool = _option(
        parse=_bool,
        default=True,
        valid="true or false",
        doc="write the manifest at exit",
    )
    manifest_log_record: bool = _option(
        parse=_bool,
        default=True,
        valid="true or false",
        doc="also send each manifest write as a `lockwatch.manifest` log record",
    )
    manifest_path: str = _option(
        parse=_path,
        default="lockwatch-manifest.json",
        valid="a file path",
        doc="where (`{pid}` is replaced)",
    )
    checkpoint_interval_s: float = _option(
        parse=_number(0),
        default=30.0,
        valid="a number >= 0",
        doc="rewrite the manifest this often (0: never), so a SIGKILL loses at most one interval",
    )
    exit_timeout_s: float = _option(
        parse=_number(0),
        default=5.0,
        valid="a number >= 0",
        doc="at exit, after the manifest is written, how long spans may take to go out",
    )
    pool_size: int | None = _option(
        parse=_pool_size,
        default=None,
        valid=f"an integer in [1, {MAX_POOL_SIZE}]",
        doc="the nominal pool size when no instrumented executor tells it",
    )
    hot_lock_threshold_pct: float = _option(
        parse=_number(0, 100, lo_open=True),
        default=20.0,
        valid="a percentage in (0, 100]",
        doc="a lock with at least this share of the aggregate wait is hot",
    )
    starvation_ratio: float = _option(
        parse=_number(1, lo_open=True),
        default=5.0,
        valid="a number > 1",
        doc="a worker waiting more than this times a lock's median wait is starved",
    )
    contention_points: int = _option(
        parse=_points,
        default=8,
        valid=f"an integer in [1, {MAX_CONTENTION_POINTS}]",
        doc="the report's top waiting and holding sites per lock class; the manifest keeps 4 x "
        "as many, the rest folded into `(other)`",
    )


# Warned once per (variable, value): the manifest's evaluation reads its thresholds again at
# every checkpoint, and a bad value is worth one line, not one per checkpoint.
WARNED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Setting:
    """One option, as declared on :class:`Options`.

    Attributes:
        name: the ``instrument()`` keyword and the :class:`Options` field.
        variable: the environment variable, ``OTEL_PYTHON_LOCKWATCH_`` + the name upper-cased.
        parse: turns an argument or the variable's text into the value.
        default: the value when neither gives one.
        valid: what a valid value is, as messages say it.
        doc: its meaning, one line.
    """

    name: str
    parse: Callable[[Any], Any]
    default: Any
    valid: str
    doc: str

    @property
    def variable(self) -> str:
        """``OTEL_PYTHON_LOCKWATCH_`` + the name upper-cased."""
        return ENV_PREFIX + self.name.upper()

    @property
    def shown_default(self) -> str:
        """The default as the documentation shows it: ``1``, ``0.1``, ```warn```, ```true```,
        ``(none)``."""
        value = self.default
        if value is None:
            return "(none)"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, str):
            return f"`{value}`"
        if isinstance(value, float):
            return format(value, "g")
        return str(value)

    def resolve(self, argument: Any = None, environ: Mapping[str, str] | None = None) -> Any:
        """The value: the argument (when not None), else the environment's, else the default.

        Args:
            argument: the value a caller gave, or None.
            environ: the environment (``os.environ`` by default).

        Raises:
            ValueError: ``argument`` is not a valid value (``starvation_ratio must be a number
                > 1, got 0.5``). An invalid environment value is logged instead.
        """
        if argument is not None:
            try:
                return self.parse(argument)
            except (TypeError, ValueError):
                raise ValueError(f"{self.name} must be {self.valid}, got {argument!r}") from None
        raw = (os.environ if environ is None else environ).get(self.variable)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            return self.parse(raw)
        except (TypeError, ValueError):
            if (self.variable, raw) not in WARNED:
                WARNED.add((self.variable, raw))
                logger.warning(
                    "otel-lockwatch: %s must be %s, got %r; using the default %r",
                    self.variable,
                    self.valid,
                    raw,
                    self.default,
                )
            return self.default


#: Every option's :class:`Setting` by name, in declaration order.
SETTINGS: Mapping[str, Setting] = MappingProxyType(
    {
        f.name: Setting(f.name, default=f.default, **f.metadata[_DECLARATION])
        for f in fields(Options)
    }
)


def load_options(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Options:
    """Resolve every option (:meth:`Setting.resolve`).

    Args:
        overrides: ``instrument()`` keyword arguments; unknown keys are ignored (the
            instrumentor also receives ``tracer_provider`` and friends).
        environ: the environment (``os.environ`` by default).

    Raises:
        ValueError: an override that is not a valid value, naming it.
    """
    overrides = overrides or {}
    return Options(
        **{name: s.resolve(overrides.get(name), environ) for name, s in SETTINGS.items()}
    )


def docs_table_rows() -> list[str]:
    """The rows of the documentation's options table, one per option in declaration order:
    ``| `WAIT_SPAN_THRESHOLD_MS` | `wait_span_threshold_ms` | 1 | <meaning> |`` (the variable
    without ``OTEL_PYTHON_LOCKWATCH_``, the keyword, the default, the meaning)."""
    return [
        f"| `{s.variable.removeprefix(ENV_PREFIX)}` | `{s.name}` | {s.shown_default} | {s.doc} |"
        for s in SETTINGS.values()
    ]
