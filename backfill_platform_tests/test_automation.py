"""The live path against a real Dagster instance (DAGSTER_HOME with deploy/dagster.yaml):
sensors are evaluated tick by tick and the runs they request are executed in process with
the requests' tags, as the daemon would launch them."""

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import (
    AssetMaterialization,
    AssetObservation,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    build_schedule_context,
)

from backfill_platform import cli
from backfill_platform.automation.freeze import (
    OBSERVATIONS_PER_PAGE,
    FreezeRefused,
    active_freezes,
    freeze,
    frozen_days,
    unfreeze,
)
from backfill_platform.automation.landing_sensor import landing_sensor
from backfill_platform.automation.live_jobs import (
    AUDIT_MARKER,
    DOWNSTREAM_KEYS,
    repair_ltv_job,
    repair_staging_job,
)
from backfill_platform.automation.schedules import daily_live_schedule
from backfill_platform.automation.stale_sensor import (
    AUTO_REPAIR_ENV,
    latest_audit,
    stale_partitions_sensor,
)
from backfill_platform.automation.staleness import (
    LTV_STEP,
    STAGING_STEP,
    RepairStep,
    StalenessReport,
)
from backfill_platform.automation.staleness import consecutive_spans as contiguous
from backfill_platform.automation.window_sensor import rolling_window_sensor
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.ranges import DayRange
from backfill_platform.reference import compute_contract_answer, customer_ltv_rows
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG, RangeRun, RunReport
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_FX_RATES,
    RAW_ORDERS,
    STAGING_ORDERS,
)
from backfill_platform_tests.harness import Platform, order_line, spark_resource_for_tests
from backfill_platform_tests.sensor_ticks import Daemon
from backfill_platform_tests.sensor_ticks import definitions as _defs
from backfill_platform_tests.sensor_ticks import instance_at as _instance
from backfill_platform_tests.sensor_ticks import requested_range as _range

REPO = Path(__file__).resolve().parents[1]
EUR_RATE = Decimal("1.10")


def _day(i: int) -> str:
    return (date(2024, 1, 1) + timedelta(days=i - 1)).isoformat()


# -- fast: configuration and pure logic ----------------------------------------------------
def test_dagster_yaml_queues_two_runs_one_writer_per_layer_and_retries(tmp_path):
    instance = _instance(tmp_path / "home")
    config = instance.get_concurrency_config()
    assert config.run_queue_config.max_concurrent_runs == 2
    assert config.pool_config.default_pool_limit == 1
    assert config.pool_config.pool_granularity.value == "run"
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
    pools = {k.to_user_string(): a.op.pool for a in all_assets for k in a.keys}
    assert {pools["raw/orders"], pools["raw/fx_rates"]} == {"lakehouse_raw"}
    assert {
        pools[k]
        for k in (
            "staging/orders",
            "staging/orders_rejects",
            "marts/fct_daily_revenue",
            "marts/customer_ltv",
        )
    } == {"lakehouse_downstream"}


def test_repair_plan_rebuilds_exactly_the_stale_days_then_ltv_to_the_newest_snapshot():
    d = date.fromisoformat
    assert contiguous([d("2024-01-07"), d("2024-01-04"), d("2024-01-05")]) == [
        (d("2024-01-04"), d("2024-01-05")),
        (d("2024-01-07"), d("2024-01-07")),
    ]
    report = StalenessReport(
        staging={d("2024-01-04"): 1, d("2024-01-05"): 2, d("2024-01-13"): 1},
        fct=[d("2024-01-08")],
        ltv_through=d("2024-01-14"),
    )
    window = [d("2024-01-12"), d("2024-01-13"), d("2024-01-14")]
    assert report.plan(exclude=window) == [
        RepairStep(STAGING_STEP, d("2024-01-04"), d("2024-01-05")),
        RepairStep(STAGING_STEP, d("2024-01-08"), d("2024-01-08")),
        RepairStep(LTV_STEP, d("2024-01-04"), d("2024-01-14")),
    ]
    only_ltv = StalenessReport(ltv_from=d("2024-01-09"), ltv_through=d("2024-01-14"))
    assert only_ltv.plan() == [RepairStep(LTV_STEP, d("2024-01-09"), d("2024-01-14"))]
    assert report.metadata()["stale_rows"] == 4 and not StalenessReport().stale


def test_stale_command_reports_exits_1_until_repaired_and_repairs_through_the_runner(
    monkeypatch, capsys
):
    """No Spark here: detection and the runner are replaced; the command's wiring is tested."""
    d = date.fromisoformat
    report = StalenessReport(staging={d("2024-01-04"): 1}, ltv_through=d("2024-01-05"))
    monkeypatch.setattr(
        cli, "Session", lambda: SimpleNamespace(lake=None, assets=[], resources={}, instance=None)
    )
    monkeypatch.setattr(cli, "detect", lambda lake: report)
    assert cli.main(["stale"]) == 1
    out = capsys.readouterr().out
    assert "staging/orders stale on 2024-01-04 (+1 rows)" in out
    assert 'make cli ARGS="stale --repair"' in out

    steps = []

    def run_repair(plan, assets, resources, instance):
        steps.extend(plan)
        return RunReport(
            runs=[RangeRun("2024-01-04", "2024-01-04", "r1", True, ("staging/orders",))]
        )

    monkeypatch.setattr(cli, "run_repair", run_repair)
    assert cli.main(["stale", "--repair", "--in-process", "--json"]) == 0
    assert steps == report.plan()
    assert '"run_id": "r1"' in capsys.readouterr().out
    monkeypatch.setattr(cli, "detect", lambda lake: StalenessReport())
    assert cli.main(["stale"]) == 0


def test_landing_sensor_requests_each_delivery_once_and_a_changed_day_again(tmp_path):
    """No Spark here: the landing sensor only lists files and reads the instance."""
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    daemon = Daemon(resources, instance)
    platform = Platform(tmp_path, tmp_path / "landing", tmp_path / "lake", instance, resources)
    for i in (2, 3, 4, 6):
        platform.write_orders(_day(i), [order_line(f"o{i}", f"{_day(i)}T10:00:00Z")])
    platform.write_rates(_day(7), {"EUR": "1.1"})
    (tmp_path / "landing" / "orders" / "ingest_date=not-a-day").mkdir()

    # Day 7, the newest, has FX but no orders yet: its delivery may not be complete.
    requests, _, _ = daemon.tick(landing_sensor)
    assert sorted(_range(r) for r in requests) == [(_day(2), _day(4)), (_day(6), _day(6))]
    assert all(r.tags["backfill_platform/trigger"] == "landing" for r in requests)
    requests, skip, _ = daemon.tick(landing_sensor)  # same deliveries: nothing new
    assert requests == [] and skip == (
        f"waiting for the day's delivery to complete: {_day(7)}: orders not landed yet"
    )
    platform.write_orders(_day(7), [order_line("o7", f"{_day(7)}T10:00:00Z")])
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(7), _day(7))]
    assert daemon.tick(landing_sensor)[0] == []

    platform.write_orders(_day(3), [order_line("late", f"{_day(1)}T10:00:00Z")], name="b.jsonl")
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(3), _day(3))]
    assert daemon.tick(landing_sensor)[0] == []


def test_rolling_window_is_one_ranged_run_that_yields_to_running_backfills(tmp_path):
    """No Spark here: raw and LTV materializations are reported to the instance directly."""
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    daemon = Daemon(resources, instance)

    def materialized(key, *days):
        for i in days:
            instance.report_runless_asset_event(AssetMaterialization(key, partition=_day(i)))

    materialized(RAW_ORDERS, 1, 2, 3, 4, 5, 6)
    materialized(CUSTOMER_LTV, 1, 2)  # days 3.. never built: the window reaches back to 3
    requests, _, _ = daemon.tick(rolling_window_sensor)
    assert [_range(r) for r in requests] == [(_day(3), _day(6))]
    assert daemon.tick(rolling_window_sensor)[0] == []  # nothing new since

    materialized(CUSTOMER_LTV, 3, 4, 5, 6)
    materialized(RAW_ORDERS, 1)  # a backfill re-ingesting history: not the window's business
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert requests == [] and "before the window" in skip

    running = DagsterRun(
        job_name="__ASSET_JOB",
        status=DagsterRunStatus.STARTED,
        asset_selection={STAGING_ORDERS},
        tags={"dagster/partition": _day(5)},
    )
    instance.add_run(running)
    # A raw ingestion run of day 6 still going (FX recorded, orders not yet): wait for it.
    ingesting = DagsterRun(
        job_name="raw_ingest_job",
        status=DagsterRunStatus.STARTED,
        asset_selection={RAW_ORDERS, RAW_FX_RATES},
        tags={"dagster/partition": _day(6)},
    )
    instance.add_run(ingesting)
    materialized(RAW_FX_RATES, 6)
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert requests == [] and skip == (
        f"waiting for raw ingestion run(s) ['{ingesting.run_id}'] of window days"
    )
    materialized(RAW_ORDERS, 6)
    instance.delete_run(ingesting.run_id)
    requests, _, _ = daemon.tick(rolling_window_sensor)
    assert [_range(r) for r in requests] == [(_day(6), _day(6))]  # shrunk past day 5
    assert requests[0].tags["backfill_platform/trigger"] == "rolling-window"
    instance.delete_run(running.run_id)

    # A backfill of every layer already built the window after its raw: no window run.
    materialized(RAW_ORDERS, 6)
    materialized(STAGING_ORDERS, 4, 5, 6)
    materialized(CUSTOMER_LTV, 4, 5, 6)
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert requests == [] and skip == f"window {_day(4)}..{_day(6)} already built after its raw"


def test_frozen_days_are_left_alone_by_the_live_path_until_unfrozen(tmp_path):
    """A correction's freeze: the window and landing sensors skip the days under correction,
    say so in their tick, and take them up again once the freeze is lifted."""
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    daemon = Daemon(resources, instance)
    lake = resources["lakehouse"]
    for i in range(1, 7):
        instance.report_runless_asset_event(AssetMaterialization(RAW_ORDERS, partition=_day(i)))
    for i in (1, 2):
        instance.report_runless_asset_event(AssetMaterialization(CUSTOMER_LTV, partition=_day(i)))

    # The whole window (days 3..6) under correction: the tick waits, naming the freeze.
    whole = freeze(instance, lake, DOWNSTREAM_KEYS, DayRange(_day(3), _day(6)), "INC-42")
    assert {f.asset_key for f in whole} == set(DOWNSTREAM_KEYS)
    assert {f.as_of_version for f in whole} == {None}  # no table yet: nothing to pin
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert requests == [] and skip == (
        f"window {_day(3)}..{_day(6)} is frozen by {whole[0].freeze_id} (INC-42); leaving it alone"
    )
    # Lifted, and days 3..4 frozen by another correction: the window is the days after them.
    assert len(unfreeze(instance, DOWNSTREAM_KEYS, "wrong range", whole[0].freeze_id)) == len(
        DOWNSTREAM_KEYS
    )
    freeze(instance, lake, [STAGING_ORDERS], DayRange(_day(3), _day(4)), "INC-43")
    assert [(f.asset_key, f.days) for f in active_freezes(instance, DOWNSTREAM_KEYS)] == [
        (STAGING_ORDERS, DayRange(_day(3), _day(4)))
    ]
    requests, _, _ = daemon.tick(rolling_window_sensor)
    assert [_range(r) for r in requests] == [(_day(5), _day(6))]
    with pytest.raises(FreezeRefused, match="no active freeze nosuch"):
        unfreeze(instance, [STAGING_ORDERS], "typo", freeze_id="nosuch")

    # The landing sensor holds a delivery into a frozen raw day, keeping it for later.
    platform = Platform(tmp_path, tmp_path / "landing", tmp_path / "lake", instance, resources)
    for i in (2, 3):
        platform.write_rates(_day(i), {"EUR": "1.1"})
        platform.write_orders(_day(i), [order_line(f"o{i}", f"{_day(i)}T10:00:00Z")])
    raw = freeze(instance, lake, [RAW_ORDERS], DayRange(_day(3), _day(3)), "bad export")
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(2), _day(2))]
    requests, skip, _ = daemon.tick(landing_sensor)
    assert requests == [] and skip == (
        "waiting for deliveries to complete or freezes to lift: "
        f"{_day(3)}: frozen by {raw[0].freeze_id}"
    )
    unfreeze(instance, [RAW_ORDERS], "export fixed")
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(3), _day(3))]
    requests, skip, _ = daemon.tick(landing_sensor)
    assert requests == [] and skip == "no new or changed deliveries in 2 days"
    # Each freeze and lift is an observation on the asset, with what a reader needs.
    (latest, *_) = instance.fetch_observations(RAW_ORDERS, limit=2).records
    meta = latest.asset_observation.metadata
    assert (meta["freeze_id"].value, meta["frozen"].value) == (raw[0].freeze_id, False)
    assert active_freezes(instance, [RAW_ORDERS]) == []


def test_a_freeze_outlives_a_thousand_later_observations_of_its_asset(tmp_path):
    """Staleness audits observe staging every 30 minutes: a freeze of weeks ago is still
    found behind more than one page of them."""
    instance = _instance(tmp_path / "home")
    lake = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))["lakehouse"]
    (made,) = freeze(instance, lake, [STAGING_ORDERS], DayRange(_day(3), _day(4)), "INC-45")
    for i in range(OBSERVATIONS_PER_PAGE + 1):
        instance.report_runless_asset_event(AssetObservation(STAGING_ORDERS, metadata={"i": i}))
    assert [f.freeze_id for f in active_freezes(instance, [STAGING_ORDERS])] == [made.freeze_id]
    assert sorted(frozen_days(instance, [STAGING_ORDERS])) == [_day(3), _day(4)]


def test_stale_sensor_audits_only_what_can_be_stale_and_never_behind_writers(tmp_path):
    """No Spark here: materializations are reported to the instance directly, as runs
    would record them; the sensor decides from them alone whether an audit is worth a run."""
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    daemon = Daemon(resources, instance)

    def materialized(key, days, **metadata):
        for i in days:
            instance.report_runless_asset_event(
                AssetMaterialization(key, partition=_day(i), metadata=metadata)
            )

    # A backfill of days 1..10 built every layer in order: nothing can be stale.
    materialized(RAW_ORDERS, range(1, 11), late_rows=0)
    materialized(RAW_FX_RATES, range(1, 11))
    for key in (STAGING_ORDERS, FCT_DAILY_REVENUE, CUSTOMER_LTV):
        materialized(key, range(1, 11))
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip.startswith("nothing can be stale: writes since the last")
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip.startswith("nothing can be stale: no write since")

    # Staging of day 2 rebuilt alone: daily revenue and LTV from day 2 are behind it.
    materialized(STAGING_ORDERS, [2])
    (request,) = daemon.tick(stale_partitions_sensor)[0]
    assert request.job_name == "staleness_audit_job"
    assert request.tags["backfill_platform/audit_reason"] == (
        f"marts/fct_daily_revenue older than staging on 1 day(s) from {_day(2)}"
    )
    materialized(FCT_DAILY_REVENUE, [2])
    materialized(CUSTOMER_LTV, range(2, 11))  # the repair: nothing behind any more
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip.startswith("nothing can be stale")

    # Day 11 arrives with late rows while its raw run is still going: no audit behind it.
    writer = DagsterRun(
        job_name="raw_ingest_job",
        status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": _day(11)},
    )
    instance.add_run(writer)
    materialized(RAW_ORDERS, [11], late_rows=2)
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip == (
        f"audit deferred: ['{writer.run_id}'] still writing tables (it would be moot)"
    )
    instance.delete_run(writer.run_id)
    # The live window (days 9..11) is the window run's; days 1..8 were built before.
    (request,) = daemon.tick(stale_partitions_sensor)[0]
    assert request.tags["backfill_platform/audit_reason"] == (
        f"raw/orders {_day(11)} has late rows for staging days built before it: "
        f"{_day(1)}..{_day(8)}"
    )


def test_stale_repair_leaves_frozen_days_and_the_ltv_snapshots_over_them_alone(
    tmp_path, monkeypatch
):
    """A frozen day is the correction's to rebuild. The repair takes the stale days
    outside the freeze; LTV's repair, which would rewrite every later snapshot, waits for the
    freeze to lift. No Spark: the audits are observations as the audit job records them."""
    monkeypatch.setenv(AUTO_REPAIR_ENV, "true")
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    daemon = Daemon(resources, instance)
    for key in (RAW_ORDERS, RAW_FX_RATES, STAGING_ORDERS, FCT_DAILY_REVENUE, CUSTOMER_LTV):
        for i in range(1, 11):
            instance.report_runless_asset_event(AssetMaterialization(key, partition=_day(i)))
    (made, *_) = freeze(
        instance, resources["lakehouse"], DOWNSTREAM_KEYS, DayRange(_day(4), _day(6)), "INC-46"
    )

    def audited(report: StalenessReport) -> None:
        instance.report_runless_asset_event(
            AssetObservation(
                STAGING_ORDERS,
                metadata={AUDIT_MARKER: True, **report.metadata(), "summary": report.summary()},
            )
        )

    d = date.fromisoformat
    # Late rows for days 2 and 5 (day 5 frozen): staging of day 2 alone is repaired.
    audited(StalenessReport(staging={d(_day(2)): 1, d(_day(5)): 2}, ltv_through=d(_day(10))))
    requests, _, _ = daemon.tick(stale_partitions_sensor)
    assert [(r.job_name, _range(r)) for r in requests] == [
        (repair_staging_job.name, (_day(2), _day(2)))
    ]
    # The next audit: staging clean, LTV stale from day 2 through snapshots 4..6 (frozen).
    audited(StalenessReport(ltv_from=d(_day(2)), ltv_through=d(_day(10))))
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip.endswith(
        f"customer_ltv {_day(2)}..{_day(10)} waits: it would rewrite snapshots frozen by "
        f"{made.freeze_id} (INC-46)"
    ), skip
    unfreeze(instance, DOWNSTREAM_KEYS, "correction cut over")
    requests, _, _ = daemon.tick(stale_partitions_sensor)
    assert [(r.job_name, _range(r)) for r in requests] == [
        (repair_ltv_job.name, (_day(2), _day(10)))
    ]


def test_daily_schedule_builds_yesterdays_utc_partition_at_two_unless_it_is_frozen(tmp_path):
    instance = _instance(tmp_path / "home")
    resources = build_resources(str(tmp_path / "landing"), str(tmp_path / "lake"))
    context = build_schedule_context(
        instance=instance,
        scheduled_execution_time=datetime(2024, 1, 15, 2, 0, tzinfo=UTC),
        repository_def=_defs(resources).get_repository_def(),
    )
    (request,) = daily_live_schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2024-01-14"
    assert request.tags["backfill_platform/trigger"] == "daily-schedule"
    assert daily_live_schedule.cron_schedule == "0 2 * * *"
    assert daily_live_schedule.execution_timezone == "UTC"
    assert daily_live_schedule.default_status == DefaultScheduleStatus.STOPPED

    lake = resources["lakehouse"]
    (made, *_) = freeze(instance, lake, [CUSTOMER_LTV], DayRange(_day(10), _day(20)), "INC-44")
    tick = daily_live_schedule.evaluate_tick(context)
    assert not tick.run_requests
    assert tick.skip_message == f"2024-01-14 is frozen by {made.freeze_id} (INC-44)"


# -- slow: the live path end to end --------------------------------------------------------
class Oracle:
    """The contract's answer for this test's tiny data (every order has one version)."""

    def __init__(self):
        self.orders: dict[str, tuple[str, str | None, str, str, Decimal]] = {}

    def add(self, order_id, day, customer, status, currency, amount) -> str:
        self.orders[order_id] = (day, customer, status, currency, Decimal(amount))
        return order_line(
            order_id,
            f"{day}T10:00:00Z",
            status=status,
            currency=currency,
            amount=amount,
            customer_id=customer,
        )

    def usd(self, currency, amount) -> Decimal:
        return amount * (EUR_RATE if currency == "EUR" else 1)

    def fct(self) -> dict[tuple[str, str], tuple[int, int, Decimal, Decimal]]:
        out: dict = defaultdict(lambda: [0, 0, Decimal(0), Decimal(0)])
        for day, _, status, currency, amount in self.orders.values():
            row = out[(day, currency)]
            row[0] += 1
            if status == "paid":
                row[1] += 1
                row[2] += amount
                row[3] += self.usd(currency, amount)
        return {k: tuple(v) for k, v in out.items()}

    def ltv(self, last_day: int) -> dict[tuple[str, str], tuple[int, Decimal, str]]:
        out = {}
        for i in range(1, last_day + 1):
            snapshot = _day(i)
            per: dict = {}
            for day, customer, status, currency, amount in self.orders.values():
                if status != "paid" or customer is None or day > snapshot:
                    continue
                n, usd, first = per.get(customer, (0, Decimal(0), day))
                per[customer] = (n + 1, usd + self.usd(currency, amount), min(first, day))
            out.update({(snapshot, c): v for c, v in per.items()})
        return out


def _deliver_day(platform: Platform, oracle: Oracle, i: int) -> None:
    day = _day(i)
    platform.write_rates(day, {"EUR": str(EUR_RATE)})
    platform.write_orders(
        day,
        [
            oracle.add(f"d{i}a", day, "c1", "paid", "USD", "10.00"),
            oracle.add(f"d{i}b", day, "c2", "paid", "EUR", "20.00"),
            oracle.add(f"d{i}c", day, "c3", "placed", "USD", "3.50"),
        ],
    )


def _marts(platform: Platform):
    fct = {
        (str(r["event_date"]), r["currency"]): (
            r["orders"],
            r["paid_orders"],
            r["revenue_local"],
            r["revenue_usd"],
        )
        for r in platform.rows("marts/fct_daily_revenue")
    }
    ltv = {
        (str(r["snapshot_date"]), r["customer_id"]): (
            r["lifetime_paid_orders"],
            r["lifetime_revenue_usd"],
            str(r["first_order_date"]),
        )
        for r in platform.rows("marts/customer_ltv")
    }
    return fct, ltv


@pytest.mark.slow
def test_live_path_folds_late_rows_in_the_window_and_repairs_stale_days(
    tmp_path, spark, monkeypatch
):
    """Three live days, then one late file: its row for the window's oldest day is folded
    in by the rolling window; its row for ten days back is reported stale and repaired."""
    monkeypatch.delenv(AUTO_REPAIR_ENV, raising=False)
    monkeypatch.delenv("BACKFILL_LIVE_WINDOW_DAYS", raising=False)
    instance = _instance(tmp_path / "home")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    resources = build_resources(str(landing), str(lake), spark=spark_resource_for_tests())
    platform = Platform(tmp_path, landing, lake, instance, resources)
    daemon = Daemon(resources, instance)
    oracle = Oracle()

    # History days 1..10, built by a backfill before the live path starts.
    for i in range(1, 11):
        _deliver_day(platform, oracle, i)
    assert all(r.success for r in platform.backfill(_day(1), _day(10), per_run=10))

    # Three live days arrive: one raw run, then ONE ranged window run over them.
    for i in (11, 12, 13):
        _deliver_day(platform, oracle, i)
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(11), _day(13))]  # history is not re-ingested
    daemon.launch(landing_sensor, requests[0])
    assert daemon.tick(landing_sensor)[0] == []

    requests, _, _ = daemon.tick(rolling_window_sensor)
    assert [_range(r) for r in requests] == [(_day(11), _day(13))]
    assert requests[0].run_key.startswith(f"window:{_day(11)}..{_day(13)}:")
    daemon.launch(rolling_window_sensor, requests[0])
    assert daemon.tick(rolling_window_sensor)[0] == []
    assert _marts(platform) == (oracle.fct(), oracle.ltv(13))

    # Day 14's delivery holds a late row for day 12 (in the window) and one for day 4.
    platform.write_rates(_day(14), {"EUR": str(EUR_RATE)})
    platform.write_orders(
        _day(14),
        [
            oracle.add("d14a", _day(14), "c1", "paid", "USD", "10.00"),
            oracle.add("late12", _day(12), "c1", "paid", "USD", "5.00"),
            oracle.add("late4", _day(4), "c4", "paid", "EUR", "7.00"),
        ],
    )
    requests, _, _ = daemon.tick(landing_sensor)
    assert [_range(r) for r in requests] == [(_day(14), _day(14))]
    daemon.launch(landing_sensor, requests[0])

    # A running backfill run writing days 12..14 downstream: the window waits for it.
    blocker = DagsterRun(
        job_name="__ASSET_JOB",
        status=DagsterRunStatus.STARTED,
        asset_selection={STAGING_ORDERS, CUSTOMER_LTV},
        tags={RANGE_START_TAG: _day(12), RANGE_END_TAG: _day(14), "dagster/backfill": "b1"},
    )
    instance.add_run(blocker)
    requests, skip, _ = daemon.tick(rolling_window_sensor)
    assert requests == [] and blocker.run_id in skip
    instance.delete_run(blocker.run_id)

    requests, _, _ = daemon.tick(rolling_window_sensor)
    assert [_range(r) for r in requests] == [(_day(12), _day(14))]
    daemon.launch(rolling_window_sensor, requests[0])
    fct, _ = _marts(platform)
    assert fct[(_day(12), "USD")] == oracle.fct()[(_day(12), "USD")]  # folded in
    assert fct[(_day(4), "EUR")] != oracle.fct()[(_day(4), "EUR")]  # beyond the window

    # Beyond the window: an audit run counts it; the sensor reports it with the command.
    audit_run = daemon.audit(stale_partitions_sensor)
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and f"{_day(4)} (+1 rows)" in skip and "--repair" in skip
    assert f"{_day(12)} (" not in skip  # the window folded day 12 in
    audit = latest_audit(instance)
    assert audit.run_id == audit_run
    assert audit.asset_observation.metadata["stale_days"].value == {_day(4): 1}
    assert audit.asset_observation.metadata["repair_plan"].value == [
        f"staging+fct {_day(4)}..{_day(4)}",
        f"customer_ltv {_day(4)}..{_day(14)}",
    ]

    # Auto repair on: staging/fct of exactly day 4, then LTV from day 4 to the newest.
    monkeypatch.setenv(AUTO_REPAIR_ENV, "true")
    requests, _, _ = daemon.tick(stale_partitions_sensor)
    assert [(r.job_name, _range(r)) for r in requests] == [
        ("repair_stale_staging_job", (_day(4), _day(4)))
    ]
    assert daemon.tick(stale_partitions_sensor)[0] == []  # requested once, not per tick
    daemon.launch(stale_partitions_sensor, requests[0])
    daemon.audit(stale_partitions_sensor)
    requests, _, _ = daemon.tick(stale_partitions_sensor)
    assert [(r.job_name, _range(r)) for r in requests] == [
        ("repair_customer_ltv_job", (_day(4), _day(14)))
    ]
    daemon.launch(stale_partitions_sensor, requests[0])
    daemon.audit(stale_partitions_sensor)
    requests, skip, _ = daemon.tick(stale_partitions_sensor)
    assert requests == [] and skip == "no stale partitions"
    assert latest_audit(instance).asset_observation.metadata["stale_rows"].value == 0

    marts = _marts(platform)
    assert marts == (oracle.fct(), oracle.ltv(14))
    # ... which is also what the contract's reference implementation computes.
    answer = compute_contract_answer(landing)
    assert marts[0] == {
        (d.isoformat(), c): (r.orders, r.paid_orders, r.revenue_local, r.revenue_usd)
        for (d, c), r in answer.fct_daily_revenue.items()
    }
    ltv_rows = customer_ltv_rows(answer, date(2024, 1, 1), date(2024, 1, 14))
    assert marts[1] == {
        (d.isoformat(), c): (n, usd, first.isoformat())
        for (d, c), (n, usd, first) in ltv_rows.items()
    }
