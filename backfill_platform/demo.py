"""`make demo`: generate a landing zone, backfill every layer through Dagster, reconcile.

Running it twice is the point: the second run rewrites every partition and the table
fingerprints printed at the end stay the same.

The terminal gets a short account: the log file's path first (Dagster's and Spark's logs
go there), a progress bar, rows per table and the reconciliation. The partitions must be
the demo's days: BACKFILL_START_DATE equal to --start and BACKFILL_END_DATE (if set) not
before the landing zone's newest day; `make demo` sets both, anything else is refused in
one line, as is a landing zone generated with other parameters. Days `make deliver-day`
added since the landing zone was generated are part of the demo's days.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from confluent_kafka import KafkaException
from dagster import DagsterInstance

from backfill_platform.assets.reference import observe_currencies
from backfill_platform.cli import staging_fold, stream_compact_files
from backfill_platform.console import (
    RunProgress,
    Terminal,
    log_dir,
    logs_to_file,
    shown,
)
from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.lineage import Lineage
from backfill_platform.operations.boundary import reconcile_boundary
from backfill_platform.operations.stream import catch_up
from backfill_platform.operations.stream_events import StreamReporter
from backfill_platform.partitions import daily_partitions
from backfill_platform.ranges import DayRange
from backfill_platform.reconcile import (
    fingerprints,
    history_answer,
    reconcile_marts,
    reconcile_segments,
)
from backfill_platform.resources.kafka import TopicUnavailable, orders_topic_from_settings
from backfill_platform.runner import InProcessExecutor, observing, recording_instance, run_range
from backfill_platform.settings import LAKEHOUSE_DIR, LANDING_DIR, SettingError, setting
from backfill_platform.sources.crm_data import generate_crm
from backfill_platform.sources.crm_process import demo_crm
from backfill_platform.sources.generate import (
    Params,
    generate_landing,
    landing_days,
    read_params,
)
from backfill_platform.sources.producer import produce, shop_events
from backfill_platform.tables import TABLE_NAMES


class DemoRefused(Exception):
    """The demo cannot run with these settings and data; nothing was written."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=date.fromisoformat, default=date(2023, 1, 1))
    parser.add_argument("--end", type=date.fromisoformat, default=date(2025, 12, 31))
    parser.add_argument("--orders-per-day", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--per-run", type=int, default=None, help="partitions per run")
    parser.add_argument(
        "--stream-days",
        type=int,
        default=0,
        help="STREAM=on: this many days of the live shop after --end onto the Kafka topic, "
        "then the stream caught up into raw and staging (0: no stream)",
    )
    parser.add_argument(
        "--log",
        type=Path,
        help="append to this log file, named already (`make demo` prints it first, and its "
        "set-up wrote there)",
    )
    args = parser.parse_args(argv)
    landing, lakehouse = Path(setting(LANDING_DIR)), Path(setting(LAKEHOUSE_DIR))
    try:  # everything that can be refused, before anything is written
        if args.start > args.end:
            raise DemoRefused(f"--start {args.start} is after --end {args.end}")
        logs = log_dir()  # refuses a DAGSTER_HOME that is not a directory
        last = _check_landing(args, landing)
        _check_partitions(args.start, last)
    except (DemoRefused, SettingError) as refused:
        print(f"Refused: {refused}")
        return 1
    with logs_to_file("demo", logs, args.log) as terminal:
        if args.log is None:
            print(f"log: {shown(terminal.log)} (Dagster and Spark)")
        return _demo(args, terminal, landing, lakehouse, DayRange.of_days(args.start, last))


def _check_landing(args, landing: Path) -> date:
    """The demo's last day: --end for a landing zone still to generate, else the newest day
    of the one there, which must be this demo's (same parameters)."""
    wanted = Params(args.start, args.end, args.orders_per_day, args.seed)
    days = landing_days(landing)
    if not days:
        return args.end
    recorded = read_params(landing)
    if recorded:
        same = (recorded.start, recorded.end, recorded.orders_per_day, recorded.seed) == (
            wanted.start,
            wanted.end,
            wanted.orders_per_day,
            wanted.seed,
        )
        other = recorded.describe()
    else:  # generated before parameters were recorded: the days are all there is to check
        same = (days[0], days[-1]) == (args.start, args.end)
        other = f"{days[0]}..{days[-1]} (parameters not recorded)"
    if not same:
        raise DemoRefused(
            f"{shown(landing)} holds the demo {other}, not {wanted.describe()}: "
            "`make clean-data` first, or other BACKFILL_LANDING_DIR and BACKFILL_LAKEHOUSE_DIR"
        )
    return max(days[-1], args.end)


def _generate_or_reuse(args, landing: Path) -> None:
    days = landing_days(landing)
    if days:
        delivered = (days[-1] - args.end).days
        since = f"; {delivered} day(s) added by make deliver-day" if delivered > 0 else ""
        print(f"landing zone {shown(landing)}: reusing {days[0]}..{days[-1]} (immutable{since})")
        return
    started = time.monotonic()
    made = generate_landing(
        landing, args.start, args.end, args.orders_per_day, args.seed, progress=False
    )
    print(
        f"landing zone {shown(landing)}: generated {args.start}..{args.end}, "
        f"{made.get('orders', 0):,} orders in {made.get('lines', 0):,} lines "
        f"({made.get('late_lines', 0):,} late, {made.get('duplicate_lines', 0):,} "
        f"duplicated, {made.get('malformed_lines', 0):,} malformed), "
        f"{time.monotonic() - started:.0f} s"
    )


def _check_partitions(first: date, last: date) -> None:
    start = daily_partitions.get_first_partition_key()
    end = daily_partitions.get_last_partition_key()
    if start != first.isoformat():
        raise DemoRefused(
            f"partitions start at {start} (BACKFILL_START_DATE) but the demo's data at "
            f"{first} (--start): set BACKFILL_START_DATE={first} (`make demo` does)"
        )
    if end is None or end < last.isoformat():
        raise DemoRefused(
            f"partitions end at {end} (BACKFILL_END_DATE) but the demo's data at {last}: "
            f"set BACKFILL_END_DATE={last} (`make demo` does) or unset it"
        )


def _demo(args, terminal: Terminal, landing: Path, lakehouse: Path, days: DayRange) -> int:
    started = time.monotonic()
    _generate_or_reuse(args, landing)

    crm_data = landing.parent / "crm"
    if not (crm_data / "customers.json").is_file():
        made = generate_crm(landing, crm_data, args.seed)
        print(
            f"CRM data {shown(crm_data)}: {made['known']:,} customers known, "
            f"{made['unknown']} unknown to it"
        )
    instance = recording_instance()
    lineage = Lineage(all_assets)
    with demo_crm(crm_data, log=log_dir() / "crm_requests.jsonl") as crm:
        resources = build_resources(str(landing), str(lakehouse))
        # The known currencies first: staging records the version it was built against, so
        # the UI does not call every staging day stale at the live path's first observation.
        observe_currencies(resources["landing"], instance)
        with observing(RunProgress(terminal.out, instance=instance)):
            report = run_range(
                InProcessExecutor(all_assets, resources, instance),
                lineage,
                lineage.toposorted(),
                days,
                trigger="backfill",
                per_run=args.per_run,
            )
        if crm is not None:
            m = crm.metrics()
            print(
                f"CRM ({crm.url}): {m['admitted']:,} calls, {m['rejected_429']} answered 429, "
                f"peak {m['peak_per_second']}/s (limit {m['rate_limit']}/s)"
            )
    if not report.success:
        failed = next(r for r in report.runs if not r.success)
        print(
            f"backfill FAILED: run {failed.run_id} ({failed.first_key}..{failed.last_key}); "
            f"{len(report.not_run)} later run(s) not started. Log: {shown(terminal.log)}"
        )
        if failed.reason:
            print(f"  why: {failed.reason}")
        return 1

    lake = resources["lakehouse"]
    previous_file = lakehouse / "_demo_fingerprints.json"
    previous = json.loads(previous_file.read_text()) if previous_file.exists() else None
    # A demo without the stream ran before over these days: its tables are the backfill's
    # alone, so they compare with this backfill's before the stream adds its rows.
    before_stream = args.stream_days > 0 and previous and _batch_only(previous, str(days))
    if before_stream:
        backfilled = {"days": str(days), "stream_days": 0, "tables": fingerprints(lake)}
        print(f"{_compared(previous, backfilled)} (before the stream's rows)")
    # The stream first, so the rows and fingerprints below are the tables as they end.
    streamed = _stream(args, resources, instance) if args.stream_days > 0 else True
    # One pass over each table gives both its row count and its fingerprint, and one
    # oracle answer serves both mart reconciliations (the summary took 58 s with two of each).
    tables = fingerprints(lake)
    print("rows per table:")
    for name in TABLE_NAMES:
        print(f"  {name:<30} {int(tables.get(name, ['0'])[0]):>10,}")
    answer = history_answer(landing, days.last_day)
    result = reconcile_marts(lake, landing, days.first_day, days.last_day, answer=answer)
    segments_ok, segments = reconcile_segments(
        lake, landing, crm_data, days.first_day, days.last_day, answer=answer
    )
    result.ok = result.ok and segments_ok
    print(f"marts reconcile with the contract's answer: {'YES' if result.ok else 'NO'}")
    for line in [*result.details, segments]:
        print(f"  {line}")
    result.ok = result.ok and streamed
    prints = {"days": str(days), "stream_days": args.stream_days, "tables": tables}
    if previous and not before_stream:
        print(_compared(previous, prints))
    previous_file.write_text(json.dumps(prints, indent=2))
    print(
        f"{len(report.runs)} Dagster runs over {len(days)} days, "
        f"{time.monotonic() - started:.0f} s. Next: "
        + (
            "`make ui STREAM=on` (browse them, the stream running)"
            if args.stream_days > 0
            else "`make ui` (browse them), `make deliver-day` (feed the live path)"
        )
    )
    return 0 if result.ok else 1


def _batch_only(previous: dict, days: str) -> bool:
    """Whether the previous demo run covered `days` without the stream."""
    return previous.get("days") == days and not previous.get("stream_days", 0)


def _compared(previous: dict, now: dict) -> str:
    """Whether the tables equal the previous demo run's, which tables differ, or why they
    cannot be compared (another span of days, the stream on in one run only)."""
    if previous.get("days") != now["days"]:
        return f"tables not compared: the previous demo run covered {previous.get('days')}"
    before, after = previous.get("stream_days", 0), now["stream_days"]
    if before != after:
        ran = f"streamed {before} day(s)" if before else "had no stream"
        return (
            f"tables not compared: the previous demo run {ran} (STREAM=on adds the stream's rows)"
        )
    differ = sorted(
        name
        for name in {*previous["tables"], *now["tables"]}
        if previous["tables"].get(name) != now["tables"].get(name)
    )
    if differ:
        return f"tables identical to the previous demo run: NO ({', '.join(differ)} differ)"
    return "tables identical to the previous demo run: YES"


def _stream(args, resources, instance: DagsterInstance) -> bool:
    """STREAM=on: the shop's first `--stream-days` from the day after --end onto the topic
    (once: a topic that holds messages is not sent them again, so a second demo run leaves
    every table as it was), the stream caught up into raw/orders and staging (its batches
    reported to the instance, as the running stream reports them), the boundary reconciled.
    Whether every day reconciles."""
    orders = orders_topic_from_settings()
    launch = datetime.combine(args.end + timedelta(days=1), datetime.min.time(), UTC)
    until = launch + timedelta(days=args.stream_days)  # the shop's "now"
    last = args.end + timedelta(days=args.stream_days)  # the stream's last day
    try:
        held = sum(end - first for first, end in orders.end_offsets().values())
        if held:
            print(f"topic {orders.topic}: {held:,} messages already there, not sent again")
        else:
            made = produce(
                orders.bootstrap_servers,
                orders.topic,
                shop_events(
                    launch,
                    args.stream_days * args.orders_per_day,
                    args.seed,
                    orders_per_day=args.orders_per_day,
                    until=until,
                ),
            )
            print(
                f"topic {orders.topic} at {orders.bootstrap_servers}: the live shop sent "
                f"{len(made):,} messages, {launch:%Y-%m-%d}..{last}"
            )
        lake = resources["lakehouse"]
        with StreamReporter(instance, lake, orders.topic) as reporter:
            caught = catch_up(
                lake,
                orders,
                on_batch=reporter,
                fold=staging_fold(instance),
                compact_files=stream_compact_files(),
            )
        boundary = reconcile_boundary(
            lake, resources["landing"], orders, DayRange.of_days(args.end, last)
        )
    except (KafkaException, TopicUnavailable) as error:
        print(f"stream: the broker at {orders.bootstrap_servers} did not answer ({error})")
        return False
    print(caught.describe().splitlines()[0])
    head = boundary.describe().splitlines()
    for line in [*head[:3], *(d.describe() for d in boundary.failed)]:
        print(line)
    return not boundary.failed


if __name__ == "__main__":
    sys.exit(main())
