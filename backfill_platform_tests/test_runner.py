"""The range type, the graph's stages and the one chunked-run loop."""

from __future__ import annotations

import io
import re
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetSpec,
    DagsterInstance,
    MaterializeResult,
    multi_asset,
)

from backfill_platform import cli
from backfill_platform.console import RunProgress
from backfill_platform.definitions import all_assets
from backfill_platform.lineage import Lineage
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange, InvalidRange, keys_in_window, ranges_of
from backfill_platform.resources.landing import FX_RATES, ORDERS
from backfill_platform.runner import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    TRIGGER_TAG,
    InProcessExecutor,
    RangeRun,
    RunReport,
    RunSpec,
    observing,
    plan_work,
    run_work,
)
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    FCT_REVENUE_BY_SEGMENT,
    RAW_CRM_HISTORY,
    RAW_FX_RATES,
    RAW_ORDERS,
    STAGING_CUSTOMERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
)
from backfill_platform_tests.harness import order_line, point_cli_at

LINEAGE = Lineage(all_assets)


def test_day_range_converts_inclusive_keys_to_half_open_dates_across_months():
    days = DayRange("2024-01-30", "2024-02-02")
    assert (days.start, days.end) == (date(2024, 1, 30), date(2024, 2, 3))
    assert days.partition_keys() == ["2024-01-30", "2024-01-31", "2024-02-01", "2024-02-02"]
    assert DayRange.of_dates(days.start, days.end) == days
    assert keys_in_window(days.start, days.end) == days.partition_keys()
    assert [str(c) for c in days.chunks(3)] == ["2024-01-30..2024-02-01", "2024-02-02..2024-02-02"]
    assert DayRange.parse(str(days)) == days and DayRange.parse("2024-02-29").end == date(
        2024, 3, 1
    )
    assert "2024-01-31" in days and date(2024, 2, 3) not in days


def test_day_range_refuses_reversed_malformed_and_out_of_partition_ranges():
    with pytest.raises(InvalidRange, match="--start 2024-02-02 is after --end 2024-01-30"):
        DayRange("2024-02-02", "2024-01-30")
    with pytest.raises(InvalidRange, match="--end '2024-13-01'"):
        DayRange("2024-01-01", "2024-13-01")
    with pytest.raises(InvalidRange, match="before the first daily partition"):
        DayRange("2023-12-30", "2024-01-02").partition_keys()
    with pytest.raises(InvalidRange, match="outside the daily partitions"):
        DayRange("2023-12-30", "2024-01-02").check_within_partitions()


def test_ranges_of_groups_consecutive_days_from_dagster_subsets():
    keys = ["2024-01-05", "2024-01-01", "2024-01-02", "2024-01-31", "2024-02-01", "2024-01-02"]
    assert [str(r) for r in ranges_of(keys)] == [
        "2024-01-01..2024-01-02",
        "2024-01-05..2024-01-05",
        "2024-01-31..2024-02-01",
    ]
    assert ranges_of([]) == []


def test_stages_put_raw_first_because_staging_reads_later_ingest_days():
    assert LINEAGE.stages(LINEAGE.toposorted()) == [
        [RAW_FX_RATES, RAW_ORDERS],
        [
            STAGING_ORDERS,
            STAGING_REJECTS,
            CUSTOMER_LTV,
            FCT_DAILY_REVENUE,
            # the CRM's tables (docs/crm.md): its raw table reads staging/orders
            RAW_CRM_HISTORY,
            STAGING_CUSTOMERS,
            FCT_REVENUE_BY_SEGMENT,
        ],
    ]
    # The staging multi-asset subsets: one of its outputs runs alone.
    assert LINEAGE.stages([STAGING_REJECTS]) == [[STAGING_REJECTS]]


def test_plan_runs_each_stage_over_the_whole_range_then_chunks_the_next():
    keys = DayRange("2024-01-01", "2024-01-05").partition_keys()
    plan = plan_work(LINEAGE, {k: keys for k in LINEAGE.toposorted()}, per_run=2)
    assert [(len(s.keys), str(s.days)) for s in plan] == [
        (2, "2024-01-01..2024-01-02"),
        (2, "2024-01-03..2024-01-04"),
        (2, "2024-01-05..2024-01-05"),
        (7, "2024-01-01..2024-01-02"),
        (7, "2024-01-03..2024-01-04"),
        (7, "2024-01-05..2024-01-05"),
    ]


def test_plan_gives_each_asset_exactly_its_days_in_graph_order():
    stale = {"2024-01-03", "2024-01-04", "2024-01-09"}
    work = {
        STAGING_ORDERS: stale,
        STAGING_REJECTS: stale,
        FCT_DAILY_REVENUE: stale,
        CUSTOMER_LTV: set(DayRange("2024-01-03", "2024-01-12").partition_keys()),
    }
    plan = plan_work(LINEAGE, work, per_run=31)
    assert [(s.assets, str(s.days)) for s in plan] == [
        (
            ["staging/orders", "staging/orders_rejects", "marts/fct_daily_revenue"],
            "2024-01-03..2024-01-04",
        ),
        (
            ["staging/orders", "staging/orders_rejects", "marts/fct_daily_revenue"],
            "2024-01-09..2024-01-09",
        ),
        (["marts/customer_ltv"], "2024-01-03..2024-01-12"),
    ]


@multi_asset(
    specs=[AssetSpec("by_event"), AssetSpec("by_arrival")], partitions_def=daily_partitions
)
def whole_only():
    """A multi-asset Dagster cannot subset: each run writes both outputs."""
    yield MaterializeResult(asset_key="by_event")
    yield MaterializeResult(asset_key="by_arrival")


def test_a_multi_asset_that_cannot_subset_runs_whole_over_its_outputs_days():
    """Each output of a non-subsettable multi-asset asked for on other days: every run
    selects it whole, over the union, and Dagster builds and runs each (it refuses a job
    that selects one of its outputs alone)."""
    by_event, by_arrival = AssetKey("by_event"), AssetKey("by_arrival")
    lineage = Lineage([whole_only])
    assert lineage.expand([by_arrival]) == [by_arrival, by_event]
    work = {by_event: {"2024-01-02"}, by_arrival: {"2024-01-20", "2024-01-21"}}
    plan = plan_work(lineage, work, per_run=31)
    assert [(s.assets, str(s.days)) for s in plan] == [
        (["by_arrival", "by_event"], "2024-01-02..2024-01-02"),
        (["by_arrival", "by_event"], "2024-01-20..2024-01-21"),
    ]
    instance = DagsterInstance.ephemeral()
    executor = InProcessExecutor([whole_only], {}, instance)
    report = run_work(executor, lineage, work, trigger="test", per_run=31)
    assert report.success and len(report.runs) == 2
    written = instance.fetch_materializations(by_arrival, limit=10).records
    assert sorted(r.partition_key for r in written) == ["2024-01-02", "2024-01-20", "2024-01-21"]


def test_runs_sized_by_work_are_few_for_small_days_and_balanced_for_big_ones():
    span = DayRange("2024-01-01", "2024-01-10")
    keys = span.partition_keys()
    assert span.chunks_by_size({k: 10 for k in keys}, target=1000) == [span]
    # 10 days of 100 bytes, 250 a run: 4 runs, cut where the total crosses a quarter
    assert [str(c) for c in span.chunks_by_size({k: 100 for k in keys}, target=250)] == [
        "2024-01-01..2024-01-03",
        "2024-01-04..2024-01-05",
        "2024-01-06..2024-01-08",
        "2024-01-09..2024-01-10",
    ]
    # one big day takes a run of its own; days without deliveries weigh nothing
    sizes = {"2024-01-02": 10, "2024-01-05": 900, "2024-01-09": 10}
    assert [str(c) for c in span.chunks_by_size(sizes, target=500)] == [
        "2024-01-01..2024-01-05",
        "2024-01-06..2024-01-10",
    ]
    assert [str(c) for c in span.chunks_by_size({}, target=500)] == [str(span)]


def test_an_in_process_backfill_sizes_its_runs_by_the_landing_zone(platform, monkeypatch):
    """Without a fixed day count the plan reads the landing files' sizes: 40 small days are
    one run per stage (not two 31-day chunks); a small target cuts them by bytes; a set
    BACKFILL_PARTITIONS_PER_RUN (or --per-run) fixes the day count again."""
    monkeypatch.delenv("BACKFILL_PARTITIONS_PER_RUN", raising=False)
    span = DayRange("2024-01-01", "2024-02-09")
    for key in span.partition_keys():
        platform.write_orders(key, [order_line(f"o-{key}", f"{key}T10:00:00Z")] * 3)
    # What is not a delivery weighs nothing: another suffix, a nested or stray folder, a
    # broken link.
    landing = platform.resources["landing"]
    orders_dir = Path(landing.landing_dir) / "orders"
    (orders_dir / "ingest_date=2024-01-01" / "notes.txt").write_text("x" * 5000)
    (orders_dir / "ingest_date=2024-01-02" / "old").mkdir()
    (orders_dir / "ingest_date=2024-01-02" / "old" / "a.jsonl").write_text("x" * 5000)
    (orders_dir / "stray").mkdir()
    (orders_dir / "stray" / "a.jsonl").write_text("x" * 5000)
    (orders_dir / "ingest_date=2024-01-03" / "gone.jsonl").symlink_to(orders_dir / "nowhere")
    executor = InProcessExecutor(all_assets, platform.resources, platform.instance)
    sizes = executor.landing_sizes(span.partition_keys())
    assert len(sizes) == 40 and all(size > 0 for size in sizes.values())
    assert sizes == {  # the same bytes as the files each day lists
        key: sum(f.size for kind in (ORDERS, FX_RATES) for f in landing.files(kind, [key]))
        for key in span.partition_keys()
    }
    work = {RAW_ORDERS: span.partition_keys()}
    assert [str(s.days) for s in plan_work(LINEAGE, work, sizes=sizes)] == [str(span)]
    monkeypatch.setenv("BACKFILL_RUN_TARGET_MB", "1")
    big = {key: size * 10_000 for key, size in sizes.items()}  # over 1 MB a day
    assert [len(s.days) for s in plan_work(LINEAGE, work, sizes=big)] == [1] * 40
    monkeypatch.setenv("BACKFILL_PARTITIONS_PER_RUN", "31")
    assert [len(s.days) for s in plan_work(LINEAGE, work, sizes=sizes)] == [31, 9]


def test_the_progress_bar_moves_inside_a_run_as_its_partitions_materialize(
    platform, monkeypatch, capsys
):
    """Runs sized by work last minutes: the bar counts the partitions the run in progress has
    materialized (read from the instance), not only finished runs; a storage that fails a
    poll or two (busy, restarting) does not freeze it for the rest of the backfill."""
    # this test's runs last seconds, not minutes: poll often enough to see inside them
    monkeypatch.setattr(RunProgress, "TICK_SECONDS", 0.05)
    monkeypatch.setattr(RunProgress, "POLL_SECONDS", 0.05)
    calls = []

    def instance():
        calls.append(1)
        if len(calls) <= RunProgress.POLL_FAILURES - 1:
            raise OSError("the instance's storage is restarting")
        return platform.instance

    span = DayRange("2024-01-01", "2024-01-12")
    for key in span.partition_keys():
        platform.write_rates(key, {"EUR": "1.10"})
        platform.write_orders(key, [order_line(f"o-{key}", f"{key}T10:00:00Z")])
    executor = InProcessExecutor(all_assets, platform.resources, platform.instance)
    keys = [RAW_ORDERS, RAW_FX_RATES, STAGING_ORDERS, STAGING_REJECTS, FCT_DAILY_REVENUE]
    work = {key: span.partition_keys() for key in keys}
    out = io.StringIO()
    with observing(RunProgress(out, instance=instance)):
        report = run_work(executor, LINEAGE, work, trigger="backfill")
    assert report.success and len(report.runs) == 2  # raw, then staging + the mart
    shown = {int(n) for n in re.findall(r"\| (\d+)/60 partitions", out.getvalue())}
    assert {0, 24, 60} <= shown
    assert shown - {0, 24, 60}, f"the bar moved only between runs: {sorted(shown)}"
    assert len(calls) == RunProgress.POLL_FAILURES  # two failed polls, then the instance
    assert "stopped following runs" not in capsys.readouterr().err


class Recorder:
    """A run observer that keeps what it was told, in order."""

    def __init__(self):
        self.events: list[tuple] = []

    def planned(self, plan: list[RunSpec], trigger: str) -> None:
        self.events.append(("planned", trigger, [str(s.days) for s in plan]))

    def ran(self, run: RangeRun) -> None:
        self.events.append(("ran", f"{run.first_key}..{run.last_key}", run.success))

    def finished(self, report: RunReport | None) -> None:
        self.events.append(("finished", report.success if report else None))


def test_a_failed_run_stops_the_plan_and_nothing_after_it_runs(platform):
    """LTV from day 5 without a day-4 snapshot fails (it never restarts everyone at zero):
    the runner stops there, reports the runs it did not start and raises nothing. An
    installed observer (the command line's progress bars) hears the plan, the run, the end."""
    for day in range(1, 9):
        key = f"2024-01-0{day}"
        platform.write_rates(key, {"EUR": "1.10"})
        platform.write_orders(key, [order_line(f"o{day}", f"{key}T10:00:00Z")])
    platform.materialize("2024-01-01", "2024-01-08", ["raw/orders", "raw/fx_rates"])
    platform.materialize("2024-01-01", "2024-01-08", ["staging/orders", "staging/orders_rejects"])
    executor = InProcessExecutor(all_assets, platform.resources, platform.instance)
    work = {CUSTOMER_LTV: set(DayRange("2024-01-05", "2024-01-08").partition_keys())}
    recorder = Recorder()
    with observing(recorder):
        report = run_work(executor, LINEAGE, work, trigger="test", per_run=2)
    assert recorder.events == [
        ("planned", "test", ["2024-01-05..2024-01-06", "2024-01-07..2024-01-08"]),
        ("ran", "2024-01-05..2024-01-06", False),
        ("finished", False),
    ]
    assert [r.success for r in report.runs] == [False]
    assert [str(s.days) for s in report.not_run] == ["2024-01-07..2024-01-08"]
    assert not report.success
    run = platform.instance.get_run_by_id(report.runs[0].run_id)
    assert run.tags[TRIGGER_TAG] == "test"
    assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == ("2024-01-05", "2024-01-06")
    assert not platform.resources["lakehouse"].exists(CUSTOMER_LTV)


def test_later_versions_weeks_after_their_order_rebuild_each_staging_output_on_its_own_days(
    platform, monkeypatch, tmp_path
):
    """Later versions of an order placed weeks before they arrive, each delivery with a line
    that is no order: staging/orders changes on the order's event day, its rejects on the
    ingest days, and the two never overlap. The runner runs each output on exactly its own
    days (a replay's rebuild has this shape; Dagster refuses a job selecting one output of
    a multi-asset that cannot subset), the CLI's backfill of the rejects alone leaves
    staging/orders as it was, and `stale --repair` brings the order's day current."""
    lake = platform.resources["lakehouse"]
    (tmp_path / "home").mkdir()
    point_cli_at(monkeypatch, tmp_path / "home", platform.landing, platform.lakehouse)
    placed, first, second = "2024-02-20", "2024-03-16", "2024-03-17"
    placed_at = f"{placed}T10:00:00Z"
    platform.write_rates(placed, {"EUR": "1.10"})
    platform.write_orders(placed, [order_line("o1", placed_at)])
    platform.materialize(placed, selection=["raw/orders", "raw/fx_rates"])
    platform.materialize(
        placed, selection=["staging/orders", "staging/orders_rejects", "marts/fct_daily_revenue"]
    )
    placed_rejects = lake.built_partitions(STAGING_REJECTS)[placed]

    def staged() -> tuple[str, Decimal]:
        (row,) = platform.rows("staging/orders")
        return row["status"], row["amount"]

    # Weeks later: the order refunded, and a broken line, on their ingest day.
    refunded = order_line("o1", placed_at, f"{first}T09:00:00Z", status="refunded")
    platform.write_orders(first, [refunded, "{bad"])
    platform.materialize(first, selection=["raw/orders"])
    work = {
        STAGING_ORDERS: {placed},
        FCT_DAILY_REVENUE: {placed},
        STAGING_REJECTS: {first},
    }
    executor = InProcessExecutor(all_assets, platform.resources, platform.instance)
    report = run_work(executor, LINEAGE, work, trigger="test")
    assert report.success
    assert [(r.assets, f"{r.first_key}..{r.last_key}") for r in report.runs] == [
        (("staging/orders", "marts/fct_daily_revenue"), f"{placed}..{placed}"),
        (("staging/orders_rejects",), f"{first}..{first}"),
    ]
    assert staged() == ("refunded", Decimal("10.00"))
    assert set(lake.built_partitions(STAGING_ORDERS)) == {placed}  # no ingest day written
    assert lake.built_partitions(STAGING_REJECTS)[placed] == placed_rejects  # nor event day
    assert [r["reason"] for r in platform.rows("staging/orders_rejects")] == ["invalid_json"]

    # Paid again at 12.00 a day later: the CLI's backfill of the rejects alone writes them
    # and nothing of staging/orders, which the staleness audit then finds behind raw.
    paid = order_line("o1", placed_at, f"{second}T09:00:00Z", amount="12.00")
    platform.write_orders(second, [paid, "[1, 2]"])
    platform.materialize(second, selection=["raw/orders"])
    orders_version = platform.version("staging/orders")
    rejects_only = ["--select", "staging/orders_rejects", "--start", second, "--end", second]
    status, payload, text = cli.execute(["backfill", *rejects_only, "--in-process", "--json"])
    assert status == 0, text
    assert [tuple(r["assets"]) for r in payload["runs"]] == [("staging/orders_rejects",)]
    assert platform.version("staging/orders") == orders_version
    assert sorted(r["reason"] for r in platform.rows("staging/orders_rejects")) == [
        "invalid_json",
        "not_an_object",
    ]
    status, payload, text = cli.execute(["stale", "--json"])
    assert status == 1 and payload["stale_days"] == {placed: 1}, text

    status, payload, text = cli.execute(["stale", "--repair", "--in-process", "--json"])
    assert status == 0 and len(payload["repair_runs"]) == 1, text
    assert staged() == ("paid", Decimal("12.00"))
    (fct,) = platform.rows("marts/fct_daily_revenue")
    assert (fct["paid_orders"], fct["revenue_usd"]) == (1, Decimal("12.00"))
    assert cli.execute(["stale", "--json"])[0] == 0
