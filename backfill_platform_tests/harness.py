"""Test harness: a landing zone to write into, a lakehouse, a real Dagster instance."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetSelection, DagsterInstance, ExecuteInProcessResult
from pyspark.sql import DataFrame

from backfill_platform.definitions import all_assets, build_resources
from backfill_platform.resources import SparkSessionResource
from backfill_platform.resources.lakehouse import CONFLICTS_RETRIED
from backfill_platform.runner import backfill, materialize_range
from backfill_platform.tables import TABLE_NAMES


def spark_resource_for_tests() -> SparkSessionResource:
    return SparkSessionResource(master="local[2]", shuffle_partitions=2, driver_memory="2g")


def contest(history: list[dict]) -> dict[str, int]:
    """Two writers' contest over one table, from its history (`LakehouseResource.history`):
    `concurrent` commits (committed past a version another writer took after this one
    read, and Delta found the two compatible) and `conflicts_retried` (lost to another
    writer's commit, run again and won: recorded by each winning commit)."""
    return {
        "concurrent": sum(
            c["read_version"] is not None and c["version"] > c["read_version"] + 1 for c in history
        ),
        "conflicts_retried": sum(c["metadata"].get(CONFLICTS_RETRIED, 0) for c in history),
    }


def order_line(
    order_id: str,
    event_time: str = "2024-01-01T10:00:00Z",
    updated_at: str | None = None,
    status: str = "paid",
    currency: str = "USD",
    amount: Any = "10.00",
    customer_id: str | None = "c1",
    **extra: Any,
) -> str:
    record = {
        "order_id": order_id,
        "customer_id": customer_id,
        "event_time": event_time,
        "updated_at": updated_at or event_time,
        "status": status,
        "currency": currency,
        "amount": amount,
        **extra,
    }
    return json.dumps(record)


@dataclass
class Platform:
    root: Path
    landing: Path
    lakehouse: Path
    instance: DagsterInstance
    resources: dict[str, Any]

    @classmethod
    def create(cls, root: Path) -> Platform:
        landing, lakehouse = root / "landing", root / "lakehouse"
        landing.mkdir(parents=True, exist_ok=True)
        resources = build_resources(str(landing), str(lakehouse), spark=spark_resource_for_tests())
        return cls(root, landing, lakehouse, DagsterInstance.ephemeral(), resources)

    @property
    def spark(self):
        return self.resources["spark"].get_session()

    # -- landing zone -------------------------------------------------------------------
    def write_orders(self, ingest_date: str, lines: list[str], name: str = "part-0000.jsonl"):
        folder = self.landing / "orders" / f"ingest_date={ingest_date}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return folder / name

    def write_bytes(self, kind: str, folder_name: str, name: str, data: bytes) -> Path:
        folder = self.landing / kind / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        return folder / name

    def write_rates(self, rate_date: str, rates: dict[str, str], name: str = "rates.csv"):
        folder = self.landing / "fx_rates" / f"rate_date={rate_date}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "currency,usd_per_unit\n" + "".join(f"{c},{r}\n" for c, r in rates.items())
        (folder / name).write_text(body, encoding="utf-8")
        return folder / name

    # -- running ------------------------------------------------------------------------
    def materialize(
        self,
        first_key: str,
        last_key: str | None = None,
        selection: list[str] | None = None,
        raise_on_error: bool = True,
    ) -> ExecuteInProcessResult:
        keys = [AssetKey.from_user_string(s) for s in selection] if selection else None
        return materialize_range(
            all_assets,
            first_key,
            last_key or first_key,
            self.resources,
            self.instance,
            selection=AssetSelection.assets(*keys) if keys else None,
            raise_on_error=raise_on_error,
        )

    def backfill(self, first_key: str, last_key: str, per_run: int = 31):
        return backfill(
            all_assets, first_key, last_key, self.resources, self.instance, per_run=per_run
        )

    # -- reading ------------------------------------------------------------------------
    def table(self, name: str) -> DataFrame:
        return self.resources["lakehouse"].read(name)

    def rows(self, name: str, where: str | None = None) -> list[dict[str, Any]]:
        """Table rows without audit columns, sorted: what "same rows" means (contract 2.2)."""
        df = self.table(name)
        if where:
            df = df.where(where)
        cols = sorted(c for c in df.columns if not c.startswith("_"))
        return sorted(
            (r.asDict() for r in df.select(*cols).collect()),
            key=lambda r: json.dumps(r, sort_keys=True, default=str),
        )

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        lake = self.resources["lakehouse"]
        return {t: self.rows(t) for t in TABLE_NAMES if lake.exists(t)}

    def version(self, name: str) -> int | None:
        return self.resources["lakehouse"].current_version(name)


def dec(text: str) -> Decimal:
    return Decimal(text)


def point_cli_at(monkeypatch, home: Path, landing: Path, lakehouse: Path) -> None:
    """The settings the CLI reads, so the CLI in this process and the test share one Dagster
    instance (DAGSTER_HOME), landing zone and lakehouse."""
    for name, value in {
        "DAGSTER_HOME": home,
        "BACKFILL_LANDING_DIR": landing,
        "BACKFILL_LAKEHOUSE_DIR": lakehouse,
    }.items():
        monkeypatch.setenv(name, str(value))
