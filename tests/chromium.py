"""A real headless Chromium for the tests, driven over the DevTools protocol on a pipe.

One browser process serves a whole test module: :class:`Browser` opens a tab per page, sets its
viewport width, loads a ``file://`` URL, evaluates JavaScript in it (the browser's own geometry,
``getBoundingClientRect``) and takes full-page screenshots. The protocol runs over the two pipes
``--remote-debugging-pipe`` opens on the browser's descriptors 3 and 4 (JSON messages ended by a
NUL byte), so no port, no websocket library and no second process are needed.

A missing browser skips the tests that need one, and fails them under ``CI`` (``scripts/test.sh``
installs Debian's ``chromium``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 60.0


def find_browser() -> str:
    """The path of an installed Chromium, or a skip (a failure under ``CI``)."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but no Chromium is installed (looked for {', '.join(BROWSERS)})")
    pytest.skip(f"Chromium is not installed (looked for {', '.join(BROWSERS)}); CI installs it")


_TRAMPOLINE = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _above_4(fd: int) -> int:
    """``fd`` moved to a descriptor number above 4 (the original is closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or not in time."""


class Browser:
    """One headless Chromium, spoken to over ``--remote-debugging-pipe``."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Above 4, so that placing them on 3 and 4 below cannot overwrite one with the other
        # (os.pipe() may hand out 3 and 4 themselves when a test closed them).
        to_browser_r, from_browser_w = _above_4(to_browser_r), _above_4(from_browser_w)
        # The browser reads commands on its fd 3 and writes answers on its fd 4. A Python
        # trampoline puts the pipes there and execs it (a POSIX shell's redirections take
        # one-digit descriptors only, and a long test session has more open than that).
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _TRAMPOLINE,
                str(to_browser_r),
                str(from_browser_w),
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []

    # -- the protocol --------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser went away (exit {self._proc.poll()})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send a command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        """The next event ``method`` of the session (one already received counts)."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method and event.get("sessionId") == session:
                    del self._events[i]
                    return event.get("params", {})
            self._events.append(self._read_message(deadline))

    # -- pages ---------------------------------------------------------------------------------
    def open(self, width: int, height: int = 900) -> str:
        """A new tab with a ``width`` x ``height`` viewport; returns its session id."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return session

    def load(self, session: str, url: str) -> None:
        """Navigate the tab to ``url`` and wait for its load event."""
        self._events = [e for e in self._events if e.get("sessionId") != session]
        self.send("Page.navigate", session, url=url)
        self.wait_event("Page.loadEventFired", session)

    def evaluate(self, session: str, expression: str) -> Any:
        """The JSON value of a JavaScript expression evaluated in the tab."""
        result = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"the script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path) -> bytes:
        """A PNG of the whole page (beyond the viewport), written to ``path``."""
        data = base64.b64decode(
            self.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)[
                "data"
            ]
        )
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.send("Browser.close")
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
