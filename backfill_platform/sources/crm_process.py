"""Start and stop the demo CRM server as a child process (make demo, make ui, the tests)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
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


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


DEMO_TOKEN = "demo-crm-token"
DEMO_PORT = 8765


@contextmanager
def demo_crm(data_dir: Path, log: Path | None = None) -> Iterator[CrmProcess | None]:
    """The demo CRM for `make demo` / `make ui`, unless BACKFILL_CRM_URL points elsewhere:
    then nothing is started. Sets BACKFILL_CRM_URL and BACKFILL_CRM_TOKEN for this process
    and its children while it runs."""
    if os.environ.get("BACKFILL_CRM_URL"):
        yield None
        return
    token = os.environ.get("BACKFILL_CRM_TOKEN") or DEMO_TOKEN
    rate = int(os.environ.get("BACKFILL_CRM_RATE_LIMIT") or 20)
    # Another demo CRM (`make ui` in another terminal) may hold the usual port.
    port = DEMO_PORT if _port_free(DEMO_PORT) else None
    with start_crm_server(data_dir, token=token, rate=rate, port=port, log=log) as server:
        saved = {k: os.environ.get(k) for k in ("BACKFILL_CRM_URL", "BACKFILL_CRM_TOKEN")}
        os.environ.update({"BACKFILL_CRM_URL": server.url, "BACKFILL_CRM_TOKEN": token})
        try:
            yield server
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    """`crm_process --data DIR -- COMMAND...`: run COMMAND with the demo CRM around it."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not (args.data / "customers.json").is_file() and not os.environ.get("BACKFILL_CRM_URL"):
        print(f"{args.data}/customers.json is missing: run `make demo` first", file=sys.stderr)
        return 1
    with demo_crm(args.data) as server:
        if server is not None:
            print(f"demo CRM at {server.url} (stopped when the command ends)")
        return run_until_stopped(command)


# How long `dagster dev` gets to stop its webserver, daemon and code servers after an
# interrupt before its whole process group is killed.
STOP_GRACE_SECONDS = 60


def run_until_stopped(command: list[str]) -> int:
    """Run `command` (`dagster dev`) in its own session; SIGTERM or SIGINT here interrupts it
    once, and whatever is left of its session after the grace period is killed.

    Why not a plain subprocess.call: a signal to `make ui`'s process group reached every
    Dagster process at once, the webserver and daemon then waited on their shutdown pipes
    for a `dagster dev` that ignored the signal (started in the background, SIGINT is
    ignored and Dagster maps SIGTERM onto it), and six processes outlived `make ui`.
    """
    child = subprocess.Popen(command, start_new_session=True, preexec_fn=_default_interrupts)

    def interrupt(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if child.poll() is None:
            child.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        child.wait()
    finally:
        _stop_session(child)
    return child.returncode


def _default_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_session(child: subprocess.Popen) -> None:
    """Wait for the child's session to end (its code servers outlive it briefly), then kill
    what is left."""
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline and _session_alive(child.pid):
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def _session_alive(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
