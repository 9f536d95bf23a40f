"""Refresh the frozen copies of pgmb/sql/schema/ that the unreleased migration runs
(`make schema`). A released migration's files are never written again.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.migrations.releases import FROZEN, RELEASED, UNRELEASED, frozen  # noqa: E402


def main() -> None:
    if UNRELEASED in RELEASED:
        sys.exit(f"{UNRELEASED} is released: its files are frozen")
    for filename in FROZEN:
        path = ROOT / "pgmb" / "sql" / "migrations" / filename
        path.write_text(frozen(filename), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
