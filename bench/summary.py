"""Render a results file as the README's tables: ``python bench/summary.py bench/results/DATE.json``.

``python bench/summary.py --merge OUT PART.json...`` joins runs of separate sections first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def ratio(c: dict[str, Any]) -> str:
    return f"{c['median_ratio']:.2f} ({c['min_ratio']:.2f}-{c['max_ratio']:.2f})"


def comparisons(results: dict[str, Any]) -> list[str]:
    lines = [
        "| comparison (tree/engine/store) | A median s | B median s | A/B median (min-max) |",
        "|---|---|---|---|",
    ]
    for c in results["comparisons"]:
        lines.append(
            f"| {c['name']} | {c['a']} {c['median_a_s']:.2f} | {c['b']} {c['median_b_s']:.2f} | {ratio(c)} |"
        )
    return lines


def goals(results: dict[str, Any]) -> list[str]:
    lines = ["| goal | measured | limit | |", "|---|---|---|---|"]
    for g in results.get("goals", []):
        verdict = "PASS" if g["pass"] else "MISS"
        lines.append(f"| {g['goal']} | {g['measured']:.2f} | {g['limit']} | {verdict} |")
    return lines


def memory(results: dict[str, Any]) -> list[str]:
    lines = ["| tree | bank VmHWM MiB (before -> after) | restore VmHWM MiB |", "|---|---|---|"]
    for tree, row in results.get("memory", {}).items():
        cells = []
        for mode in ("bank", "restore"):
            m = row.get(mode, {})
            if "hwm_after_kib" in m:
                cells.append(
                    f"{m['hwm_before_kib'] / 1024:.1f} -> {m['hwm_after_kib'] / 1024:.1f} ({m['seconds']:.1f} s)"
                )
            else:
                cells.append("n/a: " + (m.get("error", "").strip().splitlines() or ["?"])[-1][:80])
        lines.append(f"| {tree} | {cells[0]} | {cells[1]} |")
    return lines


def phases(results: dict[str, Any]) -> list[str]:
    lines = ["| engine | bank phases (s) | restore phases (s) |", "|---|---|---|"]
    for p in results.get("profiles", []):
        bank = ", ".join(f"{k} {v:.2f}" for k, v in p["bank_phases_s"].items() if v >= 0.005)
        restore = ", ".join(f"{k} {v:.2f}" for k, v in p["restore_phases_s"].items() if v >= 0.005)
        lines.append(f"| {p['engine']} | {bank} | {restore} |")
    return lines


def merge(out: Path, parts: list[Path]) -> dict[str, Any]:
    """One results file from runs of separate sections (run one after another or side by side)."""
    merged: dict[str, Any] = {
        "parts": [str(p) for p in parts],
        "comparisons": [],
        "profiles": [],
        "notes": [],
    }
    for part in parts:
        results = json.loads(part.read_text())
        for key in ("comparisons", "profiles", "notes"):
            merged[key] += results.get(key, [])
        for key, value in results.items():
            if key not in merged and key != "goals":
                merged[key] = value
    if "memory" in merged and "memory_pairs" not in merged:
        merged["memory_pairs"] = [["ten_mb", "gigabyte"], ["thousand", "million"]]
    from run import print_goals  # the same goals as a single run prints

    print_goals(merged)
    out.write_text(json.dumps(merged, indent=2, default=str))
    return merged


def main() -> None:
    if sys.argv[1] == "--merge":
        merge(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
        return
    results = json.loads(Path(sys.argv[1]).read_text())
    for section in (goals, comparisons, phases, memory):
        print("\n".join(section(results)))
        print()


if __name__ == "__main__":
    main()
