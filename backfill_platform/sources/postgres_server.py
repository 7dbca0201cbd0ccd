"""A PostgreSQL server of the demo's own for Dagster's instance (`make demo`, `make ui`,
`make cli`; the Makefile's default `DAGSTER_STORAGE=local-postgres`).

    python -m backfill_platform.sources.postgres_server start --data data/postgres \
        --dagster-home .dagster_home          # make postgres-start (run by those targets)
    python -m backfill_platform.sources.postgres_server stop --data data/postgres

Why not SQLite: a ranged run writes two Dagster events per asset and partition (9,864 in the
demo) and Dagster's SQLite storage opens new connections and compiles its SQL for each, about
7 ms an event; PostgreSQL with one pooled connection and batched writes
(`runner.recording_instance`) costs a sixth of that (docs/performance.md).

The server is Debian's (`make postgres-deps` installs it), run by the `postgres` user when
started as root (the server refuses root). It listens on a Unix socket in its data folder
only: no TCP port to collide with and no password to keep, since only who may open the
folder may connect. `synchronous_commit=off` because the instance is a demo's: a crash may
lose the last few events' commits, never corrupt the database. Started when missing, left
running for the next command; its log is `<data>/postgres.log`. By hand around `initdb`
and `pg_ctl` because no library runs Debian's server as a throwaway local instance (the
tests' servers are started the same way).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

import psycopg2

from backfill_platform.console import INSTANCE_YAML

CLUSTER = "cluster"
LOG_FILE = "postgres.log"
# Only names the socket file (`.s.PGSQL.5432`) in the data folder: nothing listens on TCP.
PORT = 5432
USER = "dagster"
DATABASE = "dagster"
SERVER_USER = "postgres"  # Debian's, for a server started as root
TIMEOUT_SECONDS = 60


class PostgresServerError(Exception):
    """The server could not be set up; the message names the folder or the missing piece."""


def server_bin() -> Path:
    """The newest installed PostgreSQL server's bin folder (Debian's layout)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=_version)
    if not found:
        raise PostgresServerError(
            "no PostgreSQL server under /usr/lib/postgresql (`make postgres-deps` installs "
            "Debian's postgresql), or set DAGSTER_STORAGE=sqlite"
        )
    return found[-1].parent


def _version(pg_ctl: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in pg_ctl.parents[1].name.split(".") if part.isdigit())


def _as_server(args: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *args] if os.geteuid() == 0 else args


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        _as_server(args), capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
    )
    if check and done.returncode != 0:
        raise PostgresServerError(f"{Path(args[0]).name} failed: {done.stderr.strip()[-400:]}")
    return done


def running(data: Path) -> bool:
    if not (data / CLUSTER / "PG_VERSION").is_file():
        return False
    status = _run([str(server_bin() / "pg_ctl"), "-D", str(data / CLUSTER), "status"], False)
    return status.returncode == 0


def instance_url(data: Path, database: str = DATABASE) -> str:
    """SQLAlchemy's URL of a database of the server, through its socket folder."""
    socket_dir = quote(str(data.resolve()), safe="/")
    return f"postgresql+psycopg2://{USER}@/{database}?host={socket_dir}&port={PORT}"


def start(data: Path) -> bool:
    """Start the server of `data` (created on first use); False if it was running already.
    Its databases are made by `write_dagster_yaml`, which names them."""
    data = data.resolve()
    if running(data):
        return False
    bin_dir = server_bin()
    if os.geteuid() == 0:
        # checked before anything is made: the server's user must reach the folder
        nearest = next(folder for folder in (data, *data.parents) if folder.exists())
        if _run(["test", "-x", str(nearest)], check=False).returncode != 0:
            raise PostgresServerError(
                f"{data}: the {SERVER_USER} user cannot reach {nearest} (a private folder); "
                "set POSTGRES_DATA to a folder it can reach"
            )
    data.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(data, SERVER_USER, SERVER_USER)
        data.chmod(0o700)
    cluster = data / CLUSTER
    if not (cluster / "PG_VERSION").is_file():
        initdb = [str(bin_dir / "initdb"), "-D", str(cluster), "-U", USER, "-A", "trust"]
        _run([*initdb, "-E", "UTF8", "--no-sync", "--no-instructions"])
    options = (
        f"-p {PORT} -c listen_addresses='' -k {shlex.quote(str(data))} -c synchronous_commit=off"
        " -c max_connections=50"
    )
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(cluster), "-o", options]
    _run([*pg_ctl, "-l", str(data / LOG_FILE), "-w", "-t", str(TIMEOUT_SECONDS), "start"])
    return True


def scratch_data(prefix: str) -> Path:
    """A data folder inside a new temporary folder the server's user can reach (the bench's
    and the tests' servers: a temporary folder is private to its maker, root included)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    return root / "postgres"


def create_database(data: Path, database: str = DATABASE) -> None:
    """The database, unless it exists (a name of letters, digits and underscores)."""
    if not database.replace("_", "").isalnum():
        raise PostgresServerError(f"database name {database!r}: letters, digits and _ only")
    # closing(): psycopg2's own context manager opens a transaction, where CREATE DATABASE fails
    with closing(psycopg2.connect(host=str(data), port=PORT, user=USER, dbname="postgres")) as conn:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE DATABASE {database}")


def stop(data: Path) -> bool:
    """Stop the server of `data`; False if none was running."""
    data = data.resolve()
    if not running(data):
        return False
    _run([str(server_bin() / "pg_ctl"), "-D", str(data / CLUSTER), "-m", "fast", "stop"])
    return True


def write_dagster_yaml(home: Path, data: Path, database: str = DATABASE) -> Path:
    """DAGSTER_HOME's dagster.yaml: a database of this server (created if missing) as its
    storage, then everything else exactly as `deploy/dagster.yaml` (queue, pools, retries)."""
    create_database(data, database)
    home.mkdir(parents=True, exist_ok=True)
    storage = (
        "# Written by `make postgres-start` (backfill_platform/sources/postgres_server.py):\n"
        "# the demo's PostgreSQL server; the rest is deploy/dagster.yaml.\n"
        "storage:\n  postgres:\n"
        f'    postgres_url: "{instance_url(data, database)}"\n\n'
    )
    target = home / "dagster.yaml"
    target.write_text(storage + INSTANCE_YAML.read_text())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--data", type=Path, default=Path("data/postgres"))
    parser.add_argument("--dagster-home", type=Path, help="write its dagster.yaml (start)")
    args = parser.parse_args(argv)
    try:
        if args.action == "stop":
            print(f"PostgreSQL of {args.data} {'stopped' if stop(args.data) else 'not running'}")
            return 0
        if start(args.data):
            print(
                f"Dagster's instance: PostgreSQL in {args.data}, started "
                "(make postgres-stop stops it)"
            )
        if args.dagster_home:
            write_dagster_yaml(args.dagster_home, args.data)
    except (PostgresServerError, psycopg2.Error, OSError) as error:
        print(f"Refused: {error} ({args.data / LOG_FILE})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
