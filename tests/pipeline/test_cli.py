"""The pipeline's command line before Spark starts: bad options and an unreachable database
end the run with one line and status 2, having touched nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from pgmb.errors import PipelineError
from pgmb.pipeline.postgres import Database
from pgmb.pipeline.spark import jdbc_jars, parse_conf


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pipeline(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgmb.pipeline", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )


def test_unreachable_database_is_one_line_and_status_2():
    port = closed_port()
    done = pipeline("stats", "--dsn", f"host=127.0.0.1 port={port} dbname=x user=u")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pgmb.pipeline stats: error: cannot reach the database")
    assert f"u@127.0.0.1:{port}/x" in lines[0]


def test_a_database_without_pgmb_is_refused(db):
    from django.db import connection

    s = connection.settings_dict
    done = pipeline(
        "stats", "--dsn", f"host={s['HOST']} port={s['PORT']} user={s['USER']} dbname=postgres"
    )
    assert done.returncode == 2
    assert "has no pgmb tables (run manage.py migrate)" in done.stderr


def test_invalid_connection_string():
    with pytest.raises(PipelineError, match="invalid database connection string"):
        Database.from_dsn("host='db.example")


def test_password_stays_out_of_the_url_and_the_messages():
    database = Database.from_dsn("postgresql://ann:s3cret@db.example:6543/shop")
    assert database.jdbc_url == "jdbc:postgresql://db.example:6543/shop"
    assert database.jdbc_properties["password"] == "s3cret"
    assert "s3cret" not in database.describe()


def test_a_socket_folder_cannot_be_used_by_jdbc():
    with pytest.raises(PipelineError, match="Unix socket folder"):
        _ = Database.from_dsn("host=/var/run/postgresql dbname=x").jdbc_url


@pytest.mark.parametrize("pair", ["novalue", "=v", " =v"])
def test_conf_pairs_need_a_key_and_an_equals_sign(pair):
    with pytest.raises(PipelineError, match="expected KEY=VALUE"):
        parse_conf([pair])


def test_conf_pairs():
    assert parse_conf(["spark.a=1", "spark.b=x=y"]) == {"spark.a": "1", "spark.b": "x=y"}


def test_a_missing_jdbc_jar_is_named(tmp_path):
    missing = tmp_path / "nope.jar"
    with pytest.raises(PipelineError, match=f"not at {missing}"):
        jdbc_jars(str(missing))


def test_the_command_reports_an_unknown_alias(db):
    with pytest.raises(CommandError, match="no database 'nope'"):
        call_command("pgmb_pipeline", "--database", "nope", "stats")
