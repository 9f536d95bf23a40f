"""The README's install works from the wheel: ``pip wheel`` builds one that carries every
file of the package, and a project that has only the wheel (not this checkout) migrates,
passes its checks and routes a message (on a scratch database beside the test database)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest

from pgmb import __version__
from tests.migrations.conftest import ROOT

SETTINGS = """
import os
SECRET_KEY = "wheel-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "pgtrigger", "pgmb"]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql",
                         "HOST": os.environ["PGHOST"], "PORT": os.environ["PGPORT"],
                         "USER": os.environ["PGUSER"], "PASSWORD": os.environ.get("PGPASSWORD", ""),
                         "NAME": os.environ["WHEEL_DB"]}}
"""


def _tracked_files(*paths: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.split() if (ROOT / name).is_file()]


def _clean_copy(destination: Path) -> Path:
    """The project's files as a clone has them: no build/, egg-info or caches, whose stale
    copies setuptools would otherwise put in the wheel."""
    for name in _tracked_files():
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination / name)
    return destination


@pytest.mark.slow
@pytest.mark.django_db
def test_the_wheel_installs_migrates_and_routes(scratch, tmp_path: Path):
    source = _clean_copy(tmp_path / "clone")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("django_pgmb-*.whl")
    assert wheel.name == f"django_pgmb-{__version__}-py3-none-any.whl"

    # Every tracked file of the package is in the wheel, and LICENSE beside it.
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = {name for name in _tracked_files("pgmb") if name not in names}
    assert not missing, f"the wheel lacks {sorted(missing)}"
    assert any(name.endswith("/LICENSE") for name in names)

    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", target, wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "wheel_settings.py").write_text(SETTINGS)

    with scratch("pgmb_wheel") as info:
        # Only the installed wheel and the project are on the path, never this checkout: the
        # interpreter's own site-packages (Django, psycopg…) come after them.
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(target), str(project)]),
            "DJANGO_SETTINGS_MODULE": "wheel_settings",
            "WHEEL_DB": info["dbname"],
        }

        def django(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "django", *args],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{args}: {done.stderr}"
            return done.stdout

        where = django("shell", "-v", "0", "-c", "import pgmb; print(pgmb.__file__)")
        assert where.strip().startswith(str(target)), where
        django("migrate", "--noinput", "-v", "0")
        django("check", "--database", "default")

        with psycopg.connect(**info, autocommit=True) as conn:
            [(worker,)] = conn.execute(
                "SELECT pgmb.worker('w', 'http://127.0.0.1:9/', 1)"
            ).fetchall()
            conn.execute("SELECT pgmb.create('order_queue', 'order.*', %s, 1)", (worker,))
            conn.execute("SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}')")
            assert conn.execute("SELECT count(*) FROM pgmb.order_queue").fetchone() == (1,)
