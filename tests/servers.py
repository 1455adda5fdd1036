"""Real servers for the tests, on free loopback ports, stopped when the test ends.

- :func:`redis_server`: Debian's ``redis-server`` (no persistence), for redis-py's pools and locks.
- :func:`http_server`: the standard library's ``ThreadingHTTPServer`` answering ``GET`` after a
  fixed delay, for urllib3's pools.

A missing ``redis-server`` skips its tests, and fails them under ``CI=true`` (``scripts/test.sh``
installs it).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
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
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_s = 0.01
    # The headers and the body go out in two writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK (40 ms), four times the delay a request is meant to take.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        time.sleep(self.delay_s)  # the server's work: the client holds its connection meanwhile
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_server(delay_s: float = 0.01) -> Iterator[int]:
    """A threading HTTP server on a free loopback port answering every GET after ``delay_s``."""
    handler = type("Handler", (_SlowHandler,), {"delay_s": delay_s})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http-server", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
