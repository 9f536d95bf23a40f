"""The jobs on a real Spark standalone cluster (a master and a worker on loopback): the
driver is this process, the JDBC reads and Parquet writes run in the worker's executor."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from .history import assert_exactly_once, build_history, message_ids, read_archive, snapshot


@pytest.mark.spark
def test_archive_on_a_standalone_cluster(spark_cluster, transactional_db, make_queue, tmp_path):
    history = build_history(make_queue)
    before = snapshot()
    out = tmp_path / "archive"
    conf = [arg for pair in spark_cluster.driver_conf for arg in ("--conf", pair)]
    report = io.StringIO()

    call_command(
        "pgmb_pipeline",
        "archive",
        *("--master", spark_cluster.url, *conf),
        *("--output", str(out), "--older-than", "5"),
        stdout=report,
    )

    assert "archived 5 messages and 8 attempts" in report.getvalue()
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())
    # The work ran on the cluster: the application finished there, with executors.
    [app] = [a for a in spark_cluster.status()["completedapps"] if a["name"] == "pgmb archive"]
    assert app["state"] == "FINISHED"
