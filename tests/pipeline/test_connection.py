"""libpq's connection settings, as libpq resolves them, become Spark's JDBC URL and
properties: TLS included, the database name encoded, the password nowhere it could be read.

The table runs each way of naming a database (connection strings, URIs, ``PG*`` variables,
a service file, a password file) through the builder against a PostgreSQL with TLS on.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from django.core.management import CommandError, call_command

from pgmb.errors import PipelineError
from pgmb.pipeline.jdbc_options import LIBPQ_TO_JDBC, NO_JDBC_EQUIVALENT, SYSTEM_CA_FACTORY
from pgmb.pipeline.postgres import CONNECT_TIMEOUT, Database

from .tls_cluster import ODD_DBNAME, TLSCluster

DRIVER = "org.postgresql.Driver"
PASSWORD = "pa55 w0rd:x"


@dataclass(frozen=True)
class Case:
    """A way of naming the database, and the JDBC URL path and properties it must give."""

    id: str
    dsn: Callable[[TLSCluster], str | None]
    env: Callable[[TLSCluster, Path], dict[str, str]]
    dbname: str
    props: Callable[[TLSCluster], dict[str, str]]
    files: Callable[[TLSCluster, Path], None] = field(default=lambda c, home: None)


def _service_file(cluster: TLSCluster, home: Path) -> None:
    (home / "services.conf").write_text(
        f"[shop]\nhost=127.0.0.1\nport={cluster.port}\nuser=postgres\ndbname=postgres\n"
        f"sslmode=require\nsslrootcert={cluster.ca}\n"
    )


def _password_file(cluster: TLSCluster, home: Path) -> None:
    passfile = home / "pgpass"
    escaped = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
    passfile.write_text(f"127.0.0.1:{cluster.port}:postgres:postgres:{escaped}\n")
    passfile.chmod(0o600)


def _pg_env(cluster: TLSCluster, home: Path) -> dict[str, str]:
    return {"PGHOST": "127.0.0.1", "PGPORT": str(cluster.port), "PGUSER": "postgres"}


CASES = [
    Case(
        "conninfo verify-full",
        lambda c: c.conninfo(dbname="postgres", sslmode="verify-full", sslrootcert=str(c.ca)),
        lambda c, home: {},
        "postgres",
        lambda c: {"sslmode": "verify-full", "sslrootcert": str(c.ca)},
    ),
    Case(
        "URI verify-ca, a database name to encode",
        lambda c: (
            f"postgresql://postgres@127.0.0.1:{c.port}/{quote(ODD_DBNAME, safe='')}"
            f"?sslmode=verify-ca&sslrootcert={quote(str(c.ca))}&application_name=nightly"
        ),
        lambda c, home: {},
        ODD_DBNAME,
        lambda c: {"sslmode": "verify-ca", "sslrootcert": str(c.ca), "ApplicationName": "nightly"},
    ),
    Case(
        "PGSSLMODE and PGSSLROOTCERT",
        lambda c: None,
        lambda c, home: {
            **_pg_env(c, home),
            "PGDATABASE": "postgres",
            "PGSSLMODE": "verify-full",
            "PGSSLROOTCERT": str(c.ca),
        },
        "postgres",
        lambda c: {"sslmode": "verify-full", "sslrootcert": str(c.ca)},
    ),
    Case(
        # libpq checks the certificate in "require" when given a CA; JDBC must too.
        "PGSERVICE, require with a CA",
        lambda c: None,
        lambda c, home: {"PGSERVICE": "shop", "PGSERVICEFILE": str(home / "services.conf")},
        "postgres",
        lambda c: {"sslmode": "verify-ca", "sslrootcert": str(c.ca)},
        _service_file,
    ),
    Case(
        "service= in the connection string",
        lambda c: "service=shop connect_timeout=7",
        lambda c, home: {"PGSERVICEFILE": str(home / "services.conf")},
        "postgres",
        lambda c: {"sslmode": "verify-ca", "sslrootcert": str(c.ca), "connectTimeout": "7"},
        _service_file,
    ),
    Case(
        "PGPASSFILE",
        lambda c: c.conninfo(dbname="postgres", sslmode="require"),
        lambda c, home: {"PGPASSFILE": str(home / "pgpass")},
        "postgres",
        lambda c: {"sslmode": "require", "password": PASSWORD},
        _password_file,
    ),
    Case(
        "~/.pgpass, no sslmode: libpq's default",
        lambda c: None,
        lambda c, home: {**_pg_env(c, home), "PGDATABASE": "postgres"},
        "postgres",
        lambda c: {"sslmode": "prefer", "password": PASSWORD},
        lambda c, home: (_password_file(c, home), (home / "pgpass").rename(home / ".pgpass")),
    ),
    Case(
        "sslmode=disable",
        lambda c: c.conninfo(dbname="postgres", sslmode="disable"),
        lambda c, home: {},
        "postgres",
        lambda c: {"sslmode": "disable"},
    ),
]


@pytest.fixture
def libpq_home(tmp_path, monkeypatch) -> Path:
    """No PG* variables, and a home of its own (no ~/.pgpass, no ~/.postgresql)."""
    for name in list(os.environ):
        if name.startswith("PG"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PGSYSCONFDIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_libpq_settings_become_the_jdbc_url_and_properties(
    case, tls_postgres, libpq_home, monkeypatch
):
    case.files(tls_postgres, libpq_home)
    for name, value in case.env(tls_postgres, libpq_home).items():
        monkeypatch.setenv(name, value)

    database = Database.from_dsn(case.dsn(tls_postgres)).resolved()

    assert database.jdbc_url == (
        f"jdbc:postgresql://127.0.0.1:{tls_postgres.port}/{quote(case.dbname, safe='')}"
    )
    assert database.jdbc_properties == {
        "driver": DRIVER,
        "user": "postgres",
        # The driver's own connect timeout, unless the settings name one.
        "connectTimeout": str(CONNECT_TIMEOUT),
        **case.props(tls_postgres),
    }
    # The password is a property only: not in the URL, not in repr or str.
    for shown in (database.jdbc_url, repr(database), str(database)):
        assert PASSWORD not in shown


def test_the_table_names_only_keywords_libpq_knows():
    import psycopg

    known = {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()}
    assert set(LIBPQ_TO_JDBC) <= known
    assert set(NO_JDBC_EQUIVALENT) <= known


def test_the_system_ca_store_is_the_jvms():
    database = Database.from_dsn("host=db.example dbname=x sslmode=verify-full sslrootcert=system")
    props = database.jdbc_properties
    assert props["sslfactory"] == SYSTEM_CA_FACTORY
    assert props["sslmode"] == "verify-full"
    assert "sslrootcert" not in props


@pytest.mark.parametrize(
    "option", ["sslcrl=/etc/crl.pem", "ssl_min_protocol_version=TLSv1.3", "channel_binding=require"]
)
def test_protection_jdbc_cannot_give_is_refused(option):
    with pytest.raises(PipelineError, match=f"sets {option}, which Spark's JDBC driver cannot"):
        _ = Database.from_dsn(f"host=db.example dbname=x {option}").jdbc_properties


def test_ipv6_hosts_and_several_hosts():
    assert Database.from_dsn("host=::1 port=5433 dbname=x").jdbc_url == (
        "jdbc:postgresql://[::1]:5433/x"
    )
    assert Database.from_dsn("host=a.example,b.example port=1,2 dbname=x").jdbc_url == (
        "jdbc:postgresql://a.example:1,b.example:2/x"
    )


# The password: never in repr, never on a command line, never in an error.


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_repr_and_str_hold_no_password():
    database = Database.from_dsn(
        "host=db.example port=6543 dbname=x user=u password=s3cret sslpassword=k3y"
    )
    for shown in (repr(database), str(database), repr([database])):
        assert "s3cret" not in shown
        assert "k3y" not in shown
    assert "u@db.example:6543/x" in repr(database)


def test_a_password_on_the_command_line_is_refused():
    secret = secrets.token_hex(8)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pgmb.pipeline", "stats", "--dsn"),
            f"postgresql://u:{secret}@127.0.0.1:{closed_port()}/x",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )
    assert done.returncode == 2
    assert "--dsn carries a password" in done.stderr
    assert "PGPASSWORD" in done.stderr
    assert secret not in done.stderr + done.stdout


def test_the_command_refuses_a_password_in_dsn_too(db):
    with pytest.raises(CommandError, match="--dsn carries a password") as raised:
        call_command("pgmb_pipeline", "stats", "--dsn", "host=127.0.0.1 password=s3cret")
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:s3cr%ZZet@db.example/x",  # libpq quotes the bad token
        "host=db.example user=u password=s3 cret",  # ... or the word after it
    ],
)
def test_a_bad_connection_string_does_not_echo_the_password(dsn):
    with pytest.raises(PipelineError, match="invalid database connection string") as raised:
        Database.from_dsn(dsn)
    assert "s3cr" not in str(raised.value)
    assert "cret" not in str(raised.value)


def test_a_failing_connection_does_not_show_the_password():
    secret = secrets.token_hex(8)
    database = Database.from_dsn(
        f"host=127.0.0.1 port={closed_port()} dbname=x user=u password={secret}"
    )
    with pytest.raises(PipelineError, match="cannot reach the database") as raised:
        database.connect()
    assert secret not in str(raised.value)


def test_a_publish_plan_and_its_failures_hold_no_password():
    from pgmb.pipeline.publish_rows import Plan, PublishFailed, write_partition

    secret = secrets.token_hex(8)
    dsn = f"host=127.0.0.1 port={closed_port()} dbname=x user=u password={secret}"
    plan = Plan(dsn=dsn, batch_size=1, has_id=True)
    assert secret not in repr(plan)
    with pytest.raises(PublishFailed, match="a partition failed after 0 of its rows") as raised:
        list(write_partition(iter([]), plan, progress=Counted()))
    assert secret not in str(raised.value)


class Counted:
    """A stand-in for the Spark accumulator write_partition adds its progress to."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, term: int) -> None:
        self.value += term


def test_an_unreachable_database_from_the_pg_variables_is_named(libpq_home, monkeypatch):
    port = closed_port()
    for name, value in {"PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": "ann"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PGDATABASE", "shop")
    with pytest.raises(PipelineError, match=f"cannot reach the database ann@127.0.0.1:{port}/shop"):
        Database.from_dsn(None).resolved()
