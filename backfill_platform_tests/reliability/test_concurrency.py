"""Concurrent writers to one table, each its own process (Python + Spark JVM), through the one
write path (`LakehouseResource.replace_range`).

- Four writers replace disjoint ranges at the same moment: every write lands.
- Two writers replace overlapping ranges at the same moment: the per-table lock serializes
  them, so each day holds the rows of exactly one writer (the later commit), never a mix.
- A writer is SIGKILLed in the middle of an overlapping write: the other lands, the table
  stays readable and whole, and a retry of the killed write (from another process) lands.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from datetime import date, timedelta

import pytest

from backfill_platform.resources import LakehouseResource
from backfill_platform_tests.harness import spark_resource_for_tests
from backfill_platform_tests.reliability.procs import Worker, reap, spawn

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TABLE = "t/concurrent"
DAY0 = date(2024, 1, 1)
SIZES = {"small": {"writers": 4, "rows_per_day": 200}, "full": {"writers": 6, "rows_per_day": 5000}}


def _day(n: int) -> str:
    return (DAY0 + timedelta(days=n)).isoformat()


def _job(start: int, end: int, tag: str, rows: int) -> dict:
    return {"start": _day(start), "end": _day(end), "tag": tag, "rows_per_day": rows}


def _state(lake: LakehouseResource) -> dict[str, dict[str, int]]:
    """day -> {writer tag: rows}: a day written by two writers at once would show two tags."""
    got: dict[str, dict[str, int]] = defaultdict(dict)
    for r in lake.read(TABLE).groupBy("d", "writer").count().collect():
        got[r["d"].isoformat()][r["writer"]] = r["count"]
    return dict(got)


def _expected(commits: list[tuple[int, dict]]) -> dict[str, dict[str, int]]:
    """Apply jobs in commit (Delta version) order: each replaces exactly its days."""
    model: dict[str, dict[str, int]] = {}
    for _, job in sorted(commits, key=lambda c: c[0]):
        start, end = date.fromisoformat(job["start"]), date.fromisoformat(job["end"])
        for n in range((end - start).days):
            model[(start + timedelta(days=n)).isoformat()] = {job["tag"]: job["rows_per_day"]}
    return model


def test_concurrent_writers_land_whole_and_never_interleave(tmp_path, spark, size, figures):
    cfg = SIZES[size]
    n, rows = cfg["writers"], cfg["rows_per_day"]
    rng = random.Random(8)
    lakehouse = tmp_path / "lake"
    # Round 1: n disjoint two-day ranges. Round 2: writers 0 and 1 overlap by two days.
    # Round 3: writers 2 and 3 overlap and writer 2 is killed mid-write. Round 4: writer 0
    # retries writer 2's round-3 job.
    disjoint = [_job(2 * i, 2 * i + 2, f"r1-w{i}", rows) for i in range(n)]
    overlap = [_job(0, 4, "r2-w0", rows), _job(2, 6, "r2-w1", rows)]
    killed_job, other_job = _job(1, 5, "r3-w2", rows), _job(3, 7, "r3-w3", rows)
    jobs = {i: [disjoint[i]] for i in range(n)}
    jobs[0] += [overlap[0], killed_job]
    jobs[1] += [overlap[1]]
    jobs[2] += [killed_job]
    jobs[3] += [other_job]
    started = time.monotonic()
    workers: list[Worker] = [
        spawn(
            tmp_path / "workers",
            f"writer-{i}",
            "write-ranges",
            {"lakehouse": str(lakehouse), "table": TABLE, "jobs": jobs[i]},
        )
        for i in range(n)
    ]
    lake = LakehouseResource(root_dir=str(lakehouse), spark=spark_resource_for_tests())
    stats = {"writers": n, "faults_injected": 0, "rows_checked": 0, "interleaved_days": 0}
    commits: list[tuple[int, dict]] = []
    try:
        for w in workers:
            w.wait("ready", timeout=900)

        # Round 1: all at once; all land, in n consecutive versions.
        for w in workers:
            w.go()
        for i, w in enumerate(workers):
            commits.append((w.wait("committed", timeout=600, job=0)["version"], disjoint[i]))
        assert sorted(v for v, _ in commits) == list(range(n))
        state = _state(lake)
        assert state == _expected(commits)
        stats["rows_checked"] += sum(sum(t.values()) for t in state.values())

        # Round 2: two overlapping writers at once: serialized, each day one writer's rows.
        workers[0].go(1)
        workers[1].go(1)
        begun = [workers[i].wait("writing", job=1)["t"] for i in (0, 1)]
        ends = [workers[i].wait("committed", timeout=600, job=1) for i in (0, 1)]
        commits += [(e["version"], overlap[i]) for i, e in enumerate(ends)]
        state = _state(lake)
        stats["interleaved_days"] += sum(len(tags) > 1 for tags in state.values())
        assert state == _expected(commits)
        stats["rows_checked"] += sum(sum(t.values()) for t in state.values())
        stats["overlapping_writes_both_in_flight"] = max(begun) < min(e["t"] for e in ends)
        stats["overlap_winner"] = overlap[max(range(2), key=lambda i: ends[i]["version"])]["tag"]

        # Round 3: overlapping again, and writer 2 is SIGKILLed mid-write.
        version_before = lake.current_version(TABLE)
        workers[2].go(1)
        workers[3].go(1)
        writing = workers[2].wait("writing", job=1)
        time.sleep(max(0.0, writing["t"] + rng.uniform(0.0, 1.5) - time.time()))
        workers[2].kill()
        stats["faults_injected"] += 1
        killed_committed = any(
            e["event"] == "committed" and e["job"] == 1 for e in workers[2].events()
        )
        end = workers[3].wait("committed", timeout=600, job=1)
        commits.append((end["version"], other_job))
        history = lake.history(TABLE)
        if killed_committed:  # the kill came after its commit: then it must be whole
            mine = next(h for h in history if h["metadata"].get("writer") == "r3-w2")
            commits.append((mine["version"], killed_job))
        stats["killed_writer_had_committed"] = killed_committed
        state = _state(lake)
        stats["interleaved_days"] += sum(len(tags) > 1 for tags in state.values())
        assert state == _expected(commits)
        assert lake.current_version(TABLE) == version_before + 1 + killed_committed

        # Round 4: the killed job is retried from another process and lands.
        workers[0].go(2)
        commits.append((workers[0].wait("committed", timeout=600, job=2)["version"], killed_job))
        state = _state(lake)
        stats["interleaved_days"] += sum(len(tags) > 1 for tags in state.values())
        expected = _expected(commits)
        assert state == expected
        stats["rows_checked"] += sum(sum(t.values()) for t in state.values())
        stats["rows_lost"] = sum(sum(t.values()) for t in expected.values()) - sum(
            sum(t.values()) for t in state.values()
        )
        for w in workers:
            if w is not workers[2]:
                assert w.finish(timeout=300) == 0, w.log()
    finally:
        reap(workers)

    versions = sorted(h["version"] for h in lake.history(TABLE))
    stats.update(
        commits=len(commits),
        delta_versions=len(versions),
        versions_contiguous=versions == list(range(len(versions))),
        torn_partitions=stats["interleaved_days"],
        failures=0,
        seconds=round(time.monotonic() - started, 1),
    )
    figures.update(stats)
    print(json.dumps(stats))
    assert stats["versions_contiguous"]
    assert stats["interleaved_days"] == 0
