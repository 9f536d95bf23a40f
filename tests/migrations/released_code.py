"""A released pgmb as its users run it: its wheel, built from this repository's own history
at the release's commit (tags may not travel with a clone), installed apart from this
checkout, its commands run as processes against a scratch database.

The tests that upgrade from a release run the release's `migrate`, `pgmb_dispatch` and SQL
while the code of this checkout migrates the same database
(docs/decisions/0062-upgrades-under-running-dispatchers.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.migrations.conftest import ROOT
from tests.migrations.releases import RELEASE_COMMITS

#: The released app's settings: only what it needs, nothing of this checkout (whose
#: ``tests`` package is not on its path). The server is the one the tests use (libpq's
#: variables), the database the scratch one the test names.
SETTINGS = """
import os
SECRET_KEY = "released-pgmb-under-upgrade"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "pgtrigger", "pgmb"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql",
                         "HOST": os.environ.get("PGHOST", "127.0.0.1"),
                         "PORT": os.environ.get("PGPORT", "5432"),
                         "USER": os.environ.get("PGUSER", "postgres"),
                         "PASSWORD": os.environ.get("PGPASSWORD", ""),
                         "NAME": os.environ["PGMB_DB_NAME"]}}
"""


@dataclass(frozen=True)
class ReleasedPgmb:
    """One release's wheel installed with ``pip --target`` into ``site``, and a project
    folder holding its settings."""

    version: str
    site: Path
    project: Path

    def env(self, dbname: str) -> dict[str, str]:
        # The installed wheel and the settings first: the interpreter's site-packages
        # (Django, psycopg, django-pgtrigger) come after them, this checkout not at all.
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.site), str(self.project)]),
            "DJANGO_SETTINGS_MODULE": "released_settings",
            "PGMB_DB_NAME": dbname,
        }

    def manage(self, dbname: str, *args: str) -> str:
        """Run the release's ``django-admin ARGS``; fail the test if it fails."""
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=self.project,
            env=self.env(dbname),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{self.version}'s {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, dbname: str, *args: str, path: str = "") -> subprocess.Popen:
        """Start the release's ``django-admin ARGS`` (the caller stops it); ``path`` is
        added to its module search path (handlers of ``pgmb_consume``)."""
        env = self.env(dbname)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"], path]))
        return subprocess.Popen(
            [sys.executable, "-m", "django", *args],
            cwd=self.project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def release_commit(version: str) -> str:
    """The full hash of the release's commit; fails the test, saying why, when this clone
    does not have it (a shallow clone, or a copy that is not a git clone)."""
    commit = RELEASE_COMMITS[version]
    found = _run("git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode != 0:
        said = f" (git: {found.stderr.strip()})" if found.stderr.strip() else ""
        pytest.fail(
            f"pgmb {version}'s release commit {commit} is not in {ROOT}{said}: the upgrade "
            "tests build that release from this repository's history, so they need a full "
            "clone (`git fetch --unshallow`), not a shallow one or an exported tree",
            pytrace=False,
        )
    return found.stdout.strip()


def build_release(version: str, workdir: Path) -> ReleasedPgmb:
    """Build ``version``'s wheel from its commit and install it under ``workdir``."""
    commit = release_commit(version)
    source, wheels, site, project = (workdir / n for n in ("source", "wheels", "site", "project"))
    for folder in (source, wheels, project):
        folder.mkdir(parents=True)
    archive = workdir / "source.tar"
    steps = [
        ("git", "archive", "--format=tar", "-o", str(archive), commit),
        ("tar", "-xf", str(archive), "-C", str(source)),
        (sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)),
    ]
    for step in steps:
        done = _run(*step)
        assert done.returncode == 0, f"{' '.join(step)}: {done.stderr}"
    [wheel] = wheels.glob("django_pgmb-*.whl")
    assert wheel.name == f"django_pgmb-{version}-py3-none-any.whl", wheel.name
    step = (sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site))
    done = _run(*step, str(wheel))
    assert done.returncode == 0, f"pip install {wheel.name}: {done.stderr}"
    (project / "released_settings.py").write_text(SETTINGS)
    released = ReleasedPgmb(version, site, project)
    # The release's code runs, not this checkout's (nor the editable install of the venv).
    where = subprocess.run(
        [sys.executable, "-c", "import pgmb; print(pgmb.__file__, pgmb.__version__)"],
        cwd=project,
        env=released.env("unused"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    path, loaded = where.stdout.split()
    assert path.startswith(str(site)) and loaded == version, where.stdout + where.stderr
    return released
