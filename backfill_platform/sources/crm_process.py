"""Start and stop the demo CRM server as a child process (make demo, make ui, the tests)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass
class CrmProcess:
    process: subprocess.Popen
    url: str
    log: Path | None

    def metrics(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            return json.loads(answer.read())

    def requests(self) -> list[dict]:
        """Every request the server logged (needs `log`)."""
        if self.log is None or not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> CrmProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_crm_server(
    data_dir: Path,
    *,
    token: str,
    rate: int = 20,
    port: int | None = None,
    host: str = "127.0.0.1",
    log: Path | None = None,
    extra: list[str] | None = None,
) -> CrmProcess:
    """Start the server and wait until it listens; the token goes through its environment."""
    port = port or free_port(host)
    # The child imports this very package, wherever it was imported from.
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "DEMO_CRM_TOKEN": token, "PYTHONPATH": path}
    command = [
        sys.executable,
        "-m",
        "backfill_platform.sources.crm_server",
        *("--host", host, "--port", str(port), "--rate", str(rate)),
        *("--data", str(data_dir), "--token-env", "DEMO_CRM_TOKEN"),
        *(("--log", str(log)) if log else ()),
        *(extra or []),
    ]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = process.stdout.readline()
    if "listening" not in first:
        process.wait(timeout=10)
        raise RuntimeError(f"the demo CRM did not start: {first}{process.stderr.read()}".strip())
    return CrmProcess(process, f"http://{host}:{port}", log)
