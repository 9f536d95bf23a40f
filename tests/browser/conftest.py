"""Browser tests: Playwright for Python drives Debian's chromium through the real admin,
served by pytest-django's live server against the real test database.

Playwright's own browser downloads are not used: chromium is the system's
(``/usr/bin/chromium``, from the Debian package ``make test`` installs), started headless
with everything that would reach the network switched off. Every test gets a fresh
browser context (its own profile: cookies, storage), one browser serves them all.

Screenshots (full page, 1280x800 viewport) go to ``$PGMB_ARTIFACTS``, by default
``artifacts/screenshots/`` at the repository's root; a failed test leaves one of the page
it was on. The run's summary says where they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.dispatch.conftest import spawn  # noqa: F401  (the dispatcher, a real process)
from tests.waiting import DEADLINE

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# The machine running the tests may have no network: without these, chromium waits on
# connections it tries on its own (updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs the suite as root, where chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
PASSWORD = "browser-tests-only"


def artifacts() -> Path:
    """Where screenshots go: ``$PGMB_ARTIFACTS``, else ``artifacts/screenshots/``."""
    folder = Path(os.environ.get("PGMB_ARTIFACTS") or ROOT / "artifacts" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_saved: list[Path] = []


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page PNG of ``page`` as ``<artifacts>/<name>.png``; return its path."""
    path = artifacts() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    _saved.append(path)
    print(f"screenshot: {path}")
    return path


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, for the browser tests of this package.

    Package-scoped, not session-scoped, on purpose: Playwright's sync API keeps an asyncio
    event loop running on the test thread while it is started, which makes Django refuse
    ORM calls ("async context") and ``asyncio.run`` fail. Django's documented switch for
    that, DJANGO_ALLOW_ASYNC_UNSAFE, is set for exactly as long as Playwright runs (the
    ORM here is used from one thread, the test's, so it is safe), and both end before the
    rest of the suite runs.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            # Waits are for events; the deadline only tells a hang from a busy machine.
            expect.set_options(timeout=DEADLINE * 1000)
            try:
                yield launched
            finally:
                launched.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Keep each phase's report on the test, for the page fixture's screenshot on failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(browser: Browser, live_server, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page in a fresh browser context, its relative URLs resolved against the live
    server; screenshotted as ``<test>-failure.png`` if the test fails."""
    context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)
    context.set_default_timeout(DEADLINE * 1000)
    # The admin's navigation sidebar closed (as its « button leaves it, in localStorage):
    # the lists get the whole 1280 pixels, and the screenshots show all their columns.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    opened = context.new_page()
    try:
        yield opened
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            screenshot(opened, f"{request.node.name}-failure")
        context.close()


@pytest.fixture
def operator(transactional_db) -> User:
    """A staff superuser in the test database (every permission, pgmb's custom ones too)."""
    return User.objects.create_superuser("operator", "operator@example.com", PASSWORD)


@pytest.fixture
def make_staff(transactional_db) -> Callable[..., User]:
    """A staff user (not a superuser) with only the named ``pgmb.<codename>`` permissions."""

    def make(username: str, *codenames: str) -> User:
        user = User.objects.create_user(username, f"{username}@example.com", PASSWORD)
        user.is_staff = True
        user.save()
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="pgmb", codename__in=codenames)
        )
        assert user.user_permissions.count() == len(codenames), "unknown permission"
        return user

    return make


def log_in(page: Page, user: User, then: str = "/admin/") -> None:
    """Log ``user`` in through the admin's login form, landing on ``then``."""
    page.goto(f"/admin/login/?next={then}")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#user-tools")).to_contain_text(user.get_username())


def pytest_terminal_summary(terminalreporter) -> None:
    if _saved:
        terminalreporter.write_line(
            f"browser tests: {len(_saved)} screenshot(s) in {_saved[0].parent}"
        )
