"""A throwaway PostgreSQL cluster with ``ssl = on`` and a certificate from a test CA, for
the pipeline's TLS tests (the shared test cluster keeps TLS off)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster.sh"
#: A database whose name needs percent-encoding in a JDBC URL.
ODD_DBNAME = "odd db/ü?#"


@dataclass(frozen=True)
class TLSCluster:
    port: int
    #: The CA that signed the server's certificate (for 127.0.0.1 and localhost).
    ca: Path
    #: Another CA, which signed nothing the server shows.
    wrong_ca: Path

    def conninfo(self, **params: str) -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=str(self.port), user="postgres", **params
        )


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, crt = folder / f"{name}.key", folder / f"{name}.crt"
    _openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-subj", f"/CN=pgmb test {name}", "-keyout", str(key), "-out", str(crt)),
    )
    return key, crt


@contextmanager
def tls_cluster() -> Iterator[TLSCluster]:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed (make deps installs it)")
    # Reachable by the "postgres" user the server runs as when the tests run as root.
    folder = Path(tempfile.mkdtemp(prefix="pgmb-tls."))
    folder.chmod(0o755)
    certs = folder / "certs"
    certs.mkdir()
    try:
        ca_key, ca = _make_ca(certs, "ca")
        _, wrong_ca = _make_ca(certs, "wrong-ca")
        key, csr, crt = certs / "server.key", certs / "server.csr", certs / "server.crt"
        _openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"),
            *("-keyout", str(key), "-out", str(csr)),
        )
        ext = certs / "server.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl(
            *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(crt)),
        )
        started = subprocess.run(
            [str(SCRIPT), "start", str(folder / "pg")], check=True, capture_output=True, text=True
        )
        port = int(started.stdout.split("PGPORT=")[1].split()[0])
        data = folder / "pg" / "data"
        for each in (crt, key):
            shutil.copy(each, data / each.name)
            os.chmod(data / each.name, 0o600)
            if os.getuid() == 0:
                shutil.chown(data / each.name, "postgres", "postgres")
        with open(data / "postgresql.auto.conf", "a") as conf:
            conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
        subprocess.run([str(SCRIPT), "restart", str(folder / "pg")], check=True)
        cluster = TLSCluster(port, ca, wrong_ca)
        with psycopg.connect(cluster.conninfo(dbname="postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{ODD_DBNAME}"')
        yield cluster
    finally:
        subprocess.run([str(SCRIPT), "destroy", str(folder / "pg")], check=False)
        shutil.rmtree(folder, ignore_errors=True)
