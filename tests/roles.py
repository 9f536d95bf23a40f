"""Sessions of the application's role and of throwaway login roles, for the tests of who
may call what.

Each role is a real login role (the test cluster trusts local connections); its sessions
are real autocommit connections, as another program's would be.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django


@pytest.fixture
def owner() -> Iterator[psycopg.Connection]:
    """A session of the application's role (the owner of pgmb's tables and functions)."""
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
        yield conn


@pytest.fixture
def login_role(owner) -> Iterator[Callable[..., tuple[str, psycopg.Connection]]]:
    """Make a login role and a session of it; both are gone after the test."""
    made: list[tuple[str, psycopg.Connection]] = []

    def make(*member_of: str) -> tuple[str, psycopg.Connection]:
        name = f"r_{uuid.uuid4().hex[:12]}"
        owner.execute(f"CREATE ROLE {name} LOGIN")
        for group in member_of:
            owner.execute(f"GRANT {group} TO {name}")
        params = conninfo_from_django("default") | {"user": name}
        conn = psycopg.connect(**params, autocommit=True)
        made.append((name, conn))
        return name, conn

    yield make
    for name, conn in made:
        conn.close()
        owner.execute(f"DROP OWNED BY {name}")
        owner.execute(f"DROP ROLE {name}")
