"""The curves of a ``--scale`` run as one SVG (no plotting library needed).

    python bench/scale_plot.py RESULTS.json [MORE.json ...] OUT.svg

A later file's run at the same (backend, N) replaces an earlier one's (a re-run).

Top left: runs per second against runs at once (teardowns and resumes, each backend).
Top right: the first decision in a fresh process (cold) against the run's length, log-log.
Bottom left: ``work_util`` per phase against runs at once (the share of the cores the machine
had free that the phase held, 1.0: none idle; ``cpu_util``, our process and its children, for
results older than it; the dotted line at 0.9 is "CPU-bound", issue 26's goal), each point's load average
in the results. Bottom right: the runner on NATS, deliveries per second against runner
processes (1, 2), each backend.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

W, H, PAD = 360, 240, 44
COLOURS = {"sqlite": "#1f77b4", "postgres": "#d62728"}


def scale(values: list[float], lo_px: float, hi_px: float, log: bool) -> tuple[float, float, Any]:
    f = (lambda v: math.log10(max(v, 1e-9))) if log else (lambda v: v)
    lo, hi = min(f(v) for v in values), max(f(v) for v in values)
    lo, hi = (lo, hi) if hi > lo else (lo - 1, hi + 1)
    lo = 0.0 if not log else lo
    return lo, hi, lambda v: lo_px + (f(v) - lo) / (hi - lo) * (hi_px - lo_px)


def panel(
    x0: int,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, list[tuple[float, float]]],
    log: bool,
    y0: int = 0,
    mark: float | None = None,
) -> list[str]:
    """One chart at (x0, y0); ``mark``: a dotted horizontal line at that y (a goal)."""
    points = [p for s in series.values() for p in s]
    if not points:
        return []
    ys = [p[1] for p in points] + ([mark] if mark is not None else [])
    _, _, sx = scale([p[0] for p in points], x0 + PAD, x0 + W - 10, log)
    _, _, sy = scale(ys, y0 + H - PAD, y0 + 20, log)
    out = [
        f'<text x="{x0 + W / 2}" y="{y0 + 14}" text-anchor="middle" font-size="12">{title}</text>',
        f'<line x1="{x0 + PAD}" y1="{y0 + H - PAD}" x2="{x0 + W - 10}" y2="{y0 + H - PAD}" stroke="#000"/>',
        f'<line x1="{x0 + PAD}" y1="{y0 + 20}" x2="{x0 + PAD}" y2="{y0 + H - PAD}" stroke="#000"/>',
        f'<text x="{x0 + W / 2}" y="{y0 + H - 8}" text-anchor="middle" font-size="10">{xlabel}</text>',
        f'<text x="{x0 + 10}" y="{y0 + H / 2}" font-size="10" '
        f'transform="rotate(-90 {x0 + 10} {y0 + H / 2})" text-anchor="middle">{ylabel}</text>',
    ]
    if mark is not None:
        out.append(
            f'<line x1="{x0 + PAD}" y1="{sy(mark):.1f}" x2="{x0 + W - 10}" y2="{sy(mark):.1f}" '
            'stroke="#888" stroke-dasharray="1 3"/>'
        )
    for x in sorted({p[0] for p in points}):
        out.append(
            f'<text x="{sx(x):.1f}" y="{y0 + H - PAD + 12}" text-anchor="middle" font-size="9">{x:g}</text>'
        )
    for y in sorted({round(y, 3) for y in ys})[:: max(1, len(ys) // 6)]:
        out.append(f'<text x="{x0 + PAD - 3}" y="{sy(y):.1f}" text-anchor="end" font-size="9">{y:g}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[name.split()[0]]
        solid = any(word in name for word in ("teardown", "cold", "runner"))
        dash = "" if solid else ' stroke-dasharray="4 3"'
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}"{dash}/>')
        out.append(
            f'<text x="{x0 + PAD + 6}" y="{y0 + 28 + 11 * i}" font-size="9" fill="{colour}">{name}</text>'
        )
    return out


def main(srcs: list[str], dest: str) -> None:
    files = [json.loads(Path(src).read_text()) for src in srcs]
    data = {
        "runs": list({(r["backend"], r["n"]): r for f in files for r in f["runs"]}.values()),
        "decisions": [d for f in files for d in f["decisions"]],
        "runner": list(
            {(r["backend"], r["runners"]): r for f in files for r in f.get("runner", [])}.values()
        ),
    }
    runs: dict[str, list[tuple[float, float]]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {}
    runner: dict[str, list[tuple[float, float]]] = {}
    for r in data["runner"]:
        if "failed" not in r:
            runner.setdefault(f"{r['backend']} runner deliveries/s", []).append(
                (r["runners"], r["deliveries_per_s"])
            )
    for r in data["runs"]:
        if "failed" in r:
            continue
        for op in ("teardown", "resume"):
            runs.setdefault(f"{r['backend']} {op}s/s", []).append((r["n"], r[op]["per_s"]))
            util = "work_util" if "work_util" in r[op] else "cpu_util"
            if util in r[op]:
                cpu.setdefault(f"{r['backend']} {op} {util}", []).append((r["n"], r[op][util]))
    decisions: dict[str, list[tuple[float, float]]] = {}
    for d in data["decisions"]:
        if "failed" in d:
            continue
        decisions.setdefault(f"{d['backend']} cold ms", []).append((d["records"], d["cold_s"] * 1000))
        if "full_fold_s" in d:
            decisions.setdefault(f"{d['backend']} full read ms", []).append(
                (d["records"], d["full_fold_s"] * 1000)
            )
    body = panel(0, "throughput vs runs at once", "runs at once (N)", "per second", runs, False)
    body += panel(W + 20, "first decision in a fresh process", "records (log)", "ms (log)", decisions, True)
    body += panel(0, "CPU use vs runs at once", "runs at once (N)", "share of the free cores", cpu, False, H + 10, 0.9)
    body += panel(
        W + 20, "runner on NATS", "runner processes", "deliveries per second", runner, False, H + 10
    )
    height = 2 * H + 10 if cpu or runner else H
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 20}" height="{height}" '
        'font-family="sans-serif">'
    )
    Path(dest).write_text(
        "\n".join([svg, '<rect width="100%" height="100%" fill="#fff"/>', *body, "</svg>\n"])
    )


if __name__ == "__main__":
    main(sys.argv[1:-1], sys.argv[-1])
