"""The main job on the embedded default: a runner over an in-process queue and lease,
local sandboxes (a PID namespace each), a SQLite timeline, banks on disk.

Scenario 1: an operator queues a run; the runner claims it, starts a sandbox, the
reference engine's nodes write the scratch and the run parks at a human gate; the
teardown quiesces, archives and banks it. The operator resumes it: the surface judges
and publishes, the runner claims, starts a new sandbox, restores, and the run goes on.
Scenario 2: a node finishes after the bank and its sandbox is lost without a
teardown: the engine refuses the resume SCRATCH_NOT_PORTABLE (R2), the operator hears
it (R11) and the run's log holds it (R12); with --accept-scratch-loss it goes on on the
bank as it was (R7). Scenario 3: a subbot's child that can park is refused adoption
into a container-local scratch (S1); one that cannot is adopted after its record (S5)
and, parked anyway, resumes alone only with the loss accepted (S2, S4).
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import attrs

from scratchbank.application.ports import EngineEnd, Sandbox, Timeline
from scratchbank.application.resume import resume
from scratchbank.application.runner import Runner, RunnerSettings, Verdicts
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import checkpoint_of
from scratchbank.domain.lease import LeaseTiming
from scratchbank.domain.records import NodeFinished, ResumeRefused, RunResumed, RunStarted, ScratchBanked
from scratchbank.domain.resume_gate import ResumeRequest

from .event_store import EventStoreTimeline
from .fs_bank import FilesystemBankStore
from .inprocess import InProcessLease, InProcessQueue
from .memory import InMemoryBankStore
from .present import decision_text, human_bytes
from .reference_engine import Node, ReferenceEngine
from .sandbox_provider import LocalSandboxProvider

WORKFLOW = (
    Node("clone", "tool", "mkdir -p clone && echo 'a clone' > clone/README.md && echo 'exit 0' > verify.sh"),
    Node("review", "human"),
    Node("measure", "agent", "test -f clone/README.md && echo measured > measure.txt"),
    Node("approve", "human"),
    Node(
        "fix",
        "subbot",
        children=(Node("patch", "tool", "echo patched > patch.txt"), Node("cap", "tool", "false")),
    ),
    Node("ask", "subbot", children=(Node("gate", "human"),)),
)
ACCEPT = Consents(accept_scratch_loss=True)


def say(text: str) -> None:
    print(text, flush=True)


def tree(sandbox: Sandbox) -> str:
    root = Path(sandbox.facts.scratch)
    if not root.exists():
        return "(no scratch)"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return ", ".join(files) or "(empty)"


@attrs.define
class TellingEngine:
    """The reference engine, saying what each new sandbox holds when the run goes on."""

    inner: ReferenceEngine
    sandboxes: int = 0

    def continue_run(
        self, run_id: str, *, sandbox: Sandbox, timeline: Timeline, cancel: threading.Event
    ) -> EngineEnd:
        self.sandboxes += 1
        say(f"   sandbox {self.sandboxes} started: {sandbox.facts.isolation}")
        say(f"   sandbox {self.sandboxes} now holds: {tree(sandbox)}")
        end = self.inner.continue_run(run_id, sandbox=sandbox, timeline=timeline, cancel=cancel)
        say(f"   the engine: {end.value}; sandbox {self.sandboxes} holds: {tree(sandbox)}")
        return end


@attrs.define
class Demo:
    timeline: EventStoreTimeline
    queue: InProcessQueue
    verdicts: Verdicts

    def resume(self, run: str, attempt: str, consents: Consents = Consents()) -> None:
        """The operator's resume (CLI or HTTP): the surface judges, publishes, hears the engine."""
        service = ScratchService(
            self.timeline, InMemoryBankStore(), queue=self.queue, verdicts=self.verdicts, verdict_wait=120
        )
        queued = service.queue_resume(run, ResumeRequest(consents=consents), attempt=attempt)
        if queued.attempt is None:
            say("   the surface refuses:")
            for line in decision_text(queued.decision):
                say("     " + line)
            return
        heard = queued.decision if queued.heard else None
        say(f"   {attempt}: published; the engine's verdict (R11):")
        for line in decision_text(heard) if heard is not None else ["(none heard)"]:
            say("     " + line)
        self.settle()

    def settle(self) -> None:
        deadline = time.monotonic() + 300
        while self.queue.pending() and time.monotonic() < deadline:
            time.sleep(0.05)

    def last(self, run: str, kind: type[ScratchBanked] | type[ResumeRefused]) -> str:
        found = [r for r in self.timeline.read(run) if isinstance(r, kind)]
        if not found:
            return "(none)"
        r = found[-1]
        if isinstance(r, ScratchBanked):
            return f"banked={r.banked} {human_bytes(r.bytes)}, quiesced={not r.unquiesced}"
        return f"{r.code} ({r.rule}): {r.hint}"


def run_demo() -> int:
    base = Path(tempfile.mkdtemp(prefix="scratchbank-demo-"))
    timeline = EventStoreTimeline(f"sqlite:///{base}/timeline.db")
    queue, verdicts = InProcessQueue(), Verdicts()
    engine = TellingEngine(ReferenceEngine(WORKFLOW, timeline))
    settings = RunnerSettings("runner-1", timing=LeaseTiming(interval=1.0, lapse=10.0))
    runner = Runner(
        queue,
        InProcessLease(lapse=10.0),
        timeline,
        FilesystemBankStore(base / "banks"),
        LocalSandboxProvider(base / "sandboxes"),
        engine,
        settings,
        verdicts,
    )
    stop = threading.Event()
    serving = threading.Thread(target=runner.serve, args=(stop, 0.1), name="runner", daemon=True)
    serving.start()
    demo = Demo(timeline, queue, verdicts)
    say(f"embedded default: in-process queue and lease, SQLite timeline and file banks under {base}")
    say(f"runs in this story: {', '.join(RUNS)}\n")
    try:
        _story(demo, engine)
        _rewind(timeline, FilesystemBankStore(base / "banks"), LocalSandboxProvider(base / "sandboxes"))
    finally:
        stop.set()
        serving.join(timeout=30)
        timeline.close()
    say("\n== inspect each run afterwards (the same service, from the command line):")
    for run, what in RUNS.items():
        say(f"   scratchbank --home {base} status {run}     # {what}")
    say("   scratchbank rules S2                                  # what a rule id means")
    return 0


def _rewind(timeline: Timeline, store: FilesystemBankStore, sandboxes: LocalSandboxProvider) -> None:
    """ADR 0013, K6: a rewind gets the scratch of the checkpoint it returns to, not the newest."""
    say("\n== 4. run-2 banks at checkpoints c1 and c2, then the engine rewinds it to c1")
    timeline.append("run-2", [RunStarted()])
    c1, c2 = checkpoint_of(("start", "c1")), checkpoint_of(("start", "c1", "c2"))
    for at, draft in ((c1, "draft 1"), (c2, "draft 2")):
        box = sandboxes.start("run-2")
        Path(box.facts.scratch).mkdir(parents=True, exist_ok=True)
        (Path(box.facts.scratch) / "notes.txt").write_text(draft + "\n")
        bank_at_teardown(
            "run-2", timeline=timeline, store=store, sandbox=box, run_finished=False, checkpoint=at
        )
        sandboxes.stop(box)
        timeline.append("run-2", [RunResumed()])
        say(f"   teardown at {at.id}: the scratch says {draft!r}")
    box = sandboxes.start("run-2")
    out = resume("run-2", ResumeRequest(checkpoint=c1), timeline=timeline, store=store, sandbox=box)
    for line in decision_text(out.decision):
        say("     " + line)
    notes = (Path(box.facts.scratch) / "notes.txt").read_text().strip()
    say(f"   the resumed sandbox's scratch says {notes!r} (the bank of c1, kept by retention)")
    sandboxes.stop(box)


RUNS = {
    "run-1": "the main run",
    "run-1.fix": "its subbot child that cannot ask a human",
    "run-1.ask": "its subbot child that can (never let in)",
    "run-2": "a rewind that gets its checkpoint's own scratch back (K6)",
}


def _story(demo: Demo, engine: TellingEngine) -> None:
    say("== 1. run-1 is queued, writes its scratch, parks at a gate; resumed on a new sandbox")
    say("   (the scratch is a run's working folder outside what is judged; it lives only in the")
    say("   sandbox, so it is banked when the sandbox stops and restored into the next one)")
    demo.timeline.append("run-1", [RunStarted()])
    demo.resume("run-1", "a1")
    say(f"   teardown: {demo.last('run-1', ScratchBanked)}; sandbox {engine.sandboxes} destroyed")
    demo.resume("run-1", "a2")
    say(f"   teardown: {demo.last('run-1', ScratchBanked)} (parked at 'approve')\n")

    say("== 2. run-1: a node finishes after the bank, then its sandbox is lost without a teardown")
    say("   (restoring the bank now would undo what that node wrote: the resume is refused, R2)")
    late = NodeFinished(node="late", kind="agent", succeeded=True, in_sandbox=True, on_cycle=False)
    demo.timeline.append("run-1", [RunResumed(attempt="a3"), late])
    say("   (a runner elsewhere resumed it as a3, node 'late' finished, then that machine was lost)")
    say("   the surface leaves the check to the engine (R10: that execution wrote no teardown)")
    demo.resume("run-1", "a4")
    say(f"   no sandbox was started; the run's log (R12): {demo.last('run-1', ResumeRefused)}")
    say("   resume with --accept-scratch-loss (the bank as it was, before 'late'):")
    demo.resume("run-1", "a5", ACCEPT)
    say("")

    say("== 3. run-1's subbot children: run-1.fix and run-1.ask work in the parent's sandbox")
    say("   (a child that may stop to ask a human is not let into a scratch that lives only in the")
    say("   parent's container: parked alone it would lose it, S1; one that cannot ask is let in")
    say("   once that is recorded, S5; if it parks anyway its own resume is refused, S2, until the")
    say("   loss of what it wrote there is accepted, S4)")
    shared = [r for r in demo.timeline.read("run-1.fix") if r.WIRE == "sandbox_shared"]
    asked = [r for r in demo.timeline.read("run-1.ask") if r.WIRE == "sandbox_shared"]
    say(f"   'fix' adopted after its record ({len(shared)} sandbox_shared, S5); 'ask' (a human gate)")
    say(f"   refused adoption into the container-local scratch (S1): {len(asked)} records, never ran there")
    say("   'fix' stopped at its failed node 'cap'; its own resume:")
    demo.resume("run-1.fix", "c1")
    say("   with --accept-scratch-loss (forsaken, S4):")
    demo.resume("run-1.fix", "c2", ACCEPT)
    forsaken = [r for r in demo.timeline.read("run-1.fix") if r.WIRE == "scratch_forsaken"]
    say(f"   scratch_forsaken records: {len(forsaken)}")
