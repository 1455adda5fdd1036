"""The test matrix as nox sessions: one a leg (a CPython, a path, and the tests it runs).

    nox                     every leg: the README's (this machine's python3) and the matrix's
    nox -l                  the sessions
    nox -s 3.14 3.15-pure   those legs (3.13t: the free-threaded build, C path)
    nox -t matrix           the matrix's legs (what .ci/run runs after the README's command)
    nox -s readme           the README's test command (scripts/test.sh: set-up, checks, its legs)

Each session runs its leg through scripts/test-pythons.sh, which finds or provisions the
interpreter (pyenv, the PATH, the Debian sid root for 3.14 and 3.15, scripts/build-python-ft.sh
for the free-threaded 3.13t), keeps the leg's venv,
checks that the leg runs the path it names and prints its wall time: nox only names and orders
the legs, so `nox -s 3.14` and `LOCKWATCH_LEGS=3.14 bash scripts/test-pythons.sh` are one run.
Arguments after ``--`` go to pytest. docs/development.md says which tests run where and why.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
RUNNER = ROOT / "scripts" / "test-pythons.sh"


def _legs(which: str) -> list[str]:
    """The legs (``3.14-pure:core``) of scripts/test-pythons.sh's README_LEGS or MATRIX_LEGS."""
    found = re.search(rf'^{which}="([^"]*)"$', RUNNER.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{RUNNER} declares no {which}")
    return found.group(1).split()


def _main_version() -> str:
    return subprocess.run(
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@nox.session(python=False)
def readme(session: nox.Session) -> None:
    """The README's test command: set-up, static checks, this machine's python3's legs."""
    session.run("bash", "scripts/test.sh", *session.posargs, external=True)


def _leg_session(leg: str, tag: str) -> None:
    name = leg.split(":")[0]

    def run(session: nox.Session) -> None:
        session.run(
            "bash", str(RUNNER), *session.posargs, env={"LOCKWATCH_LEGS": leg}, external=True
        )

    run.__doc__ = f"The {name} leg: {leg.split(':')[1]} tests."
    nox.session(name=name, python=False, tags=[tag])(run)


# Tagged: `nox -t matrix` runs the matrix's legs (what .ci/run runs after the README's command).
_MAIN = _main_version()
_ALL = []
for _tag, _list in (("readme", "README_LEGS"), ("matrix", "MATRIX_LEGS")):
    for _leg in _legs(_list):
        _leg_session(_leg.replace("main", _MAIN, 1), _tag)
        _ALL.append(_leg.replace("main", _MAIN, 1).split(":")[0])
# `nox` alone: every leg once (not the `readme` session, whose legs are among them).
nox.options.sessions = _ALL
