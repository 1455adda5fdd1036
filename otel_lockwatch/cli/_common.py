"""What every ``otel-lockwatch`` subcommand shares: its name, exit statuses, the user-error
exception, argument helpers, and the atomic write of an output file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import IO, NoReturn

from otel_lockwatch.manifest._io import write_atomically

__all__ = [
    "DEFAULT_OTLP_PROTOCOL",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_VIOLATION",
    "PROG",
    "ArgumentParser",
    "CommandError",
    "byte_size",
    "positive_int",
    "use_color",
    "write_text_atomic",
]

PROG = "otel-lockwatch"

#: The OTLP protocol of ``demo`` and ``run`` when ``OTEL_EXPORTER_OTLP_PROTOCOL`` is unset: the
#: specification's default, and the exporter the package depends on (``grpc`` is an extra).
DEFAULT_OTLP_PROTOCOL = "http/protobuf"

#: Exit status of a successful command, of a refused pool size, of a user error.
EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A user error a subcommand reports: printed as one ``otel-lockwatch: error:`` line,
    exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors reach :func:`main` as :class:`CommandError` (one line,
    exit 2) instead of a usage dump and ``sys.exit`` from deep inside ``parse_args``."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see '{self.prog} --help')")


def positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_size(text: str) -> int:
    """A size in bytes: a positive integer, optionally followed by ``K``, ``M`` or ``G``
    (binary: ``64M`` is 64 MiB)."""
    number, unit = text.strip(), ""
    if number[-1:].upper() in ("K", "M", "G"):
        number, unit = number[:-1], number[-1].upper()
    if not (number.isascii() and number.isdigit()) or len(number) > 20 or int(number) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of bytes (such as 64M), got {text!r}"
        )
    return int(number) * _UNITS[unit]


def use_color(stream: IO[str]) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader sees the old file or the whole new one, never a partial one.

    Raises:
        OSError: when the directory does not exist or is not writable (nothing is left behind).
    """
    write_atomically(Path(os.path.abspath(os.fspath(path))), text.encode("utf-8"))
