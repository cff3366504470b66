"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), stdlib only.

The browser reads JSON commands, each ended by a NUL byte, on its file descriptor 3 and writes replies and events
the same way on 4: no websocket, no port, no PyPI package. ``Chromium.open(url)`` loads a page in a window of the
given size and returns a ``Tab`` that evaluates JavaScript and takes screenshots. The flags keep a browser on a
closed network from reaching out (background networking, component updates, sync, QUIC) and from needing a GPU
or a sandbox; every read has a deadline, so a browser that hangs fails the test instead of holding it.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe")
DEADLINE_S = 120.0  # for one reply: a report page with 30 embedded figures loads in a few seconds


def find_browser() -> str | None:
    """The Chromium binary: $SOLBENCH_CHROMIUM, else Debian's /usr/bin/chromium (or another usual path)."""
    named = os.environ.get("SOLBENCH_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    return next((path for path in CANDIDATES if os.access(path, os.X_OK)), shutil.which("chromium"))


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless browser with a fresh profile; use as a context manager."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="solbench-chromium-")
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # the child's ends, above 3 and 4 so that moving them there cannot overwrite one with the other
        child_r = fcntl.fcntl(commands_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(replies_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(commands_r)
        os.close(replies_w)

        def on_3_and_4():
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        args = [binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]
        self._log = open(Path(self.profile) / "stderr.txt", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                        preexec_fn=on_3_and_4, pass_fds=(3, 4))
        os.close(child_r)
        os.close(child_w)
        self._next_id, self._buffer, self.events = 0, b"", []

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept in ``events``)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        """The first event ``method`` of ``session`` (kept or still to come)."""
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    self.events.remove(event)
                    return event
            self.events.append(self._read())

    def _read(self) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise BrowserError(f"no reply from Chromium in {DEADLINE_S:.0f} s; its log: {self.log_tail()}")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe (exit {self.process.poll()}); its log: {self.log_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def log_tail(self) -> str:
        self._log.flush()
        return (Path(self.profile) / "stderr.txt").read_text(errors="replace")[-2000:]

    def open(self, url: str) -> "Tab":
        """A new tab of the window's size showing ``url``, once its load event has fired."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        self.send("Page.enable", {}, session)
        self.send("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired", session)
        return Tab(self, session)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("Browser.close")
            except (BrowserError, OSError):
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self._commands, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class Tab:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str):
        """The value of a JavaScript expression (a promise is awaited), as JSON."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The window (the page's first screen) as a PNG file."""
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
