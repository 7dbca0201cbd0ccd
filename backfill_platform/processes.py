"""Pid files name the long-lived processes the platform starts (the stream, the demo's
Kafka broker). A pid is reused once its process ends (many Linux machines wrap pids at
32,768, and a test run or a reboot goes through thousands), so a pid file alone never
decides that a process is ours to signal: its command line must still be the one started."""

from __future__ import annotations

import psutil


def running_as(pid: int, *markers: str) -> bool:
    """Process `pid` exists, is not a zombie left for its parent to reap, and its command
    line holds every one of `markers`."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return all(marker in command for marker in markers)
