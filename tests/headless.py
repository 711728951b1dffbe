"""Open a page in headless Chromium over the DevTools protocol: its DOM, console errors, requests
and screenshots, from one browser run (used by tests/test_report.py).

    with Browser() as b:                       # skips the test if chromium is not installed
        page = b.open(Path("report.html"), width=1366, height=900, screenshot=Path("shot.png"))
        page.errors, page.requests, page.dom_text, b.evaluate("document.title")

Why the DevTools protocol and not `--dump-dom` + log scraping: the protocol reports console
messages (Runtime.consoleAPICalled), uncaught exceptions (Runtime.exceptionThrown), browser-side
errors such as a failed resource load (Log.entryAdded), JavaScript dialogs (an `alert` that ran)
and every network request as structured events, so "no console errors" is checked, not guessed
from log lines whose format changes between Chromium versions.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# As root in a container without a network: no sandbox, and none of Chromium's background traffic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


@dataclass
class Page:
    """What one page load produced."""

    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    console: list[str] = field(default_factory=list)  # every console message, "level: text"
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt that opened
    dom_text: str = ""  # document.body.innerText
    html: str = ""  # document.documentElement.outerHTML after load


def chromium_path() -> str | None:
    return next((p for name in CHROMIUM if (p := shutil.which(name))), None)


class Browser:
    """One headless Chromium process and one DevTools connection to its first tab."""

    def __init__(self, timeout: float = 20.0) -> None:
        self.exe = chromium_path()
        if self.exe is None:
            pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
        self.timeout = timeout
        self._id = 0

    def __enter__(self) -> Browser:
        import websocket  # websocket-client, in the `test` extra

        self.profile = tempfile.mkdtemp(prefix="autoao-chromium-")
        # stderr to a file, not a pipe: Chromium logs a lot (D-Bus is absent) and a full pipe blocks it.
        self.log = Path(self.profile) / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([self.exe, *FLAGS, f"--user-data-dir={self.profile}",
                                          "--remote-debugging-port=0", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=log)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.log.read_text(errors="replace")[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"chromium did not open its DevTools port: {err}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        page_ws = self._page_target(port, deadline)
        # suppress_origin: Chromium refuses DevTools websockets that carry an Origin header.
        self.ws = websocket.create_connection(page_ws, timeout=self.timeout, suppress_origin=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _page_target(self, port: int, deadline: float) -> str:
        import urllib.request

        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            if time.monotonic() > deadline:
                raise RuntimeError("chromium opened no page target")
            time.sleep(0.05)

    # ---- protocol ------------------------------------------------------------------------------

    def call(self, method: str, page: Page | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply; events that arrive meanwhile go to `page`."""
        self._id += 1
        my_id = self._id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg, page)

    def _event(self, msg: dict[str, Any], page: Page | None) -> None:
        if page is None or "method" not in msg:
            return
        method, p = msg["method"], msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            page.console.append(f"{p['type']}: {text}")
            if p["type"] in ("error", "assert"):
                page.errors.append(f"console.{p['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            page.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            e = p["entry"]
            page.console.append(f"{e['level']}: {e['text']}")
            if e["level"] == "error":
                page.errors.append(f"{e['source']}: {e['text']} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            page.requests.append(p["request"]["url"])
        elif method == "Network.loadingFailed":
            page.errors.append(f"load failed: {p.get('errorText')}")
        elif method == "Page.javascriptDialogOpening":
            page.dialogs.append(f"{p['type']}: {p['message']}")
            self.ws.send(json.dumps({"id": 0, "method": "Page.handleJavaScriptDialog", "params": {"accept": True}}))

    def evaluate(self, expression: str, page: Page | None = None) -> Any:
        result = self.call("Runtime.evaluate", page, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path: Path, *, width: int = 1366, height: int = 900, screenshot: Path | None = None,
             full_page: Path | None = None) -> Page:
        """Load `path` at a laptop-sized viewport; collect what happened until the load event plus a
        short settle; optionally save a viewport screenshot and a full-page one (PNG)."""
        page = Page()
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", page)
        self.call("Emulation.setDeviceMetricsOverride", page, width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        self.call("Page.navigate", page, url=path.resolve().as_uri())
        deadline = time.monotonic() + self.timeout
        loaded = False
        while not loaded:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not finish loading in {self.timeout} s")
            msg = json.loads(self.ws.recv())
            self._event(msg, page)
            loaded = msg.get("method") == "Page.loadEventFired"
        # Late messages (a script run after load, a failed lazy resource) arrive within the settle.
        self.ws.settimeout(0.3)
        try:
            while True:
                self._event(json.loads(self.ws.recv()), page)
        except Exception:  # noqa: BLE001 - websocket timeout: nothing more arrived
            pass
        finally:
            self.ws.settimeout(self.timeout)
        page.dom_text = self.evaluate("document.body.innerText", page)
        page.html = self.evaluate("document.documentElement.outerHTML", page)
        if screenshot is not None:
            shot = self.call("Page.captureScreenshot", page, format="png")
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        if full_page is not None:
            h = self.evaluate("Math.ceil(document.documentElement.scrollHeight)", page)
            shot = self.call("Page.captureScreenshot", page, format="png", captureBeyondViewport=True,
                             clip={"x": 0, "y": 0, "width": width, "height": h, "scale": 1})
            full_page.write_bytes(base64.b64decode(shot["data"]))
        return page
