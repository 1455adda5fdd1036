"""otel-lockwatch: watch the locks of a worker pool, and read what it left behind.

A program run under lockwatch writes a contention manifest when it exits: a verdict
(LOW_CONTENTION, HOT_LOCK_DETECTED, STARVATION_OBSERVED, CYCLIC_ORDERING_DETECTED,
LEASE_OVERRUN_DETECTED), the recommended pool size for its successor, the hot locks, the
starved workers and the lock-order cycles. This command shows it, runs programs under it, and
reads manifests:

  demo                     a built-in worker pool under lockwatch, then its report
  run -- python app.py     a program under lockwatch (opentelemetry-instrument), then its report
  report MANIFEST          the terminal summary; --json, --html OUT, --dot OUT
  check MANIFEST -p N      may a successor spawn N workers? exit 0 yes, 1 no, 2 unreadable
  merge INPUT... -o OUT    one manifest from the manifests of several processes (files,
                           directories, globs, a Collector's file of manifest records)

Exit status: 0 success (or admissible), 1 pool-size violation, 2 a user error (a missing or
invalid file, an edited manifest or one that does not agree with its data, a bad option, a
program that left no manifest), reported on one line; run exits with the program's status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from otel_lockwatch._version import __version__
from otel_lockwatch.cli import _demo, _report_html, _report_text, _run
from otel_lockwatch.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VIOLATION,
    PROG,
    ArgumentParser,
    CommandError,
    byte_size,
    positive_int,
    use_color,
    write_text_atomic,
)
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._admission import may_spawn_pool_size
from otel_lockwatch.manifest._fleet import (
    FILES_PER_JOB,
    check_output,
    expand_inputs,
    fold_inputs,
)
from otel_lockwatch.manifest._io import DEFAULT_MAX_BYTES, dump_manifest, load_manifest
from otel_lockwatch.manifest._merge import MAX_MERGED_WORKERS
from otel_lockwatch.record._witness import printable

__all__ = ["PROG", "SUBCOMMANDS", "CommandError", "Subcommand", "build_parser", "main"]


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of ``otel-lockwatch``.

    Attributes:
        name: the word on the command line.
        help: one line for the top-level ``--help``.
        add_arguments: adds the subcommand's arguments to its parser.
        run: runs it with the parsed arguments and the output streams; returns the exit status,
            or raises :class:`CommandError` (or ``ManifestError``) for a user error.
        description: the subcommand's ``--help`` text (defaults to ``help``).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, IO[str], IO[str]], int]
    description: str | None = None


# --------------------------------------------------------------------------------------------
# Helpers


def _add_max_bytes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-bytes",
        metavar="SIZE",
        type=byte_size,
        default=DEFAULT_MAX_BYTES,
        help="refuse a manifest larger than SIZE bytes (K, M, G suffixes; default 64M)",
    )


def _write(path: str, text: str, what: str) -> None:
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise CommandError(
            f"cannot write the {what} to {printable(path, None)}: {exc.strerror or exc}"
        ) from None


# --------------------------------------------------------------------------------------------
# report


def _add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="a manifest written by otel-lockwatch")
    p.add_argument("--json", action="store_true", help="print the report as JSON (sorted keys)")
    p.add_argument(
        "--html", metavar="OUT", help="also write a self-contained HTML report with charts to OUT"
    )
    p.add_argument("--dot", metavar="OUT", help="also write the lock-order graph as Graphviz DOT")
    _add_max_bytes(p)


def _run_report(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    manifest = load_manifest(args.manifest, max_bytes=args.max_bytes).to_dict()
    try:
        # Render everything before writing anything: a failure leaves no file half-done.
        text = (
            _report_text.render_json(manifest)
            if args.json
            else _report_text.render_text(manifest, color=use_color(out), source=args.manifest)
        )
        page = _report_html.render_html(manifest) if args.html else None
        dot = _report_text.render_dot(manifest) if args.dot else None
    except ValueError as exc:
        raise CommandError(f"{printable(args.manifest, None)}: {exc}") from None
    if page is not None:
        _write(args.html, page, "HTML report")
    if dot is not None:
        _write(args.dot, dot, "DOT graph")
    out.write(text)
    for path, what in ((args.html, "HTML report"), (args.dot, "lock-order graph")):
        if path:
            print(f"{PROG}: wrote the {what} to {printable(path, None)}", file=err)
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# check


def _add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="the predecessor's manifest")
    p.add_argument(
        "-p",
        "--pool-size",
        metavar="N",
        type=positive_int,
        required=True,
        help="the pool size the successor wants to spawn",
    )
    _add_max_bytes(p)


def _run_check(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    manifest = load_manifest(args.manifest, max_bytes=args.max_bytes)
    admissible, reason = may_spawn_pool_size(manifest, args.pool_size)
    print(reason, file=out)
    return EXIT_OK if admissible else EXIT_VIOLATION


# --------------------------------------------------------------------------------------------
# merge


def _add_merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "manifests",
        metavar="INPUT",
        nargs="+",
        help="manifest files, directories of them, glob patterns, or a Collector's file of "
        "lockwatch.manifest records",
    )
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="where to write the result")
    p.add_argument(
        "--max-workers",
        metavar="N",
        type=positive_int,
        default=MAX_MERGED_WORKERS,
        help="workers kept per lock class, the longest waits; the others are summed into one "
        f"'(other workers)' row (default {MAX_MERGED_WORKERS})",
    )
    p.add_argument(
        "-j",
        "--jobs",
        metavar="N",
        type=positive_int,
        default=_cpus(),
        help="processes reading the inputs, each a contiguous share of the files (default: the "
        f"CPUs this process may use, {_cpus()} here; one per {FILES_PER_JOB} files at most)",
    )
    _add_max_bytes(p)


def _cpus() -> int:
    """The CPUs this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _run_merge(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    try:
        return _merge(args, out)
    except MemoryError:
        pass
    # Raised past the handler, when what the merge built is freed.
    raise CommandError(
        "cannot merge: out of memory (the process's memory is limited, or the inputs are too "
        "large for it; --jobs 1 holds one fold, --max-workers fewer workers)"
    )


def _merge(args: argparse.Namespace, out: IO[str]) -> int:
    files = expand_inputs(args.manifests)
    check_output(args.manifests, files, args.output)
    fold = fold_inputs(
        files,
        max_workers=args.max_workers,
        max_bytes=args.max_bytes,
        jobs=args.jobs,
    )
    if not fold.count:
        raise CommandError("nothing to merge: the inputs hold no manifest")
    try:
        merged = fold.result()
    except ValueError as exc:  # ManifestError included: manifests that cannot be combined
        raise CommandError(f"cannot merge: {exc}") from None
    try:
        dump_manifest(merged, args.output)
    except OSError as exc:
        raise CommandError(
            f"cannot write the manifest to {printable(args.output, None)}: {exc.strerror or exc}"
        ) from None
    process = merged.process
    print(
        f"merged {fold.count} manifests into {printable(args.output, None)}: "
        f"verdict {merged.verdict}, {process.get('merged', fold.count)} processes, "
        f"{len(merged.locks)} locks, recommended pool size {merged.recommended_pool_size}",
        file=out,
    )
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# The registry

#: The subcommands, in the order ``--help`` lists them.
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("demo", _demo.HELP, _demo.add_arguments, _demo.run, description=_demo.DESCRIPTION),
    Subcommand("run", _run.HELP, _run.add_arguments, _run.run, description=_run.DESCRIPTION),
    Subcommand(
        "report",
        "print a manifest's contention report (--json, --html OUT, --dot OUT)",
        _add_report_arguments,
        _run_report,
        description=(
            "Print the contention report of a manifest: verdict, pool size, hot locks with "
            "their wait share and hold times, starvation, lock-order cycles (lockdep-style), "
            "effective throughput and a per-lock table. Colour only on a terminal without "
            "NO_COLOR."
        ),
    ),
    Subcommand(
        "check",
        "may a successor spawn N workers? exit 0 admissible, 1 violation, 2 unreadable manifest",
        _add_check_arguments,
        _run_check,
        description=(
            "Admission check of a pool size against a manifest: prints the reason "
            "(POOL_SIZE_ADMISSIBLE or POOL_SIZE_VIOLATION) and exits 0 when admissible, 1 on a "
            "violation, 2 when the manifest is missing, invalid or edited."
        ),
    ),
    Subcommand(
        "merge",
        "combine the manifests of several processes into one",
        _add_merge_arguments,
        _run_merge,
        description=(
            "Combine the manifests of several processes into one (distributions merged "
            "exactly, verdict evaluated again) and write it atomically to OUT. Each INPUT is a "
            "manifest file, a directory (its *.json and *.jsonl files), a glob pattern, or the "
            "file a Collector's file exporter writes the lockwatch.manifest log records to "
            "(the latest record of each process is merged). The inputs are read one at a time."
        ),
    ),
)


def build_parser(subcommands: Sequence[Subcommand] = SUBCOMMANDS) -> argparse.ArgumentParser:
    """The argument parser of ``otel-lockwatch`` with ``subcommands``.

    Args:
        subcommands: the subcommands to offer, in ``--help`` order.
    """
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in subcommands:
        p = sub.add_parser(
            command.name, help=command.help, description=command.description or command.help
        )
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``otel-lockwatch`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Args:
        argv: the arguments after the program name.

    Returns:
        0 on success (and for an admissible pool size), 1 for a pool-size violation, 2 for a
        user error, which is printed as one ``otel-lockwatch: error: ...`` line on stderr;
        130 when interrupted, 141 when the reader of stdout went away (a closed pipe).

    Raises:
        SystemExit: for ``--help`` and ``--version`` only (status 0), as argparse does.
    """
    out, err = sys.stdout, sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return int(args._run(args, out, err))
    except (CommandError, ManifestError) as exc:
        # One line whatever the message holds (a path, a name from the manifest).
        print(f"{PROG}: error: {printable(str(exc), None)}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=err)
        return 130
    except BrokenPipeError:
        # The reader went away (``otel-lockwatch report m.json | head``): stop quietly, and keep
        # the interpreter's final flush of stdout from raising again at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
        except (OSError, ValueError, AttributeError):  # not a real file (captured output)
            pass
        return 128 + 13  # as if killed by SIGPIPE, what a shell reports
