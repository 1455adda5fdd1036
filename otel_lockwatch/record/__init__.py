"""What is recorded: per-thread (per-task) statistics, histograms, the lock-order graph, and
the outbox of slow-path records.

Everything the lock path writes lives here, with no process-wide lock on the hot path. It
imports only ``exceptions`` and OpenTelemetry's API (for the current span's ids); the stages
above read it (``manifest`` evaluates its snapshot, ``telemetry`` drains its outbox).
"""
