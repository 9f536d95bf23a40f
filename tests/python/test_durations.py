"""parse_delay: every accepted form, and clear refusals of the rest."""

from datetime import datetime, timedelta, timezone

import pytest

from pgmb.durations import check_seconds, parse_delay
from pgmb.errors import InvalidDelay


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (".25", 0.25),
        ("+7", 7.0),
        (" 12 ", 12.0),
        ("500ms", 0.5),
        ("45s", 45.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4 + 0.005),
        ("0s", 0.0),
    ],
)
def test_seconds_and_durations(text, seconds):
    parsed = parse_delay(text)
    assert isinstance(parsed, float)
    assert parsed == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-12-01T10:00:00+00:00", datetime(2026, 12, 1, 10, tzinfo=timezone.utc)),
        ("2026-12-01T10:00:00Z", datetime(2026, 12, 1, 10, tzinfo=timezone.utc)),
        ("2026-12-01T10:00:00z", datetime(2026, 12, 1, 10, tzinfo=timezone.utc)),
        (
            "2026-12-01T12:30:00.250+02:00",
            datetime(2026, 12, 1, 10, 30, 0, 250000, tzinfo=timezone.utc),
        ),
        ("2026-12-01 10:00:00-05:00", datetime(2026, 12, 1, 15, tzinfo=timezone.utc)),
        # The past is allowed: like pgmb.send, it means "deliver now".
        ("2001-01-01T00:00:00+00:00", datetime(2001, 1, 1, tzinfo=timezone.utc)),
    ],
)
def test_iso_times_are_aware_datetimes(text, moment):
    parsed = parse_delay(text)
    assert isinstance(parsed, datetime)
    assert parsed.utcoffset() is not None
    assert parsed == moment


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "it is empty"),
        ("   ", "it is empty"),
        ("-5", "must not be negative"),
        ("-0.5", "must not be negative"),
        ("-10m", "must not be negative"),
        ("2026-12-01T10:00:00", "no time zone"),
        ("2026-12-01", "no time zone"),
        ("2026-13-01T10:00:00Z", "month must be in 1..12"),
        ("2026-12-01T10:00:00+99:00", "not an ISO-8601 time"),
        ("soon", "use seconds (30, 1.5), a duration"),
        ("10x", "use seconds"),
        ("1m30", "use seconds"),
        ("10 m s", "use seconds"),
        ("10M", "use seconds"),
        ("nan", "use seconds"),
        ("inf", "use seconds"),
        ("1e3", "use seconds"),
        ("30m1h", "each unit once, largest first"),
        ("1h1h", "each unit once, largest first"),
        ("5s500ms1s", "each unit once, largest first"),
        ("99999999999999d", "too long"),
        ("9" * 400, "finite"),
    ],
)
def test_bad_delays_are_refused_with_the_reason(text, reason):
    with pytest.raises(InvalidDelay) as info:
        parse_delay(text)
    assert reason in str(info.value)
    assert repr(text) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [30, None, b"30", timedelta(seconds=3)])
def test_only_texts_are_parsed(value):
    with pytest.raises(InvalidDelay, match="expected a text"):
        parse_delay(value)


def test_check_seconds():
    assert check_seconds(3) == 3.0
    assert isinstance(check_seconds(3), float)
    assert check_seconds(0.5) == 0.5
    for bad, reason in [
        (-1, "negative"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (True, "use seconds"),
        ("3", "use seconds"),
        (1e15, "too long"),
    ]:
        with pytest.raises(InvalidDelay, match=reason):
            check_seconds(bad)
