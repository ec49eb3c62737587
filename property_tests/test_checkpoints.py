"""Checkpoint stamps against a model engine (ADR 0013, issue 21): loops, fan-outs, rewinds,
lost ``node_finished`` events and lost teardowns.

The model engine runs a workflow the way the ADR's engine does: a node pass that writes
the scratch mints a new checkpoint id and adds that write to the live scratch; a teardown
banks the scratch stamped with the checkpoint the run stands at; a resume (possibly a
rewind to an earlier checkpoint of the lineage) asks the gate, then restores what it says.
The model knows the truth (which writes each scratch holds), so it can check:

- no resume restores a scratch missing a write the resumed checkpoint says happened;
- no resume is refused when the bank is exactly the checkpoint's scratch;
- a rewind to a checkpoint whose own bank retention keeps lands on that very scratch (K6);
- the prune after each teardown never deletes a bank retention keeps (K8), and no restore
  fetches an object the prune deleted.

The event-only reading (the same timeline, no stamps) is run beside the stamped one on
every resume, and what it gets wrong is counted (the note in ADR 0013).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchbank.domain import ResumeRequest, ScratchState, Verdict, decide_resume, fold
from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.objects import needed_objects
from scratchbank.domain.records import (
    NodeFinished,
    Record,
    RunResumed,
    RunRewound,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.resume_gate import ResumeDecision
from scratchbank.testing import strategies as s
from scratchbank.testing.builders import banked, node, restored, resumed, started

Gate = Callable[[ScratchState, Checkpoint], ResumeDecision]
#: what the prune after a teardown keeps (the real one: ``needed_objects``)
Keep = Callable[[ScratchState, int], frozenset[str | None]]
#: the model's retention: small, so that the sweep matters in short runs
RETAIN = 2
#: one model step: ("node", kind, lost) | ("teardown", how) | ("resume", rewind_back)
Op = tuple[object, ...]
KINDS = ("agent", "loop", "each", "human", "failed")


def stamped_gate(state: ScratchState, at: Checkpoint) -> ResumeDecision:
    return decide_resume(state, ResumeRequest(checkpoint=at, retain=RETAIN))


def newest_bank_gate(state: ScratchState, at: Checkpoint) -> ResumeDecision:
    """Planted bug "a rewind picking the newest bank": retention's history ignored."""
    return decide_resume(attrs.evolve(state, history=()), ResumeRequest(checkpoint=at, retain=RETAIN))


def current_only(state: ScratchState, retain: int) -> frozenset[str | None]:
    """Planted bug "retention deleting a kept bank": the prune keeps the current bank only."""
    return frozenset() if state.bank is None else frozenset({state.bank.record.object})


def event_only_gate(state: ScratchState, at: Checkpoint) -> ResumeDecision:
    """Today's reading (and the planted bug "the stamp ignored"): the events alone."""
    return decide_resume(state, ResumeRequest())


def _sha(content: frozenset[str]) -> str:
    return hashlib.sha256("\n".join(sorted(content)).encode()).hexdigest()


@attrs.define
class FoldOn:
    """``fold(timeline)`` for a timeline that only grows: its new records folded on from the
    state last returned (a fold is a loop over ``step``: the same state, without refolding)."""

    state: ScratchState = attrs.Factory(ScratchState)
    count: int = 0

    def of(self, timeline: Sequence[Record]) -> ScratchState:
        assert len(timeline) >= self.count
        self.state = fold(timeline[self.count :], start=self.state)
        self.count = len(timeline)
        return self.state


@attrs.define
class Model:
    """One run under the model engine; ``gate`` decides its resumes."""

    gate: Gate
    keep: Keep = needed_objects
    timeline: list[Record] = attrs.Factory(lambda: [started()])
    lineage: tuple[str, ...] = ("start",)
    scratch: frozenset[str] | None = frozenset()  # None: no live sandbox
    banks: dict[str, frozenset[str]] = attrs.Factory(dict)
    store: dict[str, frozenset[str]] = attrs.Factory(dict)  # the objects the prune left
    own: dict[tuple[str, ...], str] = attrs.Factory(dict)  # checkpoint -> its bank, newest last
    names: dict[str, tuple[str, bool]] = attrs.Factory(dict)  # write id -> (node, on a cycle)
    lost: frozenset[str] = frozenset()  # writes a go-on-without dropped (nobody's to restore)
    content_at: dict[tuple[str, ...], frozenset[str]] = attrs.Factory(dict)
    minted: int = 0
    over: bool = False
    counts: Counter[str] = attrs.Factory(Counter)
    violations: list[str] = attrs.Factory(list)
    folds: FoldOn = attrs.Factory(FoldOn)

    def run(self, ops: Sequence[Op]) -> Model:
        self.content_at[self.lineage] = frozenset()
        for op in ops:
            if self.over:
                break
            if op[0] == "node" and self.scratch is not None:
                self.node(str(op[1]), bool(op[2]))
            elif op[0] == "teardown" and self.scratch is not None:
                self.teardown(str(op[1]))
            elif op[0] == "resume" and self.scratch is None:
                self.resume(op[1] if isinstance(op[1], int) else 0)
        return self

    def node(self, kind: str, lost: bool) -> None:
        assert self.scratch is not None
        cycle = kind in ("loop", "each")
        writes = kind in ("agent", "loop", "each")
        name = kind if cycle else f"{kind}{self.minted}"
        record = NodeFinished(
            node=name,
            kind="human" if kind == "human" else "agent",
            succeeded=kind != "failed",
            in_sandbox=kind != "human",
            on_cycle=cycle,
        )
        if writes:
            self.minted += 1
            write = f"c{self.minted}"
            self.names[write] = (name, cycle)
            self.lineage = (*self.lineage, write)
            self.scratch = self.scratch | {write}
            self.content_at[self.lineage] = self.scratch
        if not lost:
            self.timeline.append(record)

    def teardown(self, how: str) -> None:
        """``ok`` banks; ``lost``: the sandbox died with its scratch, no bank, no record;
        ``unknown``: the sandbox was gone, recorded unknown (T19: an older bank decides)."""
        assert self.scratch is not None
        content, self.scratch = self.scratch, None
        if how == "lost":
            return
        stamp = Checkpoint(self.lineage)
        if how == "unknown":
            gone = ScratchBanked(
                banked=False, empty=False, unknown=True, bytes=0, reason="gone", checkpoint=stamp
            )
            self.timeline.append(gone)
            return
        self.own.pop(self.lineage, None)
        if not content:
            self.timeline.append(
                ScratchBanked(banked=False, empty=True, unknown=False, bytes=0, checkpoint=stamp)
            )
            self.prune()
            return
        sha = _sha(content)
        self.banks[sha] = self.store[sha] = content
        self.own[self.lineage] = sha
        record = ScratchBanked(
            banked=True, empty=False, unknown=False, bytes=1 + len(content),
            sha256=sha, object=f"banks/{sha}.tgz", checkpoint=stamp,
        )  # fmt: skip
        self.timeline.append(record)
        self.prune()

    def kept(self) -> dict[tuple[str, ...], str]:
        """The model's own retention: the newest RETAIN checkpoints it banked at."""
        return dict(list(self.own.items())[-RETAIN:])

    def prune(self) -> None:
        """The prune after a teardown's record (K8); then every kept bank must be stored."""
        needed = self.keep(self.folds.of(self.timeline), RETAIN)
        self.store = {sha: c for sha, c in self.store.items() if f"banks/{sha}.tgz" in needed}
        for lineage, sha in self.kept().items():
            if sha not in self.store:
                self.violations.append(f"deleted the kept bank of {lineage}")

    def resume(self, back: int) -> None:
        keep = max(1, len(self.lineage) - back)
        at = Checkpoint(self.lineage[:keep])
        dropped = self.lineage[keep:]
        if dropped:
            nodes = tuple(dict.fromkeys(self.names[w][0] for w in dropped))
            cycles = tuple(n for n in nodes if n in ("loop", "each"))
            self.timeline.append(RunRewound(dropped_nodes=nodes, on_cycle=cycles))
        self.timeline.append(RunResumed())
        state = self.folds.of(self.timeline)
        self.judge(state, at)
        decision = self.gate(state, at)
        self.counts[f"{decision.verdict.value} {decision.rule}"] += 1
        self.lineage = at.lineage
        own = self.kept().get(at.lineage)
        got = decision.bank.record.sha256 if decision.verdict is Verdict.RESTORE and decision.bank else None
        if own is not None and got != own:
            self.violations.append(f"a rewind to {at} did not land on its own scratch ({decision.rule})")
        if decision.verdict is Verdict.REFUSE:
            self.over = True
        elif decision.verdict is Verdict.RESTORE:
            assert decision.bank is not None and decision.bank.record.sha256 is not None
            content = self.banks[decision.bank.record.sha256]
            if decision.bank.record.sha256 not in self.store:
                self.violations.append(f"restored {at} from an object the prune deleted")
            self.check_restore(at, content)
            named = decision.bank.evidence.position
            restored = ScratchRestored(
                restored=True, stale=decision.stale, accepted=False, checkpoint=at, bank=named
            )
            self.timeline.append(restored)
            self.scratch = content
            self.content_at[self.lineage] = content
        else:
            self.lost = self.lost | set(self.lineage[1:])
            self.scratch = frozenset()
            self.content_at[self.lineage] = self.scratch

    def says_happened(self, at: Checkpoint) -> frozenset[str]:
        return frozenset(at.lineage[1:]) - self.lost

    def check_restore(self, at: Checkpoint, content: frozenset[str]) -> None:
        missing = self.says_happened(at) - content
        if missing:
            self.violations.append(f"restored a scratch missing {sorted(missing)} at {at}")

    def judge(self, state: ScratchState, at: Checkpoint) -> None:
        """Run the stamped and event-only readings on this resume; count their errors."""
        if state.bank is None or state.bank.record.sha256 is None:
            return
        bank = self.banks[state.bank.record.sha256]
        exact = bank == self.content_at.get(at.lineage)
        reverts = bool(self.says_happened(at) - bank)
        self.counts["resumes over a bank"] += 1
        for label, gate in (("stamped", stamped_gate), ("event-only", event_only_gate)):
            d = gate(state, at)
            if d.refused and exact:
                self.counts[f"{label}: refused an exact bank"] += 1
                if gate is self.gate:
                    self.violations.append(f"refused {at} whose bank is exactly its scratch ({d.rule})")
            if d.verdict is Verdict.RESTORE and reverts:
                self.counts[f"{label}: restored a bank missing a write"] += 1


def episodes(parts: Sequence[tuple[Sequence[tuple[str, bool]], str, int]]) -> list[Op]:
    """Each episode: node passes, the teardown that parks the run, its resume (a rewind)."""
    steps: list[Op] = []
    for nodes, how, back in parts:
        steps += [("node", kind, lost) for kind, lost in nodes]
        steps += [("teardown", how), ("resume", back)]
    return steps


ops = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from((False, False, True))), max_size=5),
        st.sampled_from(("ok", "ok", "lost", "unknown")),
        st.integers(0, 3),
    ),
    max_size=8,
).map(episodes)


@given(ops)
def test_N1_K1_no_resume_restores_a_scratch_missing_a_write_its_checkpoint_says_happened(
    steps: list[Op],
) -> None:
    """Whatever finishes or teardowns were lost, a restore holds every write of its checkpoint."""
    model = Model(stamped_gate).run(steps)
    assert not [v for v in model.violations if v.startswith("restored")], model.violations


@given(ops)
def test_N2_K3_no_resume_is_refused_when_the_bank_is_exactly_its_checkpoint_scratch(steps: list[Op]) -> None:
    """Rewinds across loops and fan-outs to the bank's own checkpoint are never refused."""
    model = Model(stamped_gate).run(steps)
    assert not [v for v in model.violations if v.startswith("refused")], model.violations


@given(s.timelines, s.requests, st.lists(st.text("abc", min_size=1, max_size=2), min_size=1, max_size=4))
def test_K5_an_unstamped_timeline_decides_exactly_as_before_whatever_the_request_says(
    timeline: list[Record], request: ResumeRequest, lineage: list[str]
) -> None:
    """No stamp on the bank: a request's checkpoint changes nothing in the decision."""
    state = fold(timeline)
    assert state.bank is None or state.bank.checkpoint is None
    stamped = attrs.evolve(request, checkpoint=Checkpoint(tuple(lineage)))
    assert decide_resume(state, stamped) == decide_resume(state, request)


def generated_runs(runs: int, seed: int = 21) -> list[list[Op]]:
    """Seeded runs for the measurement: up to 8 park/resume episodes of up to 6 passes;
    1 node finish in 10 lost; teardowns 8 in 10 banked, 1 lost, 1 unknown; half the
    resumes rewind 1-3 writing passes."""
    rng = random.Random(seed)
    out: list[list[Op]] = []
    for _ in range(runs):
        parts = [
            (
                [(rng.choice(KINDS), rng.random() < 0.1) for _ in range(rng.randint(0, 6))],
                rng.choice(("ok",) * 8 + ("lost", "unknown")),
                rng.choice((0, 0, 0, 1, 2, 3)),
            )
            for _ in range(rng.randint(1, 8))
        ]
        out.append(episodes(parts))
    return out


def measure(gate: Gate, runs: list[list[Op]], keep: Keep = needed_objects) -> tuple[Counter[str], int]:
    total: Counter[str] = Counter()
    wrong = 0
    for steps in runs:
        model = Model(gate, keep).run(steps)
        total.update(model.counts)
        wrong += len(model.violations)
    return total, wrong


#: Seeded runs of the ADR 0013 measurement: 2,000 in CI; 300 under the quick ``dev`` profile
#: (the pure tier), as many as the planted-bug checks below need to catch their bug.
GENERATED_RUNS = 2000 if settings.default.max_examples >= 300 else 300


def test_N1_N2_on_generated_runs_the_stamped_reading_is_never_wrong_where_events_are() -> None:
    """GENERATED_RUNS seeded runs (2,000 in CI): the stamped reading errs nowhere; the
    event-only one does (the note)."""
    counts, wrong = measure(stamped_gate, generated_runs(GENERATED_RUNS))
    print("\nADR 0013 measurement:", dict(sorted(counts.items())))  # shown with pytest -s
    assert wrong == 0
    assert counts["stamped: refused an exact bank"] == 0
    assert counts["stamped: restored a bank missing a write"] == 0
    assert counts["event-only: refused an exact bank"] > 0
    assert counts["event-only: restored a bank missing a write"] > 0


def test_planted_the_stamp_ignored_is_caught_by_the_model() -> None:
    """Planted bug: a gate that ignores the stamp reverts and refuses where the model says not."""
    _, wrong = measure(event_only_gate, generated_runs(300))
    assert wrong > 0


@given(ops)
def test_K6_K8_rewinds_land_on_their_own_scratch_and_no_kept_bank_is_deleted(steps: list[Op]) -> None:
    """A rewind to a checkpoint whose own bank is kept restores exactly it (K6); the prune
    after each teardown deletes no kept bank, and no restore misses its object (K8)."""
    model = Model(stamped_gate).run(steps)
    assert not [v for v in model.violations if "own scratch" in v or "deleted" in v], model.violations


def test_planted_a_rewind_picking_the_newest_bank_is_caught_by_the_model() -> None:
    """Planted bug: a gate blind to retention restores the newest bank on a rewind."""
    counts, wrong = measure(newest_bank_gate, generated_runs(150))
    assert wrong > 0 and counts["restore K6"] == 0


def test_planted_retention_deleting_a_kept_bank_is_caught_by_the_model() -> None:
    """Planted bug: a prune keeping the current bank only deletes the banks rewinds need."""
    _, wrong = measure(stamped_gate, generated_runs(150), keep=current_only)
    assert wrong > 0


# K9 (N2 without stamps): a model written from the rule, not from the fold. The truth is
# kept as sets of writes: the checkpoint a resume returns to holds the writes of its
# lineage (plus the in-flight fan-out branches the rewind lets finish); the bank holds
# what its teardown banked. The rule: restore when the bank holds every write the
# checkpoint holds, refuse when it lacks one (a kept pass or in-flight branch wrote after
# it). Timelines here lose no event (lost ones are N1's, which only stamps close).

#: one K9 step: ("pass", node) | ("teardown", "ok" | "unknown") | ("resume", back, keep_mask)
Step = tuple[object, ...]
K9_NODES = ("loop", "each", "a")
Replays = Callable[[RunRewound, str, "int | None"], "bool | None"]


@attrs.define
class ReplayModel:
    """A run of loop passes, fan-out branches and acyclic nodes, parked and rewound."""

    timeline: list[Record] = attrs.Factory(lambda: [started()])
    lineage: list[str] = attrs.Factory(list)  # write ids the run's checkpoint holds, in order
    writes: dict[str, tuple[str, int]] = attrs.Factory(dict)  # write id -> (node, pass)
    scratch: frozenset[str] | None = frozenset()  # None: parked
    bank: frozenset[str] | None = None
    minted: int = 0
    over: bool = False
    counts: Counter[str] = attrs.Factory(Counter)
    mismatches: list[str] = attrs.Factory(list)
    folds: FoldOn = attrs.Factory(FoldOn)

    def run(self, steps: Sequence[Step]) -> ReplayModel:
        for step in steps:
            if self.over:
                break
            if step[0] == "pass" and self.scratch is not None:
                self.write(str(step[1]))
            elif step[0] == "teardown" and self.scratch is not None:
                self.teardown(str(step[1]))
            elif step[0] == "resume" and self.scratch is None:
                back, mask = step[1], step[2]
                assert isinstance(back, int) and isinstance(mask, int)
                self.resume(back, mask)
        return self

    def write(self, kind: str) -> None:
        assert self.scratch is not None
        self.minted += 1
        name = f"a{self.minted}" if kind == "a" else kind
        # a pass's number: one more than the highest of its node's passes in the lineage
        number = 1 + max((p for w in self.lineage for n, p in [self.writes[w]] if n == name), default=0)
        write = f"w{self.minted}"
        self.writes[write] = (name, number)
        self.lineage.append(write)
        self.scratch = self.scratch | {write}
        self.timeline.append(attrs.evolve(node(name, on_cycle=kind != "a"), pass_=number))

    def teardown(self, how: str) -> None:
        assert self.scratch is not None
        content, self.scratch = self.scratch, None
        if how == "unknown" or not content:
            self.timeline.append(
                ScratchBanked(banked=False, empty=False, unknown=True, bytes=0, reason="gone")
            )
            return
        self.bank = content
        self.timeline.append(banked(sha256=_sha(content)))

    def resume(self, back: int, mask: int) -> None:
        keep = max(0, len(self.lineage) - back)
        dropped = self.lineage[keep:]
        # a dropped fan-out branch whose bit is set was in flight: the run lets it finish
        inflight = [w for i, w in enumerate(dropped) if self.writes[w][0] == "each" and mask >> i & 1]
        replayed = [w for w in dropped if w not in inflight]
        if replayed:
            nodes = tuple(dict.fromkeys(self.writes[w][0] for w in replayed))
            passes: dict[str, list[int]] = {}
            for w in replayed:
                name, number = self.writes[w]
                if name in ("loop", "each"):
                    passes.setdefault(name, []).append(number)
            cycles = tuple(n for n in nodes if n in ("loop", "each"))
            self.timeline.append(RunRewound(dropped_nodes=nodes, on_cycle=cycles, replayed=passes))
        self.lineage = self.lineage[:keep] + inflight
        self.timeline.append(resumed())
        if self.bank is None:
            self.scratch = frozenset(self.lineage)
            return
        holds_all = set(self.lineage) <= self.bank  # the rule
        decision = decide_resume(self.folds.of(self.timeline), ResumeRequest())
        self.counts[f"{decision.verdict.value} {decision.rule}"] += 1
        want = Verdict.RESTORE if holds_all else Verdict.REFUSE
        if decision.verdict is not want:
            self.mismatches.append(f"{decision.verdict.value} ({decision.rule}), the rule says {want.value}")
        if decision.verdict is Verdict.RESTORE:
            self.timeline.append(restored(stale=decision.stale))
            self.scratch = self.bank
        else:
            self.over = True


def k9_episodes(parts: Sequence[tuple[Sequence[str], str, int, int]]) -> list[Step]:
    """Each episode: passes, the teardown that parks the run, its resume (maybe a rewind)."""
    steps: list[Step] = []
    for passes, how, back, mask in parts:
        steps += [("pass", kind) for kind in passes]
        steps += [("teardown", how), ("resume", back, mask)]
    return steps


k9_steps = st.lists(
    st.tuples(
        st.lists(st.sampled_from(K9_NODES), max_size=4),
        st.sampled_from(("ok", "unknown")),
        st.integers(0, 4),
        st.integers(0, 15),
    ),
    max_size=6,
).map(k9_episodes)


@given(k9_steps)
def test_N2_K9_without_stamps_a_rewind_is_decided_exactly_as_the_model_of_the_rule_says(
    steps: list[Step],
) -> None:
    """Restored iff the bank holds every write the resumed checkpoint holds; refused otherwise."""
    model = ReplayModel().run(steps)
    assert not model.mismatches, model.mismatches


def k9_runs(runs: int, seed: int = 9) -> list[list[Step]]:
    """Seeded runs: 1-6 episodes of 0-5 passes, a teardown (5 in 6 banked), a resume rewinding 0-4."""
    rng = random.Random(seed)
    return [
        k9_episodes(
            [
                (
                    [rng.choice(K9_NODES) for _ in range(rng.randint(0, 5))],
                    rng.choice(("ok",) * 5 + ("unknown",)),
                    rng.choice((0, 1, 1, 2, 3, 4)),
                    rng.randint(0, 15),
                )
                for _ in range(rng.randint(1, 6))
            ]
        )
        for _ in range(runs)
    ]


def k9_measure(runs: list[list[Step]]) -> tuple[Counter[str], int]:
    total: Counter[str] = Counter()
    wrong = 0
    for steps in runs:
        model = ReplayModel().run(steps)
        total.update(model.counts)
        wrong += len(model.mismatches)
    return total, wrong


def test_N2_K9_on_seeded_runs_the_pass_reading_restores_what_the_shape_refused() -> None:
    """500 seeded runs: no mismatch with the rule; some rewinds restored K9 (refused by shape before)."""
    counts, wrong = k9_measure(k9_runs(500))
    print("\nK9 measurement:", dict(sorted(counts.items())))  # shown with pytest -s
    assert wrong == 0 and counts["restore K9"] > 0 and counts["refuse K9"] > 0


def test_planted_K9_refuse_by_shape_is_caught_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: the rewind's passes ignored (R6's shape decides): exact banks refused."""
    monkeypatch.setattr(RunRewound, "replays", lambda self, node, pass_: None)
    _, wrong = k9_measure(k9_runs(200))
    assert wrong > 0


def test_planted_K9_accepting_a_kept_pass_that_wrote_is_caught_by_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted bug: every pass of a node with named passes taken back: kept passes reverted."""

    def any_pass(self: RunRewound, node: str, pass_: int | None) -> bool | None:
        named = dict(self.replayed or ())
        return True if node in named and node in self.dropped_nodes else None

    monkeypatch.setattr(RunRewound, "replays", any_pass)
    _, wrong = k9_measure(k9_runs(200))
    assert wrong > 0
