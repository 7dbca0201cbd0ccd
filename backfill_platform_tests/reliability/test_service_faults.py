"""Fault trials with real services: a backfill of every asset over a few days, launched through
the webserver's GraphQL API and executed by the daemon, while one piece of the deployment
fails under it.

1. The daemon's whole process group is SIGKILLed while the backfill's run executes, and a new
   daemon is started: the backfill completes and every targeted partition of every table is
   written by exactly one commit of the backfill's runs (Delta history).
2. The run worker (the process executing the run) is SIGKILLed mid-step: the run is marked
   failed, the run retry from deploy/dagster.yaml re-executes it, the backfill completes and
   every table equals a clean build of the same landing zone.
3. PostgreSQL (Dagster's storage, deploy/dagster-postgres.yaml) is stopped while the run
   writes and started again: what the run and the services did is recorded, the backfill is
   resumed from failure (failed partitions only) and completes; no partition is ever torn
   (each equals its state before the backfill or the clean build), the marts reconcile.

One deployment serves all trials: PostgreSQL from Debian's package, the code location as its
own code server (deploy/workspace-code-server.yaml), webserver and daemon, all on 127.0.0.1,
each in its own process group, killed on teardown pass or fail. Every wait is bounded.
Why the code server runs on its own: docs/reliability.md, "Fault trials with real services".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
import urllib.error
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from dagster import DagsterInstance
from pyspark.sql import functions as F

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.deployment import REEXECUTE
from backfill_platform.partitions import commit_partition_keys
from backfill_platform.ranges import DayRange
from backfill_platform.reconcile import reconcile_marts
from backfill_platform.runner import backfill
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import DAY_TABLE_NAMES, TABLE_NAMES, table
from backfill_platform_tests.e2e.conftest import ALL_ASSETS, Deployment, start_deployment
from backfill_platform_tests.e2e.services import (
    LAUNCH_BACKFILL,
    DagsterServices,
    GraphQLError,
    PostgresServer,
    ServiceTimeout,
    free_port,
    make_postgres_dir,
    postgres_bin,
    wait_for,
)
from backfill_platform_tests.e2e.tables import lakehouse_for, partition_fingerprints
from backfill_platform_tests.harness import order_line, spark_resource_for_tests

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FIRST = date(2024, 1, 1)  # also BACKFILL_START_DATE: customer_ltv starts from zero
SEED = 23
SIZES = {
    # days and orders per day of the landing zone; rounds of the daemon and worker trials
    # (round r injects its fault into the backfill's (r+1)-th run: the raw/staging/fct run,
    # then customer_ltv's); PostgreSQL outages: which run they hit, whether the deployment's
    # automatic run retry stays on for that backfill, the least seconds down
    "small": {
        "days": 3,
        "orders_per_day": 12,
        "rounds": 1,
        "outages": [{"run": 0, "retries": False, "seconds": 15}],
    },
    "full": {
        "days": 5,
        "orders_per_day": 40,
        "rounds": 2,
        "outages": [
            {"run": 0, "retries": False, "seconds": 15},
            {"run": 1, "retries": True, "seconds": 45},
            # Longer than the run worker's own retries: it exits while PostgreSQL is down
            # (see docs/reliability.md for what that does to the code server).
            {"run": 0, "retries": True, "seconds": 110},
        ],
    },
}
BACKFILL_TIMEOUT = 900  # one backfill, on a shared 2-core machine
RUN_TIMEOUT = 600  # a run of the backfill reaching the state a fault waits for
OUTAGE_MAX_SECONDS = 180  # PostgreSQL comes back after this, whatever happened
ORPHAN_GRACE_SECONDS = 90  # a STARTED run whose worker is gone this long is force-terminated
DONE = {"COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED", "COMPLETED"}
WORKER_PID = re.compile(r"Started process for run \(pid: (\d+)\)")

RUNS = """
query BackfillRuns($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs { results { runId status creationTime startTime tags { key value } } }
    ... on PythonError { message }
  }
}
"""

EVENTS = """
query RunEvents($runId: ID!) {
  logsForRun(runId: $runId, limit: 5000) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message stepKey }
        ... on ErrorEvent { error { message } }
      }
    }
    ... on PythonError { message }
  }
}
"""

TERMINATE_RUNS = """
mutation Terminate($runIds: [String!]!) {
  terminateRuns(runIds: $runIds, terminatePolicy: MARK_AS_CANCELED_IMMEDIATELY) {
    __typename
    ... on TerminateRunsResult {
      terminateRunResults { __typename ... on TerminateRunSuccess { run { runId } } }
    }
    ... on PythonError { message }
  }
}
"""

BACKFILL_TARGETS = """
query Targets($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      assetBackfillData {
        assetBackfillStatuses {
          __typename
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted
            numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
    }
  }
}
"""


# -- the deployment ---------------------------------------------------------------------------
@dataclass
class Stack:
    deployment: Deployment
    postgres: PostgresServer
    days: DayRange
    rounds: int
    outages: list[dict[str, Any]]
    started: float
    builder: ThreadPoolExecutor
    deliveries: int = 0
    references: dict[int, Future] = field(default_factory=dict)

    @property
    def dagster(self) -> DagsterServices:
        return self.deployment.dagster

    @property
    def lake(self):
        return lakehouse_for(self.deployment.lakehouse)

    @property
    def last_days(self) -> tuple[date, date]:
        """First and last day, inclusive (reconcile_marts' arguments)."""
        return self.days.first_day, self.days.last_day

    @property
    def targeted(self) -> set[tuple[str, str]]:
        return {(t, k) for t in DAY_TABLE_NAMES for k in self.days.partition_keys()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, size, spark) -> Iterator[Stack]:
    cfg = SIZES[size]
    started = time.monotonic()
    root = tmp_path_factory.mktemp("service-faults")
    days = DayRange.of_days(FIRST, FIRST + timedelta(days=cfg["days"] - 1))
    landing = root / "landing"
    generate_landing(
        landing, days.first_day, days.last_day, cfg["orders_per_day"], SEED, progress=False
    )
    data_dir = make_postgres_dir()
    postgres = PostgresServer(data_dir, free_port(), postgres_bin())
    deployment = None
    builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference")
    try:
        postgres.start()
        deployment = start_deployment(
            root, "dagster-postgres.yaml", postgres.env(), code_server=True, landing=landing
        )
        yield Stack(deployment, postgres, days, cfg["rounds"], cfg["outages"], started, builder)
    finally:
        try:
            if deployment is not None:
                deployment.dagster.stop()
        finally:
            postgres.stop()
            shutil.rmtree(data_dir.parent, ignore_errors=True)
            builder.shutdown(wait=True, cancel_futures=True)


# -- GraphQL, bounded and tolerant of a storage that was just restarted ------------------------
def gql(dagster: DagsterServices, query: str, variables: dict | None = None, tries: int = 6):
    """A GraphQL call; an HTTP 5xx or refused connection is retried a few times (the first
    request after PostgreSQL restarts can meet a dead pooled connection)."""
    for attempt in range(tries):
        try:
            return dagster.graphql(query, variables)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if attempt == tries - 1:
                raise
            time.sleep(3)
    raise AssertionError("unreachable")


def backfill_runs(dagster: DagsterServices, backfill_id: str) -> list[dict[str, Any]]:
    """Every run of the backfill, retries included, oldest first, tags as a dict."""
    tags = [{"key": "dagster/backfill", "value": backfill_id}]
    result = gql(dagster, RUNS, {"filter": {"tags": tags}})["runsOrError"]
    if result["__typename"] != "Runs":
        raise GraphQLError(f"runsOrError: {result}")
    runs = [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in result["results"]]
    return sorted(runs, key=lambda r: r["creationTime"])


def run_events(dagster: DagsterServices, run_id: str) -> list[dict[str, Any]]:
    result = gql(dagster, EVENTS, {"runId": run_id})["logsForRun"]
    if result["__typename"] != "EventConnection":
        raise GraphQLError(f"logsForRun {run_id}: {result}")
    return result["events"]


def worker_pid(events: list[dict[str, Any]]) -> int | None:
    """The run worker's pid, from the engine event it writes when it starts."""
    for event in events:
        match = WORKER_PID.search(event.get("message") or "")
        if match:
            return int(match.group(1))
    return None


def failure_texts(events: list[dict[str, Any]]) -> list[str]:
    """What the run's failure and error events say (first line of each, deduplicated)."""
    texts = []
    for event in events:
        error = (event.get("error") or {}).get("message") or ""
        crash = event["__typename"] == "EngineEvent" and re.search(
            r"exited|signal|terminated", event.get("message") or ""
        )
        if (
            event["__typename"] in ("RunFailureEvent", "ExecutionStepFailureEvent")
            or error
            or crash
        ):
            text = " | ".join(x for x in (event.get("message"), error.strip()) if x)
            line = text.splitlines()[0][:300] if text else event["__typename"]
            if line not in texts:
                texts.append(line)
    return texts


def wait_for_run(
    stack: Stack, backfill_id: str, nth: int, ready: Callable[[list[str]], bool]
) -> dict[str, Any]:
    """The backfill's nth run (0-based, in launch order, retries excluded) once it is
    STARTED, its worker pid is known, and `ready(event type names)` holds."""
    dagster = stack.dagster

    def check():
        dagster._check_alive()
        runs = [
            r
            for r in backfill_runs(dagster, backfill_id)
            if "dagster/parent_run_id" not in r["tags"]
        ]
        if len(runs) <= nth or runs[nth]["status"] != "STARTED":
            if any(r["status"] in ("FAILURE", "CANCELED") for r in runs):
                raise AssertionError(f"a run failed before the fault was injected: {runs}")
            return None
        events = run_events(dagster, runs[nth]["runId"])
        pid = worker_pid(events)
        if pid is None or not ready([e["__typename"] for e in events]):
            return None
        return {**runs[nth], "pid": pid}

    return wait_for(
        f"run {nth + 1} of backfill {backfill_id} to execute",
        check,
        RUN_TIMEOUT,
        interval=0.5,
        logs=dagster.logs,
    )


def step_started(types: list[str]) -> bool:
    return "ExecutionStepStartEvent" in types


def materialized(types: list[str]) -> bool:
    return "MaterializationEvent" in types


def wait_backfill_done(stack: Stack, backfill_id: str, on_poll=None) -> dict[str, Any]:
    def finished():
        stack.dagster._check_alive()
        if on_poll:
            on_poll()
        status = stack.dagster.backfill(backfill_id)
        return status if status["status"] in DONE else None

    return wait_for(
        f"backfill {backfill_id} to finish",
        finished,
        BACKFILL_TIMEOUT,
        interval=3,
        logs=stack.dagster.logs,
    )


def launch(stack: Stack, tags: dict[str, str] | None = None) -> str:
    """An asset backfill of every asset over the trial's days, as the UI launches one."""
    if not tags:
        return stack.dagster.launch_backfill(ALL_ASSETS, stack.days.first, stack.days.last)
    params = {
        "partitionsByAssets": [
            {
                "assetKey": {"path": p},
                "partitions": {"range": {"start": stack.days.first, "end": stack.days.last}},
            }
            for p in ALL_ASSETS
        ],
        "fromFailure": False,
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
        "title": "fault trial",
    }
    result = gql(stack.dagster, LAUNCH_BACKFILL, {"backfillParams": params})[
        "launchPartitionBackfill"
    ]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise GraphQLError(f"launchPartitionBackfill failed: {result}")
    return result["backfillId"]


# -- the landing zone and the expected lakehouse -----------------------------------------------
def late_delivery(stack: Stack) -> None:
    """A new file in an ingest day already built: raw, staging and both marts change."""
    stack.deliveries += 1
    n = stack.deliveries
    day = stack.days.start + timedelta(days=1)
    folder = stack.deployment.landing / "orders" / f"ingest_date={day.isoformat()}"
    (folder / f"part-fault-{n}.jsonl").write_text(
        order_line(
            f"o-fault-{n}-1", f"{stack.days.start}T08:00:00Z", customer_id=f"c-f{n}", amount="31.00"
        )
        + "\n"
        + order_line(f"o-fault-{n}-2", f"{day}T09:30:00Z", customer_id=f"c-f{n}", amount="7.50")
        + "\n"
    )


def expected_state(stack: Stack, scratch: Path) -> Future:
    """Per-partition fingerprints of a clean build of the current landing zone (the
    platform's own runner, in this process, into a fresh lakehouse), once per delivery.

    Built on a thread while the deployment's backfill runs (the trial mostly waits for the
    daemon then), so the result is a Future; the landing zone does not change meanwhile.
    """
    if stack.deliveries not in stack.references:
        lakehouse = scratch / f"reference-{stack.deliveries}"

        def build() -> dict:
            resources = build_resources(
                str(stack.deployment.landing), str(lakehouse), spark=spark_resource_for_tests()
            )
            backfill(
                all_assets,
                stack.days.first,
                stack.days.last,
                resources,
                DagsterInstance.ephemeral(),
            )
            return partition_fingerprints(resources["lakehouse"])

        stack.references[stack.deliveries] = stack.builder.submit(build)
    return stack.references[stack.deliveries]


REFERENCE_TIMEOUT = 600


# -- what the lakehouse holds ------------------------------------------------------------------
def tables_load(lake) -> list[str]:
    """Tables whose Delta log or latest version fails to load (must be none)."""
    broken = []
    for name in TABLE_NAMES:
        try:
            assert lake.delta_table(name).history().count() >= 1
            lake.read(name).count()
        except Exception as error:  # any failure to load is the finding
            broken.append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
    return broken


def duplicate_keys(lake) -> dict[str, int]:
    """Per table, (partition, key) pairs held by more than one row."""
    result = {}
    for name in DAY_TABLE_NAMES:
        t = table(name)
        result[name] = (
            lake.read(name)
            .groupBy(t.partition_column, *t.key_columns)
            .agg(F.count(F.lit(1)).alias("n"))
            .where("n > 1")
            .count()
        )
    return result


def compare(got: dict, expected: dict, before: dict | None = None) -> dict[str, Any]:
    """Rows checked, rows lost (rows the expected state has in a partition beyond what the
    lakehouse holds there) and partitions that differ from the expected state; with
    `before`, torn partitions: those equal to neither the state before nor the expected."""
    checked = lost = 0
    differing, torn = [], []
    for name in DAY_TABLE_NAMES:
        keys = set(got.get(name, {})) | set(expected.get(name, {}))
        if before is not None:
            keys |= set(before.get(name, {}))
        for key in sorted(keys):
            mine, want = got.get(name, {}).get(key), expected.get(name, {}).get(key)
            checked += mine[0] if mine else 0
            lost += max(0, (want[0] if want else 0) - (mine[0] if mine else 0))
            if mine != want:
                differing.append((name, key, mine, want))
                if before is None or mine != before.get(name, {}).get(key):
                    torn.append((name, key, before and before.get(name, {}).get(key), mine, want))
    return {"rows_checked": checked, "rows_lost": lost, "differing": differing, "torn": torn}


def coverage(lake, run_ids: set[str]) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """(table, partition) -> the commits of these runs that wrote it: [(run id, version)]."""
    covered: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for name in DAY_TABLE_NAMES:
        for commit in lake.history(name):
            run_id = commit["metadata"].get("dagster_run_id")
            if run_id in run_ids:
                for key in commit_partition_keys(commit["metadata"]):
                    covered.setdefault((name, key), []).append((run_id, commit["version"]))
    return covered


def retry_chain(runs: list[dict[str, Any]]) -> dict[str, str]:
    """run id -> the root run it retries (itself for a first attempt)."""
    return {r["runId"]: r["tags"].get("dagster/root_run_id", r["runId"]) for r in runs}


def built_more_than_once(covered, runs) -> dict[tuple[str, str], list]:
    """Partitions written by two commits of the backfill that are not attempts of one run."""
    root = retry_chain(runs)
    return {
        key: commits
        for key, commits in covered.items()
        if len(commits) > 1 and len({root[r] for r, _ in commits}) > 1
    }


def resume_from_failure(dagster: DagsterServices, backfill_id: str, backfills: list[str]) -> str:
    """The operator's recovery: a new backfill of what failed (`reexecutePartitionBackfill`,
    FROM_FAILURE, the CLI's mutation), added to the trial's backfills so `settled` cleans it
    up. Through `gql`, which retries the 500 a first request after PostgreSQL's restart can
    meet; the CLI's client retries only 502-504."""
    result = gql(
        dagster,
        REEXECUTE,
        {"params": {"parentRunId": backfill_id, "strategy": "FROM_FAILURE"}},
    )["reexecutePartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    backfills.append(result["backfillId"])
    return result["backfillId"]


def record(figures: dict, stack: Stack, trial: dict[str, Any]) -> None:
    """Add one trial to the suite's figures (totals printed, details in the JSON)."""
    figures.setdefault("details", []).append(trial)
    figures["trials"] = figures.get("trials", 0) + 1
    figures["faults_injected"] = figures.get("faults_injected", 0) + 1
    for key in ("rows_checked", "rows_lost", "torn_partitions"):
        figures[key] = figures.get(key, 0) + trial[key]
    figures[f"{trial['trial']}_seconds"] = round(
        figures.get(f"{trial['trial']}_seconds", 0) + trial["seconds"], 1
    )
    figures["seconds"] = round(time.monotonic() - stack.started, 1)


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def settled(stack: Stack) -> Iterator[list[str]]:
    """Yields a list the trial appends its backfill ids to; afterwards (pass or fail) none of
    them is left running, so a failed trial cannot block the next one in the run queue
    (one backfill run at a time)."""
    backfill_ids: list[str] = []
    try:
        yield backfill_ids
    finally:
        for backfill_id in backfill_ids:
            with contextlib.suppress(Exception):
                if stack.dagster.backfill(backfill_id)["status"] not in DONE:
                    stack.dagster.cancel_backfill(backfill_id)
                unfinished = [
                    r["runId"]
                    for r in backfill_runs(stack.dagster, backfill_id)
                    if r["status"] not in ("SUCCESS", "FAILURE", "CANCELED")
                ]
                if unfinished:
                    gql(stack.dagster, TERMINATE_RUNS, {"runIds": unfinished})


# -- 1. the daemon -----------------------------------------------------------------------------
def test_daemon_killed_while_backfill_runs_then_started_again(stack, spark, figures, tmp_path):
    for round_no in range(stack.rounds):
        with settled(stack) as backfills:
            _daemon_kill_round(stack, figures, round_no, tmp_path, backfills)


def _daemon_kill_round(stack: Stack, figures, round_no: int, scratch: Path, backfills) -> None:
    dagster = stack.dagster
    started = time.monotonic()
    if round_no:
        late_delivery(stack)
    expected = expected_state(stack, scratch)
    before = partition_fingerprints(stack.lake)
    backfill_id = launch(stack)
    backfills.append(backfill_id)
    victim = wait_for_run(stack, backfill_id, nth=round_no, ready=step_started)
    code_server = dagster.service("dagster-code-server").process.pid
    assert victim["pid"] in descendants(code_server), "the run executes in the code server"

    killed = dagster.kill_service("dagster-daemon")
    worker_survived = victim["pid"] not in killed and alive(victim["pid"])
    status_at_kill = {r["runId"]: r["status"] for r in backfill_runs(dagster, backfill_id)}
    dagster.start_daemon()
    status = wait_backfill_done(stack, backfill_id)
    runs = backfill_runs(dagster, backfill_id)

    lake = stack.lake
    result = compare(partition_fingerprints(lake), expected.result(REFERENCE_TIMEOUT), before)
    covered = coverage(lake, {r["runId"] for r in runs})
    twice = built_more_than_once(covered, runs)
    commits_per_partition = sorted({len(c) for c in covered.values()})
    reconciliation = reconcile_marts(lake, stack.deployment.landing, *stack.last_days)
    duplicates = duplicate_keys(lake)
    trial = {
        "trial": "daemon_kill",
        "round": round_no + 1,
        "backfill": backfill_id,
        "killed_during_run": victim["runId"],
        "killed_pids": len(killed),
        "run_worker_survived": worker_survived,
        "run_statuses_at_kill": status_at_kill,
        "final_status": status["status"],
        "runs": {r["runId"]: r["status"] for r in runs},
        "retried_runs": sum("dagster/parent_run_id" in r["tags"] for r in runs),
        "commits_per_partition": commits_per_partition,
        "partitions_missing": sorted(stack.targeted - set(covered)),
        "partitions_outside_target": sorted(set(covered) - stack.targeted),
        "partitions_built_twice": {f"{k[0]}@{k[1]}": v for k, v in twice.items()},
        "duplicate_keys": sum(duplicates.values()),
        "marts_reconcile": reconciliation.ok,
        "rows_checked": result["rows_checked"],
        "rows_lost": result["rows_lost"],
        "torn_partitions": len(result["torn"]),
        "seconds": round(time.monotonic() - started, 1),
    }
    record(figures, stack, trial)

    assert worker_survived, f"the run worker died with the daemon: {trial}"
    assert status["status"] == "COMPLETED_SUCCESS", trial
    assert all(r["status"] == "SUCCESS" for r in runs), trial["runs"]
    # Built exactly once: the (table, partition) pairs the backfill's commits wrote are
    # exactly the targeted ones, and each was written by exactly one commit (no run was
    # retried, so no second attempt could legitimately write a partition again).
    assert not trial["partitions_missing"], trial
    assert not trial["partitions_outside_target"], trial
    assert trial["retried_runs"] == 0, trial
    assert commits_per_partition == [1], trial
    assert not any(duplicates.values()), duplicates
    assert reconciliation.ok, "\n".join(reconciliation.details)
    assert not result["differing"], result["differing"][:5]


# -- 2. the run worker -------------------------------------------------------------------------
def test_run_worker_killed_mid_run_is_retried(stack, spark, figures, tmp_path):
    for round_no in range(stack.rounds):
        with settled(stack) as backfills:
            _worker_kill_round(stack, figures, round_no, tmp_path, backfills)


def _worker_kill_round(stack: Stack, figures, round_no: int, scratch: Path, backfills) -> None:
    dagster = stack.dagster
    started = time.monotonic()
    late_delivery(stack)
    expected = expected_state(stack, scratch)
    before = partition_fingerprints(stack.lake)
    backfill_id = launch(stack)
    backfills.append(backfill_id)
    # In the first run, after its first commit (raw/fx_rates), so the retry starts from a
    # run that wrote part of its work; in customer_ltv's run, as soon as its step starts.
    ready = materialized if round_no == 0 else step_started
    victim = wait_for_run(stack, backfill_id, nth=round_no, ready=ready)
    pid = victim["pid"]
    code_server = dagster.service("dagster-code-server").process.pid
    assert pid in descendants(code_server), "the run worker is a child of the code server"
    assert "spawn_main" in " ".join(psutil.Process(pid).cmdline())
    children = descendants(pid)  # its Spark JVM and log tailers

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def marked_failed():
        for run in backfill_runs(dagster, backfill_id):
            if run["runId"] == victim["runId"] and run["status"] in ("FAILURE", "CANCELED"):
                return run
        return None

    marked = wait_for(
        "the killed run to be marked failed", marked_failed, 180, interval=1, logs=dagster.logs
    )
    seconds_to_failure = round(time.monotonic() - killed_at, 1)
    with contextlib.suppress(ServiceTimeout):
        wait_for(
            "the killed worker's children to exit",
            lambda: not any(alive(c) for c in children),
            60,
            interval=1,
        )
    leftovers = {c for c in children if alive(c)}
    for child in leftovers:  # never leave a JVM behind, but say so
        with contextlib.suppress(psutil.Error):
            psutil.Process(child).kill()

    status = wait_backfill_done(stack, backfill_id)
    runs = backfill_runs(dagster, backfill_id)
    retries = [r for r in runs if r["tags"].get("dagster/parent_run_id") == victim["runId"]]
    # Dagster's publication race (dagster-io/dagster#34204, 1.13): the killed run's FAILURE is
    # stored before its `dagster/will_retry` decision, and a backfill tick between the two
    # completes the backfill; the retry daemon then refuses a retry for a finished backfill.
    # Dagster did decide to retry (the tag says so), so the operator's recovery is run: re-execute
    # the backfill from failure (`backfill-platform backfill retry`), and the same assertions
    # below hold over both backfills.
    upstream_race = (
        status["status"] == "COMPLETED_FAILED"
        and not retries
        and _retry_refused_for_a_finished_backfill(dagster, victim["runId"])
    )
    resumed_id = None
    if upstream_race:
        resumed_id = resume_from_failure(dagster, backfill_id, backfills)
        status = wait_backfill_done(stack, resumed_id)
        runs += backfill_runs(dagster, resumed_id)
    lake = stack.lake
    result = compare(partition_fingerprints(lake), expected.result(REFERENCE_TIMEOUT), before)
    covered = coverage(lake, {r["runId"] for r in runs})
    twice = built_more_than_once(covered, runs)
    reconciliation = reconcile_marts(lake, stack.deployment.landing, *stack.last_days)
    trial = {
        "trial": "worker_kill",
        "round": round_no + 1,
        "backfill": backfill_id,
        "killed_run": victim["runId"],
        "killed_run_status": marked["status"],
        "seconds_to_failure": seconds_to_failure,
        "failure_text": failure_texts(run_events(dagster, victim["runId"]))[:3],
        "worker_children_left_after_60s": len(leftovers),
        "retry_runs": [
            (r["runId"], r["status"], r["tags"].get("dagster/retry_number")) for r in retries
        ],
        "final_status": status["status"],
        "dagster_34204_race_resumed_as": resumed_id,
        "runs": {r["runId"]: r["status"] for r in runs},
        "partitions_missing": sorted(stack.targeted - set(covered)),
        "partitions_written_by_killed_run_and_retry": sum(
            1 for c in covered.values() if len(c) > 1
        ),
        "partitions_built_twice_outside_a_retry": len(twice),
        "marts_reconcile": reconciliation.ok,
        "rows_checked": result["rows_checked"],
        "rows_lost": result["rows_lost"],
        "torn_partitions": len(result["torn"]),
        "seconds": round(time.monotonic() - started, 1),
    }
    record(figures, stack, trial)

    assert marked["status"] == "FAILURE", trial
    if not upstream_race:
        assert len(retries) == 1 and retries[0]["status"] == "SUCCESS", trial
    assert status["status"] == "COMPLETED_SUCCESS", trial
    assert not leftovers, f"the killed worker left processes behind: {trial}"
    assert not trial["partitions_missing"] and not twice, trial
    # The result equals a clean build of the same landing zone, partition by partition.
    assert not result["differing"], result["differing"][:5]
    assert reconciliation.ok, "\n".join(reconciliation.details)


def _retry_refused_for_a_finished_backfill(dagster: DagsterServices, run_id: str) -> bool:
    """Dagster decided to retry the run (`dagster/will_retry` true) and its retry daemon then
    refused, because the backfill had already finished: #34204's signature, nothing else."""

    def decided():
        runs = gql(dagster, RUNS, {"filter": {"runIds": [run_id]}})["runsOrError"]["results"]
        tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
        if tags.get("dagster/will_retry") != "true" or "dagster/auto_retry_run_id" in tags:
            return "no"
        refused = any(
            "Not retrying run since it is part of a backfill that is in a terminal"
            in (e.get("message") or "")
            for e in run_events(dagster, run_id)
        )
        return "yes" if refused else None

    # The retry daemon decides on its next pass over run failures (seconds).
    return wait_for("the retry daemon's decision", decided, 60, interval=1) == "yes"


# -- 3. PostgreSQL -----------------------------------------------------------------------------
def test_postgres_stopped_during_backfill_then_resumed(stack, spark, figures, tmp_path):
    for round_no, outage in enumerate(stack.outages):
        with settled(stack) as backfills:
            _postgres_round(stack, figures, round_no, outage, tmp_path, backfills)


def _pg_errors(log: Path, offset: int) -> int:
    """Failed PostgreSQL connections a service logged after byte `offset` of its log."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    return text.count("Retrying failed database connection") + text.count(
        "too many retries for DB connection"
    )


@dataclass
class OrphanWatch:
    """Force-terminates (as an operator would, GraphQL `terminateRuns` with
    MARK_AS_CANCELED_IMMEDIATELY) a run left STARTED by a worker that is gone, once it has
    been so for ORPHAN_GRACE_SECONDS: its failure could not be stored, nothing else ends it."""

    dagster: DagsterServices
    backfill_ids: list[str]
    actions: list[str] = field(default_factory=list)
    since: dict[str, float] = field(default_factory=dict)

    def __call__(self) -> None:
        for backfill_id in self.backfill_ids:
            for run in backfill_runs(self.dagster, backfill_id):
                if run["status"] != "STARTED":
                    continue
                pid = worker_pid(run_events(self.dagster, run["runId"]))
                if pid is not None and alive(pid):
                    self.since.pop(run["runId"], None)
                    continue
                first_seen = self.since.setdefault(run["runId"], time.monotonic())
                if time.monotonic() - first_seen > ORPHAN_GRACE_SECONDS:
                    gql(self.dagster, TERMINATE_RUNS, {"runIds": [run["runId"]]})
                    self.actions.append(f"force-terminated orphaned run {run['runId']}")
                    self.since.pop(run["runId"])


def _stop_postgres_until_the_run_meets_it(
    stack: Stack, code_log: Path, least_seconds: float
) -> dict[str, Any]:
    """Stop PostgreSQL; keep it down until the run's worker has logged failed connections
    (so the outage hit the run, not only idle services) and at least `outage_seconds`, at
    most OUTAGE_MAX_SECONDS; start it again."""
    offset = code_log.stat().st_size
    stack.postgres.stop()
    stopped_at = time.monotonic()
    api = None
    try:
        stack.dagster.graphql("{ version }")
        stack.dagster.graphql(RUNS, {"filter": {}})
        api = "answered"
    except (urllib.error.URLError, GraphQLError, TimeoutError) as error:
        api = f"{type(error).__name__}: {str(error)[:200]}"

    def run_met_outage() -> bool:
        long_enough = time.monotonic() - stopped_at >= least_seconds
        return long_enough and _pg_errors(code_log, offset) > 0

    met = True
    try:
        wait_for("the run to meet the outage", run_met_outage, OUTAGE_MAX_SECONDS, interval=1)
    except ServiceTimeout:
        met = False
    services = {s.name: s.alive() for s in stack.dagster.services}
    stack.postgres.start_again()
    return {
        "outage_seconds": round(time.monotonic() - stopped_at, 1),
        "run_met_outage": met,
        "graphql_during_outage": api,
        "services_alive_during_outage": services,
    }


def _postgres_round(
    stack: Stack, figures, round_no: int, plan: dict[str, Any], scratch: Path, backfills
) -> None:
    dagster = stack.dagster
    started = time.monotonic()
    lake = stack.lake
    before = partition_fingerprints(lake)
    late_delivery(stack)
    expected = expected_state(stack, scratch)
    # Without retries (run tag dagster/max_retries=0 on the backfill) a run the outage fails
    # fails the backfill, and the operator's resume is exercised; with them,
    # deploy/dagster.yaml's run retries take their course.
    tags = None if plan["retries"] else {"dagster/max_retries": "0"}
    backfill_id = launch(stack, tags)
    backfills.append(backfill_id)
    ready = materialized if plan["run"] == 0 else step_started
    victim = wait_for_run(stack, backfill_id, nth=plan["run"], ready=ready)
    code_log = dagster.service("dagster-code-server").log
    daemon_log = dagster.service("dagster-daemon").log
    offsets = {p: p.stat().st_size for p in (code_log, daemon_log)}

    outage = _stop_postgres_until_the_run_meets_it(stack, code_log, plan["seconds"])
    worker_alive_after = alive(victim["pid"])

    watch = OrphanWatch(dagster, backfills)
    if not dagster.service("dagster-daemon").alive():
        watch.actions.append("restarted the daemon (it exited in the outage)")
        dagster.services.remove(dagster.service("dagster-daemon"))
        dagster.start_daemon()
    status = wait_backfill_done(stack, backfill_id, on_poll=watch)
    runs = backfill_runs(dagster, backfill_id)
    run_report = {
        r["runId"]: {
            "status": r["status"],
            "retry_of": r["tags"].get("dagster/parent_run_id"),
            "errors": failure_texts(run_events(dagster, r["runId"]))[:3],
        }
        for r in runs
    }
    expected = expected.result(REFERENCE_TIMEOUT)
    mid = compare(partition_fingerprints(lake), expected, before)
    broken = tables_load(lake)

    resumed_id, resumed_status, resume_targets = None, None, {}
    if status["status"] != "COMPLETED_SUCCESS":
        resumed_id = resume_from_failure(dagster, backfill_id, backfills)
        watch.actions.append(f"reexecutePartitionBackfill FROM_FAILURE -> {resumed_id}")
        resumed_status = wait_backfill_done(stack, resumed_id, on_poll=watch)["status"]
        targets = gql(dagster, BACKFILL_TARGETS, {"backfillId": resumed_id})
        statuses = targets["partitionBackfillOrError"]["assetBackfillData"]
        for entry in statuses["assetBackfillStatuses"]:
            if entry["__typename"] == "AssetPartitionsStatusCounts":
                name = "/".join(entry["assetKey"]["path"])
                resume_targets[name] = entry["numPartitionsTargeted"]

    end = compare(partition_fingerprints(lake), expected, before)
    broken += tables_load(lake)
    reconciliation = reconcile_marts(lake, stack.deployment.landing, *stack.last_days)
    trial = {
        "trial": "postgres_outage",
        "round": round_no + 1,
        "backfill": backfill_id,
        "automatic_run_retries": plan["retries"],
        "run_hit": victim["runId"],
        **outage,
        "failed_db_connections_logged": {
            "code_server": _pg_errors(code_log, offsets[code_log]),
            "daemon": _pg_errors(daemon_log, offsets[daemon_log]),
        },
        "run_worker_alive_after_outage": worker_alive_after,
        "status_after_outage": status["status"],
        "runs": run_report,
        "operator_actions": watch.actions,
        "resumed_backfill": resumed_id,
        "resumed_status": resumed_status,
        "resume_targeted_partitions": resume_targets,
        "torn_after_outage": len(mid["torn"]),
        "partitions_still_old_after_outage": len(mid["differing"]) - len(mid["torn"]),
        "tables_failing_to_load": broken,
        "marts_reconcile": reconciliation.ok,
        "rows_checked": end["rows_checked"],
        "rows_lost": end["rows_lost"],
        "torn_partitions": len(mid["torn"]) + len(end["torn"]),
        "seconds": round(time.monotonic() - started, 1),
    }
    record(figures, stack, trial)

    assert outage["run_met_outage"], f"the outage never reached the run: {trial}"
    assert not broken, trial
    assert not mid["torn"], f"torn after the outage: {mid['torn'][:5]}"
    assert (resumed_status or status["status"]) == "COMPLETED_SUCCESS", trial
    assert not end["differing"], f"not the rebuilt state at the end: {end['differing'][:5]}"
    assert reconciliation.ok, "\n".join(reconciliation.details)
    if resume_targets:  # the resume retried what had failed, not the whole backfill
        assert sum(resume_targets.values()) < len(stack.targeted) + len(TABLE_NAMES), trial
