"""The manifest's log record: each write of the manifest also sends its mergeable part through
the OpenTelemetry logs SDK, so a Collector can gather a fleet's manifests into one file.

The logger provider is the one given to ``instrument(logger_provider=...)``, else the global one
(``opentelemetry._logs.get_logger_provider()``, asked at every send, so a provider set after
``instrument()`` is used); without an SDK provider the record goes nowhere, at the cost of
building it. The record (``manifest/_fleet.py`` has its schema) is sent at every checkpoint and
once, ``final``, at exit. Sending is an ``emit`` (a batch processor queues it); at exit the
send and a flush of the provider run inside the exit writer's deadline, and when that flush did
not finish in time (an exporter that does not answer) the provider's processors are shut down
within what is left of it, as the tracer provider's are; a later final write (the tracer
provider's own shutdown after the exit hook) sends its record again, so the last record is
always the manifest on disk. Nothing here raises into the host program: an error is counted and
logged once (``record._outbox``).
"""

from __future__ import annotations

import inspect
import os
import secrets
import time
from typing import Any

from opentelemetry import _logs

from .._session import OUTBOX
from ..manifest._fleet import ATTR_EVENT_NAME, EVENT_NAME, record_attributes, record_body
from ..manifest._model import Manifest

__all__ = ["ManifestRecords"]

#: Whether the API's log record has an event name (opentelemetry-api 1.35 and later); before,
#: the record carries the name as its ``event.name`` attribute, which the Collector's filter and
#: the merge accept too.
HAS_EVENT_NAME = "event_name" in inspect.signature(_logs.LogRecord.__init__).parameters


class ManifestRecords:
    """Sends a manifest's log record (see the module docstring).

    Args:
        logger_provider: the provider; None for the global one at each send.
        enabled: False sends nothing (the ``manifest_log_record`` option).
    """

    def __init__(self, logger_provider: Any = None, enabled: bool = True) -> None:
        self._provider = logger_provider
        self._enabled = enabled
        self._pid = 0
        self._instance = ""
        #: Whether the last flush asked for finished in time (the provider's exporter answers).
        self.flushed = False

    def provider(self) -> Any:
        """The logger provider records go to."""
        return self._provider if self._provider is not None else _logs.get_logger_provider()

    def send(
        self, manifest: Manifest, sequence: int, final: bool, flush_s: float | None = None
    ) -> None:
        """Emit ``manifest``'s record, the ``sequence``-th evaluation of this process; with
        ``flush_s``, then flush the provider for at most that long. Never raises."""
        if not self._enabled:
            return
        try:
            pid = os.getpid()
            if pid != self._pid:  # a new process (a fork's child included): a new instance
                self._pid, self._instance = pid, secrets.token_hex(16)
            from .._version import __version__

            provider = self.provider()
            logger = provider.get_logger("otel_lockwatch", __version__)
            now = time.time_ns()
            attributes = record_attributes(manifest, self._instance, sequence, final)
            named: dict[str, Any] = {"event_name": EVENT_NAME}
            if not HAS_EVENT_NAME:
                attributes[ATTR_EVENT_NAME] = EVENT_NAME
                named = {}
            logger.emit(
                _logs.LogRecord(
                    timestamp=now,
                    observed_timestamp=now,
                    severity_number=_logs.SeverityNumber.INFO,
                    severity_text="INFO",
                    body=record_body(manifest, self._instance, sequence, final),
                    attributes=attributes,
                    **named,
                )
            )
            flush = getattr(provider, "force_flush", None)
            if flush_s is not None and callable(flush):
                self.flushed = False
                self.flushed = bool(flush(max(0, int(flush_s * 1000))))
        except Exception as exc:  # never into the host: the one error path
            OUTBOX.failed(exc)

    def processors(self) -> tuple[Any, ...]:
        """The SDK provider's log record processors (none for another provider, or when
        nothing is sent)."""
        if not self._enabled:
            return ()
        multi = getattr(self.provider(), "_multi_log_record_processor", None)
        return tuple(getattr(multi, "_log_record_processors", ()))
