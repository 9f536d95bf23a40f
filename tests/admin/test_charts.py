"""The SVG charts of the dashboard (pgmb.admin.charts): pure Python, no database."""

from __future__ import annotations

import re
from xml.etree import ElementTree as ET

import pytest

from pgmb.admin import charts
from pgmb.admin.charts import Series

NS = {"svg": charts.SVG_NS}
MINUTES = [f"12:{m:02d}" for m in range(10)]


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def numbers(root: ET.Element) -> list[tuple[str, str, float]]:
    """Every coordinate of the drawing: (tag, attribute, value), polyline points too."""
    found = []
    for el in root.iter():
        tag = el.tag.split("}")[1]
        for name in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "width", "height"):
            if name in el.attrib:
                found.append((tag, name, float(el.attrib[name])))
        for pair in el.attrib.get("points", "").split():
            x, y = pair.split(",")
            found += [(tag, "x", float(x)), (tag, "y", float(y))]
    return found


def test_a_line_chart_is_valid_svg_with_its_title_and_role():
    svg = charts.line_chart(
        "Delivered per minute", MINUTES, [0, 5], [Series("delivered", list(range(10)), "#080")]
    )

    root = parse(svg)
    assert root.tag == f"{{{charts.SVG_NS}}}svg"
    assert root.attrib["class"] == "pgmb-chart"
    assert root.attrib["role"] == "img"
    assert root.attrib["aria-label"] == "Delivered per minute"
    assert root.find("svg:title", NS).text == "Delivered per minute"
    assert "delivered: 45 in all, at most 9 per slot" in root.find("svg:desc", NS).text
    (line,) = root.iter(f"{{{charts.SVG_NS}}}polyline")
    assert len(line.attrib["points"].split()) == 10
    # The axis names the ticked slots only.
    labels = [t.text for t in root.find("svg:g[@class='pgmb-chart-x']", NS)]
    assert [t for t in labels if t] == ["12:00", "12:05"]


@pytest.mark.parametrize("kind", [charts.line_chart, charts.bar_chart])
@pytest.mark.parametrize(
    "values",
    [
        [0] * 10,
        [1_000_000, 0, 3, None, 5, 5, 5, 0, 0, 1],
        [None] * 10,
        [0.001, 0.5, 2.25, None, None, 7, 9.99, 10, 0, 0],
    ],
)
def test_every_coordinate_lies_within_the_view_box(kind, values):
    svg = kind(
        "t", MINUTES, range(10), [Series("a", values, "#000"), Series("b", [1] * 10, "#f00")]
    )

    root = parse(svg)
    _, _, width, height = (float(n) for n in root.attrib["viewBox"].split())
    for tag, name, value in numbers(root):
        limit = width if name in ("x", "x1", "x2", "cx", "width") else height
        assert 0 <= value <= limit, (tag, name, value)
    for rect in root.iter(f"{{{charts.SVG_NS}}}rect"):
        assert float(rect.attrib["x"]) + float(rect.attrib["width"]) <= width
        assert float(rect.attrib["y"]) + float(rect.attrib["height"]) <= height


def test_labels_are_escaped():
    nasty = 'queue <&> "quoted"'
    svg = charts.bar_chart(
        f"Unrouted, {nasty}",
        [f"{nasty} {m}" for m in MINUTES],
        [0],
        [Series(nasty, [1] * 10, "#000")],
    )

    assert "<&>" not in svg
    assert 'aria-label="Unrouted, queue &lt;&amp;&gt; &quot;quoted&quot;"' in svg
    root = parse(svg)  # well-formed: every text and attribute escaped
    assert root.attrib["aria-label"] == f"Unrouted, {nasty}"
    assert root.find("svg:title", NS).text == f"Unrouted, {nasty}"
    texts = {el.text for el in root.iter() if el.text}
    assert nasty in texts  # the legend
    assert f"{nasty} 12:00" in texts  # the axis
    assert f"{nasty} 12:03: {nasty} 1" in texts  # a slot's hover text


def test_a_legend_too_long_for_the_chart_is_cut_inside_it():
    names = [f"a rather long series name number {i}" for i in range(4)]
    svg = charts.line_chart("t", MINUTES, [], [Series(n, [1] * 10, "#000") for n in names])

    root = parse(svg)
    legend = [t.text for t in root.find("svg:g[@class='pgmb-chart-legend']", NS)]
    assert legend[1] == names[0]
    assert legend[-1].endswith("…")
    for _, name, value in numbers(root):
        assert value <= charts.WIDTH, name
    assert all(n in root.find("svg:desc", NS).text for n in names)


def test_a_value_of_none_breaks_the_line_and_a_lone_value_is_a_dot():
    svg = charts.line_chart(
        "p95", MINUTES, [], [Series("p95", [1, 2, 3, None, 5, None, None, 8, 9, 10], "#000")],
        unit="ms",
    )  # fmt: skip

    root = parse(svg)
    runs = [len(p.attrib["points"].split()) for p in root.iter(f"{{{charts.SVG_NS}}}polyline")]
    assert runs == [3, 3]
    assert len(list(root.iter(f"{{{charts.SVG_NS}}}circle"))) == 1
    hover = [t.text for t in root.iter(f"{{{charts.SVG_NS}}}title")][1:]
    assert hover[3] == "12:03: p95 -"
    assert hover[4] == "12:04: p95 5 ms"


def test_bars_are_drawn_for_values_only_and_scale_to_the_highest():
    svg = charts.bar_chart(
        "n", MINUTES, [], [Series("n", [0, 4, 0, 0, 0, 0, 0, 0, 2, None], "#000")]
    )

    root = parse(svg)
    data = root.find("svg:g[@class='pgmb-chart-data']", NS)
    heights = [float(r.attrib["height"]) for r in data]
    assert len(heights) == 2
    assert heights[0] == pytest.approx(2 * heights[1], abs=0.2)


def test_no_values_say_so():
    svg = charts.line_chart("p50", MINUTES, [], [Series("p50", [None] * 10, "#000")], unit="ms")

    root = parse(svg)
    assert "no data" in {el.text for el in root.iter()}
    assert "p50: no value" in root.find("svg:desc", NS).text


def test_a_series_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="series 'a' has 3 values for 10 slots"):
        charts.line_chart("t", MINUTES, [], [Series("a", [1, 2, 3], "#000")])


@pytest.mark.parametrize(
    ("top", "whole", "ticks"),
    [
        (0, True, [0, 1]),
        (1, True, [0, 1]),
        (3, True, [0, 1, 2, 3]),
        (7, True, [0, 2, 4, 6, 8]),
        (100, True, [0, 50, 100]),
        (0.3, False, [0, 0.1, 0.2, 0.3]),
        (1234, True, [0, 500, 1000, 1500]),
    ],
)
def test_ticks_are_round_and_reach_the_top(top, whole, ticks):
    assert charts.nice_ticks(top, whole=whole) == ticks


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (7, "", "7"),
        (2.5, "", "2.5"),
        (12_345, "", "12.3k"),
        (3_000_000, "", "3M"),
        (67, "ms", "67 ms"),
    ],
)
def test_numbers_are_short(value, unit, text):
    assert charts.format_number(value, unit) == text


def test_the_markup_is_one_svg_element_safe_to_inline():
    svg = charts.line_chart("t", MINUTES, [], [Series("a", [1] * 10, "#000")])
    assert re.fullmatch(r"<svg [^>]*>.*</svg>", str(svg), re.S)
    assert "<script" not in svg and "href" not in svg
