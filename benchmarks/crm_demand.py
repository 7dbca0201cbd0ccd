"""The CRM calls the segment mart would need to follow the stream (`make bench-crm-demand`,
docs/live-stream.md, "The marts within the batch").

`marts/fct_revenue_by_segment` attributes each order to its customer's CRM version in force
at the order's event_time, and a history fetched at F is final only up to F (contract 1.3):
a live order, whose event_time is now, needs its customer fetched again. So a fold that
kept the segment mart within `--window` seconds of the stream would call the CRM at least
once per distinct customer per window (one fetch after the window's last order covers all
of that customer's orders in it). This counts those customers in the demo shop's messages
as `make bench-stream` sends them (`shop_events`, `--seconds` of messages at each rate, the
shop's own customer pool and guests) and sets them against the contract's limit: 20
requests/s in all (`BACKFILL_CRM_RATE_LIMIT`), of which the live path is sure of its
reserve, 25 % (5/s), while a backfill calls.

Pure Python, no Spark or servers: a few seconds. Prints a table; writes
`benchmarks/results/crm-demand-<time>.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from benchmarks.measure import write_result

LAUNCH = datetime(2024, 1, 10, tzinfo=UTC)  # benchmarks/stream.py's
LIMIT, LIVE_RESERVE = 20, 0.25  # the contract's defaults
BENCH_STREAM_MESSAGES = 100_000  # benchmarks/stream.py's --messages, which sizes its pool


def customers_per_window(rate: int, seconds: int, window: int) -> dict:
    """The demo shop at `rate` messages/s for `seconds`, as `make bench-stream` sends it:
    the most distinct customers any `window` seconds of it hold."""
    from backfill_platform.sources.producer import shop_events

    total = rate * seconds
    per_day = max(BENCH_STREAM_MESSAGES, total)  # the customer pool bench-stream's shop has
    messages = shop_events(LAUNCH, total, orders_per_day=per_day)[:total]
    per_window = rate * window
    most, orders = 0, 0
    for start in range(0, max(1, total - per_window + 1), per_window):
        customers, ids = set(), set()
        for message in messages[start : start + per_window]:
            try:
                order = json.loads(message.value)
            except ValueError:  # a malformed message: no customer to fetch
                continue
            if isinstance(order, dict) and order.get("customer_id"):
                customers.add(order["customer_id"])
                ids.add(order.get("order_id"))
        if len(customers) > most:
            most, orders = len(customers), len(ids)
    calls = most / window
    return {
        "rate": rate,
        "window_seconds": window,
        "orders_with_a_customer": orders,
        "distinct_customers": most,
        "calls_per_second_needed": round(calls, 1),
        "times_the_limit": round(calls / LIMIT, 1),
        "times_the_live_reserve": round(calls / (LIMIT * LIVE_RESERVE), 1),
        "within_the_limit_alone": calls <= LIMIT,
        "within_the_reserve_beside_a_backfill": calls <= LIMIT * LIVE_RESERVE,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1,5,20,100,1000", help="messages/s, comma-separated")
    parser.add_argument("--window", type=int, default=30, help="seconds the mart may trail")
    parser.add_argument("--seconds", type=int, default=60, help="messages per rate: rate x this")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rows = [customers_per_window(int(r), args.seconds, args.window) for r in args.rates.split(",")]
    print(
        f"| messages/s | orders with a customer in {args.window} s | distinct customers | "
        "calls/s needed | x the limit (20/s) | x the live reserve (5/s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['rate']:,} | {row['orders_with_a_customer']:,} | "
            f"{row['distinct_customers']:,} | {row['calls_per_second_needed']} | "
            f"{row['times_the_limit']} | {row['times_the_live_reserve']} |"
        )
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "benchmark": "crm-demand",
        "args": vars(args),
        "rows": rows,
    }
    out = write_result("crm-demand", result)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
