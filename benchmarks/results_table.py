"""The committed benchmark results as markdown tables: `python -m benchmarks.results_table`.

Each dated run is one file, `benchmarks/results/YYYY-MM-DD-<name>.json` (the benchmarks'
own output, `<timestamp>.json`, stays out of git). docs/performance.md embeds this module's
output between its two markers; `--update` rewrites that part, and a test fails when the
two differ, so the page's history table is always the committed results.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
DATED = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.json$")
BEGIN = "<!-- results-table: begin (python -m benchmarks.results_table --update) -->"
END = "<!-- results-table: end -->"

# (column, figure key, format) of the `make bench` table; a run that did not record a
# figure shows "-".
BENCH_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("plain Spark s", "plain_spark", "s"),
    ("same-tables s", "same_tables", "s"),
    ("platform s", "platform", "s"),
    ("with checks s", "platform_with_checks", "s"),
    ("with checks / plain Spark", "platform_with_checks_over_plain_spark", "x"),
    (
        "six tables + checks / same-tables",
        "platform_anchor_marts_with_checks_over_same_tables",
        "x",
    ),
    ("fixed cost per run s", "fixed_cost_per_run_seconds", "s2"),
    ("new process's first Spark job s", "deployment_first_spark_job_seconds", "s"),
    ("live cycle jobs", "live_cycle_spark_jobs", "n"),
    ("checks share", "checks_added_share", "%"),
    ("check steps share", "checks_steps_share", "%"),
    ("event log share", "dagster_event_log_share", "%"),
    ("re-run / first", "rerun_over_first", "r"),
    ("window warm s", "rolling_window_warm_seconds", "s"),
)


def load(results: Path = RESULTS) -> list[tuple[str, dict[str, Any]]]:
    """Every committed run, oldest first (by file name: the date leads it)."""
    return [
        (path.stem, json.loads(path.read_text()))
        for path in sorted(results.iterdir())
        if DATED.match(path.name)
    ]


def _figure(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "%":
        return f"{value * 100:.1f} %"
    if kind == "x":
        return f"{value:.2f}"
    if kind == "r":
        return f"{value:.3f}"
    if kind == "s2":
        return f"{value:.2f}"
    if kind == "n":
        return f"{value:,}"
    return f"{value:,.1f}"


def _wall(run: dict[str, Any]) -> str:
    wall = run.get("wall_seconds")
    if wall is None:
        return "-"
    return ("~" if run.get("wall_approximate") else "") + f"{wall:,}"


def _commit(run: dict[str, Any]) -> str:
    return run["commit"] or "-"


def markdown(runs: list[tuple[str, dict[str, Any]]]) -> str:
    bench = [(name, run) for name, run in runs if run["benchmark"] == "make bench"]
    other = [(name, run) for name, run in runs if run["benchmark"] != "make bench"]
    head = ["run", "commit", "wall s", *(column for column, _, _ in BENCH_COLUMNS)]
    lines = [
        "`make bench` at the default scale, one row per committed run (shares: the checks' "
        "and Dagster's event log's, of the backfill without and with checks):",
        "",
        "| " + " | ".join(head) + " |",
        "|---|---|" + "---:|" * (len(head) - 2),
    ]
    for name, run in bench:
        figures = run["figures"]
        cells = [name, _commit(run), _wall(run)]
        cells += [_figure(figures.get(key), kind) for _, key, kind in BENCH_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "The demo and the other benchmarks:",
        "",
        "| run | command | commit | wall s | result |",
        "|---|---|---|---:|---|",
    ]
    for name, run in other:
        cells = [name, f"`{run['command']}`", _commit(run), _wall(run), run["summary"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def embedded(doc_text: str) -> str:
    """The part of the page between the markers."""
    start = doc_text.index(BEGIN) + len(BEGIN)
    return doc_text[start : doc_text.index(END, start)].strip("\n") + "\n"


def updated(doc_text: str, table: str) -> str:
    start = doc_text.index(BEGIN) + len(BEGIN)
    end = doc_text.index(END, start)
    return doc_text[:start] + "\n" + table + doc_text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--update", action="store_true", help=f"rewrite the table embedded in {DOC.name}"
    )
    args = parser.parse_args(argv)
    table = markdown(load())
    if args.update:
        DOC.write_text(updated(DOC.read_text(), table))
        print(f"updated {DOC}")
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
