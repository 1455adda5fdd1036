"""What callgrind counts between two marks of a program: the half that
``churn_instructions.py`` and ``pair_instructions.py`` share.

The program calls ``os.getppid()`` before and after the part to count; run under
``valgrind --tool=callgrind --dump-before=getppid``, callgrind dumps its counts at each call, and
the second dump holds the part's alone (start-up, imports and exit left out).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile


def marked_instructions(script: str, *args: str) -> int:
    """The instructions ``python script args...`` runs between its two ``os.getppid()`` marks."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-instr=no", "--dump-before=getppid",
             f"--callgrind-out-file={out}/cg", sys.executable, script, *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        with open(f"{out}/cg.2") as part:  # the second dump: the marked part
            found = re.search(r"^totals: (\d+)", part.read(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"callgrind wrote no totals between the marks of {script}")
    return int(found.group(1))


def instrument_without_tick() -> None:
    """Instrument the measured program as the counts do: SDK providers, no manifest, and the
    emitter's periodic tick made an hour (it does work per unit of time, which callgrind's
    50-100x slowdown would charge to the counted part that much more than in a real run)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from otel_lockwatch import LockwatchInstrumentor
    from otel_lockwatch.telemetry._emitter import Telemetry

    Telemetry.INTERVAL_S = 3600.0
    LockwatchInstrumentor().instrument(
        tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
    )
