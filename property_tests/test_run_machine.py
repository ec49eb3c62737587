"""A stateful audit: random park / resume / rewind / teardown sequences, fold vs a model.

The model is written the plain, imperative way: it tracks what it knows of the run's
scratch as the story unfolds (is there a bank, which in-sandbox writes came after
it, was a scratch lost unbanked, was it handed to a host directory). The domain only
ever sees the records the story writes. At every resume both must agree.

Restore outcomes come from the model too, read from RULES.md X1-X7 (and A13 for the
teardown records): the story writes the record the model says a restore writes, and
checks that ``after_restore`` says the same; the code under test is never the oracle.
"""

from __future__ import annotations

import attrs
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
from scratchbank.domain.fold import ScratchState
from scratchbank.domain.kinds import SANDBOX_KINDS
from scratchbank.domain.records import (
    NodeFinished,
    Record,
    RunResumed,
    RunRewound,
    RunStarted,
    ScratchRestored,
)
from scratchbank.testing import strategies as s
from scratchbank.testing.builders import banked, empty, unbanked, unknown


class RunStory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.state = ScratchState()  # fold(self.records[: self.folded]), folded on as they grow
        self.folded = 0
        self.alive = False
        self.bank = False
        self.writes: list[tuple[str, bool | None]] = []  # (node, on_cycle) after the bank
        self.unbanked = False
        self.host_backed = False
        self.hold = False
        self.accept = False

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
        elif outcome == "unbanked":  # A13: it replaces any older bank (R1 reads the last teardown)
            self.bank, self.writes, self.unbanked, self.host_backed = False, [], True, False
        else:  # unknown: an earlier bank still decides (T19); an unbanked one no more (A13)
            self.unbanked = False

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
        decision = decide_resume(self._fold(), ResumeRequest(consents, source_changed=changed))
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
        self.accept = accept
        self._restore(decision, RestoreAttempt(result, bytes=10, into_host_dir=into_host))

    def _restore(self, decision: object, attempt: RestoreAttempt) -> None:
        expected = restore_per_rules(attempt.result, attempt.into_host_dir, self.writes != [], self.accept)
        out = after_restore(decision, attempt)  # type: ignore[arg-type]
        got = (out.record.restored, out.record.accepted, out.record.host_backed, out.record.stale)
        assert got == expected.record, (attempt, out)
        assert (out.proceed, out.hold, out.must_record) == (expected.proceed, expected.hold, expected.must)
        assert (out.park.code if out.park else "no park") == expected.park, out
        self.records.append(
            ScratchRestored(
                restored=expected.record[0],
                accepted=expected.record[1],
                host_backed=expected.record[2],
                stale=expected.record[3],
                bytes=10 if expected.record[0] else 0,
                reason="" if expected.record[0] else attempt.result.value,
            )
        )
        if expected.proceed and expected.record[0]:
            self.writes = []
            if attempt.into_host_dir:
                self.bank, self.host_backed = False, True
        elif expected.proceed:  # X4 with the loss accepted: the bank is forsaken
            self.bank, self.writes = False, []
        else:  # parked: the failed sandbox's teardown banks nothing over the bank
            self.hold, self.alive = True, False

    def _fold(self) -> ScratchState:
        """The fold of every record so far: the new ones folded on from the last state (a fold
        is a loop over ``step``; ``teardown`` checks it against a fold from the start)."""
        self.state = fold(self.records[self.folded :], start=self.state)
        self.folded = len(self.records)
        return self.state

    @invariant()
    def fold_agrees_on_what_a_resume_would_restore(self) -> None:
        state = self._fold()
        assert (state.bank is not None) == self.bank
        assert [w.node for w in state.stale_writes] == [n for n, _ in self.writes]
        assert (state.unbanked is not None) == self.unbanked
        assert (state.host_backed is not None) == self.host_backed

    def teardown(self) -> None:
        assert fold(self.records) == self._fold()  # the story's last fold, folded from the start


@attrs.frozen
class Expected:
    """What RULES.md says a restore attempt leads to."""

    record: tuple[bool, bool, bool, bool]  # restored, accepted, host_backed, stale
    proceed: bool
    hold: bool
    must: bool
    park: str | None


#: X4: the bank is gone or does not extract (host or sandbox), or there is no sandbox.
X4_LOSSES = {"gone", "refused_on_host", "refused_in_sandbox", "no_sandbox"}


def restore_per_rules(result: RestoreResult, into_host: bool, stale: bool, accepted: bool) -> Expected:
    """X1-X7, read from RULES.md (the names of the results are the enum's only input)."""
    if result.value == "restored":
        # X1 / X6; X7: the host_backed and a stale bank's records are written within budget
        return Expected((True, accepted, into_host, stale), True, False, into_host or stale, "no park")
    if result.value in X4_LOSSES and accepted:
        # X4: accepting the loss goes on without the bank
        return Expected((False, True, False, stale), True, False, False, "no park")
    if result.value in X4_LOSSES:
        # X4 parks SCRATCH_NOT_PORTABLE; X3 every failure holds the bank
        return Expected((False, False, False, stale), False, True, False, SCRATCH_NOT_PORTABLE)
    # X5: a read that fails on the way parks without a code; no consent skips it; X3 holds
    return Expected((False, False, False, stale), False, True, False, None)


TestRunStory = RunStory.TestCase
