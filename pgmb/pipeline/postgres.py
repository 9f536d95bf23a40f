"""Where the pipeline's PostgreSQL is, for psycopg on the driver and JDBC in Spark.

A :class:`Database` comes from a libpq connection string or URI (``--dsn``), or from
libpq's ``PG*`` environment variables when none is given; ``manage.py pgmb_pipeline``
builds one from Django's ``DATABASES``. :meth:`Database.resolved` asks libpq itself what it
connected with (environment, service file, password file included), so that Spark's JDBC
reads and the executors' psycopg connections use the very same settings, TLS included
(:mod:`.jdbc_options`). The password never shows: not in ``repr``, not in a message, not in
the JDBC URL (it travels as a property, in-process). Decision records 0036 and 0037.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import PipelineError
from . import jdbc_options

#: Seconds the driver waits for the database before it gives up with a clear error.
CONNECT_TIMEOUT = 10
#: Keywords whose values are secrets: kept out of repr and scrubbed from messages.
SECRETS = ("password", "sslpassword")
#: Keywords that only point libpq at the files it read; what it read is carried instead,
#: so executors without those files connect the same way.
FILE_POINTERS = ("service", "servicefile", "passfile", "hostaddr")
#: What stands in for a quoted fragment of a connection string in libpq's parse errors.
_QUOTED = re.compile(r'"[^"]*"')


@dataclass(frozen=True, repr=False)
class Database:
    """Connection parameters (libpq keywords: host, port, dbname, user, password, …)."""

    params: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dsn(cls, dsn: str | None) -> Database:
        """Parse ``dsn`` with libpq; ``None`` or ``""`` leaves everything to libpq's
        environment variables, read when connecting (:meth:`resolved`)."""
        try:
            given = conninfo_to_dict(dsn or "")
        except psycopg.ProgrammingError as e:
            # libpq quotes the fragment it choked on, which may be part of a password.
            reason = _QUOTED.sub('"…"', str(e).strip())
            raise PipelineError(f"invalid database connection string: {reason}") from None
        return cls({k: str(v) for k, v in given.items() if v not in (None, "")})

    def __repr__(self) -> str:
        return f"Database({self.describe()})"

    __str__ = __repr__

    @property
    def has_password(self) -> bool:
        """Whether the connection string itself carries a password."""
        return bool(self.params.get("password"))

    @property
    def dsn(self) -> str:
        """The libpq connection string (with the password: do not print it)."""
        return make_conninfo(**self.params)

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/dbname``, without credentials or TLS settings."""
        return jdbc_options.jdbc_url(self.params)

    @property
    def jdbc_properties(self) -> dict[str, str]:
        """Spark JDBC options: the driver class, user, password and TLS settings."""
        return jdbc_options.jdbc_properties(self.params)

    def describe(self) -> str:
        """Where the database is, for messages (no password): what is not in the
        parameters is libpq's default (its ``PG*`` variables included)."""
        defaults = {
            o.keyword.decode(): o.val.decode()
            for o in psycopg.pq.Conninfo.get_defaults()
            if o.val is not None and o.keyword.decode() in ("host", "port", "user", "dbname")
        }
        p = {**defaults, **self.params}
        where = f"{p.get('host') or 'localhost'}:{p.get('port') or '5432'}"
        return f"{p.get('user', '')}@{where}/{p.get('dbname', '')}"

    def scrub(self, text: str) -> str:
        """``text`` without any of this connection's secrets."""
        for key in SECRETS:
            if secret := self.params.get(key):
                text = text.replace(secret, "***")
        return text

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection, or :class:`PipelineError` naming why there is none."""
        if "connect_timeout" not in self.params:
            kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
        try:
            return psycopg.connect(self.dsn, **kwargs)
        except psycopg.Error as e:
            text = str(e).strip()
            reason = text.splitlines()[-1] if text else type(e).__name__
            raise PipelineError(
                f"cannot reach the database {self.describe()}: {self.scrub(reason)}"
            ) from None

    def resolved(self) -> Database:
        """The settings libpq connected with: the connection string completed by the
        ``PG*`` variables, the service file (``PGSERVICE``) and the password file
        (``.pgpass``, ``PGPASSFILE``); one host, the one that answered."""
        with self.connect() as conn:
            info = conn.info
            params = {
                k: v for k, v in info.get_parameters().items() if k not in FILE_POINTERS and v
            }
            params.update(host=info.host, port=str(info.port), dbname=info.dbname)
            params["user"] = info.user
            if info.password:
                params["password"] = info.password
        return Database(params)

    def check(self) -> None:
        """Fail fast when the database is unreachable or pgmb is not migrated in it."""
        with self.connect() as conn:
            found = conn.execute("SELECT to_regclass('pgmb_message') IS NOT NULL").fetchone()
            if not found or not found[0]:
                raise PipelineError(
                    f"the database {self.describe()} has no pgmb tables (run manage.py migrate)"
                )
