"""scratchbank benchmarks: every figure a ratio of interleaved pairs, measured side by side.

    ./dev bench [--quick] [--pairs N] [--out bench/results/DATE.json]

Per engine that is up (local, the Kubernetes API double, Docker, Podman) and store
(files, S3 when an endpoint is set), on the same scratch in the same sandbox:

1. bank end to end (``bank_at_teardown``: quiesce + archive + host check + store +
   record) against the in-sandbox ``tar czf`` floor and against the by-hand pipeline
   (in-sandbox ``tar czf`` to a host file, then copied into place or ``upload_file``d);
2. restore end to end (``resume``: fetch + host check + canonical stream + extract +
   verify) against a bare ``tar xzf`` of the same bank in the same sandbox, into a fresh
   directory beside the scratch (same filesystem);
3. the user's alternatives: ``docker cp`` / ``podman cp`` / ``kubectl cp`` out and back in;
4. bigger trees on every engine (205 MB mix, 1 GB mostly incompressible, 1,000,000
   tiny files; full run only; ``--big-pairs`` pairs each, default 2, with the engine's
   ``cp`` in; ``--big-trees thousand,ten_mb`` substitutes small trees to try the section);
5. host peak memory (VmHWM of a fresh banking / restoring process), 10 MB -> 1 GB and
   1,000 -> 1,000,000 files;
6. the host's gzip (ISA-L vs zlib) on the raw tar of a tree (ADR 0003);
7. where the time goes: each bank's phases (quiesce, archive, continue, upload, record)
   and a cProfile of one bank and one restore per engine;
8. the resume decision against history length (SQLite).

Before every timed side, untimed: the sandbox's old trees a restore removes in the
background are gone and the disk is synced (``Rig.settle``): on this machine's ext4
(mounted with ``discard``) a side otherwise pays for the writes of the side before it,
and the bare extract of one run took 0.34 s and 2.92 s in another.

Goals are printed PASS/MISS; nothing here asserts (CI never runs it: speed lives here).
Only the public use cases are called, so the harness runs unchanged on a new pipeline.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import platform
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import engines
import trees
from engines import Box, run_shell
from pairs import Comparison, Goal, Side, interleaved, seconds

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.application.resume import check_resume, current_state, resume
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import ResumeRequest, decide_resume, fold
from scratchbank.testing.builders import banked, node, started

HERE = Path(__file__).resolve().parent
FLOOR = 'cd "$1" && tar czf - . > /dev/null'
SETTLE = 'p=$(dirname "$1"); i=0; while ls -a "$p" | grep -q "staged.*[.]old$" && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done'
BIG = Budgets(cap_bytes=4 << 30)  # a 1 GB mostly incompressible scratch is over the 256 MiB cap
NOTES: list[str] = []


def make_store(kind: str, work: Path, name: str) -> Any:
    if kind == "fs":
        return FilesystemBankStore(work / f"{name}-banks")
    import uuid

    import boto3

    from scratchbank.adapters.s3_bank import S3BankStore

    client = boto3.client(
        "s3",
        endpoint_url=os.environ["SCRATCHBANK_S3_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id="b",
        aws_secret_access_key="b",
    )
    bucket = "bench-" + uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=bucket)
    return S3BankStore(bucket, client=client)


class Rig:
    """One engine, one store, one tree: the sides every comparison is made of."""

    def __init__(self, box: Box, store_kind: str, work: Path, budgets: Budgets) -> None:
        self.box, self.store_kind, self.budgets = box, store_kind, budgets
        self.work = work / f"{box.engine}-{store_kind}"
        self.work.mkdir(parents=True)
        self.timeline = EventStoreTimeline(f"sqlite:///{self.work}/timeline.db")
        self.timeline.append("run-b", [started()])
        self.store = make_store(store_kind, self.work, "ours")
        self.hand_store = make_store(store_kind, self.work, "hand")
        self.hand_file = self.work / "by-hand.tgz"
        self.bank_file = self.work / "bank.tgz"

    def try_bank(self) -> str:
        """Bank once; '' when banked, else why not (a refusal is a figure too, not a crash)."""
        report = bank_at_teardown(
            "run-b",
            timeline=self.timeline,
            store=self.store,
            sandbox=self.box.sandbox,
            run_finished=False,
            budgets=self.budgets,
        )
        record = report.record
        return "" if record is not None and record.banked else (record.reason if record else "no record")

    def bank(self) -> None:
        why = self.try_bank()
        assert not why, why

    def floor(self) -> None:
        run_shell(self.box, FLOOR)

    def by_hand(self) -> None:
        with open(self.hand_file, "wb") as out:
            run_shell(self.box, 'cd "$1" && tar czf - .', stdout=out)
        if self.store_kind == "fs":
            dest = self.work / "hand-banks" / "bank.tgz"
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(self.hand_file, dest)
        else:
            self.hand_store.client.upload_file(str(self.hand_file), self.hand_store.bucket, "byhand.tgz")

    def fetch_bank(self) -> int:
        with open(self.bank_file, "wb") as f:
            name = next(o.name for o in self.store.objects("run-b") if o.name is not None)
            return int(self.store.fetch("run-b", f, max_bytes=self.budgets.cap_bytes, name=name).bytes)

    def restore(self) -> None:
        out = resume(
            "run-b", ResumeRequest(), timeline=self.timeline, store=self.store, sandbox=self.box.sandbox
        )
        assert out.proceeds, out

    def settle(self) -> None:
        """Untimed, before every timed side: the old scratch a restore's commit removes in
        the background is gone, and the disk has written back what the last side left
        dirty (on this machine's ext4 a side otherwise pays for its neighbour's writes)."""
        run_shell(self.box, SETTLE)
        os.sync()

    def bare_prepare(self) -> None:
        run_shell(self.box, 'p=$(dirname "$1"); rm -rf "$p/.bench-bare" && mkdir "$p/.bench-bare"')
        self.settle()

    def bare_extract(self) -> None:
        with open(self.bank_file, "rb") as src:
            run_shell(self.box, 'tar xzf - -C "$(dirname "$1")/.bench-bare"', stdin=src)

    def close(self) -> None:
        self.timeline.close()


def compare_engine(
    box: Box, store_kind: str, work: Path, n: int, tree_name: str, *, alternatives: bool, quick: bool = False
) -> list[Comparison]:
    # a 1 GB bank needs a bigger cap; a million files is refused past Limits.members: once is enough
    budgets = {"gigabyte": BIG, "million": Budgets(bank_tries=1)}.get(tree_name, Budgets())
    rig = Rig(box, store_kind, work / tree_name, budgets)
    where = f"{tree_name}/{box.engine}/{store_kind}"
    try:
        why = rig.try_bank()
        if why:
            print(f"bank {where}: NOT BANKED ({why[:200]}); no comparison", flush=True)
            NOTES.append(f"bank {where} not banked: {why}")
            return []
        bank, floor = Side("bank", rig.bank, rig.settle), Side("floor", rig.floor, rig.settle)
        out = [interleaved(f"bank/floor {where}", bank, floor, n)]
        if tree_name in ("source", "mixed") and not quick:  # a by-hand tar czf of 1 GB adds minutes, no news
            out.append(
                interleaved(f"bank/by-hand {where}", bank, Side("by-hand", rig.by_hand, rig.settle), n)
            )
        rig.fetch_bank()
        restore = Side("restore", rig.restore, rig.settle)
        # a bank banked under a larger cap (the 1 GB tree) is restored too: the restore's cap
        # never falls below the size the host recorded
        bare = Side("bare x", rig.bare_extract, rig.bare_prepare)
        out.append(interleaved(f"restore/bare-extract {where}", restore, bare, n))
        if alternatives and box.cp_out is not None and box.cp_in is not None:
            cp_dir = rig.work / "cp"
            cp_out, cp_in = box.cp_out, box.cp_in
            out.append(
                interleaved(
                    f"bank/{box.engine}-cp-out {where}",
                    bank,
                    Side("cp out", lambda: cp_out(cp_dir), rig.settle),
                    n,
                )
            )
            out.append(
                interleaved(
                    f"restore/{box.engine}-cp-in {where}",
                    restore,
                    Side("cp in", lambda: cp_in(cp_dir), rig.settle),
                    n,
                )
            )
        for c in out:
            print(c.line(), flush=True)
        return out
    finally:
        rig.close()


def isal_vs_zlib(box: Box, work: Path, n: int) -> Comparison:
    """The whole bank with ISA-L's gzip against the same bank with zlib's (ADR 0003)."""
    from scratchbank.application.bank_format import gzip_codec

    rig = Rig(box, "fs", work / "codec-e2e", Budgets())
    has_isal = gzip_codec._isal

    def with_zlib() -> None:
        gzip_codec._isal = lambda: None  # type: ignore[assignment]  # the fallback a host without isal takes
        try:
            rig.bank()
        finally:
            gzip_codec._isal = has_isal  # type: ignore[assignment]

    try:
        c = interleaved(
            f"bank isal/zlib source/{box.engine}/fs", Side("isal", rig.bank), Side("zlib", with_zlib), n
        )
        print(c.line(), flush=True)
        return c
    finally:
        rig.close()


# -- where the time goes ----------------------------------------------------------------------


class Phases:
    """Wraps a sandbox, a store and a timeline to time each call a bank makes to them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, obj: Any, names: tuple[str, ...]) -> Any:
        phases = self

        class Timed:
            def __getattr__(self, attr: str) -> Any:
                value = getattr(obj, attr)
                if attr.startswith("_") or not callable(value) or (names and attr not in names):
                    return value

                def call(*args: Any, **kwargs: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return value(*args, **kwargs)
                    finally:
                        took = time.perf_counter() - t0
                        phases.seconds[attr] = phases.seconds.get(attr, 0.0) + took

                return call

        return Timed()


def profile_engine(box: Box, work: Path, *, deep: bool) -> dict[str, Any]:
    """One bank and one restore with their phases timed, and (deep) each under cProfile."""
    rig = Rig(box, "fs", work / "profile", Budgets())
    try:
        rig.bank()  # warm
        phases = Phases()
        sandbox = phases.wrap(box.sandbox, ())  # every public call: the restore pipeline may change
        store = phases.wrap(rig.store, ("put", "fetch"))
        timeline = phases.wrap(rig.timeline, ("append", "read"))
        total = seconds(
            lambda: bank_at_teardown(
                "run-b", timeline=timeline, store=store, sandbox=sandbox, run_finished=False
            )
        )
        bank_phases = dict(phases.seconds, total=total)
        phases.seconds = {}
        total = seconds(
            lambda: resume("run-b", ResumeRequest(), timeline=timeline, store=store, sandbox=sandbox)
        )
        restore_phases = dict(phases.seconds, total=total)
        return {
            "engine": box.engine,
            "bank_phases_s": bank_phases,
            "restore_phases_s": restore_phases,
            "bank_profile": _cprofile(rig.bank) if deep else [],
            "restore_profile": _cprofile(rig.restore) if deep else [],
        }
    finally:
        rig.close()


def _cprofile(fn: Callable[[], object], top: int = 12) -> list[str]:
    """The main thread's top functions by own time (the host lanes' threads are not profiled)."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    return lines[-top - 1 :]


# -- memory -----------------------------------------------------------------------------------


def memory(tree_names: list[str], work: Path) -> dict[str, Any]:
    """Bank then restore each tree in fresh processes; VmHWM of each, before and after."""
    child = str(HERE / "memory_child.py")
    out: dict[str, Any] = {}
    for name in tree_names:
        folder = work / f"mem-{name}"
        folder.mkdir()
        row = {}
        for mode, args in (("bank", [str(trees.tree(name)), str(folder)]), ("restore", [str(folder)])):
            done = subprocess.run(
                [sys.executable, child, mode, *args], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                row[mode] = {"error": done.stderr[-1500:]}
                continue
            row[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        shutil.rmtree(folder, ignore_errors=True)
        out[name] = row
        print(f"memory {name:9} " + "  ".join(_mem_line(mode, m) for mode, m in row.items()), flush=True)
    return out


def _mem_line(mode: str, m: dict[str, Any]) -> str:
    if "error" in m:
        return f"{mode}: ERROR {m['error'].strip().splitlines()[-1] if m['error'].strip() else ''}"
    return (
        f"{mode}: VmHWM {m['hwm_before_kib'] / 1024:.1f} -> {m['hwm_after_kib'] / 1024:.1f} MiB "
        f"in {m['seconds']:.1f}s ({m['what'][:90]})"
    )


def peak_mib(mem: dict[str, Any], tree: str, mode: str) -> float | None:
    m = mem.get(tree, {}).get(mode, {})
    return m["hwm_after_kib"] / 1024 if "hwm_after_kib" in m else None


def memory_goals(mem: dict[str, Any], small: str, large: str, what: str) -> list[Goal]:
    goals = []
    for mode in ("bank", "restore"):
        lo, hi = peak_mib(mem, small, mode), peak_mib(mem, large, mode)
        if lo is not None and hi is not None:
            goals.append(
                Goal(f"{mode} peak memory growth {what} ({small} -> {large})", 32, value=hi - lo, unit=" MiB")
            )
    return goals


# -- host gzip --------------------------------------------------------------------------------


def codecs(tree_names: list[str], work: Path, n: int) -> list[dict[str, Any]]:
    """ISA-L vs zlib through HostArchive (compress + hash + write + parse) on a tree's raw tar."""
    from scratchbank.application.bank_format.gzip_codec import GzipCodec, _isal
    from scratchbank.application.bank_format.host_archive import HostArchive

    if _isal() is None:
        print("isal not installed: codec comparison skipped")
        return []
    rows = []
    for name in tree_names:
        raw = work / f"{name}.tar"
        subprocess.run(["tar", "cf", str(raw), "-C", str(trees.tree(name)), "."], check=True)

        def sink(codec: GzipCodec, raw: Path = raw) -> Callable[[], object]:
            def go() -> object:
                archive = HostArchive(
                    work / "codec.tgz", gzipped_input=False, gzip_level=codec.level, cap=8 << 30, codec=codec
                )
                with open(raw, "rb") as src:
                    while chunk := src.read(1 << 20):
                        archive.write(chunk)
                return archive.finish()

            return go

        isal1, zlib1, zlib6 = GzipCodec("isal", 1), GzipCodec("zlib", 1), GzipCodec("zlib", 6)
        for other in (zlib1, zlib6):
            c = interleaved(
                f"host archive isal-1/{other.library}-{other.level} {name}",
                Side("isal-1", sink(isal1)),
                Side(f"{other.library}-{other.level}", sink(other)),
                n,
            )
            print(c.line(), flush=True)
            rows.append(c.as_json())
        for codec in (isal1, zlib1, zlib6):
            facts: Any = sink(codec)()
            rows.append(
                {
                    "tree": name,
                    "codec": f"{codec.library}-{codec.level}",
                    "raw_bytes": raw.stat().st_size,
                    "gzip_bytes": facts.bytes,
                }
            )
            print(
                f"  {name}: {codec.library}-{codec.level} {raw.stat().st_size / 1e6:.1f} MB -> {facts.bytes / 1e6:.1f} MB"
            )
        raw.unlink()
    return rows


# -- decision ---------------------------------------------------------------------------------


def bench_decision(work: Path, lengths: list[int]) -> dict[str, Any]:
    out, snap = {}, {}
    for n in lengths:
        t = EventStoreTimeline(f"sqlite:///{work}/decision-{n}.db")
        batch = [node(f"n{i % 50}", "human") for i in range(1000)]
        written = 2
        t.append("run-d", [started(), banked()])
        while written < n:
            chunk = batch[: min(1000, n - written)]
            t.append("run-d", chunk)
            written += len(chunk)
        out[n] = seconds(lambda t=t: decide_resume(fold(t.read("run-d")), ResumeRequest()))
        current_state(t, "run-d", snapshots=t)  # the first call after a long run saves one
        snap[n] = seconds(lambda t=t: check_resume(t, "run-d", ResumeRequest(), snapshots=t))
        t.close()
    return {"seconds": out, "seconds_with_snapshots": snap}


# -- the run ----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
    }


SECTIONS = ("source", "big", "codecs", "memory", "decision")


@attrs.frozen
class Plan:
    """What one run measures: engines, stores, pairs, sections, and where it writes."""

    quick: bool
    n: int
    engines: tuple[str, ...]
    stores: tuple[str, ...]
    sections: tuple[str, ...]
    out: str
    work: Path
    big_pairs: int = 2
    big_trees: tuple[str, ...] = ("mixed", "gigabyte", "million")


def parse_plan() -> Plan:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick",
        action="store_true",
        help="source tree, files store, bank/floor and restore/bare per engine, small memory sizes (< 5 min when quiet)",
    )
    parser.add_argument("--pairs", type=int, default=5, help="interleaved pairs per comparison (>= 5)")
    parser.add_argument("--engines", default=",".join(engines.available()))
    parser.add_argument("--sections", default=",".join(SECTIONS), help="any of " + ",".join(SECTIONS))
    parser.add_argument("--out", default="")
    parser.add_argument("--big-pairs", type=int, default=2, help="interleaved pairs per big-tree comparison")
    parser.add_argument(
        "--big-trees",
        default="mixed,gigabyte,million",
        help="the big section's trees (thousand,ten_mb: a small substitute to try it)",
    )
    args = parser.parse_args()
    stem = f"bench/results/{dt.date.today().isoformat()}{'-quick' if args.quick else ''}"
    sections = tuple(x for x in args.sections.split(",") if x and not (args.quick and x in ("big", "codecs")))
    return Plan(
        args.quick,
        max(5, args.pairs),
        tuple(e for e in args.engines.split(",") if e),
        ("fs", "s3") if os.environ.get("SCRATCHBANK_S3_ENDPOINT") else ("fs",),
        sections,
        args.out or f"{stem}.json",
        Path(tempfile.mkdtemp(prefix="scratchbank-bench-")),
        max(1, args.big_pairs),
        tuple(t for t in args.big_trees.split(",") if t),
    )


def source_section(plan: Plan, results: dict[str, Any]) -> None:
    """Every engine on the source tree: goals, alternatives, isal vs zlib, phases."""
    with_s3 = () if plan.quick else ("local", "docker")
    for name in plan.engines:
        box = engines.make(name, trees.tree("source"))
        try:
            for store_kind in plan.stores if name in with_s3 else ("fs",):
                results["comparisons"] += as_json(
                    compare_engine(
                        box,
                        store_kind,
                        plan.work,
                        plan.n,
                        "source",
                        alternatives=not plan.quick,
                        quick=plan.quick,
                    )
                )
            if not plan.quick:
                results["comparisons"].append(isal_vs_zlib(box, plan.work, plan.n).as_json())
            results["profiles"].append(profile_engine(box, plan.work / name, deep=not plan.quick))
            print_phases(results["profiles"][-1])
        finally:
            box.close()
        save(plan.out, results)


def big_section(plan: Plan, results: dict[str, Any]) -> None:
    """The 205 MB mix, 1 GB mostly incompressible and 1,000,000 tiny files, on every engine,
    ``big_pairs`` pairs each, the engine's ``cp`` in and out beside (issue 24)."""
    for tree_name in plan.big_trees:
        for name in plan.engines:
            box = engines.make(name, trees.tree(tree_name))
            try:
                results["comparisons"] += as_json(
                    compare_engine(
                        box, "fs", plan.work / name, plan.big_pairs, tree_name, alternatives=True, quick=True
                    )
                )
            finally:
                box.close()
            save(plan.out, results)


def as_json(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    return [c.as_json() for c in comparisons]


def memory_section(plan: Plan, results: dict[str, Any]) -> None:
    sizes, counts = (["ten_mb", "source"], ["thousand", "source"]) if plan.quick else MEMORY_TREES
    results["memory"] = memory(list(dict.fromkeys(sizes + counts)), plan.work)
    results["memory_pairs"] = [sizes, counts]


MEMORY_TREES = (["ten_mb", "gigabyte"], ["thousand", "million"])


def decision_section(plan: Plan, results: dict[str, Any]) -> None:
    results["decision"] = bench_decision(
        plan.work, [10, 1000, 10_000] if plan.quick else [10, 1000, 10_000, 50_000]
    )
    print(
        "decision (read + fold + decide) seconds:",
        {k: round(v, 4) for k, v in results["decision"]["seconds"].items()},
    )


def print_goals(results: dict[str, Any]) -> None:
    goals = [Goal.of(c) for c in results["comparisons"] if Goal.limit_for(c["name"]) is not None]
    mem = results.get("memory", {})
    for (small, large), what in zip(
        results.get("memory_pairs", []), ("by size", "by file count"), strict=False
    ):
        goals += memory_goals(mem, small, large, what)
    results["goals"] = [g.as_json() for g in goals]
    print("goals:")
    for g in goals:
        print(g.line())


def main() -> int:
    if "--scale" in sys.argv[1:]:  # how cost grows with work: bench/scale.py (issue 26)
        import scale

        return scale.main([a for a in sys.argv[1:] if a != "--scale"])
    started = time.monotonic()
    plan = parse_plan()
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "machine": machine(),
        "pairs": plan.n,
        "quick": plan.quick,
        "comparisons": [],
        "profiles": [],
        "notes": NOTES,
    }
    size, entries = trees.stats(trees.tree("source"))
    print(f"source tree: {size / 1e6:.1f} MB, {entries} entries; {plan.n} interleaved pairs per comparison")
    run_sections = {
        "source": source_section,
        "big": big_section,
        "memory": memory_section,
        "decision": decision_section,
    }
    for section in plan.sections:
        if section == "codecs":
            results["codecs"] = codecs(["source"], plan.work, plan.n)
        else:
            run_sections[section](plan, results)
        save(plan.out, results)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print_goals(results)
    if plan.quick:
        print(Goal("quick run's wall time", 300, value=results["elapsed_s"], unit=" s").line())
    save(plan.out, results)
    print(f"written {plan.out}")
    shutil.rmtree(plan.work, ignore_errors=True)
    return 0


def print_phases(p: dict[str, Any]) -> None:
    print(
        f"phases {p['engine']:10} bank {_phases(p['bank_phases_s'])} | restore {_phases(p['restore_phases_s'])}"
    )


def save(out: str, results: dict[str, Any]) -> None:
    """Written after each section too: a run cut short still leaves its figures."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2, default=str))


def _phases(p: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in p.items())


if __name__ == "__main__":
    sys.exit(main())
