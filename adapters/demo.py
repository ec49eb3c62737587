"""The main job on the embedded default: a local sandbox, a SQLite timeline, banks on disk.

Scenario 1: a run writes its scratch, parks, its sandbox is torn down and banked, and a
new sandbox resumes it with the scratch restored. Scenario 2: a node finishes after
the bank (its sandbox was lost without a teardown); the resume is refused with the
hint, then accepted with the consent.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain.consent import Consents
from scratchbank.domain.records import NodeFinished, RunStarted
from scratchbank.domain.resume_gate import ResumeRequest

from .event_store import EventStoreTimeline
from .fs_bank import FilesystemBankStore
from .local_sandbox import LocalSandbox
from .present import outcome_text


def say(text: str) -> None:
    print(text, flush=True)


def _tree(sandbox: LocalSandbox) -> str:
    root = Path(sandbox.facts.scratch)
    if not root.exists():
        return "(no scratch)"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return ", ".join(files) or "(empty)"


def run_demo() -> int:
    base = Path(tempfile.mkdtemp(prefix="scratchbank-demo-"))
    timeline = EventStoreTimeline(f"sqlite:///{base}/timeline.db")
    store = FilesystemBankStore(base / "banks")
    say(f"embedded default: SQLite timeline and file banks under {base}\n")

    say("== 1. a run writes its scratch, parks, and resumes on a new sandbox")
    first = LocalSandbox(base / "sandbox-1")
    say(f"   sandbox 1: {first.facts.isolation}")
    scratch = Path(first.facts.scratch)
    (scratch / "clone").mkdir(parents=True)
    (scratch / "verify.sh").write_text("#!/bin/sh\nexit 0\n")
    (scratch / "clone" / "README.md").write_text("a source clone an agent made\n")
    timeline.append(
        "run-1",
        [
            RunStarted(),
            NodeFinished(node="clone", kind="tool", succeeded=True, in_sandbox=True, on_cycle=False),
        ],
    )
    say(f"   node 'clone' wrote: {_tree(first)}")
    report = bank_at_teardown("run-1", timeline=timeline, store=store, sandbox=first, run_finished=False)
    first.destroy()
    rec = report.record
    assert rec is not None
    say(
        f"   teardown: banked={rec.banked} {rec.bytes} bytes, quiesced={not rec.unquiesced}, "
        f"sha256 {str(rec.sha256)[:12]}..; sandbox 1 destroyed"
    )
    second = LocalSandbox(base / "sandbox-2")
    say(f"   sandbox 2 starts with: {_tree(second)}")
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=second)
    for line in outcome_text(out):
        say("   " + line)
    say(f"   sandbox 2 now holds: {_tree(second)}\n")

    say("== 2. a node finishes after the bank, then the sandbox is lost without a teardown")
    timeline.append(
        "run-1", [NodeFinished(node="measure", kind="agent", succeeded=True, in_sandbox=True, on_cycle=False)]
    )
    second.destroy()
    third = LocalSandbox(base / "sandbox-3")
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=third)
    say("   resume without consent:")
    for line in outcome_text(out):
        say("     " + line)
    say(f"   sandbox 3 holds: {_tree(third)} (nothing moved)")
    accept = ResumeRequest(consents=Consents(accept_scratch_loss=True))
    out = resume("run-1", accept, timeline=timeline, store=store, sandbox=third)
    say("   resume with --accept-scratch-loss:")
    for line in outcome_text(out):
        say("     " + line)
    say(f"   sandbox 3 now holds: {_tree(third)} (the bank, as it was before 'measure')")
    third.destroy()
    timeline.close()
    return 0
