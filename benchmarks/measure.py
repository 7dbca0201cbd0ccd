"""What the benchmark observes besides wall time: memory peaks, Spark's own timings, the machine.

Spark's time comes from its event log (JSON lines written by the driver, flushed at every
job and stage end), so nothing in the platform's code has to be instrumented: a Spark job
is attributed to a benchmark phase, and to a Dagster step, by when it was submitted.
"""

from __future__ import annotations

import json
import os
import platform
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil


class MemorySampler:
    """Peak resident memory of this Python process and of its Spark driver JVM (a child)."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self._me = psutil.Process()
        self._peaks = {"python": 0, "jvm": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self) -> None:
        self._peaks = {"python": 0, "jvm": 0}

    def peaks_mb(self) -> dict[str, float]:
        self.sample()
        return {k: round(v / 2**20, 1) for k, v in self._peaks.items()}

    def sample(self) -> None:
        try:
            python = self._me.memory_info().rss
            jvm = sum(
                c.memory_info().rss
                for c in self._me.children(recursive=True)
                if "java" in c.name().lower()
            )
        except psutil.Error:  # a child exited between listing and reading it
            return
        self._peaks["python"] = max(self._peaks["python"], python)
        self._peaks["jvm"] = max(self._peaks["jvm"], jvm)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


@dataclass
class SparkJob:
    job_id: int
    submitted_ms: int
    completed_ms: int
    stage_ids: list[int]
    # What the job does: the description Delta gives its own jobs ("Delta: Compute snapshot
    # for version: 12"), else the action of the SQL query it serves ("collect at
    # .../quality.py:63"; AQE's stage jobs run from a thread pool and name no call site).
    description: str = ""


@dataclass
class SparkStage:
    stage_id: int
    name: str
    submitted_ms: int
    completed_ms: int
    tasks: int
    input_bytes: int = 0
    shuffle_read_bytes: int = 0
    shuffle_write_bytes: int = 0
    executor_run_ms: int = 0


@dataclass
class SparkLog:
    """Jobs and stages parsed from a Spark event log."""

    jobs: list[SparkJob] = field(default_factory=list)
    stages: dict[int, SparkStage] = field(default_factory=dict)
    started_ms: int | None = None  # the application's start: its SparkContext is up

    @classmethod
    def read(cls, log_dir: Path | None) -> SparkLog:
        log = cls()
        if log_dir is None or not log_dir.is_dir():
            return log
        starts: dict[int, dict] = {}
        queries: dict[str, str] = {}  # SQL execution id -> its action's call site
        metrics: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # Spark 4 writes a rolling log: a folder per application, events_<n>_<app> inside.
        files = sorted((p for p in log_dir.rglob("*") if p.is_file()), key=_event_file_order)
        for path in files:
            for line in _lines(path):
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # the line being written right now
                    continue
                if not isinstance(event, dict):
                    continue
                kind = event.get("Event")
                if kind == "SparkListenerApplicationStart":
                    log.started_ms = event.get("Timestamp")
                elif kind == "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart":
                    queries[str(event.get("executionId"))] = event.get("description", "")
                elif kind == "SparkListenerJobStart":
                    starts[event["Job ID"]] = event
                elif kind == "SparkListenerJobEnd" and event["Job ID"] in starts:
                    start = starts[event["Job ID"]]
                    properties = start.get("Properties") or {}
                    log.jobs.append(
                        SparkJob(
                            event["Job ID"],
                            start["Submission Time"],
                            event["Completion Time"],
                            list(start.get("Stage IDs", [])),
                            properties.get("spark.job.description")
                            or queries.get(properties.get("spark.sql.execution.root.id", ""))
                            or properties.get("callSite.short")
                            or _last_stage_name(start),
                        )
                    )
                elif kind == "SparkListenerTaskEnd":
                    m = event.get("Task Metrics") or {}
                    acc = metrics[event["Stage ID"]]
                    acc["input"] += (m.get("Input Metrics") or {}).get("Bytes Read", 0)
                    shuffle_read = m.get("Shuffle Read Metrics") or {}
                    acc["shuffle_read"] += shuffle_read.get(
                        "Remote Bytes Read", 0
                    ) + shuffle_read.get("Local Bytes Read", 0)
                    acc["shuffle_write"] += (m.get("Shuffle Write Metrics") or {}).get(
                        "Shuffle Bytes Written", 0
                    )
                    acc["run_ms"] += m.get("Executor Run Time", 0)
                elif kind == "SparkListenerStageCompleted":
                    info = event["Stage Info"]
                    if "Submission Time" not in info or "Completion Time" not in info:
                        continue
                    sid = info["Stage ID"]
                    log.stages[sid] = SparkStage(
                        sid,
                        info.get("Stage Name", "?"),
                        info["Submission Time"],
                        info["Completion Time"],
                        info.get("Number of Tasks", 0),
                    )
        for sid, stage in log.stages.items():
            acc = metrics.get(sid, {})
            stage.input_bytes = acc.get("input", 0)
            stage.shuffle_read_bytes = acc.get("shuffle_read", 0)
            stage.shuffle_write_bytes = acc.get("shuffle_write", 0)
            stage.executor_run_ms = acc.get("run_ms", 0)
        return log

    def between(self, start_s: float, end_s: float) -> SparkLog:
        """Jobs submitted in [start_s, end_s) (epoch seconds) and their stages."""
        jobs = [j for j in self.jobs if start_s * 1000 <= j.submitted_ms < end_s * 1000]
        ids = {s for j in jobs for s in j.stage_ids}
        return SparkLog(jobs, {s: st for s, st in self.stages.items() if s in ids})

    def summary(self) -> dict[str, float]:
        """Job count, seconds with at least one Spark job running, tasks and bytes moved."""
        return {
            "jobs": len(self.jobs),
            "stages": len(self.stages),
            "tasks": sum(s.tasks for s in self.stages.values()),
            "busy_s": round(_union_seconds((j.submitted_ms, j.completed_ms) for j in self.jobs), 2),
            "executor_run_s": round(sum(s.executor_run_ms for s in self.stages.values()) / 1e3, 2),
            "input_mb": round(sum(s.input_bytes for s in self.stages.values()) / 2**20, 2),
            "shuffle_mb": round(
                sum(s.shuffle_write_bytes for s in self.stages.values()) / 2**20, 2
            ),
        }

    def jobs_by_description(self, n: int = 10) -> list[dict]:
        """Jobs grouped by what they do (a description's first line, its numbers as N, the
        repository's path dropped), most job seconds first; jobs that ran at the same time
        count each."""
        groups: dict[str, list[SparkJob]] = defaultdict(list)
        for job in self.jobs:
            first_line = job.description.split("<br/>")[0].replace(f"{Path.cwd()}/", "")
            groups[re.sub(r"\d+", "N", first_line) or "?"].append(job)
        rows = [
            {
                "what": text,
                "jobs": len(jobs),
                "job_seconds": round(sum(j.completed_ms - j.submitted_ms for j in jobs) / 1e3, 2),
            }
            for text, jobs in groups.items()
        ]
        return sorted(rows, key=lambda r: -r["job_seconds"])[:n]

    def top_stages(self, n: int = 8) -> list[dict]:
        """Stage time grouped by Spark's stage name (the call site), largest first."""
        by_name: dict[str, list[SparkStage]] = defaultdict(list)
        for stage in self.stages.values():
            by_name[stage.name].append(stage)
        rows = [
            {
                "stage": name,
                "count": len(stages),
                "seconds": round(sum(s.completed_ms - s.submitted_ms for s in stages) / 1e3, 2),
                "input_mb": round(sum(s.input_bytes for s in stages) / 2**20, 2),
            }
            for name, stages in by_name.items()
        ]
        return sorted(rows, key=lambda r: -r["seconds"])[:n]


def spark_with_event_log(folder: Path):
    """The platform's Spark settings (from the environment, as the code location reads
    them) plus Spark's event log as plain JSON lines in one file in `folder`: flushed at each
    job's end, so `SparkLog.read` can read it while the session runs."""
    from backfill_platform.resources import SparkSessionResource
    from backfill_platform.settings import (
        SPARK_DRIVER_MEMORY,
        SPARK_MASTER,
        SPARK_SHUFFLE_PARTITIONS,
        setting,
    )

    return SparkSessionResource(
        master=setting(SPARK_MASTER),
        shuffle_partitions=int(setting(SPARK_SHUFFLE_PARTITIONS)),
        driver_memory=setting(SPARK_DRIVER_MEMORY),
        extra_conf=event_log_conf(folder),
    )


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark's event log as plain JSON lines in one file in `folder`."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def _last_stage_name(job_start: dict) -> str:
    """The call site of a job's final stage, which Spark names after the action."""
    stages = job_start.get("Stage Infos") or []
    return max(stages, key=lambda s: s.get("Stage ID", 0)).get("Stage Name", "") if stages else ""


def _event_file_order(path: Path) -> tuple:
    parts = path.name.split("_")
    index = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return (str(path.parent), index, path.name)


def _lines(path: Path) -> Iterable[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        yield from handle


def _union_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """Length of the union of [start, end) millisecond intervals, in seconds."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total / 1e3


@contextmanager
def demo_crm(landing: Path, work: Path, seed: int, rate: int) -> Iterator[tuple[object, dict]]:
    """The demo CRM for the landing zone's customers on a free port, and the client's settings
    pointing at it while it runs (the caller's settings back afterwards): yields the server's
    process and what `generate_crm` made."""
    from backfill_platform.sources.crm_data import generate_crm
    from backfill_platform.sources.crm_process import start_crm_server

    made = generate_crm(landing, work / "crm", seed)
    token = "bench-crm-token"
    crm = start_crm_server(work / "crm", token=token, rate=rate, log=work / "crm_requests.jsonl")
    settings = {
        "BACKFILL_CRM_URL": crm.url,
        "BACKFILL_CRM_TOKEN": token,
        "BACKFILL_CRM_RATE_LIMIT": str(rate),
    }
    before = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield crm, made
    finally:
        crm.stop()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def answered_calls(server) -> list[dict]:
    """The demo CRM's requests it answered (429s aside), oldest first; none without it."""
    return [] if server is None else [e for e in server.requests() if e["status"] != 429]


@contextmanager
def stopwatch(into: dict, name: str):
    """Wall seconds of the block, stored as into[name]; the phase's epoch span alongside."""
    started_wall, started = time.time(), time.perf_counter()
    try:
        yield
    finally:
        into[name] = round(time.perf_counter() - started, 2)
        into.setdefault("_spans", {})[name] = (started_wall, time.time())


def machine_info(spark) -> dict:
    cpu_model = "?"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    jvm = spark.sparkContext._jvm.System
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "spark": spark.version,
        "java": jvm.getProperty("java.version"),
        "spark_master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, result: dict, out: Path | None = None) -> Path:
    """A run's JSON as `benchmarks/results/<name>-<time>.json` (or `out`). Git ignores these;
    a run worth keeping is transcribed into a dated file (docs/performance.md)."""
    if out is None:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    return out
