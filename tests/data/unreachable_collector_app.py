"""A program whose OTLP/HTTP collector is unreachable (for spans and the manifest's log
record): its exit must not hang.

    python unreachable_collector_app.py simple|batch PORT MANIFEST [wait-for-sigint]

It contends a lock from four threads (hundreds of ``lock.wait`` spans queued for export), prints
``work done <epoch seconds>``, then exits; with ``wait-for-sigint`` it first waits for a SIGINT
(the user's Ctrl-C) and exits by the KeyboardInterrupt.
"""

import signal
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from otel_lockwatch import LockwatchInstrumentor

mode, port, manifest = sys.argv[1:4]
provider = TracerProvider()
processor = SimpleSpanProcessor if mode == "simple" else BatchSpanProcessor
provider.add_span_processor(
    processor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))
)
trace.set_tracer_provider(provider)
# The manifest's log record goes to the same unreachable collector, through the same kind of
# processor.
logs = LoggerProvider()
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
print("work done", time.time(), flush=True)
if sys.argv[4:] == ["wait-for-sigint"]:
    print("ready", flush=True)
    signal.pause()  # until the user's Ctrl-C: a KeyboardInterrupt ends the program
