"""Headless Chromium (Debian's package; ``make install-dev`` installs it where it runs as root): a page as a
browser builds it, scripts run, and the elements it shows."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

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
