"""The external dispatcher: claim → POST → ack/fail, on asyncio and psycopg async.

``engine`` runs the loop; ``registration`` keeps the dispatcher's row (heartbeats, the
waiting mark), ``housekeeper`` vacuums and rebuilds once the work is drained; ``client``
posts a request (over ``http1``, pgmb's HTTP/1.1 client; what a worker receives is built
by :mod:`pgmb.worker_request`) and classifies the outcome; ``pacing`` spaces requests to a
worker; ``supervisor`` runs one engine per database a process serves, and ``gc_tuning``
sets the garbage collector up for a process that runs them. The connections, reconnected
after an outage, and the NOTIFY listener are :mod:`pgmb.db.reconnecting`'s.
"""
