"""tests/pg_http/install.sh leaves an extension folder exactly as it found it.

The test runs install the stand-in with ``--save`` and undo it with ``--restore``; these run
the real script on a real folder laid out as PostgreSQL's share directory is, and compare
every file's bytes and mode before and after.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parents[1] / "pg_http" / "install.sh"
STANDIN = INSTALL.parent
FILES = ("http.control", "http--1.6.sql")
REAL_CONTROL = "default_version = '1.6'\nmodule_pathname = '$libdir/http'\n"


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *map(str, args)], capture_output=True, text=True, check=False
    )


def _listing(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())}


def _share(tmp_path: Path, found: str) -> Path:
    """A share directory whose extension folder holds what a test run may find there."""
    ext = tmp_path / "share" / "extension"
    ext.mkdir(parents=True)
    (ext / "plpgsql.control").write_text("# PostgreSQL's own\n")
    if found == "an outdated stand-in":
        for name in FILES:
            (ext / name).write_bytes((STANDIN / name).read_bytes() + b"-- an older copy\n")
            (ext / name).chmod(0o640)
    elif found == "the stand-in":
        for name in FILES:
            (ext / name).write_bytes((STANDIN / name).read_bytes())
    elif found == "a real pgsql-http":
        (ext / "http.control").write_text(REAL_CONTROL)
    return tmp_path / "share"


@pytest.mark.parametrize(
    "found", ["no http", "an outdated stand-in", "the stand-in", "a real pgsql-http"]
)
def test_save_install_restore_leaves_the_folder_as_found(tmp_path, found):
    share = _share(tmp_path, found)
    before = _listing(share / "extension")
    saved = tmp_path / "saved"

    done = _run("--save", saved, share)
    assert done.returncode == 0, done.stderr
    during = _listing(share / "extension")
    if found == "a real pgsql-http":
        assert during == before  # never replaced
    else:  # the tests run against the current stand-in
        for name in FILES:
            assert during[name][0] == (STANDIN / name).read_bytes()

    done = _run("--restore", saved, share)
    assert done.returncode == 0, done.stderr
    assert _listing(share / "extension") == before


def test_restore_refuses_a_folder_save_did_not_write(tmp_path):
    share = _share(tmp_path, "the stand-in")
    before = _listing(share / "extension")
    (tmp_path / "other").mkdir()
    done = _run("--restore", tmp_path / "other", share)
    assert done.returncode != 0
    assert "was not written by --save" in done.stderr
    assert _listing(share / "extension") == before


def test_save_refuses_a_folder_in_use(tmp_path):
    share = _share(tmp_path, "no http")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "http.control.absent").touch()
    done = _run("--save", saved, share)
    assert done.returncode != 0
    assert "needs an empty folder" in done.stderr
    assert "http.control" not in _listing(share / "extension")  # nothing installed
