"""Work launched on a running Dagster deployment as ONE asset backfill, and followed there.

`DeploymentExecutor` is the runner's other executor. It does not run the plan's ranged
runs itself: it folds the plan back into "these partitions of these assets" and sends them
with GraphQL `launchPartitionBackfill` and `partitionsByAssets` (each asset exactly its own
ranges; `partitionNames` would let Dagster widen staging and marts through the
`AllPartitionMapping` on FX to every later day). The daemon then runs it like any UI
backfill: queued, under the pools and run retries of `deploy/dagster.yaml`, on the Backfills
page, cancellable there. The executor polls `partitionBackfillOrError` until the backfill
finishes and reports its outcome; `retry` re-runs only what failed
(`reexecutePartitionBackfill`, `FROM_FAILURE`).

HTTP goes through one `requests` session with urllib3 `Retry`: connection failures and
502/503/504 are retried with backoff; a read timeout is not (a mutation may have landed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
from dagster import AssetKey
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from backfill_platform.ranges import ranges_of
from backfill_platform.runner import (
    BackfillProgress,
    RangeRun,
    RunReport,
    RunSpec,
    current_observer,
)
from backfill_platform.settings import DAGSTER_URL, setting

# The code location `workspace.yaml` (and `make ui`) loads: Dagster names it after the module.
CODE_LOCATION = "backfill_platform.definitions"
FINISHED = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
# Run statuses that count as done for the progress bar.
RUN_DONE = {"SUCCESS", "FAILURE", "CANCELED"}
REASON_TAG = "backfill_platform/reason"

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on Error { message }
  }
}"""
REEXECUTE = """
mutation Reexecute($params: ReexecutionParams!) {
  reexecutePartitionBackfill(reexecutionParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on Error { message }
  }
}"""
CANCEL = """
mutation Cancel($id: String!) {
  cancelPartitionBackfill(backfillId: $id) {
    __typename
    ... on PythonError { message }
    ... on Error { message }
  }
}"""
STATUS = """
query Status($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      id
      status
      error { message }
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted
            numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
      runs(limit: 1000) {
        runId
        status
        tags { key value }
        assetSelection { path }
      }
    }
    ... on PythonError { message }
    ... on Error { message }
  }
}"""
LOCATIONS = """
query Locations {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
    ... on PythonError { message }
  }
}"""
ASSET_NODES = """
query Assets($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    repository { location { name } }
  }
}"""


class DeploymentError(RuntimeError):
    """The deployment cannot take or report the work; the message is one line."""


class DeploymentUnreachable(DeploymentError):
    pass


class BackfillDetached(DeploymentError):
    """Ctrl-C while following: the backfill keeps running on the deployment."""

    def __init__(self, backfill_id: str, url: str):
        super().__init__(
            f"stopped following backfill {backfill_id}; it keeps running on the deployment. "
            f"Watch or cancel it at {url} (Cancel backfill), or `backfill-platform cancel "
            f"{backfill_id}`"
        )
        self.backfill_id, self.url = backfill_id, url


def dagster_url() -> str:
    return setting(DAGSTER_URL).strip().rstrip("/")


def _session() -> requests.Session:
    retry = Retry(
        total=5,
        connect=5,
        read=0,
        status=3,
        status_forcelist=(502, 503, 504),
        allowed_methods=frozenset({"POST"}),
        backoff_factor=0.5,
        raise_on_status=False,
    )
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    session.mount("https://", HTTPAdapter(max_retries=retry))
    return session


@dataclass
class DagsterDeployment:
    """A Dagster webserver's GraphQL API: launch, follow, re-execute and cancel backfills."""

    url: str = field(default_factory=dagster_url)
    timeout: float = 60.0
    session: requests.Session = field(default_factory=_session, repr=False)

    def backfill_url(self, backfill_id: str) -> str:
        return f"{self.url}/runs/b/{backfill_id}"

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict:
        try:
            response = self.session.post(
                f"{self.url}/graphql",
                json={"query": query, "variables": dict(variables or {})},
                timeout=self.timeout,
            )
        except requests.ConnectionError as error:
            raise self._unreachable() from error
        except requests.RequestException as error:
            raise DeploymentError(f"{self.url}: {type(error).__name__}") from error
        try:
            body = response.json()
        except ValueError:
            body = {}
        if body.get("errors"):  # GraphQL errors come with HTTP 200, 400 or 500
            messages = "; ".join(e.get("message", "?") for e in body["errors"])
            raise DeploymentError(f"{self.url}/graphql: {messages}")
        if response.status_code != 200 or "data" not in body:
            first_line = (response.text.strip().splitlines() or [""])[0][:200]
            raise DeploymentError(
                f"{self.url}/graphql answered HTTP {response.status_code}: {first_line}"
            )
        return body["data"]

    def _unreachable(self) -> DeploymentUnreachable:
        return DeploymentUnreachable(
            f"no Dagster deployment answers at {self.url} (DAGSTER_URL): start one with "
            "`make ui`, point DAGSTER_URL at yours, or pass --in-process to run here"
        )

    def check_reachable(self) -> None:
        """One quick request without retries: the CLI's choice between here and there."""
        try:
            requests.post(f"{self.url}/graphql", json={"query": "{ version }"}, timeout=5)
        except requests.RequestException as error:
            raise self._unreachable() from error

    def check_serves(self, keys: Iterable[AssetKey]) -> None:
        """This code location is loaded there and defines every asset of the work."""
        workspace = self.graphql(LOCATIONS)["workspaceOrError"]
        if workspace["__typename"] != "Workspace":
            raise DeploymentError(f"{self.url}: workspace: {workspace.get('message')}")
        entries = {e["name"]: e["locationOrLoadError"] for e in workspace["locationEntries"]}
        if CODE_LOCATION not in entries:
            raise DeploymentError(
                f"{self.url} does not serve code location {CODE_LOCATION} "
                f"(it serves: {', '.join(sorted(entries)) or 'nothing'})"
            )
        location = entries[CODE_LOCATION] or {}
        if location.get("__typename") != "RepositoryLocation":
            raise DeploymentError(
                f"{self.url}: code location {CODE_LOCATION} failed to load: "
                f"{(location.get('message') or '').splitlines()[:1]}"
            )
        keys = list(keys)
        nodes = self.graphql(ASSET_NODES, {"keys": [{"path": k.path} for k in keys]})
        served = {
            AssetKey(n["assetKey"]["path"])
            for n in nodes["assetNodes"]
            if n["repository"]["location"]["name"] == CODE_LOCATION
        }
        missing = [k.to_user_string() for k in keys if k not in served]
        if missing:
            raise DeploymentError(
                f"code location {CODE_LOCATION} at {self.url} has no asset "
                f"{', '.join(missing)} (an older deployment? restart `make ui`)"
            )

    def launch(
        self, work: Mapping[AssetKey, Iterable[str]], tags: Mapping[str, str], title: str
    ) -> str:
        """One asset backfill: each asset exactly its own partitions, as ranges."""
        params = {
            "partitionsByAssets": [
                {
                    "assetKey": {"path": key.path},
                    "partitions": {
                        "ranges": [{"start": r.first, "end": r.last} for r in ranges_of(days)]
                    },
                }
                for key, days in work.items()
            ],
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
            # Dagster refuses titles over 100 characters or with %, * or ".
            "title": "".join(c for c in title if c not in '%*"')[:100],
        }
        result = self.graphql(LAUNCH, {"params": params})["launchPartitionBackfill"]
        return self._backfill_id(result, "launchPartitionBackfill")

    def retry(self, backfill_id: str) -> str:
        """A new backfill re-running only the failed (and never started) partitions."""
        params = {"parentRunId": backfill_id, "strategy": "FROM_FAILURE"}
        result = self.graphql(REEXECUTE, {"params": params})["reexecutePartitionBackfill"]
        return self._backfill_id(result, f"reexecutePartitionBackfill {backfill_id}")

    def cancel(self, backfill_id: str) -> None:
        result = self.graphql(CANCEL, {"id": backfill_id})["cancelPartitionBackfill"]
        if result["__typename"] != "CancelBackfillSuccess":
            raise DeploymentError(f"cancel {backfill_id}: {result.get('message')}")

    def status(self, backfill_id: str) -> dict:
        result = self.graphql(STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        if result["__typename"] != "PartitionBackfill":
            raise DeploymentError(f"backfill {backfill_id}: {result.get('message')}")
        return result

    @staticmethod
    def _backfill_id(result: dict, what: str) -> str:
        if result["__typename"] != "LaunchBackfillSuccess":
            raise DeploymentError(f"{what}: {result['__typename']}: {result.get('message')}")
        return result["backfillId"]


def work_of(plan: Sequence[RunSpec]) -> dict[AssetKey, list[str]]:
    """The plan's runs folded back into partitions per asset (Dagster plans its own runs)."""
    work: dict[AssetKey, set[str]] = {}
    for spec in plan:
        for key in spec.keys:
            work.setdefault(key, set()).update(spec.days.partition_keys())
    return {key: sorted(days) for key, days in work.items()}


def progress_of(status: dict) -> BackfillProgress:
    counts = (status.get("assetBackfillData") or {}).get("assetBackfillStatuses") or []
    counts = [c for c in counts if "numPartitionsTargeted" in c]
    runs = status.get("runs") or []
    return BackfillProgress(
        partitions_done=sum(
            c["numPartitionsMaterialized"] + c["numPartitionsFailed"] for c in counts
        ),
        partitions_total=sum(c["numPartitionsTargeted"] for c in counts),
        partitions_failed=sum(c["numPartitionsFailed"] for c in counts),
        runs_done=sum(r["status"] in RUN_DONE for r in runs),
        runs_total=len(runs),
    )


def range_run(run: dict) -> RangeRun:
    tags = {t["key"]: t["value"] for t in run.get("tags") or []}
    first = tags.get("dagster/asset_partition_range_start") or tags.get("dagster/partition", "")
    last = tags.get("dagster/asset_partition_range_end") or first
    assets = tuple("/".join(a["path"]) for a in run.get("assetSelection") or [])
    return RangeRun(first, last, run["runId"], run["status"] == "SUCCESS", assets)


@dataclass
class DeploymentExecutor:
    """Executes a plan as one asset backfill on a deployment and follows it to its end."""

    deployment: DagsterDeployment = field(default_factory=DagsterDeployment)
    title: str = "backfill-platform"
    poll_seconds: float = 3.0
    sleep: Callable[[float], None] = time.sleep

    def execute(
        self,
        plan: Sequence[RunSpec],
        tags: Mapping[str, str],
        on_run: Callable[[RangeRun], None] | None = None,
    ) -> RunReport:
        work = work_of(plan)
        if not work:
            return RunReport()
        self.deployment.check_serves(work)
        backfill_id = self.deployment.launch(work, tags, self.title)
        return self.follow(backfill_id, on_run)

    def follow(
        self,
        backfill_id: str,
        on_run: Callable[[RangeRun], None] | None = None,
        cancelled: bool = False,
    ) -> RunReport:
        """Poll until the backfill finishes; Ctrl-C leaves it running (`BackfillDetached`).

        `cancelled`: a cancel was accepted, so a backfill that reads REQUESTED again lost it.
        Dagster's cancel and its backfill daemon each read the backfill and write it back
        whole, unlocked (dagster-io/dagster#7094); a daemon iteration that read it just before
        the cancel writes REQUESTED back and the backfill would run to its end. The cancel is
        sent again, as a user would press it again.
        """
        url = self.deployment.backfill_url(backfill_id)
        observer = current_observer()
        reported: set[str] = set()
        try:
            if observer is not None:
                observer.launched(backfill_id, url)
            while True:
                status = self.deployment.status(backfill_id)
                if observer is not None:
                    observer.progressed(progress_of(status))
                for run in status.get("runs") or []:
                    if run["status"] in RUN_DONE and run["runId"] not in reported:
                        reported.add(run["runId"])
                        if on_run:
                            on_run(range_run(run))
                if status["status"] in FINISHED:
                    break
                if cancelled and status["status"] == "REQUESTED":
                    self.deployment.cancel(backfill_id)
                self.sleep(self.poll_seconds)
        except KeyboardInterrupt:
            raise BackfillDetached(backfill_id, url) from None
        runs = sorted((range_run(r) for r in status.get("runs") or []), key=lambda r: r.first_key)
        return RunReport(
            runs=runs, backfill_id=backfill_id, backfill_url=url, outcome=status["status"]
        )


def follow_backfill(
    executor: DeploymentExecutor, backfill_id: str, cancelled: bool = False
) -> RunReport:
    """Follow a backfill launched elsewhere (a retry, a cancel) with the observer's bar."""
    observer = current_observer()
    report = None
    try:
        report = executor.follow(backfill_id, cancelled=cancelled)
        return report
    finally:
        if observer is not None:
            observer.finished(report)
