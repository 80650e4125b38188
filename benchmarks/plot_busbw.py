"""Plot busbw against message size for smddp and gloo from collectives_bench.py JSON, as a plain SVG.

    python3 benchmarks/plot_busbw.py results.json docs/img/busbw-ws2.svg --n 2

No plotting library: the SVG is written by hand (log2 x axis of sizes, linear y axis of busbw in GB/s),
one panel per op, smddp solid and gloo dashed. Rows with the same op, n and size are combined by median.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.collectives_bench import human  # noqa: E402

PANEL_W, PANEL_H, MARGIN = 300, 220, 48
COLOURS = {"smddp": "#1f6fb4", "gloo": "#d9661f"}


def medians(rows: list[dict], n: int) -> dict[str, dict[str, dict[int, float]]]:
    """op -> backend -> size -> median busbw over repeated runs."""
    seen: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for row in rows:
        if row.get("n") != n:
            continue
        for backend in COLOURS:
            if backend in row:
                seen[(row["op"], backend, row["size"])].append(row[backend]["busbw"])
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for (op, backend, size), values in seen.items():
        out[op][backend][size] = statistics.median(values)
    return out


def panel(op: str, series: dict[str, dict[int, float]], left: float) -> list[str]:
    sizes = sorted({s for points in series.values() for s in points})
    top = max(v for points in series.values() for v in points.values()) * 1.1 or 1.0
    lo, hi = math.log2(sizes[0]), math.log2(sizes[-1]) if len(sizes) > 1 else math.log2(sizes[0]) + 1

    def x(size: int) -> float:
        return left + MARGIN + (math.log2(size) - lo) / (hi - lo) * (PANEL_W - MARGIN - 10)

    def y(value: float) -> float:
        return 20 + (1 - value / top) * (PANEL_H - 60)

    parts = [f'<text x="{left + PANEL_W / 2}" y="14" text-anchor="middle" font-weight="bold">{op}</text>',
             f'<line x1="{left + MARGIN}" y1="{y(0)}" x2="{left + PANEL_W - 10}" y2="{y(0)}" stroke="#444"/>',
             f'<line x1="{left + MARGIN}" y1="20" x2="{left + MARGIN}" y2="{y(0)}" stroke="#444"/>']
    for tick in range(5):
        value = top * tick / 4
        parts.append(f'<text x="{left + MARGIN - 4}" y="{y(value) + 4}" text-anchor="end">{value:.2g}</text>')
    for size in sizes:
        parts.append(f'<text x="{x(size)}" y="{y(0) + 14}" text-anchor="middle">{human(size)}</text>')
    parts.append(f'<text x="{left + PANEL_W / 2}" y="{y(0) + 30}" text-anchor="middle">message size (bytes)</text>')
    for backend, points in series.items():
        coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in sorted(points.items()))
        dash = "" if backend == "smddp" else ' stroke-dasharray="5,3"'
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{COLOURS[backend]}" stroke-width="2"{dash}/>')
        parts += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.5" fill="{COLOURS[backend]}"/>' for s, v in points.items()]
    return parts


def render(data: dict[str, dict[str, dict[int, float]]], n: int) -> str:
    ops = sorted(data)
    width = PANEL_W * len(ops)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 20}" '
             f'font-family="sans-serif" font-size="10">', f'<rect width="{width}" height="{PANEL_H + 20}" fill="white"/>']
    for i, op in enumerate(ops):
        parts += panel(op, data[op], i * PANEL_W)
    legend_y = PANEL_H + 10
    for i, backend in enumerate(COLOURS):
        parts.append(f'<text x="{10 + 90 * i}" y="{legend_y}" fill="{COLOURS[backend]}">&#9632; {backend} (n={n})</text>')
    parts.append(f'<text x="{width - 10}" y="{legend_y}" text-anchor="end">busbw, GB/s (nccl-tests convention)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="collectives_bench.py --json files (repeated runs are combined)")
    parser.add_argument("output", help="the SVG file to write")
    parser.add_argument("--n", type=int, default=2, help="world size to plot")
    args = parser.parse_args(argv)
    rows = [row for path in args.results for row in json.loads(Path(path).read_text())]
    data = medians(rows, args.n)
    if not data:
        parser.error(f"no rows with n={args.n} in {', '.join(args.results)}")
    Path(args.output).write_text(render(data, args.n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
