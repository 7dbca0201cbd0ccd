"""Starting, watching and killing worker processes (see worker.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    events_path: Path
    go_path: Path
    log_path: Path

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        return [json.loads(x) for x in lines if x.strip()]

    def has(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events())

    def wait(
        self, event: str, timeout: float = 300, poll: float = 0.02, **fields: Any
    ) -> dict[str, Any]:
        """The first `event` (with these field values); fails fast, with the worker's log,
        if the worker died first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if e["event"] == event and all(e.get(k) == v for k, v in fields.items()):
                    return e
                if e["event"] == "crash":
                    raise AssertionError(f"{self.name} crashed:\n{e['traceback']}")
            exited = self.proc.poll() is not None
            if exited and not any(
                e["event"] == event and all(e.get(k) == v for k, v in fields.items())
                for e in self.events()
            ):
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before '{event}':\n{self.log()}"
                )
            time.sleep(poll)
        raise AssertionError(f"{self.name}: no '{event}' within {timeout}s:\n{self.log()}")

    def check(self) -> None:
        """Fail fast, with the traceback, if the worker crashed."""
        for e in self.events():
            if e["event"] == "crash":
                raise AssertionError(f"{self.name} crashed:\n{e['traceback']}")
        if self.proc.poll() not in (None, 0):
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.log()}")

    def go(self, job: int = 0) -> None:
        (self.go_path if not job else self.go_path.with_suffix(f".go.{job}")).touch()

    def kill(self) -> None:
        """SIGKILL the whole process group: the Python driver and its Spark JVM at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def finish(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        lines = [x for x in text.splitlines() if " WARN " not in x]
        return "\n".join(lines[-60:])


def spawn(workdir: Path, name: str, command: str, args: dict[str, Any]) -> Worker:
    """A worker in its own session (process group), so one killpg takes the JVM down too."""
    workdir.mkdir(parents=True, exist_ok=True)
    events, go, log = workdir / f"{name}.events", workdir / f"{name}.go", workdir / f"{name}.log"
    args = {**args, "events": str(events), "go": str(go)}
    env = {**os.environ, "BACKFILL_START_DATE": "2024-01-01", "PYTHONPATH": str(REPO_ROOT)}
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "backfill_platform_tests.reliability.worker",
                command,
                json.dumps(args),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker(name, proc, events, go, log)


def reap(workers: list[Worker]) -> None:
    """Leave no worker behind, whatever happened in the test."""
    for w in workers:
        if w.proc.poll() is None:
            w.kill()
