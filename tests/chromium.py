"""Headless Chromium for the browser tests (marker `browser`), driven through the DevTools protocol over a
websocket (Debian package `chromium`; no extra test dependency), plus the polling and process helpers they share.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

WIDTH = 1400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, every: float = 2.0):
    """Poll `check` until it returns something truthy (returned), or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last = exc
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last!r})")


def stop_group(proc: subprocess.Popen, grace: float = 30) -> None:
    """Stop a process started in its own session, and everything it started: SIGINT to the group (Ctrl-C, which
    `airflow standalone` shuts down cleanly on), SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class Chromium:
    """A headless Chromium page driven through the DevTools protocol."""

    def __init__(self, profile: Path, *, height: int = 1000) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "Debian's chromium package is needed (bootstrap.py test installs it)"
        port = free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--allow-file-access-from-files",
                f"--user-data-dir={profile}",
                f"--remote-debugging-port={port}",
                f"--window-size={WIDTH},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        pages = wait_for(
            "chromium's DevTools endpoint",
            lambda: [t for t in httpx.get(f"http://127.0.0.1:{port}/json").json() if t["type"] == "page"],
            60,
            0.5,
        )
        from websockets.sync.client import connect

        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.ids = itertools.count(1)
        self.call("Page.enable")

    def call(self, method: str, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def goto(self, url: str, *, until_url: str | None = None) -> None:
        """Navigate and wait until the page has loaded (and, with `until_url`, its address contains that text: a
        page that redirects, like a login, lands elsewhere)."""
        self.call("Page.navigate", url=url)
        self.wait_loaded(until_url or "")

    def wait_loaded(self, url_part: str = "") -> None:
        wait_for(
            f"{url_part or 'the page'} to load",
            lambda: url_part in self.eval("location.href") and self.eval("document.readyState") == "complete",
            60,
            0.5,
        )

    def text(self, selector: str = "body") -> str:
        return self.eval(f"(document.querySelector({json.dumps(selector)}) || {{innerText: ''}}).innerText") or ""

    def type_into(self, selector: str, text: str) -> None:
        assert self.eval(f"!!document.querySelector({json.dumps(selector)})"), selector
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def exists(self, selector: str) -> bool:
        return bool(self.eval(f"!!document.querySelector({json.dumps(selector)})"))

    def wait_for_selector(self, selector: str, timeout: float = 60, what: str | None = None) -> None:
        wait_for(what or selector, lambda: self.exists(selector), timeout, 0.5)

    def on(self, selector: str, body: str):
        """Run the JavaScript `body` with `e` = the first element matching `selector` (which must exist)."""
        assert self.exists(selector), f"nothing matches {selector}"
        return self.eval(f"(e => {{ {body} }})(document.querySelector({json.dumps(selector)}))")

    def attribute(self, selector: str, name: str) -> str | None:
        return self.on(selector, f"return e.getAttribute({json.dumps(name)});")

    def click(self, selector: str) -> None:
        """Click the first element that matches `selector` (scrolled into view first), as a user would: React and
        Chakra UI handle the DOM click event like a mouse click."""
        self.on(selector, "e.scrollIntoView({block: 'center'}); e.click();")

    def click_text(self, text: str, selector: str = "button, a, [role=menuitem]") -> None:
        """Click the first element matching `selector` whose visible text is `text` (ignoring surrounding blanks)."""
        found = self.eval(
            f"(() => {{ const e = [...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => e.innerText.trim() === {json.dumps(text)}); if (!e) return false;"
            " e.scrollIntoView({block: 'center'}); e.click(); return true; })()"
        )
        assert found, f"no {selector} with the text {text!r}"

    def fill(self, selector: str, text: str) -> None:
        """Replace the value of a (React-controlled) input as a user typing would: focus, select what it holds, type
        `text` over it (trusted input events, which React and Chakra UI's number fields take), then leave the field
        (a number field commits its value on blur)."""
        self.on(selector, "e.scrollIntoView({block: 'center'}); e.focus(); e.select();")
        self.call("Input.insertText", text=text)
        value = self.on(selector, "e.blur(); return e.value;")
        assert value == text, f"{selector} holds {value!r} after typing {text!r}"

    def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        params: dict = {"format": "png"}
        if full_page:
            height = self.eval("document.documentElement.scrollHeight")
            params |= {
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1},
            }
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        stop_group(self.proc, 10)
