"""Waiting in a test for something no event announces: poll a predicate, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(
    predicate: Callable[[], object], what: str = "timed out", timeout_s: float = 10.0
) -> None:
    """Poll ``predicate`` every millisecond until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)  # ok: polling with a deadline
