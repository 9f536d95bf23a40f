"""Instructions per message published or consumed, counted by callgrind: pgmb against a
plain table and PGMQ.

    scripts/with-cluster.sh .venv/bin/python bench/instructions.py [--against MIGRATION]
        [--pgmq-sql path/to/pgmq.sql]

Rates on this shared 2-core machine move with other people's work; the instructions a
statement executes do not. This counts them: in a scratch database set up as
bench/pgbench_publish.py sets up its own (the queues of bench/publish.py, its plain twin of
``pgmb_message``, PGMQ when its SQL is given: ``--pgmq-sql`` or ``$PGMQ_SQL``, see
bench/pgmq_sql.py), copied with ``pg_basebackup``, each case
runs in a single-user PostgreSQL under ``valgrind --tool=callgrind``, once with
``--small`` statements and once with ``--large``; the difference of the two counts over the
difference of messages is the count per message (starting and stopping the backend
cancel out). The statements are those of bench/pgbench/ (one source), with pgbench's
variables written in.

With ``--against MIGRATION`` a second database, migrated back to that pgmb migration, runs
the pgmb cases too: what the migrations since then cost, in the same run.

The cases: one message per statement (a plain INSERT, ``pgmq.send``, ``pgmb.send``),
batches of 100, and consuming a queue (a plain table's ``DELETE`` of 100, ``read``(100) +
``delete`` of PGMQ and of a pgmb pull queue with and without its history, and PGMQ's
``read`` + ``archive``), as bench/pgbench_publish.py and bench/pull.py run them with
pgbench. Without PGMQ its cases are left out and the output says so.

Single-user mode plans every statement (pgbench ``-M prepared`` plans each once): the
counts include parsing and planning the top-level statement, for every case alike. A
commit's flush takes time but few instructions: a ratio of counts is a ratio of CPU work,
not of throughput. The exit status is 1 if a statement failed or valgrind is missing,
never for a ratio.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, pgbench_publish, pgbench_runner, pgmq_sql, publish, pull  # noqa: E402


@dataclass(frozen=True)
class Case:
    label: str
    #: A script of bench/pgbench/ (pgbench's variables are written in).
    script: str
    #: Messages a statement publishes or consumes.
    messages: int
    #: The cases whose counts this one's are held against (PGMQ's, the plain table's).
    baseline: str | None = None
    plain: str | None = None
    #: Counted again in the database of ``--against``.
    again: bool = False
    #: Consumes a pgmb pull queue: counted again if ``--against`` has them (0023 on).
    pull: bool = False
    #: pgbench variables of this case beyond the body and the keys (written in first).
    variables: tuple[tuple[str, str], ...] = ()


CASES = (
    Case("plain INSERT", "plain_send.sql", 1),
    Case("pgmq.send()", "pgmq_send.sql", 1, plain="plain INSERT"),
    Case("pgmb.send()", "pgmb_send.sql", 1, "pgmq.send()", "plain INSERT", again=True),
    # Unique while live (docs/decisions/0090-unique-while-live.md): a key nothing holds, and
    # one a live delivery holds (all but the first statement skip), against a send without.
    Case("pgmb.send_unique(), new key", "pgmb_send_unique.sql", 1, "pgmb.send()"),
    Case("pgmb.send_unique(), live key", "pgmb_send_unique_skip.sql", 1, "pgmb.send()"),
    Case("plain INSERT ... SELECT 100", "plain_batch.sql", 100),
    Case("pgmq.send_batch(100)", "pgmq_batch.sql", 100, plain="plain INSERT ... SELECT 100"),
    Case(
        "pgmb INSERT ... SELECT 100",
        "pgmb_batch.sql",
        100,
        "pgmq.send_batch(100)",
        "plain INSERT ... SELECT 100",
        again=True,
    ),
    # pgmb's design limit for a batch (bench/pgbench_publish.py): its rows, one statement.
    Case("limit: rows of 100 routed", "limit_batch.sql", 100, plain="plain INSERT ... SELECT 100"),
    *(
        case
        for k in pgbench_publish.FANOUTS
        for case in (
            Case(
                f"pgmq.send() to {k} queues",
                "pgmq_send_fanout.sql",
                1,
                variables=(("k", str(k)),),
            ),
            Case(
                f"pgmb.send() routed to {k} queues",
                "pgmb_send_fanout.sql",
                1,
                f"pgmq.send() to {k} queues",
                again=True,
                variables=(("k", str(k)), ("fankey", pgbench_publish.FANOUT_KEY.format(k=k))),
            ),
        )
    ),
    Case("plain DELETE 100 (SKIP LOCKED)", "plain_read_delete.sql", 100),
    Case("pgmq.read(100) + delete", "pgmq_read_delete.sql", 100),
    Case("pgmq.read(100) + archive", "pgmq_read_archive.sql", 100, "pgmq.read(100) + delete"),
    Case(
        "pgmb.read(100) + delete",
        "pgmb_read_delete.sql",
        100,
        "pgmq.read(100) + delete",
        "plain DELETE 100 (SKIP LOCKED)",
        pull=True,
    ),
    Case(
        "pgmb.read(100) + delete, no history",
        "pgmb_read_delete_no_history.sql",
        100,
        "pgmq.read(100) + delete",
        "plain DELETE 100 (SKIP LOCKED)",
    ),
)


def statements(case: Case, count: int) -> str:
    """``count`` statements of a case's pgbench script, its variables written in."""
    text = (pgbench_runner.SCRIPTS / case.script).read_text()
    body = json.dumps(publish.order_event(1)).replace("'", "''")
    keys = "{" + ",".join(publish.ROUTING_KEYS) + "}"
    lines = [
        line for line in text.splitlines() if line.strip() and not line.startswith(("--", "\\"))
    ]
    statement = " ".join(lines).replace(":keys", f"'{keys}'").replace(":body", f"'{body}'")
    statement = statement.replace(":queue", f"'{os.environ.get('PGMB_BENCH_ORDER_QUEUE', '')}'")
    for name, value in sorted(case.variables, key=lambda item: -len(item[0])):
        statement = statement.replace(f":{name}", value if value.isdigit() else f"'{value}'")
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


def _copy_back(migration: str | None, database: str, copy: str) -> None:
    """``copy``: a copy of ``database`` migrated back to pgmb's ``migration`` (if any)."""
    if not migration:
        return
    from django.db import connections

    connections.close_all()
    with harness.connect(os.environ.get("PGDATABASE", "postgres")) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{copy}"')
        admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{database}"')
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "pgmb", migration, "-v", "0", "--skip-checks"],
        check=True,
        env={**os.environ, "PGMB_BENCH_DB": copy},
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=50, help="statements of the first run")
    parser.add_argument("--large", type=int, default=300, help="statements of the second run")
    parser.add_argument("--against", help="also count pgmb migrated back to this migration")
    parser.add_argument("--db", default="pgmb_bench_instructions", help="scratch database")
    pgmq_sql.add_argument(parser)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found (Debian package valgrind): nothing counted")
        return 1

    old_db = f"{args.db}_old"
    with harness.scratch_database(args.db):
        os.environ["PGMB_BENCH_ORDER_QUEUE"] = publish.set_up(0)
        pgbench_publish.set_up_limit_and_fanout(with_pgmq=False)
        # The pull cases' queues, filled for both runs of each (PGMQ's two share one); before
        # the copy for --against only if that migration has pull queues (0023 on).
        pull_again = bool(args.against) and args.against[:4] >= "0023"
        if not pull_again:
            _copy_back(args.against, args.db, old_db)
        pull.set_up()
        with_pgmq = args.pgmq_sql is not None
        if with_pgmq and (failure := pgmq_sql.load(args.pgmq_sql)):
            print(f"FAILED: PGMQ from {args.pgmq_sql} did not load: {failure}")
            return 1
        if with_pgmq:
            with harness.connect() as conn:
                for n in range(1, max(pgbench_publish.FANOUTS) + 1):
                    conn.execute("SELECT pgmq.create(%s)", (f"f{n}",))
        size = 2 * (args.small + args.large) * pull.BATCH + 1000
        body = json.dumps(publish.order_event(1))
        with harness.connect() as conn:
            kinds = ("plain", "pgmb", "pgmb_bare")
            for kind in (*kinds, "pgmq") if with_pgmq else kinds:
                conn.execute(pull.CASES[kind][2], {"n": size, "body": body})
            conn.execute("VACUUM ANALYZE")
        if pull_again:
            _copy_back(args.against, args.db, old_db)
        harness.print_machine(
            counted=f"valgrind --tool=callgrind, {args.small} and {args.large} statements a case",
            pgmq=pgmq_sql.describe(args.pgmq_sql),
        )
        results: dict[str, float] = {}
        try:
            with tempfile.TemporaryDirectory() as scratch_name:
                scratch = Path(scratch_name)
                os.chmod(scratch, 0o755)
                copy, as_owner = copy_cluster(scratch / "cluster")
                runs = [(case, case.label, args.db) for case in CASES]
                if args.against:
                    runs += [
                        (case, f"{case.label}, at {args.against}", old_db)
                        for case in CASES
                        if case.again or (case.pull and pull_again)
                    ]
                for case, label, database in runs:
                    if not with_pgmq and case.script.startswith("pgmq"):
                        continue
                    small, large = (
                        count(copy, as_owner, database, statements(case, n), scratch)
                        for n in (args.small, args.large)
                    )
                    results[label] = (large - small) / ((args.large - args.small) * case.messages)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"\nFAILED: {exc}")
            return 1
        finally:
            if args.against:
                with harness.connect(os.environ.get("PGDATABASE", "postgres")) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{old_db}" WITH (FORCE)')

    print(f"\n{'instructions per message':44} {'count':>10} {'vs pgmq':>8} {'vs plain':>9}")
    cases = {case.label: case for case in CASES}
    for label, value in results.items():
        case = cases[label.split(", at ")[0]]
        pgmq = results.get(case.baseline or "")
        plain = results.get(case.plain or "")
        ratio = f"{pgmq / value:8.2f}" if pgmq else " " * 8
        vs_plain = f"{plain / value:9.2f}" if plain else " " * 9
        print(f"  {label:42} {value:10,.0f} {ratio} {vs_plain}")
    print("\nratios: the baseline's count over the case's (above 1.0: fewer instructions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
