"""The SQL tests act as the application's role and as throwaway login roles."""

from tests.roles import login_role, owner  # noqa: F401
