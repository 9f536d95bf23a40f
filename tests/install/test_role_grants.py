"""pgmb.may_grant_role, which migrate, check and pgmb.set_membership ask before handing out
a group role, against PostgreSQL's own verdict: one table of cases, each run through the
function and through a real GRANT, on the server's version (CREATEROLE alone lets a role
grant others' roles before PostgreSQL 16, not since)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django

# (case, the granting role's attribute, how the role to grant is made, verdict before 16,
# verdict since 16)
CASES = [
    ("plain role", "NOCREATEROLE", "by a superuser", False, False),
    ("member without admin option", "NOCREATEROLE", "granted to it", False, False),
    ("admin option", "NOCREATEROLE", "granted to it with admin option", True, True),
    ("createrole, a DBA's role", "CREATEROLE", "by a superuser", True, False),
    ("createrole, its own role", "CREATEROLE", "by itself", True, True),
    ("createrole, a superuser role", "CREATEROLE", "a superuser, by a superuser", False, False),
]


@pytest.fixture
def cluster_roles(db) -> Iterator[list[str]]:
    """Names of roles the test makes, dropped after it (most recent first)."""
    made: list[str] = []
    yield made
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as su:
        for name in reversed(made):
            su.execute(f"DROP OWNED BY {name}")
            su.execute(f"DROP ROLE {name}")


@pytest.mark.parametrize(
    ("attribute", "made", "before_16", "since_16"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_may_grant_role_is_postgresqls_verdict(cluster_roles, attribute, made, before_16, since_16):
    tag = uuid.uuid4().hex[:8]
    grantor, target, grantee = f"pgmb_g_{tag}", f"pgmb_t_{tag}", f"pgmb_e_{tag}"
    params = conninfo_from_django("default")
    with psycopg.connect(**params, autocommit=True) as su:
        su.execute(f"CREATE ROLE {grantor} LOGIN {attribute}")
        cluster_roles.append(grantor)
        su.execute(f"GRANT EXECUTE ON FUNCTION pgmb.may_grant_role(oid) TO {grantor}")
        if made != "by itself":
            superuser = "SUPERUSER" if made.startswith("a superuser") else ""
            su.execute(f"CREATE ROLE {target} NOLOGIN {superuser}")
            cluster_roles.append(target)
        if made == "granted to it":
            su.execute(f"GRANT {target} TO {grantor}")
        elif made == "granted to it with admin option":
            su.execute(f"GRANT {target} TO {grantor} WITH ADMIN OPTION")
        su.execute(f"CREATE ROLE {grantee} NOLOGIN")
        cluster_roles.append(grantee)
        version = su.info.server_version
    with psycopg.connect(**params | {"user": grantor}, autocommit=True) as conn:
        if made == "by itself":
            conn.execute(f"CREATE ROLE {target} NOLOGIN")
            cluster_roles.append(target)
        [(verdict,)] = conn.execute(
            "SELECT pgmb.may_grant_role(oid) FROM pg_roles WHERE rolname = %s", (target,)
        )
        try:
            conn.execute(f"GRANT {target} TO {grantee}")
            granted = True
        except psycopg.errors.InsufficientPrivilege:
            granted = False
    assert verdict == granted
    assert verdict == (before_16 if version < 160000 else since_16)
