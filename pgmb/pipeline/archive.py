"""The ``archive`` job (being built)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .cli import Output
from .database import Database
from .errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This job's own options."""


def run(spark: SparkSession, database: Database, options: argparse.Namespace, out: Output) -> int:
    raise PipelineError("the archive job is not built yet")
