"""Fixtures of the Spark pipeline's tests.

Spark reads and writes through its own JDBC connections, so these tests commit their data
(``transactional_db``). Jobs run through ``manage.py pgmb_pipeline`` on ``local[2]``, or
on a real standalone cluster (``spark_cluster``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests.waiting import wait_until

from .tls_cluster import TLSCluster, tls_cluster

#: Two cores on these machines: local[2] keeps a job's tasks from queueing behind each other.
MASTER = "local[2]"
#: Seconds a cluster's JVMs may take to start on a busy machine.
CLUSTER_DEADLINE = 300.0


@pytest.fixture
def run_pipeline(transactional_db) -> Callable[..., str]:
    """Run ``manage.py pgmb_pipeline JOB ARGS…`` on the test database; its report."""

    def run(job: str, *args: str) -> str:
        out = io.StringIO()
        call_command("pgmb_pipeline", job, "--master", MASTER, *args, stdout=out)
        return out.getvalue()

    return run


# A Spark standalone cluster on loopback: a master and one worker, started from the PySpark
# installation's own jars, for as long as the session needs it.


def _free_ports(count: int) -> list[int]:
    """``count`` free ports, all different: held open together while they are chosen."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


@dataclass(frozen=True)
class SparkCluster:
    #: The master's URL, for --master.
    url: str
    #: The master's web UI; ``/json`` there describes workers and applications.
    ui: str
    #: --conf pairs a driver in this process needs to be reachable by the executors.
    driver_conf: tuple[str, ...] = ("spark.driver.host=127.0.0.1",)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.ui}/json", timeout=10) as answer:
            return dict(json.load(answer))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory) -> Iterator[SparkCluster]:
    """A master and one worker (1 core, 1 GB) on 127.0.0.1; stopped at the end."""
    import pyspark

    home = Path(pyspark.__file__).parent
    java = shutil.which("java")
    if java is None:
        pytest.fail("no java on PATH: a Spark cluster needs Java 17")
    # What Spark's launch scripts (load-spark-env.sh) tell the worker, which builds its
    # executors' command line from it: spark-core_2.13-4.3.0.jar is Scala 2.13.
    [core] = home.glob("jars/spark-core_*.jar")
    scala = core.name.split("_")[1].split("-")[0]
    folder = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = _free_ports(3)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SCALA_VERSION": scala,
        # Executors run on this machine, with this Python, should a job run Python code.
        "PYSPARK_PYTHON": sys.executable,
    }
    classpath = f"{home}/jars/*"
    commands = {
        "master": [
            *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
            *("--port", str(port), "--webui-port", str(ui)),
        ],
        "worker": [
            *("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}"),
            *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
            *("--webui-port", str(worker_ui), "--work-dir", str(folder / "work")),
        ],
    }
    processes: dict[str, subprocess.Popen] = {}
    try:
        for name, args in commands.items():
            with open(folder / f"{name}.log", "w") as log:
                processes[name] = subprocess.Popen(
                    [java, "-cp", classpath, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}")

        def registered() -> bool:
            for name, process in processes.items():
                log = (folder / f"{name}.log").read_text()
                assert process.poll() is None, f"the Spark {name} ended:\n{log[-3000:]}"
            try:
                return cluster.status().get("aliveworkers", 0) >= 1
            except (OSError, ValueError):
                # Not answering yet, or not with its JSON yet (a page while it starts).
                return False

        wait_until(registered, CLUSTER_DEADLINE, "the Spark worker to register", 0.5)
        yield cluster
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[TLSCluster]:
    """A separate PostgreSQL cluster with TLS on (tls_cluster.py); destroyed after the module."""
    with tls_cluster() as cluster:
        yield cluster
