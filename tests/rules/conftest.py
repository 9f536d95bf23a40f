"""The rules tests that publish as a real producer role use its sessions."""

from tests.roles import login_role, owner  # noqa: F401
