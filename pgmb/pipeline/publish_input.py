"""The dataset of a ``publish``: its format, reading it with Spark, and the message columns.

:func:`prepare` turns whatever columns the dataset has into the ones the executors
publish (:data:`pgmb.pipeline.publish_rows.FIELDS`): everything that Spark can do in the
JVM (picking columns, turning structs into JSON texts, timestamps into ISO texts) happens
here; what needs pgmb's rules is checked row by row on the executors.

Every fault that can be seen from the driver (no such file, an unknown format, a missing
column, a column of the wrong type) is a :class:`~pgmb.errors.PipelineError`
raised before any row is read.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..db.error_text import first_line
from ..errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

FORMATS = ("parquet", "jsonl", "csv")
_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
}
#: Compression suffixes Spark reads through, ignored when guessing the format.
_COMPRESSION = (".gz", ".bz2", ".deflate", ".zst", ".lz4", ".snappy", ".xz")
#: Spark's column for a JSON line it could not parse.
CORRUPT = "_corrupt_record"


@dataclass(frozen=True)
class Columns:
    """Which dataset columns make the message (None: not from the dataset)."""

    key: str | None = None
    body: str | None = None
    body_columns: tuple[str, ...] = ()
    headers: str | None = None
    delay: str | None = None
    id: str | None = None

    def named(self) -> list[tuple[str, str]]:
        """(column, option) for every column named, for "missing column" errors."""
        pairs = [
            (self.key, "--key-column"),
            (self.body, "--body-column"),
            (self.headers, "--headers-column"),
            (self.delay, "--delay-column"),
            (self.id, "--id-column"),
        ]
        pairs += [(c, "--body-columns") for c in self.body_columns]
        return [(c, option) for c, option in pairs if c is not None]


def input_format(path: str, given: str | None) -> str:
    """``--format``, or the format the file name says (``events.parquet``, ``x.jsonl.gz``)."""
    if given:
        return given
    name = path.rstrip("/").lower()
    for suffix in _COMPRESSION:
        name = name.removesuffix(suffix)
    fmt = _EXTENSIONS.get(os.path.splitext(name)[1])
    if fmt is None:
        raise PipelineError(
            f"cannot tell the format of {path} from its name: pass --format {'|'.join(FORMATS)}"
        )
    return fmt


def local_path(path: str) -> str | None:
    """The local file path of ``path`` (``file:`` URIs too), or None for other file systems."""
    if path.startswith("file:"):
        rest = path.removeprefix("file:")
        return rest.removeprefix("//") if rest.startswith("///") else rest
    return None if "://" in path else path


def check_readable(path: str) -> None:
    """A local input must exist and be readable (other file systems are asked by Spark)."""
    local = local_path(path)
    if local is None:
        return
    found = glob.glob(local) if glob.has_magic(local) else [local] if os.path.exists(local) else []
    if not found:
        raise PipelineError(f"cannot read {path}: no such file or directory")
    for each in found:
        if not os.access(each, os.R_OK | (os.X_OK if os.path.isdir(each) else 0)):
            raise PipelineError(f"cannot read {each}: permission denied")


def spark_reason(error: Exception) -> str:
    """What went wrong, in one line, from an error of Spark (a JVM stack trace follows)."""
    text = str(error).strip()
    java = getattr(error, "java_exception", None)
    if java is not None:  # a Py4JJavaError: its text is the whole stack
        text = str(java.toString())
    line = first_line(error, text)
    return re.sub(r"^(?:[\w$]+\.)+[\w$]+(?:Exception|Error): ", "", line)


def read(spark: SparkSession, path: str, fmt: str, raw_json: set[str]) -> DataFrame:
    """The dataset as Spark reads it.

    JSON Lines: the columns in ``raw_json`` (body and headers) are read as the JSON text
    they hold, byte for byte, whatever their values are (objects, arrays, numbers): Spark's
    inferred types would drop explicit nulls and round big numbers. A line that is not a
    JSON object lands in :data:`CORRUPT`. CSV: a header line, RFC 4180 quoting ("" inside
    quotes), quoted fields may span lines, every column a text.
    """
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException
    from pyspark.sql.types import StringType, StructField, StructType

    try:
        if fmt == "parquet":
            return spark.read.parquet(path)
        if fmt == "csv":
            return spark.read.csv(path, header=True, escape='"', multiLine=True)
        inferred = spark.read.json(path, columnNameOfCorruptRecord=CORRUPT).schema
        fields = [StructField(f.name, StringType()) if f.name in raw_json else f for f in inferred]
        if CORRUPT not in inferred.names:
            fields.append(StructField(CORRUPT, StringType()))
        return spark.read.json(path, schema=StructType(fields), columnNameOfCorruptRecord=CORRUPT)
    except (PySparkException, Py4JError) as e:
        raise PipelineError(f"cannot read {path} as {fmt}: {spark_reason(e)}") from None


def _col(name: str) -> Column:
    """A top-level column by its exact name (dots and spaces included)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _kind(data_type: DataType) -> str:
    return data_type.simpleString()


def _json_text(df: DataFrame, name: str, what: str) -> Column:
    """A column as JSON text: a text column as it is, a struct, map or array as JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StringType, StructType

    data_type = df.schema[name].dataType
    if isinstance(data_type, StringType):
        return _col(name)
    if isinstance(data_type, StructType | MapType | ArrayType):
        # Explicit nulls stay in the JSON (Spark drops null fields by default).
        return F.to_json(_col(name), {"ignoreNullFields": "false"})
    raise PipelineError(
        f"column {name!r} ({what}) holds {_kind(data_type)}: it must hold JSON texts, "
        "or structs, maps or arrays"
    )


def _delay(df: DataFrame, name: str) -> Column:
    """Seconds as a double, a text for pgmb's delay parser, or a time as ISO text (UTC)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, StringType, TimestampNTZType, TimestampType

    data_type = df.schema[name].dataType
    if isinstance(data_type, NumericType):
        return _col(name).cast("double")
    if isinstance(data_type, StringType):
        return _col(name)
    if isinstance(data_type, TimestampType | TimestampNTZType):
        # The session's time zone is UTC (pgmb.pipeline.spark): a time without a zone is UTC.
        return F.date_format(_col(name).cast("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX")
    raise PipelineError(
        f"column {name!r} (--delay-column) holds {_kind(data_type)}: it must hold seconds "
        "(numbers), times (timestamps) or delays as text (30, 10m, 2026-12-01T10:00:00Z)"
    )


def _text(df: DataFrame, name: str, what: str) -> Column:
    from pyspark.sql.types import StringType

    data_type = df.schema[name].dataType
    if not isinstance(data_type, StringType):
        raise PipelineError(f"column {name!r} ({what}) holds {_kind(data_type)}, not text")
    return _col(name)


def prepare(df: DataFrame, columns: Columns, path: str, fmt: str, key: str | None) -> DataFrame:
    """The message columns of ``df`` (see :data:`~pgmb.pipeline.publish_rows.FIELDS`).

    ``key`` is the constant routing key when there is no key column.
    """
    from pyspark.sql import functions as F

    from .publish_rows import FIELDS

    present = set(df.columns)
    for name, option in columns.named():
        if name not in present:
            have = ", ".join(c for c in df.columns if c != CORRUPT)
            raise PipelineError(
                f"column {name!r} ({option}) is not in {path}; its columns: {have or 'none'}"
            )
    none = F.lit(None).cast("string")
    if columns.body_columns:
        body = F.to_json(
            F.struct(*[_col(c) for c in columns.body_columns]), {"ignoreNullFields": "false"}
        )
    else:
        assert columns.body is not None
        body = _json_text(df, columns.body, "--body-column")
    picked = {
        "id": _text(df, columns.id, "--id-column") if columns.id else none,
        "key": _text(df, columns.key, "--key-column") if columns.key else F.lit(key),
        "body": body,
        "headers": (
            _json_text(df, columns.headers, "--headers-column") if columns.headers else none
        ),
        "delay": _delay(df, columns.delay) if columns.delay else none,
        "pos": F.monotonically_increasing_id(),
        "corrupt": _col(CORRUPT) if fmt == "jsonl" else none,
        "file": F.col("_metadata.file_path"),
    }
    assert tuple(picked) == FIELDS
    return df.select(*[value.alias(name) for name, value in picked.items()])
