"""The long-lived stream as a process of its own: `stream start` runs `stream run` detached,
`stream stop` ends it with SIGTERM (the query stops between two batches, or its unfinished
batch is re-run on the next start), `stream status` says whether it runs, and the
deployment's `stream_supervisor` sensor starts it again when it died.

A pid file under DAGSTER_HOME (`stream/raw_orders_stream.pid`) names the process; its
output goes to `stream/raw_orders_stream.log` beside it. `stream stop` leaves a
`.stopped` file there, so the supervisor leaves a stream an operator stopped alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from backfill_platform.processes import running_as
from backfill_platform.resources.kafka import QUERY_NAME

STOP_TIMEOUT_SECONDS = 120
TRIGGER_SECONDS = 5.0  # least time between two batches of `stream run`


@dataclass(frozen=True)
class ProcessState:
    """What the pid files say: running, stopped by an operator, died, or never started."""

    pid: int | None  # the running process
    died: int | None  # a process that ended without `stream stop` (its pid file remained)
    stopped: bool  # `stream stop` ran after the last start


class StreamProcessError(RuntimeError):
    """The stream process could not be started or stopped; the message says why."""


@dataclass(frozen=True)
class StreamProcess:
    directory: Path

    @property
    def pid_file(self) -> Path:
        return self.directory / f"{QUERY_NAME}.pid"

    @property
    def log(self) -> Path:
        return self.directory / f"{QUERY_NAME}.log"

    @property
    def stopped_file(self) -> Path:
        return self.directory / f"{QUERY_NAME}.stopped"

    def state(self) -> ProcessState:
        """Read before `pid()` forgets a dead process: a pid file whose process is gone
        means the stream died (killed, crashed, machine restarted), not that it was stopped."""
        recorded = None
        if self.pid_file.exists():
            recorded = int(self.pid_file.read_text().strip() or 0) or None
        running = self.pid()
        died = recorded if recorded is not None and running is None else None
        return ProcessState(running, died, self.stopped_file.exists())

    def log_tail(self, lines: int = 20) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def pid(self) -> int | None:
        """The running stream's pid; None (and no stale pid file) when none runs."""
        if not self.pid_file.exists():
            return None
        pid = int(self.pid_file.read_text().strip() or 0)
        if pid and _alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, trigger_seconds: float = TRIGGER_SECONDS) -> int:
        """`backfill-platform stream run` detached; its pid. One at a time."""
        running = self.pid()
        if running is not None:
            raise StreamProcessError(f"the stream runs already (pid {running}); stream stop first")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stopped_file.unlink(missing_ok=True)
        with open(self.log, "ab") as out:
            child = subprocess.Popen(
                [
                    *(sys.executable, "-m", "backfill_platform", "stream", "run"),
                    *("--trigger-seconds", str(trigger_seconds)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": _package_path()},
            )
        self.pid_file.write_text(str(child.pid))
        return child.pid

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM, then wait for it to end (SIGKILL after `timeout`); the pid it had.
        Marks the stream stopped, so the supervisor does not start it again."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stopped_file.touch()
        pid = self.pid()
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return pid


# What the stream's command line holds (`StreamProcess.start`): a pid file's pid that no
# longer runs this is another process now, never signalled.
STREAM_COMMAND = ("backfill_platform", "stream", "run")


def _alive(pid: int) -> bool:
    """The stream's process exists (a reused pid is not it)."""
    return running_as(pid, *STREAM_COMMAND)


def _package_path() -> str:
    """The child imports this very package, wherever it was imported from."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
