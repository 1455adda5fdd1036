"""The public surface of ``otel_lockwatch``: a sorted ``__all__`` whose every name resolves,
and the old name of the span processor kept as a deprecated alias."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import otel_lockwatch


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert otel_lockwatch.__all__ == sorted(otel_lockwatch.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no public name is a deprecated one
        for name in otel_lockwatch.__all__:
            assert getattr(otel_lockwatch, name) is not None


def test_held_lock_span_processor_is_public() -> None:
    from otel_lockwatch import HeldLockSpanProcessor
    from otel_lockwatch.telemetry._held_spans import HeldLockSpanProcessor as defined

    assert HeldLockSpanProcessor is defined
    assert "HeldLockSpanProcessor" in otel_lockwatch.__all__


def test_lock_order_span_processor_is_a_deprecated_alias() -> None:
    """The old name still works, is the same class, and warns on every access."""
    with pytest.warns(
        DeprecationWarning,
        match=r"^LockOrderSpanProcessor is deprecated; use HeldLockSpanProcessor, the same class "
        r"\(it counts the spans started while a lock is held\)$",
    ) as record:
        from otel_lockwatch import LockOrderSpanProcessor
    assert LockOrderSpanProcessor is otel_lockwatch.HeldLockSpanProcessor
    assert record[0].filename == __file__  # the warning points at the importing line
    with pytest.warns(DeprecationWarning):
        assert otel_lockwatch.LockOrderSpanProcessor is LockOrderSpanProcessor
    assert "LockOrderSpanProcessor" not in otel_lockwatch.__all__


def test_star_import_warns_nothing() -> None:
    """``from otel_lockwatch import *`` takes ``__all__``, which holds no deprecated name (a
    fresh interpreter, so that nothing is imported already)."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from otel_lockwatch import *\n"
        "assert HeldLockSpanProcessor.__name__ == 'HeldLockSpanProcessor'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(
        AttributeError, match=r"^module 'otel_lockwatch' has no attribute 'NoSuchThing'$"
    ):
        otel_lockwatch.NoSuchThing  # noqa: B018
