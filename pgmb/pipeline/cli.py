"""The pipeline's command line, shared by ``python -m pgmb.pipeline``, ``spark-submit`` and
``manage.py pgmb_pipeline``.

    JOB [--dsn DSN] [--master URL] [--conf KEY=VALUE …] [--jars JARS] [--partitions N] …

Each job module adds its own options (``add_arguments``), may check them without Spark
(``validate(options)``, optional) and does its work in ``run(spark, database, options,
out)``. Before Spark starts, the options and the database are checked;
any :class:`~pgmb.errors.PipelineError` ends the run with one line on stderr and
exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import PipelineError
from . import JOBS
from .postgres import Database
from .spark import DEFAULT_MASTER, parse_conf, session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark partitions of a JDBC read or a publish when --partitions is not given.
DEFAULT_PARTITIONS = 4


class Output(Protocol):
    """Where a job reports (stdout, or a management command's ``self.stdout``)."""

    def write(self, text: str, /) -> object: ...


def say(out: Output, line: str) -> None:
    """Write one line of a job's report (whole lines: a Django OutputWrapper adds none)."""
    out.write(line + "\n")
    flush = getattr(out, "flush", None)
    if flush:
        flush()


class Job(Protocol):
    """What a job module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(
        self, spark: SparkSession, database: Database, options: argparse.Namespace, out: Output
    ) -> int: ...


def job(name: str) -> Job:
    """The module of job ``name``."""
    module: Job = importlib.import_module(f"{__package__}.{name}")
    return module


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def parser(prog: str = "pgmb.pipeline", *, dsn_required: bool = False) -> argparse.ArgumentParser:
    """The whole command line: one sub-command per job, each with the common options."""
    top = argparse.ArgumentParser(prog=prog, description="pgmb's Spark jobs")
    jobs = top.add_subparsers(dest="job", required=True, metavar="JOB")
    for name in JOBS:
        module = job(name)
        sub = jobs.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        common = sub.add_argument_group("database and Spark")
        common.add_argument(
            "--dsn",
            required=dsn_required,
            help="libpq connection string or URI (default: the PG* environment variables)",
        )
        common.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL")
        common.add_argument(
            "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
        )
        common.add_argument("--jars", help="comma-separated jars (default: Debian's JDBC driver)")
        common.add_argument(
            "--partitions",
            type=positive_int,
            default=DEFAULT_PARTITIONS,
            help=f"Spark partitions of reads and writes (default {DEFAULT_PARTITIONS})",
        )
        module.add_arguments(sub)
    return top


def refuse_password_in_dsn(options: argparse.Namespace) -> None:
    """A password in ``--dsn`` on a command line is readable by every local user (the
    process list, shell history, the Spark UI's command line): refused, pointing at
    libpq's ways of keeping it out (decision record 0037)."""
    if options.dsn and Database.from_dsn(options.dsn).has_password:
        raise PipelineError(
            "--dsn carries a password, which any user of this machine can read in the "
            "process list; set PGPASSWORD, or use a password file (~/.pgpass, PGPASSFILE) "
            "or a service (PGSERVICE) instead (docs/pipeline.md#passwords)"
        )


def run(options: argparse.Namespace, out: Output = sys.stdout) -> int:
    """Run the job that ``options`` name; errors propagate as :class:`PipelineError`."""
    given = Database.from_dsn(options.dsn)
    module = job(options.job)
    # Options that can be checked without Spark are, before its JVM takes seconds to start.
    validate = getattr(module, "validate", None)
    if validate is not None:
        validate(options)
    database = given.resolved()
    database.check()
    # TLS options JDBC cannot honour end the run here, before Spark starts.
    _ = database.jdbc_properties
    spark = session(options.job, options.master, parse_conf(options.conf), options.jars)
    try:
        return module.run(spark, database, options, out)
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None, prog: str = "pgmb.pipeline") -> int:
    """Parse ``argv``, run the job, and turn a :class:`PipelineError` into one line."""
    options = parser(prog).parse_args(argv)
    try:
        refuse_password_in_dsn(options)
        return run(options)
    except PipelineError as e:
        print(f"{prog} {options.job}: error: {e}", file=sys.stderr)
        return 2
