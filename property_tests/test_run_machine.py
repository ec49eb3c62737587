"""A stateful audit: random park / resume / rewind / teardown sequences, fold vs a model.

The model is written the plain, imperative way: it tracks what it knows of the run's
scratch as the story unfolds (is there a bank, which in-sandbox writes came after
it, was a scratch lost unbanked, was it handed to a host directory). The domain only
ever sees the records the story writes. At every resume both must agree.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scratchbank.domain import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    Consents,
    RestoreAttempt,
    RestoreResult,
    ResumeRequest,
    Verdict,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.domain.kinds import SANDBOX_KINDS
from scratchbank.domain.records import NodeFinished, Record, RunResumed, RunRewound, RunStarted
from scratchbank.testing import strategies as s
from scratchbank.testing.builders import banked, empty, unbanked, unknown


class RunStory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.alive = False
        self.bank = False
        self.writes: list[tuple[str, bool | None]] = []  # (node, on_cycle) after the bank
        self.unbanked = False
        self.host_backed = False
        self.hold = False

    @initialize()
    def start(self) -> None:
        self.records.append(RunStarted())
        self.alive = True

    # -- while a sandbox runs --------------------------------------------------------

    @precondition(lambda self: self.alive)
    @rule(
        name=s.node_names,
        kind=st.sampled_from(sorted(SANDBOX_KINDS)) | s.kinds,
        ok=st.booleans(),
        answered=st.booleans(),
        on_cycle=s.maybe_bool,
    )
    def node_finishes(
        self, name: str, kind: str | None, ok: bool, answered: bool, on_cycle: bool | None
    ) -> None:
        in_sandbox = kind in SANDBOX_KINDS
        self.records.append(
            NodeFinished(
                node=name,
                kind=kind,
                succeeded=ok,
                answered=answered,
                in_sandbox=in_sandbox,
                on_cycle=on_cycle,
            )
        )
        if ok and not answered and in_sandbox and self.bank:
            self.writes.append((name, on_cycle))

    @precondition(lambda self: self.alive)
    @rule(outcome=st.sampled_from(["banked", "empty", "unknown", "unbanked"]))
    def sandbox_torn_down(self, outcome: str) -> None:
        self.alive = False
        if self.hold:
            return  # X3: a failed restore holds the bank; this sandbox banks nothing
        self.records.append(
            {"banked": banked, "empty": empty, "unknown": unknown, "unbanked": unbanked}[outcome]()
        )
        if outcome == "banked":
            self.bank, self.writes, self.unbanked, self.host_backed = True, [], False, False
        elif outcome == "empty":
            self.bank, self.writes, self.unbanked, self.host_backed = False, [], False, False
        elif outcome == "unbanked":
            self.unbanked, self.host_backed = True, False

    @precondition(lambda self: self.alive)
    @rule()
    def sandbox_lost_without_teardown(self) -> None:
        self.alive = False

    # -- while parked ----------------------------------------------------------------

    @precondition(lambda self: not self.alive)
    @rule(
        dropped=st.lists(s.node_names, unique=True, min_size=1, max_size=3),
        said=st.none() | st.lists(s.node_names, unique=True, max_size=2),
    )
    def rewind(self, dropped: list[str], said: list[str] | None) -> None:
        self.records.append(
            RunRewound(dropped_nodes=tuple(dropped), on_cycle=None if said is None else tuple(said))
        )

        def on_cycle(node: str, recorded: bool | None) -> bool:
            if said is not None:
                return node in said
            return recorded is not False

        self.writes = [(n, c) for n, c in self.writes if n not in dropped or on_cycle(n, c)]

    @precondition(lambda self: not self.alive)
    @rule(
        accept=st.booleans(),
        force=st.booleans(),
        changed=st.booleans(),
        result=st.sampled_from([RestoreResult.RESTORED] * 6 + list(RestoreResult)),
        into_host=st.booleans(),
    )
    def resume(
        self, accept: bool, force: bool, changed: bool, result: RestoreResult, into_host: bool
    ) -> None:
        consents = Consents(force=force, accept_scratch_loss=accept)
        decision = decide_resume(fold(self.records), ResumeRequest(consents, source_changed=changed))
        scratch_problem = self.unbanked or (self.bank and bool(self.writes))
        if scratch_problem and not accept:
            assert decision.code == SCRATCH_NOT_PORTABLE, decision
            return
        if changed and not force:
            assert decision.code == RESUME_INVALID, decision
            return
        assert not decision.refused, decision
        self.records.append(RunResumed(force=force, accept_scratch_loss=accept))
        self.records.extend(decision.records)
        self.alive, self.hold = True, False
        if self.unbanked:
            assert decision.verdict is Verdict.GO_ON_WITHOUT, decision
            self.unbanked, self.bank, self.writes = False, False, []
            return
        if not self.bank:
            assert decision.verdict is Verdict.GO_ON_WITHOUT, decision
            return
        assert decision.verdict is Verdict.RESTORE, decision
        assert decision.stale == bool(self.writes)
        self._restore(decision, RestoreAttempt(result, bytes=10, into_host_dir=into_host))

    def _restore(self, decision: object, attempt: RestoreAttempt) -> None:
        out = after_restore(decision, attempt)  # type: ignore[arg-type]
        self.records.append(out.record)
        if out.proceed and attempt.result is RestoreResult.RESTORED:
            self.writes = []
            if attempt.into_host_dir:
                self.bank, self.host_backed = False, True
        elif out.proceed:  # X4 with the loss accepted: the bank is forsaken
            self.bank, self.writes = False, []
        else:  # parked: the failed sandbox's teardown banks nothing over the bank
            self.hold, self.alive = True, False

    @invariant()
    def fold_agrees_on_what_a_resume_would_restore(self) -> None:
        state = fold(self.records)
        assert (state.bank is not None) == self.bank
        assert [w.node for w in state.stale_writes] == [n for n, _ in self.writes]
        assert (state.unbanked is not None) == self.unbanked
        assert (state.host_backed is not None) == self.host_backed


TestRunStory = RunStory.TestCase
