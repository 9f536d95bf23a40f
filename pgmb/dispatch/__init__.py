"""The external dispatcher: claim → POST → ack/fail, on asyncio and psycopg async.

``engine`` runs the loop, ``request`` builds what a worker receives, ``client`` posts it
(over ``http1``, pgmb's HTTP/1.1 client) and classifies the outcome, ``pacing`` spaces
requests to a worker, ``database`` wraps the SQL state machine with reconnection,
``listener`` turns NOTIFY into wake-ups, and ``supervisor`` runs one engine per database a
process serves, and ``heap`` sets the garbage collector up for a process that runs them.
"""
