"""Kill during write: SIGKILL a ranged materialization (Python driver and Spark JVM) at seeded
random moments, including inside a Delta commit (data files written, log entry not yet).
After every kill the Delta logs must be readable and every table's range must be exactly its
state before the killed write or its complete new state; re-running the range must give
exactly the contract's answer (reference.py, compared by reconcile.py).

Trials are cheap because each worker starts its JVM while the previous one is still being
killed-at-random, and checks the state the previous kill left before writing again.
"""

import fcntl
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path
from urllib.parse import unquote

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.reconcile import reconcile_marts
from backfill_platform.reference import compute_contract_answer
from backfill_platform.resources import LakehouseResource
from backfill_platform.runner import materialize_range
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import TABLE_NAMES
from backfill_platform_tests.harness import spark_resource_for_tests
from backfill_platform_tests.reliability.procs import REPO_ROOT, Worker, reap, spawn
from backfill_platform_tests.reliability.worker import DATE_COLUMNS, partition_fingerprints

FIRST, LAST = date(2024, 1, 1), date(2024, 1, 5)
SIZES = {
    # kills, and orders per day of the two landing zones the runs alternate between
    "small": {"trials": 2, "orders_per_day": 10},
    "full": {"trials": 21, "orders_per_day": 30},
}
SEED = 20240101

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def _materialize(landing: Path, lakehouse: Path, tables: list[str]) -> None:
    resources = build_resources(str(landing), str(lakehouse), spark=spark_resource_for_tests())
    materialize_range(
        all_assets,
        FIRST.isoformat(),
        LAST.isoformat(),
        resources,
        DagsterInstance.ephemeral(),
        selection=AssetSelection.assets(*(AssetKey.from_user_string(t) for t in tables)),
    )


def _variant_of(table_state: dict, expected: list[dict]) -> tuple[set[int], int, int, int]:
    """Which expected states (0=A, 1=B) the whole table equals, torn partitions, partitions
    and rows checked."""
    got = table_state["partitions"]
    keys = set(got) | set(expected[0]["partitions"]) | set(expected[1]["partitions"])
    torn = sum(1 for k in keys if all(got.get(k) != e["partitions"].get(k) for e in expected))
    whole = {
        v for v, e in enumerate(expected) if all(got.get(k) == e["partitions"].get(k) for k in keys)
    }
    return whole, torn, len(keys), sum(n for n, _ in got.values())


def _locks_held(lakehouse: Path) -> list[str]:
    """Table locks some process holds right now (probe: a non-blocking exclusive lock)."""
    held = []
    for path in sorted((lakehouse / "_locks").glob("*.lock")):
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(path.stem)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
    return held


def _commit_count(lakehouse: Path) -> int:
    return sum(len(list((lakehouse / t / "_delta_log").glob("*.json"))) for t in TABLE_NAMES)


def _data_files(lakehouse: Path) -> set[str]:
    """Parquet data files on disk (the log and its checkpoints excluded)."""
    return {
        str(f.relative_to(lakehouse))
        for t in TABLE_NAMES
        for f in (lakehouse / t).rglob("*.parquet")
        if "_delta_log" not in f.parts
    }


def _uncommitted_files(lakehouse: Path) -> set[str]:
    """Data files no commit ever added: what a write killed before its commit leaves behind
    (invisible to readers, removable by VACUUM)."""
    added = set()
    for t in TABLE_NAMES:
        for log in (lakehouse / t / "_delta_log").glob("*.json"):
            for line in log.read_text().splitlines():
                action = json.loads(line)
                if "add" in action:
                    added.add(f"{t}/{unquote(action['add']['path'])}")
    return _data_files(lakehouse) - added


def _wait_inside_a_commit(lakehouse: Path, worker: Worker, timeout: float) -> bool:
    """Return as soon as a write has put data files on disk that no commit has added yet:
    Delta writes a commit's files first and its log entry last, so that is mid-commit."""
    deadline = time.monotonic() + timeout
    commits, files = _commit_count(lakehouse), len(_data_files(lakehouse))
    while time.monotonic() < deadline and worker.proc.poll() is None:
        now_commits, now_files = _commit_count(lakehouse), len(_data_files(lakehouse))
        if now_commits != commits:
            commits, files = now_commits, now_files
        elif now_files > files:
            return True
        time.sleep(0.002)
    return False


def _check(lake, tables, expected, allowed, stats, problems, label) -> dict[str, int]:
    """Read every table as the kill left it (a different JVM from the killed one): which
    complete state each is in, and whether that is one the killed write could leave."""
    state = {}
    for t in tables:
        stats["tables_checked"] += 1
        found = partition_fingerprints(lake, t)
        if "error" in found:
            stats["unreadable_logs"] += 1
            problems.append(f"{label}: {t} unreadable: {found['error']}")
            continue
        whole, torn, parts, rows = _variant_of(found, [e[t] for e in expected])
        stats["partitions_checked"] += parts
        stats["rows_checked"] += rows
        stats["torn_partitions"] += torn
        if not whole:
            stats["mixed_ranges"] += 0 if torn else 1
            problems.append(f"{label}: {t} is neither complete state ({torn} torn partitions)")
            continue
        if not whole & allowed[t]:
            stats["not_old_or_new"] += 1
            problems.append(f"{label}: {t} is state {whole}, expected one of {allowed[t]}")
        state[t] = min(whole & allowed[t] or whole)
    return state


@pytest.mark.slow
def test_killed_runs_leave_every_partition_old_or_new(tmp_path, spark, size, figures):
    cfg = SIZES[size]
    tables = list(DATE_COLUMNS)  # the six tables of orders and FX (the CRM's: test_crm.py)
    rng = random.Random(SEED)
    landings = [tmp_path / "landing_a", tmp_path / "landing_b"]
    for seed, landing in enumerate(landings, start=1):
        generate_landing(
            landing, FIRST, LAST, cfg["orders_per_day"], seed=seed, malformed_rate=0.02
        )
    answers = [compute_contract_answer(p, first_date=FIRST, last_date=LAST) for p in landings]
    assert not any(a.fx_errors for a in answers)
    # The two complete states every partition may be in (A and B), built in this process.
    started = time.monotonic()
    expected = []
    for i, landing in enumerate(landings):
        _materialize(landing, tmp_path / f"expected_{i}", tables)
        built = LakehouseResource(
            root_dir=str(tmp_path / f"expected_{i}"), spark=spark_resource_for_tests()
        )
        expected.append({t: partition_fingerprints(built, t) for t in tables})
    lakehouse = tmp_path / "lakehouse"
    shutil.copytree(tmp_path / "expected_0", lakehouse)
    lake = LakehouseResource(root_dir=str(lakehouse), spark=spark_resource_for_tests())

    work = tmp_path / "workers"
    base = {
        "lakehouse": str(lakehouse),
        "landings": [str(p) for p in landings],
        "first": FIRST.isoformat(),
        "last": LAST.isoformat(),
        "selection": tables,
    }

    def start_worker(trial: int, once: bool = False) -> Worker:
        start_index = rng.randrange(2)
        return spawn(
            work,
            f"trial-{trial:03d}",
            "kill-target",
            {**base, "start_index": start_index, "once": once},
        )

    trials = cfg["trials"]
    # Early in a run, later in it (after some commits), and inside a Delta commit.
    modes = ["commit", "early", "late"]
    stats = {
        "trials": trials,
        "faults_injected": 0,
        "kills_by_mode": {m: 0 for m in modes},
        "kills_with_uncommitted_files": 0,
        "kills_holding_table_lock": 0,
        "kills_between_table_commits": 0,
        "kills_before_any_commit": 0,
        "kills_after_completed_iterations": 0,
        "tables_checked": 0,
        "partitions_checked": 0,
        "rows_checked": 0,
        "torn_partitions": 0,
        "mixed_ranges": 0,
        "unreadable_logs": 0,
        "not_old_or_new": 0,
        "kill_delays_s": [],
    }
    problems: list[str] = []
    iteration_estimate = 15.0
    allowed: dict[str, set[int]] = {t: {0} for t in tables}  # the copied lakehouse is A
    workers: list[Worker] = [start_worker(0, once=trials == 0)]
    try:
        for trial in range(trials):
            state = _check(lake, tables, expected, allowed, stats, problems, f"trial {trial}")
            uncommitted_before = _uncommitted_files(lakehouse)
            worker = workers[trial]
            worker.wait("ready", timeout=600)
            commits_before = _commit_count(lakehouse)
            worker.go()
            workers.append(start_worker(trial + 1, once=trial + 1 == trials))
            first = worker.wait("start", timeout=600)
            mode = modes[trial % len(modes)]
            if mode == "commit":
                # Cut into the run's n-th commit (seeded), so each table's commit gets its turn.
                nth = rng.randrange(len(tables))
                deadline = time.monotonic() + 4 * iteration_estimate
                while (
                    _commit_count(lakehouse) < commits_before + nth
                    and time.monotonic() < deadline
                    and worker.proc.poll() is None
                ):
                    time.sleep(0.002)
                _wait_inside_a_commit(lakehouse, worker, 4 * iteration_estimate)
            else:
                low, high = (0.0, 1.0) if mode == "early" else (1.0, 2.0)
                delay = rng.uniform(low * iteration_estimate, high * iteration_estimate)
                stats["kill_delays_s"].append(round(delay, 2))
                time.sleep(max(0.0, first["t"] + delay - time.time()))
            if _locks_held(lakehouse):
                stats["kills_holding_table_lock"] += 1
            worker.kill()
            stats["faults_injected"] += 1
            stats["kills_by_mode"][mode] += 1
            if _uncommitted_files(lakehouse) - uncommitted_before:
                stats["kills_with_uncommitted_files"] += 1
            events = worker.events()
            done = [e for e in events if e["event"] == "done"]
            starts = [e for e in events if e["event"] == "start"]
            new_commits = _commit_count(lakehouse) - commits_before
            if done:
                stats["kills_after_completed_iterations"] += 1
                iteration_estimate = max(1.0, done[0]["t"] - starts[0]["t"])
            if 0 < new_commits - len(done) * len(tables) < len(tables):
                stats["kills_between_table_commits"] += 1
            if new_commits == 0:
                stats["kills_before_any_commit"] += 1
            # Each table may now hold its state after the last completed iteration (or the
            # state checked before this worker), or the new state of the interrupted one.
            interrupted = {starts[-1]["variant"]} if len(starts) > len(done) else set()
            for t in tables:
                before = done[-1]["variant"] if done else state.get(t, 0)
                allowed[t] = {before} | interrupted
        _check(lake, tables, expected, allowed, stats, problems, "after the last kill")
        final_worker = workers[-1]
        final_worker.wait("ready", timeout=600)
        final_worker.go()
        assert final_worker.finish(timeout=600) == 0, final_worker.log()
        variant = final_worker.wait("done")["variant"]
    finally:
        reap(workers)

    # The re-run: exactly the tables a clean build gives, and the contract's answer.
    final = {t: partition_fingerprints(lake, t) for t in tables}
    exact = all(final[t].get("partitions") == expected[variant][t]["partitions"] for t in tables)
    answer = answers[variant]
    raw_rows = lake.read("raw/orders").count()
    rows_lost = sum(answer.raw_line_counts.values()) - raw_rows
    reconciliation = reconcile_marts(lake, landings[variant], FIRST, LAST)
    staged = lake.read("staging/orders").count()
    rejects = lake.read("staging/orders_rejects").count()
    stats.update(
        rerun_exact=exact,
        rerun_matches_contract=reconciliation.ok,
        rows_lost=rows_lost,
        staging_rows_vs_contract=[staged, len(answer.staging)],
        reject_rows_vs_contract=[rejects, len(answer.rejects)],
        final_variant="AB"[variant],
        delta_versions={t: len(final[t]["versions"]) for t in tables},
        versions_contiguous=all(
            final[t]["versions"] == list(range(len(final[t]["versions"]))) for t in tables
        ),
        seconds=round(time.monotonic() - started, 1),
    )
    stats["rows_checked"] += raw_rows + staged + rejects
    stats["failures"] = (
        len(problems)
        + (not exact)
        + (rows_lost != 0)
        + (not stats["versions_contiguous"])
        + (not reconciliation.ok)
        + (staged != len(answer.staging))
        + (rejects != len(answer.rejects))
    )
    figures.update(stats)
    print(json.dumps(stats, default=str))
    assert not problems, "\n".join(problems)
    assert stats["torn_partitions"] == 0 and stats["unreadable_logs"] == 0
    assert exact, "re-running the range did not give exactly the expected tables"
    assert reconciliation.ok, "\n".join(reconciliation.details)
    assert stats["failures"] == 0, stats
    # The suite must really have cut into commits, not only killed between them.
    assert stats["kills_with_uncommitted_files"] >= 1, stats


HOLDER = """
import sys, time
from backfill_platform.resources import LakehouseResource, SparkSessionResource
lake = LakehouseResource(root_dir=sys.argv[1], spark=SparkSessionResource())
with lake.table_lock(sys.argv[2]):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_lock_holder_never_blocks_the_next_writer(tmp_path, spark, size, figures):
    """The table lock is an OS file lock: a writer killed while holding it releases it."""
    lake = LakehouseResource(root_dir=str(tmp_path / "lake"), spark=spark_resource_for_tests())
    table = "raw/orders"
    rounds = 2 if size == "small" else 10
    blocked_while_held = 0
    for n in range(rounds):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, lake.root_dir, table],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            assert holder.stdout.readline().strip() == b"locked"
            assert _locks_held(Path(lake.root_dir)) == ["raw__orders"]
            day = date(2024, 1, 1 + n)
            df = spark.createDataFrame([(day, n)], "ingest_date date, n int")
            writer = threading.Thread(
                target=lake.replace_range,
                args=(table, df, "ingest_date", day, date(2024, 1, 2 + n), {"round": n}),
            )
            writer.start()
            writer.join(timeout=2)
            blocked_while_held += writer.is_alive()
        finally:
            holder.kill()
            holder.wait()
        writer.join(timeout=300)
        assert not writer.is_alive(), "the writer still waits for a dead process's lock"
    versions = [h["version"] for h in lake.history(table)]
    assert sorted(versions) == list(range(rounds))
    assert lake.read(table).count() == rounds
    figures.update(
        lock_holders_killed=rounds,
        writers_blocked_while_holder_alive=blocked_while_held,
        writers_landed_after_kill=len(versions),
    )
    assert blocked_while_held == rounds
