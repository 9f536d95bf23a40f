"""Reading PostgreSQL into Spark through its JDBC source, split into ranges of a column.

Spark reads ``numPartitions`` ranges of ``partitionColumn`` in parallel, each on its own
connection; the bounds only set the ranges' width (rows outside them fall into the first
and last ranges), so they come from a first query of the data to read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .postgres import Database

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Rows a JDBC read fetches per round trip (the driver's default, 0, fetches everything).
FETCH_SIZE = 10_000


def subquery(statement: str, alias: str) -> str:
    """A SELECT as Spark's ``dbtable`` option takes it: ``(statement) AS alias``."""
    return f"({statement}) AS {alias}"


def read_ranges(
    spark: SparkSession,
    database: Database,
    table: str,
    column: str,
    low: int,
    high: int,
    partitions: int,
) -> DataFrame:
    """``table`` (a name or :func:`subquery`) read as ``partitions`` ranges of the integer
    ``column`` between ``low`` and ``high``."""
    return (
        spark.read.format("jdbc")
        .option("url", database.jdbc_url)
        .options(**database.jdbc_properties)
        .option("dbtable", table)
        .option("partitionColumn", column)
        .option("lowerBound", str(low))
        .option("upperBound", str(high))
        .option("numPartitions", str(partitions))
        .option("fetchsize", str(FETCH_SIZE))
        .load()
    )


def read_whole(spark: SparkSession, database: Database, table: str) -> DataFrame:
    """``table`` (a name or :func:`subquery`) read by one task."""
    return (
        spark.read.format("jdbc")
        .option("url", database.jdbc_url)
        .options(**database.jdbc_properties)
        .option("dbtable", table)
        .option("fetchsize", str(FETCH_SIZE))
        .load()
    )
