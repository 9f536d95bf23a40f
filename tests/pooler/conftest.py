"""A real PgBouncer in transaction mode in front of the test cluster.

Started once for the layer from Debian's ``pgbouncer`` binary (``make test`` installs it),
with a configuration of its own in a temporary folder: trust authentication of the cluster's
user, ``pool_mode = transaction``, a pool of :data:`POOL_SIZE` server connections, on a free
port of 127.0.0.1. The layer is skipped, saying why, where the binary is absent.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.waiting import wait_until

#: Server connections per database and user: few, so that clients share them (what a
#: client leaves on one, the next client meets).
POOL_SIZE = 2


@dataclass(frozen=True)
class Bouncer:
    port: int
    log: Path

    def conninfo(self, dbname: str) -> dict[str, object]:
        """A plain client's connection arguments (prepared statements off, as a pooler
        needs of every client)."""
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "dbname": dbname,
            "user": os.environ.get("PGUSER", "postgres"),
            "prepare_threshold": None,
        }


def _binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup, django_db_blocker) -> Iterator[Bouncer]:
    binary = _binary()
    if binary is None:
        pytest.skip("the pgbouncer binary is absent (apt-get install pgbouncer; make test does)")
    # PgBouncer refuses to run as root: then it runs as the cluster's "postgres" user, and
    # its folder must be that user's.
    user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="pgmb-pgbouncer."))
    folder.chmod(0o755)
    port = _free_port()
    pg_user = os.environ.get("PGUSER", "postgres")
    (folder / "users.txt").write_text(f'"{pg_user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={os.environ.get("PGHOST", "127.0.0.1")} port={os.environ.get("PGPORT", "5432")}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = {folder / "pgbouncer.log"}
"""
    )
    if user is not None:
        uid = pwd.getpwnam(user).pw_uid
        for path in (folder, *folder.iterdir()):
            os.chown(path, uid, -1)
    proc = subprocess.Popen(
        [binary, str(folder / "pgbouncer.ini")],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    bouncer = Bouncer(port, folder / "pgbouncer.log")

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            psycopg.connect(**bouncer.conninfo("postgres"), autocommit=True).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_until(answers, message="pgbouncer to accept connections")
        yield bouncer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
