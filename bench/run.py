"""scratchbank benchmarks: figures and ratios measured side by side in one run.

    ./dev bench [--quick] [--out bench/results/DATE.json]

1. bank end to end (quiesce + archive + host check + store + record) against the floor
   (a bare in-sandbox `tar czf - . > /dev/null`) and the by-hand pipeline (in-sandbox
   `tar czf` streamed to a host file, then stored), per engine that is up;
2. restore end to end (fetch + host check + canonical stream + extract + verify)
   against a bare `tar xzf` of the same archive in the same sandbox;
3. host peak RSS of a banking process at 10, 100 and 250 MB scratches, and the slope;
4. the resume decision (read + fold + decide) at 10 .. 100k events on SQLite.
Targets are printed as pass/fail; nothing here asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import ScriptedSandbox
from scratchbank.application.resume import check_resume, current_state, resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest, decide_resume, fold
from scratchbank.testing.builders import banked, node, started

SITE = Path(__import__("botocore").__file__).parent.parent


def source_tree(dest: Path) -> int:
    """A ~35 MB tree of many small files: botocore, hypothesis and pip sources and data."""
    for pkg in ("botocore", "hypothesis", "pip"):
        shutil.copytree(SITE / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def timed(fn: Callable[[], Any], n: int) -> float:
    runs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


class Engine:
    """A sandbox factory: local, or a container on Docker / Podman."""

    def __init__(self, name: str) -> None:
        self.name = name

    def make(self, tree: Path) -> tuple[ScriptedSandbox, Callable[[], None]]:
        if self.name == "local":
            box = LocalSandbox()
            shutil.copytree(tree, box.facts.scratch)
            return box, box.destroy
        if self.name == "k8s-double":
            return self._k8s(tree)
        import docker

        from scratchbank.adapters.docker_sandbox import DockerSandbox

        kind = self.name.split("-")[0]
        url = os.environ["SCRATCHBANK_DOCKER_URL" if kind == "docker" else "SCRATCHBANK_PODMAN_URL"]
        client = docker.DockerClient(base_url=url, timeout=300)
        image = "scratchbank-busybox:test" if kind == "docker" else "localhost/scratchbank-busybox:test"
        c = client.containers.run(image, ["sleep", "1000000"], detach=True, network_mode="none")
        c.exec_run(["mkdir", "-p", "/tmp/iterion-scratch"])
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(tree, arcname=".")
        c.put_archive("/tmp/iterion-scratch", buf.getvalue())
        box = DockerSandbox(c.id, scratch="/tmp/iterion-scratch", podman=kind == "podman", client=client)

        def close() -> None:
            c.remove(force=True)
            client.close()

        return box, close

    def _k8s(self, tree: Path) -> tuple[ScriptedSandbox, Callable[[], None]]:
        """A pod of the API double (tests/k8s_double.py), through the Kubernetes adapter."""
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from k8s_double import running_double
        from kubernetes import client as k8s

        from scratchbank.adapters.k8s_sandbox import KubernetesSandbox

        ctx = running_double()
        double = ctx.__enter__()
        pod = double.add_pod("ns1", "bench")
        shutil.copytree(tree, pod.sandbox.facts.scratch)
        config = k8s.Configuration()
        config.host = double.url
        api = k8s.ApiClient(config)
        box = KubernetesSandbox("bench", namespace="ns1", scratch=pod.sandbox.facts.scratch, api_client=api)

        def close() -> None:
            api.close()
            ctx.__exit__(None, None, None)

        return box, close


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


def bench_bank_restore(
    engine: Engine, tree: Path, n: int, work: Path, store_kind: str = "fs"
) -> dict[str, Any]:
    box, close = engine.make(tree)
    try:
        floor = timed(lambda: box.run('cd "$1" && tar czf - . > /dev/null', [box.facts.scratch]), n)
        by_hand_file = work / f"{engine.name}-byhand.tgz"
        store_root = work / f"{engine.name}-byhand-store"
        store_root.mkdir(exist_ok=True)

        hand_store = make_store(store_kind, work, f"{engine.name}-byhand")

        def by_hand() -> None:
            with open(by_hand_file, "wb") as out:
                box.run('cd "$1" && tar czf - .', [box.facts.scratch], stdout=out)
            if store_kind == "fs":
                shutil.copyfile(by_hand_file, store_root / "bank.tgz")
            else:
                hand_store.client.upload_file(str(by_hand_file), hand_store.bucket, "byhand.tgz")

        hand = timed(by_hand, n)
        timeline = EventStoreTimeline(f"sqlite:///{work}/{engine.name}-{store_kind}.db")
        store = make_store(store_kind, work, engine.name)
        timeline.append("run-b", [started()])

        def bank() -> None:
            report = bank_at_teardown(
                "run-b", timeline=timeline, store=store, sandbox=box, run_finished=False
            )
            assert report.record is not None and report.record.banked, report

        ours = timed(bank, n)
        bank_file = work / f"{engine.name}-{store_kind}-bank.tgz"
        with open(bank_file, "wb") as f:
            bank_bytes = store.fetch("run-b", f, max_bytes=1 << 30).bytes
        bare_x = timed(lambda: _bare_extract(box, bank_file), n)

        def restore() -> None:
            out = resume("run-b", ResumeRequest(), timeline=timeline, store=store, sandbox=box)
            assert out.proceeds, out

        restore_t = timed(restore, n)
        timeline.close()
        return {
            "engine": engine.name,
            "store": store_kind,
            "floor_s": floor,
            "by_hand_s": hand,
            "bank_s": ours,
            "bank_ratio_to_floor": ours / floor,
            "bank_faster_than_by_hand": ours < hand,
            "bank_bytes": bank_bytes,
            "by_hand_bytes": by_hand_file.stat().st_size,
            "bare_extract_s": bare_x,
            "restore_s": restore_t,
            "restore_ratio_to_bare": restore_t / bare_x,
        }
    finally:
        close()


def _bare_extract(box: ScriptedSandbox, bank: Path) -> None:
    with open(bank, "rb") as src:
        done = box.run("rm -rf /tmp/floor && mkdir -p /tmp/floor && tar xzf - -C /tmp/floor", [], stdin=src)
    assert done.exit_code == 0, done.err


def mixed_tree(dest: Path, tree: Path) -> int:
    """~200 MB: the source tree, 80 MB of random binaries and 90 MB of compressible logs."""
    shutil.copytree(tree, dest / "src")
    (dest / "bin").mkdir()
    for i in range(8):
        (dest / "bin" / f"blob{i}.bin").write_bytes(os.urandom(10 << 20))
    line = b"2026-11-29T10:00:00Z INFO step=%d measured floor=12.5 ms ok\n"
    with open(dest / "run.log", "wb") as log:
        for i in range(1_400_000):
            log.write(line % i)
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def bench_compression(
    engines: list[Engine], trees: dict[str, Path], n: int, work: Path
) -> list[dict[str, Any]]:
    """Host-side gzip levels 1, 6, 9 against the sandbox's own gzip, per tree and engine."""
    from scratchbank.application.teardown import Budgets

    rows = []
    for engine in engines:
        for tree_name, tree in trees.items():
            if tree_name != "source" and engine.name != "local":
                continue
            box, close = engine.make(tree)
            try:
                for label, budgets in [
                    ("host gzip -1", Budgets(gzip_level=1)),
                    ("host gzip -6", Budgets(gzip_level=6)),
                    ("host gzip -9", Budgets(gzip_level=9)),
                    ("sandbox gzip", Budgets(compress_in_sandbox=True)),
                ]:
                    timeline = EventStoreTimeline(
                        f"sqlite:///{work}/c-{engine.name}-{tree_name}-{label[-2:]}.db"
                    )
                    timeline.append("run-c", [started()])
                    store = FilesystemBankStore(work / "c-banks")

                    bank = functools.partial(
                        bank_at_teardown,
                        "run-c",
                        timeline=timeline,
                        store=store,
                        sandbox=box,
                        run_finished=False,
                        budgets=budgets,
                    )
                    seconds = timed(bank, n)
                    rows.append(
                        {
                            "engine": engine.name,
                            "tree": tree_name,
                            "compression": label,
                            "seconds": seconds,
                            "bytes": store.path("run-c").stat().st_size,
                        }
                    )
                    timeline.close()
            finally:
                close()
    return rows


RSS_CHILD = r"""
import os, resource, sys, shutil
from pathlib import Path
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.testing.builders import started
mb, work = int(sys.argv[1]), Path(sys.argv[2])
box = LocalSandbox()
scratch = Path(box.facts.scratch); scratch.mkdir(parents=True)
for i in range(mb // 10):
    (scratch / f"blob{i}").write_bytes(os.urandom(10 << 20))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = InMemoryTimeline(); t.append("r", [started()])
report = bank_at_teardown("r", timeline=t, store=FilesystemBankStore(work / f"rss{mb}"), sandbox=box, run_finished=False)
assert report.record.banked, report
box.destroy()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, base)
"""


def bench_rss(work: Path, sizes: list[int]) -> dict[str, Any]:
    points = {}
    for mb in sizes:
        out = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, str(mb), str(work)], capture_output=True, text=True, check=True
        ).stdout.split()
        points[mb] = int(out[0]) / 1024
    growth = points[sizes[-1]] - points[sizes[0]]
    slope = growth / (sizes[-1] - sizes[0])
    return {"peak_rss_mib": points, "growth_mib": growth, "slope_mib_per_mb": slope}


def bench_decision(work: Path, lengths: list[int], postgres: str | None = None) -> dict[str, Any]:
    out, snap = {}, {}
    for n in lengths:
        url = f"sqlite:///{work}/decision-{n}.db"
        if postgres:
            import uuid

            import psycopg

            name = "bench_" + uuid.uuid4().hex[:8]
            with psycopg.connect(postgres, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            url = postgres.rsplit("/", 1)[0] + "/" + name
        t = EventStoreTimeline(url)
        records = [started(), banked()]
        batch = [node(f"n{i % 50}", "human") for i in range(1000)]
        written = 2
        t.append("run-d", records)
        while written < n:
            chunk = batch[: min(1000, n - written)]
            t.append("run-d", chunk)
            written += len(chunk)
        out[n] = timed(lambda t=t: decide_resume(fold(t.read("run-d")), ResumeRequest()), 3)
        current_state(t, "run-d", snapshots=t)  # the first call after a long run saves one
        snap[n] = timed(lambda t=t: check_resume(t, "run-d", ResumeRequest(), snapshots=t), 3)
        t.close()
    return {"seconds": out, "seconds_with_snapshots": snap}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=f"bench/results/{dt.date.today().isoformat()}.json")
    args = parser.parse_args()
    n = 1 if args.quick else 3
    work = Path(tempfile.mkdtemp(prefix="scratchbank-bench-"))
    engines = [Engine("local"), Engine("k8s-double")]
    if os.environ.get("SCRATCHBANK_DOCKER_URL"):
        engines.append(Engine("docker-busybox"))
    if os.environ.get("SCRATCHBANK_PODMAN_URL"):
        engines.append(Engine("podman-busybox"))
    tree = work / "tree"
    size = source_tree(tree)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "tree_bytes": size,
        "repeats": n,
        "bank_restore": [],
    }
    print(f"source tree: {size / 1e6:.1f} MB, {sum(1 for _ in tree.rglob('*'))} entries; median of {n}")
    print(
        f"{'engine':16} {'store':5} {'floor':>7} {'by-hand':>8} {'bank':>7} {'ratio':>6} "
        f"{'bare x':>7} {'restore':>8} {'ratio':>6}"
    )
    stores = ["fs", "s3"] if os.environ.get("SCRATCHBANK_S3_ENDPOINT") else ["fs"]
    for engine, store_kind in [(e, k) for e in engines for k in stores]:
        row = bench_bank_restore(engine, tree, n, work, store_kind)
        results["bank_restore"].append(row)
        print(
            f"{row['engine']:16} {row['store']:5} {row['floor_s']:7.2f} {row['by_hand_s']:8.2f} "
            f"{row['bank_s']:7.2f} {row['bank_ratio_to_floor']:6.2f} {row['bare_extract_s']:7.2f} "
            f"{row['restore_s']:8.2f} {row['restore_ratio_to_bare']:6.2f}"
        )
    trees = {"source": tree}
    if not args.quick:
        mixed = work / "mixed"
        mixed.mkdir()
        print(f"mixed tree: {mixed_tree(mixed, tree) / 1e6:.1f} MB")
        trees["mixed"] = mixed
    results["compression"] = bench_compression(engines, trees, n, work)
    print(f"{'engine':16} {'tree':7} {'compression':14} {'seconds':>8} {'MB':>7}")
    for row in results["compression"]:
        print(
            f"{row['engine']:16} {row['tree']:7} {row['compression']:14} {row['seconds']:8.2f} "
            f"{row['bytes'] / 1e6:7.1f}"
        )
    sizes = [10, 100] if args.quick else [10, 100, 250]
    results["rss"] = bench_rss(work, sizes)
    print(
        f"peak RSS (MiB) by scratch MB: {results['rss']['peak_rss_mib']}; "
        f"growth {results['rss']['growth_mib']:.1f} MiB, slope {results['rss']['slope_mib_per_mb']:.3f} MiB/MB"
    )
    lengths = [10, 1000, 10_000] if args.quick else [10, 1000, 10_000, 100_000]
    results["decision"] = bench_decision(work, lengths)
    print(
        "decision (read + fold + decide) seconds by events:",
        {k: round(v, 4) for k, v in results["decision"]["seconds"].items()},
    )
    targets = {
        "bank <= 1.15x floor": all(r["bank_ratio_to_floor"] <= 1.15 for r in results["bank_restore"]),
        "bank faster than by-hand": all(r["bank_faster_than_by_hand"] for r in results["bank_restore"]),
        "restore <= 1.2x bare extract": all(
            r["restore_ratio_to_bare"] <= 1.2 for r in results["bank_restore"]
        ),
        "RSS growth < 16 MiB": results["rss"]["growth_mib"] < 16,
        "decision < 100 ms at the longest history (snapshots)": max(
            results["decision"]["seconds_with_snapshots"].values()
        )
        < 0.1,
    }
    results["targets"] = targets
    for name, ok in targets.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    print(f"written {args.out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
