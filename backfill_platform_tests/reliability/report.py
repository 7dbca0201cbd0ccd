"""The figures of the last reliability run as a Markdown table (for docs/reliability.md).

python -m backfill_platform_tests.reliability.report
"""

from __future__ import annotations

import json
import sys

from backfill_platform_tests.reliability.conftest import ARTIFACTS

COLUMNS = {
    "suite": lambda f: f["suite"],
    "size": lambda f: f["size"],
    "trials": lambda f: f.get("trials", f.get("spark_examples", f.get("live_passes", "-"))),
    "faults injected": lambda f: f.get("faults_injected", "-"),
    "input kinds": lambda f: f.get("input_kinds", "-"),
    "rows checked": lambda f: f.get("rows_checked", "-"),
    "rows lost": lambda f: f.get("rows_lost", "-"),
    "torn partitions": lambda f: f.get("torn_partitions", "-"),
    "operator inputs refused": lambda f: (
        f"{f['operator_inputs_refused']}/{f['operator_inputs_tried']}"
        if "operator_inputs_tried" in f
        else "-"
    ),
    "files changed by a refusal": lambda f: f.get("files_changed_by_a_refusal", "-"),
    "failed tests": lambda f: f.get("failed_tests", "-"),
    "seconds": lambda f: f.get("seconds", "-"),
}


def _rows() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(ARTIFACTS.glob("*.json"))]


def table() -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(get(r)) for get in COLUMNS.values()) + " |" for r in _rows()]
    return "\n".join(lines)


def trials() -> str:
    """One line per trial of the suites that run several (pytest-xdist workers print none)."""
    lines = []
    for row in _rows():
        for detail in row.get("details", []):
            flat = {k: v for k, v in detail.items() if not isinstance(v, (dict, list))}
            lines.append(f"{row['suite']}: " + ", ".join(f"{k}={v}" for k, v in flat.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n\n" + trials() + "\n")
