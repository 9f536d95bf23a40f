"""Django Tasks: pgmb's backend against django-tasks-db and procrastinate, each against its
own design limit.

    scripts/with-cluster.sh .venv-bench/bin/python bench/tasks.py [--tasks 1000]
        [--rounds 2] [--seconds 5] [--processes 1,2,4] [--json]

The peers are benchmark-only dependencies, installed beside pgmb in a virtualenv of their
own (bench/requirements-tasks.txt, docs/benchmarks.md): django-tasks-db (its ``db_worker``)
and procrastinate (its Django app, ``manage.py procrastinate worker --concurrency 1``). One
that is not installed is left out, and the output says so; pgmb alone is held against its
design limit only.

Each system is a Django project of its own (bench/tasks_settings.py) on a database of its
own of the same cluster, migrated by its own migrations, with the same no-op task
(bench/tasks_noop.py: it appends ``<n> <start time>`` to a file of its worker process, and
nothing to the database). A client process per system (bench/tasks_systems.py) enqueues
through the system's own API; workers are the systems' own commands, started as
subprocesses. A round of one system, the systems' order rotating between rounds:

* **enqueue**: ``--tasks`` tasks, one ``enqueue`` (procrastinate: ``defer``) per
  ``transaction.atomic()``, timed by the client;
* **bulk**: ``--batches`` transactions of 100 enqueues each, timed by the client;
* **run**: one worker process started on the queue those filled; tasks per second
  between the first task's start and the last one's (the worker's start-up is not
  counted), the system's own records then waited for (every task finished);
* **latency**: the same worker, now idle-waiting, gets one task per transaction every
  ``--pause`` seconds for ``--seconds``; latency = the task's start - its enqueue's commit
  (both ``time.time()`` of this machine); p50 and p99 of the round;
* **limit**: the same rows by plain statements into trigger-less copies of its tables
  (bench/tasks_systems.py says which): ``--tasks`` one per transaction, the bulk's
  100 per statement, then claimed and finished one task at a time, two statements each.

Then pgmb alone, ``--processes`` worker processes (1, 2, 4) on ``--tasks`` tasks enqueued
in bulk, the counts alternating between rounds: tasks per second over the window in which
every process was running tasks.

Figures are the best of the rounds (rates: highest; latencies: lowest); ratios best
against best. pg_stat_statements, when the server preloads it, gives each system's
statements per task run (``--statements``). The exit status is 1 when a task was lost,
ran twice (no task comes near its lease), failed, or a worker did not run, never for a
missed ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.tasks_systems import BATCH  # noqa: E402

SYSTEMS = ("pgmb", "django_tasks_db", "procrastinate")
LABELS = {"pgmb": "pgmb", "django_tasks_db": "django-tasks-db", "procrastinate": "procrastinate"}
#: The module each system needs beyond pgmb's own dependencies.
MODULES = {"pgmb": "django", "django_tasks_db": "django_tasks_db", "procrastinate": "procrastinate"}
#: Each system's worker, one process: its own management command.
WORKERS = {
    "pgmb": ["pgmb_tasks_worker"],
    # --no-startup-delay: no random sleep before its first poll (a herd of workers' remedy).
    "django_tasks_db": ["db_worker", "--no-startup-delay"],
    "procrastinate": ["procrastinate", "worker", "--concurrency", "1"],
}
#: Per system: (finished, failed, not finished) tasks of its own records.
STATE_SQL = {
    "pgmb": (
        "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'),"
        " count(*) FILTER (WHERE status = 'FAILED'),"
        " (SELECT count(*) FROM pgmb_delivery) FROM pgmb_task_result"
    ),
    "django_tasks_db": (
        "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'),"
        " count(*) FILTER (WHERE status = 'FAILED'),"
        " count(*) FILTER (WHERE status IN ('READY', 'RUNNING'))"
        " FROM django_tasks_database_dbtaskresult"
    ),
    "procrastinate": (
        "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
        " count(*) FILTER (WHERE status IN ('failed', 'cancelled', 'aborted')),"
        " count(*) FILTER (WHERE status IN ('todo', 'doing')) FROM procrastinate_jobs"
    ),
}


class Failure(Exception):
    """A task lost, run twice or failed, or a worker that did not run: exit status 1."""


def installed(name: str) -> bool:
    return importlib.util.find_spec(MODULES[name]) is not None


# --- A system: its database, its client process, its workers, its tasks. ---


@dataclass
class System:
    name: str
    database: str
    runs: Path  # the no-op task's files, one per worker process
    next_n: int = 1
    enqueued: int = 0
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        context = mp.get_context("spawn")  # a Django project of its own: a fresh interpreter
        self._pipe, child = context.Pipe()
        from bench import tasks_systems

        self._proc = context.Process(
            target=tasks_systems.serve,
            args=(self.name, self.database, str(self.runs), child),
            daemon=True,
        )
        self._proc.start()

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def call(self, function: str, *args: Any) -> Any:
        self._pipe.send((function, args))
        ok, value = self._pipe.recv()
        if not ok:
            raise RuntimeError(f"{self.label}'s client failed:\n{value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.send(None)
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()

    def numbers(self, count: int, own: bool = True) -> range:
        """The next ``count`` task numbers; ``own``: tasks of the system (not its limit's)."""
        first = self.next_n
        self.next_n += count
        self.enqueued += count if own else 0
        return range(first, first + count)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PGMB_BENCH_TASKS_SYSTEM": self.name,
            "PGMB_BENCH_DB": self.database,
            "PGMB_BENCH_TASKS_RUNS": str(self.runs),
            "DJANGO_SETTINGS_MODULE": "bench.tasks_settings",
        }

    def state(self) -> tuple[int, int, int]:
        with harness.connect(self.database) as conn:
            done, failed, left = conn.execute(STATE_SQL[self.name]).fetchone() or (0, 0, 0)
        return done, failed, left

    def runs_of(self, wanted: range) -> dict[int, list[tuple[int, float]]]:
        """Task number -> (worker pid, start time) of each of its runs, for ``wanted``."""
        found: dict[int, list[tuple[int, float]]] = {}
        for path in self.runs.glob("*.log"):
            pid = int(path.stem)
            text = path.read_text(encoding="ascii")
            for line in text[: text.rfind("\n") + 1].splitlines():
                n, at = line.split()
                if int(n) in wanted:
                    found.setdefault(int(n), []).append((pid, float(at)))
        return found


@contextlib.contextmanager
def workers(system: System, count: int, log: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes of ``system``, stopped (SIGTERM) on the way out."""
    procs = []
    with open(log, "ab") as out:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "django", *WORKERS[system.name]],
                    env=system.env(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            )
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                system.problems.append(f"{system.label}: a worker ignored SIGTERM for 30 s")


def wait_for_runs(
    system: System, wanted: range, procs: Sequence[subprocess.Popen[bytes]], log: Path
) -> dict[int, list[tuple[int, float]]]:
    """The runs of ``wanted`` once every one of them started and the system recorded every
    task enqueued so far as finished (else :class:`Failure`)."""
    # Generous: a stalled worker, not a slow one, is what this catches.
    deadline = time.monotonic() + 60 + len(wanted) / 10
    found: dict[int, list[tuple[int, float]]] = {}
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in procs):
            raise Failure(f"{system.label}: a worker exited:\n{_tail(log)}")
        found = system.runs_of(wanted)
        if len(found) == len(wanted):
            done, failed, _ = system.state()
            if failed:
                raise Failure(f"{system.label}: {failed} tasks failed:\n{_tail(log)}")
            if done >= system.enqueued:
                return found
        time.sleep(0.05)
    raise Failure(
        f"{system.label}: {len(found)} of {len(wanted)} tasks ran within the time allowed"
        f"; its records: {system.state()} (finished, failed, left)\n{_tail(log)}"
    )


def _tail(log: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def check_once(system: System, found: dict[int, list[tuple[int, float]]]) -> None:
    twice = {n: len(r) for n, r in found.items() if len(r) > 1}
    if twice:
        some = ", ".join(f"{n} ({k}x)" for n, k in list(twice.items())[:5])
        system.problems.append(f"{system.label}: {len(twice)} tasks ran more than once: {some}")


def rate(found: dict[int, list[tuple[int, float]]]) -> float:
    """Tasks started per second while every worker process was running tasks: from the
    last of the processes' first starts to the first of their last ones."""
    by_pid: dict[int, list[float]] = {}
    for runs in found.values():
        for pid, at in runs:
            by_pid.setdefault(pid, []).append(at)
    begin = max(min(times) for times in by_pid.values())
    end = min(max(times) for times in by_pid.values())
    starts = sorted(at for times in by_pid.values() for at in times)
    if end <= begin:  # a process ran only at the edges: the whole span
        begin, end = starts[0], starts[-1]
    inside = sum(begin <= at <= end for at in starts)
    return (inside - 1) / max(end - begin, 1e-9)


# --- One round of one system. ---


@dataclass(frozen=True)
class Settings:
    tasks: int
    batches: int
    seconds: float
    pause: float
    log_dir: Path


def round_of(system: System, settings: Settings) -> harness.Sample:
    sample: harness.Sample = {}
    log = settings.log_dir / f"{system.name}.log"

    queued = system.numbers(settings.tasks)
    sample["enqueue"] = settings.tasks / system.call("enqueue", queued.start, settings.tasks)
    bulk = system.numbers(settings.batches * BATCH)
    sample["bulk"] = len(bulk) / system.call("enqueue_bulk", bulk.start, settings.batches)
    everything = range(queued.start, bulk.stop)

    with workers(system, 1, log) as procs:
        found = wait_for_runs(system, everything, procs, log)
        check_once(system, found)
        sample["run"] = rate(found)
        paced = system.numbers(max(1, round(settings.seconds / settings.pause)))
        committed = system.call("enqueue_paced", paced.start, len(paced), settings.pause)
        found = wait_for_runs(system, paced, procs, log)
        check_once(system, found)
    latencies = sorted(found[n][0][1] - at for n, at in zip(paced, committed, strict=True))
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    sample["p50"], sample["p99"] = cuts[49] * 1000, cuts[98] * 1000
    _, failed, left = system.state()
    if left or failed:
        raise Failure(f"{system.label}: {left} tasks left unfinished, {failed} failed")

    limit = system.numbers(settings.tasks, own=False)
    sample["limit_enqueue"] = settings.tasks / system.call(
        "limit_enqueue", limit.start, settings.tasks, 1
    )
    limit_bulk = system.numbers(settings.batches * BATCH, own=False)
    sample["limit_bulk"] = len(limit_bulk) / system.call(
        "limit_enqueue", limit_bulk.start, len(limit_bulk), BATCH
    )
    ran, seconds = system.call("limit_run")
    if ran != len(limit) + len(limit_bulk):
        raise Failure(f"{system.label}'s limit: {ran} of {len(limit) + len(limit_bulk)} claimed")
    sample["limit_run"] = ran / seconds
    return sample


def scaling_round(system: System, processes: int, settings: Settings) -> harness.Sample:
    log = settings.log_dir / f"{system.name}-{processes}.log"
    batches = max(1, settings.tasks // BATCH)
    wanted = system.numbers(batches * BATCH)
    system.call("enqueue_bulk", wanted.start, batches)
    with workers(system, processes, log) as procs:
        found = wait_for_runs(system, wanted, procs, log)
    check_once(system, found)
    pids = {pid for runs in found.values() for pid, _ in runs}
    return {"rate": rate(found), "processes": float(len(pids))}


# --- pg_stat_statements: each system's statements per task. ---


def statements_available() -> bool:
    with harness.connect(os.environ.get("PGDATABASE", "postgres")) as conn:
        (preload,) = conn.execute("SHOW shared_preload_libraries").fetchone() or ("",)
    return "pg_stat_statements" in preload


def reset_statements(system: System) -> None:
    with harness.connect(system.database) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(
            "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
            " WHERE datname = current_database()), 0)"
        )


def statements(system: System, tasks: int, top: int = 14) -> list[dict[str, Any]]:
    """The system's statements (its enqueues' and workers'), per task: not the benchmark's
    own (the limit's copies, the counts of its records)."""
    with harness.connect(system.database) as conn:
        rows = conn.execute(
            "SELECT s.calls, s.total_exec_time, s.wal_bytes, s.query"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database() AND s.query NOT LIKE %s"
            " AND s.query NOT LIKE %s AND s.query NOT LIKE %s"
            " ORDER BY s.total_exec_time DESC",
            ("%bench_limit_%", "%pg_stat_statements%", "SELECT count(*) FILTER%"),
        ).fetchall()
    return [
        {
            "calls_per_task": calls / tasks,
            "ms_per_task": total / tasks,
            "wal_bytes_per_task": float(wal) / tasks,
            "query": " ".join(query.split())[:110],
        }
        for calls, total, wal, query in rows[:top]
    ]


# --- Output. ---

#: (key, title, unit, higher is better)
FIGURES = (
    ("enqueue", "enqueue, one task per transaction", "tasks/s", True),
    ("bulk", f"enqueue, {BATCH} per transaction", "tasks/s", True),
    ("run", "run queued no-op tasks, one worker process", "tasks/s", True),
    ("p50", "enqueue -> start latency p50, worker idle", "ms", False),
    ("p99", "enqueue -> start latency p99, worker idle", "ms", False),
)
GOALS = {"enqueue": 1.0, "run": 1.0, "p50": 1.0}
LIMITS = {"enqueue": "limit_enqueue", "bulk": "limit_bulk", "run": "limit_run"}


def summary(results: harness.Results, label: str, key: str, higher: bool) -> float:
    values = results.values(label, key)
    return max(values) if higher else min(values)


def table(results: harness.Results, systems: Sequence[System]) -> dict[str, Any]:
    """Each figure: pgmb's, the best peer's, pgmb's advantage (pgmb / peer for rates,
    peer / pgmb for latencies: >= 1 means pgmb is at least as good)."""
    pgmb, peers = systems[0], systems[1:]
    rows: dict[str, Any] = {}
    print(
        f"\n  {'path':<46} {'pgmb':>10} {'best peer':>30} {'ratio':>6}"
        "   (ratio: >= 1 when pgmb is at least as good)"
    )
    for key, title, unit, higher in FIGURES:
        mine = summary(results, pgmb.label, key, higher)
        row: dict[str, Any] = {"unit": unit, "pgmb": mine}
        if peers:
            figures = {p.label: summary(results, p.label, key, higher) for p in peers}
            peer = (max if higher else min)(figures, key=lambda label: figures[label])
            ratio = mine / figures[peer] if higher else figures[peer] / max(mine, 1e-9)
            row.update(best_peer=peer, peer=figures[peer], ratio=ratio, peers=figures)
            shown = f"{peer} {figures[peer]:,.0f}"
            mark = ""
            if key in GOALS:
                met = ratio >= GOALS[key]
                row["goal"] = GOALS[key]
                row["met"] = met
                mark = f"  goal >= {GOALS[key]:g} " + ("met" if met else "NOT MET")
            print(f"  {title:<46} {mine:>10,.0f} {shown:>30} {ratio:>6.2f}{mark}  ({unit})")
        else:
            print(f"  {title:<46} {mine:>10,.0f} {'(no peer installed)':>30}         ({unit})")
        rows[key] = row
    return rows


def details(results: harness.Results, systems: Sequence[System]) -> dict[str, Any]:
    print(
        "\n  Each system against its design limit (its rows by plain statements, no trigger;"
        " bench/tasks_systems.py):"
    )
    print(
        f"  {'':<16} {'enqueue/s':>10} {'limit':>8} {'of it':>6} {'bulk/s':>9} {'limit':>8}"
        f" {'of it':>6} {'run/s':>8} {'limit':>8} {'of it':>6} {'p50 ms':>7} {'p99 ms':>7}"
    )
    out: dict[str, Any] = {}
    for system in systems:
        figures = {
            key: summary(results, system.label, key, higher) for key, _, _, higher in FIGURES
        }
        figures.update(
            {limit: summary(results, system.label, limit, True) for limit in LIMITS.values()}
        )
        cells = ""
        for key, limit in LIMITS.items():
            cells += (
                f" {figures[key]:>9,.0f} {figures[limit]:>8,.0f}"
                f" {figures[key] / figures[limit]:>6.2f}"
            )
        ranges = {
            key: (min(results.values(system.label, key)), max(results.values(system.label, key)))
            for key, *_ in FIGURES
        }
        print(f"  {system.label:<16}{cells} {figures['p50']:>7.1f} {figures['p99']:>7.1f}")
        out[system.label] = {"best": figures, "ranges": ranges}
    if note := results.load_note():
        print(f"  During the runs, {note}.")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        type=int,
        default=1000,
        help="tasks enqueued one per transaction, and run, per round (default 1000)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=5,
        help=f"transactions of {BATCH} enqueues per round (default 5)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=5,
        help="of paced enqueues for the latency, per round (default 5)",
    )
    parser.add_argument(
        "--pause", type=float, default=0.05, help="between the latency's enqueues (default 0.05 s)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument(
        "--processes",
        default="1,2,4",
        help="pgmb worker processes to scale over ('' for none; default 1,2,4)",
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="which systems (default: all installed)"
    )
    parser.add_argument(
        "--statements",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-statement figures when pg_stat_statements is preloaded",
    )
    parser.add_argument(
        "--db", default="pgmb_bench_tasks", help="prefix of the scratch databases (one per system)"
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the databases")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1 or args.pause <= 0:
        parser.error("--tasks and --rounds must be positive, --pause above 0")
    processes = [int(p) for p in args.processes.split(",") if p.strip()]

    wanted = [s for s in args.systems.split(",") if s]
    if unknown := set(wanted) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}: {', '.join(SYSTEMS)}")
    if "pgmb" not in wanted:
        parser.error("--systems must include pgmb")
    names = [s for s in SYSTEMS if s in wanted and installed(s)]
    missing = [LABELS[s] for s in SYSTEMS if s in wanted and not installed(s)]

    began = time.monotonic()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    work = Path(tempfile.mkdtemp(prefix="pgmb-bench-tasks-"))
    settings = Settings(args.tasks, args.batches, args.seconds, args.pause, work)
    systems: list[System] = []
    report: dict[str, Any] = {}
    try:
        for name in names:
            database = f"{args.db}_{name}"
            harness.recreate_database(database, create=True)
            runs = work / f"runs-{name}"
            runs.mkdir()
            systems.append(System(name, database, runs))
        for system in systems:
            system.call("set_up")
        os.environ["PGMB_BENCH_DB"] = systems[0].database
        harness.print_machine(
            systems=", ".join(f"{s.label} ({'its own database ' + s.database})" for s in systems),
            peers=(
                f"not installed: {', '.join(missing)} (pip install -r "
                "bench/requirements-tasks.txt): compared with its design limit only"
                if missing
                else "all installed"
            ),
            workers="; ".join(f"{s.label}: manage.py {' '.join(WORKERS[s.name])}" for s in systems),
            round=f"{args.tasks:,} tasks one per transaction, {args.batches} x {BATCH} in bulk, "
            f"latency over {args.seconds:g} s (one task every {args.pause:g} s)",
        )
        with_statements = args.statements and statements_available()
        if with_statements:
            for system in systems:
                reset_statements(system)
        load = harness.OtherLoad(harness.postmaster())
        group = tuple(harness.Case(s.label, partial(round_of, s, settings)) for s in systems)
        results = harness.measure([group], args.rounds, load, budget=len(systems))
        print(
            f"\nBest of {args.rounds} rounds, the systems' order rotating (rates: highest, "
            "latencies: lowest); ratios best against best."
        )
        report["summary"] = table(results, systems)
        report["systems"] = details(results, systems)
        if with_statements:
            report["statements"] = {}
            print(
                "\n  Statements per task of each system (pg_stat_statements, every round, the"
                " limit's left out; top 14 by time):"
            )
            for system in systems:
                ran = system.enqueued
                found = statements(system, ran)
                report["statements"][system.label] = found
                print(f"  {system.label} ({ran:,} tasks):   calls/task  ms/task  WAL B/task")
                for s in found:
                    print(
                        f"    {s['calls_per_task']:>8.2f} {s['ms_per_task']:>8.3f}"
                        f" {s['wal_bytes_per_task']:>10,.0f}  {s['query']}"
                    )
        elif args.statements:
            print("\n  (pg_stat_statements is not preloaded: no per-statement figures)")
        if processes:
            pgmb = systems[0]
            cases = tuple(
                harness.Case(
                    f"{k} process{'es' if k > 1 else ''}",
                    partial(scaling_round, pgmb, k, settings),
                )
                for k in processes
            )
            scaled = harness.measure([cases], args.rounds, load, budget=len(cases))
            print(
                f"\n  pgmb, {max(1, args.tasks // BATCH) * BATCH:,} queued tasks, N worker "
                "processes: tasks/s while all ran (best of rounds), against 1 process:"
            )
            base = harness.best(scaled.values(cases[0].label))
            report["scaling"] = {}
            for case in cases:
                best = harness.best(scaled.values(case.label))
                print(f"  {case.label:<14} {best:>9,.0f}   {best / base:.2f}")
                report["scaling"][case.label] = {"rate": best, "ratio": best / base}
            if note := scaled.load_note():
                print(f"  During the runs, {note}.")
        problems = [p for s in systems for p in s.problems]
        if problems:
            raise Failure("\n  ".join(problems))
    except (Failure, RuntimeError) as exc:
        print(f"\nFAILED: {exc}")
        return 1
    finally:
        for system in systems:
            system.close()
        if not args.keep:
            for name in names:
                with contextlib.suppress(Exception):
                    harness.recreate_database(f"{args.db}_{name}", create=False)
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    print(
        f"\ncount check: every task of every system ran exactly once and finished; "
        f"{time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
