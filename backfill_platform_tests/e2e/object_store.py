"""A real S3-compatible server on 127.0.0.1 for the object-storage tests: versitygw.

versitygw is an S3 gateway over a POSIX directory (conditional writes, multipart uploads,
listing), built from source by `make s3-deps` into `.tools/bin`. A bucket is a directory
under the gateway's root. The credentials are per-test random strings, handed to the
platform through its settings (BACKFILL_S3_*), as a deployment would.
"""

from __future__ import annotations

import secrets
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from backfill_platform.resources import SparkSessionResource
from backfill_platform.resources.storage import hadoop_fs
from backfill_platform_tests.e2e.services import (
    REPO_ROOT,
    Service,
    free_port,
    start,
    stop_all,
    wait_for,
)

VERSITYGW = REPO_ROOT / ".tools" / "bin" / "versitygw"


def versitygw_bin() -> Path:
    found = VERSITYGW if VERSITYGW.exists() else shutil.which("versitygw")
    if not found:
        raise FileNotFoundError(
            f"versitygw is not installed ({VERSITYGW}); `make s3-deps` builds it (Go)"
        )
    return Path(found)


@dataclass
class S3Server:
    root: Path
    port: int = field(default_factory=free_port)
    access_key: str = field(default_factory=lambda: "test" + secrets.token_hex(6))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    services: list[Service] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "meta").mkdir(exist_ok=True)
        env = {"ROOT_ACCESS_KEY": self.access_key, "ROOT_SECRET_KEY": self.secret_key}
        args = [str(versitygw_bin()), "--port", f"127.0.0.1:{self.port}", "posix"]
        args += ["--sidecar", str(self.root / "meta"), str(self.root / "data")]
        self.services.append(start("versitygw", args, self.root, env, self.root))
        wait_for("versitygw", self._answers, timeout, interval=0.5, logs=[self.log])

    @property
    def log(self) -> Path:
        return self.root / "versitygw.log"

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            return True  # 403 without credentials: it is serving
        return True

    def stop(self) -> None:
        stop_all(self.services)

    def bucket(self, name: str) -> str:
        """A new bucket (a directory under the gateway's root); returns `s3a://name`."""
        (self.root / "data" / name).mkdir()
        return f"s3a://{name}"

    def objects(self, bucket: str) -> list[str]:
        """Every object key in `bucket`, read from the gateway's own directory (the store's
        side of the truth, not what S3A reports)."""
        folder = self.root / "data" / bucket
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    def env(self) -> dict[str, str]:
        """The platform's settings for this server (README "Deploying")."""
        return {
            "BACKFILL_S3_ENDPOINT": self.endpoint,
            "BACKFILL_S3_PATH_STYLE": "true",
            "BACKFILL_S3_ACCESS_KEY_ID": self.access_key,
            "BACKFILL_S3_SECRET_ACCESS_KEY": self.secret_key,
        }

    def spark_resource(self, **settings) -> SparkSessionResource:
        return SparkSessionResource(
            s3_endpoint=self.endpoint,
            s3_path_style=True,
            s3_access_key_id=self.access_key,
            s3_secret_access_key=self.secret_key,
            **settings,
        )

    def configure(self, session: SparkSession) -> None:
        """Point an already running session (the test process's) at this server: Hadoop
        reads `fs.s3a.*` when it first opens a bucket, after the session started."""
        hadoop = session.sparkContext._jsc.hadoopConfiguration()
        for key, value in self.spark_resource().s3_config().items():
            if key.startswith("spark.hadoop."):
                hadoop.set(key.removeprefix("spark.hadoop."), value)

    def upload(self, session: SparkSession, local: Path, uri: str) -> None:
        """Copy a local directory tree to `uri` through S3A (as a source would deliver it)."""
        filesystem, target = hadoop_fs(session, uri)
        jvm = session.sparkContext._jvm
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            relative = path.relative_to(local).as_posix()
            filesystem.copyFromLocalFile(
                False, True, jvm.org.apache.hadoop.fs.Path(str(path)), target.suffix("/" + relative)
            )
