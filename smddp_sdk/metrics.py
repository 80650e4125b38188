"""``metric_definitions`` applied to a job's logs, on every scheduler, and drawn as a chart.

Each definition is v2's ``{"Name": "train:loss", "Regex": "loss=([0-9.]+)"}``: every log line the regex
matches gives one value, its first group, as SageMaker does with CloudWatch (a regex without a group is
an error). Here the logs are read back from the scheduler (local files, docker logs, CloudWatch), so
the same definitions give the same numbers everywhere, SageMaker included. Values are a time series:
``timestamp`` is seconds since the job's first log line (v2's column), per rank: rank 0's by default,
as v2 reads the first host's series.

    analytics = estimator.training_job_analytics      # v2's TrainingJobAnalytics
    analytics.dataframe()                             # pandas: timestamp, metric_name, value (+ host, rank)
    analytics.rows()                                  # the same as dicts, no pandas needed
    write_plot(analytics.points(), "loss.svg")        # SVG with no extra package; .png needs matplotlib
"""

from __future__ import annotations

import csv
import html
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError
from smddp_sdk.specs.contract import number_or_none
from smddp_sdk.specs.job import metric_definition_issues
from smddp_sdk.specs.status import JobHandle, LogLine

COLUMNS = ("timestamp", "metric_name", "value", "step", "host", "rank")  # v2's columns first
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class MetricPoint:
    """One value of one metric: the ``step``-th time the metric appeared in its rank's logs."""

    metric_name: str
    value: float
    step: int
    timestamp: float | None = None
    host: str = ""
    rank: int | None = None


def compile_definitions(definitions: Iterable[Mapping[str, str]]) -> list[tuple[str, re.Pattern[str]]]:
    """``[(name, compiled regex)]``; every malformed definition is reported at once (exit 2), by the job's own check."""
    definitions = list(definitions)
    issues = [SpecIssue(f"metric_definitions[{index}]", f"must be {{'Name': <string>, 'Regex': <string>}}, got {item!r}")
              for index, item in enumerate(definitions) if not isinstance(item, Mapping) or not all(isinstance(item.get(k), str) for k in ("Name", "Regex"))]
    issues += metric_definition_issues(definitions)
    if issues:
        raise SpecError(issues)
    return [(item["Name"], re.compile(item["Regex"])) for item in definitions]


def extract(lines: Iterable[LogLine], definitions: Iterable[Mapping[str, str]], ranks: Collection[int] | None = None) -> list[MetricPoint]:
    """Every metric value in ``lines``, in log order; only ``ranks``' lines (and the hosts' own) unless None."""
    compiled = compile_definitions(definitions)
    steps: dict[tuple[str, int | None], int] = {}
    points = []
    for line in lines:
        if ranks is not None and line.rank is not None and line.rank not in ranks:
            continue
        for name, regex in compiled:
            match = regex.search(line.text)
            value = _number(match.group(1)) if match else None
            if value is None:
                continue
            step = steps[name, line.rank] = steps.get((name, line.rank), -1) + 1
            points.append(MetricPoint(name, value, step, line.timestamp, line.host, line.rank))
    return points


def _number(text: str | None) -> float | None:
    value = number_or_none(float, text)
    return value if value is not None and math.isfinite(value) else None


def summary(points: Sequence[MetricPoint]) -> list[dict[str, Any]]:
    """Per metric: count, last, min, max (in first-seen order)."""
    by_name: dict[str, list[float]] = {}
    for point in points:
        by_name.setdefault(point.metric_name, []).append(point.value)
    return [{"metric_name": name, "count": len(values), "last": values[-1], "min": min(values), "max": max(values)} for name, values in by_name.items()]


class TrainingJobAnalytics:
    """v2's ``TrainingJobAnalytics`` for one job: its metrics read from its logs with ``metric_definitions``,
    rank 0's unless ``ranks`` names others (None: every rank)."""

    def __init__(self, scheduler: Any, handle: JobHandle, metric_definitions: Iterable[Mapping[str, str]], metric_names: Sequence[str] | None = None, ranks: Collection[int] | None = (0,)) -> None:
        self.scheduler = scheduler
        self.handle = handle
        self.metric_definitions = tuple(metric_definitions)
        self.metric_names = tuple(metric_names) if metric_names else tuple(d["Name"] for d in self.metric_definitions)
        self.ranks = ranks
        self._points: list[MetricPoint] | None = None
        self._start: float | None = None

    @property
    def name(self) -> str:
        return self.handle.job_id.rsplit("/", 1)[-1]

    def points(self, force_refresh: bool = False) -> list[MetricPoint]:
        if self._points is None or force_refresh:
            wanted = [d for d in self.metric_definitions if d.get("Name") in self.metric_names]
            lines = list(self.scheduler.logs(self.handle, follow=False)) if wanted else []
            self._start = min((line.timestamp for line in lines if line.timestamp is not None), default=None)
            self._points = extract(lines, wanted, self.ranks)
        return self._points

    def rows(self, force_refresh: bool = False) -> list[dict[str, Any]]:
        """``timestamp`` (seconds since the job's first log line, as v2's seconds since the start; the step
        for lines that carry no time), ``metric_name``, ``value``, plus ``step``, ``host`` and ``rank``."""
        points = self.points(force_refresh)
        return [{"timestamp": round(p.timestamp - self._start, 3) if p.timestamp is not None and self._start is not None else float(p.step),
                 "metric_name": p.metric_name, "value": p.value, "step": p.step, "host": p.host, "rank": p.rank} for p in points]

    def dataframe(self, force_refresh: bool = False) -> Any:
        """The rows as a pandas DataFrame. Without pandas: exit 3 with the install command."""
        try:
            import pandas
        except ModuleNotFoundError:
            raise UnavailableError("training_job_analytics.dataframe() needs pandas: pip install pandas (or use .rows(), which needs nothing)") from None
        return pandas.DataFrame(self.rows(force_refresh), columns=list(COLUMNS))

    def export_csv(self, filename: str) -> None:
        write_csv(self.rows(), filename)

    def clear_cache(self) -> None:
        self._points = None


def write_csv(rows: Sequence[Mapping[str, Any]], filename: str | Path) -> None:
    with open(filename, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def write_plot(points: Sequence[MetricPoint], path: str | Path, title: str = "") -> Path:
    """Draw every metric against its step: ``.svg`` needs nothing; ``.png`` needs matplotlib (exit 3 otherwise)."""
    target = Path(path)
    if not points:
        raise SpecError(SpecIssue("metrics", "no metric values to plot", "check metric_definitions against the job's log lines"))
    if len({point.rank for point in points}) > 1:  # one series per metric and rank
        points = [replace(point, metric_name=f"{point.metric_name} rank {point.rank}") for point in points]
    suffix = target.suffix.lower()
    if suffix == ".svg":
        target.write_text(render_svg(points, title), encoding="utf-8")
    elif suffix == ".png":
        _write_png(points, target, title)
    else:
        raise SpecError(SpecIssue("plot", f"cannot draw {target.name!r}: the file name must end in .svg or .png"))
    return target


def render_svg(points: Sequence[MetricPoint], title: str = "", width: int = 720, panel_height: int = 180) -> str:
    """One panel per metric (each with its own y range), lines through the values, in a standalone SVG."""
    by_name: dict[str, list[MetricPoint]] = {}
    for point in points:
        by_name.setdefault(point.metric_name, []).append(point)
    left, right, top, gap = 70, 20, 40 if title else 16, 44
    height = top + len(by_name) * (panel_height + gap)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    if title:
        parts.append(f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>')
    for index, (name, series) in enumerate(by_name.items()):
        y0 = top + index * (panel_height + gap) + 18
        parts += _panel(name, series, left, y0, width - left - right, panel_height - 18, _COLOURS[index % len(_COLOURS)])
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(name: str, series: list[MetricPoint], x0: float, y0: float, w: float, h: float, colour: str) -> list[str]:
    values = [p.value for p in series]
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 1, high + 1
    last_step = max(series[-1].step, 1)

    def xy(point: MetricPoint) -> str:
        return f"{x0 + w * point.step / last_step:.1f},{y0 + h - h * (point.value - low) / (high - low):.1f}"

    out = [f'<text x="{x0}" y="{y0 - 6}" font-weight="bold">{html.escape(name)} (last {values[-1]:.6g}, min {min(values):.6g}, max {max(values):.6g})</text>',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    for fraction in (0.0, 0.5, 1.0):
        y = y0 + h - h * fraction
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{low + (high - low) * fraction:.4g}</text>')
    out.append(f'<text x="{x0 + w}" y="{y0 + h + 16}" text-anchor="end" fill="#555">step {last_step}</text>')
    out.append(f'<text x="{x0}" y="{y0 + h + 16}" fill="#555">step 0</text>')
    if len(series) == 1:
        x, y = xy(series[0]).split(",")
        out.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>')
    else:
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{" ".join(xy(p) for p in series)}"/>')
    return out


def _write_png(points: Sequence[MetricPoint], target: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise UnavailableError("a .png plot needs matplotlib: pip install matplotlib (or write .svg, which needs nothing)") from None
    names = list(dict.fromkeys(p.metric_name for p in points))
    figure, axes = plt.subplots(len(names), 1, figsize=(8, 2.4 * len(names)), squeeze=False)
    for axis, name in zip(axes[:, 0], names):
        series = [p for p in points if p.metric_name == name]
        axis.plot([p.step for p in series], [p.value for p in series])
        axis.set_title(name)
        axis.set_xlabel("step")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(target)
    plt.close(figure)


__all__ = ["MetricPoint", "TrainingJobAnalytics", "compile_definitions", "extract", "summary", "write_plot", "render_svg", "write_csv"]
