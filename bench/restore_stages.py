"""Where a restore's time goes in the sandbox: restore.sh's stages, timed by its own trace.

    SCRATCHBANK_RESTORE_TRACE=1 python bench/restore_stages.py [--engines local,docker]
        [--tree source] [--runs 5]

Per engine: bank the tree once, then restore it ``--runs`` times (each after ``settle``),
with the script's env-guarded trace on (``scratchbank-trace STAGE UPTIME`` lines on its
stderr, read here from each exec's result); prints each stage's median seconds (from the
stage before it) and the exec's whole wall time, and, interleaved with the restores, a
bare ``tar xf`` of the same bank into the same sandbox (restore/bare per pair).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if not os.environ.get("SCRATCHBANK_RESTORE_TRACE"):
    sys.exit("set SCRATCHBANK_RESTORE_TRACE=1: the restore script's trace is read from its stderr")

import engines
import trees
from run import Rig

from scratchbank.application.teardown import Budgets


def _traced(box: engines.Box, stages: list[tuple[str, list[tuple[str, float]]]], side: list[str]) -> None:
    """Wrap the box's sandbox ``call`` so each restore exec's trace lines are kept, with
    the side (``side[0]``: restore, old) that ran it."""
    sandbox = box.sandbox
    inner = sandbox.call

    def call(*args: Any, **kwargs: Any) -> Any:
        done = inner(*args, **kwargs)
        marks = [
            (words[1].decode(), float(words[2]))
            for words in (line.split() for line in done.stderr.splitlines())
            if len(words) == 3 and words[0] == b"scratchbank-trace"
        ]
        if marks and marks[0][0] == "start":
            stages.append((side[0], marks))
        return done

    sandbox.call = call  # type: ignore[method-assign]


def measure(engine: str, tree_name: str, runs: int, work: Path, old: str = "") -> dict[str, Any]:
    box = engines.make(engine, trees.tree(tree_name))
    stages: list[tuple[str, list[tuple[str, float]]]] = []
    current = ["restore"]
    try:
        rig = Rig(box, "fs", work / tree_name, Budgets())
        why = rig.try_bank()
        assert not why, why
        rig.fetch_bank()
        _traced(box, stages, current)
        ratios, restore_s, bare_s, old_ratios = [], [], [], []
        order = [("restore", rig.settle, rig.restore), ("bare", rig.bare_prepare, rig.bare_extract)]
        if old:  # the same restore with another restore.sh (before/after in the same minute)
            order.append(("old", rig.settle, lambda: _with_script(old, rig.restore)))
        for i in range(runs):
            took = {}
            for name, prepare, side in order[i % len(order) :] + order[: i % len(order)]:
                prepare()
                current[0] = name
                t0 = time.monotonic()
                side()
                took[name] = time.monotonic() - t0
            ratios.append(took["restore"] / took["bare"])
            restore_s.append(took["restore"])
            bare_s.append(took["bare"])
            if old:
                old_ratios.append(took["old"] / took["bare"])
        per: dict[str, list[float]] = defaultdict(list)
        for who, marks in stages:
            tag = "" if who == "restore" else f"{who}: "
            for (_, before), (name, at) in itertools.pairwise(marks):
                per[tag + name].append(at - before)
            per[tag + "(exec, start to last mark)"].append(marks[-1][1] - marks[0][1])
        rig.close()
        return {
            "engine": engine,
            "tree": tree_name,
            "restore/bare": sorted(ratios),
            "old/bare": sorted(old_ratios),
            "restore_s": restore_s,
            "bare_s": bare_s,
            "stages_median_s": {k: statistics.median(v) for k, v in per.items()},
        }
    finally:
        box.close()


def _with_script(source: str, call: Any) -> None:
    """``call`` with another restore.sh; one that sums the stream with ``sha256sum`` (before
    issue 24's MD5) gets a host framing that digests with SHA-256 too."""
    import hashlib
    import types

    from scratchbank.adapters import restore_wire, scripted

    new, scripted.RESTORE = scripted.RESTORE, "SCRATCHBANK_TRACE=1\n" + source  # type: ignore[misc]
    algorithms = restore_wire.hashlib
    if "sha256sum <" in source:
        restore_wire.hashlib = types.SimpleNamespace(md5=lambda **_: hashlib.sha256())  # type: ignore[assignment]
    try:
        call()
    finally:
        scripted.RESTORE = new  # type: ignore[misc]
        restore_wire.hashlib = algorithms


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="local,docker")
    parser.add_argument("--tree", default="source")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old", default="", help="another restore.sh, interleaved as a third side")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scratchbank-stages-"))
    for engine in args.engines.split(","):
        old = Path(args.old).read_text() if args.old else ""
        got = measure(engine, args.tree, args.runs, work / engine, old)
        r = got["restore/bare"]
        print(
            f"{engine:10} {args.tree}: restore/bare median {statistics.median(r):.2f} "
            f"(min {r[0]:.2f}, max {r[-1]:.2f}); load1 {os.getloadavg()[0]:.1f}"
        )
        if old:
            o = got["old/bare"]
            print(
                f"{'':10} old restore.sh: restore/bare median {statistics.median(o):.2f} (min {o[0]:.2f}, max {o[-1]:.2f})"
            )
        for stage, s in got["stages_median_s"].items():
            print(f"    {stage:28} {s:7.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
