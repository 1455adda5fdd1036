"""The package as a user gets it: a wheel built from a clean clone, installed in a fresh venv.

The wheel must carry every subpackage (and the bootstrap ``sitecustomize`` that spawned children
start with); installed on its own (no source tree on the path), the command runs its main job.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a clean clone of the repository's HEAD (its committed files only)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no clean clone to build from")
    work = tmp_path_factory.mktemp("wheel")
    clone = work / "clone"
    done = _run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)])
    assert done.returncode == 0, done.stderr
    out = work / "dist"
    # Built as a user builds it: the pure-Python leg's switch (LOCKWATCH_DISABLE_EXTENSIONS,
    # which a build honours too) is the test run's, not the user's.
    env = {k: v for k, v in os.environ.items() if k != "LOCKWATCH_DISABLE_EXTENSIONS"}
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(clone)],
        env=env,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (path,) = out.glob("otel_lockwatch-*.whl")
    return path


def _source_packages() -> set[str]:
    return {
        str(p.parent.relative_to(ROOT)).replace(os.sep, "/")
        for p in (ROOT / "otel_lockwatch").rglob("__init__.py")
    }


def test_the_wheel_carries_every_subpackage(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in sorted(_source_packages()):
        assert f"{package}/__init__.py" in names, f"{package} is missing from {wheel.name}"
    assert "otel_lockwatch/capture/_bootstrap/sitecustomize.py" in names
    assert "otel_lockwatch/py.typed" in names
    for extension in ("capture/_speedups", "record/_merge_speedups"):
        assert f"otel_lockwatch/{extension}.pyi" in names
        if importlib.util.find_spec(f"otel_lockwatch.{extension.replace('/', '.')}") is not None:
            # This machine builds the C fast paths: so did the wheel.
            assert any(
                n.startswith(f"otel_lockwatch/{extension}.") and n.endswith(".so") for n in names
            ), f"{extension} is not compiled into {wheel.name}"
    assert any(n.startswith("otel_lockwatch-") and n.endswith("/LICENSE") for n in names) or any(
        n.endswith("licenses/LICENSE") for n in names
    ), "the wheel has no LICENSE"


def test_a_fresh_venv_runs_the_demo_from_the_wheel(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)]
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "OTEL_PYTHON_LOCKWATCH_MANIFEST_PATH")
    }
    env["OTEL_TRACES_EXPORTER"] = env["OTEL_METRICS_EXPORTER"] = "none"
    where = _run(
        [str(python), "-c", "import otel_lockwatch; print(otel_lockwatch.__file__)"],
        cwd=tmp_path,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert str(venv) in where.stdout, "imported from somewhere else than the venv"
    demo = _run(
        [str(venv / "bin" / "otel-lockwatch"), "demo", "--seconds", "1", "-m", "m.json"],
        cwd=tmp_path,
        env=env,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "verdict" in demo.stdout
    assert (tmp_path / "m.json").is_file()
