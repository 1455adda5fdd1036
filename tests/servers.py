"""Real servers for the tests, on free loopback ports, stopped when the test ends.

- :func:`redis_server`: Debian's ``redis-server`` (no persistence), for redis-py's pools and locks.
- :func:`http_server`: the standard library's ``ThreadingHTTPServer`` answering ``GET`` after a
  fixed delay, in a process of its own (``slow_http_server.py``), for urllib3's and httpx's
  pools.
- :func:`postgres_server`: a throwaway PostgreSQL cluster of Debian's ``postgresql`` (``initdb``
  and ``pg_ctl`` from ``/usr/lib/postgresql/*/bin``), for psycopg_pool's pool. PostgreSQL refuses
  to run as root: as root the cluster is made and run as the ``postgres`` user (made here when
  missing), with ``runuser``.

A missing ``redis-server`` or ``postgresql`` skips its tests, and fails them under ``CI=true``
(``scripts/test.sh`` installs both).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server(workdir: Path, timeout_s: float = 10.0) -> Iterator[int]:
    """A ``redis-server`` on a free loopback port; yields the port."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is missing (scripts/test.sh installs it)")
        pytest.skip("redis-server is not installed")
    port = free_port()
    log = (workdir / "redis.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not start: {(workdir / 'redis.log').read_text()}"
                )
            time.sleep(0.05)  # ok: polling the server's start, with a deadline
        yield port
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """End a server: SIGTERM, then SIGKILL if it is still there after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def http_server(delay_s: float = 0.01, timeout_s: float = 60.0) -> Iterator[int]:
    """A threading HTTP server answering every GET after ``delay_s``, in a process of its own
    (``slow_http_server.py``: its threads do not share the tested interpreter), on a free
    loopback port; yields the port. (``timeout_s`` is only for a server that never prints its
    port: a free-threaded 3.13 interpreter beside four busy processes took 9 s to run
    ``-c pass``, its imports yielding the processor some 4,500 times, and more than 10 s to
    start this server.)"""
    script = Path(__file__).with_name("slow_http_server.py")
    proc = subprocess.Popen(
        [sys.executable, "-I", str(script), repr(delay_s)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        ready = threading.Timer(timeout_s, proc.kill)  # a server that never prints its port
        ready.start()
        try:
            line = proc.stdout.readline()  # the port, or EOF when the server died
        finally:
            ready.cancel()
        if not line.strip().isdigit():
            raise RuntimeError(f"the HTTP server did not start (exit status {proc.poll()})")
        yield int(line)
    finally:
        _stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with ``initdb`` and ``pg_ctl``."""
    found = [
        Path(d)
        for d in glob.glob("/usr/lib/postgresql/*/bin")
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists()
    ]
    return max(found, key=lambda d: int(d.parent.name), default=None) if found else None


def _as_postgres_user() -> list[str]:
    """The command prefix that runs PostgreSQL's tools: as ourselves, or, as root, as the
    ``postgres`` user (made when missing)."""
    if os.geteuid() != 0:
        return []
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True,
            capture_output=True,
        )
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_server(timeout_s: float = 30.0) -> Iterator[str]:
    """A PostgreSQL cluster of its own on a free loopback port (trust authentication, no other
    listener), in a new directory under the temporary directory (one the ``postgres`` user can
    reach, when it runs the cluster); yields its connection string. The cluster is stopped and
    its directory removed at the end."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("postgresql is missing (scripts/test.sh installs it)")
        pytest.skip("postgresql (initdb, pg_ctl) is not installed")
    as_user = _as_postgres_user()
    user = "postgres" if as_user else None
    top = Path(tempfile.mkdtemp(prefix="lockwatch-pg-"))
    cluster = top / "data"
    cluster.mkdir(mode=0o700)
    if user:
        shutil.chown(top, user)
        shutil.chown(cluster, user)
    try:
        yield from _run_postgres(bin_dir, as_user, user, cluster, timeout_s)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _run_postgres(
    bin_dir: Path, as_user: list[str], user: str | None, cluster: Path, timeout_s: float
) -> Iterator[str]:
    initdb = [str(bin_dir / "initdb"), "-D", str(cluster), "--auth=trust", "--no-sync"]
    made = subprocess.run([*as_user, *initdb, *(["-U", user] if user else [])], capture_output=True)
    if made.returncode != 0:
        raise RuntimeError(f"initdb failed: {made.stderr.decode()}")
    port = free_port()
    options = f"-p {port} -k {cluster} -c listen_addresses=127.0.0.1 -c fsync=off"
    log = cluster / "server.log"
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(cluster)]
    started = subprocess.run(
        [
            *as_user,
            *pg_ctl,
            "-l",
            str(log),
            "-o",
            options,
            "-w",
            "-t",
            str(int(timeout_s)),
            "start",
        ],
        capture_output=True,
    )
    if started.returncode != 0:
        tail = log.read_text() if log.exists() else started.stderr.decode()
        raise RuntimeError(f"postgres did not start: {tail}")
    try:
        who = user or os.environ.get("USER") or "postgres"
        yield f"host=127.0.0.1 port={port} dbname=postgres user={who}"
    finally:
        subprocess.run([*as_user, *pg_ctl, "-m", "immediate", "-w", "stop"], capture_output=True)
