"""A headless chromium for the page test (Debian's chromium, driven over the DevTools protocol on a pipe), and
the screenshot and visibility checks it is read with."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from PIL import Image

from tests.report.helpers import decode_png


def above_9(fd: int) -> int:
    """The same pipe end on a descriptor above 9 (the old one closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """Headless chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: it reads
    commands on its fd 3 and answers on fd 4, each message JSON ended by a NUL byte), with one page attached."""

    FLAGS = (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--remote-debugging-pipe",
    )

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "chromium is not installed: .ci/system-deps.sh installs it (apt-get install chromium)"
        profile.mkdir(parents=True)
        self.log = profile / "chromium.log"
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # bash puts chromium's ends on fds 3 and 4, where it expects them, then becomes chromium; the ends are first
        # moved above 9 so that the wiring never closes a pipe it has just put in place
        commands_r, replies_w = (above_9(fd) for fd in (commands_r, replies_w))
        wiring = f'exec "$0" "$@" 3<&{commands_r} 4>&{replies_w} {commands_r}<&- {replies_w}>&-'
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", wiring, binary, *self.FLAGS, f"--user-data-dir={profile}"],
                pass_fds=(commands_r, replies_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        os.close(commands_r)
        os.close(replies_w)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable", page=True)
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, page=True)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._replies, 1 << 20) if ready else b""
            if not chunk:
                why = "timed out" if not ready else "closed the pipe"
                raise AssertionError(f"chromium {why}: {self.log.read_text(errors='replace')[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 30) -> dict:
        self._id += 1
        command: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if page:
            command["sessionId"] = self.session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") != self._id:
                self.events.append(message)
                continue
            assert "error" not in message, (method, message["error"])
            return message["result"]

    def wait_for(self, event: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    return self.events.pop(i)
            self.events.append(self._message(deadline))

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, page=True)
        self.wait_for("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, page=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) on the middle of the element, scrolled into view."""
        x, y = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            event = {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            self.send("Input.dispatchMouseEvent", event, page=True)

    def screenshot(self, path: Path) -> Image.Image:
        """The whole page, not only the window."""
        size = self.send("Page.getLayoutMetrics", page=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}, True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return decode_png(path)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except AssertionError:
            pass  # it may close the pipe before answering
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)


def near(colours: list[tuple[int, tuple[int, int, int]]], rgb: tuple[int, int, int], within: int = 40) -> int:
    return sum(n for n, c in colours if all(abs(a - b) < within for a, b in zip(c, rgb, strict=True)))


def visible(selector: str) -> str:
    """A JS expression: is the element laid out and shown (not display:none, itself or an ancestor)?"""
    return f"(() => {{ const e = document.querySelector({json.dumps(selector)}); return !!e && e.getClientRects().length > 0; }})()"
