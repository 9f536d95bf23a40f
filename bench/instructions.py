"""Instructions per published message, counted by callgrind: pgmb against PGMQ 1.5.1.

    scripts/with-cluster.sh .venv/bin/python bench/instructions.py [--against 0020]

Rates on this shared 2-core machine move with other people's work; the instructions a
statement executes do not. This counts them: in a scratch database set up as
bench/pgbench_publish.py sets up its own (the queues of bench/publish.py, its plain twin of
``pgmb_message``, PGMQ 1.5.1 loaded from its SQL), copied with ``pg_basebackup``, each case
runs in a single-user PostgreSQL under ``valgrind --tool=callgrind``, once with
``--small`` statements and once with ``--large``; the difference of the two counts over the
difference of messages is the count per message (starting and stopping the backend
cancel out). The statements are those of bench/pgbench/ (one source), with pgbench's
variables written in.

With ``--against MIGRATION`` a second database, migrated back to that pgmb migration, runs
the pgmb cases too: what the migrations since then cost, in the same run.

Single-user mode plans every statement (pgbench ``-M prepared`` plans each once): the
counts include parsing and planning the top-level statement, for every case alike.
Commits wait for no flush here either (``fsync`` counts no instructions). The exit status
is 1 if a statement failed or valgrind is missing, never for a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, pgbench_publish, pgbench_runner, publish  # noqa: E402

#: (label, script of bench/pgbench/, messages a statement, which database: pgmb or pgmq)
CASES = (
    ("plain INSERT", "plain_send.sql", 1, "plain"),
    ("pgmq.send()", "pgmq_send.sql", 1, "pgmq"),
    ("pgmb.send()", "pgmb_send.sql", 1, "pgmb"),
    ("plain INSERT ... SELECT 100", "plain_batch.sql", 100, "plain"),
    ("pgmq.send_batch(100)", "pgmq_batch.sql", 100, "pgmq"),
    ("pgmb INSERT ... SELECT 100", "pgmb_batch.sql", 100, "pgmb"),
)


def statements(script: str, count: int) -> str:
    """``count`` statements of a pgbench script, its variables written in."""
    text = (pgbench_runner.SCRIPTS / script).read_text()
    body = json.dumps(publish.order_event(1)).replace("'", "''")
    keys = "{" + ",".join(publish.ROUTING_KEYS) + "}"
    lines = [
        line for line in text.splitlines() if line.strip() and not line.startswith(("--", "\\"))
    ]
    statement = " ".join(lines).replace(":keys", f"'{keys}'").replace(":body", f"'{body}'")
    # Single-user mode ends a statement at the end of its line.
    return "".join(statement.replace(":k", str(1 + n % 3)) + "\n" for n in range(count))


def _owner_command(owner: str) -> list[str]:
    return ["runuser", "-u", owner, "--"] if os.geteuid() == 0 and owner != "root" else []


def copy_cluster(target: Path) -> tuple[Path, list[str]]:
    """A consistent copy of the running cluster; its folder and how to run as its owner."""
    with harness.connect() as conn:
        (data,) = conn.execute("SELECT current_setting('data_directory')").fetchone()
    owner = Path(data).owner()
    as_owner = _owner_command(owner)
    target.mkdir(parents=True)
    shutil.chown(target, owner)
    copy = target / "data"
    bindir = Path(pgbench_runner.binary()).parent
    subprocess.run(
        [*as_owner, str(bindir / "pg_basebackup"), "-D", str(copy), "-X", "stream", "-c", "fast"],
        check=True,
        capture_output=True,
        env={**os.environ, "PGDATABASE": "postgres"},
    )
    return copy, as_owner


def count(copy: Path, as_owner: list[str], database: str, sql_text: str, scratch: Path) -> int:
    """Instructions callgrind counts for a single-user backend running ``sql_text``."""
    script = scratch / "statements.sql"
    script.write_text(sql_text)
    script.chmod(0o644)
    postgres = Path(pgbench_runner.binary()).parent / "postgres"
    run = subprocess.run(
        [
            *as_owner,
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            str(postgres),
            "--single",
            "-D",
            str(copy),
            "-c",
            "shared_preload_libraries=",
            database,
        ],
        stdin=script.open(),
        capture_output=True,
        text=True,
    )
    if "ERROR:" in run.stdout or "ERROR:" in run.stderr:
        error = next(line for line in (run.stdout + run.stderr).splitlines() if "ERROR:" in line)
        raise RuntimeError(f"{database}: {error.strip()}")
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind failed ({run.returncode}): {run.stderr[-500:]}")
    return int(found.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=50, help="statements of the first run")
    parser.add_argument("--large", type=int, default=300, help="statements of the second run")
    parser.add_argument("--against", help="also count pgmb migrated back to this migration")
    parser.add_argument("--db", default="pgmb_bench_instructions", help="scratch database")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found (Debian package valgrind): nothing counted")
        return 1

    old_db = f"{args.db}_old"
    with harness.scratch_database(args.db):
        publish.set_up(0)
        failure = pgbench_publish.load_pgmq()
        if failure is not None:
            print(f"PGMQ did not load ({failure}): only pgmb and the plain table are counted")
        if args.against:
            from django.db import connections

            connections.close_all()
            with harness.connect(os.environ.get("PGDATABASE", "postgres")) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{old_db}"')
                admin.execute(f'CREATE DATABASE "{old_db}" TEMPLATE "{args.db}"')
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "migrate",
                    "pgmb",
                    args.against,
                    "-v",
                    "0",
                    "--skip-checks",
                ],
                check=True,
                env={**os.environ, "PGMB_BENCH_DB": old_db},
            )
        harness.print_machine(
            counted=f"valgrind --tool=callgrind, {args.small} and {args.large} statements a case",
            pgmq="1.5.1, loaded from bench/pgmq/pgmq.sql" if failure is None else "not loaded",
        )
        results: dict[str, float] = {}
        try:
            with tempfile.TemporaryDirectory() as scratch_name:
                scratch = Path(scratch_name)
                os.chmod(scratch, 0o755)
                copy, as_owner = copy_cluster(scratch / "cluster")
                runs = [(label, script, n, kind, args.db) for label, script, n, kind in CASES]
                if args.against:
                    runs += [
                        (f"{label}, at {args.against}", script, n, kind, old_db)
                        for label, script, n, kind in CASES
                        if kind == "pgmb"
                    ]
                for label, script, per_statement, kind, database in runs:
                    if kind == "pgmq" and failure is not None:
                        continue
                    small = count(copy, as_owner, database, statements(script, args.small), scratch)
                    large = count(copy, as_owner, database, statements(script, args.large), scratch)
                    messages = (args.large - args.small) * per_statement
                    results[label] = (large - small) / messages
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"\nFAILED: {exc}")
            return 1
        finally:
            if args.against:
                with harness.connect(os.environ.get("PGDATABASE", "postgres")) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{old_db}" WITH (FORCE)')

    print(f"\n{'instructions per message':44} {'count':>10} {'vs pgmq':>8} {'vs plain':>9}")
    for label, value in results.items():
        batch = "100" in label
        pgmq = results.get("pgmq.send_batch(100)" if batch else "pgmq.send()")
        plain = results.get("plain INSERT ... SELECT 100" if batch else "plain INSERT")
        ratio = f"{pgmq / value:8.2f}" if pgmq and "pgmq" not in label else " " * 8
        vs_plain = f"{plain / value:9.2f}" if plain and "plain" not in label else " " * 9
        print(f"  {label:42} {value:10,.0f} {ratio} {vs_plain}")
    print("\nratios: the baseline's count over the case's (above 1.0: fewer instructions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
