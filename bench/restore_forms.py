"""The restore stream's forms against each other and a bare extract, per engine (ADR 0003).

    python bench/restore_forms.py [--engines docker,podman,k8s-double] [--tree source] [--rounds 5]

Per engine: bank the tree once, then per round (order rotated) a restore with the
canonical stream raw, one with it gzipped (ISA-L level 1 on the host, ``tar xzf`` in the
sandbox), and a bare ``tar xzf`` of the bank: each restore's ratio to the round's bare
extract. Forced forms go through ``SandboxTarget(gzip_level=...)``, the choice aside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import engines
import trees
from pairs import seconds
from run import Rig

from scratchbank.application import resume as resume_module
from scratchbank.application.restore import SandboxTarget
from scratchbank.application.teardown import Budgets


def _forced(level: int | None) -> type:
    class Forced(SandboxTarget):
        def __init__(self, sandbox: object, gzip_level: object = None) -> None:
            super().__init__(sandbox, level)  # type: ignore[arg-type]

    return Forced


def measure(engine: str, tree_name: str, rounds: int, work: Path) -> dict[str, object]:
    box = engines.make(engine, trees.tree(tree_name))
    rig = Rig(box, "fs", work / f"{engine}-{tree_name}", Budgets())
    original = resume_module.SandboxTarget
    try:
        rig.bank()
        rig.fetch_bank()

        def restore(level: int | None) -> None:
            resume_module.SandboxTarget = _forced(level)  # type: ignore[misc]
            try:
                rig.restore()
            finally:
                resume_module.SandboxTarget = original  # type: ignore[misc]

        sides = {
            "raw": (lambda: restore(None), rig.settle),
            "gz1": (lambda: restore(1), rig.settle),
            "bare": (rig.bare_extract, rig.bare_prepare),
        }
        names = list(sides)
        for name in names:  # warm-up
            sides[name][1]()
            sides[name][0]()
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                run, prepare = sides[name]
                prepare()
                times[name].append(seconds(run))
        ratios = {n: [t / b for t, b in zip(times[n], times["bare"], strict=True)] for n in ("raw", "gz1")}
        out = {
            "engine": engine,
            "tree": tree_name,
            "seconds": times,
            "ratios": ratios,
            "median": {n: statistics.median(v) for n, v in ratios.items()},
            "gz_over_raw": statistics.median(
                [g / r for g, r in zip(times["gz1"], times["raw"], strict=True)]
            ),
        }
        print(json.dumps({k: out[k] for k in ("engine", "tree", "median", "gz_over_raw")}), flush=True)
        print("   ", {n: [round(x, 2) for x in v] for n, v in ratios.items()}, flush=True)
        return out
    finally:
        rig.close()
        box.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="docker,podman,k8s-double")
    parser.add_argument("--tree", default="source")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            results.append(measure(engine, args.tree, args.rounds, Path(tmp)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
