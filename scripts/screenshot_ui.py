"""Log two RAG variants to a real local `mlflow server` and screenshot the UI's run comparison.

Usage (needs Debian's chromium: `apt-get install chromium`):

    .venv/bin/python scripts/screenshot_ui.py [--out docs/img/mlflow-compare-runs.png]

Everything runs on 127.0.0.1 with the offline demo judge; the server and its store live in a temp
dir and are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import resources
from pathlib import Path

import pandas as pd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
         "--default-artifact-root", str(workdir / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("mlflow server did not start within 90 s")


def log_variants(url: str) -> tuple[str, list[str]]:
    import mlflow

    mlflow.set_tracking_uri(url)
    exp = mlflow.set_experiment("ragjudge-variants")
    with resources.as_file(resources.files("mlflow_ragjudge") / "data" / "sample_rag.jsonl") as p:
        df = pd.read_json(p, lines=True, dtype=False).drop(columns=["group"])
    better = df.copy()
    # variant B: a generator that follows the reference more closely (stands in for a better prompt)
    better["answer"] = [r if i % 2 == 0 else a for i, (a, r) in enumerate(zip(df["answer"], df["reference"]))]
    run_ids = []
    for name, data in (("prompt=zero-shot", df), ("prompt=cot", better)):
        with mlflow.start_run(run_name=name) as run:
            mlflow.models.evaluate(data=data, predictions="answer", targets="reference", model_type="rag",
                                   evaluators="ragjudge",
                                   evaluator_config={"judge": "demo:/overlap", "cache": False, "bertscore": False,
                                                     "metrics": ["correctness", "lexical"]})
            run_ids.append(run.info.run_id)
    return exp.experiment_id, run_ids


def screenshot(url: str, out: Path, width: int = 1500, height: int = 2300) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--virtual-time-budget=25000",
             "--hide-scrollbars", f"--screenshot={out}", url],
            check=True, capture_output=True, timeout=180,
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/img/mlflow-compare-runs.png")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGJUDGE_CACHE_DIR"] = str(Path(tmp) / "cache")
        proc, url = start_server(Path(tmp))
        try:
            exp_id, run_ids = log_variants(url)
            page = (f"{url}/#/compare-runs?runs={json.dumps(run_ids)}&experiments={json.dumps([exp_id])}")
            screenshot(page.replace(" ", ""), out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
