"""What the benchmarks share: a scratch database, client processes, rounds run next to a
baseline, the load others put on the machine, and tables of figures with their ratios.

Every figure is held against a baseline measured in the same run, interleaved with it: on
a shared 2-core machine absolute figures move by 30 % between runs, ratios much less.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import statistics
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
#: A run during which other processes kept more than this many cores busy is run again.
QUIET = 0.25

# --- The scratch database. ---


def connect(database: str | None = None) -> psycopg.Connection[Any]:
    """Autocommit connection to the scratch database (or to ``database``)."""
    name = database or os.environ["PGMB_BENCH_DB"]
    return psycopg.connect(dbname=name, autocommit=True)


def recreate_database(name: str, create: bool) -> None:
    """Drop database ``name`` if it exists; create it anew when ``create``."""
    # PGDATABASE is the one database we know exists; ours cannot be dropped from itself.
    with connect(os.environ.get("PGDATABASE", "postgres")) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if create:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@contextlib.contextmanager
def scratch_database(name: str, keep: bool = False) -> Iterator[None]:
    """Create ``name``, set Django up on it and migrate; drop it afterwards unless ``keep``."""
    os.environ["PGMB_BENCH_DB"] = name
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    # The virtualenv is shared between checkouts: child processes must import this one's pgmb.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    recreate_database(name, create=True)
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield
    finally:
        connections.close_all()
        if not keep:
            recreate_database(name, create=False)


# --- Client processes. ---


def _serve(pipe: Connection) -> None:
    while (call := pipe.recv()) is not None:
        function, args = call
        try:
            pipe.send((True, function(*args)))
        except Exception:
            pipe.send((False, traceback.format_exc()))


class Pool:
    """Processes forked once, each running one call at a time with its own connections.

    Processes, so that the GIL is not what is measured; forked once, so that neither is
    the start-up of Python and Django.
    """

    def __init__(self, size: int) -> None:
        from django.db import connections

        connections.close_all()  # a forked child must not share the parent's socket
        context = mp.get_context("fork")
        self._pipes: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(size):
            parent, child = context.Pipe()
            proc = context.Process(target=_serve, args=(child,), daemon=True)
            proc.start()
            self._pipes.append(parent)
            self._procs.append(proc)

    def map(self, function: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``function(*args)`` for each ``args`` of ``calls``, at once, one per process."""
        if len(calls) > len(self._pipes):
            raise ValueError(f"{len(calls)} calls for {len(self._pipes)} processes")
        for pipe, args in zip(self._pipes, calls, strict=False):
            pipe.send((function, args))
        answers = [pipe.recv() for pipe in self._pipes[: len(calls)]]
        for ok, value in answers:
            if not ok:
                raise RuntimeError(f"a client process failed:\n{value}")
        return [value for _, value in answers]

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- Other load on the machine. ---


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent, CPU seconds of the process and of the children it has reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            # utime, stime, cutime, cstime (proc(5) fields 14-17): with the reaped children
            # counted, a process that exits mid-run hands its CPU to its parent, not to nobody.
            found[int(entry.name)] = (int(fields[1]), sum(map(int, fields[11:15])) / tick)
    return found


def _descendants(procs: dict[int, tuple[int, float]], roots: set[int]) -> set[int]:
    """``roots`` and every process below them in ``procs``."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _) in procs.items():
        children[parent].append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children[pid])
    return found


def _is_local_server() -> bool:
    host = os.environ.get("PGHOST", "")
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


def postmaster() -> int | None:
    """The PID of the PostgreSQL server when it runs on this machine (else None)."""
    if not _is_local_server():
        return None
    # Read while connected: a closed connection's backend is gone, its parent with it.
    with connect(os.environ.get("PGDATABASE", "postgres")) as conn:
        return _processes().get(conn.info.backend_pid, (None, 0.0))[0]


def tree_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a local process and its descendants, the exited ones too.

    For the whole PostgreSQL server (its postmaster): backends of clients that came and
    went, e.g. pgbench's, count once the postmaster has reaped them. Ticks of 10 ms: for
    runs of seconds, not for a single statement.
    """
    if pid is None:
        return 0.0
    procs = _processes()
    return sum(procs[member][1] for member in _descendants(procs, {pid}) if member in procs)


def children(pid: int | None) -> set[int]:
    """The processes whose parent is ``pid`` (none when it is not local)."""
    if pid is None:
        return set()
    return {child for child, (parent, _) in _processes().items() if parent == pid}


def reaped(pid: int | None, known: set[int], timeout: float = 2.0) -> None:
    """Wait until the children of ``pid`` that are not ``known`` have exited and been reaped.

    A client's backend exits after the client does, and its CPU reaches its parent's
    count only once reaped: until then :func:`tree_cpu` may miss it. Children born later
    (an autovacuum worker) are not waited for.
    """
    deadline, waited = time.monotonic() + timeout, children(pid) - known
    while waited & children(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def backend_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a local process (0 when it cannot be read)."""
    if pid is None:
        return 0.0
    # schedstat counts nanoseconds; stat counts 10 ms ticks, too coarse for short runs.
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9
    return 0.0


class OtherLoad:
    """Cores kept busy by processes that are not ours: other people's work.

    Ours are this process, the local PostgreSQL server, and their descendants. Kernel
    threads (children of kthreadd, pid 2) do I/O for whoever asks, us included: nobody's.
    A run slowed down by others measures them, not the code: such runs are run again.
    """

    def __init__(self, server: int | None) -> None:
        self._roots = {os.getpid()} | ({server} if server else set())
        with contextlib.suppress(OSError), open("/proc/2/comm") as comm:
            if comm.read().strip() == "kthreadd":
                self._roots.add(2)
        self.start()

    def _others_cpu(self) -> float:
        procs = _processes()
        ours = _descendants(procs, self._roots)
        return sum(cpu for pid, (_, cpu) in procs.items() if pid not in ours)

    def start(self) -> None:
        self._cpu, self._at = self._others_cpu(), time.monotonic()

    def cores(self) -> float:
        """Cores used by others since :meth:`start`."""
        used = self._others_cpu() - self._cpu
        return max(0.0, used) / max(time.monotonic() - self._at, 1e-6)


# --- Rounds next to a baseline. ---

Sample = dict[str, float]


@dataclass(frozen=True)
class Case:
    label: str
    run: Callable[[], Sample]


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    loads: list[float] = field(default_factory=list)
    repeated: int = 0

    def values(self, label: str, key: str = "rate") -> list[float]:
        return [sample[key] for sample in self.samples[label]]

    def load_note(self) -> str:
        if not self.loads:
            return ""
        return (
            f"other processes kept {statistics.median(self.loads):.2f} cores busy (median; "
            f"max {max(self.loads):.2f}); {self.repeated} runs repeated for more than {QUIET}"
        )


def measure(
    groups: Sequence[tuple[Case, ...]], rounds: int, load: OtherLoad, budget: int = 16
) -> Results:
    """Run each group, a (baseline, case) pair or longer, ``rounds`` times, its cases right
    next to each other.

    Which of a pair goes first alternates, so that a burst of load elsewhere, or the slow
    growth of the tables, does not lean on one side of a ratio; a longer group (baselines
    and the cases held against them) rotates: round r starts at its r-th member. A loaded
    run is replaced by one more run, ``budget`` times in all: a busy machine costs a little
    time, not double.
    """
    results = Results()
    for round_ in range(rounds):
        for group in groups:
            shift = round_ % len(group)
            for current in (*group[shift:], *group[:shift]):
                for attempt in range(2):
                    load.start()
                    sample = current.run()
                    cores = load.cores()
                    if cores <= QUIET or attempt or results.repeated >= budget:
                        break
                    results.repeated += 1
                results.samples[current.label].append(sample)
                results.loads.append(cores)
    return results


# --- Printing. ---


def best(values: Sequence[float]) -> float:
    """Other work can only slow a run down: the fastest is the least disturbed."""
    return max(values)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def least(values: Sequence[float]) -> float:
    return min(values)


@dataclass(frozen=True)
class Row:
    """A figure (``key`` of the samples of case ``case``) and the baseline it is held against."""

    label: str
    case: str
    key: str = "rate"
    baseline: str | None = None
    goal: float | None = None
    #: A second baseline, e.g. the physical limit behind the goal's: a second ratio column.
    also: str | None = None


@dataclass(frozen=True)
class Column:
    """A further quantity per row, e.g. CPU per message, with how runs are summarised."""

    title: str
    key: str
    summary: Callable[[Sequence[float]], float]


def print_table(
    results: Results,
    rows: Sequence[Row],
    summary: Callable[[Sequence[float]], float],
    columns: Sequence[Column] = (),
    ratio_title: str = "ratio",
    also_title: str | None = None,
) -> None:
    """One line per row: figure, range over the runs, ratio to its baseline(s), columns.

    ``also_title`` heads the column of the ratios to the rows' second baselines (``also``).
    """

    def ratio(value: float, baseline: str | None) -> str:
        return f"{value / summary(results.values(baseline)):.2f}" if baseline else ""

    width, also_width = max(6, len(ratio_title)), max(6, len(also_title or ""))
    head = f"  {'':<46} {'per sec':>9} {'(range)':>15} {ratio_title:>{width}}"
    head += f" {also_title:>{also_width}}" if also_title else ""
    print(head + "".join(f" {c.title:>13}" for c in columns))
    for row in rows:
        values = results.values(row.case, row.key)
        value = summary(values)
        spread = f"{min(values):,.0f}-{max(values):,.0f}" if len(values) > 1 else ""
        shown = f"{ratio(value, row.baseline):>{width}}"
        shown += f" {ratio(value, row.also):>{also_width}}" if also_title else ""
        cells = "".join(f" {c.summary(results.values(row.case, c.key)):>13,.0f}" for c in columns)
        mark = ""
        if row.baseline and row.goal is not None:
            met = value / summary(results.values(row.baseline)) >= row.goal
            mark = f"  goal >= {row.goal:g} " + ("met" if met else "NOT MET")
        print(f"  {row.label:<46} {value:>9,.0f} {spread:>15} {shown}{cells}{mark}")
    if note := results.load_note():
        print(f"  During the runs, {note}.")


def print_machine(**extra: str) -> None:
    """What the figures were measured on: they mean little without it."""
    import django

    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as info:
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    with connect() as conn:
        version, fsync, sync, buffers = conn.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'),"
            " current_setting('shared_buffers')"
        ).fetchone()
    lines = {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "os": platform.platform(),
        "load": "{:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(*os.getloadavg()),
        "postgres": version.split(" on ")[0],
        "server": f"fsync={fsync} synchronous_commit={sync} shared_buffers={buffers}",
        "client": (
            f"Python {platform.python_version()}, Django {django.__version__}, "
            f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
        ),
        **extra,
    }
    for key, value in lines.items():
        print(f"{key:<9} {value}")
