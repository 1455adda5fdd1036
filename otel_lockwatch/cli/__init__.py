"""The ``otel-lockwatch`` command: demo, run, report, check, merge."""

from ._main import main

__all__ = ["main"]
