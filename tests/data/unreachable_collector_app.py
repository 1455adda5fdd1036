"""A program whose OTLP/HTTP collector is unreachable (for spans and the manifest's log
record): its exit must not hang.

    python unreachable_collector_app.py simple|batch|console PORT MANIFEST [wait-for-sigint]
        [no-threads-at-exit]

It contends a lock from four threads (hundreds of ``lock.wait`` spans queued for export), prints
``work done <epoch seconds>``, then exits; with ``wait-for-sigint`` it first waits for a SIGINT
(the user's Ctrl-C) and exits by the KeyboardInterrupt. ``console`` exports the spans and the
log record to standard output instead (the port is not used), and lockwatch's emitter waits for
the exit to send anything, so every span goes out in the exit's final flush. With
``no-threads-at-exit`` no thread can be started once the exit hooks run, as on CPython 3.12
(gh-113964).
"""

import atexit
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    ConsoleLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch.telemetry._emitter import Telemetry

mode, port, manifest = sys.argv[1:4]
provider = TracerProvider()
if mode == "console":
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    Telemetry.INTERVAL_S = 3600.0  # nothing is emitted before the exit's final flush
else:
    processor = SimpleSpanProcessor if mode == "simple" else BatchSpanProcessor
    provider.add_span_processor(
        processor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))
    )
trace.set_tracer_provider(provider)
# The manifest's log record goes to the same unreachable collector, through the same kind of
# processor.
logs = LoggerProvider()
if mode == "console":
    logs.add_log_record_processor(SimpleLogRecordProcessor(ConsoleLogRecordExporter()))
else:
    log_processor = SimpleLogRecordProcessor if mode == "simple" else BatchLogRecordProcessor
    logs.add_log_record_processor(
        log_processor(OTLPLogExporter(endpoint=f"http://127.0.0.1:{port}/v1/logs"))
    )
LockwatchInstrumentor().instrument(
    tracer_provider=provider,
    logger_provider=logs,
    manifest_path=manifest,
    wait_span_threshold_ms=0.001,
)
lock = threading.Lock()


def work() -> None:
    for _ in range(300):
        with lock:
            time.sleep(0.0005)  # hold: the others queue behind it


threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if "no-threads-at-exit" in sys.argv[4:]:

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    # Registered after lockwatch's exit hook, so it runs first: from then on, as on 3.12.
    atexit.register(setattr, threading.Thread, "start", refuse)
print("work done", time.time(), flush=True)
if "wait-for-sigint" in sys.argv[4:]:
    print("ready", flush=True)
    # Until the user's Ctrl-C, whose KeyboardInterrupt ends the program. Not signal.pause(): a
    # SIGINT landing after the interpreter's last check for signals and before pause() is
    # entered wakes nothing, and pause() waits for the next signal (the tests send theirs as
    # soon as they read "ready": lost in 1 run in 5 on 3.14 and 3.15, 1 in 20 on 3.11 with
    # threads running). Each sleep's end is such a check: a SIGINT is handled within 50 ms.
    while True:
        time.sleep(0.05)
