"""The CRM (contract 1.3) against the real demo server: the client alone, then the platform.

Every server here is a real process on a free port (sources/crm_process.py); nothing is
mocked. The platform tests replace the session CRM (which knows no one) by their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import pairwise
from pathlib import Path

import pytest
from dagster import AssetSelection
from pyspark.sql import functions as F

from backfill_platform.assets.crm import CRM_KIND_TAG, crm_kind
from backfill_platform.automation.live_jobs import DOWNSTREAM_KEYS, RAW_KEYS
from backfill_platform.checks import all_checks
from backfill_platform.definitions import all_assets
from backfill_platform.lineage import Lineage
from backfill_platform.operations.plan import build_plan
from backfill_platform.reference import compute_contract_answer, revenue_by_segment
from backfill_platform.resources.crm import (
    CrmAuthError,
    CrmError,
    CrmResource,
    backfill_share,
)
from backfill_platform.runner import materialize_range
from backfill_platform.sources.crm_data import generate_crm
from backfill_platform.sources.crm_process import start_crm_server
from backfill_platform.sources.crm_server import peak_per_second
from backfill_platform.sources.generate import generate_landing
from backfill_platform.tables import FCT_REVENUE_BY_SEGMENT, RAW_CRM_HISTORY, STAGING_CUSTOMERS
from backfill_platform.transforms.customers import RAW_HISTORY_SCHEMA
from backfill_platform_tests.harness import order_line

TOKEN = "crm-test-token-7f3a"


def write_crm(folder: Path, customers: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "customers.json").write_text(
        json.dumps({"customers": customers}, ensure_ascii=False), encoding="utf-8"
    )
    return folder


def client(url: str, tmp_path: Path, **config) -> CrmResource:
    config.setdefault("limiter_path", str(tmp_path / "limiter.sqlite"))
    config.setdefault("backoff_max_seconds", 0.5)
    return CrmResource(url=url, token=config.pop("token", TOKEN), **config)


def v(valid_from: str, segment: str, country: str | None) -> dict:
    return {"valid_from": valid_from, "segment": segment, "country": country}


HISTORIES = {
    "a/b c": [v("2024-01-01T00:00:00Z", "smb", "DE")],
    "客户 42": [v("2020-01-01T00:00:00+08:00", "enterprise", "CN")],
    "future": [v("2023-01-01T00:00:00Z", "consumer", "US"), v("2999-01-01T00:00:00Z", "smb", "US")],
}


# -- the client and the server ---------------------------------------------------------
def test_unicode_ids_404s_and_histories_as_served(tmp_path):
    data = write_crm(tmp_path / "crm", HISTORIES)
    with start_crm_server(data, token=TOKEN, rate=50) as crm:
        answers, stats = client(crm.url, tmp_path).fetch(["a/b c", "客户 42", "future", "nobody"])
    by_id = {a.customer_id: a for a in answers}
    assert {k: a.status for k, a in by_id.items()} == {
        "a/b c": 200,
        "客户 42": 200,
        "future": 200,
        "nobody": 404,
    }
    assert json.loads(by_id["客户 42"].body)["versions"] == HISTORIES["客户 42"]
    # Histories only grow at the end: the version of 2999 is not served yet.
    assert json.loads(by_id["future"].body)["versions"] == HISTORIES["future"][:1]
    assert stats.requests == 4 and stats.throttled_429 == 0


def test_a_server_limit_lower_than_configured_slows_the_client_which_finishes(tmp_path):
    data = write_crm(tmp_path / "crm", HISTORIES)
    log = tmp_path / "requests.jsonl"
    with start_crm_server(data, token=TOKEN, rate=3, log=log) as crm:
        ids = [f"c{n}" for n in range(12)]
        answers, stats = client(crm.url, tmp_path, rate_limit=20).fetch(ids)
        metrics = crm.metrics()
    assert sorted(a.customer_id for a in answers) == sorted(ids)
    assert all(a.status == 404 for a in answers)
    assert stats.throttled_429 > 0 and stats.throttled_429 == metrics["rejected_429"]
    assert metrics["peak_per_second"] <= 3


def test_injected_5xx_and_dropped_connections_are_retried(tmp_path):
    data = write_crm(tmp_path / "crm", HISTORIES)
    faults = ["--error-rate", "0.3", "--drop-rate", "0.2", "--fault-seed", "3"]
    with start_crm_server(data, token=TOKEN, rate=100, extra=faults) as crm:
        ids = ["a/b c", "客户 42", "nobody"] * 4
        answers, stats = client(crm.url, tmp_path, max_attempts=12).fetch(ids)
        statuses = crm.metrics()["by_status"]
    assert [a.status for a in answers] == [200, 200, 404] * 4
    assert stats.transient_retries > 0 and statuses.get("503", 0) > 0 and statuses.get("0", 0) > 0


@pytest.mark.parametrize("concurrency, received", [(1, ["a/b c"]), (4, ["a/b c", "future"])])
def test_a_customer_failing_every_attempt_is_named(tmp_path, concurrency, received):
    data = write_crm(tmp_path / "crm", HISTORIES)
    with start_crm_server(data, token=TOKEN, rate=100, extra=["--fail-id", "客户 42"]) as crm:
        crm_client = client(crm.url, tmp_path, max_attempts=3, concurrency=concurrency)
        with pytest.raises(CrmError, match=r"customer '客户 42' failed after 3 attempts") as error:
            crm_client.fetch(["a/b c", "客户 42", "future"])
        assert crm.metrics()["by_status"] == {"200": len(received), "503": 3}
    # Every answer the server gave is handed back to be kept, in the order asked: one at a
    # time, nothing after the failure was asked; four at a time, "future" was in flight.
    assert [(a.customer_id, a.status) for a in error.value.answers] == [(c, 200) for c in received]


def test_calls_in_flight_hide_the_crms_latency_within_the_limit(tmp_path):
    """Every answer takes 0.3 s: one at a time, arrivals are at least 0.3 s apart (3/s);
    four in flight, the limiter's share (15/s) sets the pace and the server never sees
    more, nor a 429, and the answers come back in the order asked."""
    ids = [f"c{n:02d}" for n in range(30)]
    data = write_crm(tmp_path / "crm", {c: [v("2024-01-01T00:00:00Z", "smb", "DE")] for c in ids})
    slow = ["--slow-rate", "1", "--slow-seconds", "0.3"]
    log = tmp_path / "requests.jsonl"
    with start_crm_server(data, token=TOKEN, rate=20, log=log, extra=slow) as crm:
        answers, stats = client(crm.url, tmp_path, rate_limit=20, concurrency=4).fetch(ids)
        arrivals = sorted(e["t"] for e in crm.requests())
    assert [a.customer_id for a in answers] == ids and {a.status for a in answers} == {200}
    assert stats.requests == 30 and stats.throttled_429 == 0 and stats.statuses == {"200": 30}
    gaps = [b - a for a, b in pairwise(arrivals)]
    assert min(gaps) < 0.3, "no two calls were in flight at once"
    assert peak_per_second(arrivals) <= 15
    with pytest.raises(CrmError, match="BACKFILL_CRM_CONCURRENCY=0"):
        client(crm.url, tmp_path, concurrency=0).fetch(ids)


def test_a_missing_or_wrong_token_fails_clearly_without_printing_it(tmp_path):
    data = write_crm(tmp_path / "crm", HISTORIES)
    with start_crm_server(data, token=TOKEN, rate=100) as crm:
        with pytest.raises(CrmAuthError, match="BACKFILL_CRM_TOKEN is not set") as missing:
            client(crm.url, tmp_path, token="").fetch(["a/b c"])
        wrong = "wrong-secret-9d1e"
        with pytest.raises(CrmAuthError, match="refused the token") as refused:
            client(crm.url, tmp_path, token=wrong).fetch(["a/b c"])
    assert wrong not in str(refused.value) and TOKEN not in str(missing.value)
    assert wrong not in repr(refused.value.__cause__) and refused.value.__cause__ is None


_CALLER = """
import sys
from backfill_platform.resources.crm import CrmResource
url, limiter, kind, count, token = sys.argv[1:]
crm = CrmResource(url=url, token=token, rate_limit=10, live_reserve=0.3, limiter_path=limiter)
crm.fetch([f"{kind}-{n}" for n in range(int(count))], kind=kind)
"""


def test_two_backfills_and_a_live_caller_share_the_limit(tmp_path):
    """Three processes at once: the server never sees more than 10 in any second, the two
    backfills together never more than their 7 (= (1 - 0.3) x 10), and no 429."""
    data = write_crm(tmp_path / "crm", {})
    log = tmp_path / "requests.jsonl"
    limiter = str(tmp_path / "limiter.sqlite")
    root = str(Path(__file__).resolve().parents[1])
    with start_crm_server(data, token=TOKEN, rate=10, log=log) as crm:
        callers = [
            subprocess.Popen(
                [sys.executable, "-c", _CALLER, crm.url, limiter, kind, count, TOKEN],
                cwd=root,
            )
            for kind, count in (("backfill", "30"), ("backfill", "30"), ("live", "25"))
        ]
        assert [c.wait(timeout=120) for c in callers] == [0, 0, 0]
        logged = crm.requests()
    assert Counter(e["status"] for e in logged) == {404: 85}
    everyone = [e["t"] for e in logged]
    backfills = [e["t"] for e in logged if e["kind"] == "backfill"]
    assert peak_per_second(everyone) <= 10
    assert peak_per_second(backfills) <= 7
    # While the live caller called, backfills took at most their share.
    live = [e["t"] for e in logged if e["kind"] == "live"]
    during = [t for t in backfills if min(live) <= t <= max(live)]
    share = len(during) / (len(during) + len(live))
    print(f"backfill share while live called: {share:.2f}; peak/s {peak_per_second(everyone)}")
    assert share <= 0.7 + 0.1


def test_live_runs_call_from_the_whole_limit_and_live_jobs_build_the_crm_tables():
    assert crm_kind({}) == "backfill"
    assert crm_kind({"dagster/backfill": "abc"}) == "backfill"
    assert crm_kind({"dagster/schedule_name": "daily"}) == "live"
    assert crm_kind({"dagster/sensor_name": "rolling_window_sensor"}) == "live"
    assert crm_kind({CRM_KIND_TAG: "live"}) == "live"
    crm_keys = {RAW_CRM_HISTORY, STAGING_CUSTOMERS, FCT_REVENUE_BY_SEGMENT}
    assert crm_keys <= set(DOWNSTREAM_KEYS) and not crm_keys & set(RAW_KEYS)
    assert backfill_share(20, 0.25) == 15 and backfill_share(10, 0.3) == 7
    assert backfill_share(1, 0.25) == 1


# -- the platform ------------------------------------------------------------------------
EDGE = {
    # A change exactly at o1's event_time (10:00Z, written +02:00 there).
    "edge": [v("2024-01-01T10:00:00Z", "smb", "DE"), v("2023-06-01T00:00:00Z", "consumer", "US")],
    # valid_from 2024-01-02T05:00+05:00 is 2024-01-02T00:00Z: o3 (01-01 22:30-03:00) is after
    # it, o4 (01-01 23:30Z) before it, though o3's local day is the 1st.
    "late/night é": [
        v("2024-01-02T05:00:00+05:00", "enterprise", "JP"),
        v("2023-01-01T00:00:00Z", "consumer", "FR"),
    ],
    "newbie": [v("2024-01-05T00:00:00Z", "smb", "GB")],
    "客户 42": [v("2020-01-01T00:00:00+08:00", "smb", "CN")],
}


def _with_crm(platform, tmp_path, crm_url: str) -> None:
    platform.resources["crm"] = client(crm_url, tmp_path, rate_limit=20)


def _by_key(rows) -> dict:
    return {
        (r["event_date"], r["segment"], r["country"]): (
            r["orders"],
            r["paid_orders"],
            r["revenue_usd"],
        )
        for r in rows
    }


@pytest.mark.slow
def test_point_in_time_segments_and_a_rerun_without_calls(platform, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKFILL_CRM_RATE_LIMIT", "20")  # the plan's share: 15/s
    day1, day2 = "2024-01-01", "2024-01-02"
    lines = [
        order_line("o1", "2024-01-01T12:00:00+02:00", customer_id="edge", amount="10.00"),
        order_line("o2", "2024-01-01T09:59:59.999999Z", customer_id="edge", amount="20.00"),
        order_line("o3", "2024-01-01T22:30:00-03:00", customer_id="late/night é", amount="70"),
        order_line("o4", "2024-01-01T23:30:00Z", customer_id="late/night é", amount="30.00"),
        order_line("o5", "2024-01-01T08:00:00Z", customer_id="ghost", amount="40.00"),
        order_line("o8", "2024-01-01T08:30:00Z", customer_id="newbie", amount="50.00"),
        order_line("o6", "2024-01-01T09:00:00Z", customer_id=None, amount="60.00"),
        '{"order_id": "o7", "event_time": "2024-01-02T03:00:00Z", "updated_at": '
        '"2024-01-02T03:00:00Z", "status": "paid", "currency": "USD", "amount": "5.00"}',
        order_line("o9", "2024-01-02T04:00:00Z", customer_id="客户 42", amount="6.00"),
        order_line("o10", "2024-01-02T05:00:00Z", customer_id="edge", status="cancelled"),
    ]
    platform.write_orders(day1, lines)
    platform.write_rates(day1, {"EUR": "1.1"})
    data = write_crm(tmp_path / "crm", EDGE)
    log = tmp_path / "requests.jsonl"
    lake, lineage = platform.resources["lakehouse"], Lineage(all_assets)

    def plan():
        return build_plan(
            lake,
            platform.resources["landing"],
            None,
            [RAW_CRM_HISTORY],
            day1,
            day2,
            lineage=lineage,
        )

    with start_crm_server(data, token=TOKEN, rate=20, log=log) as crm:
        _with_crm(platform, tmp_path, crm.url)
        platform.materialize(day1, day2, selection=["raw/orders", "raw/fx_rates"])
        before = plan()  # counted from raw: nothing kept yet
        assert before.crm_calls == 5 and before.crm_min_seconds == 5 / 15
        assert "CRM: 5 calls" in before.markdown()
        assert all(r.success for r in platform.backfill(day1, day2, per_run=2))
        first = platform.snapshot()
        assert plan().crm_calls == 0
        calls = len(crm.requests())
        assert all(r.success for r in platform.backfill(day1, day2, per_run=1))
        again = platform.snapshot()
        assert len(crm.requests()) == calls  # a re-run calls the CRM zero times
    assert calls == 5  # one per customer: edge, late/night é, ghost, newbie, 客户 42
    d1, d2 = date(2024, 1, 1), date(2024, 1, 2)
    assert _by_key(first["marts/fct_revenue_by_segment"]) == {
        (d1, "smb", "DE"): (1, 1, Decimal("10")),
        (d1, "consumer", "US"): (1, 1, Decimal("20")),
        (d1, "consumer", "FR"): (1, 1, Decimal("30")),
        (d1, "unknown", None): (2, 2, Decimal("90")),
        (d1, "guest", None): (1, 1, Decimal("60")),
        (d2, "enterprise", "JP"): (1, 1, Decimal("70")),
        (d2, "guest", None): (1, 1, Decimal("5")),
        (d2, "smb", "CN"): (1, 1, Decimal("6")),
        (d2, "smb", "DE"): (1, 0, Decimal("0")),
    }
    assert again == first  # raw history kept, nothing replaced, same rows
    kept = first["raw/crm_customer_history"]
    assert Counter(r["http_status"] for r in kept) == {200: 4, 404: 1}
    versions = first["staging/customers"]
    assert [
        (r["valid_from"].isoformat(), r["valid_to"])
        for r in versions
        if r["customer_id"] == "newbie"
    ] == [("2024-01-05T00:00:00", None)]


@pytest.mark.slow
def test_customers_are_rebuilt_only_when_raw_kept_new_answers(platform, tmp_path):
    """A run whose raw history kept no new answer commits no row to staging/customers, only
    the days it covered, and nothing when the log already records them; a new answer, a
    RESTORE or another writer's commit rebuilds it."""
    day1, day2 = "2024-01-01", "2024-01-02"
    for day in (day1, day2):
        platform.write_orders(
            day, [order_line(f"o-{day}", f"{day}T12:00:00Z", customer_id="edge", amount="10")]
        )
        platform.write_rates(day, {"EUR": "1.1"})
    lake = platform.resources["lakehouse"]
    path = ["raw/orders", "raw/fx_rates", "staging/orders", "raw/crm_customer_history"]
    counted: list[tuple[int, int]] = []  # each run's (versions, customers)

    def run(day: str) -> tuple[bool, bool, object]:
        result = platform.materialize(day, selection=[*path, "staging/customers"])
        [event] = [
            e for e in result.get_asset_materialization_events() if e.asset_key == STAGING_CUSTOMERS
        ]
        meta = event.step_materialization_data.materialization.metadata
        counted.append((meta["versions"].value, meta["customers"].value))
        return meta["rebuilt"].value, meta["committed"].value, lake.newest_commit(STAGING_CUSTOMERS)

    def edge() -> list[tuple[str, str]]:
        rows = platform.rows("staging/customers", "customer_id = 'edge'")
        return sorted((r["valid_from"].isoformat(), r["segment"]) for r in rows)

    with start_crm_server(write_crm(tmp_path / "crm", EDGE), token=TOKEN, rate=20) as crm:
        _with_crm(platform, tmp_path, crm.url)
        rebuilt, committed, first = run(day1)
        assert rebuilt and committed and not first.changes_no_row
        built = platform.rows("staging/customers")
        raw_version = lake.newest_commit(RAW_CRM_HISTORY).version

        # A re-run of the same day: neither table gets a new version.
        rebuilt, committed, again = run(day1)
        assert not rebuilt and not committed and again.version == first.version
        assert lake.newest_commit(RAW_CRM_HISTORY).version == raw_version

        # A new day whose customer was fetched before: its days recorded, no row changed.
        rebuilt, committed, second = run(day2)
        assert not rebuilt and committed and second.changes_no_row
        assert second.version == first.version + 1
        assert second.metrics["numAddedFiles"] == "0"  # nothing on storage either
        assert second.user_metadata["partition_start"] == day2
        assert lake.newest_commit(RAW_CRM_HISTORY).changes_no_row
        rebuilt, committed, third = run(day2)  # recorded by a commit of no change too
        assert not rebuilt and not committed and third.version == second.version
        assert {day1, day2} <= set(lake.built_partitions(STAGING_CUSTOMERS))
        assert platform.rows("staging/customers") == built
        assert counted == [(2, 1)] * 4  # edge's two versions, carried by the commits
        assert crm.metrics()["admitted"] == 1

        # A newer answer for `edge`, kept by another run: the next run rebuilds from it.
        body = {
            "customer_id": "edge",
            "versions": [*EDGE["edge"], v("2024-01-01T11:00:00Z", "enterprise", "US")],
        }
        fetched = datetime.now(UTC)
        answer = platform.spark.createDataFrame(
            [("edge", fetched, fetched.date(), 200, json.dumps(body), "another-run")],
            RAW_HISTORY_SCHEMA,
        ).withColumn("_loaded_at", F.current_timestamp())
        lake.append(RAW_CRM_HISTORY, answer, "fetched_date", {})
        rebuilt, committed, _ = run(day1)
        assert rebuilt and committed and ("2024-01-01T11:00:00", "enterprise") in edge()
        rebuilt, committed, _ = run(day1)
        assert not rebuilt and not committed and counted[-2:] == [(3, 1)] * 2

        # Undone by a RESTORE to the first build: its newest commit is not a build.
        lake.delta_table(STAGING_CUSTOMERS).restoreToVersion(first.version)
        assert ("2024-01-01T11:00:00", "enterprise") not in edge()
        rebuilt, _, _ = run(day1)
        assert rebuilt and ("2024-01-01T11:00:00", "enterprise") in edge()
        assert crm.metrics()["admitted"] == 1  # none of it called the CRM again


@pytest.mark.slow
def test_the_segment_mart_equals_the_contracts_answer(platform, tmp_path):
    start, end = date(2024, 1, 1), date(2024, 1, 6)
    generate_landing(platform.landing, start, end, 15, seed=23)
    summary = generate_crm(platform.landing, tmp_path / "crm", seed=23)
    histories = json.loads((tmp_path / "crm" / "customers.json").read_text())["customers"]
    log = tmp_path / "requests.jsonl"
    with start_crm_server(tmp_path / "crm", token=TOKEN, rate=20, log=log) as crm:
        _with_crm(platform, tmp_path, crm.url)
        assert all(r.success for r in platform.backfill(start.isoformat(), end.isoformat(), 3))
        metrics = crm.metrics()
        rows = platform.rows("marts/fct_revenue_by_segment")
        answer = compute_contract_answer(platform.landing, first_date=start, last_date=end)
        customers = {o.customer_id for o in answer.staging.values() if o.customer_id}
        print(f"CRM: {summary}; calls {metrics['admitted']} for {len(customers)} customers")
        assert metrics["rejected_429"] == 0 and metrics["admitted"] == len(customers)
        assert all(r.success for r in platform.backfill(start.isoformat(), end.isoformat(), 6))
        assert crm.metrics()["admitted"] == metrics["admitted"]
    assert _by_key(rows) == revenue_by_segment(answer, histories)
    assert {r["segment"] for r in rows} >= {"guest", "unknown"}


@pytest.mark.slow
def test_crm_checks_pass_then_catch_broken_versions_and_totals(platform, tmp_path):
    day1, day2 = "2024-01-01", "2024-01-02"
    platform.write_orders(
        day1,
        [
            order_line("o1", "2024-01-01T12:00:00+02:00", customer_id="edge", amount="10.00"),
            order_line("o2", "2024-01-02T09:00:00Z", customer_id="newbie", amount="20.00"),
            order_line("o3", "2024-01-02T10:00:00Z", customer_id=None, amount="30.00"),
        ],
    )
    platform.write_rates(day1, {"EUR": "1.1"})
    everything = [*all_assets, *all_checks]
    with start_crm_server(write_crm(tmp_path / "crm", EDGE), token=TOKEN, rate=20) as crm:
        _with_crm(platform, tmp_path, crm.url)
        built = materialize_range(everything, day1, day2, platform.resources, platform.instance)
    ours = {
        "staging/customers:scd2_valid",
        "marts/fct_revenue_by_segment:segments_match_daily_revenue",
    }
    evaluations = {
        f"{e.asset_key.to_user_string()}:{e.check_name}": e
        for e in built.get_asset_check_evaluations()
    }
    assert ours <= set(evaluations) and all(evaluations[c].passed for c in ours)

    lake = platform.resources["lakehouse"]
    # A second open version for `edge`, and one segment row of day 1 counting an order more.
    versions = lake.read("staging/customers")
    extra = versions.where("customer_id = 'edge' AND valid_to IS NULL").withColumn(
        "valid_from", F.to_timestamp(F.lit("2024-06-01 00:00:00"))
    )
    lake.overwrite("staging/customers", versions.unionByName(extra), {})
    start = date(2024, 1, 1)
    mart = lake.read_range("marts/fct_revenue_by_segment", "event_date", start, date(2024, 1, 2))
    lake.replace_range(
        "marts/fct_revenue_by_segment",
        mart.withColumn("orders", F.col("orders") + 1),
        "event_date",
        start,
        date(2024, 1, 2),
        {},
    )
    checks = [
        c
        for c in all_checks
        if {k.name for k in c.check_keys} & {"scd2_valid", "segments_match_daily_revenue"}
    ]
    rerun = materialize_range(
        everything,
        day1,
        day2,
        platform.resources,
        platform.instance,
        selection=AssetSelection.checks(*checks),
        raise_on_error=False,
    )
    found = {
        f"{e.asset_key.to_user_string()}:{e.check_name}": e
        for e in rerun.get_asset_check_evaluations()
    }
    per_day = {
        e.partition: e
        for e in rerun.get_asset_check_evaluations()
        if e.check_name == "segments_match_daily_revenue"
    }
    scd2 = found["staging/customers:scd2_valid"]
    assert not scd2.passed
    assert "gap or overlap: 'edge'" in scd2.description
    assert "not exactly one open version: 'edge'" in scd2.description
    # One verdict per day: day 1 (an order more over segments) fails, day 2 passes.
    assert not per_day[day1].passed and per_day[day2].passed
    assert f"FAIL {day1}: expected daily (1, 1, " in per_day[day1].description
    assert "got segments (2, 1, " in per_day[day1].description


@pytest.mark.slow
def test_a_failing_customer_fails_the_run_by_name_and_a_retry_calls_only_it(platform, tmp_path):
    day = "2024-01-01"
    platform.write_orders(
        day,
        [
            order_line("o1", "2024-01-01T10:00:00Z", customer_id="edge", amount="10.00"),
            order_line("o2", "2024-01-01T11:00:00Z", customer_id="ghost", amount="20.00"),
            order_line("o3", "2024-01-01T12:00:00Z", customer_id="newbie", amount="30.00"),
        ],
    )
    data = write_crm(tmp_path / "crm", EDGE)
    log = tmp_path / "requests.jsonl"
    failing = ["--fail-id", "newbie"]
    with start_crm_server(data, token=TOKEN, rate=50, log=log, extra=failing) as crm:
        platform.resources["crm"] = client(crm.url, tmp_path, max_attempts=2)
        failed = platform.materialize(day, raise_on_error=False)
    assert not failed.success
    errors = [e.event_specific_data.error.message for e in failed.all_events if e.is_step_failure]
    assert any("customer 'newbie' failed after 2 attempts" in m for m in errors), errors
    lake = platform.resources["lakehouse"]
    assert not lake.exists("marts/fct_revenue_by_segment")  # nothing written for the day
    kept = sorted(
        (r["customer_id"], r["http_status"]) for r in platform.rows("raw/crm_customer_history")
    )
    assert kept == [("edge", 200), ("ghost", 404)]  # answers before the failure are kept
    assert day not in lake.built_partitions("raw/crm_customer_history")

    with start_crm_server(data, token=TOKEN, rate=50, log=tmp_path / "again.jsonl") as crm:
        platform.resources["crm"] = client(crm.url, tmp_path)
        assert platform.materialize(day).success
        called = [e["customer_id"] for e in crm.requests()]
    assert called == ["newbie"]
    segments = {r["segment"] for r in platform.rows("marts/fct_revenue_by_segment")}
    assert segments == {"smb", "unknown"}  # edge: smb from 10:00Z; ghost 404; newbie later
