"""Charts as inline SVG, drawn on the server: no JavaScript, nothing fetched from anywhere.

A chart is a row of equal slots, one per point (a minute of the dashboard), and one or more
series of values drawn over them, as lines (:func:`line_chart`) or bars (:func:`bar_chart`)::

    svg = line_chart(
        "Delivered per minute",
        x=["12:00", "12:01", "12:02"],     # each slot's name (its hover text)
        ticks=[0, 2],                      # the slots whose names the x axis shows
        series=[Series("delivered", [3, 0, 5], GREEN)],
    )

The result is one ``<svg class="pgmb-chart" role="img" aria-label="…">`` element with a
``<title>`` and a ``<desc>`` (each series' total and peak), built with ElementTree: every
text and attribute is escaped, and the markup is well-formed XML as well as HTML. A value
of None is no value (a gap in a line, no bar); the y axis starts at 0 and ends on a round
number at or above the highest value. Each slot carries a ``<title>`` with its name and
every series' value there, which browsers show on hover.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from django.utils.safestring import SafeString, mark_safe

SVG_NS = "http://www.w3.org/2000/svg"

#: The drawing's own units; the page scales it to the width it has.
WIDTH = 480
HEIGHT = 200
#: Room for the y axis' labels, the legend above and the x axis' labels below.
LEFT = 50
RIGHT = 12
TOP = 30
BOTTOM = 26
#: The width of a character of the legend, roughly, at its font size.
LEGEND_CHAR = 7

# Series colours, readable on the admin's light and dark themes.
GREEN = "#2e7d32"
RED = "#d32f2f"
PURPLE = "#7b1fa2"
BLUE = "#1976d2"
ORANGE = "#ef6c00"
GREY = "#757575"


@dataclass(frozen=True, slots=True)
class Series:
    """One line or set of bars: its name in the legend, a value per slot, its colour."""

    label: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False


def nice_ticks(top: float, count: int = 4, *, whole: bool = True) -> list[float]:
    """0, then round steps (1, 2 or 5 times a power of ten) up to at least ``top``.

    ``whole``: the values counted are whole numbers, so a step is never below 1.
    """
    if not math.isfinite(top) or top <= 0:
        top = 1.0
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(step, 1.0)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def format_number(value: float, unit: str = "") -> str:
    """Short: 7, 2.5, 1.2k, 3M; the unit after it (``12 ms``)."""
    magnitude = abs(value)
    if magnitude >= 1_000_000:
        text = f"{value / 1_000_000:.3g}M"
    elif magnitude >= 10_000:
        text = f"{value / 1000:.3g}k"
    elif value == int(value):
        text = str(int(value))
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def _n(value: float) -> str:
    """A coordinate: one decimal, no trailing zero."""
    return f"{value:.1f}".removesuffix(".0")


class _Frame:
    """The plot area and the scales of one chart."""

    def __init__(self, slots: int, ticks: list[float], width: int, height: int) -> None:
        self.slots = max(slots, 1)
        self.ticks = ticks
        self.top_value = ticks[-1]
        self.left, self.right = LEFT, width - RIGHT
        self.top, self.bottom = TOP, height - BOTTOM
        self.slot = (self.right - self.left) / self.slots

    def x(self, i: int) -> float:
        """The middle of slot ``i``."""
        return self.left + (i + 0.5) * self.slot

    def y(self, value: float) -> float:
        share = min(max(value / self.top_value, 0.0), 1.0)
        return self.bottom - share * (self.bottom - self.top)


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    element = ET.SubElement(
        parent, tag, {k.rstrip("_").replace("_", "-"): v for k, v in attrib.items()}
    )
    if text is not None:
        element.text = text
    return element


def _summary(series: Sequence[Series], unit: str) -> str:
    parts = []
    for s in series:
        values = [v for v in s.values if v is not None]
        if not values:
            parts.append(f"{s.label}: no value")
        elif unit:
            parts.append(f"{s.label}: highest {format_number(max(values), unit)}")
        else:
            parts.append(
                f"{s.label}: {format_number(sum(values))} in all, "
                f"at most {format_number(max(values))} per slot"
            )
    return "; ".join(parts)


def _chart(
    kind: str,
    title: str,
    x: Sequence[str],
    ticks: Collection[int],
    series: Sequence[Series],
    unit: str,
    width: int,
    height: int,
) -> SafeString:
    for s in series:
        if len(s.values) != len(x):
            raise ValueError(f"series {s.label!r} has {len(s.values)} values for {len(x)} slots")
    values = [v for s in series for v in s.values if v is not None]
    whole = not unit and all(float(v).is_integer() for v in values)
    frame = _Frame(len(x), nice_ticks(max(values, default=0.0), whole=whole), width, height)

    svg = ET.Element(
        "svg",
        {
            "xmlns": SVG_NS,
            "class": "pgmb-chart",
            "role": "img",
            "aria-label": title,
            "viewBox": f"0 0 {width} {height}",
            "preserveAspectRatio": "xMidYMid meet",
            "font-family": "sans-serif",
            "font-size": "12",
        },
    )
    _el(svg, "title", title)
    _el(svg, "desc", _summary(series, unit))

    # The y axis: a rule and a label per tick.
    axis = _el(svg, "g", class_="pgmb-chart-y", fill="currentColor")
    for tick in frame.ticks:
        y = _n(frame.y(tick))
        _el(axis, "line", x1=_n(frame.left), x2=_n(frame.right), y1=y, y2=y,
            stroke="currentColor", stroke_opacity="0.15")  # fmt: skip
        _el(axis, "text", format_number(tick, unit), x=_n(frame.left - 6), y=y,
            text_anchor="end", dominant_baseline="middle")  # fmt: skip

    # The x axis: a base line and the names of the ticked slots.
    labels = _el(svg, "g", class_="pgmb-chart-x", fill="currentColor")
    _el(labels, "line", x1=_n(frame.left), x2=_n(frame.right), y1=_n(frame.bottom),
        y2=_n(frame.bottom), stroke="currentColor", stroke_opacity="0.5")  # fmt: skip
    for i in sorted(t for t in ticks if 0 <= t < len(x)):
        _el(labels, "text", x[i], x=_n(frame.x(i)), y=_n(frame.bottom + 16),
            text_anchor="middle")  # fmt: skip

    # The legend, above the plot; a label too long for the room left is cut (the <desc>
    # and the hover texts have it whole).
    legend = _el(svg, "g", class_="pgmb-chart-legend", fill="currentColor")
    at = float(frame.left)
    for s in series:
        room = int((frame.right - at - 18) // LEGEND_CHAR)
        if room < 2:
            break
        label = s.label if len(s.label) <= room else s.label[: room - 1] + "…"
        _el(legend, "rect", x=_n(at), y="9", width="14", height="4", fill=s.color)
        _el(legend, "text", label, x=_n(at + 18), y="11", dominant_baseline="middle")
        at += 18 + LEGEND_CHAR * len(label) + 16

    plot = _el(svg, "g", class_="pgmb-chart-data")
    if kind in ("line", "steps"):
        for s in series:
            _lines(plot, frame, s, steps=kind == "steps")
    else:
        _bars(plot, frame, series)
    if not values:
        _el(plot, "text", "no data", x=_n((frame.left + frame.right) / 2),
            y=_n((frame.top + frame.bottom) / 2), text_anchor="middle",
            fill="currentColor", fill_opacity="0.6")  # fmt: skip

    # One invisible column per slot, whose title says what the slot holds.
    hover = _el(svg, "g", class_="pgmb-chart-hover")
    for i, name in enumerate(x):
        shown = ", ".join(
            f"{s.label} {'-' if s.values[i] is None else format_number(s.values[i] or 0, unit)}"
            for s in series
        )
        column = _el(hover, "rect", x=_n(frame.left + i * frame.slot), y=_n(frame.top),
                     width=_n(frame.slot), height=_n(frame.bottom - frame.top),
                     fill="transparent")  # fmt: skip
        _el(column, "title", f"{name}: {shown}")

    return mark_safe(ET.tostring(svg, encoding="unicode"))  # noqa: S308  (built and escaped by ElementTree)


def _lines(plot: ET.Element, frame: _Frame, s: Series, steps: bool) -> None:
    """A polyline per run of values; a lone value between gaps is a dot. With ``steps``,
    each value is a level across its whole slot instead: a lone value is a short line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for i, value in enumerate(s.values):
        if value is None:
            if runs[-1]:
                runs.append([])
            continue
        if steps:
            left = frame.left + i * frame.slot
            runs[-1] += [(left, frame.y(value)), (left + frame.slot, frame.y(value))]
        else:
            runs[-1].append((frame.x(i), frame.y(value)))
    for run in runs:
        if len(run) == 1:
            _el(plot, "circle", cx=_n(run[0][0]), cy=_n(run[0][1]), r="2", fill=s.color)
        elif run:
            attrib = {"fill": "none", "stroke": s.color, "stroke_width": "1.8",
                      "stroke_linejoin": "round"}  # fmt: skip
            if s.dashed:
                attrib["stroke_dasharray"] = "4 3"
            _el(plot, "polyline", points=" ".join(f"{_n(x)},{_n(y)}" for x, y in run), **attrib)


def _bars(plot: ET.Element, frame: _Frame, series: Sequence[Series]) -> None:
    """Bars side by side in each slot, one per series; a zero or None draws nothing."""
    width = frame.slot * 0.8 / max(len(series), 1)
    for k, s in enumerate(series):
        for i, value in enumerate(s.values):
            if not value:
                continue
            y = frame.y(value)
            x = frame.left + i * frame.slot + frame.slot * 0.1 + k * width
            _el(plot, "rect", x=_n(x), y=_n(y), width=_n(width), height=_n(frame.bottom - y),
                fill=s.color)  # fmt: skip


def line_chart(
    title: str,
    x: Sequence[str],
    ticks: Collection[int],
    series: Sequence[Series],
    *,
    unit: str = "",
    steps: bool = False,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> SafeString:
    """Lines over the slots ``x``; the axis names the slots whose indexes ``ticks`` lists.
    ``steps``: each value drawn level across its slot (a value that stands for the whole
    slot, such as a percentile of its requests), so that a lone one is a line, not a dot."""
    return _chart("steps" if steps else "line", title, x, ticks, series, unit, width, height)


def bar_chart(
    title: str,
    x: Sequence[str],
    ticks: Collection[int],
    series: Sequence[Series],
    *,
    unit: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> SafeString:
    """Bars in the slots ``x`` (several series side by side); as :func:`line_chart`."""
    return _chart("bar", title, x, ticks, series, unit, width, height)
