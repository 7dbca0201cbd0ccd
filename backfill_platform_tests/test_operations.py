"""Backfills as managed operations, played end to end on tiny generated data.

The incident: a release converted orders with the previous day's FX rate (a code bug, code
version `*-0-fxbug`) for event days 2..6; day 1 and day 7 were built by the correct code.
The correction runs as a shadow backfill of the marts, is validated, cut over atomically,
rebuilt downstream, rolled back, cut over again and decommissioned.
"""

import contextlib
import getpass
import hashlib
import io
import json
import threading
from datetime import date
from decimal import Decimal

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    materialize,
)
from pyspark.sql import functions as F

import backfill_platform.assets.marts as marts_module
from backfill_platform import cli
from backfill_platform.assets import shadow_assets
from backfill_platform.automation.freeze import active_freezes
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.lineage import Lineage
from backfill_platform.operations.cutover import CutoverRefused, cutover
from backfill_platform.operations.decommission import DecommissionRefused, decommission
from backfill_platform.operations.plan import build_plan
from backfill_platform.operations.reconciliation import reconcile_layers
from backfill_platform.operations.report import REPORT_MARKER
from backfill_platform.operations.rollback import RollbackRefused, missing_files, rollback
from backfill_platform.operations.shadow import shadow_lakehouse
from backfill_platform.operations.validate import latest_validation
from backfill_platform.ranges import DayRange
from backfill_platform.reconcile import reconcile_marts
from backfill_platform.runner import RANGE_END_TAG, RANGE_START_TAG, materialize_range
from backfill_platform.tables import (
    CUSTOMER_LTV,
    FCT_DAILY_REVENUE,
    RAW_FX_RATES,
    RAW_ORDERS,
    SHADOW_SUFFIX_TAG,
    STAGING_CUSTOMERS,
    shadow_key,
)
from backfill_platform.transforms.fx import with_usd
from backfill_platform_tests.harness import (
    Platform,
    order_line,
    point_cli_at,
    spark_resource_for_tests,
)

DAYS = [f"2024-01-0{d}" for d in range(1, 8)]
LINEAGE = Lineage(all_assets)
MARTS = "marts/fct_daily_revenue,marts/customer_ltv"
EUR_PAID = Decimal("17.50")  # per day: 10.00 + 7.50
BUG_VERSIONS = {
    FCT_DAILY_REVENUE: "fct-daily-revenue-0-fxbug",
    CUSTOMER_LTV: "customer-ltv-0-fxbug",
}


def eur_rate(day: str) -> Decimal:
    return Decimal("1.10") + Decimal("0.01") * int(day[-1])


def previous_day_fx(orders, rates):
    """The bug: every rate applied one day late (the join used the previous day's rate)."""
    return with_usd(orders, rates.withColumn("rate_date", F.date_add("rate_date", 1)))


def buggy_assets():
    """The released code: same assets, the FX step wrong, stamped with its own code version."""
    return [
        a.map_asset_specs(lambda s: s.replace_attributes(code_version=BUG_VERSIONS[s.key]))
        if set(a.keys) & set(BUG_VERSIONS)
        else a
        for a in all_assets
    ]


@pytest.fixture
def ops_env(tmp_path, spark, monkeypatch):
    """A platform whose instance is DAGSTER_HOME's, so the CLI and the test see the same runs."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    landing, lakehouse = tmp_path / "landing", tmp_path / "lakehouse"
    landing.mkdir()
    point_cli_at(monkeypatch, home, landing, lakehouse)
    resources = build_resources(str(landing), str(lakehouse), spark=spark_resource_for_tests())
    return Platform(tmp_path, landing, lakehouse, DagsterInstance.get(), resources)


def run_cli(*argv) -> tuple[int, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        in_process = ["--in-process"] if argv[0] in cli.DEPLOYED_COMMANDS else []
        status = cli.main([*argv, *in_process, "--json"])
    return status, json.loads(out.getvalue())


def deliver(platform: Platform) -> None:
    for day in DAYS:
        platform.write_rates(day, {"EUR": str(eur_rate(day)), "GBP": "1.25"})
        platform.write_orders(
            day,
            [
                order_line(f"{day}-a", f"{day}T08:00:00Z", customer_id="c1", currency="EUR"),
                order_line(f"{day}-b", f"{day}T09:00:00Z", customer_id="c2", amount="5"),
                order_line(
                    f"{day}-c", f"{day}T10:00:00Z", customer_id="c3", currency="EUR", amount="7.5"
                ),
                order_line(f"{day}-d", f"{day}T11:00:00Z", customer_id=None, status="placed"),
            ],
        )


def build_production_with_the_bug(platform: Platform, monkeypatch) -> None:
    """Day 1 by the correct code, days 2..6 by the buggy release, day 7 by the fixed code."""
    platform.materialize(DAYS[0], DAYS[0])
    with monkeypatch.context() as patch:
        patch.setattr(marts_module, "with_usd", previous_day_fx)
        materialize(
            buggy_assets(),
            resources=platform.resources,
            instance=platform.instance,
            tags={RANGE_START_TAG: DAYS[1], RANGE_END_TAG: DAYS[5]},
        )
    platform.materialize(DAYS[6], DAYS[6])


def fct_usd(platform: Platform, table: str = "marts/fct_daily_revenue") -> dict:
    lake = platform.resources["lakehouse"]
    return {
        (str(r["event_date"]), r["currency"]): r["revenue_usd"]
        for r in lake.read(table).select("event_date", "currency", "revenue_usd").collect()
    }


def full_rows(platform: Platform, table: str) -> list:
    """Every column, audit columns included: a rollback must restore the table exactly."""
    return sorted(map(str, platform.table(table).collect()))


@pytest.mark.slow
def test_wrong_fx_rule_corrected_by_shadow_backfill_cutover_and_rollback(ops_env, monkeypatch):
    platform, lake = ops_env, ops_env.resources["lakehouse"]
    deliver(platform)
    build_production_with_the_bug(platform, monkeypatch)
    landing, first, last = platform.landing, date(2024, 1, 1), date(2024, 1, 7)
    assert not reconcile_marts(lake, landing, first, last).ok
    # Validation's reconciliation (no oracle: each layer against the one it was built from)
    # sees the bug too: fct USD and LTV's roll-forward disagree with staging at the day's FX.
    layers = reconcile_layers(
        lake, platform.resources["landing"], [FCT_DAILY_REVENUE, CUSTOMER_LTV], DayRange(*DAYS[::6])
    )
    failing = [d for d in layers["details"] if "5 of 7 partition(s) FAIL" in d]  # days 2..6
    assert not layers["ok"] and len(failing) == 2 and "revenue_usd" in failing[1], layers

    # Plan: the marts over days 2..6 also rewrite LTV day 7 (its previous-day mapping); the
    # whole week was written by two code versions.
    status, plan = run_cli("plan", "--select", MARTS, "--start", DAYS[1], "--end", DAYS[5])
    assert status == 0 and plan["ok"], plan
    by_asset = {a["asset"]: a for a in plan["assets"]}
    assert by_asset["marts/fct_daily_revenue"]["partitions"] == DAYS[1:6]
    assert by_asset["marts/customer_ltv"]["partitions"] == DAYS[1:7]
    assert by_asset["marts/customer_ltv"]["downstream_partitions"] == [DAYS[6]]
    assert by_asset["marts/fct_daily_revenue"]["code_version_now"] == {
        "fct-daily-revenue-0-fxbug": 5
    }
    assert by_asset["marts/fct_daily_revenue"]["code_version_next"] == "fct-daily-revenue-1"
    assert by_asset["marts/fct_daily_revenue"]["rows"] == 5 * 2  # EUR and USD rows per day
    week = build_plan(
        lake, platform.resources["landing"], None, [FCT_DAILY_REVENUE], *DAYS[::6], lineage=LINEAGE
    )
    assert week.assets[0].mixed_code_versions and not plan["assets"][0]["mixed_code_versions"]
    assert platform.instance.get_run_by_id(plan["run_id"]).job_name == (
        "backfill_preflight_plan_job"
    )

    # Shadow: the corrected code over the range, beside production, which stays untouched.
    before = {t: full_rows(platform, t) for t in MARTS.split(",")}
    versions = {t: platform.version(t) for t in MARTS.split(",")}
    old_usd = fct_usd(platform)
    marts = [FCT_DAILY_REVENUE, CUSTOMER_LTV]
    latest_before = {k: latest_materialization(platform, k) for k in marts}

    # Freeze: days 2..6 of the marts (and what reads them) are under correction. The live
    # path leaves them alone (test_automation.py) and readers are told the version to read.
    status, frozen = run_cli(
        "freeze", "--select", MARTS, "--start", DAYS[1], "--end", DAYS[5], "--reason", "INC-42"
    )
    assert status == 0, frozen
    (freeze_id,) = {f["freeze_id"] for f in frozen}
    assert {f["asset"]: f["as_of_version"] for f in frozen if f["asset"] in versions} == versions
    assert {f.asset_key for f in active_freezes(platform.instance, marts)} == set(marts)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(["history", "--select", MARTS.split(",")[0], "--start", DAYS[1], "--end", DAYS[1]])
    assert (
        f"FROZEN marts/fct_daily_revenue {DAYS[1]}..{DAYS[5]} frozen by {freeze_id} (INC-42; "
        f"{getpass.getuser()}): read versionAsOf {versions['marts/fct_daily_revenue']} meanwhile"
    ) in printed.getvalue()
    status, shadow = run_cli(
        "shadow", "--select", MARTS, "--start", DAYS[1], "--end", DAYS[5], "--suffix", "fxfix"
    )
    assert status == 0 and shadow["success"], shadow
    assert shadow["seeded"] == {"marts/customer_ltv__shadow_fxfix": f"{DAYS[0]}..{DAYS[0]}"}
    assert {t: full_rows(platform, t) for t in MARTS.split(",")} == before
    assert {t: platform.version(t) for t in MARTS.split(",")} == versions
    # Dagster saw shadow materializations, not production ones: production's latest is the
    # same event, the twins have one per shadowed partition, from runs tagged with the suffix.
    assert {k: latest_materialization(platform, k) for k in marts} == latest_before
    assert sorted(shadow["assets"]) == [
        "shadow/marts/customer_ltv",
        "shadow/marts/fct_daily_revenue",
    ]
    twin = materializations(platform, shadow_key(FCT_DAILY_REVENUE), DAYS[1:6])
    assert sorted(r.partition_key for r in twin) == DAYS[1:6]
    assert "fct_daily_revenue__shadow_fxfix" in str(
        twin[0].asset_materialization.metadata["table_path"].value
    )
    runs = {platform.instance.get_run_by_id(r.run_id).tags.get(SHADOW_SUFFIX_TAG) for r in twin}
    assert runs == {"fxfix"}
    new_usd = fct_usd(platform, "marts/fct_daily_revenue__shadow_fxfix")

    # Validate: exactly the expected difference, and the shadow reconciles between layers.
    status, validation = run_cli(
        "validate", "--select", MARTS, "--start", DAYS[1], "--end", DAYS[5], "--suffix", "fxfix"
    )
    assert status == 0 and validation["passed"], validation
    assert validation["reconciliation"]["ok"]
    fct_check = next(t for t in validation["tables"] if t["table"] == "marts/fct_daily_revenue")
    assert fct_check["changed_partitions"] == 5
    for i, part in enumerate(fct_check["partitions"], start=1):
        prod_sum, shadow_sum = map(Decimal, part["sums"]["revenue_usd"])
        # the bug used day i-1's rate for day i: the difference is the paid EUR times the move
        assert shadow_sum - prod_sum == EUR_PAID * (eur_rate(DAYS[i]) - eur_rate(DAYS[i - 1]))
        assert part["rows"] == [2, 2]
    assert fct_check["sample_changed_rows"][0]["key"]["currency"] == "EUR"
    assert latest_validation(platform.instance, FCT_DAILY_REVENUE, "fxfix")["passed"]

    # Cutover while a reader polls production: every read is all old or all new.
    eur_days = [(d, "EUR") for d in DAYS[1:6]]
    seen: list[set[str]] = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            rows = fct_usd(platform)
            seen.append(
                {
                    "old"
                    if rows.get(k) == old_usd[k]
                    else "new"
                    if rows.get(k) == new_usd[k]
                    else "?"
                    for k in eur_days
                }
            )

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        status, done = run_cli(
            "cutover",
            "--select",
            MARTS,
            "--start",
            DAYS[1],
            "--end",
            DAYS[5],
            "--suffix",
            "fxfix",
            "--reason",
            "FX joined the previous day's rate (INC-42)",
        )
    finally:
        stop.set()
        thread.join()
    assert status == 0, done
    # Zero-copy: each table's commit adopted the shadow's files, writing no data file.
    assert [(t["mode"], t["copy_reason"], t["data_bytes_written"]) for t in done["tables"]] == [
        ("zero-copy", None, 0)
    ] * 2
    assert active_freezes(platform.instance, marts) == []  # the cutover finished it
    assert seen and all(len(s) == 1 and s <= {"old", "new"} for s in seen), seen
    # The cutover is what changes production in Dagster: a materialization of each swapped
    # partition on the production key, naming the shadow and the Delta versions.
    swapped = materializations(platform, FCT_DAILY_REVENUE, DAYS[1:6])
    assert sorted(r.partition_key for r in swapped[:5]) == DAYS[1:6]
    cut = swapped[0].asset_materialization.metadata
    assert cut["operation"].value == "cutover"
    assert cut["shadow_table"].value == "marts/fct_daily_revenue__shadow_fxfix"
    assert cut["delta_version"].value == platform.version("marts/fct_daily_revenue")
    assert cut["delta_version_before"].value == versions["marts/fct_daily_revenue"]
    assert latest_materialization(platform, FCT_DAILY_REVENUE) != latest_before[FCT_DAILY_REVENUE]
    assert fct_usd(platform) == {**old_usd, **new_usd}
    commit = lake.history("marts/fct_daily_revenue", limit=1)[0]["metadata"]
    assert commit["operation"] == "cutover" and commit["reason"].endswith("(INC-42)")
    assert (commit["partition_start"], commit["partition_end"]) == (DAYS[1], "2024-01-07")
    assert commit["shadow_version"] == shadow_version(platform, "marts/fct_daily_revenue")
    # Downstream rebuilt through the normal path: LTV day 7 now carries corrected days 2..6.
    assert [(r["assets"], r["first"], r["last"]) for r in done["rebuild_runs"]] == [
        (["marts/customer_ltv"], DAYS[6], DAYS[6])
    ]
    assert reconcile_marts(lake, landing, first, last).ok

    # The correction report, from Delta's versions and the validation record: the paid EUR
    # times each day's rate move, in total and per day, largest first; who, why, what was
    # rebuilt; the same Markdown on the production asset in the UI.
    status, report = run_cli("report", done["cutover_id"])
    assert status == 0, report
    assert report["reason"].endswith("(INC-42)") and report["operator"] == getpass.getuser()
    assert report["validation_id"] == validation["validation_id"] and report["validation"]["passed"]
    assert (report["start"], report["end"]) == (DAYS[1], DAYS[5])
    moves = {DAYS[i]: EUR_PAID * (eur_rate(DAYS[i]) - eur_rate(DAYS[i - 1])) for i in range(1, 6)}
    totals = {(t["table"], t["measure"]): t for t in report["totals"]}
    assert Decimal(totals[("marts/fct_daily_revenue", "revenue_usd")]["change"]) == sum(
        moves.values()
    )
    assert totals[("marts/fct_daily_revenue", "rows")]["change"] == "0"
    fct_days = {
        c["day"]: Decimal(c["change"])
        for c in report["changes"]
        if c["table"] == "marts/fct_daily_revenue" and c["measure"] == "revenue_usd"
    }
    assert fct_days == {d: m for d, m in moves.items() if m}
    order = [abs(c["relative"]) for c in report["changes"] if c["relative"] is not None]
    assert order == sorted(order, reverse=True)
    assert [(r["table"], r["days"]) for r in report["rebuilt"]] == [
        ("marts/customer_ltv", str(DayRange(DAYS[6], DAYS[6])))
    ]
    (observed, *_) = platform.instance.fetch_observations(
        AssetRecordsFilter(asset_key=FCT_DAILY_REVENUE), limit=1
    ).records
    shown = observed.asset_observation.metadata[REPORT_MARKER].value
    assert done["cutover_id"] in shown and "INC-42" in shown and "revenue_usd" in shown
    assert run_cli("report", "nosuchcutover")[0] == 1

    status, history = run_cli(
        "history", "--select", "marts/fct_daily_revenue", "--start", DAYS[2], "--end", DAYS[2]
    )
    assert [(h["operation"], h["code_version"]) for h in history][:2] == [
        ("cutover", "fct-daily-revenue-1"),
        ("WRITE", "fct-daily-revenue-0-fxbug"),
    ]

    # Rollback: one command, the old numbers exactly (audit columns included).
    after_cutover = {t: full_rows(platform, t) for t in MARTS.split(",")}
    status, undone = run_cli("rollback", "--reason", "finance wants the old numbers back")
    assert status == 0, undone
    assert {t: full_rows(platform, t) for t in MARTS.split(",")} == before
    # The UI's latest materialization of a rolled-back day is the rollback, not the cutover.
    (latest, *_) = materializations(platform, FCT_DAILY_REVENUE, [DAYS[1]])
    assert latest.asset_materialization.metadata["operation"].value == "rollback"
    assert run_cli("rollback", "--reason", "again")[0] == 1  # already rolled back

    # The fix was right after all: cut over again; the shadow is kept for the retention window.
    again = cutover(
        lake,
        platform.instance,
        [FCT_DAILY_REVENUE, CUSTOMER_LTV],
        DAYS[1],
        DAYS[5],
        "fxfix",
        "re-apply INC-42 fix",
        lineage=LINEAGE,
        copy=True,  # the copying cutover (object stores' path) gives the same table
    )
    assert [(t.mode, t.copy_reason) for t in again.tables] == [("copy", "asked for (--copy)")] * 2
    assert all(t.data_bytes_written > 0 for t in again.tables)
    assert {t: full_rows(platform, t) for t in MARTS.split(",")}["marts/fct_daily_revenue"] == (
        after_cutover["marts/fct_daily_revenue"]
    )
    with pytest.raises(DecommissionRefused, match="retention window"):
        decommission(lake, "fxfix", retention_hours=168)
    assert (platform.lakehouse / "marts/fct_daily_revenue__shadow_fxfix").is_dir()

    # Dropping the shadow keeps production's configured history (168 h): the pre-cutover
    # version stays whole. Shortening it must be asked for, and is refused until then,
    # naming what would be lost.
    old_fct = next(t for t in again.tables if t.table == "marts/fct_daily_revenue")
    tree = lakehouse_checksum(platform.lakehouse)
    status, refused = run_cli(
        "decommission", "--suffix", "fxfix", "--retention-hours", "0",
        "--vacuum-retention-hours", "0",
    )  # fmt: skip
    assert status == 1 and "below production's retention of 168 h" in refused["error"], refused
    assert "marts/fct_daily_revenue versions 0.." in refused["error"]
    assert lakehouse_checksum(platform.lakehouse) == tree
    status, gone = run_cli("decommission", "--suffix", "fxfix", "--retention-hours", "0")
    assert status == 0 and gone["vacuum_retention_hours"] == 168, gone
    assert not list(platform.lakehouse.glob("marts/*__shadow_*"))
    assert not missing_files(lake, "marts/fct_daily_revenue", old_fct.version_before)
    assert lake.read("marts/fct_daily_revenue", old_fct.version_before).count() > 0
    # The operator's explicit, shorter window (a shadow of the suffix again, to drop).
    shadow = shadow_lakehouse(lake, "fxfix", [FCT_DAILY_REVENUE])
    shadow.replace_range(
        FCT_DAILY_REVENUE,
        lake.read_partitions(FCT_DAILY_REVENUE, date(2024, 1, 2), date(2024, 1, 3)),
        "event_date",
        date(2024, 1, 2),
        date(2024, 1, 3),
        {},
    )
    status, gone = run_cli(
        "decommission", "--suffix", "fxfix", "--retention-hours", "0",
        "--vacuum-retention-hours", "0", "--shorten-history",
    )  # fmt: skip
    assert status == 0 and gone["vacuum_retention_hours"] == 0, gone
    assert missing_files(lake, "marts/fct_daily_revenue", old_fct.version_before)
    current = {t: full_rows(platform, t) for t in MARTS.split(",")}
    with pytest.raises(RollbackRefused, match="vacuumed"):
        rollback(lake, platform.instance, "too late")
    assert {t: full_rows(platform, t) for t in MARTS.split(",")} == current


def latest_materialization(platform: Platform, key: AssetKey) -> int | None:
    """The storage id of the key's latest materialization event (None: never materialized)."""
    page = AssetRecordsFilter(asset_key=key)
    records = platform.instance.fetch_materializations(page, limit=1).records
    return records[0].storage_id if records else None


def materializations(platform: Platform, key: AssetKey, partitions: list[str]) -> list:
    """The key's materialization records of those partitions, newest first."""
    page = AssetRecordsFilter(asset_key=key, asset_partitions=partitions)
    return list(platform.instance.fetch_materializations(page, limit=100).records)


def test_shadow_assets_refuse_a_run_without_a_valid_suffix_tag(ops_env):
    """A shadow twin launched without the suffix tag (or with a bad one) fails naming the tag,
    and no table, shadow or production, is written."""
    platform = ops_env
    deliver(platform)
    platform.materialize(DAYS[0], DAYS[0])
    versions = {t: platform.version(t) for t in MARTS.split(",")}
    everything = [*all_assets, *shadow_assets]
    for tags, message in (
        ({}, f"needs the run tag {SHADOW_SUFFIX_TAG}"),
        ({SHADOW_SUFFIX_TAG: "../prod"}, f"run tag {SHADOW_SUFFIX_TAG}: --suffix '../prod'"),
    ):
        result = materialize(
            everything,
            selection=[shadow_key(FCT_DAILY_REVENUE)],
            partition_key=DAYS[0],
            resources=platform.resources,
            instance=platform.instance,
            tags=tags,
            raise_on_error=False,
        )
        assert not result.success
        errors = [
            e.event_specific_data.error.message
            for e in result.all_events
            if getattr(e.event_specific_data, "error", None)
        ]
        assert any(message in text for text in errors), errors
    # A production asset in a run tagged as shadow is refused too.
    tagged = materialize(
        everything,
        selection=[FCT_DAILY_REVENUE],
        partition_key=DAYS[0],
        resources=platform.resources,
        instance=platform.instance,
        tags={SHADOW_SUFFIX_TAG: "ok"},
        raise_on_error=False,
    )
    assert not tagged.success
    assert not list(platform.lakehouse.glob("marts/*__shadow_*"))
    assert {t: platform.version(t) for t in MARTS.split(",")} == versions


def lakehouse_checksum(root) -> dict[str, str]:
    """Every file under the lakehouse root (Delta logs, data files, locks) by its sha256."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_shadow_twins_write_only_their_shadow_never_production(ops_env):
    """Every shadow twin selected in one run without the suffix tag writes nothing anywhere
    (staging/customers, which writes itself, included); with the tag, the customers twin
    writes its shadow even before that shadow exists, and production is untouched."""
    platform = ops_env
    deliver(platform)
    platform.materialize(DAYS[0], DAYS[2])
    before = lakehouse_checksum(platform.lakehouse)
    assert any(name.startswith("staging/customers/_delta_log/") for name in before)
    everything = [*all_assets, *shadow_assets]
    twins = [key for d in shadow_assets for key in d.keys]
    assert shadow_key(STAGING_CUSTOMERS) in twins
    untagged = materialize_range(
        everything,
        DAYS[0],
        DAYS[2],
        platform.resources,
        platform.instance,
        selection=twins,
        raise_on_error=False,
    )
    assert not untagged.success
    failures = [e for e in untagged.all_events if e.is_step_failure]
    assert failures and all(
        f"needs the run tag {SHADOW_SUFFIX_TAG}" in e.event_specific_data.error.message
        for e in failures
    )
    assert lakehouse_checksum(platform.lakehouse) == before

    tagged = materialize_range(
        everything,
        DAYS[0],
        DAYS[2],
        platform.resources,
        platform.instance,
        selection=[shadow_key(STAGING_CUSTOMERS)],
        tags={SHADOW_SUFFIX_TAG: "crmfix"},
    )
    assert tagged.success
    after = lakehouse_checksum(platform.lakehouse)
    changed = {name for name in after if before.get(name) != after[name]}
    assert changed and all(
        name.startswith(("staging/customers__shadow_crmfix/", "_locks/")) for name in changed
    ), sorted(changed)
    assert platform.rows("staging/customers__shadow_crmfix") == platform.rows("staging/customers")


def shadow_version(platform: Platform, table: str) -> int | None:
    return (
        platform.resources["lakehouse"].history(table, limit=1)[0]["metadata"].get("shadow_version")
    )


def test_plan_blocks_on_missing_inputs_and_on_runs_writing_the_same_partitions(ops_env):
    platform = ops_env
    busy = DagsterRun(
        job_name="__ASSET_JOB",
        status=DagsterRunStatus.STARTED,
        asset_selection={CUSTOMER_LTV},
        tags={RANGE_START_TAG: DAYS[4], RANGE_END_TAG: DAYS[6]},
    )
    # launched while the partitions reached further (`make ui STREAM=on` defines the
    # stream's days): its range runs past the last partition this process defines
    beyond = DagsterRun(
        job_name="__ASSET_JOB",
        status=DagsterRunStatus.STARTED,
        asset_selection={CUSTOMER_LTV},
        tags={RANGE_START_TAG: DAYS[5], RANGE_END_TAG: "2099-01-02"},
    )
    platform.instance.add_run(busy)
    platform.instance.add_run(beyond)
    lake, landing = platform.resources["lakehouse"], platform.resources["landing"]
    plan = build_plan(
        lake, landing, platform.instance, [CUSTOMER_LTV], DAYS[0], DAYS[5], lineage=LINEAGE
    )
    assert not plan.ok
    conflicts = sorted(plan.conflicting_runs, key=lambda c: c["first"])
    assert conflicts == [
        {
            "run_id": busy.run_id,
            "assets": ["marts/customer_ltv"],
            "first": DAYS[4],
            "last": DAYS[6],
        },
        {
            "run_id": beyond.run_id,
            "assets": ["marts/customer_ltv"],
            "first": DAYS[5],
            "last": "2099-01-02",
        },
    ]
    assert set(plan.assets[0].missing_inputs) == {
        f"staging/orders partitions {DAYS[0]}..{DAYS[5]} not built",
        f"raw/fx_rates partitions {DAYS[0]}..{DAYS[5]} not built",
    }
    assert "BLOCKED" in plan.markdown() and busy.run_id[:8] in plan.markdown()


def test_cutover_refused_without_a_passed_validation(ops_env):
    platform, lake = ops_env, ops_env.resources["lakehouse"]
    deliver(platform)
    platform.materialize(DAYS[0], DAYS[1], selection=["raw/orders", "raw/fx_rates"])
    # A shadow of raw/fx_rates exists but was never validated.
    shadow = shadow_lakehouse(lake, "t", [RAW_FX_RATES])
    shadow.replace_range(
        RAW_FX_RATES, lake.read(RAW_FX_RATES), "rate_date", date(2024, 1, 1), date(2024, 1, 3), {}
    )
    version = platform.version("raw/fx_rates")
    with pytest.raises(CutoverRefused, match="never validated"):
        cutover(
            lake, platform.instance, [RAW_FX_RATES], DAYS[0], DAYS[1], "t", "x", lineage=LINEAGE
        )
    assert platform.version("raw/fx_rates") == version


@pytest.mark.slow
def test_reingesting_a_day_whose_landing_files_are_gone_is_refused(ops_env):
    platform, lake = ops_env, ops_env.resources["lakehouse"]
    deliver(platform)
    platform.materialize(DAYS[0], DAYS[1], selection=["raw/orders"])
    raw_before, version = full_rows(platform, "raw/orders"), platform.version("raw/orders")
    gone = platform.landing / "orders" / f"ingest_date={DAYS[1]}" / "part-0000.jsonl"
    gone.unlink()
    # A file of the other day lost its last record; the blank lines it gained are no records.
    shrunk = platform.landing / "orders" / f"ingest_date={DAYS[0]}" / "part-0000.jsonl"
    records = shrunk.read_text().splitlines()
    shrunk.write_text("\n".join([*records[:-1], "", " \t"]) + "\n")

    plan = build_plan(
        lake, platform.resources["landing"], None, [RAW_ORDERS], DAYS[0], DAYS[1], lineage=LINEAGE
    )
    assert not plan.ok
    assert plan.missing_inputs == [
        f"raw/orders: landing file orders/{DAYS[1]}/part-0000.jsonl is gone"
    ]
    status, refused = run_cli(
        "shadow", "--select", "raw/orders", "--start", DAYS[0], "--end", DAYS[1], "--suffix", "s"
    )
    assert status == 1 and refused["refused"]

    result = platform.materialize(DAYS[0], DAYS[1], selection=["raw/orders"], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.message
    assert f"{DAYS[1]} part-0000.jsonl: 4 rows in raw, file gone" in message
    held = len(records)
    assert f"{DAYS[0]} part-0000.jsonl: {held} rows in raw, now {held - 1} lines" in message
    assert full_rows(platform, "raw/orders") == raw_before
    assert platform.version("raw/orders") == version

    # The CLI's backfill says why on the terminal, under the run it failed.
    days = ["--select", "raw/orders", "--start", DAYS[0], "--end", DAYS[1]]
    status, failed = run_cli("backfill", *days)
    (run,) = failed["runs"]
    assert status == 1 and run["reason"].startswith("raw__orders: "), run
    assert "part-0000.jsonl" in run["reason"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["backfill", *days, "--in-process"]) == 1
    assert f"    why: {run['reason']}" in out.getvalue().splitlines(), out.getvalue()
    assert platform.version("raw/orders") == version

    # A deliberate purge is allowed through typed run config and recorded on the commit.
    purge = materialize(
        all_assets,
        selection=AssetSelection.assets(RAW_ORDERS),
        resources=platform.resources,
        instance=platform.instance,
        run_config={
            "ops": {
                "raw__orders": {
                    "config": {"allow_source_purge": True, "purge_reason": "GDPR erasure #7"}
                }
            }
        },
        tags={
            "dagster/asset_partition_range_start": DAYS[0],
            "dagster/asset_partition_range_end": DAYS[1],
        },
    )
    assert purge.success
    meta = lake.history("raw/orders", limit=1)[0]["metadata"]
    assert json.loads(meta["source_purge"])["reason"] == "GDPR erasure #7"
    assert platform.table("raw/orders").count() == held - 1  # day 1 shrunk, day 2 gone


@pytest.mark.slow
def test_plain_backfill_command_in_process_tags_its_runs_and_refuses_a_bad_tag(ops_env):
    """`backfill --in-process`: the selection plus what runs with it, tagged with trigger,
    reason and --tag; the same argument checks as the other commands."""
    platform = ops_env
    deliver(platform)
    status, payload = run_cli(
        "backfill", "--select", "raw/orders,raw/fx_rates", "--start", DAYS[0], "--end", DAYS[1],
        "--reason", "re-ingest", "--tag", "team=finance",
    )  # fmt: skip
    assert status == 0 and payload["backfill_id"] is None, payload
    built = set(platform.resources["lakehouse"].built_partitions(RAW_ORDERS))
    assert built >= {DAYS[0], DAYS[1]}
    runs = [platform.instance.get_run_by_id(r["run_id"]) for r in payload["runs"]]
    assert runs and all(
        r.tags["backfill_platform/trigger"] == "backfill"
        and r.tags["backfill_platform/reason"] == "re-ingest"
        and r.tags["team"] == "finance"
        for r in runs
    )
    status, refused = run_cli(
        "backfill", "--select", "raw/orders", "--start", DAYS[1], "--end", DAYS[0]
    )
    assert status == 1 and refused["refused"] and "2024" in refused["error"]
