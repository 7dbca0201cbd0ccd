"""The stream over simulated weeks (`make soak-stream`, docs/live-stream.md).

A real one-node broker and the demo shop selling over `--days` days, its clock run fast:
each simulated day's messages are sent in the time of `--batches-per-day` triggers of the
stream, and the day's landing export is delivered at its end (`deliver_next_day`). The
stream runs as a deployment runs it: `stream start` (its own process and JVM, a batch every
`--trigger-seconds`, reporting to a Dagster instance, compacting its small files beside it).
The soak, meanwhile, does what the live path around it does:

- at the day `--backfill-at`, backfills the days delivered so far (every asset with its
  checks, in runs of `--per-run` days) on a thread beside the stream;
- ticks the `stream_supervisor` sensor every simulated day (a stream that died is started
  again) and, once the backfill is done, the `landing_sensor` and the
  `rolling_window_sensor`, launching the runs they ask for;
- stops the broker and starts it again on the same port at the day `--restart-at`.

After each simulated day, once raw holds every message sent so far, it records: the batches
of the day and their seconds (from the stream's log), the data files of the day's partition
of `raw/orders` (written by the stream, and live at the end of the day, then at the end of
the soak), the most small files any day holds, the stream's reports in Dagster's event log,
and the stream JVM's heap after a full GC (`jcmd GC.run`, then `GC.heap_info`) with its
metaspace (reported, not judged: the classes Spark keeps compiled, at most
`spark.sql.codegen.cache.maxEntries` of its generated ones).

At the end a backfill of every day folds in what the window did not reach (late versions of
older days) and every table is compared with the contract's answer over landing files and
messages (every offset in raw once).
It passes when the last day's heap is within 10 % of the first warm day's (the first day
that ends after `--warm-up-batches` batches: the heap grows over the stream's first
batches, 96 to 118 MB over its first 12 in a 5-day run), the last tenth of
the batches is no more than 20 % slower than the first (medians), no day held more small
files than the compaction threshold at any observation (a trigger after the day's last
batch, its compaction round done), plus one for each round of that day that gave way to
another writer's table lock (its day keeps the batch's file until the next round), and the
tables equal the contract.
A run too short to have a warm day before its last leaves the heap not judged, and one of
fewer than 100 batches the batch time (CI's small soak: `e2e/test_soak_stream.py`). Prints
a table per day and the verdicts; writes `benchmarks/results/soak-stream-<time>.json` (or
`--out`); exit 1 if a verdict fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import psutil

from benchmarks.measure import load_average, write_result

LOGS = Path(tempfile.gettempdir()) / "soak-stream-logs"  # the soak's log and the stream's
REPO_ROOT = Path(__file__).resolve().parents[1]
FIRST = date(2024, 3, 1)
TOPIC = "orders"
BATCH_LINE = re.compile(
    r"batch (\d+): (\d+) rows, .*: (?:Delta v\d+|already in raw \(replay skipped\)) \(([\d.]+) s\)"
)
LEFT_FOR_LATER = re.compile(r"compaction of raw/orders .* left for later: ")
HEAP_USED = re.compile(r"used (\d+)K")
METASPACE_USED = re.compile(r"Metaspace\s+used (\d+)K")
HEAP_MARGIN = 0.10  # the last day's heap over the first's
SLOWDOWN_MARGIN = 0.20  # the last tenth of the batches over the first tenth (medians)
TENTH_AT_LEAST = 10  # batches in a tenth for its median to judge by (CI's 14 batches do not)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30, help="simulated days")
    parser.add_argument("--batches-per-day", type=int, default=40)
    parser.add_argument("--trigger-seconds", type=float, default=5.0)
    parser.add_argument("--orders-per-day", type=int, default=40, help="the shop's, per day")
    parser.add_argument("--landing-per-day", type=int, default=20, help="landing orders a day")
    parser.add_argument("--compact-files", type=int, default=32, help="the stream's threshold")
    parser.add_argument("--backfill-at", type=int, default=None, help="day (default: a third)")
    parser.add_argument("--restart-at", type=int, default=None, help="day (default: 2/3)")
    parser.add_argument("--per-run", type=int, default=10, help="the backfill's days per run")
    parser.add_argument(
        "--warm-up-batches", type=int, default=20, help="batches before the heap's baseline"
    )
    parser.add_argument("--work", default=None, help="a folder to keep (default: a temp one)")
    parser.add_argument("--out", default=None, help="the results file (default: results/)")
    parser.add_argument("--no-write", action="store_true", help="write no results file")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.backfill_at = args.days // 3 if args.backfill_at is None else args.backfill_at
    args.restart_at = 2 * args.days // 3 if args.restart_at is None else args.restart_at

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="soak-stream-"))
    last = FIRST + timedelta(days=args.days - 1)
    env = {
        "DAGSTER_HOME": str(work / "home"),
        "BACKFILL_LAKEHOUSE_DIR": str(work / "lake"),
        "BACKFILL_LANDING_DIR": str(work / "landing"),
        "BACKFILL_ORDERS_TOPIC": TOPIC,
        "BACKFILL_START_DATE": FIRST.isoformat(),
        "BACKFILL_END_DATE": last.isoformat(),
        "BACKFILL_STREAM_COMPACT_FILES": str(args.compact_files),
    }
    # Read when the platform's modules are imported (the partitions) and by the stream's
    # process, which inherits this environment.
    os.environ.update(env)
    started = time.monotonic()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "benchmark": "soak-stream",
        "command": "make soak-stream" + (f' SOAK_STREAM_ARGS="{" ".join(argv)}"' if argv else ""),
        "commit": _commit(),
        "args": vars(args),
        "load_before": load_average(),
    }
    from backfill_platform.console import logs_to_file

    soak = Soak(work, args, last)
    # Dagster's events and Spark's output to a file; a line per simulated day to the terminal.
    with logs_to_file("soak-stream", LOGS) as terminal:
        print(f"log: {terminal.log}", flush=True)
        try:
            soak.start()
            result.update(soak.run())
        finally:
            soak.close()
    result["load_after"] = load_average()
    result["seconds"] = round(time.monotonic() - started, 1)
    _print(result)
    if not args.no_write:
        out = write_result("soak-stream", result, Path(args.out) if args.out else None)
        print(f"written {out}")
    stream_log = work / "home" / "stream" / "raw_orders_stream.log"
    if stream_log.exists():  # kept beside the soak's own log
        shutil.copy(stream_log, terminal.log.with_suffix(".stream.log"))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(v["met"] is False for v in result["verdicts"].values()) else 0


class Soak:
    def __init__(self, work: Path, args, last: date):
        self.work, self.args, self.last = work, args, last
        self.crm = self.broker = None

    def start(self) -> None:
        """The landing zone, the CRM, the broker and the platform's resources."""
        from backfill_platform.definitions import build_resources
        from backfill_platform.resources.stream_process import StreamProcess
        from backfill_platform.sources.crm_data import generate_crm
        from backfill_platform.sources.crm_process import start_crm_server
        from backfill_platform.sources.generate import generate_landing
        from backfill_platform.sources.kafka_broker import start_broker
        from backfill_platform_tests.harness import spark_resource_for_tests
        from backfill_platform_tests.sensor_ticks import Daemon, instance_at

        work, args = self.work, self.args
        self.landing, self.lakehouse = work / "landing", str(work / "lake")
        # The export's first day; the next ones are delivered one a day as the shop sells.
        generate_landing(self.landing, FIRST, FIRST, args.landing_per_day, seed=31)
        # Every backfill of all assets calls the CRM: the demo's, for the landing's customers.
        generate_crm(self.landing, work / "crm", 31)
        self.crm = start_crm_server(work / "crm", token="soak-crm-token", rate=1000)
        os.environ.update(
            BACKFILL_CRM_URL=self.crm.url,
            BACKFILL_CRM_TOKEN="soak-crm-token",
            BACKFILL_CRM_RATE_LIMIT="1000",
        )
        self.broker = start_broker(work / "kafka")
        os.environ["BACKFILL_KAFKA_BOOTSTRAP"] = self.broker.bootstrap
        self.broker.create_topic(TOPIC, 4)
        self.instance = instance_at(work / "home")
        self.resources = build_resources(
            str(self.landing), self.lakehouse, spark=spark_resource_for_tests()
        )
        self.lake = self.resources["lakehouse"]
        self.daemon = Daemon(self.resources, self.instance)
        self.process = StreamProcess(work / "home" / "stream")
        self.backfill: threading.Thread | None = None
        self.backfill_outcome: dict = {}
        self.restarts_by_supervisor = 0
        self.jvm: int | None = None  # the stream JVM's pid when last measured

    def run(self) -> dict:
        from backfill_platform import cli
        from backfill_platform.sources.generate import deliver_next_day
        from backfill_platform.sources.producer import produce, shop_events
        from backfill_platform_tests.reliability.stream_helpers import overlap_messages

        args = self.args
        launch = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
        end = launch + timedelta(days=args.days)
        shop = shop_events(
            launch, args.days * args.orders_per_day, 31, orders_per_day=args.orders_per_day
        )
        shop = [m for m in shop if m.timestamp < end]
        overlap = overlap_messages(self.landing, FIRST, launch)
        by_day: dict[int, list] = {}
        for message in sorted(overlap + shop, key=lambda m: m.timestamp):
            by_day.setdefault((message.timestamp - launch).days, []).append(message)

        if cli.main(["stream", "start", "--trigger-seconds", str(args.trigger_seconds)]):
            raise RuntimeError(f"the stream did not start:\n{self._log_tail()}")
        produced, days, seen_batches, restarts = [], [], 0, []
        events_before = gave_way_before = 0
        for index in range(args.days):
            day = FIRST + timedelta(days=index)
            if index == args.backfill_at:
                self._start_backfill()
            if index == args.restart_at:
                restarts.append(self._restart_broker())
            messages = by_day.get(index, [])
            wall = args.batches_per_day * args.trigger_seconds
            began = time.monotonic()
            sold: list = []
            rate = len(messages) / wall if messages else 0
            seller = threading.Thread(
                target=lambda m=messages, r=rate, into=sold: into.extend(
                    produce(self.broker.bootstrap, TOPIC, m, rate=r)
                )
            )
            seller.start()  # the shop sells its day while the sensors tick beside it
            supervisor = self._tick_supervisor()
            self.restarts_by_supervisor += supervisor == "started again"
            live = self._tick_live_path()
            seller.join()
            time.sleep(max(0.0, wall - (time.monotonic() - began)))
            if len(sold) != len(messages):
                raise RuntimeError(f"{day}: {len(sold)} of {len(messages)} messages acknowledged")
            produced += sold
            if index:  # the day's export lands at its end (the first day's was there)
                deliver_next_day(self.landing)
            self._wait_for(len(produced))
            # a trigger's pause: the compactor's round after the day's last batch has run
            time.sleep(args.trigger_seconds)
            log = self._stream_log()  # read once a day: it grows with every batch
            batches = _batches(log)
            new = batches[seen_batches:]
            seen_batches = len(batches)
            events = self._stream_reports()
            gave_way = len(LEFT_FOR_LATER.findall(log))  # compaction rounds that gave way
            files = self.lake.partition_files("raw/orders", [day.isoformat()])
            heap, metaspace = self._memory_mb()
            days.append(
                {
                    "day": day.isoformat(),
                    "messages": len(messages),
                    "batches": len(new),
                    "batch_seconds_median": _median([s for _, _, s in new]),
                    "batch_seconds_max": max((s for _, _, s in new), default=None),
                    "files_at_day_end": files[day.isoformat()].files if files else 0,
                    "most_small_files_of_a_day": max(self._small_files().values(), default=0),
                    "compaction_rounds_left_for_later": gave_way - gave_way_before,
                    "stream_reports": events - events_before,
                    "heap_mb_after_full_gc": heap,
                    "metaspace_mb": metaspace,
                    "stream_jvm": self.jvm,
                    "supervisor": supervisor,
                    "live_path": live,
                    "seconds": round(time.monotonic() - began, 1),
                }
            )
            events_before, gave_way_before = events, gave_way
            print(json.dumps(days[-1]), flush=True)

        if self.backfill is not None:
            self.backfill.join()
        last_live = self._tick_live_path()  # the last day's export
        self._wait_for(len(produced))
        if cli.main(["stream", "stop"]):
            raise RuntimeError(f"the stream did not stop:\n{self._log_tail()}")
        return self._finish(produced, overlap, days, restarts) | {"live_path_at_the_end": last_live}

    def _finish(self, produced, overlap, days, restarts) -> dict:
        from backfill_platform.definitions import all_assets
        from backfill_platform.runner import backfill as run_backfill
        from backfill_platform_tests.reliability.stream_helpers import converged

        # The window folds what the stream sent after the backfill's runs (the daemon's ask).
        run_backfill(
            all_assets, FIRST.isoformat(), self.last.isoformat(), self.resources, self.instance
        )
        result = converged(self.lake, self.landing, FIRST, self.last, TOPIC, produced, overlap)
        failures = []
        try:
            result.check()
        except AssertionError as failed:
            failures.append(str(failed) or "the tables differ from the contract's answer")
        written = self._stream_files_by_day()
        live = {d: f.files for d, f in self.lake.partition_files("raw/orders").items()}
        for day in days:
            day["stream_files_written"] = written.get(day["day"], 0)
            day["files_at_the_end"] = live.get(day["day"], 0)
        batches = [s for _, _, s in _batches(self._stream_log())]
        verdicts = {
            "heap": _heap_verdict(days, self.args.warm_up_batches),
            "batch_time": _batch_time_verdict(batches),
            "files": {
                "threshold": self.args.compact_files,
                "most_small_files_of_a_day": max(d["most_small_files_of_a_day"] for d in days),
                "most_files_of_a_day_at_the_end": max(live.values(), default=0),
                "compaction_rounds_left_for_later": sum(
                    d["compaction_rounds_left_for_later"] for d in days
                ),
                "met": all(
                    d["most_small_files_of_a_day"]
                    <= self.args.compact_files + d["compaction_rounds_left_for_later"]
                    for d in days
                )
                and max(live.values(), default=0) <= self.args.compact_files,
            },
            "contract": {"figures": result.figures, "failures": failures, "met": not failures},
        }
        return {
            "days": days,
            "batches": len(batches),
            "broker_restarts": restarts,
            "stream_started_again_by_the_supervisor": self.restarts_by_supervisor,
            "backfill": self.backfill_outcome,
            "stream_reports": sum(d["stream_reports"] for d in days),
            "verdicts": verdicts,
        }

    def _start_backfill(self) -> None:
        """The landing zone's days, every asset with its checks, beside the stream."""
        from backfill_platform.checks import all_checks
        from backfill_platform.definitions import all_assets
        from backfill_platform.runner import backfill as run_backfill
        from backfill_platform.sources.generate import landing_days

        newest = max(landing_days(self.landing))

        def load() -> None:
            began = time.monotonic()
            try:
                runs = run_backfill(
                    all_assets,
                    FIRST.isoformat(),
                    newest.isoformat(),
                    self.resources,
                    self.instance,
                    per_run=self.args.per_run,
                    checks=all_checks,
                )
                self.backfill_outcome.update(days=f"{FIRST}..{newest}", runs=len(runs), ok=True)
            except Exception as failed:  # reported in the results, and the soak fails
                self.backfill_outcome.update(ok=False, error=str(failed)[:2000])
            self.backfill_outcome["seconds"] = round(time.monotonic() - began, 1)

        self.backfill = threading.Thread(target=load, name="landing-backfill")
        self.backfill.start()

    def _restart_broker(self) -> dict:
        """A controlled shutdown and a start on the same port, data and topic kept."""
        from backfill_platform.sources.kafka_broker import controller_port_beside, start_broker

        port = int(self.broker.bootstrap.rsplit(":", 1)[1])
        began = time.monotonic()
        self.broker.stop()
        down = time.monotonic()
        self.broker = start_broker(self.work / "kafka", port, controller_port_beside(port))
        return {
            "stop_seconds": round(down - began, 1),
            "down_seconds": round(time.monotonic() - down, 1),
        }

    def _tick_supervisor(self) -> str:
        from backfill_platform.automation.stream_sensor import stream_supervisor

        _, skip, observed = self.daemon.tick(stream_supervisor)
        return "started again" if observed or (skip or "").startswith("started") else "running"

    def _tick_live_path(self) -> dict[str, str]:
        """The landing sensor's runs (the days delivered since), then the rolling window's,
        once the backfill has loaded the history: the live path is turned on after it."""
        from backfill_platform.automation.landing_sensor import landing_sensor
        from backfill_platform.automation.window_sensor import rolling_window_sensor

        if self.backfill is None or self.backfill.is_alive():
            return {}
        done = {}
        for sensor in (landing_sensor, rolling_window_sensor):
            requests, skip, _ = self.daemon.tick(sensor)
            for request in requests:
                self.daemon.launch(sensor, request)
            done[sensor.name] = f"{len(requests)} run(s)" if requests else (skip or "")[:120]
        return done

    def _wait_for(self, count: int, timeout: float = 600) -> None:
        """Until raw holds `count` messages; a stream that died meanwhile is started again
        by the supervisor's next tick, as the daemon's would (every 30 s)."""
        from backfill_platform_tests.reliability.stream_helpers import offsets

        deadline = time.monotonic() + timeout
        while len(offsets(self.lake, TOPIC)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw did not reach {count} messages:\n{self._log_tail()}")
            if self.process.pid() is None:
                self.restarts_by_supervisor += self._tick_supervisor() == "started again"
            time.sleep(2)

    def _log_tail(self) -> str:
        return self.process.log_tail(40) if self.process.log.exists() else ""

    def _stream_log(self) -> str:
        return self.process.log.read_text(errors="replace") if self.process.log.exists() else ""

    def _small_files(self) -> dict[str, int]:
        from backfill_platform.resources.maintenance import small_files

        return small_files(self.lake, "raw/orders")

    def _stream_reports(self) -> int:
        """Materializations of raw/orders outside runs: the stream's reports."""
        from dagster import AssetKey

        count, cursor = 0, None
        while True:
            page = self.instance.fetch_materializations(
                AssetKey(["raw", "orders"]), limit=1000, cursor=cursor
            )
            count += sum(1 for r in page.records if not r.run_id)
            if not page.has_more:
                return count
            cursor = page.cursor

    def _stream_files_by_day(self) -> dict[str, int]:
        """Data files the stream wrote per day: one per day a batch committed."""
        from backfill_platform.operations.stream import STREAM_WRITER

        written: dict[str, int] = {}
        for commit in self.lake.history("raw/orders"):
            if commit["metadata"].get("writer") == STREAM_WRITER:
                for day in commit["metadata"].get("ingest_dates", []):
                    written[day] = written.get(day, 0) + 1
        return written

    def _memory_mb(self) -> tuple[float | None, float | None]:
        """The stream JVM's heap in use after a full GC and its metaspace in use (None for
        what could not be read, both when no stream runs)."""
        pid = self.process.pid()
        jvm = self.jvm = java_child(pid) if pid else None
        if jvm is None:
            return None, None
        subprocess.run(["jcmd", str(jvm), "GC.run"], capture_output=True, timeout=120)
        info = subprocess.run(
            ["jcmd", str(jvm), "GC.heap_info"], capture_output=True, text=True, timeout=120
        ).stdout
        return _megabytes(HEAP_USED.search(info)), _megabytes(METASPACE_USED.search(info))

    def close(self) -> None:
        from backfill_platform import cli

        cli.main(["stream", "stop"])
        for service in (self.broker, self.crm):
            if service is not None:
                service.stop()


def _batches(log: str) -> list[tuple[int, int, float]]:
    """(batch id, rows, seconds) of each batch line in the stream's log, in order."""
    return [(int(m[1]), int(m[2]), float(m[3])) for m in BATCH_LINE.finditer(log)]


def _heap_verdict(days: list[dict], warm_up_batches: int) -> dict:
    """The last day's heap against the first warm day's; not judged (met None) when no day
    before the last ends after the warm-up. Every day's batches count toward the warm-up,
    a day whose heap could not be read too."""
    measured = [d for d in days if d["heap_mb_after_full_gc"]]
    last_day = measured[-1] if measured else None
    ran, warm = 0, None
    for day in days:
        if day is last_day:
            break
        ran += day["batches"]
        if ran >= warm_up_batches and day["heap_mb_after_full_gc"]:
            warm = day
            break
    if warm is None:
        return {
            "warm_up_batches": warm_up_batches,
            "last_mb": last_day["heap_mb_after_full_gc"] if last_day else None,
            "met": None,
            "why": "no day before the last ends after the warm-up" if measured else "no heap",
        }
    last, first = last_day["heap_mb_after_full_gc"], warm["heap_mb_after_full_gc"]
    # One day's reading spreads (+18 % for three days of a 30-day run, then back): the
    # medians of the first and last fifth of the warm days are shown beside it, not judged.
    warm_days = [d["heap_mb_after_full_gc"] for d in measured[measured.index(warm) :]]
    fifth = max(1, len(warm_days) // 5)
    return {
        "warm_day": warm["day"],
        "first_mb": first,
        "last_mb": last,
        "first_fifth_median_mb": _median(warm_days[:fifth]),
        "last_fifth_median_mb": _median(warm_days[-fifth:]),
        "met": last <= first * (1 + HEAP_MARGIN),
    }


def _batch_time_verdict(batches: list[float]) -> dict:
    """The last tenth's median batch time against the first tenth's; not judged (met None)
    when a tenth holds fewer than TENTH_AT_LEAST batches: one or two batches, the first with
    the JVM's warm-up in it and the last beside a live-path run, say nothing of a trend."""
    tenth = len(batches) // 10
    if tenth < TENTH_AT_LEAST:
        return {
            "batches": len(batches),
            "met": None,
            "why": f"fewer than {TENTH_AT_LEAST} batches in a tenth",
        }
    first, latest = _median(batches[:tenth]), _median(batches[-tenth:])
    return {
        "first_tenth_median_s": first,
        "last_tenth_median_s": latest,
        "met": latest <= first * (1 + SLOWDOWN_MARGIN),
    }


def _megabytes(kilobytes: re.Match | None) -> float | None:
    return round(int(kilobytes[1]) / 1024, 1) if kilobytes else None


def java_child(pid: int) -> int | None:
    """The JVM pyspark started under `pid` (a child, or a child's child)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
        return next((c.pid for c in children if c.name() == "java"), None)
    except psutil.Error:  # the stream ended meanwhile
        return None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


def _print(result: dict) -> None:
    print()
    print(
        "| day | messages | batches | batch s (median / max) | stream files written | "
        "files at day end / at the end | most small files of a day | stream reports | "
        "heap MB after full GC | metaspace MB |"
    )
    print("|---|---:|---:|---|---:|---|---:|---:|---:|---:|")
    for d in result.get("days", []):
        print(
            f"| {d['day']} | {d['messages']} | {d['batches']} | "
            f"{d['batch_seconds_median']} / {d['batch_seconds_max']} | "
            f"{d.get('stream_files_written', '-')} | "
            f"{d['files_at_day_end']} / {d.get('files_at_the_end', '-')} | "
            f"{d['most_small_files_of_a_day']} | {d['stream_reports']} | "
            f"{d['heap_mb_after_full_gc']} | {d.get('metaspace_mb', '-')} |"
        )
    print()
    for name, verdict in result.get("verdicts", {}).items():
        shown = {k: v for k, v in verdict.items() if k not in ("met", "figures")}
        met = {True: "met", False: "NOT MET", None: "not judged"}[verdict["met"]]
        print(f"{name}: {met} {json.dumps(shown)}")
    print(
        f"{result.get('batches')} batches, {result.get('stream_reports')} stream reports, "
        f"broker restarts {result.get('broker_restarts')}, backfill {result.get('backfill')}, "
        f"{result.get('seconds')} s (load {result['load_before']} -> {result.get('load_after')})"
    )


if __name__ == "__main__":
    sys.exit(main())
