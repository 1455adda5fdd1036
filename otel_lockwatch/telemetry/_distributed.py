"""The counters of distributed locks: lease overruns and release failures.

Both are exact counts kept by the recorder (``record._distributed``) and observed at collection,
like the acquisition counters:

- ``lockwatch.lock.lease_overruns``: holds of a Redis lock that outlived their lease;
- ``lockwatch.lock.release_failures``: releases that failed (refused, or raised), by
  ``lockwatch.failure`` (``not_owned``, ``lock_error``).

Attributes: ``lockwatch.lock.name`` (a key template, or a chosen name) and ``.kind``; never a key.
"""

from __future__ import annotations

from typing import Any

from .._session import DISTRIBUTED

__all__ = ["distributed_counters"]


def distributed_counters(meter: Any) -> list[Any]:
    """Create the two observable counters on ``meter``; returns them."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def observe(overruns: bool) -> Any:
        def callback(options: CallbackOptions) -> list[Observation]:
            out = []
            for (name, kind, event), n in DISTRIBUTED.totals().items():
                if (event == "lease_overrun") != overruns:
                    continue
                attrs = {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind}
                if not overruns:
                    attrs["lockwatch.failure"] = event
                out.append(Observation(n, attrs))
            return out

        return callback

    return [
        meter.create_observable_counter(
            "lockwatch.lock.lease_overruns",
            callbacks=[observe(True)],
            unit="{hold}",
            description="Holds of a distributed lock that outlived their lease.",
        ),
        meter.create_observable_counter(
            "lockwatch.lock.release_failures",
            callbacks=[observe(False)],
            unit="{release}",
            description="Releases of a distributed lock that the lock refused.",
        ),
    ]
