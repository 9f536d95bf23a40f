"""Spark's JDBC reads keep libpq's TLS settings: ``verify-full`` with a CA connects over TLS
to a server whose certificate that CA signed, and refuses one a wrong CA is given for."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgmb.errors import PipelineError
from pgmb.pipeline.postgres import Database
from pgmb.pipeline.spark import session

from .conftest import MASTER
from .tls_cluster import ODD_DBNAME

WHO = "SELECT current_database() AS db, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    spark = session("tls", MASTER, {}, None)
    yield spark
    spark.stop()


def read(spark, database: Database) -> list[tuple[str, bool]]:
    frame = (
        spark.read.format("jdbc")
        .option("url", database.jdbc_url)
        .options(**database.jdbc_properties)
        .option("query", WHO)
        .load()
    )
    return [(row.db, row.ssl) for row in frame.collect()]


def whole_error(error: BaseException) -> str:
    """A Spark error with its Java causes and stack trace."""
    parts: list[str] = []
    each: object = error
    while each is not None:
        parts += [str(each), str(getattr(each, "_stackTrace", "") or "")]
        each = getattr(each, "cause", None)
    return "\n".join(parts)


def command_lines() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # a process that ended meanwhile
    return found


@pytest.mark.spark
def test_verify_full_reads_over_tls_and_a_wrong_ca_is_refused(spark, tls_postgres):
    secret = secrets.token_hex(8)
    trusted = Database.from_dsn(
        tls_postgres.conninfo(
            dbname=ODD_DBNAME, sslmode="verify-full", sslrootcert=str(tls_postgres.ca)
        )
        + f" password={secret}"  # the server trusts any: it must only stay hidden
    ).resolved()

    assert read(spark, trusted) == [(ODD_DBNAME, True)]
    # The password went to the driver in-process: no command line on this machine (the
    # JVM's included) and no Spark setting holds it.
    assert not [line for line in command_lines() if secret in line]
    assert secret not in repr(spark.sparkContext.getConf().getAll())

    wrong = Database({**trusted.params, "sslrootcert": str(tls_postgres.wrong_ca)})
    with pytest.raises(Exception, match="Couldn't connect") as refused:
        read(spark, wrong)
    reason = whole_error(refused.value)
    assert "SSLHandshakeException" in reason, reason
    assert secret not in reason
    # libpq refuses it as well, so a job stops before Spark starts.
    with pytest.raises(PipelineError, match="cannot reach the database") as refused_early:
        Database.from_dsn(
            tls_postgres.conninfo(
                dbname="postgres", sslmode="verify-full", sslrootcert=str(tls_postgres.wrong_ca)
            )
        ).resolved()
    assert "certificate verify failed" in str(refused_early.value)
