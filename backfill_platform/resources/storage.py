"""Paths that may be local or on object storage (`s3a://bucket/prefix`).

Local paths are used as they are (the landing sensor lists them without a JVM). A URI is
reached through Hadoop's FileSystem in the process's Spark session: the storage layer Spark
and Delta themselves use, with the session's S3A settings and credentials, so every scheme
Hadoop has a connector for works the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import SparkSession

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(path: str) -> bool:
    """`s3a://b/k` or `file:///x` (a scheme and `//`), not a local path."""
    return bool(_URI.match(str(path)))


def join(root: str, *parts: str) -> str:
    return "/".join([str(root).rstrip("/"), *parts])


@dataclass(frozen=True)
class StoredObject:
    """A file as the storage lists it."""

    path: str  # as Hadoop qualifies it: `s3a://bucket/landing/orders/ingest_date=.../x.jsonl`
    name: str
    size: int
    modified: float  # seconds since the epoch
    is_dir: bool


def hadoop_fs(session: SparkSession, path: str):
    """Hadoop's FileSystem for `path`, and the Hadoop Path."""
    jvm = session.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(session.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def list_dir(session: SparkSession, path: str) -> list[StoredObject]:
    """The entries directly under `path`, sorted by name; none when it does not exist."""
    filesystem, hadoop_path = hadoop_fs(session, path)
    if not filesystem.exists(hadoop_path):
        return []
    entries = [
        StoredObject(
            path=status.getPath().toString(),
            name=status.getPath().getName(),
            size=int(status.getLen()),
            modified=status.getModificationTime() / 1000.0,
            is_dir=bool(status.isDirectory()),
        )
        for status in filesystem.listStatus(hadoop_path)
    ]
    return sorted(entries, key=lambda e: e.name)


def read_bytes(session: SparkSession, path: str) -> bytes:
    """A whole (small) file: landing FX files and record counts, not table data."""
    filesystem, hadoop_path = hadoop_fs(session, path)
    stream = filesystem.open(hadoop_path)
    try:
        jvm = session.sparkContext._jvm
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()
