"""The ``OTEL_PYTHON_LOCKWATCH_*`` environment variables.

Registered under the ``opentelemetry_environment_variables`` entry point, so that
``opentelemetry-instrument`` accepts each as a flag (``--lockwatch_on_cycle raise`` style flags are
derived by lower-casing the name without its ``OTEL_`` prefix). An invalid value is reported with
one warning and the default is used; an invalid *argument* to ``instrument()`` raises.
"""

OTEL_PYTHON_LOCKWATCH_WAIT_SPAN_THRESHOLD_MS = "OTEL_PYTHON_LOCKWATCH_WAIT_SPAN_THRESHOLD_MS"
"""A wait at least this long (ms) becomes a ``lock.wait`` span. Default 1."""

OTEL_PYTHON_LOCKWATCH_HOLD_SPAN_THRESHOLD_MS = "OTEL_PYTHON_LOCKWATCH_HOLD_SPAN_THRESHOLD_MS"
"""A hold at least this long (ms) becomes a ``lock.hold`` span. Default 10."""

OTEL_PYTHON_LOCKWATCH_HOLD_METRIC_FLOOR_MS = "OTEL_PYTHON_LOCKWATCH_HOLD_METRIC_FLOOR_MS"
"""Holds at least this long (ms) are recorded in ``lockwatch.lock.hold.duration``. Default 0.1."""

OTEL_PYTHON_LOCKWATCH_ON_CYCLE = "OTEL_PYTHON_LOCKWATCH_ON_CYCLE"
"""What a new lock-order cycle does: ``warn`` (default), ``raise`` or ``ignore``."""

OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH = "OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH"
"""Where the manifest is written (``{pid}`` is replaced). Default ``lockwatch-manifest.json``."""

OTEL_PYTHON_LOCKWATCH_MANIFEST = "OTEL_PYTHON_LOCKWATCH_MANIFEST"
"""``true`` (default) writes the manifest at exit; ``false`` does not."""

OTEL_PYTHON_LOCKWATCH_CHECKPOINT_INTERVAL_S = "OTEL_PYTHON_LOCKWATCH_CHECKPOINT_INTERVAL_S"
"""Seconds between manifest checkpoints (0 disables them). Default 30."""

OTEL_PYTHON_LOCKWATCH_POOL_SIZE = "OTEL_PYTHON_LOCKWATCH_POOL_SIZE"
"""The pool's nominal size when no instrumented executor tells it."""

OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT = "OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT"
"""A lock with at least this share (%) of the aggregate wait is hot. Default 20."""

OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO = "OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO"
"""A worker waiting more than this times the median wait on a lock is starved. Default 5."""
