"""Rules A: readings this project chose where the design is open. The pure tier's tests of A1, A2, A3,
A4, A5, A6, A7, A10, A12, A13, A14, A18 (tests/tiers.py: a file of tests/rules/ has its tier in its
name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from rigs.checkpoint_stamps import C1, C2, checkpoints_run, loop, rewind_replaying, stamped
from rigs.resume_decisions import ACCEPT, FORCE, decide, kinds
from rigs.teardown_world import FILES, FakeClock

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import (
    RESUME_INVALID,
    CauseKind,
    ResumeRequest,
    Seen,
    TryOutcome,
    Verdict,
    Where,
    decide_resume,
    fold,
    merge_try,
)
from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.objects import BankStamp, Listing, StoredObject, listed_now, object_name, over_bound
from scratchbank.domain.records import RunRewound, ScratchRestored
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import (
    banked,
    node,
    restored,
    resumed,
    shared,
    started,
    unbanked,
    unknown,
    went_on_without,
)

# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


def test_A2_K_a_restore_naming_its_checkpoint_restamps_the_bank() -> None:
    """A stale bank restored at c2 with loss accepted is c2's scratch from then on.
    Proves ``scratchbank.domain.decide_resume``."""
    restored = ScratchRestored(restored=True, stale=True, accepted=True, checkpoint=C2)
    state = fold([started(), stamped(C1), resumed(), restored])
    assert state.bank is not None and state.bank.checkpoint == C2
    assert decide_resume(state, ResumeRequest(checkpoint=C2)).rule == "K3"


def test_A2_K5_a_stale_restore_naming_no_checkpoint_drops_the_stamp() -> None:
    """Restored stale without a checkpoint: the events decide from then on; exact keeps it.
    Proves ``scratchbank.domain.fold``."""
    stale = ScratchRestored(restored=True, stale=True, accepted=True)
    assert fold([started(), stamped(C1), resumed(), stale]).bank.checkpoint is None  # type: ignore[union-attr]
    exact = ScratchRestored(restored=True, stale=False, accepted=False)
    assert fold([started(), stamped(C1), resumed(), exact]).bank.checkpoint == C1  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [[], [""], ["start", 3], "start", 7, {"id": "c1"}])
def test_A6_K_an_ill_typed_checkpoint_makes_the_timeline_unreadable(bad: object) -> None:
    """A checkpoint that is not a non-empty list of non-empty ids is unreadable, never None.
    Proves ``scratchbank.domain.wire.decode``."""
    with pytest.raises(TimelineUnreadable, match="checkpoint"):
        decode({**encode(banked()), "checkpoint": bad}, position=3)


def test_A3_K8_a_rewind_to_before_an_accepted_loss_restores_no_older_bank() -> None:
    """An accepted loss is final: a rewind to c1 afterwards goes on without, none restored.
    Proves ``scratchbank.domain.decide_resume``."""
    from scratchbank.domain.objects import needed_objects

    loss = ScratchRestored(restored=False, stale=False, accepted=True, reason="bank gone")
    state = fold([*checkpoints_run(), loss, resumed()])
    decision = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.GO_ON_WITHOUT and decision.rule == "R7"
    assert state.history == () and needed_objects(state) == frozenset()


def test_A6_K9_passes_on_the_wire_round_trip_and_old_versions_read_without_them() -> None:
    """v2 finishes and rewinds carry passes; v1 reads through identity upcasters; bad passes are unreadable.
    Proves ``scratchbank.domain.wire.decode``."""
    rewind = rewind_replaying(loop=[3, 2])
    wire = encode(rewind)
    assert wire["v"] == 2 and wire["_replayed_passes"] == {"loop": [2, 3]}
    assert decode(wire) == rewind and decode(encode(loop(2))) == loop(2)
    assert encode(loop(2))["_pass"] == 2
    old = decode({"type": "run_rewound", "v": 1, "dropped_nodes": ["loop"]})
    assert isinstance(old, RunRewound) and old.replayed is None
    assert decode({"type": "node_finished", "v": 1, "node": "a", "succeeded": True}) == attrs.evolve(
        node("a", kind=None, on_cycle=None)
    )
    finish = {"type": "node_finished", "v": 2, "node": "a", "succeeded": True}
    rewound_ = {"type": "run_rewound", "v": 2, "dropped_nodes": ["loop"]}
    for bad in (
        {**finish, "_pass": 0},
        {**finish, "_pass": "2"},
        {**finish, "_pass": True},
        {**rewound_, "_replayed_passes": ["loop"]},
        {**rewound_, "_replayed_passes": {"loop": []}},
        {**rewound_, "_replayed_passes": {"loop": [0]}},
        {**rewound_, "_replayed_passes": {"loop": ["1"]}},
        {**rewound_, "_replayed_passes": {"loop": [True]}},
        {**rewound_, "_replayed_passes": {"other": [1]}},
        {**finish, "v": 3},
    ):
        with pytest.raises(TimelineUnreadable):
            decode(bad)


# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_A4_changed_source_without_scratch_loss_is_resume_invalid() -> None:
    """Changed source without scratch loss is resume invalid: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), source_changed=True)
    assert d.code == RESUME_INVALID
    assert d.rule == "R8"
    assert decide(started(), banked(), source_changed=True, consents=FORCE).verdict is Verdict.RESTORE


def test_A1_first_execution_without_a_teardown_record_may_still_be_banking() -> None:
    """First execution without a teardown record may still be banking:
    ``scratchbank.domain.decide_resume``."""
    assert decide(started(), node("a"), where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE
    assert decide(started(), node("a")).verdict is Verdict.GO_ON_WITHOUT


def test_A5_copy_based_parent_not_container_local_needs_force_only() -> None:
    """Copy based parent not container local needs force only: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), shared(container_local=False, copy_based=True))
    assert d.code == RESUME_INVALID
    assert d.rule == "A5"


def test_A3_accepted_loss_is_final_for_the_record_it_accepted() -> None:
    """After accepting an unbanked loss, the older bank is not restored over the run.
    Proves ``scratchbank.domain.decide_resume``."""
    records = (started(), banked(), resumed(), restored(), node("a"), unbanked())
    records += (resumed(accept_scratch_loss=True), went_on_without("tar failed"))
    d = decide(*records)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "R7"


def test_A10_several_causes_are_named_in_one_refusal() -> None:
    """Several causes are named in one refusal: ``scratchbank.domain.decide_resume``."""
    records = (started(), shared(copy_based=True), banked(), node("a"))
    d = decide(*records, source_changed=True)
    assert set(kinds(d)) == {
        CauseKind.LONE_CHILD,
        CauseKind.SCRATCH_STALE,
        CauseKind.SOURCE_CHANGED,
        CauseKind.COPY_BASED_DIVERGENCE,
    }


def test_A12_consent_counts_without_an_earlier_refusal() -> None:
    """Consent counts without an earlier refusal: ``scratchbank.domain.decide_resume``."""
    assert decide(started(), unbanked(), consents=ACCEPT).verdict is Verdict.GO_ON_WITHOUT


def test_A13_an_unknown_record_after_an_unbanked_one_is_not_refused() -> None:
    """R14 reads the latest unknown record as 'not refused', exactly as after no record.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), node("a"), unbanked("tar failed"), resumed(), unknown())
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "R14"
    assert d.code is None and not d.records  # nothing forsaken, nothing to accept


def test_A13_an_unbanked_record_replaces_an_older_bank() -> None:
    """R1 reads the last teardown: the older bank is no longer the run's scratch.
    Proves ``scratchbank.domain.decide_resume``."""
    state = fold([started(), banked(), resumed(), node("a"), unbanked("over the cap")])
    assert state.bank is None and state.unbanked is not None
    d = decide(started(), banked(), resumed(), node("a"), unbanked(), consents=ACCEPT)
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "R13"
    # ...and an unknown record after it does not bring the older bank back either
    d = decide(started(), banked(), resumed(), unbanked(), resumed(), unknown())
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.bank is None


def test_A14_a_host_backed_restore_ends_the_may_still_be_banking_window() -> None:
    """The latest execution restored into a host directory: it will never bank (X6).
    Proves ``scratchbank.domain.decide_resume``."""
    records = (started(), banked(), resumed(), restored(host_backed=True))
    assert not fold(records).may_still_be_banking
    d = decide(*records, where=Where.SURFACE)
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "X6"
    # a later execution opens the window again
    assert fold([*records, resumed()]).may_still_be_banking
    assert decide(*records, resumed(), where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE


# ---- from tests/rules/test_[ATX]*.py: Teardown decisions, rule by rule (T1, T4-T6, T9, T11, T13, T16, T19, T20, X3, A7).


def test_A7_a_try_that_knows_less_stops_the_tries() -> None:
    """A try that knows less stops the tries: ``scratchbank.domain.merge_try``."""
    merged = merge_try(TryOutcome(Seen.FILES, None, reason="tar failed"), TryOutcome(Seen.EMPTY))
    assert merged.stop and merged.rule == "A7" and merged.best.seen is Seen.FILES


# ---- from tests/test_teardown_use_case.py: The teardown banking use case under faults, with fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost.


def test_A18_a_timeline_unreadable_for_the_whole_record_budget_writes_nothing_blind() -> None:
    """Unnamed and never readable, the teardown cannot tell which execution it banks: it
    retries its first read within the record budget, then stores and records nothing (A18).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""

    class Unreadable(InMemoryTimeline):
        def read(self, run_id: str):  # type: ignore[no-untyped-def]
            from scratchbank.domain.errors import TimelineUnreadable

            raise TimelineUnreadable("down")

    timeline, store, clock = Unreadable(), InMemoryBankStore(), FakeClock()
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    assert store.only("run-1") is None and not report.recorded
    assert InMemoryTimeline.read(timeline, "run-1") == ()  # nothing written blind
    assert "cannot tell which execution it banks" in report.superseded
    assert sum(clock.slept) <= Budgets().record_seconds and len(clock.slept) >= 2  # retried within budget


# ---- from tests/test_wire.py: The wire codec: stable names, versions, strict reading of known records (A6, R15).


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ({"type": "node_finished", "node": "a"}, "lacks required field 'succeeded'"),
        ({"type": "node_finished", "node": "a", "succeeded": "yes"}, "should be a boolean"),
        ({"type": "node_finished", "node": "a", "succeeded": 1}, "should be a boolean"),
        ({"type": "node_finished", "node": "a", "succeeded": True, "_in_sandbox": "no"}, "boolean"),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": False, "unknown": False},
            "lacks required field 'bytes'",
        ),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": True, "unknown": False, "bytes": 3},
            "more than one",
        ),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": False, "unknown": False, "bytes": -1},
            "non-negative",
        ),
        ({"type": "run_rewound", "dropped_nodes": "a"}, "list of strings"),
        ({"type": "run_status_changed", "status": "sleeping"}, "run status"),
        ({"type": "node_finished", "v": 3, "node": "a", "succeeded": True}, "newer"),
        ({"type": "node_finished", "v": 0, "node": "a", "succeeded": True}, "positive"),
        ({"type": "run_started", "at": "yesterday"}, "ISO 8601"),
        ({"node": "a"}, "string 'type'"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_A6_malformed_known_record_makes_the_timeline_unreadable(obj: Any, says: str) -> None:
    """Malformed known record makes the timeline unreadable: ``scratchbank.domain.wire.decode``."""
    with pytest.raises(TimelineUnreadable, match=says):
        decode(obj)


def test_A17_the_bound_ages_by_the_store_alone_and_never_chooses_an_object_of_unknown_age() -> None:
    """``over_bound`` reads the store's times only: the writers' stamps (a year behind, a day ahead)
    change nothing; an object the store gave no time counts, never chosen; no store ``now``, or a
    store clock gone back, sweeps nothing."""
    now = datetime(2026, 12, 2, 12, tzinfo=UTC)

    def loose(i: int, stored: timedelta | None, writer: timedelta) -> StoredObject:
        digest = f"{i:064x}"
        stamp = BankStamp("run-1", "@9", 1, digest, "", now + writer)
        return StoredObject(object_name(digest), 1, stamp, None if stored is None else now - stored)

    hour, fresh = timedelta(hours=1), timedelta(seconds=5)
    old = loose(0, 3 * hour, timedelta(days=1))  # its writer ran a day ahead
    older = loose(1, 5 * hour, timedelta())
    unknown = loose(2, None, -timedelta(days=365))
    young = [loose(3 + i, fresh, -timedelta(days=365)) for i in range(3)]  # their writers a year behind
    listing = [old, unknown, *young, older]
    assert over_bound(listing, now) == (older, old)  # 3 past the count; only these two are an hour old
    assert over_bound([old, unknown, *young[:2]], now) == (old,)
    assert over_bound(listing, None) == ()
    assert over_bound(listing, now - 6 * hour) == ()  # the store's clock went back: nothing is old
    assert listed_now(Listing(listing, now)) == now and listed_now(listing) is None
