"""Headless Chromium (Debian's package; ``make install-dev`` installs it where it runs as root): a page as a
browser builds it, scripts run, and the elements it shows; or a page driven (:class:`Driven`: the mouse moved,
elements clicked, the page's state read back) over the DevTools protocol, with aiohttp's websocket."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium: `apt-get install chromium` (make install-dev does it as root)"
)
# Root needs --no-sandbox; virtual time lets the page's fetches and first timers finish before the dump.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--window-size=1100,900")


def rendered(url: str) -> str:
    """The DOM of ``url`` after its scripts ran."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(url: str, path: Path) -> None:
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={path}", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and path.exists(), done.stderr[-2000:]


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""


class Page(HTMLParser):
    """Every element of a page with its attributes and the text directly inside it."""

    VOID = frozenset({"input", "br", "meta", "img", "circle", "polyline", "hr", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop().tag != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1].text += data

    def find(self, tag: str, **attrs: str) -> list[Element]:
        """Elements ``tag`` with these attributes (``data_step`` is ``data-step``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [e for e in self.elements if e.tag == tag and all(e.attrs.get(k) == v for k, v in wanted.items())]

    def text(self) -> str:
        return " ".join(e.text for e in self.elements)


def parse(dom: str) -> Page:
    page = Page()
    page.feed(dom)
    return page


class Driven:
    """A headless Chromium page driven over the DevTools protocol: what ``--dump-dom`` cannot do (move the
    mouse over a chart, click, read back what the page's script then shows). Closes its browser on exit."""

    def __init__(self, url: str, size: tuple[int, int] = (1100, 900)) -> None:
        assert CHROMIUM is not None
        # chromium's helpers may still write the profile as its main process exits: a leftover file is no failure
        self.profile = tempfile.TemporaryDirectory(prefix="spotmorph-chromium-", ignore_cleanup_errors=True)
        flags = [f for f in FLAGS if not f.startswith(("--virtual-time-budget", "--window-size"))]
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                *flags,
                f"--window-size={size[0]},{size[1]}",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.loop = asyncio.new_event_loop()
        self.ids = itertools.count(1)
        try:
            self.loop.run_until_complete(self._connect())
            self.call("Page.enable")
            self.call("Page.navigate", url=url)
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        ready = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not ready.exists() or len(ready.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline and self.process.poll() is None, "chromium did not start"
            await asyncio.sleep(0.05)
        port = ready.read_text().splitlines()[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as reply:
            targets = await reply.json()
        page = next(t for t in targets if t["type"] == "page")
        self.socket = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        number = next(self.ids)
        await self.socket.send_json({"id": number, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.socket.receive_json(), 30)
            if message.get("id") == number:
                assert "error" not in message, message
                result: dict[str, Any] = message.get("result", {})
                return result

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.loop.run_until_complete(self._call(method, params))

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-like values only)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait(self, expression: str, seconds: float = 20.0) -> Any:
        """The first truthy value of ``expression``, polled."""
        deadline = time.monotonic() + seconds
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"waited {seconds} s for {expression}"
            time.sleep(0.05)
        return value

    def move_mouse(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, selector: str) -> None:
        assert self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e && e.click(); return !!e; }})()"
        )

    def screenshot(self, path: Path, clip: tuple[float, float, float, float] | None = None) -> None:
        """A PNG of ``clip`` (x, y, width, height in page pixels; None: the whole page, however long)."""
        if clip is None:
            clip = (
                0,
                0,
                self.evaluate("document.documentElement.scrollWidth"),
                self.evaluate("document.documentElement.scrollHeight"),
            )
        x, y, width, height = clip
        area = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=area)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        if hasattr(self, "session"):
            self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.profile.cleanup()

    def __enter__(self) -> Driven:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
