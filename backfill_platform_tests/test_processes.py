"""A pid file whose process ended names nobody: once its pid is reused by another process,
`stream stop` and `make kafka-stop` leave that process alone."""

import subprocess
import sys
import time
from pathlib import Path

import psutil

from backfill_platform.processes import running_as
from backfill_platform.resources.stream_process import StreamProcess
from backfill_platform.sources.kafka_broker import PID_FILE, running_broker


def _bystander() -> subprocess.Popen:
    """Another user's process, holding the pid a stale pid file names; returned once it runs
    its own command line (until its exec the child still shows the test's)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    deadline = time.monotonic() + 60
    while "time.sleep(300)" not in " ".join(psutil.Process(process.pid).cmdline()):
        assert time.monotonic() < deadline, "the bystander did not start within 60 s"
        time.sleep(0.05)
    return process


def test_a_stale_stream_pid_file_never_signals_the_process_that_reused_its_pid(tmp_path: Path):
    bystander = _bystander()
    try:
        stream = StreamProcess(tmp_path / "stream")
        stream.directory.mkdir()
        stream.pid_file.write_text(str(bystander.pid))
        assert stream.pid() is None  # not the stream: the file is stale
        assert stream.stop(timeout=2) is None
        assert bystander.poll() is None  # still running
        assert not stream.pid_file.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_stale_broker_pid_file_never_signals_the_process_that_reused_its_pid(tmp_path: Path):
    bystander = _bystander()
    try:
        (tmp_path / PID_FILE).write_text(str(bystander.pid))
        broker = running_broker(tmp_path, "127.0.0.1:9")
        broker.stop(timeout=2)
        broker.kill()
        assert bystander.poll() is None
        assert not (tmp_path / PID_FILE).exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_running_as_reads_the_command_line():
    bystander = _bystander()
    try:
        assert running_as(bystander.pid, "time.sleep(300)")
        assert not running_as(bystander.pid, "kafka.Kafka")
    finally:
        bystander.kill()
        bystander.wait()
    assert not running_as(bystander.pid, "time.sleep(300)")  # gone


def test_a_process_just_started_is_recognised_though_its_command_line_reads_empty_at_first():
    """Popen returns once the exec pipe closes, which Linux does before the new program's
    arguments are in place: /proc/<pid>/cmdline read at once can be empty (about 1 in 150
    starts on a loaded machine). Each of these is checked the moment it starts."""
    for _ in range(150):
        started = subprocess.Popen(
            ["sleep", "301"], stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            assert running_as(started.pid, "sleep", "301")
        finally:
            started.kill()
            started.wait()
