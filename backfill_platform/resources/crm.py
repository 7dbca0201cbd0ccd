"""The CRM client (contract 1.3): rate-limited across processes, retrying, token-safe.

Every call takes a slot from the shared rate limiter (`crm_limiter.py`: a SQLite file every
process on the machine shares; `crm_limiter_postgres.py`: a table in the Dagster instance's
PostgreSQL every machine shares), so all runs together stay under BACKFILL_CRM_RATE_LIMIT
and backfill runs under their share (1 - BACKFILL_CRM_LIVE_RESERVE). Retries go through
tenacity: a 429 waits its `Retry-After` and repeats (not an attempt: the call had no
effect), a 5xx, timeout or dropped connection backs off exponentially and counts; after
BACKFILL_CRM_MAX_ATTEMPTS the error names the customer. A retry takes a new slot, like any
call. The token is sent in a header only: errors and metadata name the URL and the
setting, never its value.

Calls run BACKFILL_CRM_CONCURRENCY at a time (threads, one HTTP session each): a CRM
answering in 100 ms allows 10 sequential calls a second, under the default backfill share
of 15/s; the limiter, not the thread count, sets the pace.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from urllib.parse import quote

import requests
from dagster import ConfigurableResource
from pydantic import Field
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from backfill_platform.resources.crm_limiter import BACKFILL, LIVE, CrmRateLimiter, RateLimiter
from backfill_platform.resources.crm_limiter_postgres import (
    LimiterUnavailable,
    PgConnection,
    PostgresRateLimiter,
)

TOKEN_SETTING = "BACKFILL_CRM_TOKEN"


class CrmError(Exception):
    """The CRM could not be used; the message names the customer or the setting.

    `answers` holds what the same call received before it failed: valid answers the
    caller may keep, so a retry of the run does not ask for them again."""

    answers: tuple[CrmAnswer, ...] = ()  # set by `fetch` on the instance it raises


class CrmAuthError(CrmError):
    """401: missing or wrong token (never printed)."""


class _Throttled(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"429, Retry-After {seconds}")
        self.seconds = seconds


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class CrmAnswer:
    """One answer as received: kept verbatim in raw/crm_customer_history."""

    customer_id: str
    fetched_at: datetime  # when the request was sent: the history is final up to here
    status: int
    body: str


@dataclass
class CrmCallStats:
    """What one run's calls cost: reported as metadata, 429s count as the limiter's fault."""

    customers: int = 0
    requests: int = 0
    throttled_429: int = 0
    transient_retries: int = 0
    limiter_wait_seconds: float = 0.0
    retry_wait_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, other: CrmCallStats) -> None:
        """Fold one call's numbers in (waits are summed over the calls in flight)."""
        for f in fields(self):
            if f.name == "statuses":
                for status, count in other.statuses.items():
                    self.statuses[status] = self.statuses.get(status, 0) + count
            elif f.name != "customers" and f.name != "elapsed_seconds":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metadata(self) -> dict[str, float | int | str]:
        return {
            "crm_customers_fetched": self.customers,
            "crm_requests": self.requests,
            "crm_429s": self.throttled_429,
            "crm_transient_retries": self.transient_retries,
            "crm_rate_limit_wait_seconds": round(self.limiter_wait_seconds, 3),
            "crm_retry_wait_seconds": round(self.retry_wait_seconds, 3),
            "crm_seconds": round(self.elapsed_seconds, 3),
            "crm_answers": ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items())),
        }


def backfill_share(rate_limit: int, live_reserve: float) -> int:
    """Calls per second all backfills together may make: floor((1 - reserve) * limit), >= 1."""
    return max(1, math.floor(rate_limit * (1.0 - live_reserve) + 1e-9))


class CrmResource(ConfigurableResource):
    """The CRM's history endpoint behind the shared rate limiter."""

    url: str = Field(description="Base URL of the CRM (BACKFILL_CRM_URL).")
    token: str = Field(default="", description="Bearer token (BACKFILL_CRM_TOKEN); never logged.")
    rate_limit: int = Field(
        default=20, description="Requests per second (BACKFILL_CRM_RATE_LIMIT)."
    )
    live_reserve: float = Field(
        default=0.25, description="Share kept for the live path (BACKFILL_CRM_LIVE_RESERVE)."
    )
    max_attempts: int = Field(
        default=8, description="Attempts per customer on 5xx/timeouts (BACKFILL_CRM_MAX_ATTEMPTS)."
    )
    limiter_backend: str = Field(
        default="sqlite",
        description="Holder of the limiter's window: `sqlite` (limiter_path) or `postgres` "
        "(the DAGSTER_PG_* database; BACKFILL_CRM_LIMITER_BACKEND).",
    )
    limiter_path: str = Field(
        default="", description="SQLite file every process shares (BACKFILL_CRM_LIMITER)."
    )
    limiter_unavailable_seconds: float = Field(
        default=60.0,
        description="How long calls wait for an unreachable PostgreSQL limiter before the run "
        "fails.",
    )
    concurrency: int = Field(
        default=4, description="Calls in flight at once (BACKFILL_CRM_CONCURRENCY)."
    )
    timeout_seconds: float = Field(default=10.0, description="Per-request timeout.")
    backoff_max_seconds: float = Field(default=8.0, description="Longest backoff after a 5xx.")

    def limiter(self) -> RateLimiter:
        if not 0.0 <= self.live_reserve < 1.0:
            raise CrmError(f"BACKFILL_CRM_LIVE_RESERVE={self.live_reserve}: must be in [0, 1)")
        if self.rate_limit < 1 or self.max_attempts < 1 or self.concurrency < 1:
            raise CrmError(
                f"BACKFILL_CRM_RATE_LIMIT={self.rate_limit}, BACKFILL_CRM_MAX_ATTEMPTS="
                f"{self.max_attempts}, BACKFILL_CRM_CONCURRENCY={self.concurrency}: "
                "each must be at least 1"
            )
        share = backfill_share(self.rate_limit, self.live_reserve)
        if self.limiter_backend == "postgres":
            return PostgresRateLimiter(
                PgConnection.from_settings(),
                self.rate_limit,
                share,
                unavailable_seconds=self.limiter_unavailable_seconds,
            )
        if self.limiter_backend != "sqlite" or not self.limiter_path:
            raise CrmError(
                f"CRM limiter {self.limiter_backend!r} with file {self.limiter_path!r}: needs "
                "`postgres`, or `sqlite` and a file (BACKFILL_CRM_LIMITER_BACKEND, "
                "BACKFILL_CRM_LIMITER)"
            )
        return CrmRateLimiter(self.limiter_path, self.rate_limit, share)

    def history_url(self, customer_id: str) -> str:
        return f"{self.url.rstrip('/')}/v1/customers/{quote(customer_id, safe='')}/history"

    def fetch(
        self, customer_ids: list[str], kind: str = BACKFILL, run_id: str = ""
    ) -> tuple[list[CrmAnswer], CrmCallStats]:
        """Each customer's history, one call each (plus retries), at the limiter's pace."""
        if kind not in (BACKFILL, LIVE):
            raise CrmError(f"kind {kind!r}: must be {BACKFILL!r} or {LIVE!r}")
        if not self.token:
            raise CrmAuthError(f"{TOKEN_SETTING} is not set: the CRM needs a bearer token")
        stats = CrmCallStats()
        if not customer_ids:
            return [], stats
        started = time.monotonic()
        lock, failed = threading.Lock(), threading.Event()
        local, sessions, first_error = threading.local(), [], []

        def session() -> requests.Session:
            if getattr(local, "session", None) is None:
                local.session = self._session(kind, run_id)
                with lock:
                    sessions.append(local.session)
            return local.session

        def call(customer: str) -> CrmAnswer | None:
            if failed.is_set():  # a call failed for good, or the run stops: start no more
                return None
            one = CrmCallStats()
            try:
                return self._fetch_one(session(), limiter, customer, kind, one, failed)
            except Exception as error:
                with lock:
                    if not failed.is_set():
                        first_error.append(error)
                        failed.set()
                raise
            finally:
                with lock:
                    stats.add(one)

        with self.limiter() as limiter:
            pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="crm")
            try:
                futures = [pool.submit(call, customer) for customer in customer_ids]
                wait(futures)
            except BaseException:
                failed.set()  # e.g. the run is being terminated: cut retry waits short
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
                for opened in sessions:
                    opened.close()
        # Every answer received is handed back, in the order asked, even when a call failed:
        # the caller keeps them, so a retry of the run does not ask for them again.
        answers = [
            answer
            for f in futures
            if not f.cancelled() and f.exception() is None and (answer := f.result())
        ]
        if first_error:
            error = first_error[0]
            if isinstance(error, CrmError):
                error.answers = tuple(answers)
            raise error
        stats.customers = len(answers)
        stats.elapsed_seconds = time.monotonic() - started
        return answers, stats

    def _session(self, kind: str, run_id: str) -> requests.Session:
        session = requests.Session()
        # Proxy and CA-bundle settings from the environment, read once per session: with
        # `trust_env` requests reads them twice per call (5 s in 10k calls, measured) and
        # would let a ~/.netrc entry replace the bearer token.
        env = session.merge_environment_settings(self.url, {}, None, None, None)
        session.trust_env = False
        session.proxies.update(env["proxies"])
        session.verify = env["verify"]
        session.headers.update(
            {
                "Authorization": f"Bearer {self.token}",
                "X-Backfill-Kind": kind,
                "X-Backfill-Run": run_id,
            }
        )
        return session

    def _fetch_one(
        self, session, limiter, customer: str, kind: str, stats, failed: threading.Event
    ) -> CrmAnswer:
        url = self.history_url(customer)
        failures = {"transient": 0, "last": ""}

        def attempt() -> CrmAnswer:
            try:
                call, waited = limiter.acquire(kind)
            except LimiterUnavailable as error:
                raise CrmError(str(error)) from None
            stats.limiter_wait_seconds += waited
            sent = datetime.now(UTC)
            stats.requests += 1
            try:
                response = session.get(url, timeout=self.timeout_seconds, allow_redirects=False)
            except (requests.ConnectionError, requests.Timeout) as error:
                failures["transient"] += 1
                failures["last"] = type(error).__name__
                raise _Transient() from None
            finally:
                limiter.finish(call)
            status = response.status_code
            stats.statuses[str(status)] = stats.statuses.get(str(status), 0) + 1
            if status == 429:
                stats.throttled_429 += 1
                raise _Throttled(_retry_after(response.headers.get("Retry-After")))
            if status >= 500:
                failures["transient"] += 1
                failures["last"] = f"HTTP {status}"
                raise _Transient()
            if status == 401:
                raise CrmAuthError(
                    f"the CRM at {self.url} refused the token (401): check {TOKEN_SETTING}"
                )
            if status not in (200, 404):
                raise CrmError(f"CRM history of customer {customer!r}: unexpected HTTP {status}")
            return CrmAnswer(customer, sent, status, response.text)

        backoff = wait_exponential_jitter(initial=0.2, max=self.backoff_max_seconds)

        def pause(state: RetryCallState) -> float:
            error = state.outcome.exception()
            seconds = error.seconds if isinstance(error, _Throttled) else backoff(state)
            stats.retry_wait_seconds += seconds
            if isinstance(error, _Transient):
                stats.transient_retries += 1
            return seconds

        def stop(state: RetryCallState) -> bool:
            return failures["transient"] >= self.max_attempts or failed.is_set()

        retrying = Retrying(
            retry=retry_if_exception_type((_Throttled, _Transient)),
            wait=pause,
            stop=stop,
            sleep=failed.wait,  # a wait ends early once the fetch gives up
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient:
            raise CrmError(
                f"CRM history of customer {customer!r} failed after {self.max_attempts} "
                f"attempts (last: {failures['last']}); the partitions needing it are not written"
            ) from None


def _retry_after(value: str | None) -> float:
    """Retry-After in decimal seconds; a missing or odd value waits one second."""
    try:
        seconds = float(value or "")
    except ValueError:
        return 1.0
    return seconds if 0.0 <= seconds <= 3600 else 1.0
