"""Files where Spark keeps them: Hadoop's FileSystem API, driven from the driver.

Paths are Hadoop URIs (``file:/…``, ``hdfs://…``, ``s3a://…``; a path without a scheme is
on the cluster's default file system, as for Spark's own readers and writers). Every
failure of the file system becomes a :class:`~pgmb.errors.PipelineError` naming
the path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..db.error_text import first_line
from ..errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def reason(error: Exception) -> str:
    """The first line of a Java exception's own message, not py4j's stack trace."""
    java = getattr(error, "java_exception", None)
    text = str(java.toString()) if java is not None else str(error)
    return first_line(error, text)


@contextmanager
def _failing(what: str) -> Iterator[None]:
    try:
        yield
    except PipelineError:
        raise
    except Exception as e:
        raise PipelineError(f"{what}: {reason(e)}") from None


@dataclass(frozen=True)
class Usage:
    """What lies under a folder: data files (names not starting with ``_`` or ``.``) and
    all their bytes."""

    files: int
    bytes: int


class HadoopFS:
    """The file system operations the jobs need, on ``spark``'s Hadoop configuration."""

    def __init__(self, spark: SparkSession) -> None:
        # PySpark's way to Hadoop's Java API: its gateway to the driver's JVM.
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _path(self, uri: str) -> tuple[Any, Any]:
        with _failing(uri):
            path = self._jvm.org.apache.hadoop.fs.Path(uri)
            return path, path.getFileSystem(self._conf)

    def qualify(self, uri: str) -> str:
        """``uri`` absolute, with its scheme (and authority): how runs record it."""
        path, fs = self._path(uri)
        with _failing(uri):
            return str(fs.makeQualified(path).toString())

    def exists(self, uri: str) -> bool:
        path, fs = self._path(uri)
        with _failing(f"cannot read {uri}"):
            return bool(fs.exists(path))

    def is_dir(self, uri: str) -> bool:
        path, fs = self._path(uri)
        with _failing(f"cannot read {uri}"):
            return bool(fs.getFileStatus(path).isDirectory())

    def names(self, uri: str) -> list[str]:
        """The names in folder ``uri``."""
        path, fs = self._path(uri)
        with _failing(f"cannot read {uri}"):
            return sorted(str(s.getPath().getName()) for s in fs.listStatus(path))

    def mkdirs(self, uri: str) -> None:
        path, fs = self._path(uri)
        with _failing(f"cannot create {uri}"):
            if not fs.mkdirs(path):
                raise PipelineError(f"cannot create {uri}")

    def delete(self, uri: str) -> None:
        """Remove ``uri`` and everything under it, if it exists."""
        path, fs = self._path(uri)
        with _failing(f"cannot delete {uri}"):
            if fs.exists(path) and not fs.delete(path, True):
                raise PipelineError(f"cannot delete {uri}")

    def rename(self, source: str, target: str) -> None:
        """Move folder ``source`` to ``target``, whose parent exists and which does not
        (one atomic rename on HDFS and local disks; a copy on object stores)."""
        src, fs = self._path(source)
        dst, _ = self._path(target)
        with _failing(f"cannot move {source} to {target}"):
            if fs.exists(dst):
                raise PipelineError(f"cannot move {source} to {target}: it exists")
            if not fs.rename(src, dst):
                raise PipelineError(f"cannot move {source} to {target}")

    def check_writable(self, uri: str) -> None:
        """Create folder ``uri`` if needed, and a file in it (removed again)."""
        self.mkdirs(uri)
        probe, fs = self._path(f"{uri.rstrip('/')}/.probe-{uuid.uuid4().hex}")
        with _failing(f"cannot write in {uri}"):
            fs.create(probe, False).close()
            fs.delete(probe, False)

    def usage(self, uri: str) -> Usage:
        """Data files and bytes under folder ``uri`` (Spark's _SUCCESS and checksums
        excluded)."""
        path, fs = self._path(uri)
        files = size = 0
        with _failing(f"cannot read {uri}"):
            found = fs.listFiles(path, True)
            while found.hasNext():
                status = found.next()
                name = str(status.getPath().getName())
                if not name.startswith(("_", ".")):
                    files += 1
                    size += int(status.getLen())
        return Usage(files, size)
