"""One process of a fleet: contends a shared lock class from four threads, writes a
checkpoint, contends again, and exits; its manifest goes to a file and, as a log record, over
OTLP/gRPC to a collector.

    python fleet_worker.py OTLP_GRPC_ENDPOINT MANIFEST_PATH
"""

import sys
import threading

from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from otel_lockwatch import LockwatchInstrumentor, _session, name_lock

endpoint, manifest_path = sys.argv[1:3]
logs = LoggerProvider(resource=Resource.create({"service.name": "lockwatch-fleet-e2e"}))
logs.add_log_record_processor(
    BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"http://{endpoint}", insecure=True))
)
LockwatchInstrumentor().instrument(
    tracer_provider=TracerProvider(), logger_provider=logs, manifest_path=manifest_path
)
shared = name_lock(threading.Lock(), "fleet-shared")
own = name_lock(threading.Lock(), "fleet-own")


def run_threads(rounds: int) -> None:
    barrier = threading.Barrier(4)

    def work() -> None:
        barrier.wait()
        for _ in range(rounds):
            with shared, own:
                pass

    threads = [threading.Thread(target=work, name=f"worker-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


run_threads(200)
assert _session.current().exporter is not None
_session.current().exporter.write(
    final=False
)  # a checkpoint: an earlier record the merge must skip
run_threads(300)
print("done", flush=True)
