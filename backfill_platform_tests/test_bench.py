"""`make bench` end to end at a micro scale: it runs, checks itself and writes valid JSON.

No timing is asserted here; speed targets live in the benchmark's own report.
"""

import json
import re

import pytest

from benchmarks import bench, dagster_events, large
from benchmarks.measure import SparkLog

# The benchmark's own tests, not the platform's core: `make bench-smoke` runs them, so `make
# test` stays the newcomer's run of the core (docs/testing.md says why CI leaves them out).
pytestmark = pytest.mark.bench


@pytest.mark.slow
def test_bench_runs_end_to_end_and_writes_the_result(tmp_path, spark, capsys):
    code = bench.main(
        [
            "--start=2024-01-01",
            "--days=3",
            "--orders-per-day=4",
            "--sample=1",
            "--window-repeats=1",
            "--cold-sample=1",  # one day's two runs in new processes, and the window's two
            "--no-warm-up",  # timings at this scale mean nothing: no untimed warm-up either
            "--scaling=",
            f"--out={tmp_path}",
        ]
    )
    assert code == 0
    (result_file,) = tmp_path.glob("*.json")
    result = json.loads(result_file.read_text())
    for key in (
        "floor",
        "plain_spark",
        "same_tables",
        "duckdb",
        "platform",
        "platform_with_checks",
        "platform_anchor_marts",
        "platform_anchor_marts_with_checks",
        "rerun",
        "rerun_anchor_marts",
        "per_partition_extrapolated",
        "rolling_window",
    ):
        assert result["seconds"][key] > 0
    assert set(result["ratios"]) >= {
        "platform_over_floor",
        "platform_over_plain_spark",
        "platform_with_checks_over_plain_spark",
        "platform_over_duckdb",
        "per_partition_over_chunked",
        "rerun_over_first",
    }
    assert result["checks"]["rerun_rows_unchanged"] and result["checks"]["floor_equals_platform"]
    # the platform as users run it: its runs evaluated every check, none failed as ERROR,
    # and they wrote the same marts as the backfill without checks
    evaluations = result["checks"]["check_evaluations"]
    assert evaluations["checks"] == 16 and evaluations["failed_error"] == 0
    assert evaluations["evaluated"] > 16 and result["checks"]["with_checks_equals_platform"]
    assert "platform_with_checks_over_plain_spark" in result["targets"]
    # the independent anchors compute the platform's marts, row for row
    assert result["checks"]["plain_spark_equals_platform"]
    assert result["checks"]["duckdb_equals_platform"]
    # the fair denominator: a hand-written job building the same six tables, equal
    # to the platform's by count and hash over the contract's columns
    assert result["checks"]["same_tables_equals_platform"]
    # like for like: the platform building those six tables, each run with their checks
    # (the CRM assets and their 3 checks left out), against the job
    target = result["targets"]["platform_anchor_marts_with_checks_over_same_tables"]
    like = round(seconds_of(result, "platform_anchor_marts_with_checks", "same_tables"), 2)
    assert target == {"target": "<= 1.25", "measured": like, "met": like <= 1.25}
    anchor_evaluations = result["checks"]["anchor_marts_check_evaluations"]
    assert anchor_evaluations["checks"] == 13 and anchor_evaluations["failed_error"] == 0
    assert result["checks"]["anchor_marts_with_checks_equals_platform"]
    assert result["ratios"]["platform_with_checks_over_same_tables"] == round(
        seconds_of(result, "platform_with_checks", "same_tables"), 2
    )
    # like for like: the backfill without the CRM assets writes the same two marts
    assert result["checks"]["anchor_marts_equals_platform"]
    assert "platform_anchor_marts_over_plain_spark" in result["ratios"]
    assert result["checks"]["anchor_marts_rerun_rows_unchanged"]
    assert result["targets"]["rerun_over_first"]["target"] == "1 ± 0.05"
    # the fixed cost per backfill: the backfill's runs times what one more run costs
    fixed = result["targets"]["fixed_cost_per_backfill_seconds"]
    assert fixed["target"] == "<= 10.0"
    per_run = result["seconds"]["per_run_overhead"]
    assert fixed["measured"] == round(per_run * result["scale"]["platform_runs"], 1)
    assert result["targets"]["per_partition_over_chunked"]["target"] == ">= 50.0"
    # the price-of-safety targets, each printed with its measurement, met or not
    targets, seconds = result["targets"], result["seconds"]
    assert targets["fixed_cost_per_run_seconds"] == {
        "target": "<= 3.0",
        "measured": per_run,
        "met": per_run is not None and per_run <= 3.0,
    }
    assert targets["platform_with_checks_over_plain_spark"]["target"] == "<= 2.5"
    like = result["ratios"]["platform_anchor_marts_over_same_tables"]
    assert targets["platform_anchor_marts_over_same_tables"] == {
        "target": "<= 1.1",
        "measured": like,
        "met": like <= 1.1,
    }
    # a run as the deployment launches it, in a process and a JVM of its own: when its Spark
    # session came up and its first Spark job started, read off each run's own event log
    starts = result["new_process_runs"]
    assert [s["run"].split()[0] for s in starts] == ["raw", "downstream", "raw", "downstream"]
    for start in starts:
        assert 0 < start["session_up_seconds"] < start["first_spark_job_seconds"]
    slowest = max(s["first_spark_job_seconds"] for s in starts)
    assert targets["deployment_first_spark_job_seconds"] == {
        "target": "<= 5.0",
        "measured": slowest,
        "met": slowest <= 5.0,
    }
    added = round(seconds["platform_with_checks"] / seconds["platform"] - 1, 3)
    assert targets["checks_added_share"]["measured"] == added
    assert targets["checks_added_share"]["target"] == "<= 0.15"
    # the same share by step: the steps only the backfill with checks has, every check's
    check_steps = [
        row["seconds"]
        for key, row in result["platform_with_checks_steps"].items()
        if key not in result["platform_steps"]
    ]
    # 16 checks; the staging checks (accounting, rejects, quality's four, skew) are one step
    assert len(check_steps) == 10
    assert result["ratios"]["checks_steps_share"] == round(
        round(sum(check_steps), 2) / seconds["platform"], 3
    )
    by_step = result["ratios"]["checks_steps_share"]
    assert by_step > 0
    assert targets["checks_steps_share"] == {
        "target": "<= 0.1",
        "measured": by_step,
        "met": by_step <= 0.1,
    }
    events_seconds = result["dagster_events"]["phases"]["platform_with_checks"]
    share = round(events_seconds["estimated_seconds"] / seconds["platform_with_checks"], 3)
    assert targets["dagster_event_log_share"]["measured"] == share
    # this session keeps no Spark event log, so the cycle's jobs are not counted: not met
    assert targets["live_cycle_spark_jobs"] == {"target": "<= 20", "measured": None, "met": False}
    # Dagster's event log: every backfill's per-partition events, priced in the session
    # (the prices are timings: at this scale, on a loaded machine, their sign is noise)
    events = result["dagster_events"]
    checked = events["phases"]["platform_with_checks"]
    assert checked["ASSET_MATERIALIZATION"] == checked["ASSET_MATERIALIZATION_PLANNED"] == 27
    assert checked["ASSET_CHECK_EVALUATION"] == evaluations["evaluated"]
    for phase in events["phases"].values():
        assert phase["estimated_seconds"] == dagster_events.estimate(phase, events["price"])
    assert result["scale"]["raw_rows"] > 0 and result["machine"]["cpus"] >= 1
    assert result["files_per_partition"]["raw/orders"]["active_max"] == 1
    crm = result["crm"]
    assert crm["platform_calls"] == crm["distinct_customers_called"] > 0
    assert crm["rerun_calls"] == 0 and crm["server_429s"] == 0
    assert result["checks"]["crm_rerun_zero_calls"] and result["checks"]["crm_no_429"]
    assert (tmp_path / result_file.name.replace(".json", ".png")).stat().st_size > 0
    out = capsys.readouterr().out
    assert "| platform: full backfill" in out and "CRM: the full backfill made" in out
    assert "| platform with checks: the same" in out
    assert "| platform with checks, the anchors' assets only: the same-tables job's six" in out
    assert "Dagster's event log, priced on" in out and "| platform_with_checks |" in out
    assert "| DuckDB: the contract as SQL" in out and "| plain Spark: a hand-written" in out
    assert "| same tables: a hand-written job building the platform's six tables" in out
    assert f"| {starts[0]['run']} | {starts[0]['session_up_seconds']} |" in out
    # a progress bar per backfill, named by its phase: partitions (9 assets x 3 days) and runs
    assert re.search(r"platform: 100%\|.*\| 27/27 partitions, 2/2 runs", out)


def seconds_of(result: dict, over: str, under: str) -> float:
    return result["seconds"][over] / result["seconds"][under]


@pytest.mark.slow
def test_bench_large_runs_end_to_end_and_reports_the_scale_point(tmp_path, spark, capsys):
    code = large.run(
        [
            "--reference-days=2",
            "--start=2024-01-01",
            "--days=5",
            "--orders-per-day=4",
            f"--out={tmp_path}",
        ]
    )
    assert code == 0
    (result_file,) = tmp_path.glob("*.json")
    result = json.loads(result_file.read_text())
    assert result["scale"]["partitions"] == 5 and result["scale"]["reference_partitions"] == 2
    assert 0 < result["scale"]["reference_landing_lines"] < result["scale"]["landing_lines"]
    per_million = result["seconds_per_million_lines"]
    assert per_million["platform_large"] > 0 and per_million["platform_reference"] > 0
    # the anchor's marts equal the platform's, and every partition is one active file
    assert result["checks"]["plain_spark_equals_platform"]
    assert result["checks"]["active_files_per_partition_max"] == 1
    assert result["driver_jvm_peak_mb"]["large"] > 0
    out = capsys.readouterr().out
    assert "s per million lines" in out and "linear within 10%" in out


def test_spark_log_names_each_job_by_what_it_does(tmp_path):
    """Delta's own description first, else the action of the SQL query the job serves (AQE's
    stage jobs run from a thread pool without a call site), else the call site."""
    events = [
        {
            "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
            "executionId": 7,
            "description": "collect at /somewhere/backfill_platform/checks/quality.py:63",
        },
        *_job(1, 0, 400, {"spark.job.description": "Delta: Compute snapshot for version: 12"}),
        *_job(2, 0, 100, {"spark.job.description": "Delta: Compute snapshot for version: 13"}),
        *_job(3, 0, 900, {"spark.sql.execution.root.id": "7", "callSite.short": "$anonfun at X"}),
        *_job(4, 0, 50, {"callSite.short": "count at NativeMethodAccessorImpl.java:0"}),
    ]
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "local-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = SparkLog.read(folder).jobs_by_description()
    assert rows == [
        {
            "what": "collect at /somewhere/backfill_platform/checks/quality.py:N",
            "jobs": 1,
            "job_seconds": 0.9,
        },
        {"what": "Delta: Compute snapshot for version: N", "jobs": 2, "job_seconds": 0.5},
        {"what": "count at NativeMethodAccessorImpl.java:N", "jobs": 1, "job_seconds": 0.05},
    ]


def _job(job_id: int, start_ms: int, end_ms: int, properties: dict) -> list[dict]:
    return [
        {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Submission Time": start_ms,
            "Stage IDs": [],
            "Properties": properties,
        },
        {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": end_ms},
    ]
