"""The console's part of 0002 on a database 0.1.0's migration built and filled as 0.1.0
allowed: a one-byte secret, an endpoint with a port out of range, 20 retiring secrets, the
old default endpoint policy. Upgrading fails on none of them, the rows keep working (the
short secret still signs, the worker can still be paused), what signs is bounded at once,
and the stored default policy becomes 0.1.1's default; migrating back restores 0.1.0's."""

from __future__ import annotations

import psycopg

from pgmb import conf

from .conftest import manage

OLD_DEFAULT = ["169.254.0.0/16", "fe80::/10"]


def secret(n: int) -> str:
    return f"a retiring secret, number {n:03}"


def test_0_1_0_rows_survive_the_console_changes(scratch):
    with scratch("pgmb_console_upgrade") as params:
        manage(params["dbname"], "migrate", "pgmb", "0001_initial")
        with psycopg.connect(**params, autocommit=True) as conn:
            [(worker_id,)] = conn.execute(
                "INSERT INTO pgmb_worker (name, endpoint, rps, secret)"
                " VALUES ('old', 'http://127.0.0.1:99999/x', 1, %s) RETURNING id",
                (secret(0),),
            )
            for n in range(1, 21):  # 0.1.0 retires every one
                conn.execute("UPDATE pgmb_worker SET secret = %s", (secret(n),))
            conn.execute("UPDATE pgmb_worker SET secret = 'x'")  # 0.1.0 took one byte
            [(retiring,)] = conn.execute("SELECT count(*) FROM pgmb_worker_secret")
            assert retiring == 21
            # What 0.1.0's migrate wrote from its default setting (this tree's writes 0.1.1's).
            conn.execute("UPDATE pgmb.endpoint_policy SET deny = %s::cidr[]", (OLD_DEFAULT,))
            [(default,)] = conn.execute("SELECT pgmb.endpoint_policy_is_default()")
            assert default is True

        manage(params["dbname"], "migrate", "pgmb")

        with psycopg.connect(**params, autocommit=True) as conn:
            [(signing,)] = conn.execute(
                "SELECT pgmb.signing_secrets(secret, id, now()) FROM pgmb_worker"
            )
            assert signing == ["x", *(secret(n) for n in range(20, 15, -1))]
            conn.execute("UPDATE pgmb_worker SET active = false")  # unchanged: accepted
            [(endpoint, stored)] = conn.execute("SELECT endpoint, secret FROM pgmb_worker")
            assert (endpoint, stored) == ("http://127.0.0.1:99999/x", "x")
            [(deny, default)] = conn.execute(
                "SELECT deny::text[], pgmb.endpoint_policy_is_default() FROM pgmb.endpoint_policy"
            )
            assert deny == conf.DEFAULT_ENDPOINT_POLICY["deny"] and default is True
            # A new short secret is refused now; a rotation trims the retiring ones.
            try:
                conn.execute("UPDATE pgmb_worker SET secret = 'y'")
                raise AssertionError("a one-byte secret was accepted")
            except psycopg.errors.InvalidParameterValue as exc:
                assert "at least 16 bytes" in str(exc)
            conn.execute("UPDATE pgmb_worker SET secret = %s", (secret(21),))
            [(retiring,)] = conn.execute(
                "SELECT count(*) FROM pgmb_worker_secret WHERE worker_id = %s", (worker_id,)
            )
            assert retiring == 5

        manage(params["dbname"], "migrate", "pgmb", "0001_initial")

        with psycopg.connect(**params, autocommit=True) as conn:
            [(deny, default)] = conn.execute(
                "SELECT deny::text[], pgmb.endpoint_policy_is_default() FROM pgmb.endpoint_policy"
            )
            assert deny == OLD_DEFAULT and default is True
            conn.execute("UPDATE pgmb_worker SET secret = 'y'")  # 0.1.0's rule again
