"""A database owned by a role that is not a superuser, as a managed service gives one
(RDS, Cloud SQL, Azure): no pg_read_all_settings, CREATEROLE or not; and the cluster's
group roles pgmb_producer, pgmb_consumer and pgmb_admin there beforehand or not.

Everything here is real: the roles are made in the test cluster and dropped after, and
``manage.py`` runs in a subprocess that connects as the owner role.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django
from tests.roles import login_role, owner  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
GROUP_ROLES = ("pgmb_producer", "pgmb_consumer", "pgmb_admin")


def conninfo(dbname: str, user: str | None = None) -> dict:
    params = conninfo_from_django("default") | {"dbname": dbname}
    return params | {"user": user} if user else params


@pytest.fixture
def superuser() -> Iterator[psycopg.Connection]:
    """A session of the cluster's superuser (the test settings' role), in database postgres."""
    with psycopg.connect(**conninfo("postgres"), autocommit=True) as conn:
        yield conn


@dataclass
class OwnedDatabase:
    """A new database and its owner role; ``manage`` runs manage.py as that role there
    (or as another, such as the cluster's superuser acting as the DBA)."""

    name: str
    owner: str
    made_roles: list[str]

    def connect(self, user: str | None = None) -> psycopg.Connection:
        return psycopg.connect(**conninfo(self.name, user or self.owner), autocommit=True)

    def as_superuser(self) -> psycopg.Connection:
        return psycopg.connect(**conninfo(self.name), autocommit=True)

    def manage(
        self, *args: str, ok: bool = True, user: str | None = None
    ) -> subprocess.CompletedProcess:
        """manage.py ARGS, connecting as the owner (or as ``user``: a DBA's own role)."""
        env = {
            **os.environ,
            "PGUSER": user or self.owner,
            "PGMB_DB_NAME": self.name,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        result = subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if ok:
            assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stderr}"
        return result

    def login_role(self) -> str:
        """A login role with no privilege, dropped after the test."""
        name = f"pgmb_t_{uuid.uuid4().hex[:10]}"
        with self.as_superuser() as conn:
            conn.execute(f"CREATE ROLE {name} LOGIN")
        self.made_roles.append(name)
        return name


@pytest.fixture
def owned_database(superuser) -> Iterator[Callable[..., OwnedDatabase]]:
    """make(createrole=False): a database owned by a new login role that is not a superuser;
    the database, the roles made for the test and the owner are dropped after."""
    made: list[OwnedDatabase] = []

    def make(*, createrole: bool = False) -> OwnedDatabase:
        tag = uuid.uuid4().hex[:10]
        owned = OwnedDatabase(f"pgmb_owned_{tag}", f"pgmb_owner_{tag}", [])
        superuser.execute(
            f"CREATE ROLE {owned.owner} LOGIN {'CREATEROLE' if createrole else 'NOCREATEROLE'}"
        )
        superuser.execute(f"CREATE DATABASE {owned.name} OWNER {owned.owner}")
        made.append(owned)
        return owned

    yield make
    for owned in made:
        superuser.execute(f'DROP DATABASE IF EXISTS "{owned.name}" WITH (FORCE)')
        for role in [*owned.made_roles, owned.owner]:
            # What the owner granted (memberships, since PostgreSQL 16 its own grants
            # depend on it), then the role.
            superuser.execute(f"DROP OWNED BY {role}")
            superuser.execute(f"DROP ROLE {role}")


@pytest.fixture(params=["roles there", "no roles"])
def group_roles(request, superuser) -> Iterator[bool]:
    """The group roles exist before migrating ("roles there": made by a superuser, as a DBA
    would) or not ("no roles": those of the cluster are renamed for the test, and put back
    after; those the test's owner or its DBA made are dropped). Yields whether they exist.
    A test asks for it before ``owned_database``, whose database holds grants to them and
    must be dropped first."""
    there = request.param == "roles there"
    existing = {
        name
        for (name,) in superuser.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(GROUP_ROLES),)
        )
    }
    away = f"_away_{uuid.uuid4().hex[:8]}"
    made = []
    for name in GROUP_ROLES:
        if there and name not in existing:
            superuser.execute(f"CREATE ROLE {name} NOLOGIN")
            made.append(name)
        elif not there and name in existing:
            superuser.execute(f"ALTER ROLE {name} RENAME TO {name}{away}")
    try:
        yield there
    finally:
        for name in GROUP_ROLES:
            if not there or name in made:
                superuser.execute(f"DROP ROLE IF EXISTS {name}")
            if not there and name in existing:
                superuser.execute(f"ALTER ROLE {name}{away} RENAME TO {name}")
