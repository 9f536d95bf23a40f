"""pgmb's database layer, shared by every part of the package.

``statements`` runs one SQL statement with its parameters and a reader of its rows
(:class:`~pgmb.db.statements.Call`) on a Django connection, a psycopg connection or an
async one; ``values`` turns what PostgreSQL returns into Python values and back;
``conninfo`` makes psycopg connection arguments out of a Django database alias;
``pooler`` opens connections that know whether a transaction pooler (PgBouncer) is in
between; ``reconnecting`` keeps an async connection (and a LISTEN) alive across outages, waiting
with ``backoff``; ``error_text`` says in one line what went wrong.

This package imports nothing of pgmb but the settings (:mod:`pgmb.conf`) and the SQL
(:mod:`pgmb.sql`), both leaves, so
every module above may use it.
"""
