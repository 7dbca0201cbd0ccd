"""Asset checks on real Spark, Delta and Dagster: every check passes on good data, fails on a
crafted fault of its kind, and names the partitions.

One ranged run builds six good days once (module fixture); each fault test works on a copy
of that lakehouse, corrupts one table with a new Delta version through the one write path
(`LakehouseResource.replace_range`) and runs only the checks in question over the range.
"""

import contextlib
import io
import json
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import date, timedelta

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetIn,
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    InMemoryIOManager,
    SkipReason,
    TimeWindowPartitionMapping,
    asset,
    asset_check,
    build_sensor_context,
)
from pyspark.sql import functions as F

from backfill_platform.automation.sensors import rolling_window_sensor
from backfill_platform.checks import all_checks
from backfill_platform.checks.reconciliation import versions_of_run
from backfill_platform.checks.results import FAILED_PARTITIONS, PARTITIONS, at_once, run_partitions
from backfill_platform.definitions import all_assets
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.resources import LakehouseResource
from backfill_platform.resources import lakehouse as lakehouse_module
from backfill_platform.resources.delta_io_manager import OWN_DAYS_ONLY, READ_VERSIONS
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG, materialize_range
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_ORDERS,
    STAGING_ORDERS,
    STAGING_REJECTS,
    table,
)
from backfill_platform_tests.harness import Platform, order_line

DAYS = [(date(2024, 1, 1) + timedelta(days=i)).isoformat() for i in range(6)]
ASSETS_AND_CHECKS = [*all_assets, *all_checks]
CHECK_ENV = {"BACKFILL_SKEW_WORKERS": "4", "BACKFILL_CHECK_MIN_HISTORY": "3"}


def _deliver(platform: Platform) -> None:
    """Six days of 40 orders: 36 customers and guests, two currencies, a duplicate line,
    a late refund of the previous day's order, an invalid and a blank line per day."""
    for i, day in enumerate(DAYS):
        platform.write_rates(day, {"EUR": "1.10"})
        lines = [
            order_line(
                f"o{i}-{j}",
                f"{day}T{j % 24:02d}:00:00Z",
                customer_id=None if j % 10 == 0 else f"c{j}",
                currency="EUR" if j % 3 == 0 else "USD",
                status="paid" if j % 4 else "placed",
                amount=f"{10 + j}.50",
            )
            for j in range(40)
        ]
        lines += [lines[1], "not json", ""]
        if i:
            lines.append(
                order_line(
                    f"o{i - 1}-2",
                    f"{DAYS[i - 1]}T02:00:00Z",
                    f"{day}T01:00:00Z",
                    status="refunded",
                    customer_id="c2",
                    amount="12.50",
                )
            )
        platform.write_orders(day, lines)


@pytest.fixture(scope="module")
def env():
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CHECK_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory, spark, env):
    """Six good days built by ONE ranged run of every layer with every check."""
    platform = Platform.create(tmp_path_factory.mktemp("built"))
    _deliver(platform)
    result = materialize_range(
        ASSETS_AND_CHECKS, DAYS[0], DAYS[-1], platform.resources, platform.instance
    )
    return platform, result


@pytest.fixture
def copy(built, tmp_path):
    """A private copy of the built lakehouse and landing zone, with a fresh instance."""
    source, _ = built
    shutil.copytree(source.landing, tmp_path / "landing")
    shutil.copytree(source.lakehouse, tmp_path / "lakehouse")
    return Platform.create(tmp_path)


def _check_key(text: str) -> AssetCheckKey:
    asset, name = text.split(":")
    return AssetCheckKey(AssetKey.from_user_string(asset), name)


def _run_checks(platform: Platform, checks: list[str], first=DAYS[0], last=DAYS[-1]):
    """Only the given checks over first..last: the tables stay as the test left them."""
    return materialize_range(
        ASSETS_AND_CHECKS,
        first,
        last,
        platform.resources,
        platform.instance,
        selection=AssetSelection.checks(*_definitions_of(checks)),
        raise_on_error=False,
    )


def _definitions_of(checks: list[str]):
    """The check definitions holding these checks (a multi-check runs all its checks)."""
    keys = {_check_key(c) for c in checks}
    return [d for d in all_checks if keys & set(d.check_keys)]


@dataclass
class Verdicts:
    """One check's evaluations in a run: one per partition."""

    evaluations: list[AssetCheckEvaluation]

    @property
    def passed(self) -> bool:
        return all(e.passed for e in self.evaluations)

    @property
    def partitions(self) -> list[str]:
        return [e.partition for e in self.evaluations]

    @property
    def severity(self) -> AssetCheckSeverity:
        return self.evaluations[0].severity

    @property
    def description(self) -> str:
        return "\n".join(e.description for e in self.evaluations)

    def of(self, partition: str) -> AssetCheckEvaluation:
        return next(e for e in self.evaluations if e.partition == partition)


def _evaluations(result) -> dict[str, Verdicts]:
    by_check: dict[str, Verdicts] = {}
    for e in result.get_asset_check_evaluations():
        name = f"{e.asset_key.to_user_string()}:{e.check_name}"
        by_check.setdefault(name, Verdicts([])).evaluations.append(e)
    return by_check


def _failed(verdicts: Verdicts) -> list[str]:
    return [e.partition for e in verdicts.evaluations if not e.passed]


def _partition_statuses(instance: DagsterInstance, check: AssetCheckKey) -> dict[str, str]:
    """The resolved status per partition of a check, as the UI's Checks tab gets it
    (a partition whose evaluation does not target its latest materialization has none)."""
    state = instance.event_log_storage.get_asset_check_state([(check, daily_partitions)])[check]
    return {
        partition: status.value
        for status, subset in state.subsets.items()
        for partition in subset.subset_value.get_partition_keys()
    }


def _rewrite(platform: Platform, key: AssetKey, column: str, day: str, change) -> None:
    """Replace one partition by `change(rows of that partition)`: a new Delta version."""
    lake = platform.resources["lakehouse"]
    start = date.fromisoformat(day)
    rows = lake.read_range(key, column, start, start + timedelta(days=1))
    lake.replace_range(key, change(rows), column, start, start + timedelta(days=1), {})


# -- good data ------------------------------------------------------------------------------
@pytest.mark.slow
def test_ranged_run_evaluates_every_partition_and_all_checks_pass(built):
    _, result = built
    assert result.success
    evaluations = _evaluations(result)
    expected_checks = {
        f"{k.asset_key.to_user_string()}:{k.name}" for c in all_checks for k in c.check_keys
    }
    assert set(evaluations) == expected_checks and len(expected_checks) == 16  # 3 CRM
    # SCD2 validity is a property of the whole customers table: one evaluation, no day.
    whole_table = {"staging/customers:scd2_valid"}
    assert evaluations["staging/customers:scd2_valid"].partitions == [None]
    for name, verdicts in evaluations.items():
        assert verdicts.passed, (name, verdicts.description)
        if name in whole_table:
            continue
        # One evaluation per day of the ranged run, each for its own partition.
        assert verdicts.partitions == DAYS, name
        assert all(e.description.count(" pass ") == 1 for e in verdicts.evaluations), name
    # Read back from the instance: every partition of every check has its own verdict.
    platform, _ = built
    for check in (k for c in all_checks for k in c.check_keys):
        if check.to_user_string() not in whole_table:
            statuses = _partition_statuses(platform.instance, check)
            assert statuses == dict.fromkeys(DAYS, "SUCCEEDED"), check
    # That day's numbers travel on that day's evaluation.
    raw_check = evaluations["raw/orders:rows_match_landing_lines"]
    assert [raw_check.of(d).metadata["actual"].value for d in DAYS] == [42] + [43] * 5
    assert raw_check.of(DAYS[1]).metadata["late_rows"].value == 1

    # Per-partition numbers for the UI: one observation per partition, own values each.
    observed = {}
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_OBSERVATION:
            obs = event.asset_observation_data.asset_observation
            observed[(obs.asset_key, obs.partition)] = {k: v.value for k, v in obs.metadata.items()}
    raw = [observed[(RAW_ORDERS, d)] for d in DAYS]
    assert [r["rows"] for r in raw] == [42] + [43] * 5  # 40 + duplicate + invalid (+ late)
    assert [r["late_rows"] for r in raw] == [0] + [1] * 5
    assert [r["rejects"] for r in raw] == [1] * 6
    assert raw[1]["late_arrival_rate"] == round(1 / 43, 6)
    fct = [observed[(FCT_DAILY_REVENUE, d)] for d in DAYS]
    assert all(f["orders"] == 40 for f in fct) and fct[0]["revenue_usd"] > 0
    staged = [observed[(STAGING_ORDERS, d)] for d in DAYS]
    assert [s["superseded_versions"] for s in staged] == [2] * 5 + [1]

    # Each mart's commit and materialization record the staging version its write read: its
    # check proves the write against that version while the live stream may replace
    # staging's days.
    lake = platform.resources["lakehouse"]
    staging_now = lake.current_version(STAGING_ORDERS)
    for key in (FCT_DAILY_REVENUE, CUSTOMER_LTV):
        assert versions_of_run(lake, key, result.run_id, STAGING_ORDERS) == (
            lake.current_version(key),
            staging_now,
        ), key
        materialized, *_ = result.asset_materializations_for_node(key.to_python_identifier())
        read = json.loads(materialized.metadata[READ_VERSIONS].value)
        assert read[STAGING_ORDERS.to_user_string()] == staging_now, key


@pytest.mark.slow
def test_a_92_day_ranged_run_records_92_evaluations_per_check(tmp_path, spark, env):
    """A backfill chunk's size: one ranged run of 92 one-order days, every layer and every check,
    records 92 evaluations per partitioned check, resolved per day in the instance."""
    platform = Platform.create(tmp_path)
    days = DayRange("2024-01-01", "2024-04-01").partition_keys()
    assert len(days) == 92
    for i, day in enumerate(days):
        platform.write_rates(day, {"EUR": "1.10"})
        platform.write_orders(day, [order_line(f"o{i}", f"{day}T08:00:00Z", customer_id="c1")])
    result = materialize_range(
        ASSETS_AND_CHECKS, days[0], days[-1], platform.resources, platform.instance
    )
    assert result.success
    evaluations = _evaluations(result)
    assert len(evaluations) == 16  # 3 CRM
    whole_table = "staging/customers:scd2_valid"  # one evaluation over the whole table
    assert evaluations.pop(whole_table).partitions == [None]
    for name, verdicts in evaluations.items():
        assert verdicts.partitions == days, name
    for definition in all_checks:
        for spec in definition.check_specs:
            if spec.key.to_user_string() == whole_table:
                continue
            statuses = _partition_statuses(platform.instance, spec.key)
            assert sorted(statuses) == days, spec.key
            if spec.blocking:
                assert set(statuses.values()) == {"SUCCEEDED"}, spec.key


# -- reconciliation faults ------------------------------------------------------------------
@pytest.mark.slow
def test_a_dropped_raw_row_fails_reconciliation_naming_the_day(copy):
    _rewrite(copy, RAW_ORDERS, "ingest_date", DAYS[2], lambda df: df.where("line_number <> 5"))
    check = "raw/orders:rows_match_landing_lines"
    evaluation = _evaluations(_run_checks(copy, [check]))[check]
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert _failed(evaluation) == [DAYS[2]]
    assert f"{DAYS[2]}: expected 43, got 42" in evaluation.description


@pytest.mark.slow
def test_a_doubled_staging_partition_fails_accounting_and_uniqueness(copy):
    _rewrite(copy, STAGING_ORDERS, "event_date", DAYS[1], lambda df: df.unionByName(df))
    checks = ["staging/orders:accounts_for_every_raw_row", "staging/orders:order_id_unique"]
    evaluations = _evaluations(_run_checks(copy, checks))
    accounting, unique = (evaluations[c] for c in checks)
    assert _failed(accounting) == _failed(unique) == [DAYS[1]]
    assert f"{DAYS[1]}: expected 42, got 84" in accounting.description
    assert evaluations["staging/orders:required_columns_not_null"].passed


@pytest.mark.slow
def test_a_lost_reject_fails_its_check_and_the_step_still_evaluates_the_others(copy):
    """The staging checks share one step (checks/staging.py): a failure of one check, on
    the rejects table, is that check's on that day; the others are evaluated as before."""
    _rewrite(copy, STAGING_REJECTS, "ingest_date", DAYS[2], lambda df: df.limit(0))
    result = _run_checks(copy, ["staging/orders_rejects:rejects_match_raw"])
    evaluations = _evaluations(result)
    rejects = evaluations["staging/orders_rejects:rejects_match_raw"]
    assert _failed(rejects) == [DAYS[2]]
    assert f"{DAYS[2]}: expected 1, got 0" in rejects.description
    for check in ("accounts_for_every_raw_row", "order_id_unique", "customer_id_skew"):
        assert evaluations[f"staging/orders:{check}"].partitions == DAYS
    assert evaluations["staging/orders:accounts_for_every_raw_row"].passed
    assert not result.success  # a blocking check failed: its step fails naming the day
    failure = next(
        e.step_failure_data.error.message
        for e in result.all_events
        if e.event_type == DagsterEventType.STEP_FAILURE
    )
    assert f"rejects_match_raw failed for 1 of 6 partition(s): {DAYS[2]}" in failure


@pytest.mark.slow
def test_the_staging_step_runs_only_the_checks_a_run_selects(copy):
    """The daemon launches runs selecting part of the shared step (staging/orders' checks
    without the rejects'): the step runs and evaluates only those, each per day."""
    _rewrite(copy, STAGING_REJECTS, "ingest_date", DAYS[2], lambda df: df.limit(0))
    chosen = ["staging/orders:accounts_for_every_raw_row", "staging/orders:order_id_unique"]
    result = materialize_range(
        ASSETS_AND_CHECKS,
        DAYS[0],
        DAYS[-1],
        copy.resources,
        copy.instance,
        selection=AssetSelection.checks(*(_check_key(c) for c in chosen)),
        raise_on_error=False,
    )
    evaluations = _evaluations(result)
    assert result.success  # the lost reject is the rejects' check's, which did not run
    assert sorted(evaluations) == chosen
    assert all(evaluations[c].partitions == DAYS and evaluations[c].passed for c in chosen)


@pytest.mark.slow
def test_a_wrong_revenue_sum_and_a_broken_ltv_roll_forward_fail(copy):
    plus_one = (F.col("revenue_local") + F.lit(1)).cast("decimal(38,2)")
    _rewrite(
        copy,
        FCT_DAILY_REVENUE,
        "event_date",
        DAYS[3],
        lambda df: df.withColumn(
            "revenue_local",
            F.when(F.col("currency") == "EUR", plus_one).otherwise(F.col("revenue_local")),
        ),
    )
    _rewrite(
        copy,
        CUSTOMER_LTV,
        "snapshot_date",
        DAYS[2],
        lambda df: df.withColumn(
            "lifetime_revenue_usd",
            F.when(F.col("customer_id") == "c3", F.col("lifetime_revenue_usd") + 1)
            .otherwise(F.col("lifetime_revenue_usd"))
            .cast("decimal(38,10)"),
        ),
    )
    fct_check = "marts/fct_daily_revenue:matches_staging_orders"
    ltv_check = "marts/customer_ltv:rolls_forward_from_previous_day"
    evaluations = _evaluations(_run_checks(copy, [fct_check, ltv_check]))
    assert _failed(evaluations[fct_check]) == [DAYS[3]]
    assert "EUR: staging" in evaluations[fct_check].description
    assert "USD:" not in evaluations[fct_check].of(DAYS[3]).description  # only what differs
    # The corrupt snapshot fails, and so does the next one built on top of it.
    assert _failed(evaluations[ltv_check]) == [DAYS[2], DAYS[3]]
    assert "1 customer(s) differ, e.g. c3" in evaluations[ltv_check].description


@pytest.mark.slow
def test_a_doubled_or_dropped_ltv_row_fails_the_roll_forward(copy):
    """Totals that still roll forward customer by customer, but with a snapshot row doubled
    (day 3) or dropped (day 5): the per-customer join sees nothing, the sums see both."""
    one = F.col("customer_id") == "c3"
    _rewrite(copy, CUSTOMER_LTV, "snapshot_date", DAYS[2], lambda df: df.unionByName(df.where(one)))
    _rewrite(copy, CUSTOMER_LTV, "snapshot_date", DAYS[4], lambda df: df.where(~one))
    ltv_check = "marts/customer_ltv:rolls_forward_from_previous_day"
    evaluation = _evaluations(_run_checks(copy, [ltv_check]))[ltv_check]
    assert _failed(evaluation) == DAYS[2:]
    doubled = evaluation.of(DAYS[2])
    assert doubled.metadata["expected"].value.startswith(
        f"{int(doubled.metadata['actual'].value.split()[0]) - 1} customers"
    )
    assert "a snapshot row is doubled, missing or extra" in evaluation.description
    assert "1 customer(s) differ, e.g. c3" in evaluation.description  # day 5 lost c3


# -- quality and skew faults ----------------------------------------------------------------
@pytest.mark.slow
def test_null_spike_empty_day_and_hot_key_warn_naming_their_days(copy):
    _rewrite(copy, STAGING_ORDERS, "event_date", DAYS[3], _hot_key)
    _rewrite(copy, STAGING_ORDERS, "event_date", DAYS[4], lambda df: df.limit(0))
    _rewrite(
        copy,
        STAGING_ORDERS,
        "event_date",
        DAYS[5],
        lambda df: df.withColumn("customer_id", F.lit(None).cast("string")),
    )
    checks = [
        "staging/orders:null_rate_within_trailing_bounds",
        "staging/orders:row_count_within_trailing_bounds",
        "staging/orders:customer_id_skew",
    ]
    evaluations = _evaluations(_run_checks(copy, checks))
    spike, volume, skew = (evaluations[c] for c in checks)
    assert all(
        e.severity == AssetCheckSeverity.WARN and not e.passed for e in (spike, volume, skew)
    )
    assert _failed(spike) == [DAYS[5]] and "customer_id: 1.000" in spike.description
    assert _failed(volume) == [DAYS[4]] and "empty partition" in volume.description
    assert _failed(skew) == [DAYS[3], DAYS[5]]
    assert "c-hot (24/40)" in skew.description
    assert evaluations["staging/orders:order_id_unique"].passed  # blocking ones still pass


def _hot_key(df):
    """60% of the day's orders moved to one customer."""
    number = F.element_at(F.split("order_id", "-"), 2).cast("int")
    return df.withColumn(
        "customer_id", F.when(number < 24, F.lit("c-hot")).otherwise(F.col("customer_id"))
    )


# -- drift ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_drift_names_the_rewritten_day_that_changed_and_passes_the_identical_one(copy):
    lake = copy.resources["lakehouse"]
    start, end = date.fromisoformat(DAYS[1]), date.fromisoformat(DAYS[3])
    rows = lake.read_range(FCT_DAILY_REVENUE, "event_date", start, end)
    doubled = F.when(F.col("event_date") == F.lit(DAYS[2]).cast("date"), 2).otherwise(1)
    lake.replace_range(
        FCT_DAILY_REVENUE,
        rows.withColumn("revenue_usd", (F.col("revenue_usd") * doubled).cast("decimal(38,10)")),
        "event_date",
        start,
        end,
        {},
    )
    check = "marts/fct_daily_revenue:drift_vs_previous_version"
    evaluation = _evaluations(_run_checks(copy, [check], DAYS[1], DAYS[2]))[check]
    assert evaluation.severity == AssetCheckSeverity.WARN
    assert _failed(evaluation) == [DAYS[2]]
    assert "sum:revenue_usd 100.0%" in evaluation.description
    assert evaluation.of(DAYS[2]).metadata["rewritten_partitions"].value == 2

    # A run's own commit: rebuilding the two days from staging halves DAYS[2] back (both
    # versions profiled in one job), and a day the table lacked has no earlier rows (its
    # replace removed no file, so nothing is read).
    last, after = date.fromisoformat(DAYS[5]), date.fromisoformat(DAYS[5]) + timedelta(days=1)
    lake.replace_range(
        FCT_DAILY_REVENUE,
        lake.read_range(FCT_DAILY_REVENUE, "event_date", last, after).limit(0),
        "event_date",
        last,
        after,
        {},
    )
    assert lake.read_range(FCT_DAILY_REVENUE, "event_date", last, after).count() == 0
    rebuilt = {}
    for first, final in ((DAYS[1], DAYS[2]), (DAYS[5], DAYS[5])):
        run = materialize_range(
            ASSETS_AND_CHECKS,
            first,
            final,
            copy.resources,
            copy.instance,
            selection=AssetSelection.assets(FCT_DAILY_REVENUE).without_checks()
            | AssetSelection.checks(*_definitions_of([check])),
        )
        rebuilt[first] = _evaluations(run)[check]
    halved, new_day = rebuilt[DAYS[1]], rebuilt[DAYS[5]]
    assert _failed(halved) == [DAYS[2]] and "sum:revenue_usd 50.0%" in halved.description
    assert halved.of(DAYS[1]).metadata["rewritten_partitions"].value == 2
    assert new_day.passed and "no earlier rows" in new_day.description
    assert new_day.of(DAYS[5]).metadata["rewritten_partitions"].value == 0
    assert lake.read_range(FCT_DAILY_REVENUE, "event_date", last, after).count() > 0


# -- blocking -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_blocking_failure_in_a_ranged_run_fails_that_day_only_and_stops_downstream(copy):
    """A raw row that slipped through parsing without an order_id (crafted in raw on day 3)
    reaches staging; over days 2..4 the blocking NOT NULL check fails day 3 only, the step
    fails naming that day, and the marts are not touched (for any day: a ranged step cannot
    be split)."""
    _rewrite(
        copy,
        RAW_ORDERS,
        "ingest_date",
        DAYS[2],
        lambda df: df.unionByName(
            df.where("reject_reason IS NULL AND event_date = ingest_date")
            .limit(1)
            .withColumn("order_id", F.lit(None).cast("string"))
        ),
    )
    fct_version, ltv_version = (
        copy.version("marts/fct_daily_revenue"),
        copy.version("marts/customer_ltv"),
    )
    # The run builds staging and the marts with their blocking checks (the others would
    # only cost time here).
    built = [STAGING_ORDERS, STAGING_REJECTS, FCT_DAILY_REVENUE, CUSTOMER_LTV]
    blocking = [d for d in all_checks for s in d.check_specs if s.blocking and s.asset_key in built]
    result = materialize_range(
        ASSETS_AND_CHECKS,
        DAYS[1],
        DAYS[3],
        copy.resources,
        copy.instance,
        selection=AssetSelection.assets(*built).without_checks() | AssetSelection.checks(*blocking),
        raise_on_error=False,
    )
    assert not result.success
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert STAGING_ORDERS in materialized
    assert FCT_DAILY_REVENUE not in materialized and CUSTOMER_LTV not in materialized
    not_null = _evaluations(result)["staging/orders:required_columns_not_null"]
    assert not_null.partitions == DAYS[1:4]
    assert _failed(not_null) == [DAYS[2]] and "order_id: 1 NULLs" in not_null.description
    assert _evaluations(result)["staging/orders:accounts_for_every_raw_row"].passed
    failure = next(
        e.step_failure_data.error.message
        for e in result.all_events
        if e.event_type == DagsterEventType.STEP_FAILURE
    )
    assert (
        f"staging/orders:required_columns_not_null failed for 1 of 3 partition(s): {DAYS[2]}"
        in (failure)
    )
    check = _check_key("staging/orders:required_columns_not_null")
    assert _partition_statuses(copy.instance, check) == {
        DAYS[1]: "SUCCEEDED",
        DAYS[2]: "FAILED",
        DAYS[3]: "SUCCEEDED",
    }
    assert copy.version("marts/fct_daily_revenue") == fct_version
    assert copy.version("marts/customer_ltv") == ltv_version


@pytest.mark.slow
def test_a_faulty_landing_day_fails_its_check_on_that_day_only(copy):
    """A line delivered late into day 4's landing file after raw was built: the raw
    reconciliation over all six days fails day 4 alone, in its own evaluation."""
    day_file = sorted((copy.landing / "orders" / f"ingest_date={DAYS[3]}").iterdir())[0]
    with day_file.open("a") as out:
        out.write(order_line("late-1", f"{DAYS[3]}T05:00:00Z") + "\n")
    check = "raw/orders:rows_match_landing_lines"
    result = _run_checks(copy, [check])
    verdicts = _evaluations(result)[check]
    assert verdicts.partitions == DAYS and _failed(verdicts) == [DAYS[3]]
    assert verdicts.of(DAYS[3]).metadata["expected"].value == 44
    assert verdicts.of(DAYS[3]).metadata["actual"].value == 43
    statuses = _partition_statuses(copy.instance, _check_key(check))
    assert statuses == {d: "FAILED" if d == DAYS[3] else "SUCCEEDED" for d in DAYS}


# -- automation -----------------------------------------------------------------------------
def _evaluation(key: AssetCheckKey, partitions: list[str], failed: list[str]):
    return AssetCheckEvaluation(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=not failed,
        metadata={PARTITIONS: partitions, FAILED_PARTITIONS: failed},
        severity=AssetCheckSeverity.ERROR,
    )


def test_a_runs_checks_read_the_range_it_wrote_from_memory_until_the_run_ends(copy):
    """Dagster gives the IO manager and the checks two instances of the lakehouse; the range
    the run wrote is read from memory by the checks too, and released when the run ends."""

    @asset_check(asset=STAGING_ORDERS, name="reads_from_memory", partitions_def=daily_partitions)
    def reads_from_memory(
        context: AssetCheckExecutionContext, lakehouse: LakehouseResource
    ) -> AssetCheckResult:
        run = run_partitions(context)
        plan = io.StringIO()
        with contextlib.redirect_stdout(plan):
            lakehouse.read_partitions(STAGING_ORDERS, run.start, run.end).explain()
        return AssetCheckResult(passed="InMemory" in plan.getvalue())

    result = materialize_range(
        [*all_assets, reads_from_memory],
        DAYS[0],
        DAYS[-1],
        copy.resources,
        copy.instance,
        selection=AssetSelection.assets(STAGING_ORDERS),
    )
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.check_name == "reads_from_memory" and evaluation.passed
    assert lakehouse_module._KEPT_BY_RUN == {}


def test_an_input_of_its_steps_own_days_is_the_runs_write_of_them_in_memory(copy):
    """customer_ltv waits on the week of staging before its days but reads only its own days
    (`OWN_DAYS_ONLY`): the rows the run's staging step wrote and kept, not a Delta read."""
    seen: dict[str, object] = {}
    week_before = TimeWindowPartitionMapping(
        start_offset=-7, end_offset=0, allow_nonexistent_upstream_partitions=True
    )

    @asset(
        key="own_days_reader",
        partitions_def=daily_partitions,
        ins={
            "staged": AssetIn(
                STAGING_ORDERS, partition_mapping=week_before, metadata={OWN_DAYS_ONLY: True}
            )
        },
        io_manager_key="memory",
    )
    def own_days_reader(staged):
        plan = io.StringIO()
        with contextlib.redirect_stdout(plan):
            staged.explain()
        seen["in_memory"] = "InMemory" in plan.getvalue()
        column = table(STAGING_ORDERS).partition_column
        seen["days"] = sorted(r[0].isoformat() for r in staged.select(column).distinct().collect())

    result = materialize_range(
        [*all_assets, own_days_reader],
        DAYS[3],
        DAYS[5],
        {**copy.resources, "memory": InMemoryIOManager()},
        copy.instance,
        selection=AssetSelection.assets(STAGING_ORDERS, AssetKey("own_days_reader")),
    )
    assert result.success
    assert seen == {"in_memory": True, "days": DAYS[3:6]}


@pytest.mark.parametrize("together", ["true", "false"])
def test_queries_at_once_keep_their_order_and_raise_the_first_failure(monkeypatch, together):
    monkeypatch.setenv("BACKFILL_CHECK_QUERIES_AT_ONCE", together)
    # At once, no query can pass the barrier until all three are running; one after
    # another, each runs on the caller's thread.
    barrier = threading.Barrier(3, timeout=10)
    threads: list[threading.Thread] = []

    def query(value):
        def run():
            threads.append(threading.current_thread())
            if together == "true":
                barrier.wait()
            time.sleep(0.05 if value == 1 else 0)  # the first finishes last
            return value

        return run

    assert at_once(query(1), query(2), query(3)) == [1, 2, 3]
    on_caller = [t is threading.current_thread() for t in threads]
    assert on_caller == [together == "false"] * 3

    def failing():
        raise ValueError("the second query's error")

    barrier = threading.Barrier(2, timeout=10)
    with pytest.raises(ValueError, match="the second query's error"):
        at_once(query(1), failing, query(3))


def test_rolling_window_holds_partitions_whose_blocking_check_failed():
    """No Spark: materializations and check evaluations are reported to the instance."""
    instance = DagsterInstance.ephemeral()
    raw_check = _check_key("raw/orders:rows_match_landing_lines")
    ltv_check = _check_key("marts/customer_ltv:rolls_forward_from_previous_day")

    def tick():
        with build_sensor_context(instance=instance) as context:
            return rolling_window_sensor(context)

    for day in DAYS:
        instance.report_runless_asset_event(AssetMaterialization(RAW_ORDERS, partition=day))
        instance.report_runless_asset_event(AssetMaterialization(CUSTOMER_LTV, partition=day))
    # A ranged raw run failed its reconciliation on day 5; a later run passed day 6 only.
    instance.report_runless_asset_event(_evaluation(raw_check, DAYS[3:], [DAYS[4]]))
    instance.report_runless_asset_event(_evaluation(raw_check, [DAYS[5]], []))
    held = tick()
    assert isinstance(held, SkipReason)
    assert "holding" in held.skip_message and DAYS[4] in held.skip_message

    # Re-ingested: the latest evaluation of day 5 passes, so the window runs again ...
    instance.report_runless_asset_event(_evaluation(raw_check, [DAYS[4]], []))
    # ... and reaches back over the LTV snapshot whose blocking check failed.
    instance.report_runless_asset_event(_evaluation(ltv_check, [DAYS[2]], [DAYS[2]]))
    request = tick().run_requests[0]
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == (DAYS[2], DAYS[5])
