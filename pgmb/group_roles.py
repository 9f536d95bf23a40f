"""The three group roles (``pgmb_producer``, ``pgmb_consumer``, ``pgmb_admin``) in one
database as the application's role sees them, and the statements a DBA runs for what it
lacks (docs/access.md). Read from the catalogs only, so any role may ask: a managed
service's owner role has neither CREATEROLE nor ADMIN OPTION on roles a DBA made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import sql

#: The roles pgmb's grant functions hand out (``pgmb.grant_publish_access``,
#: ``pgmb.grant_queue_access``): the owner needs ADMIN OPTION on them.
HANDED_OUT = ("pgmb_producer", "pgmb_consumer")


@dataclass(frozen=True, slots=True)
class GroupRole:
    name: str
    present: bool  # the role exists in the cluster
    applied: bool  # pgmb's grants were given to it (pgmb.apply_access)
    grantable: bool  # the asking role may grant it to others (pgmb.may_grant_role)


@dataclass(frozen=True, slots=True)
class RoleState:
    owner: str  # the asking role, as an SQL identifier
    roles: tuple[GroupRole, ...]

    def missing(self) -> list[str]:
        return [r.name for r in self.roles if not r.present]

    def not_applied(self) -> list[str]:
        return [r.name for r in self.roles if r.present and not r.applied]

    def not_grantable(self) -> list[str]:
        """The roles the owner hands out but may not, of those that exist."""
        return [
            r.name for r in self.roles if r.present and not r.grantable and r.name in HANDED_OUT
        ]

    def create_statements(self) -> str:
        """What a DBA runs for the missing roles, then the owner."""
        missing = self.missing()
        handed = [name for name in missing if name in HANDED_OUT]
        creates = " ".join(f"CREATE ROLE {name} NOLOGIN;" for name in missing)
        grant = f" GRANT {', '.join(handed)} TO {self.owner} WITH ADMIN OPTION;" if handed else ""
        return (
            f"A DBA runs: {creates}{grant} Then, as {self.owner}: SELECT pgmb.install_access(); "
            "(docs/access.md)"
        )

    def admin_option_statement(self) -> str:
        names = ", ".join(self.not_grantable())
        return (
            f"A DBA (a superuser, or a role with ADMIN OPTION on them) runs: GRANT {names} TO "
            f"{self.owner} WITH ADMIN OPTION; (docs/access.md)"
        )


def role_state(cursor: Any) -> RoleState:
    cursor.execute(sql.query("access.sql", "group_roles"))
    rows = cursor.fetchall()
    return RoleState(owner=rows[0][4], roles=tuple(GroupRole(*row[:4]) for row in rows))
