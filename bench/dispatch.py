"""Dispatch throughput and latency: pgmb's dispatchers against the HTTP client alone.

Run it with a throwaway PostgreSQL cluster, or given the libpq variables of a server
where the user may create databases::

    scripts/with-cluster.sh .venv/bin/python bench/dispatch.py [--messages 20000] [--rounds 3]

It creates a scratch database (``pgmb_bench_dispatch``), migrates it, starts a local
endpoint that answers 200 at once (nginx when installed, else aiohttp; see
``bench/endpoints.py``) and prints:

1. **Throughput of the external dispatcher**: N messages published with ``send_batch`` to
   one queue whose worker allows 1,000,000 requests/s, then ``manage.py pgmb_dispatch
   --until-idle`` run as a real process until every delivery is acked. Two rates: *steady*,
   from the first ack to the last (the ack times the database recorded), and *end to end*,
   from starting the process to its exit (Python and Django start-up included). Checked in
   the database: no delivery left, N acks recorded.
2. **The ceiling**: aiohttp alone posting the same body with the same headers to the same
   endpoint, with as many requests in flight (64), in a process of its own, in the same
   run, interleaved with the dispatcher's runs. The ratio dispatcher / ceiling is what
   pgmb's claim, ack and bookkeeping leave of the HTTP client's speed.
3. **Latency** from a producer's COMMIT to the endpoint receiving the POST, at a steady
   rate (1,000 messages/s for 10 s, one message per transaction, from a separate process
   that notes when each commit returned), against a recording endpoint in a process of
   its own that notes when each request arrived; the first second is warm-up and is not
   counted. The dispatcher runs all along, woken by NOTIFY.
4. **The in-database path**: ``CALL pgmb.dispatch_loop(...)`` (the procedure pg_cron
   runs) posting through PL/Python to the fast endpoint, against PL/Python posting the
   same requests in a loop without claiming or acking anything.

Runs of each kind are interleaved and repeated; figures are medians with the range
(slowest-fastest) beside them, since other work on a shared 2-core machine slows single
runs down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import endpoints  # noqa: E402

CONCURRENCY = 64
#: A worker this fast is never held back by its rate limit.
UNLIMITED_RPS = 1_000_000
BODY = {
    "order_id": 1234567,
    "customer": "c-01234",
    "total": "129.90",
    "currency": "EUR",
    "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
}
QUEUES = {
    # queue: (worker, binding, routing key)
    "fast_queue": ("fast", "bench.#", "bench.order.created"),
    "latency_queue": ("recorder", "latency.#", "latency.order.created"),
    "indb_queue": ("indb", "indb.#", "indb.order.created"),
}


# --- Helpers. ---


def _env(database: str) -> dict[str, str]:
    """What a child process needs to reach the scratch database through Django."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "PGMB_BENCH_DB": database,
    }


def admin_connection():
    import psycopg

    return psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True)


def connect(database: str):
    import psycopg

    return psycopg.connect(dbname=database, autocommit=True)


def create_database(name: str) -> None:
    from psycopg import sql as q

    with admin_connection() as admin:
        admin.execute(q.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(q.Identifier(name)))
        admin.execute(q.SQL("CREATE DATABASE {}").format(q.Identifier(name)))


def drop_database(name: str) -> None:
    from psycopg import sql as q

    with admin_connection() as admin:
        admin.execute(q.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(q.Identifier(name)))


def _children_cpu() -> float:
    """CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class OtherLoad:
    """How many cores processes other than this benchmark's kept busy, sampled in a thread.

    Ours are this process and its descendants (endpoints, dispatchers, clients) and the
    PostgreSQL server when it runs here. The machine is shared and has two cores, so a
    figure measured while something else was busy is slower than the code it measures;
    this says which ones. Linux only (/proc); elsewhere it reports nothing.
    """

    def __init__(self, postmaster: int | None, interval: float = 0.1) -> None:
        self._roots = {os.getpid()} | ({postmaster} if postmaster else set())
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ok = Path("/proc/stat").exists()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False

    @staticmethod
    def _machine() -> float:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
        ours = set(self._roots)
        grew = True
        while grew:  # descendants of the roots, however deep
            before = len(ours)
            ours |= {pid for pid, parent in parents.items() if parent in ours}
            grew = len(ours) > before
        with self._lock:
            for pid in ours & cpu.keys():
                # A process first seen after the start began since: all its CPU is ours.
                self._first.setdefault(pid, cpu[pid] if not self._started else 0.0)
                self._last[pid] = cpu[pid]

    def _ours(self) -> float:
        with self._lock:
            return sum(self._last[pid] - self._first[pid] for pid in self._last)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def start(self) -> OtherLoad:
        if self._ok:
            self._sample()
            self._started = True
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def mark(self) -> tuple[float, float, float]:
        if not self._ok:
            return (0.0, 0.0, time.monotonic())
        self._sample()
        return (self._machine(), self._ours(), time.monotonic())

    def since(self, mark: tuple[float, float, float]) -> float | None:
        """Cores kept busy by others since ``mark`` (None where it cannot be known)."""
        if not self._ok:
            return None
        machine, ours, at = self.mark()
        return max(0.0, (machine - mark[0]) - (ours - mark[1])) / max(at - mark[2], 1e-9)


def _postmaster() -> int | None:
    """The PID of the PostgreSQL server, when it runs on this machine."""
    with admin_connection() as admin:
        (backend,) = admin.execute("SELECT pg_backend_pid()").fetchone()
    try:
        with open(f"/proc/{backend}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None  # another machine


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _range(values: Sequence[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}" if len(values) > 1 else ""


def machine(endpoint: str) -> list[tuple[str, str]]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as info:
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    with admin_connection() as admin:
        version, fsync, sync_commit, buffers = admin.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'),"
            " current_setting('shared_buffers')"
        ).fetchone()
    import aiohttp
    import psycopg

    uvloop = _uvloop_version()
    loop = "asyncio" + (f" (uvloop {uvloop} installed: tried on aiohttp alone)" if uvloop else "")
    return [
        ("cpu", f"{cpu}, {os.cpu_count()} cores"),
        ("os", platform.platform()),
        ("load", "{:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(*os.getloadavg())),
        ("postgres", version.split(" on ")[0]),
        ("server", f"fsync={fsync} synchronous_commit={sync_commit} shared_buffers={buffers}"),
        (
            "client",
            f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
            f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), event loop {loop}",
        ),
        ("endpoint", endpoint),
    ]


def _uvloop_version() -> str:
    try:
        import uvloop
    except ImportError:
        return ""
    return uvloop.__version__


# --- Setup. ---


def set_up(fast_url: str) -> dict[str, str]:
    """Migrate, register workers and queues; queue name -> queue id."""
    from django.core.management import call_command
    from django.db import connection

    from pgmb.models import Queue, Worker

    call_command("migrate", verbosity=0, interactive=False)
    ids = {}
    for queue, (worker, binding, _) in QUEUES.items():
        w, _ = Worker.objects.get_or_create(
            name=worker, defaults={"endpoint": fast_url, "rps": UNLIMITED_RPS}
        )
        ids[queue] = str(Queue.objects.create(name=queue, binding_key=binding, worker=w).id)
    connection.close()
    return ids


def point_worker(name: str, url: str) -> None:
    from pgmb.models import Worker

    Worker.objects.filter(name=name).update(endpoint=url)


def publish(queue: str, n: int) -> None:
    """``n`` messages routed to ``queue`` only, in send_batch calls of 1,000."""
    import pgmb

    key = QUEUES[queue][2]
    for start in range(0, n, 1000):
        pgmb.send_batch([(key, BODY) for _ in range(min(1000, n - start))])


def sample_headers() -> dict[str, str]:
    """The headers the dispatcher sends with one delivery to the fast worker."""
    from pgmb.dispatch.request import build_headers

    body = json.dumps(BODY).encode()
    return build_headers(
        message_id=str(uuid.uuid4()),
        routing_key=QUEUES["fast_queue"][2],
        queue="fast_queue",
        attempt=1,
        headers={},
        body=body,
        secret="",
        timestamp=int(time.time()),
    )


# --- 1 and 2: throughput of the dispatcher and of aiohttp alone. ---


@dataclass(frozen=True)
class DispatchRun:
    steady: float  # deliveries/s from the first ack to the last
    end_to_end: float  # deliveries/s from process start to exit
    wall: float
    cpu_us: float  # dispatcher process CPU per delivery, start-up included


def run_dispatcher(database: str, queue_id: str, n: int) -> DispatchRun:
    publish("fast_queue", n)
    with connect(database) as conn:
        (since,) = conn.execute("SELECT clock_timestamp()").fetchone()
        cpu = _children_cpu()
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "django", "pgmb_dispatch", "--until-idle", "--queue",
             "fast_queue", "--concurrency", str(CONCURRENCY), "-v", "1"],
            env=_env(database), cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        cpu = _children_cpu() - cpu
        if proc.returncode:
            raise RuntimeError(f"pgmb_dispatch failed ({proc.returncode}):\n{proc.stderr}")
        acks, first, last = conn.execute(
            "SELECT count(*), min(created_at), max(created_at) FROM pgmb_attempt"
            " WHERE queue_id = %s AND outcome = 'ack' AND created_at >= %s",
            (queue_id, since),
        ).fetchone()
        (left,) = conn.execute(
            "SELECT count(*) FROM pgmb_delivery WHERE queue_id = %s", (queue_id,)
        ).fetchone()
    if acks != n or left:
        raise RuntimeError(f"dispatch check failed: {acks} acks of {n}, {left} deliveries left")
    span = (last - first).total_seconds()
    return DispatchRun(
        steady=(acks - 1) / span if span > 0 else float("nan"),
        end_to_end=n / wall,
        wall=wall,
        cpu_us=cpu / n * 1e6,
    )


def idle_dispatcher(database: str) -> float:
    """Seconds pgmb_dispatch --until-idle takes to start, find nothing and exit."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "django", "pgmb_dispatch", "--until-idle", "-v", "0"],
        env=_env(database), cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - start


@dataclass(frozen=True)
class RawRun:
    rate: float  # requests/s
    cpu_us: float  # client process CPU per request, start-up included


def run_raw(url: str, n: int, uvloop: bool = False) -> RawRun:
    """aiohttp alone, in a fresh process like the dispatcher's."""
    argv = [sys.executable, __file__, "_raw", url, str(n), str(CONCURRENCY)]
    if uvloop:
        argv.append("uvloop")
    cpu = _children_cpu()
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return RawRun(float(proc.stdout.strip()), (_children_cpu() - cpu) / n * 1e6)


def _raw_client(url: str, n: int, concurrency: int, loop: str = "asyncio") -> None:
    """Child process: POST ``n`` times with ``concurrency`` in flight; print requests/s."""
    import asyncio

    import aiohttp

    body = json.dumps(BODY).encode()
    headers = sample_headers()

    async def main() -> float:
        timeout = aiohttp.ClientTimeout(total=10)
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
        async with aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar()
        ) as session:
            left = n
            failed = 0

            async def one() -> None:
                nonlocal left, failed
                while left > 0:
                    left -= 1
                    async with session.post(
                        url, data=body, headers=headers, timeout=timeout, allow_redirects=False
                    ) as response:
                        failed += response.status != 200

            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(concurrency)))
            elapsed = time.perf_counter() - start
        if failed:
            raise SystemExit(f"{failed} requests failed")
        return n / elapsed

    if loop == "uvloop":
        import uvloop

        print(uvloop.run(main()))
    else:
        print(asyncio.run(main()))


# --- 3: latency from commit to arrival. ---


def _publisher(database: str, rate: float, seconds: float, out: str) -> None:
    """Child process: one message per transaction at ``rate``/s; note each commit's time."""
    body = json.dumps(BODY)
    key = QUEUES["latency_queue"][2]
    total = int(rate * seconds)
    sent: list[tuple[str, float]] = []
    with connect(database) as conn:
        start = time.time() + 0.1
        for i in range(total):
            # On a schedule, not "sleep 1/rate": late messages do not push the rest back.
            wait = start + i / rate - time.time()
            if wait > 0:
                time.sleep(wait)
            message_id = uuid.uuid4()
            conn.execute("SELECT pgmb.send(%s, %s, %s::jsonb)", (message_id, key, body))
            sent.append((str(message_id), time.time()))  # autocommit: the commit returned
    Path(out).write_text(json.dumps(sent))


@dataclass(frozen=True)
class Latency:
    published: int
    rate: float
    counted: int
    missing: int
    ms: dict[str, float]


def run_latency(
    database: str, recorder: endpoints.Recorder, rate: float, seconds: float
) -> Latency:
    warmup = 1.0
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "django", "pgmb_dispatch", "--queue", "latency_queue",
         "--concurrency", str(CONCURRENCY), "--max-seconds", str(seconds + warmup + 60),
         "-v", "0"],
        env=_env(database), cwd=ROOT,
    )  # fmt: skip
    try:
        with connect(database) as conn:
            deadline = time.monotonic() + 20
            while not conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
                " WHERE datname = current_database() AND query = 'LISTEN pgmb')"
            ).fetchone()[0]:
                if time.monotonic() > deadline or dispatcher.poll() is not None:
                    raise RuntimeError("the dispatcher did not start listening")
                time.sleep(0.05)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run(
                [sys.executable, __file__, "_publish", database, str(rate),
                 str(seconds + warmup), out.name],
                env=_env(database), cwd=ROOT, check=True,
            )  # fmt: skip
            sent = json.loads(Path(out.name).read_text())
        deadline = time.monotonic() + 30
        while recorder.count() < len(sent) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        dispatcher.terminate()
        dispatcher.wait(30)
    arrivals = recorder.arrivals()
    start = sent[0][1]
    counted = [(mid, at) for mid, at in sent if at >= start + warmup]
    delays = sorted((arrivals[mid] - at) * 1000 for mid, at in counted if mid in arrivals)
    missing = sum(1 for mid, _ in counted if mid not in arrivals)

    def pct(p: float) -> float:
        return delays[min(len(delays) - 1, int(p / 100 * len(delays)))] if delays else float("nan")

    return Latency(
        published=len(sent),
        rate=len(sent) / (sent[-1][1] - start) if len(sent) > 1 else 0.0,
        counted=len(delays),
        missing=missing,
        ms={"p50": pct(50), "p95": pct(95), "p99": pct(99), "max": delays[-1] if delays else 0},
    )


# --- 4: the in-database path. ---


def run_indb(database: str, queue_id: str, n: int, batch: int) -> float:
    """Deliveries/s of CALL pgmb.dispatch_loop, from its start to the last ack."""
    import psycopg

    publish("indb_queue", n)
    with connect(database) as caller, connect(database) as watcher:
        (since,) = caller.execute("SELECT clock_timestamp()").fetchone()
        failure: list[BaseException] = []

        def call() -> None:
            try:
                caller.execute("CALL pgmb.dispatch_loop(%s, %s, %s)", (120, batch, ["indb_queue"]))
            except psycopg.errors.QueryCanceled:
                pass  # how we stop it once everything is delivered
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        deadline = time.monotonic() + 120
        while watcher.execute(
            "SELECT EXISTS (SELECT 1 FROM pgmb_delivery WHERE queue_id = %s)", (queue_id,)
        ).fetchone()[0]:
            if failure or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        watcher.execute("SELECT pg_cancel_backend(%s)", (caller.info.backend_pid,))
        thread.join()
        if failure:
            raise failure[0]
        acks, last = watcher.execute(
            "SELECT count(*), max(created_at) FROM pgmb_attempt"
            " WHERE queue_id = %s AND outcome = 'ack' AND created_at >= %s",
            (queue_id, since),
        ).fetchone()
    if acks != n:
        raise RuntimeError(f"in-database check failed: {acks} acks of {n}")
    return n / (last - since).total_seconds()


def run_indb_transport(database: str, url: str, n: int) -> float:
    """Requests/s of pgmb.post_via_plpython alone: n POSTs from one backend, no claim/ack."""
    with connect(database) as conn:
        start = time.perf_counter()
        # In the select list, so that it runs once per row (a FROM item that does not
        # depend on the row would be run once and its result reused).
        (ok,) = conn.execute(
            "SELECT count(*) FILTER (WHERE (o).status = 200) FROM"
            " (SELECT pgmb.post_via_plpython(%s, %s, %s::jsonb, 10) AS o"
            "  FROM generate_series(1, %s) AS g) AS posts",
            (url, json.dumps(BODY), json.dumps(sample_headers()), n),
        ).fetchone()
        elapsed = time.perf_counter() - start
    if ok != n:
        raise RuntimeError(f"PL/Python transport: {ok} of {n} answered 200")
    return n / elapsed


# --- Main. ---


def _row(label: str, values: Sequence[float], base: float | None, note: str = "") -> None:
    value = _median(values)
    ratio = f"{value / base:.2f}" if base else ""
    print(f"  {label:<46} {value:>9,.0f} {_range(values):>15} {ratio:>6}  {note}")


def _others(loads: Sequence[float | None]) -> str:
    known = [x for x in loads if x is not None]
    if not known:
        return ""
    return f"other processes kept {_median(known):.2f} cores busy (max {max(known):.2f})"


def throughput(args: argparse.Namespace, url: str, queue_id: str, load: OtherLoad) -> None:
    from django.db import connection

    print(
        f"\n1-2. Throughput: {args.messages:,} messages per run, {CONCURRENCY} requests in "
        f"flight, {args.rounds} runs of each, interleaved; median (range). ratio = to aiohttp "
        "alone."
    )
    raws: list[RawRun] = []
    raws_uvloop: list[RawRun] = []
    runs: list[DispatchRun] = []
    others: list[float | None] = []
    uvloop = bool(_uvloop_version())
    run_raw(url, 2_000)  # warms nginx and the page cache; not counted
    for round_ in range(args.rounds):
        for kind in ("raw", "dispatch") if round_ % 2 == 0 else ("dispatch", "raw"):
            mark = load.mark()
            if kind == "raw":
                raws.append(run_raw(url, args.messages))
                if uvloop:
                    raws_uvloop.append(run_raw(url, args.messages, uvloop=True))
            else:
                runs.append(run_dispatcher(args.db, queue_id, args.messages))
            others.append(load.since(mark))
            connection.close()
    idle = _median([idle_dispatcher(args.db) for _ in range(2)])
    base = _median([r.rate for r in raws])
    print(f"  {'':<46} {'per sec':>9} {'(range)':>15} {'ratio':>6}")
    for label, group in (("asyncio loop (the ceiling)", raws), ("uvloop", raws_uvloop)):
        if group:
            _row(
                f"aiohttp alone, {label}",
                [r.rate for r in group],
                base,
                f"CPU {_median([r.cpu_us for r in group]):.0f} us/request",
            )
    steady = [r.steady for r in runs]
    met = _median(steady) / base >= 0.5 and _median(steady) >= 5000
    _row(
        "pgmb_dispatch, steady (first ack to last)",
        steady,
        base,
        "goal >= 0.5 and >= 5,000/s: " + ("met" if met else "NOT MET"),
    )
    _row(
        "pgmb_dispatch, end to end (process start-exit)",
        [r.end_to_end for r in runs],
        base,
        f"wall {_median([r.wall for r in runs]):.2f} s, "
        f"CPU {_median([r.cpu_us for r in runs]):.0f} us/delivery",
    )
    print(
        "  CPU: of the client process, start-up included. An idle pgmb_dispatch --until-idle "
        f"starts and exits in {idle:.2f} s. Checked: each run acked all its messages, none left."
    )
    if note := _others(others):
        print(f"  During the runs, {note}.")


def in_database(args: argparse.Namespace, url: str, queue_id: str, load: OtherLoad) -> None:
    from django.db import connection

    n = args.indb_messages
    print(
        f"\n4. In-database path: CALL pgmb.dispatch_loop(batch => {args.indb_batch}) over "
        f"PL/Python, {n:,} messages per run, {args.rounds} runs; ratio = to PL/Python posting "
        "alone from one backend."
    )
    transport: list[float] = []
    indb: list[float] = []
    others: list[float | None] = []
    for _ in range(args.rounds):
        mark = load.mark()
        transport.append(run_indb_transport(args.db, url, n))
        indb.append(run_indb(args.db, queue_id, n, args.indb_batch))
        others.append(load.since(mark))
        connection.close()
    base = _median(transport)
    print(f"  {'':<46} {'per sec':>9} {'(range)':>15} {'ratio':>6}")
    _row("PL/Python urllib POST alone (one backend)", transport, base)
    _row("pgmb.dispatch_loop (claim, POST, ack, COMMIT)", indb, base)
    if note := _others(others):
        print(f"  During the runs, {note}.")


def latency(args: argparse.Namespace, load: OtherLoad) -> None:
    from django.db import connection

    print(
        f"\n3. Latency, COMMIT to arrival at the endpoint: {args.latency_rate:,.0f} messages/s "
        f"asked for {args.latency_seconds:g} s (+1 s of warm-up, not counted), one per "
        f"transaction, from another process; {args.latency_runs} runs. Goal p50 <= 5 ms, "
        "p99 <= 50 ms."
    )
    results: list[Latency] = []
    for _ in range(args.latency_runs):
        with endpoints.recorder() as rec:
            point_worker("recorder", rec.url())
            connection.close()
            mark = load.mark()
            lat = run_latency(args.db, rec, args.latency_rate, args.latency_seconds)
            other = load.since(mark)
        results.append(lat)
        print(
            f"  {lat.rate:,.0f} msg/s, {lat.counted:,} counted: "
            + "  ".join(f"{k} {v:5.1f} ms" for k, v in lat.ms.items())
            + (f"  {lat.missing} NOT RECEIVED" if lat.missing else "")
            + (f"  (other processes: {other:.2f} cores)" if other is not None else "")
        )
    p50 = _median([r.ms["p50"] for r in results])
    p99 = _median([r.ms["p99"] for r in results])
    met = p50 <= 5 and p99 <= 50
    print(
        f"  median of the runs: p50 {p50:.1f} ms, p99 {p99:.1f} ms: "
        + ("goal met" if met else "goal NOT MET")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per throughput run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each throughput case")
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="messages/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-runs", type=int, default=2)
    parser.add_argument("--indb-messages", type=int, default=5_000)
    parser.add_argument("--indb-batch", type=int, default=50, help="as pg_cron's job claims")
    parser.add_argument("--db", default="pgmb_bench_dispatch", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["throughput", "latency", "indb"]
    )
    args = parser.parse_args(argv)

    os.environ["PGMB_BENCH_DB"] = args.db
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.db import connection

    began = time.perf_counter()
    create_database(args.db)
    load = OtherLoad(_postmaster()).start()
    try:
        with endpoints.fast_endpoint() as fast:
            label = fast.kind
            if fast.kind == "nginx":
                version = subprocess.run(
                    [endpoints.NGINX, "-v"], capture_output=True, text=True, check=False
                ).stderr.strip()
                label = version.replace("nginx version: ", "")
            for key, value in machine(f'{label} on 127.0.0.1, answering 200 "ok"'):
                print(f"{key:<9} {value}")
            ids = set_up(fast.url())
            if "throughput" not in args.skip:
                throughput(args, fast.url(), ids["fast_queue"], load)
            if "indb" not in args.skip:
                in_database(args, fast.url(), ids["indb_queue"], load)
        if "latency" not in args.skip:
            latency(args, load)
        print(
            f"\nload average at the end: {os.getloadavg()[0]:.2f}; "
            f"took {time.perf_counter() - began:.0f} s"
        )
        return 0
    finally:
        load.stop()
        connection.close()
        if not args.keep:
            drop_database(args.db)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_raw":
        _raw_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "_publish":
        _publisher(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(main())
