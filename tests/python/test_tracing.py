"""Without opentelemetry installed, pgmb imports none of it and leaves messages as they are
(pgmb.tracing): run in a Python whose imports of the package fail, as where it is absent."""

from __future__ import annotations

import os
import subprocess
import sys

ABSENT = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
import django
django.setup()
import pgmb.consume, pgmb.dispatch.engine, pgmb.publish, pgmb.tasks.backend, pgmb.trace_export
from django.core.management import CommandError, call_command
from pgmb import tracing

headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
assert tracing.ENABLED is False
assert tracing.publish_headers() == {}
assert tracing.with_headers(headers, tracing.publish_headers()) is headers
assert tracing.traced(headers) is False
with tracing.consume_span("q", []):
    pass
try:
    call_command("pgmb_trace_export")
except CommandError as exc:
    assert "OpenTelemetry is not installed: pip install 'pgmb[otel]'" in str(exc), exc
else:
    raise AssertionError("pgmb_trace_export ran without OpenTelemetry")
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_without_the_package_nothing_is_imported_and_nothing_changes():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", ABSENT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


NO_PROVIDER = """
import django
django.setup()
from django.core.management import CommandError, call_command

try:
    call_command("pgmb_trace_export")
except CommandError as exc:
    print(exc)
"""


def test_the_exporter_refuses_to_run_where_no_tracer_provider_is_set_up():
    """With the API alone, spans would be dropped while the export moved past their
    attempts: the command says what to set up instead (and reads nothing)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("OTEL_SDK_DISABLED", None)
    done = subprocess.run(
        [sys.executable, "-c", NO_PROVIDER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "no OpenTelemetry tracer provider is set up in this process" in done.stdout
