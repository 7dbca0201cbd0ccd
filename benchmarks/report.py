"""The benchmark's result as a markdown table and a PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def markdown(r: dict[str, Any]) -> str:
    s, sec, mem, spark = r["scale"], r["seconds"], r["memory_peak_mb"], r["spark_phases"]
    rows_s = r["rows_per_second"]
    detail = sec["detail"]

    def mem_of(phase: str) -> str:
        m = mem.get(phase, {})
        return f"{m.get('jvm', 0):,.0f} / {m.get('python', 0):,.0f}" if m else ""

    def jobs(phase: str) -> str:
        return str(spark.get(phase, {}).get("jobs", ""))

    n = s["partitions"]
    lines = [
        f"Scale: {s['start']}..{s['end']} ({n} daily partitions), {s['orders_per_day']} "
        f"orders/day, {s['raw_rows']:,} landing lines; {s['partitions_per_run']} partitions "
        f"per run ({s['platform_runs']} runs). Load average at start "
        f"{r['load_average']['start']}, at end {r['load_average']['end']} "
        f"on {r['machine']['cpus']} CPUs.",
        "",
        "| measurement | seconds | rows/s | peak MB (JVM / Python) | Spark jobs |",
        "|---|---:|---:|---:|---:|",
        f"| floor: one bare Spark job, landing -> marts as Parquet (best of 2) | "
        f"{sec['floor']:.1f} | {rows_s['floor']:,} | {mem_of('floor_1')} | {jobs('floor_1')} |",
        f"| plain Spark: a hand-written job without the platform's transforms | "
        f"{sec['plain_spark']:.1f} | {rows_s['plain_spark']:,} | {mem_of('plain_spark')} | "
        f"{jobs('plain_spark')} |",
        f"| same tables: a hand-written job building the platform's six tables as Delta, no "
        f"checks (tables equal: {_yes(r['checks'].get('same_tables_equals_platform'))}) | "
        f"{sec['same_tables']:.1f} | {rows_s['same_tables']:,} | {mem_of('same_tables')} | "
        f"{jobs('same_tables')} |",
        f"| DuckDB: the contract as SQL on one machine, landing -> marts as Parquet | "
        f"{sec['duckdb']:.1f} | {rows_s['duckdb']:,} | {mem_of('duckdb')} | |",
        f"| platform: full backfill through Dagster, empty lakehouse | {sec['platform']:.1f} | "
        f"{rows_s['platform']:,} | {mem_of('platform')} | {jobs('platform')} |",
        f"| platform with checks: the same, every run evaluating its assets' checks "
        f"({_checks(r['checks'].get('check_evaluations'))}) | "
        f"{sec['platform_with_checks']:.1f} | {rows_s['platform_with_checks']:,} | "
        f"{mem_of('platform_with_checks')} | {jobs('platform_with_checks')} |",
        f"| platform, the anchors' assets only (no CRM assets; marts equal: "
        f"{_yes(r['checks'].get('anchor_marts_equals_platform'))}) | "
        f"{sec['platform_anchor_marts']:.1f} | {rows_s['platform_anchor_marts']:,} | "
        f"{mem_of('platform_anchor_marts')} | {jobs('platform_anchor_marts')} |",
        f"| platform with checks, the anchors' assets only: the same-tables job's six tables "
        f"and their checks ({_checks(r['checks'].get('anchor_marts_check_evaluations'))}; "
        f"marts equal: {_yes(r['checks'].get('anchor_marts_with_checks_equals_platform'))}) | "
        f"{sec['platform_anchor_marts_with_checks']:.1f} | "
        f"{rows_s['platform_anchor_marts_with_checks']:,} | "
        f"{mem_of('platform_anchor_marts_with_checks')} | "
        f"{jobs('platform_anchor_marts_with_checks')} |",
        f"| re-run: the same backfill again (no row changed: "
        f"{_yes(r['checks']['rerun_rows_unchanged'])}) | {sec['rerun']:.1f} | "
        f"{rows_s['rerun']:,} | {mem_of('rerun')} | {jobs('rerun')} |",
        f"| re-run of the anchors' assets only (no row changed: "
        f"{_yes(r['checks']['anchor_marts_rerun_rows_unchanged'])}) | "
        f"{sec['rerun_anchor_marts']:.1f} | {rows_s['rerun_anchor_marts']:,} | "
        f"{mem_of('rerun_anchor_marts')} | {jobs('rerun_anchor_marts')} |",
    ]
    if s["new_process_per_run_measured"]:
        lines.append(
            f"| one run per partition, new process per run "
            f"({detail['per_partition_sample_cold']:.1f} s for "
            f"{_days(s['per_partition_cold_sample'])} days, x{n}) | "
            f"{sec['per_partition_extrapolated']:.0f} | | {mem_of('per_partition_sample_cold')} | |"
        )
    lines += [
        f"| one run per partition, warm shared session "
        f"({detail['per_partition_sample_warm']:.1f} s for "
        f"{_days(s['per_partition_sample'])} days, x{n}) | "
        f"{sec['per_partition_extrapolated_warm_session']:.0f} | | "
        f"{mem_of('per_partition_sample_warm')} | {jobs('per_partition_sample_warm')} |",
    ]
    if s["new_process_per_run_measured"]:
        lines.append(
            f"| rolling-window cycle: 1 new day + last {s['window_days']} days, new process "
            f"per run | {sec['rolling_window']:.1f} | | {mem_of('rolling_window')} | |"
        )
    crm = r.get("crm")
    crm_lines = (
        [
            f"CRM: the full backfill made {crm['platform_calls']:,} calls for "
            f"{crm['distinct_customers_called']:,} distinct customers; the re-run made "
            f"{crm['rerun_calls']} (target 0); the server answered 429 {crm['server_429s']} "
            f"times; peak {crm['peak_per_second']}/s against a limit of {crm['rate_limit']}/s "
            f"(backfill share {crm['backfill_share']}/s); the limiter held runs back "
            f"{crm['limiter_wait_seconds']} s. At the default 20/s (backfill share 15/s) "
            f"those calls take at least {crm['seconds_at_default_limit']:,} s.",
        ]
        if crm
        else []
    )
    lines += [
        f"| rolling-window cycle, warm shared session (mean) | "
        f"{sec['rolling_window_warm_session'] or 0:.1f} | | {mem_of('rolling_window_warm_1')} | |",
        f"| fixed cost: {s['platform_runs']} runs x {sec['per_run_overhead']} s per run "
        "(the one-run-per-partition sample beyond its days' share of the re-run) | "
        f"{sec['fixed_cost_per_backfill']} | | | |",
        "",
        "| target | goal | measured | met |",
        "|---|---|---:|---|",
    ]
    for name, t in r["targets"].items():
        lines.append(f"| {name} | {t['target']} | {t['measured']} | {_yes(t['met'])} |")
    lines += [
        f"| platform with and without checks: marts identical | yes | "
        f"{_yes(r['checks']['with_checks_equals_platform'])} | |",
        f"| floor and platform marts identical | yes | "
        f"{_yes(r['checks']['floor_equals_platform'])} | |",
        f"| plain Spark and platform marts identical | yes | "
        f"{_yes(r['checks']['plain_spark_equals_platform'])} | |",
        f"| DuckDB and platform marts identical | yes | "
        f"{_yes(r['checks']['duckdb_equals_platform'])} | |",
        f"| same-tables job and platform: six tables identical (count and hash) | yes | "
        f"{_yes(r['checks']['same_tables_equals_platform'])} | |",
    ]
    starts = r.get("new_process_runs")
    if starts:
        lines += [
            "",
            "Runs in a new process, as the deployment launches them (seconds from the "
            "process's launch):",
            "",
            "| run | Spark session up | first Spark job |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {run['run']} | {run['session_up_seconds']} | {run['first_spark_job_seconds']} |"
            for run in starts
        ]
    lines += [
        "",
        *crm_lines,
        *([""] if crm_lines else []),
        *_dagster_events(r.get("dagster_events"), sec),
        "Where the platform's time goes (full backfill, per Dagster step):",
        "",
        "| step | seconds | Spark busy s | Spark jobs |",
        "|---|---:|---:|---:|",
    ]
    for step, row in r["platform_steps"].items():
        lines.append(f"| {step} | {row['seconds']} | {row['spark_busy_s']} | {row['jobs']} |")
    checked = r.get("platform_with_checks_steps")
    if checked:
        lines += [
            "",
            "The same backfill with its checks, per Dagster step (checks defined apart from "
            "their asset run as steps of their own):",
            "",
            "| step | seconds | Spark busy s | Spark jobs |",
            "|---|---:|---:|---:|",
        ]
        for step, row in checked.items():
            lines.append(f"| {step} | {row['seconds']} | {row['spark_busy_s']} | {row['jobs']} |")
    lines += ["", "Spark stages by call site, platform full backfill (top):", ""]
    lines += ["| stage | count | seconds | input MB |", "|---|---:|---:|---:|"]
    for st in spark.get("platform", {}).get("top_stages", []):
        lines.append(
            f"| `{st['stage'][:70]}` | {st['count']} | {st['seconds']} | {st['input_mb']} |"
        )
    lines += [
        "",
        "Files per Delta partition after all re-runs (active in the snapshot / on disk "
        "before VACUUM):",
        "",
        "| table | partitions | active max | active mean | on disk max |",
        "|---|---:|---:|---:|---:|",
    ]
    for table, f in r["files_per_partition"].items():
        lines.append(
            f"| {table} | {f['partitions']} | {f['active_max']} | {f['active_mean']} | "
            f"{f['on_disk_max']} |"
        )
    fit = r["scaling"]["fit"]
    lines += ["", "Scaling (full backfills; cost model fitted over these points):", ""]
    lines += [
        "| point | partitions | runs | landing lines | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in r["scaling"]["points"]:
        lines.append(
            f"| {p['label']} | {p['partitions']} | {p['runs']} | {p['raw_rows']:,} | "
            f"{p['seconds']} |"
        )
    if fit:
        lines += [
            "",
            f"seconds = {fit['seconds_per_run']} x runs + {fit['seconds_per_partition']} x "
            f"partitions + {fit['seconds_per_million_rows']} x million rows (R^2 {fit['r2']})",
        ]
    return "\n".join(lines)


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sec = r["seconds"]
    bars = [
        ("DuckDB", sec["duckdb"], "#444444"),
        ("plain Spark job", sec["plain_spark"], "#666666"),
        ("same-tables job", sec["same_tables"], "#777777"),
        ("floor (platform transforms)", sec["floor"], "#888888"),
        ("platform backfill", sec["platform"], "#1f77b4"),
        ("platform with checks", sec["platform_with_checks"], "#08519c"),
        ("platform, no CRM assets", sec["platform_anchor_marts"], "#9ecae1"),
        (
            "platform with checks,\nno CRM assets",
            sec["platform_anchor_marts_with_checks"],
            "#4292c6",
        ),
        ("re-run", sec["rerun"], "#6baed6"),
        ("re-run, no CRM assets", sec["rerun_anchor_marts"], "#c6dbef"),
        (
            "run per partition\n(warm session)",
            sec["per_partition_extrapolated_warm_session"],
            "#fd8d3c",
        ),
    ]
    if r["scale"]["new_process_per_run_measured"]:
        bars += [
            ("run per partition\n(process per run)", sec["per_partition_extrapolated"], "#d94801"),
            ("rolling window\n(process per run)", sec["rolling_window"], "#31a354"),
        ]
    else:  # --no-cold: the rolling window was measured in the warm session only
        bars.append(("rolling window\n(warm session)", sec["rolling_window"], "#31a354"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    labels, values, colors = zip(*bars, strict=True)
    left.barh(labels, values, color=colors)
    left.set_xscale("log")
    left.invert_yaxis()
    left.set_xlabel("seconds (log scale)")
    s = r["scale"]
    left.set_title(
        f"{s['partitions']} days, {s['raw_rows']:,} landing lines "
        f"(load avg {r['load_average']['start'][0]})"
    )
    for i, v in enumerate(values):
        left.text(v, i, f" {v:,.0f} s", va="center")

    if r["scaling"]["fit"] or not r.get("dagster_events"):
        _scaling(right, r)
    else:
        _breakdown(right, r)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _breakdown(ax, r: dict[str, Any]) -> None:
    """Each backfill as Spark jobs, Dagster's event log (at the session's price) and the rest,
    next to the plain Spark job: where the gap is, at a glance."""
    sec, spark = r["seconds"], r["spark_phases"]
    events = r["dagster_events"]["phases"]
    rows = [("plain Spark job", "plain_spark"), ("same-tables job", "same_tables")] + [
        (label, name)
        for label, name in (
            ("platform, no CRM assets", "platform_anchor_marts"),
            ("platform with checks, no CRM assets", "platform_anchor_marts_with_checks"),
            ("platform backfill", "platform"),
            ("platform with checks", "platform_with_checks"),
        )
        if name in events
    ]
    labels = [label for label, _ in rows]
    busy = [spark.get(name, {}).get("busy_s", 0.0) for _, name in rows]
    log = [events.get(name, {}).get("estimated_seconds", 0.0) for _, name in rows]
    rest = [max(0.0, sec[name] - b - e) for (_, name), b, e in zip(rows, busy, log, strict=True)]
    ax.barh(labels, busy, color="#1f77b4", label="Spark jobs")
    ax.barh(labels, log, left=busy, color="#fdae6b", label="Dagster event log")
    left = [b + e for b, e in zip(busy, log, strict=True)]
    ax.barh(labels, rest, left=left, color="#d9d9d9", label="the rest: Python (CRM calls), Dagster")
    ax.invert_yaxis()
    for i, (_, name) in enumerate(rows):
        ax.text(sec[name], i, f" {sec[name]:,.0f} s", va="center")
    ax.set_xlabel("seconds")
    ax.set_title("where the time goes", fontsize=9)
    ax.set_xlim(0, max(sec[name] for _, name in rows) * 1.15)
    ax.legend(loc="upper right", fontsize=8)


def _scaling(right, r: dict[str, Any]) -> None:
    points = r["scaling"]["points"]
    for p in points:
        right.scatter(p["raw_rows"] / 1e6, p["seconds"], s=40)
        right.annotate(
            f"{p['label']}\n{p['runs']} runs",
            (p["raw_rows"] / 1e6, p["seconds"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    right.set_xlabel("million landing lines")
    right.set_ylabel("seconds")
    fit = r["scaling"]["fit"]
    right.set_title(
        "full backfills"
        + (
            f": {fit['seconds_per_run']} s/run, {fit['seconds_per_partition']} s/partition, "
            f"{fit['seconds_per_million_rows']} s/M rows"
            if fit
            else ""
        ),
        fontsize=9,
    )


def _dagster_events(events: dict | None, sec: dict[str, Any]) -> list[str]:
    """What Dagster's event log cost each backfill, at the price measured in the session."""
    if not events:
        return []
    price = events["price"]
    lines = [
        f"Dagster's event log, priced on the instances' storage "
        f"({price.get('storage', 'sqlite')}) in this session: "
        f"{price['ms_per_event']} ms per asset event (planned, materialization, "
        f"observation), {price['ms_per_check_evaluation']} ms per check evaluation.",
        "",
        "| backfill | seconds | planned | materialized | observed | check evaluations | "
        "all events | their cost s | share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in events["phases"].items():
        lines.append(
            f"| {name} | {sec[name]:.1f} | {e['ASSET_MATERIALIZATION_PLANNED']:,} | "
            f"{e['ASSET_MATERIALIZATION']:,} | {e['ASSET_OBSERVATION']:,} | "
            f"{e['ASSET_CHECK_EVALUATION']:,} | {e['total']:,} | {e['estimated_seconds']} | "
            f"{e['estimated_seconds'] / sec[name]:.0%} |"
        )
    return [*lines, ""]


def _checks(counts: dict | None) -> str:
    if not counts:
        return "no evaluations"
    return (
        f"{counts['checks']} checks, {counts['evaluated']:,} evaluations, "
        f"{counts['failed_error']} failed ERROR, {counts['failed_warn']} WARN"
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _days(span: list[str]) -> int:
    from datetime import date

    return (date.fromisoformat(span[1]) - date.fromisoformat(span[0])).days + 1
