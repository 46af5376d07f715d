"""A real local `mlflow server` and headless Chromium, for UI tests and the docs screenshot."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: Path, timeout: float = 120, *, jobs: bool = False, workers: int = 1,
                 port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start `mlflow server` on 127.0.0.1 with a SQLite store in ``workdir``; returns (process, url).

    ``workdir / "mlflow.db"`` is created (and migrated) by the server unless it is there already. ``jobs``: MLflow's
    job execution, off by default: it starts several consumer processes (each importing mlflow) that neither
    logging runs nor the UI pages need. ``workers``: the server's worker processes (``mlflow server``'s own default is
    4; one is enough for tests). ``port``: a given one (a server started again where it was), else a free one.
    """
    port = port or free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="true" if jobs else "false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
         "--default-artifact-root", str(workdir / "artifacts"), "--workers", str(workers)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"mlflow server did not answer within {timeout:g} s")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, *, screenshot: Path | None = None, width: int = 1500, height: int = 1100,
             budget_ms: int = 25000) -> str:
    """Render ``url`` headless; returns the DOM after ``budget_ms`` of virtual time (or writes a PNG)."""
    browser = chromium_path()
    if browser is None:
        raise FileNotFoundError("chromium not found: apt-get install chromium")
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:  # chromium helpers may still write
        args = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                f"--virtual-time-budget={budget_ms}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        proc = subprocess.run([*args, url], check=True, capture_output=True, text=True, timeout=240)
    return proc.stdout


def browse(url: str, *, clicks: tuple[str, ...] = (), screenshot: Path | None = None, width: int = 1900,
           height: int = 1000, settle: float = 8.0, timeout: float = 120.0, ready: tuple[str, ...] = (),
           until: tuple[str, ...] = (), script: str | None = None, click_every: tuple[str, ...] = ()) -> str:
    """Open ``url`` in headless Chromium driven over the DevTools protocol, click each CSS selector of ``clicks``
    that is on the page (in order, a second apart), optionally write a PNG, and return the DOM.

    ``ready``: texts the page must show before the clicks; ``until``: texts it must show after them. Each is waited
    for (polled, up to ``timeout``) on top of ``settle``, so a slow machine renders late rather than never.

    For pages whose interesting state needs a click (a parent run's children expanded, a panel closed), which
    ``chromium --screenshot`` cannot do. ``click_every``: selectors whose every match is clicked, after ``clicks`` (a
    list's rows expanded, say). ``script``: a JavaScript expression evaluated last, in the page; its value
    (as JSON text) is returned instead of the DOM -- for what the DOM text cannot tell, such as whether a cell's text
    is cut (its ``scrollWidth`` beyond its ``clientWidth``). Uses aiohttp's websocket client (an MLflow dependency)."""
    import asyncio
    import base64
    import json
    import urllib.request

    import aiohttp

    browser = chromium_path()
    if browser is None:
        raise FileNotFoundError("chromium not found: apt-get install chromium")

    async def drive(port: int) -> str:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2) as r:
                    targets = json.load(r)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        page = next(t for t in targets if t["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(page["webSocketDebuggerUrl"],
                                                                           max_msg_size=0) as ws:
            counter = 0

            async def call(method: str, **params: object) -> dict:
                nonlocal counter
                counter += 1
                mine = counter
                await ws.send_json({"id": mine, "method": method, "params": params})
                while True:
                    msg = await asyncio.wait_for(ws.receive_json(), timeout)
                    if msg.get("id") == mine:
                        return msg.get("result") or {}

            async def dom() -> str:
                got = await call("Runtime.evaluate", expression="document.documentElement.outerHTML")
                return str(got.get("result", {}).get("value", ""))

            async def shows(texts: tuple[str, ...]) -> None:
                end = time.time() + timeout
                while texts and time.time() < end:
                    page = await dom()
                    if all(t in page for t in texts):
                        return
                    await asyncio.sleep(1.0)

            await call("Page.enable")
            await call("Page.navigate", url=url)
            await asyncio.sleep(settle)
            await shows(ready)
            for selector in clicks:
                await call("Runtime.evaluate", expression=(
                    f"(() => {{ const b = document.querySelector({json.dumps(selector)}); if (b) b.click(); }})()"))
                await asyncio.sleep(1.5)
            for selector in click_every:
                await call("Runtime.evaluate", expression=(
                    f"document.querySelectorAll({json.dumps(selector)}).forEach(b => b.click())"))
                await asyncio.sleep(1.5)
            await shows(until)
            if screenshot is not None:
                shot = await call("Page.captureScreenshot", format="png")
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            if script is not None:
                got = await call("Runtime.evaluate", expression=f"JSON.stringify({script})", returnByValue=True)
                return str(got.get("result", {}).get("value", "null"))
            return await dom()

    port = free_port()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:  # chromium helpers may still write
        proc = subprocess.Popen([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                 f"--window-size={width},{height}", f"--remote-debugging-port={port}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            return asyncio.run(drive(port))
        finally:
            proc.terminate()
            proc.wait(timeout=30)


#: selectors of the MLflow 3.17 UI that the screenshots click
EXPAND_PARENT_RUN = '[data-component-id$="runnamecellrenderer.tsx_46"]'
CLOSE_ASSISTANT = '[data-component-id="mlflow.assistant.chat_panel.close"]'
#: the "Detect Issues in Your Traces" guidance over an experiment's Traces tab, shown on a first visit
DISMISS_DETECT_ISSUES = '[data-component-id="mlflow.detect_issues.guidance.got_it"]'
#: the sidebar's collapse button (room for a wide table)
TOGGLE_SIDEBAR = '[data-component-id="mlflow_header.toggle_sidebar_button"]'
#: an opened trace's "Assess" button: shows its Feedback and Expectations
SHOW_ASSESSMENTS = '[data-component-id="shared.model-trace-explorer.assessments-pane-toggle"]'
#: a Feedback's chevron in that pane: shows its rationale, source and metadata
EXPAND_ASSESSMENT = '[data-component-id="shared.model-trace-explorer.toggle-assessment-expanded"]'
