"""The Spark session of a job: master, ``--conf`` pairs and the JDBC driver's jar.

``pyspark`` is imported here and only here, when a job starts, so that the rest of the
package (and Django) can be imported without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Debian's libpostgresql-jdbc-java puts PostgreSQL's JDBC driver here.
DEBIAN_JDBC_JAR = "/usr/share/java/postgresql.jar"
#: Environment variable naming the driver's jar when it lives elsewhere.
JDBC_JAR_ENV = "PGMB_JDBC_JAR"
DEFAULT_MASTER = "local[*]"


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", …]`` from ``--conf`` into a dict; a pair without ``=`` is an error."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"--conf {pair!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


def jdbc_jars(jars: str | None) -> str:
    """The jars to give Spark: ``--jars``, else ``$PGMB_JDBC_JAR``, else Debian's driver."""
    chosen = jars or os.environ.get(JDBC_JAR_ENV) or DEBIAN_JDBC_JAR
    for path in chosen.split(","):
        local = path.removeprefix("file://")
        if "://" not in local and not os.path.isfile(local):
            raise PipelineError(
                f"PostgreSQL's JDBC driver is not at {local} (install Debian's "
                f"libpostgresql-jdbc-java, or pass --jars or set {JDBC_JAR_ENV})"
            )
    return chosen


def session(app: str, master: str, conf: dict[str, str], jars: str | None) -> SparkSession:
    """A Spark session for one job; times are UTC so that day partitions are the same
    wherever the job runs."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PipelineError(
            "PySpark is not installed: install pgmb's [spark] extra (pyspark>=4.0)"
        ) from None
    # Python code on the executors (the publish job's partitions) runs in this very
    # interpreter, with its packages, unless PYSPARK_PYTHON or spark.pyspark.python names
    # another (as a cluster whose machines keep Python elsewhere must).
    os.environ.setdefault("PYSPARK_PYTHON", conf.get("spark.pyspark.python", sys.executable))
    builder = (
        SparkSession.builder.appName(f"pgmb {app}")
        .master(master)
        .config("spark.jars", jdbc_jars(jars))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(conf.get("spark.log.level", "WARN"))
    return spark
