"""Render collectives_bench.py --json files as the Markdown tables in docs/collectives.md.

    python benchmarks/report.py run1.json [run2.json ...]

With several runs, each cell shows the median over runs; the ratio columns are computed per run
(smddp and gloo from the same run) and their median is shown with the range.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from collectives_bench import human


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _busbw_ratio(rows: list[dict]) -> str:
    """smddp's busbw over gloo's, median (range); "-" for an op that moves no bytes (barrier)."""
    if any(r["gloo"]["busbw"] == 0 for r in rows):
        return "-"
    ratios = [r["smddp"]["busbw"] / r["gloo"]["busbw"] for r in rows]
    spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(rows) > 1 else ""
    return f"**{statistics.median(ratios):.2f}x**{spread}"


def render(runs: list[list[dict]]) -> str:
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        for row in run:
            cells[(row["op"], row["n"], row["size"])].append(row)
    lines = []
    for op, n in dict.fromkeys((op, n) for op, n, _ in cells):
        lines += [f"\n**{op}, {n} ranks** (float32; median of {len(runs)} run(s); busbw in GB/s)\n",
                  "| size | smddp time | smddp busbw | gloo time | gloo busbw | busbw ratio (range) | time ratio |",
                  "|---|---|---|---|---|---|---|"]
        for (o, k, size), rows in cells.items():
            if (o, k) != (op, n):
                continue
            med = lambda name, key: statistics.median(r[name][key] for r in rows)  # noqa: E731
            times = [r["smddp"]["time_s"] / r["gloo"]["time_s"] for r in rows]
            lines.append(f"| {human(size)} | {fmt_time(med('smddp', 'time_s'))} | {med('smddp', 'busbw'):.3f} | "
                         f"{fmt_time(med('gloo', 'time_s'))} | {med('gloo', 'busbw'):.3f} | "
                         f"{_busbw_ratio(rows)} | {statistics.median(times):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by collectives_bench.py --json")
    args = parser.parse_args(argv)
    print(render([json.loads(path.read_text()) for path in args.runs]))


if __name__ == "__main__":
    main()
