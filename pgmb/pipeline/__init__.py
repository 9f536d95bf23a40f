"""pgmb's data pipeline on Apache Spark (PySpark, the ``[spark]`` extra).

Three jobs, each a module with ``add_arguments(parser)`` and ``run(options) -> int``:

* ``archive``: finished messages and their attempts to Parquet, then out of PostgreSQL;
* ``stats``: hourly delivery statistics per queue and worker;
* ``publish``: a dataset (Parquet, JSON Lines, CSV) published into pgmb, routed.

Run them as ``manage.py pgmb_pipeline JOB …`` (the database comes from Django's settings)
or as ``python -m pgmb.pipeline JOB …`` / ``spark-submit pgmb/pipeline/__main__.py JOB …``
(the database from ``--dsn`` or libpq's ``PG*`` variables). Nothing in this package imports
Django, and ``pyspark`` is imported only when a job starts a session, so the executors of
a cluster need neither Django nor the project's settings.
"""

from __future__ import annotations

#: The jobs, by name, as modules of this package.
JOBS = ("archive", "stats", "publish")
