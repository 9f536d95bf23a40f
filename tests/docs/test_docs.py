"""The documentation's own checks: links that lead somewhere, commands that exist.

Every tracked Markdown file is read: a relative link must name a file or folder of the
repository, and an ``#anchor`` a heading of its target (GitHub's slugs). A ``make TARGET``
written in code must be a target of the Makefile. The README stays a ten-minute read, and
the version is written the same in setup.cfg and ``pgmb.__version__``. No database needed.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import pgmb

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
#: Written in two parts so that this file does not point there itself.
SHARED = "../" + "shared/"

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_MAKE = re.compile(r"(?:^|[\s;&|(])make((?:\s+(?:-\S+|\w+=\S*))*)\s+([A-Za-z_][\w.-]*)")
_TARGET = re.compile(r"^([A-Za-z_][\w.-]*(?:[ \t]+[A-Za-z_][\w.-]*)*)[ \t]*:(?!=)", re.MULTILINE)


def tracked_files() -> list[Path]:
    """The repository's files as git knows them (what a clone holds)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def markdown_files() -> list[Path]:
    return [path for path in tracked_files() if path.suffix == ".md"]


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_and_code(text: str) -> Iterator[tuple[int, str, bool]]:
    """Each line with its number and whether it lies in a fenced code block."""
    fence = ""
    for number, line in enumerate(text.splitlines(), 1):
        opened = _FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
            yield number, line, True
        elif opened:
            fence = opened.group(1)
            yield number, line, True
        else:
            yield number, line, False


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, - for blanks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors a Markdown file offers: its headings' slugs (-1, -2 for repeats)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line, in_code in prose_and_code(path.read_text()):
        if in_code:
            continue
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> Iterator[tuple[int, str]]:
    """The link targets of a Markdown file's prose (code shows links, it does not make them)."""
    for number, line, in_code in prose_and_code(path.read_text()):
        if in_code:
            continue
        prose = _CODE_SPAN.sub("", line)
        for target in _LINK.findall(prose):
            yield number, target
        reference = _REFERENCE.match(prose)
        if reference:
            yield number, reference.group(1)


def link_problem(source: Path, target: str) -> str | None:
    """Why a link of ``source`` leads nowhere, or None."""
    if _SCHEME.match(target) or target.startswith("//"):
        return None  # another site's page: not this test's to fetch
    where, _, anchor = target.partition("#")
    if where.startswith("/"):
        resolved = ROOT / where.lstrip("/")
    else:
        resolved = (source.parent / where).resolve() if where else source
    if not resolved.exists():
        return f"no such file: {where}"
    try:
        resolved.relative_to(ROOT)
    except ValueError:
        return f"outside the repository: {where}"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"no heading with the anchor #{anchor} in {_relative(resolved)}"
    return None


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return {
        name
        for names in _TARGET.findall(makefile)
        for name in names.split()
        if not name.startswith(".")
    }


def make_commands(path: Path) -> Iterator[tuple[int, str]]:
    """The targets of ``make`` commands written in a file's code (blocks and spans)."""
    for number, line, in_code in prose_and_code(path.read_text()):
        pieces = [line] if in_code else [span for _, span in _CODE_SPAN.findall(line)]
        for piece in pieces:
            for _, target in _MAKE.findall(piece):
                yield number, target


def test_every_relative_link_and_anchor_leads_somewhere():
    broken = [
        f"{_relative(path)}:{number}: ({target}) {problem}"
        for path in markdown_files()
        for number, target in links(path)
        if (problem := link_problem(path, target))
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_make_target_named_in_the_docs_exists():
    targets = make_targets()
    assert {"demo", "test"} <= targets, f"the Makefile's targets, as read: {sorted(targets)}"
    unknown = [
        f"{_relative(path)}:{number}: make {target}"
        for path in markdown_files()
        for number, target in make_commands(path)
        if target not in targets
    ]
    assert not unknown, "no such Makefile target:\n" + "\n".join(unknown)


def test_the_readme_is_a_ten_minute_read():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


def test_no_file_points_outside_the_project():
    pointing = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # images and other binary files
        pointing += [
            f"{_relative(path)}:{number}"
            for number, line in enumerate(text.splitlines(), 1)
            if SHARED in line
        ]
    assert not pointing, f"files pointing to {SHARED}:\n" + "\n".join(pointing)


def test_the_version_is_written_once_in_each_place():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert pgmb.__version__ == config["metadata"]["version"]


# The checks' own parts, on text made for them: each must be able to fail.


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Quick start: the two commands", "quick-start-the-two-commands"),
        ("`manage.py pgmb_send`", "managepy-pgmb_send"),
        ("Rate limits, retries, dead letters", "rate-limits-retries-dead-letters"),
        ("Ordered groups (SQS FIFO `MessageGroupId`)", "ordered-groups-sqs-fifo-messagegroupid"),
        ("See [the API](sql-api.md) here", "see-the-api-here"),
        ("[0.1.0] - Unreleased", "010---unreleased"),
    ],
)
def test_slugs_are_githubs(heading, expected):
    assert slug(heading) == expected


def test_broken_links_and_unknown_targets_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n## Twice\n\n## Twice\n\n"
        "[ok](../README.md#intro) [ok](#twice-1) [web](https://example.org/x.md)\n"
        "[gone](missing.md) [bad anchor](#nowhere) `[not a link](missing.md)`\n"
        "```sh\n[in code](missing.md)\nmake demo\nmake nothing\n```\n"
        "Run `make -j2 lint` or `PGMQ_SQL=x make bench`; make sure it works.\n"
    )
    (tmp_path / "README.md").write_text("# Intro\n")
    (tmp_path / "Makefile").write_text(".PHONY: demo\ndemo test: venv\n\t@true\nX := 1\n")
    problems = [(n, t, link_problem(page, t)) for n, t in links(page)]
    assert [(n, t) for n, t, problem in problems if problem] == [
        (8, "missing.md"),
        (8, "#nowhere"),
    ]
    assert make_targets() == {"demo", "test"}
    assert list(make_commands(page)) == [(11, "demo"), (12, "nothing"), (14, "lint"), (14, "bench")]
