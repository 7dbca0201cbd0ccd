"""Every command the README shows runs as the README writes it, and says what it promises.

The commands are read out of README.md's bash blocks and run in order in the repository, with
a small demo (the Makefile's documented DEMO_START/DEMO_END/ORDERS_PER_DAY, given in the
environment so the text stays the README's) and data folders of the test's own. `make test`
is the suite this runs in. CI runs `make demo` itself too, with the default folders.

Real processes: make, the demo's PostgreSQL, Kafka, Spark, Delta, the Dagster webserver and
daemon.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# What the README shows, in order (a changed README must change this list and its checks).
COMMANDS = [
    "make demo",
    "make test",
    "make ui",
    "make deliver-day",
    "make ui",
    "make demo STREAM=on",
    "make ui STREAM=on",
    'make cli ARGS="stream stop" STREAM=on && make kafka-stop',
    'make cli ARGS="plan --select marts/fct_daily_revenue --start 2025-01-01 --end 2025-01-31"',
]
DEMO_START, DEMO_END = "2025-01-01", "2025-01-31"
TRACEBACK = "Traceback (most recent call last)"
LOG_LINE = re.compile(r"^log: (\S+\.log)")


def readme_commands(text: str) -> list[str]:
    """The command lines of the README's bash blocks, without their trailing comments."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            command = re.split(r"\s+#\s", line.strip(), maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def readme_demo_output(text: str) -> list[str]:
    """The lines the README says `make demo` prints on a clean clone."""
    (block,) = re.findall(r"```\n(log: .*?)```", text, flags=re.S)
    return block.splitlines()


def terminal_lines(text: str) -> list[str]:
    """The lines a terminal shows of `text`, captured without newline translation: a progress
    bar redraws its line after carriage returns, so only its last drawing stays."""
    return [line.rsplit("\r", 1)[-1] for line in text.rstrip("\n").split("\n")]


def test_the_readme_shows_these_commands_and_stays_short():
    text = README.read_text()
    assert readme_commands(text) == COMMANDS
    assert len(text.splitlines()) <= 150


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(command: str, env: dict[str, str], timeout: float = 900, status: int = 0) -> str:
    """`command`'s standard output, once it exited with `status` (0, or 2 for a refusal make
    passes on) and printed no traceback, Dagster event or warning."""
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, timeout=timeout
    )
    # decoded here: text=True would turn a progress bar's carriage returns into newlines
    stdout, output = done.stdout.decode(), (done.stdout + done.stderr).decode()
    assert done.returncode == status, f"{command}: exit {done.returncode}\n{output}"
    for unwanted in (TRACEBACK, "RUN_SUCCESS", "Warning"):
        assert unwanted not in output, f"{command}: {unwanted}\n{output}"
    return stdout


def _ui(command: str, env: dict[str, str], until=None) -> None:
    """A `make ui` command in the background until the webserver answers (and `until()` holds),
    then stopped with its process group, as Ctrl-C would."""
    port = _free_port()
    ui = subprocess.Popen(
        ["bash", "-c", command],
        cwd=REPO,
        env={**env, "UI_ARGS": f"-p {port}"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started: list[psutil.Process] = []
    try:
        _wait(lambda: _answers(f"http://127.0.0.1:{port}/server_info"), 300, command)
        started = psutil.Process(ui.pid).children(recursive=True)
        if until is not None:
            _wait(until, 300, f"{command}: {until.__doc__}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            ui.wait(timeout=120)
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(2)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "BACKFILL_"))}
    env.update(
        DEMO_START=DEMO_START,
        DEMO_END=DEMO_END,
        ORDERS_PER_DAY="10",
        DAGSTER_HOME=str(tmp_path / "home"),
        BACKFILL_LANDING_DIR=str(data / "landing"),
        BACKFILL_LAKEHOUSE_DIR=str(data / "lakehouse"),
        BACKFILL_KAFKA_BOOTSTRAP=f"127.0.0.1:{_free_port()}",
    )
    commands = readme_commands(README.read_text())
    assert commands == COMMANDS
    stream_pid = tmp_path / "home" / "stream" / "raw_orders_stream.pid"
    try:
        demo = _run(commands[0], env)
        first = demo.splitlines()[0]
        assert first.startswith("log: ") and first.endswith("(set-up, Dagster and Spark)")
        assert "marts reconcile with the contract's answer: YES" in demo
        assert "2 Dagster runs over 31 days" in demo
        started = f"Dagster's instance: PostgreSQL in {data / 'postgres'}, started"
        assert demo.splitlines()[1].startswith(started), demo
        assert "postgres_url" in (tmp_path / "home" / "dagster.yaml").read_text()
        log = Path(LOG_LINE.match(first)[1])  # Dagster's events are in the file, not above
        assert log.parent == tmp_path / "home" / "backfill-logs"
        assert "RUN_SUCCESS" in log.read_text()
        # the README's account, line for line in shape (set-up was done by `make test`)
        shown = [line for line in readme_demo_output(README.read_text()) if "set-up:" not in line]
        # (set-up lines show when make's install stamp is older than what it depends on)
        ran = [line for line in terminal_lines(demo) if not line.startswith("set-up: ")]
        assert [(line.split() or [""])[0] for line in ran] == [line.split()[0] for line in shown], (
            demo
        )
        # the same data at another scale is refused in one line, and touches nothing
        refused = _run("make demo ORDERS_PER_DAY=11", env, status=2).splitlines()
        assert LOG_LINE.match(refused[0]) and len(refused) == 2, refused
        assert refused[1].startswith("Refused: ") and "make clean-data" in refused[1], refused
        _ui(commands[2], env)
        delivered = _run(commands[3], env)
        assert delivered.startswith("delivered 2025-02-01 ")
        ui = _run("make -n ui", env)  # without the stream: up to the delivered day
        assert "BACKFILL_START_DATE=2025-01-01 BACKFILL_END_DATE=2025-02-01" in ui
        assert "BACKFILL_STREAM_SUPERVISOR" not in ui
        # The README's second `make ui` is the first one's command: started once above, and
        # what differs after the delivery (the partitions' end) is what `make -n` showed.
        assert commands[4] == commands[2]
        streamed = _run(commands[5], env)
        assert "marts reconcile with the contract's answer: YES" in streamed
        assert len(terminal_lines(streamed)) < 30
        broker = f"broker at {env['BACKFILL_KAFKA_BOOTSTRAP']}, topic orders"
        assert any(line.startswith(broker) for line in streamed.splitlines()), streamed
        # the shop's messages from the day after the landing zone's, each once in raw
        sent = re.search(r"the live shop sent (\d+) messages, 2025-02-01\.\.", streamed)
        assert sent, streamed
        assert f"1 batch(es), {sent[1]} rows" in streamed
        assert "2025-01-31..2025-02-03: every day reconciles" in streamed
        assert f"{sent[1]} messages -> {sent[1]} stream rows (0 missing, 0 extra" in streamed
        ui = _run("make -n ui STREAM=on", env)  # up to the stream's last day, supervised
        assert "BACKFILL_START_DATE=2025-01-01 BACKFILL_END_DATE=2025-02-03" in ui
        assert "BACKFILL_STREAM_SUPERVISOR=true BACKFILL_STREAM_CHECK=true" in ui

        def stream_started() -> bool:
            """the stream_supervisor sensor starts the stream"""
            return stream_pid.is_file()

        _ui(commands[6], env, until=stream_started)
        stopped = _run(commands[7], env)
        # the stream dies with `make ui`'s process group, or is stopped here
        assert re.search(r"stream \(pid \d+\) stopped|no stream process running", stopped), stopped
        assert re.search(r"^broker from .* stopped$", stopped, re.MULTILINE), stopped
        planned = _run(commands[8], env)
        assert "marts/fct_daily_revenue" in planned
    finally:
        subprocess.run(
            ["bash", "-c", "make kafka-stop; make postgres-stop"],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
