"""Paths that may be local or on object storage (`s3a://bucket/prefix`).

Local paths are used as they are (the landing sensor lists them without a JVM). A URI is
reached through Hadoop's FileSystem in the process's Spark session: the storage layer Spark
and Delta themselves use, with the session's S3A settings and credentials, so every scheme
Hadoop has a connector for works the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from pyspark.sql import SparkSession

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(path: str) -> bool:
    """`s3a://b/k` or `file:///x` (a scheme and `//`), not a local path."""
    return bool(_URI.match(str(path)))


def local_path(root: str) -> str | None:
    """A plain path, or a `file://` URI's path (one machine's disk); None for object storage."""
    if not is_uri(root):
        return root
    parsed = urlparse(root)
    return url2pathname(parsed.path) if parsed.scheme == "file" else None


def join(root: str, *parts: str) -> str:
    return "/".join([str(root).rstrip("/"), *parts])


@dataclass(frozen=True)
class StoredObject:
    """A file or folder as the storage lists it; `str()` is the path Spark reads."""

    path: str  # local, or as Hadoop qualifies it: `s3a://bucket/landing/orders/.../x.jsonl`
    name: str
    size: int
    modified_ns: int  # since the epoch
    is_dir: bool

    def __str__(self) -> str:
        return self.path


def hadoop_fs(session: SparkSession, path: str):
    """Hadoop's FileSystem for `path`, and the Hadoop Path."""
    jvm = session.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(session.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def list_dir(session: SparkSession, path: str) -> list[StoredObject]:
    """The entries directly under `path` through Hadoop, sorted by name; none when it does
    not exist."""
    filesystem, hadoop_path = hadoop_fs(session, path)
    if not filesystem.exists(hadoop_path):
        return []
    entries = [
        StoredObject(
            path=status.getPath().toString(),
            name=status.getPath().getName(),
            size=int(status.getLen()),
            modified_ns=int(status.getModificationTime()) * 1_000_000,
            is_dir=bool(status.isDirectory()),
        )
        for status in filesystem.listStatus(hadoop_path)
    ]
    return sorted(entries, key=lambda e: e.name)


def sizes_under(session: SparkSession, path: str) -> dict[str, int]:
    """Bytes of every file under `path` at any depth, by its path relative to `path`, from
    one recursive listing: on S3A one paged LIST of the prefix instead of two requests per
    folder. Empty when `path` does not exist."""
    filesystem, hadoop_path = hadoop_fs(session, path)
    if not filesystem.exists(hadoop_path):
        return {}
    root = filesystem.makeQualified(hadoop_path).toString().rstrip("/") + "/"
    sizes = {}
    files = filesystem.listFiles(hadoop_path, True)
    while files.hasNext():
        status = files.next()
        sizes[status.getPath().toString().removeprefix(root)] = int(status.getLen())
    return sizes


def list_local_dir(path: str) -> list[StoredObject]:
    """The files and folders directly under a local `path`, sorted by name, without a JVM;
    none when it does not exist."""
    root = Path(path)
    if not root.is_dir():
        return []
    entries = []
    with os.scandir(root) as found:  # one stat per entry (DirEntry caches it)
        for e in found:
            if e.is_dir() or e.is_file():
                stat = e.stat()
                entries.append(
                    StoredObject(e.path, e.name, stat.st_size, stat.st_mtime_ns, e.is_dir())
                )
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
