"""Pid files name the long-lived processes the platform starts (the stream, the demo's
Kafka broker). A pid is reused once its process ends (many Linux machines wrap pids at
32,768, and a test run or a reboot goes through thousands), so a pid file alone never
decides that a process is ours to signal: its command line must still be the one started."""

from __future__ import annotations

import time

import psutil

# How long an empty command line is read again before it counts as not ours.
EXEC_WAIT_SECONDS = 2.0


def running_as(pid: int, *markers: str) -> bool:
    """Process `pid` exists, is not a zombie left for its parent to reap, and its command
    line holds every one of `markers`.

    A process that has just been started can show an empty command line: Linux closes the
    starter's exec pipe (so `subprocess.Popen` returns) before it has copied the new
    program's arguments, and /proc/<pid>/cmdline reads empty in between. Read as "not
    ours", a stream just started lost its pid file and ran on unseen (a loaded machine hit
    it); so an empty command line is read again for up to `EXEC_WAIT_SECONDS`."""
    deadline = time.monotonic() + EXEC_WAIT_SECONDS
    try:
        process = psutil.Process(pid)
        while True:
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            command = " ".join(process.cmdline())
            if command or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    except psutil.Error:
        return False
    return all(marker in command for marker in markers)
