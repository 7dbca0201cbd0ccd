"""What a person sees in a terminal: logs in a file, progress bars, a short summary.

`make demo`, `make bench` and every `backfill-platform` command run inside `logs_to_file`:
file descriptors 1 and 2 go to a log file, so everything libraries and child processes
write (Dagster's console logger, Spark's JVM and log4j, Python warnings) lands there, while
the command writes to the terminal through `Terminal.out` and `Terminal.err`, copies of the
original descriptors. The log file's path is the first line a command prints.

`RunProgress` is a run observer (`runner.observing`): one bar per planned piece of work with
partitions (asset by day) done of total, runs done of total, elapsed time and ETA. Work
launched on a deployment names its backfill and URL first, and the bar follows Dagster's
counts (its runs are planned by Dagster, not by `runner.plan_work`).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from tqdm import tqdm

from backfill_platform.runner import (
    TRIGGER_TAG,
    BackfillProgress,
    RangeRun,
    RunReport,
    RunSpec,
    range_tags,
)
from backfill_platform.settings import SettingError

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_YAML = REPO_ROOT / "deploy" / "dagster.yaml"
# Short enough for an 80-column terminal with room for the bar (`_columns` sizes it).
BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} partitions{postfix} "
    "[{elapsed}<{remaining}]"
)


def _columns(stream: TextIO) -> int | None:
    """The terminal's width, read once when a bar starts: tqdm's `dynamic_ncols` re-reads it
    at every refresh and, refreshed from the ticker thread during a run, drew a 10-column
    bar now and then. None (tqdm's default) when `stream` is not a terminal."""
    try:
        return os.get_terminal_size(stream.fileno()).columns - 1
    except (OSError, ValueError, AttributeError):
        return None


def dagster_home() -> Path:
    """DAGSTER_HOME, or the repository's `.dagster_home` (the Makefile's default) when unset,
    created with `deploy/dagster.yaml` like `make dagster-home` does."""
    configured = os.environ.get("DAGSTER_HOME", "").strip()
    if configured:
        home = Path(configured)
        if not home.is_dir():
            raise SettingError(
                f"DAGSTER_HOME={configured}: no such directory (create it, e.g. "
                "`make dagster-home`, or unset DAGSTER_HOME to use the repository's)"
            )
        return home
    if not INSTANCE_YAML.is_file():
        raise SettingError(
            "DAGSTER_HOME is not set: export DAGSTER_HOME=<a directory for Dagster's instance>"
        )
    home = REPO_ROOT / ".dagster_home"
    home.mkdir(exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(INSTANCE_YAML, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


# Not `logs`: Dagster's webserver and daemon treat DAGSTER_HOME/logs as their telemetry
# cache and move it to `.logs_queue/` for upload when they start (even with telemetry
# disabled in dagster.yaml), so every log path printed earlier would stop pointing at a file.
LOG_DIR_NAME = "backfill-logs"


def log_dir() -> Path:
    """Where the commands' log files go: DAGSTER_HOME/backfill-logs."""
    return dagster_home() / LOG_DIR_NAME


def shown(path: Path) -> str:
    """`path` relative to the working directory when it is inside it (shorter to read)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class Terminal:
    """Where a command writes for a person while fds 1 and 2 go to the log file."""

    out: TextIO
    err: TextIO
    log: Path


@contextmanager
def logs_to_file(name: str, directory: Path, path: Path | None = None) -> Iterator[Terminal]:
    """fds 1 and 2 to `directory/<name>-<UTC time>.log` (or to `path`, appended) for the
    block; `sys.stdout` is the terminal's stdout meanwhile, so `print` still reaches the
    person."""
    directory.mkdir(parents=True, exist_ok=True)
    path = path or directory / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    encoding = sys.stdout.encoding or "utf-8"
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding=encoding, errors="replace")
    err = os.fdopen(os.dup(2), "w", buffering=1, encoding=encoding, errors="replace")
    previous_stdout = sys.stdout
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = out
        try:
            yield Terminal(out, err, path)
        finally:
            for stream in (out, err, sys.stderr, previous_stdout):
                stream.flush()
            sys.stdout = previous_stdout
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            out.close()
            err.close()


class RunProgress:
    """Progress bars for `runner.observing`: one per planned piece of work.

    With `instance` (the one the in-process runs record to, or a function returning it),
    the bar also moves inside a run: every few seconds it counts the partitions the run in
    progress has materialized so far. Runs sized by work can be minutes long, and a bar
    that moves only between runs would sit still for most of `make demo`.
    """

    TICK_SECONDS = 1.0  # how often elapsed time is redrawn on a terminal
    POLL_SECONDS = 2.0  # how often the instance is asked for the run's partitions
    POLL_FAILURES = 3  # failed polls in a row before the bar stops following runs

    def __init__(
        self,
        stream: TextIO,
        labels: dict[str, str] | None = None,
        instance: DagsterInstance | Callable[[], DagsterInstance] | None = None,
    ):
        self.stream = stream
        self.labels = labels or {}
        self.bar: tqdm | None = None
        self.plan: Sequence[RunSpec] = ()
        self.done = 0
        self.failed: RangeRun | None = None
        self.deployed: BackfillProgress | None = None  # set once work runs on a deployment
        self._instance = instance
        self._trigger = ""
        self._in_run: tuple[str, int, str | None] | None = None  # run id, count, cursor
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @staticmethod
    def size(spec: RunSpec) -> int:
        return len(spec.days) * len(spec.keys)

    def planned(self, plan: Sequence[RunSpec], trigger: str) -> None:
        self.close()
        self.plan, self.done, self.failed, self.deployed = list(plan), 0, None, None
        self._trigger, self._in_run = trigger, None
        self.bar = tqdm(
            total=sum(self.size(spec) for spec in self.plan),
            desc=self.labels.get(trigger, trigger),
            file=self.stream,
            bar_format=BAR_FORMAT,
            ncols=_columns(self.stream),
            mininterval=0.5,
        )
        self._describe()
        # elapsed time (and, with an instance, the partitions) keep moving while a run works
        if self.stream.isatty() or self._instance is not None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def launched(self, backfill_id: str, url: str) -> None:
        if self.bar is None:  # following a backfill no plan of ours launched (retry)
            self.planned([], "backfill")
        self.deployed = BackfillProgress(0, 0, 0, 0, 0)
        message = f"backfill {backfill_id} launched: {url}"
        if self.bar is None:
            print(message, file=self.stream)
        else:
            self.bar.write(message, file=self.stream)

    def progressed(self, progress: BackfillProgress) -> None:
        self.deployed = progress
        if self.bar is None:
            return
        if progress.partitions_total:
            self.bar.total = progress.partitions_total
        self.bar.n = progress.partitions_done
        self._describe()

    def ran(self, run: RangeRun) -> None:
        if self.bar is None or self.deployed is not None:
            return
        with self._lock:
            self.done += 1
            self._in_run = None
            self.bar.n = self._partitions_done()
        if not run.success:
            self.failed = run
        self._describe()

    def finished(self, report: RunReport | None) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _describe(self) -> None:
        if self.deployed is not None:
            done = self.deployed
            failed = f", {done.partitions_failed} FAILED" if done.partitions_failed else ""
            self.bar.set_postfix_str(
                f"{done.runs_done}/{done.runs_total} runs{failed}", refresh=True
            )
            return
        total = len(self.plan)
        if self.failed is not None:
            text = f"run {self.done}/{total} FAILED"
        elif self.done < total:
            text = f"run {self.done + 1}/{total}"  # the one in progress
        else:
            text = f"{total}/{total} runs"
        self.bar.set_postfix_str(text, refresh=True)

    def _tick(self) -> None:
        polled, failures = 0.0, 0
        while not self._stop.wait(self.TICK_SECONDS):
            bar = self.bar
            if bar is None:
                continue
            polled += self.TICK_SECONDS
            moved = False
            if self._instance is not None and self.deployed is None and polled >= self.POLL_SECONDS:
                polled = 0.0
                try:
                    moved, failures = self._count_in_run(bar), 0
                except Exception as error:  # a progress display never fails the command
                    # one busy or restarting storage is not a reason to freeze the bar for
                    # the rest of a long backfill; a storage that keeps failing is
                    failures += 1
                    if failures >= self.POLL_FAILURES:
                        print(f"progress: stopped following runs: {error}", file=sys.stderr)
                        self._instance = None
            if moved or self.stream.isatty():
                bar.refresh()

    def _count_in_run(self, bar: tqdm) -> bool:
        """Partitions the run in progress materialized so far (its range and trigger tags
        name it among the instance's started runs), added to the finished runs' count;
        whether the bar moved."""
        if callable(self._instance):
            self._instance = self._instance()
        with self._lock:
            if self.done >= len(self.plan):
                return False
            spec = self.plan[self.done]
        tags = {TRIGGER_TAG: self._trigger, **range_tags(spec.days)}
        started = self._instance.get_runs(
            RunsFilter(statuses=[DagsterRunStatus.STARTED], tags=tags), limit=1
        )
        if not started:
            return False
        run_id = started[0].run_id
        _, count, cursor = (
            self._in_run if self._in_run and self._in_run[0] == run_id else (run_id, 0, None)
        )
        page = self._instance.get_records_for_run(
            run_id, cursor=cursor, of_type=DagsterEventType.ASSET_MATERIALIZATION, limit=10_000
        )
        count += len(page.records)
        with self._lock:
            current = self.plan[self.done] if self.done < len(self.plan) else None
            if self.bar is not bar or current is not spec:
                return False  # the run finished meanwhile: `ran` counted it
            self._in_run = (run_id, count, page.cursor)
            before = bar.n
            bar.n = self._partitions_done() + min(count, self.size(spec) - 1)
            return bar.n != before

    def _partitions_done(self) -> int:
        """Partitions of the runs finished so far."""
        return sum(self.size(spec) for spec in self.plan[: self.done])
