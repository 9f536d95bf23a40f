"""The metrics read pgmb_delivery and pgmb_attempt through their indexes: the plans
(EXPLAIN, on a few thousand rows, analyzed), not timings."""

from __future__ import annotations

import json

import pytest

N_QUEUES = 20


@pytest.fixture
def crowd(sql, make_worker, make_queue):
    workers = [make_worker(f"crowd_worker_{i}") for i in range(4)]
    queues = [
        make_queue(f"crowd{i}.#", name=f"crowd_{i}", worker=workers[i % 4]) for i in range(N_QUEUES)
    ]
    ids = [str(q.pk) for q in queues]
    sql(
        "INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at,"
        " created_at, last_error)"
        " SELECT gen_random_uuid(), (%s::uuid[])[1 + i %% %s], 'ready', i %% 3,"
        " now() + (i %% 7 - 3) * interval '1 minute', now() - i * interval '1 second', ''"
        " FROM generate_series(1, 4000) AS i",
        (ids, N_QUEUES),
    )
    sql(
        "INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at,"
        " created_at, lease_id, last_error)"
        " SELECT gen_random_uuid(), (%s::uuid[])[1 + i %% %s], 'leased', 1,"
        " now() + interval '1 minute', now(), gen_random_uuid(), ''"
        " FROM generate_series(1, 40) AS i",
        (ids, N_QUEUES),
    )
    sql(
        "INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status,"
        " last_error, created_at)"
        " SELECT gen_random_uuid(), (%s::uuid[])[1 + i %% %s], 6, 503, '', now()"
        " FROM generate_series(1, 2000) AS i",
        (ids, N_QUEUES),
    )
    # 6000 attempts over 10 days, 1 in 6 of them acked, a few in the last hour.
    sql(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " SELECT gen_random_uuid(), (%s::uuid[])[1 + i %% %s], 1,"
        " CASE WHEN i %% 6 = 0 THEN 'ack' ELSE 'retry' END, 200, i %% 100, '',"
        " now() - i * interval '2 minutes'"
        " FROM generate_series(1, 6000) AS i",
        (ids, N_QUEUES),
    )
    sql("ANALYZE pgmb_delivery, pgmb_attempt, pgmb_dead_letter, pgmb_queue, pgmb_worker")
    return queues


def plan_nodes(sql, statement: str) -> list[dict]:
    ((plan,),) = sql(f"EXPLAIN (FORMAT JSON) {statement}")
    plan = plan if isinstance(plan, list) else json.loads(plan)
    nodes, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    # The history tables are partitioned by day (decision 0076): a scan of a partition, or
    # of a partition's index, is named here after the table or index it is a partition of.
    names = [n[key] for n in nodes for key in ("Relation Name", "Index Name") if n.get(key)]
    # A partition of a few pages (a day ahead, today's in a test database) is read by a Seq
    # Scan of next to nothing: left out.
    partitions = {
        name: (parent, empty)
        for name, parent, empty in sql(
            "SELECT i.inhrelid::regclass::text, i.inhparent::regclass::text,"
            " c.relpages < 16"
            " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhrelid::regclass::text = ANY (%s)",
            (names,),
        )
    }
    kept = []
    for n in nodes:
        if n["Node Type"] == "Seq Scan" and partitions.get(n.get("Relation Name"), ("", False))[1]:
            continue
        for key in ("Relation Name", "Index Name"):
            if n.get(key) in partitions:
                n[key] = partitions[n[key]][0]
        kept.append(n)
    return kept


def scans(nodes: list[dict], table: str) -> list[tuple[str, str | None]]:
    """How ``table`` is read: (node type, index); a bitmap scan's index is its child's."""
    return [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == table
        or (n["Node Type"] == "Bitmap Index Scan" and n["Index Name"].startswith(table))
    ]


def assert_no_seq_scan(nodes: list[dict]) -> None:
    for table in ("pgmb_delivery", "pgmb_attempt", "pgmb_dead_letter"):
        kinds = scans(nodes, table)
        assert kinds, f"{table} not read?"
        assert all(kind != "Seq Scan" for kind, _ in kinds), (table, kinds)


def test_one_queue_reads_only_its_rows_through_indexes(crowd, sql):
    nodes = plan_nodes(sql, "SELECT * FROM pgmb.metrics_all() WHERE queue_name = 'crowd_3'")
    assert_no_seq_scan(nodes)
    delivery = {index for _, index in scans(nodes, "pgmb_delivery")}
    assert "pgmb_delivery_due" in delivery  # the queue's ready rows
    attempt = {index for _, index in scans(nodes, "pgmb_attempt")}
    assert {"pgmb_attempt_acked", "pgmb_attempt_created"} <= attempt
    # The name's condition reaches pgmb_queue: one queue, not every queue then a filter.
    queue_scan = [n for n in nodes if n.get("Relation Name") == "pgmb_queue"]
    assert any("crowd_3" in json.dumps(n) for n in queue_scan), queue_scan


def test_every_queue_through_indexes(crowd, sql):
    assert_no_seq_scan(plan_nodes(sql, "SELECT * FROM pgmb.metrics_all()"))


def test_workers_through_indexes(crowd, sql):
    nodes = plan_nodes(sql, "SELECT * FROM pgmb.worker_metrics()")
    kinds = scans(nodes, "pgmb_attempt")
    assert kinds and all(kind != "Seq Scan" for kind, _ in kinds), kinds
    assert "pgmb_attempt_acked" in {index for _, index in kinds}  # the last success


def test_the_plans_compute_what_they_should(crowd, sql):
    (total,) = sql(
        "SELECT sum(total_messages) FROM pgmb.metrics_all() WHERE queue_name LIKE 'crowd%%'"
    )[0]
    assert total == 4000 + 40 + 2000 + 1000  # live + dead + acked
