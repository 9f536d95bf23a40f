"""Running PostgreSQL's pgbench on a custom script and reading back what it counted."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The custom scripts of bench/pgbench_publish.py.
SCRIPTS = Path(__file__).resolve().parent / "pgbench"


@functools.cache
def binary() -> str:
    """pgbench of the server's version: $PG_BINDIR, ``pg_config --bindir``, the newest install.

    The same search as scripts/pgcluster.sh, so that pgbench and the throwaway server are
    of one version; Debian's /usr/bin/pgbench is a wrapper that may pick another.
    """
    candidates = [os.environ.get("PG_BINDIR", "")]
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(found.stdout.strip())
    candidates += sorted(
        (str(p) for p in Path("/usr/lib/postgresql").glob("*/bin")),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p)],
        reverse=True,
    )
    for folder in filter(None, candidates):
        if os.access(Path(folder, "pgbench"), os.X_OK):
            return str(Path(folder, "pgbench"))
    raise FileNotFoundError("pgbench not found: set PG_BINDIR to PostgreSQL's bin folder")


def version() -> str:
    """What ``pgbench --version`` says, e.g. ``pgbench (PostgreSQL) 15.20 (Debian ...)``."""
    return subprocess.run([binary(), "--version"], capture_output=True, text=True).stdout.strip()


@dataclass(frozen=True)
class Outcome:
    transactions: int
    #: Transactions per second, without the connections' start (pgbench's own figure).
    tps: float


def run(
    script: str,
    database: str,
    clients: int,
    seconds: int,
    variables: dict[str, str],
) -> Outcome:
    """``pgbench -n -f SCRIPTS/script -c clients -j clients -T seconds -M prepared``.

    ``variables`` become ``-D name=value``. The connection is libpq's environment (PGHOST,
    PGPORT, ...).
    A failed transaction aborts pgbench, and that raises: a figure needs every one to pass.
    """
    command = [binary(), "-n", "-M", "prepared", "-f", str(SCRIPTS / script)]
    command += ["-c", str(clients), "-j", str(clients), "-T", str(seconds)]
    for name, value in variables.items():
        command += ["-D", f"{name}={value}"]
    done = subprocess.run([*command, database], capture_output=True, text=True)
    processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    tps = re.search(r"tps = ([\d.]+)", done.stdout)
    if done.returncode or not processed or not tps:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return Outcome(int(processed.group(1)), float(tps.group(1)))
