"""The status page's inline SVG for known inputs: what each chart draws, parsed back from the markup."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tokwatch.statuspage.model import Day
from tokwatch.statuspage.svg import daily_medians, daily_uptime, sparkline
from tokwatch.storage.base import RunPoint

T0 = 1_790_000_000.0
DAY = 86400.0


def _run(t: float, status: str = "ok", tps: float | None = 50.0) -> RunPoint:
    figure = tps if status == "ok" else None
    return RunPoint(T0 + t, status, figure, None, None, None, None, None, None, "scheduled", False)


def _svg(markup: str) -> ET.Element:
    return ET.fromstring(markup)


def _segments(svg: ET.Element) -> list[list[tuple[float, float]]]:
    """The line's path segments (one per M command) as lists of (x, y)."""
    paths = [p for p in svg.iter("path") if p.get("class") == "line"]
    if not paths:
        return []
    (path,) = paths
    return [
        [tuple(map(float, pt.split())) for pt in seg.split("L")]  # type: ignore[misc]
        for seg in re.findall(r"M([^M]+)", path.get("d", ""))
    ]


def _x(svg: ET.Element, tag: str, cls: str, attr: str) -> list[float]:
    return [float(e.get(attr, "nan")) for e in svg.iter(tag) if e.get("class") == cls]


# Seven runs 10 s apart: x = 4 + t / 60 * 252 on the 260-wide sparkline (4 px padding each side).
SERIES = [
    _run(0, tps=50.0),
    _run(10, tps=60.0),
    _run(20, "timeout"),
    _run(30, tps=55.0),
    _run(40, tps=56.0),
    _run(50, "rate_limited"),
    _run(60, tps=70.0),
]


def test_sparkline_breaks_the_line_at_non_ok_runs_and_ticks_them_red() -> None:
    svg = _svg(sparkline(SERIES))
    assert svg.get("aria-label") == "7 recent runs, 2 not ok" and svg.get("viewBox") == "0 0 260 44"
    segments = _segments(svg)
    # two segments: the ok runs before the timeout, and the two between the failures
    assert [[x for x, _ in seg] for seg in segments] == [[4.0, 46.0], [130.0, 172.0]]
    ys = dict(zip([50.0, 60.0, 55.0, 56.0], (y for seg in segments for _, y in seg), strict=True))
    assert ys[60.0] < ys[56.0] < ys[55.0] < ys[50.0]  # faster is higher up (smaller y)
    assert all(3.0 <= y <= 41.0 for y in ys.values())  # inside the plot's margins
    # the last ok run stands alone after the rate-limited one: a dot, not a line
    dots = [(float(c.get("cx", "0")), float(c.get("cy", "0"))) for c in svg.iter("circle")]
    assert len(dots) == 1 and dots[0][0] == 256.0 and dots[0][1] < ys[60.0]
    # each non-ok run is a red dashed tick at its own x, over the full height
    ticks = [e for e in svg.iter("line") if e.get("class") == "fail"]
    assert [float(t.get("x1", "0")) for t in ticks] == [88.0, 214.0]
    assert all(t.get("x1") == t.get("x2") and t.get("y1") == "1" and t.get("y2") == "43" for t in ticks)


def test_sparkline_places_runs_by_time_and_handles_edge_cases() -> None:
    # uneven spacing: the gap shows as distance, the failure sits at its own time
    svg = _svg(sparkline([_run(0), _run(90, "provider_error"), _run(100), _run(120)]))
    assert _x(svg, "line", "fail", "x1") == [193.0]
    assert [[x for x, _ in s] for s in _segments(svg)] == [[214.0, 256.0]]
    assert _x(svg, "circle", "dot", "cx") == [4.0]
    # an ok run without a figure breaks the line but is no failure: no tick
    svg = _svg(sparkline([_run(0), _run(10), _run(20, tps=None), _run(30), _run(40)]))
    assert len(_segments(svg)) == 2 and _x(svg, "line", "fail", "x1") == []
    # only failures: ticks, no line
    svg = _svg(sparkline([_run(0, "unreachable"), _run(10, "auth_failure")]))
    assert _segments(svg) == [] and _x(svg, "line", "fail", "x1") == [4.0, 256.0]
    assert svg.get("aria-label") == "2 recent runs, 2 not ok"
    # flat data is drawn level, mid-height
    svg = _svg(sparkline([_run(0, tps=80.0), _run(10, tps=80.0), _run(20, tps=80.0)]))
    ((a, b, c),) = _segments(svg)
    assert a[1] == b[1] == c[1] == pytest.approx(22.0, abs=0.1)
    # nothing yet
    svg = _svg(sparkline([]))
    assert svg.get("aria-label") == "no runs yet" and "".join(svg.itertext()) == "no runs yet"


def _days(*spec: tuple[int, int, float | None]) -> list[Day]:
    return [Day(T0 - T0 % DAY + i * DAY, runs, ok, median) for i, (runs, ok, median) in enumerate(spec)]


def test_daily_medians_draw_a_point_per_day_with_gaps_for_days_without_ok_runs() -> None:
    days = _days((24, 24, 10.0), (24, 24, 20.0), (24, 0, None), (24, 20, 30.0), (24, 24, 30.0), (0, 0, None),
                 (12, 12, 25.0))  # fmt: skip
    svg = _svg(daily_medians(days))
    assert svg.get("aria-label") == "daily median tok/s over 7 days"
    # x: 48 px left margin, 8 right, (720 - 56) / 6 per day
    step = (720 - 48 - 8) / 6
    segments = _segments(svg)
    assert [[x for x, _ in s] for s in segments] == [
        [48.0, pytest.approx(48 + step, abs=0.05)],
        [pytest.approx(48 + 3 * step, abs=0.05), pytest.approx(48 + 4 * step, abs=0.05)],
    ]
    dots = [c for c in svg.iter("circle")]
    titles = ["".join(c.itertext()) for c in dots]
    day = [d.start for d in days]
    assert len(dots) == 5  # one per day with a median, the lone last day included, none twice
    assert titles[0].endswith(": 10.0 tok/s") and titles[-1].endswith(": 25.0 tok/s")
    assert float(dots[-1].get("cx", "0")) == pytest.approx(712.0)
    y = {t.split(": ")[1]: float(c.get("cy", "0")) for t, c in zip(titles, dots, strict=True)}
    assert y["30.0 tok/s"] < y["25.0 tok/s"] < y["20.0 tok/s"] < y["10.0 tok/s"]
    assert y["30.0 tok/s"] >= 8.0 and y["10.0 tok/s"] <= 140.0  # within the plot area
    labels = [t.text for t in svg.iter("text")]
    assert labels[:2] == ["30.0", "10.0"]  # the axis shows the range it was given
    assert labels[2:] == [_date(day[0]), _date(day[-1])]


def _date(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def test_daily_uptime_draws_a_bar_per_day_with_runs_coloured_by_uptime() -> None:
    days = _days((24, 24, 1.0), (24, 23, 1.0), (24, 12, 1.0), (0, 0, None), (10, 0, None))
    svg = _svg(daily_uptime(days))
    bars = [e for e in svg.iter("rect")]
    assert len(bars) == 4  # the day without runs has no bar
    step = (720 - 48 - 8) / 5
    xs = [float(b.get("x", "0")) for b in bars]
    assert xs == pytest.approx([48 + i * step for i in (0, 1, 2, 4)], abs=0.05)
    assert [b.get("class") for b in bars] == ["up-full", "up-some", "up-low", "up-low"]
    plot = (70 - 18) - 4  # bar height at 100 %
    heights = [float(b.get("height", "0")) for b in bars]
    assert heights == pytest.approx([plot, plot * 23 / 24, plot / 2, 1.0], abs=0.05)  # 0 %: a 1 px stub
    bottoms = [float(b.get("y", "0")) + h for b, h in zip(bars, heights, strict=True)]
    assert bottoms == pytest.approx([52.0] * 4, abs=0.05)  # standing on the 0 % line
    assert ["".join(b.itertext()).split(": ")[1] for b in bars] == [
        "100.0 % of 24 runs ok", "95.8 % of 24 runs ok", "50.0 % of 24 runs ok", "0.0 % of 10 runs ok",
    ]  # fmt: skip


def test_empty_history_says_so() -> None:
    nothing = _days((0, 0, None), (0, 0, None))
    assert "".join(_svg(daily_medians(nothing)).itertext()) == "no ok runs in this period"
    assert "".join(_svg(daily_uptime(nothing)).itertext()) == "no runs in this period"
    failing = _days((5, 0, None))
    assert "".join(_svg(daily_medians(failing)).itertext()) == "no ok runs in this period"
    assert len(list(_svg(daily_uptime(failing)).iter("rect"))) == 1
