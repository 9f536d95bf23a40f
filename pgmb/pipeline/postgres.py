"""Where the pipeline's PostgreSQL is, for psycopg on the driver and JDBC in Spark.

A :class:`Database` comes from a libpq connection string or URI (``--dsn``), or from
libpq's ``PG*`` environment variables when none is given; ``manage.py pgmb_pipeline``
builds one from Django's ``DATABASES``. The password travels to Spark as a JDBC property,
never inside the URL that Spark may log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import PipelineError

#: Seconds the driver waits for the database before it gives up with a clear error.
CONNECT_TIMEOUT = 10


@dataclass(frozen=True)
class Database:
    """Connection parameters (libpq keywords: host, port, dbname, user, password, …)."""

    params: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dsn(cls, dsn: str | None) -> Database:
        """Parse ``dsn``; with ``None`` or ``""``, use libpq's environment variables."""
        try:
            given = conninfo_to_dict(dsn or "")
        except psycopg.ProgrammingError as e:
            raise PipelineError(f"invalid database connection string: {e}") from None
        env = {
            "host": "PGHOST",
            "port": "PGPORT",
            "dbname": "PGDATABASE",
            "user": "PGUSER",
            "password": "PGPASSWORD",
        }
        params = {k: os.environ[v] for k, v in env.items() if os.environ.get(v)}
        params.update({k: str(v) for k, v in given.items() if v not in (None, "")})
        return cls(params)

    @property
    def dsn(self) -> str:
        """The libpq connection string (with the password: do not print it)."""
        return make_conninfo(**self.params)

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/dbname`` (TCP: JDBC cannot use a Unix socket)."""
        host = self.params.get("host") or "localhost"
        if host.startswith("/"):
            raise PipelineError(
                f"database host {host!r} is a Unix socket folder; Spark's JDBC driver "
                "needs a TCP host (set host=127.0.0.1 or a name)"
            )
        port = self.params.get("port") or "5432"
        dbname = self.params.get("dbname") or self.params.get("user") or ""
        return f"jdbc:postgresql://{host}:{port}/{dbname}"

    @property
    def jdbc_properties(self) -> dict[str, str]:
        """Spark JDBC options: the driver class, user and password."""
        props = {"driver": "org.postgresql.Driver"}
        if self.params.get("user"):
            props["user"] = self.params["user"]
        if self.params.get("password"):
            props["password"] = self.params["password"]
        return props

    def describe(self) -> str:
        """Where the database is, for messages (no password)."""
        p = self.params
        where = f"{p.get('host', 'localhost')}:{p.get('port', '5432')}"
        return f"{p.get('user', '')}@{where}/{p.get('dbname', '')}"

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection, or :class:`PipelineError` naming why there is none."""
        try:
            return psycopg.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT, **kwargs)
        except psycopg.OperationalError as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise PipelineError(f"cannot reach the database {self.describe()}: {reason}") from None

    def check(self) -> None:
        """Fail fast when the database is unreachable or pgmb is not migrated in it."""
        with self.connect() as conn:
            found = conn.execute("SELECT to_regclass('pgmb_message') IS NOT NULL").fetchone()
            if not found or not found[0]:
                raise PipelineError(
                    f"the database {self.describe()} has no pgmb tables (run manage.py migrate)"
                )
