"""``otel-lockwatch run -- PROGRAM ...``: run a program under lockwatch, then print its report.

This is what ``opentelemetry-instrument PROGRAM ...`` does with the ``lockwatch`` instrumentor
loaded (it is registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument`` loads it like any contrib instrumentation): the program's Python
starts with OpenTelemetry's ``sitecustomize``, which configures the SDK and instruments the
program before its first line runs. The manifest is written when the program exits (normally,
by an exception, by Ctrl-C or by SIGTERM), and ``run`` prints its report.

The child's environment is the caller's, with:

- ``OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH``: ``--manifest PATH``, or a file in a fresh temporary
  directory removed afterwards; ``OTEL_PYTHON_LOCKWATCH_MANIFEST=true``;
- ``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, ``OTEL_LOGS_EXPORTER``: ``none``, or
  ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (each only when not already set), and
  then ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` unless set (the distro's own default
  is ``grpc``, which needs the ``grpc`` extra);
- ``OTEL_SERVICE_NAME``: the program's name (``app`` for ``python app.py``) unless set.

Ctrl-C and SIGTERM reach the program: SIGTERM is forwarded to it; Ctrl-C at a terminal reaches
it directly (it is in the terminal's foreground process group, like ``run`` itself), and a
SIGINT sent to ``run`` alone is forwarded. ``run`` then waits for the program, prints the report
and exits with the program's status (128 + N when a signal N ended it). When the program left no
manifest (it is not a Python program, its Python does not have otel-lockwatch installed, or it
died before the instrumentation started), ``run`` says so on one line and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from otel_lockwatch._settings import SETTINGS

__all__ = [
    "DESCRIPTION",
    "HELP",
    "child_environment",
    "add_arguments",
    "instrument_command",
    "program_name",
    "run",
]

HELP = "run a Python program under lockwatch (opentelemetry-instrument) and print its report"
DESCRIPTION = (
    "Run PROGRAM under lockwatch auto-instrumentation (opentelemetry-instrument with the "
    "lockwatch instrumentor), wait for it, and print the contention report of the manifest it "
    "left. Exits with the program's status; 2 when it left no manifest. Nothing is exported "
    "over the network unless OTEL_EXPORTER_OTLP_ENDPOINT is set. "
    "Example: otel-lockwatch run -- python app.py --jobs 8"
)

_PYTHON = re.compile(r"^python[0-9.]*(\.exe)?$")
# Interpreter options that take a value in the next argument.
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``run`` options to its parser.

    Args:
        p: the subcommand's parser.
    """
    p.add_argument(
        "-m",
        "--manifest",
        metavar="PATH",
        help="where the program writes its manifest ({pid} is the program's process id); "
        "default a temporary file, removed afterwards",
    )
    p.add_argument(
        "program",
        metavar="-- PROGRAM [ARG ...]",
        nargs=argparse.REMAINDER,
        help="the program and its arguments, e.g. -- python app.py",
    )


# --------------------------------------------------------------------------------------------
# The child's command and environment


def instrument_command(executable: str = sys.executable) -> str:
    """The ``opentelemetry-instrument`` of this Python (next to ``executable``), else the one
    on ``PATH``.

    Args:
        executable: the Python whose environment has otel-lockwatch installed.

    Raises:
        CommandError: none can be found.
    """
    from otel_lockwatch.cli._common import CommandError

    bindir = Path(executable).parent
    for name in ("opentelemetry-instrument", "opentelemetry-instrument.exe"):
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("opentelemetry-instrument")
    if found is None:
        raise CommandError(
            f"opentelemetry-instrument is neither next to {executable} nor on PATH "
            "(pip install opentelemetry-instrumentation)"
        )
    return found


def program_name(program: Sequence[str]) -> str:
    """The service name of a command line: the script of ``python app.py`` (``app``), the
    module of ``python -m pkg.app`` (``pkg.app``), else the command's file name.

    Args:
        program: the command line, not empty.
    """
    command = os.path.basename(program[0])
    if not _PYTHON.match(command):
        return command
    args = iter(program[1:])
    for arg in args:
        if arg == "-m":
            return next(args, command)
        if arg == "-c":
            return command
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        return Path(arg).stem or command
    return command


def child_environment(
    environ: Mapping[str, str], manifest_path: str, program: Sequence[str]
) -> dict[str, str]:
    """The environment ``run`` gives the program (see the module docstring).

    Args:
        environ: the caller's environment.
        manifest_path: where the program must write its manifest.
        program: the command line (for the default service name).
    """
    from otel_lockwatch.cli._common import DEFAULT_OTLP_PROTOCOL

    env = dict(environ)
    env["OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH"] = manifest_path
    env["OTEL_PYTHON_LOCKWATCH_MANIFEST"] = "true"
    exporter = "otlp" if env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() else "none"
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        if not env.get(var, "").strip():
            env[var] = exporter
    if exporter == "otlp" and not env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip():
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = DEFAULT_OTLP_PROTOCOL
    if not env.get("OTEL_SERVICE_NAME", "").strip():
        env["OTEL_SERVICE_NAME"] = program_name(program)
    return env


# --------------------------------------------------------------------------------------------
# Signals


def _terminal_interrupts_us() -> bool:
    """True when a Ctrl-C at a terminal reaches our whole process group (the child included):
    one of our standard streams is a terminal whose foreground process group is ours."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def _forwarding(children: list[subprocess.Popen[bytes]]) -> Iterator[list[int]]:
    """Forward SIGTERM (and a SIGINT that the terminal did not already deliver to the child) to
    the child in ``children``, for the duration of the block. Signals that arrive before the
    child exists are kept in the list the block receives, for it to deliver. Only the main
    thread can handle signals; elsewhere this does nothing."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and _terminal_interrupts_us():
            return  # the child got this Ctrl-C too; a second one could cut its clean-up short
        if not children:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            children[0].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        yield pending
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_child(command: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run ``command`` to its end with signals forwarded; returns (exit status, pid)."""
    from otel_lockwatch.cli._common import CommandError

    children: list[subprocess.Popen[bytes]] = []
    with _forwarding(children) as pending:
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise CommandError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
        children.append(child)
        for signum in pending:  # arrived while the child was being started
            child.send_signal(signum)
        status = child.wait()
    return (128 - status if status < 0 else status), child.pid


# --------------------------------------------------------------------------------------------
# The command


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run the program under lockwatch and print the report of its manifest.

    Args:
        args: the parsed ``run`` options (``manifest``, ``program``).
        out: where the report goes (after the program's own output).
        err: unused; the program writes to the inherited stderr itself.

    Returns:
        The program's exit status (128 + N when signal N ended it).

    Raises:
        CommandError: no program, a program that cannot be found or started, lockwatch
            disabled in the environment, or no manifest left behind.
    """
    from otel_lockwatch.cli import _common as _cli
    from otel_lockwatch.cli import _report_text
    from otel_lockwatch.manifest._io import load_manifest

    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        raise _cli.CommandError(
            f"no program to run (usage: {_cli.PROG} run [--manifest PATH] -- python app.py ...)"
        )
    if shutil.which(program[0]) is None:
        raise _cli.CommandError(f"program {program[0]!r} not found (or not executable)")
    disabled = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    if "lockwatch" in {name.strip() for name in disabled.split(",")}:
        raise _cli.CommandError(
            f"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS={disabled!r} disables lockwatch"
        )
    command = [instrument_command(), *program]

    tmpdir = None
    if args.manifest:
        path = os.path.abspath(args.manifest)
        directory = Path(path.replace("{pid}", "0")).parent
        if not directory.is_dir():
            raise _cli.CommandError(
                f"cannot write the manifest to {args.manifest}: no directory {directory}"
            )
    else:
        tmpdir = tempfile.mkdtemp(prefix="otel-lockwatch-run-")
        path = os.path.join(tmpdir, os.path.basename(SETTINGS["manifest_path"].default))
    try:
        before = None if "{pid}" in path else _signature(path)
        status, pid = _run_child(command, child_environment(os.environ, path, program))
        written = path.replace("{pid}", str(pid))
        after = _signature(written)
        if after is None or after == before:
            raise _cli.CommandError(
                f"{' '.join(program)} exited with status {status} and left no manifest "
                f"(is it a Python program whose Python has otel-lockwatch installed?)"
            )
        manifest = load_manifest(written).to_dict()
        try:
            source = written if tmpdir is None else " ".join(program)
            text = _report_text.render_text(manifest, color=_cli.use_color(out), source=source)
        except ValueError as exc:
            raise _cli.CommandError(f"{written}: {exc}") from None
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    out.flush()
    out.write("\n" + text)
    return status
