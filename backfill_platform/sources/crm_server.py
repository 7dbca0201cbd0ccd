"""The demo CRM (contract 1.3): a real HTTP server with a strict per-second rate limit.

`python -m backfill_platform.sources.crm_server --port 8765 --rate 20 --data DIR` serves
`GET /v1/customers/{percent-encoded id}/history` from `DIR/customers.json` (written by
`sources/crm_data.py`) behind a bearer token read from the environment variable named by
`--token-env`. It admits at most `--rate` requests in every window of one second (a
sliding window over admission instants) and answers the rest 429 with `Retry-After`;
429s have no effect and are not counted as admitted. For tests it can inject 5xx answers,
slow answers (client timeouts), dropped connections and customers that always fail.
Every request is logged (JSON lines, `--log`) and `GET /metrics` reports requests,
admissions, 429s and the peak of admitted requests in any one-second window. The
platform never reads this server's files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import deque
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from backfill_platform.reference import parse_timestamp

CUSTOMERS_FILE = "customers.json"
_PREFIX, _SUFFIX = "/v1/customers/", "/history"


def peak_per_second(instants: list[float]) -> int:
    """The most instants inside any half-open window of one second."""
    times = sorted(instants)
    peak, first = 0, 0
    for last, moment in enumerate(times):
        while times[first] <= moment - 1.0:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


class CrmState:
    """The server's data, limiter, faults and log, shared by its handler threads."""

    def __init__(self, histories: dict, token: str, rate: int, faults: dict, log_path):
        self.histories = histories
        self.token = token
        self.rate = rate
        self.faults = faults
        self.random = random.Random(faults.get("seed", 0))
        self.lock = threading.Lock()
        self.admitted: deque[float] = deque()
        self.log: list[dict] = []
        self.log_file = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def admit(self, now: float) -> float | None:
        """None if admitted; else the seconds until a slot frees (the Retry-After)."""
        with self.lock:
            while self.admitted and self.admitted[0] <= now - 1.0:
                self.admitted.popleft()
            if len(self.admitted) >= self.rate:
                return max(self.admitted[0] + 1.0 - now, 0.001)
            self.admitted.append(now)
            return None

    def fault(self) -> str | None:
        with self.lock:
            roll = self.random.random()
        edge = 0.0
        for kind in ("error", "drop", "slow"):
            edge += self.faults.get(kind, 0.0)
            if roll < edge:
                return kind
        return None

    def record(self, entry: dict) -> None:
        with self.lock:
            self.log.append(entry)
            if self.log_file:
                self.log_file.write(json.dumps(entry, ensure_ascii=False) + "\n")
                self.log_file.flush()

    def metrics(self) -> dict:
        with self.lock:
            log = list(self.log)
        counted = [e["t"] for e in log if e["status"] not in (401, 429)]
        by_status: dict[str, int] = {}
        for e in log:
            by_status[str(e["status"])] = by_status.get(str(e["status"]), 0) + 1
        span = (max(counted) - min(counted)) if len(counted) > 1 else 0.0
        return {
            "requests": len(log),
            "admitted": len(counted),
            "rejected_429": by_status.get("429", 0),
            "by_status": by_status,
            "rate_limit": self.rate,
            "peak_per_second": peak_per_second(counted),
            "mean_per_second": round(len(counted) / span, 3) if span else float(len(counted)),
        }


def served_history(versions: list[dict], now: datetime) -> list[dict]:
    """Histories only grow at the end: never serve a version that starts after now."""
    return [v for v in versions if parse_timestamp(v["valid_from"]) <= now]


def _handler(state: CrmState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The headers and the body leave in two writes; with Nagle's algorithm on, the
        # body waits for the client's delayed ACK of the headers (~40 ms on Linux), so a
        # kept-alive connection managed ~20 calls/s whatever --rate said. TCP_NODELAY.
        disable_nagle_algorithm = True

        def log_message(self, format, *args):
            return

        def _send(self, status: int, body: dict | None, headers: dict | None = None) -> None:
            data = json.dumps(body, ensure_ascii=False).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            now = time.time()
            if self.path == "/metrics":
                self._send(200, state.metrics())
                return
            entry = {
                "t": now,
                "path": self.path,
                "kind": self.headers.get("X-Backfill-Kind", ""),
                "run": self.headers.get("X-Backfill-Run", ""),
            }
            status = self._answer(now, entry)
            entry["status"] = status
            state.record(entry)

        def _answer(self, now: float, entry: dict) -> int:
            if self.headers.get("Authorization", "") != f"Bearer {state.token}":
                self._send(401, {"error": "missing or wrong token"})
                return 401
            wait = state.admit(now)
            if wait is not None:
                self._send(429, {"error": "rate limited"}, {"Retry-After": f"{wait:.3f}"})
                return 429
            if not (self.path.startswith(_PREFIX) and self.path.endswith(_SUFFIX)):
                self._send(404, {"error": "no such resource"})
                return 404
            segment = self.path[len(_PREFIX) : -len(_SUFFIX)]
            if "/" in segment:
                self._send(404, {"error": "customer id must be one percent-encoded segment"})
                return 404
            customer = unquote(segment, encoding="utf-8", errors="strict")
            entry["customer_id"] = customer
            fault = "error" if customer in state.faults.get("fail_ids", ()) else state.fault()
            if fault == "error":
                self._send(503, {"error": "injected failure"})
                return 503
            if fault == "drop":
                self.close_connection = True
                self.connection.close()
                return 0
            if fault == "slow":
                time.sleep(state.faults.get("slow_seconds", 5.0))
            versions = state.histories.get(customer)
            if versions is None:
                self._send(404, {"error": "unknown customer"})
                return 404
            served = served_history(versions, datetime.fromtimestamp(now, UTC))
            self._send(200, {"customer_id": customer, "versions": served})
            return 200

    return Handler


def load_histories(data_dir: Path) -> dict[str, list[dict]]:
    path = Path(data_dir) / CUSTOMERS_FILE
    if not path.is_file():
        raise SystemExit(f"--data {data_dir}: no {CUSTOMERS_FILE} (write it with crm_data.py)")
    return json.loads(path.read_text(encoding="utf-8"))["customers"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--rate", type=int, default=20, help="requests admitted per second")
    parser.add_argument("--data", type=Path, required=True, help="folder with customers.json")
    parser.add_argument("--token-env", default="BACKFILL_CRM_TOKEN", help="env var of the token")
    parser.add_argument("--log", type=Path, help="append every request as a JSON line here")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share answered 503")
    parser.add_argument("--drop-rate", type=float, default=0.0, help="share of dropped connections")
    parser.add_argument("--slow-rate", type=float, default=0.0, help="share answered late")
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument(
        "--fail-id", action="append", default=[], help="always answer 503 for this customer"
    )
    args = parser.parse_args(argv)
    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"crm_server: set {args.token_env} to the bearer token to accept", file=sys.stderr)
        return 2
    if args.rate < 1:
        print(f"crm_server: --rate {args.rate}: must be at least 1", file=sys.stderr)
        return 2
    faults = {
        "error": args.error_rate,
        "drop": args.drop_rate,
        "slow": args.slow_rate,
        "slow_seconds": args.slow_seconds,
        "seed": args.fault_seed,
        "fail_ids": frozenset(args.fail_id),
    }
    state = CrmState(load_histories(args.data), token, args.rate, faults, args.log)
    server = ThreadingHTTPServer((args.host, args.port), _handler(state))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"demo CRM listening on http://{host}:{port} (rate {args.rate}/s)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
