"""One banking or restoring process, measured from inside: VmHWM before and after.

    python memory_child.py bank TREE WORK
    python memory_child.py restore WORK
    python memory_child.py host TREE WORK     (HostArchive alone, fed by a host tar)

Run as a fresh process per measurement: ``ru_maxrss`` survives ``exec`` on Linux, so a
child of a big process would report its parent's peak; ``VmHWM`` in /proc/self/status
is this process's own. Prints one JSON line: hwm_before_kib, hwm_after_kib, seconds, what.
The bank's cap is raised to 4 GiB (``Budgets.cap_bytes``) so a 1 GB scratch is banked;
a restore past the default cap goes through ``restore_bank`` with the same cap.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.application.resume import check_resume, resume
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import ResumeRequest
from scratchbank.domain.teardown import CAP_BYTES
from scratchbank.testing.builders import started

BIG_CAP = 4 << 30


def vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def bank(tree: Path, work: Path) -> dict[str, object]:
    box = LocalSandbox()
    os.symlink(tree, box.facts.scratch)
    timeline = EventStoreTimeline(f"sqlite:///{work}/timeline.db")
    timeline.append("r", [started()])
    store = FilesystemBankStore(work / "banks")
    before = vm_hwm_kib()
    t0 = time.perf_counter()
    report = bank_at_teardown(
        "r",
        timeline=timeline,
        store=store,
        sandbox=box,
        run_finished=False,
        # a refusal (over a budget) once; a million files takes minutes on a busy host: an
        # hour's banking budget measures the memory rather than the default 300 s deadline
        budgets=Budgets(cap_bytes=BIG_CAP, bank_tries=1, banking_seconds=3600.0),
    )
    took = time.perf_counter() - t0
    after = vm_hwm_kib()
    box.destroy()
    record = report.record
    what = f"banked={record.banked} bytes={record.bytes} reason={record.reason!r}" if record else "no record"
    return {"hwm_before_kib": before, "hwm_after_kib": after, "seconds": took, "what": what}


def restore(work: Path) -> dict[str, object]:
    box = LocalSandbox()
    timeline = EventStoreTimeline(f"sqlite:///{work}/timeline.db")
    store = FilesystemBankStore(work / "banks")
    size = sum(o.bytes for o in store.objects("r") if o.name is not None)  # the one bank the teardown put
    before = vm_hwm_kib()
    t0 = time.perf_counter()
    if size <= CAP_BYTES:
        outcome = resume("r", ResumeRequest(), timeline=timeline, store=store, sandbox=box)
        what = f"resume: {outcome.restore}"
    else:
        from scratchbank.application.restore import restore_bank

        decision = check_resume(timeline, "r", ResumeRequest())
        what = (
            f"restore_bank(cap=4 GiB): {restore_bank('r', decision, store=store, sandbox=box, cap=BIG_CAP)}"
        )
    took = time.perf_counter() - t0
    after = vm_hwm_kib()
    box.destroy()
    return {"hwm_before_kib": before, "hwm_after_kib": after, "seconds": took, "what": what[:300]}


def host(tree: Path, work: Path) -> dict[str, object]:
    """The host side alone: ``tar cf`` of the tree into HostArchive, members capped at 2M not 200k."""
    import subprocess

    from scratchbank.application.bank_format.host_archive import HostArchive
    from scratchbank.application.bank_format.reader import Limits

    before = vm_hwm_kib()
    t0 = time.perf_counter()
    sink = HostArchive(
        work / "host.tgz", gzipped_input=False, gzip_level=1, cap=BIG_CAP, limits=Limits(members=2_000_000)
    )
    tar = subprocess.Popen(["tar", "cf", "-", "-C", str(tree), "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    while chunk := tar.stdout.read(1 << 20):
        sink.write(chunk)
    tar.wait()
    facts = sink.finish()
    what = f"refused={facts.refused!r} entries={facts.manifest.entries if facts.manifest else None}"
    return {
        "hwm_before_kib": before,
        "hwm_after_kib": vm_hwm_kib(),
        "seconds": time.perf_counter() - t0,
        "what": what,
    }


def main() -> None:
    mode, *paths = sys.argv[1:]
    if mode == "host":
        out = host(Path(paths[0]), Path(paths[1]))
    else:
        out = bank(Path(paths[0]), Path(paths[1])) if mode == "bank" else restore(Path(paths[0]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
