"""otel-lockwatch's bootstrap for multiprocessing's spawn and forkserver interpreters.

``LockwatchInstrumentor().instrument()`` prepends this directory to ``PYTHONPATH`` (unless the
program runs under ``opentelemetry-instrument``, whose own ``sitecustomize`` instruments every
child) and puts its options, as JSON, in ``OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS``. Every Python
started from then on imports this module at startup. It instruments only the interpreters that
multiprocessing starts (``python -c "from multiprocessing.spawn import spawn_main; ..."
--multiprocessing-fork`` and the forkserver's ``python -c "from multiprocessing.forkserver import
main; ..."``), so a ``python script.py`` subprocess, or multiprocessing's resource tracker, is left
alone. Then it imports the next ``sitecustomize`` on the path, if any, as if this one were not
there.

Nothing here may stop the child from starting: a failure is logged and the child runs
uninstrumented.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_OPTIONS_ENV = "OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS"
_MARKERS = ("from multiprocessing.spawn import", "from multiprocessing.forkserver import")


def _is_multiprocessing_child() -> bool:
    argv = getattr(sys, "argv", None) or []
    if not argv or argv[0] != "-c":
        return False
    try:
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = f.read().decode("utf-8", "replace")
    except OSError:  # no /proc: spawn's marker argument, or the forkserver's bare "-c"
        return argv[1:] == ["--multiprocessing-fork"] or argv == ["-c"]
    return any(marker in cmdline for marker in _MARKERS)


def _instrument() -> None:
    raw = os.environ.get(_OPTIONS_ENV)
    if raw is None or not _is_multiprocessing_child():
        return
    try:
        options = json.loads(raw)
        if not isinstance(options, dict):
            raise ValueError(f"{_OPTIONS_ENV} must be a JSON object, got {raw!r}")
        from otel_lockwatch._instrumentor import LockwatchInstrumentor
        from otel_lockwatch.capture import _multiprocess

        _multiprocess.mark_child()
        LockwatchInstrumentor().instrument(**options)
    except Exception as exc:  # never stop the child
        logging.getLogger("otel_lockwatch").warning(
            "otel-lockwatch: could not instrument child process %d: %s", os.getpid(), exc
        )


def _chain() -> None:
    """Import the next ``sitecustomize`` on ``sys.path``, as if this one were not there."""
    me = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            logging.getLogger("otel_lockwatch").warning(
                "otel-lockwatch: the next sitecustomize failed: %s", exc
            )
    except Exception as exc:
        logging.getLogger("otel_lockwatch").warning(
            "otel-lockwatch: the next sitecustomize failed: %s", exc
        )
    finally:
        # Our directory goes back where it was; whatever the other one added stays.
        for i, p in enumerate(saved):
            if os.path.abspath(p or os.curdir) == _HERE and p not in sys.path:
                sys.path.insert(min(i, len(sys.path)), p)
        if "sitecustomize" not in sys.modules and me is not None:
            sys.modules["sitecustomize"] = me


_chain()
_instrument()
