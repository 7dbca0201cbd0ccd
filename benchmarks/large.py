"""`make bench-large`: one point at ten million landing lines (is the cost linear?).

The full `make bench` at this scale would run a dozen backfills (about 90 minutes on two
cores); this runs the three that answer the scale questions, on ONE generated landing zone
in one warm session: the platform's backfill of the whole range (without the CRM assets,
like for like with the anchor), the same over the first days only (about the default
bench's 2.2M lines, same lines per day) as the reference point, and the plain Spark anchor
over the whole range. Reported: seconds per million landing lines at both sizes (linear
if within 10 %), the driver JVM's and Python's peak memory of each backfill (the longer
range must not need more), files per partition, and the anchor's marts checked equal.
Same arguments as `make bench`; `--reference-days` sets the reference point's length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench import Bench, files_per_partition, main, without_crm

REFERENCE_DAYS = 80  # x 14,000 orders/day: about the default bench's 2.2M landing lines
LINEAR_WITHIN = 0.10


class LargeBench(Bench):
    uses_crm = False  # the CRM assets are left out: the anchor does not compute them
    reference_days = REFERENCE_DAYS

    def _measure(self, summary: dict) -> dict[str, Any]:
        from backfill_platform.definitions import all_assets
        from backfill_platform.runner import backfill
        from backfill_platform.tables import RAW_ORDERS
        from benchmarks.anchor_spark import run_anchor_spark

        assets = without_crm(all_assets)
        reference_days = self.days[: min(self.reference_days, len(self.days))]
        runs: dict[str, list] = {}
        rows: dict[str, int] = {}
        points = (("warm_up", self.days[:3]), ("reference", reference_days), ("large", self.days))
        for name, days in points:
            resources, instance, _, _ = self._platform(name)
            with self._phase(name):
                runs[name] = backfill(
                    assets,
                    days[0].isoformat(),
                    days[-1].isoformat(),
                    resources,
                    instance,
                    per_run=self.per_run,
                )
            rows[name] = resources["lakehouse"].read(RAW_ORDERS).count()  # one row a line
        lake = resources["lakehouse"]
        with self._phase("plain_spark"):
            run_anchor_spark(
                self.spark, self.landing, self.days[0], self.days[-1], self.work / "plain_spark"
            )
        anchor_same = self._equals_platform(lake, self.work / "plain_spark")
        files = files_per_partition(lake)
        self.seconds.pop("_spans", None)

        def per_million(phase: str, lines: int) -> float:
            return round(self.seconds[phase] / (lines / 1e6), 2)

        large, reference = (
            per_million("large", rows["large"]),
            per_million("reference", rows["reference"]),
        )
        growth = round(large / reference - 1, 3)
        jvm = {p: self.memory[p].get("jvm", 0.0) for p in ("reference", "large")}
        checks = {
            "all_runs_succeeded": all(r.success for rs in runs.values() for r in rs),
            "plain_spark_equals_platform": anchor_same,
            "active_files_per_partition_max": max(f["active_max"] for f in files.values()),
        }
        checks["all_ok"] = bool(
            checks["all_runs_succeeded"]
            and anchor_same
            and checks["active_files_per_partition_max"] == 1
        )
        return {
            "scale": {
                "start": self.days[0].isoformat(),
                "end": self.days[-1].isoformat(),
                "partitions": len(self.days),
                "reference_partitions": len(reference_days),
                "orders_per_day": self.args.orders_per_day,
                "landing_lines": rows["large"],
                "reference_landing_lines": rows["reference"],
                "partitions_per_run": self.per_run,
                "runs": len(runs["large"]),
            },
            "seconds": dict(self.seconds),
            "seconds_per_million_lines": {
                "platform_large": large,
                "platform_reference": reference,
                "plain_spark_large": per_million("plain_spark", rows["large"]),
            },
            "linear": {
                "growth": growth,
                "within": LINEAR_WITHIN,
                "met": abs(growth) <= LINEAR_WITHIN,
            },
            "platform_over_plain_spark": round(
                self.seconds["large"] / self.seconds["plain_spark"], 2
            ),
            "driver_jvm_peak_mb": jvm,
            "driver_heap_grows_with_range": jvm["large"] > jvm["reference"] * (1 + LINEAR_WITHIN),
            "memory_peak_mb": self.memory,
            "files_per_partition": files,
            "checks": checks,
            "input": summary,
        }

    def render(self, result: dict[str, Any], chart_path: Path) -> str:
        s, sec, pm, mem = (
            result["scale"],
            result["seconds"],
            result["seconds_per_million_lines"],
            result["memory_peak_mb"],
        )

        def peaks(phase: str) -> str:
            m = mem.get(phase, {})
            return f"{m.get('jvm', 0):,.0f} / {m.get('python', 0):,.0f}"

        linear = result["linear"]
        files = result["files_per_partition"]
        lines = [
            f"Scale: {s['start']}..{s['end']} ({s['partitions']} daily partitions, "
            f"{s['orders_per_day']:,} orders/day), {s['landing_lines']:,} landing lines; "
            f"{s['partitions_per_run']} partitions per run. Load average at start "
            f"{result['load_average']['start']}, at end {result['load_average']['end']}.",
            "",
            "| line | landing lines | seconds | s per million lines | peak MB (JVM / Python) |",
            "|---|---:|---:|---:|---:|",
            f"| platform, {s['reference_partitions']} days (reference) | "
            f"{s['reference_landing_lines']:,} | {sec['reference']:.1f} | "
            f"{pm['platform_reference']} | {peaks('reference')} |",
            f"| platform, {s['partitions']} days | {s['landing_lines']:,} | {sec['large']:.1f} | "
            f"{pm['platform_large']} | {peaks('large')} |",
            f"| plain Spark, {s['partitions']} days (marts equal: "
            f"{'yes' if result['checks']['plain_spark_equals_platform'] else 'MISMATCH'}) | "
            f"{s['landing_lines']:,} | {sec['plain_spark']:.1f} | {pm['plain_spark_large']} | "
            f"{peaks('plain_spark')} |",
            "",
            f"Seconds per million lines, {s['partitions']} days vs the reference: "
            f"{linear['growth']:+.1%} (linear within {linear['within']:.0%}: "
            f"{'yes' if linear['met'] else 'NO'}). Driver JVM peak grows with the range: "
            f"{'YES' if result['driver_heap_grows_with_range'] else 'no'}. Platform / plain "
            f"Spark at this scale: {result['platform_over_plain_spark']}.",
            "",
            "| table | partitions | active files max | on disk max |",
            "|---|---:|---:|---:|",
            *(
                f"| {name} | {f['partitions']} | {f['active_max']} | {f['on_disk_max']} |"
                for name, f in files.items()
            ),
        ]
        return "\n".join(lines)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--reference-days", type=int, default=REFERENCE_DAYS)
    known, rest = parser.parse_known_args(argv)
    LargeBench.reference_days = known.reference_days
    return main(rest, bench_class=LargeBench)


if __name__ == "__main__":
    sys.exit(run())
