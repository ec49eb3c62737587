"""Rules K: checkpoint stamps: staleness read from the checkpoint itself (ADR 0013). The pure tier's
tests of K1, K2, K4, K5, K6, K7, K8, K9 (tests/tiers.py: a file of tests/rules/ has its tier in its
name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from rigs.checkpoint_stamps import (
    ACCEPT,
    C1,
    C2,
    C3,
    C4,
    C5,
    URLS,
    _teardown,
    bank_at,
    checkpoints_run,
    kept_flags,
    rewind_replaying,
    stamped,
)
from rigs.rewind_model import Counted, loop

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import resume
from scratchbank.application.service import ScratchService
from scratchbank.domain import SCRATCH_NOT_PORTABLE, Consents, ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.errors import ConfigInvalid, InvalidCheckpoint, TimelineUnreadable
from scratchbank.domain.records import RunRewound, ScratchRestored
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_[KN]*.py: Attacks on K9 (a rewind's replay read from the timeline) and K8's retention setting.


@pytest.mark.parametrize("value", ["0" * 5000 + "5", "9" * 4301, "+5", "1e1", "\u0665", "0x5"])
def test_K8_an_odd_retention_setting_is_named_never_a_traceback(value: str) -> None:
    """A digit string past Python's int limit, a sign, an exponent, a unicode digit: ConfigInvalid."""
    from scratchbank.adapters.config import parse_retain

    with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_RETAIN=.*from 1 to 64"):
        parse_retain(value)


def test_K8_leading_zeros_and_surrounding_whitespace_read_as_the_number() -> None:
    """'05' and ' 5\\n' are 5: a whole number, written loosely.
    Proves ``scratchbank.adapters.config.parse_retain``."""
    from scratchbank.adapters.config import parse_retain

    assert [parse_retain(v) for v in ("05", " 5\n", "\t64", "001")] == [5, 5, 64, 1]


def test_K9_a_rewind_naming_many_nodes_decodes_in_linear_time() -> None:
    """2000 dropped nodes with replayed passes: the stray check compares each name a few times, not N times.
    Proves ``scratchbank.domain.wire.decode``."""
    n = 2_000
    names = [Counted(f"n{i}") for i in range(n)]
    Counted.compared = 0
    record = decode(
        {
            "type": "run_rewound",
            "v": 2,
            "dropped_nodes": names,
            "_replayed_passes": {f"n{i}": [1] for i in range(n)},
        }
    )
    assert isinstance(record, RunRewound) and len(record.dropped_nodes) == n
    assert Counted.compared < 10 * n


def test_K9_a_fold_over_a_wide_rewind_looks_each_write_up_once() -> None:
    """A rewind of 2000 loop nodes after 2000 pass writes: each write's lookup is constant, not a scan.
    Proves ``scratchbank.domain.decide_resume``."""
    n = 2_000
    names = [Counted(f"n{i}") for i in range(n)]
    writes = [loop(1, name) for name in names]
    rewind = RunRewound(
        dropped_nodes=tuple(names), on_cycle=tuple(names), replayed={f"n{i}": [1] for i in range(n)}
    )
    Counted.compared = 0
    decision = decide_resume(fold([started(), banked(), *writes, rewind, resumed()]), ResumeRequest())
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K9"
    assert Counted.compared < 20 * n


@pytest.mark.parametrize(
    "bad",
    [
        {"_pass": -1},
        {"_pass": 1.0},
        {"_pass": [1]},
        {"_pass": {"n": 1}},
        {"_pass": None, "node": ["x"]},
    ],
)
def test_K9_a_hostile_pass_on_a_finish_is_unreadable_by_name(bad: dict[str, Any]) -> None:
    """Negative, float, nested values of _pass: TimelineUnreadable, never a traceback."""
    with pytest.raises(TimelineUnreadable):
        decode({"type": "node_finished", "v": 2, "node": "x", "succeeded": True, **bad})


@pytest.mark.parametrize(
    "replayed",
    [
        {"x": [-1]},
        {"x": [[1]]},
        {"x": [1.5]},
        {"x": "12"},
        {"x": {"1": 1}},
        {"x": None},
        [["x", [1]]],
        "x",
        {"x": [1], "\u00e9": [1]},
    ],
)
def test_K9_hostile_replayed_passes_are_unreadable_by_name(replayed: Any) -> None:
    """Nested, negative, string, float, list-shaped or stray-node replays: TimelineUnreadable."""
    with pytest.raises(TimelineUnreadable):
        decode({"type": "run_rewound", "v": 2, "dropped_nodes": ["x"], "_replayed_passes": replayed})


def test_K9_unicode_node_names_and_huge_passes_round_trip() -> None:
    """A unicode node name and a pass past 2**64 are read and written back unchanged.
    Proves ``scratchbank.domain.wire.decode``."""
    huge = 10**30
    rewind = RunRewound(dropped_nodes=("n\u00e9\u6f22",), replayed={"n\u00e9\u6f22": [huge, 1]})
    assert decode(encode(rewind)) == rewind
    finish = loop(huge, "n\u00e9\u6f22")
    assert decode(encode(finish)) == finish
    decision = decide_resume(fold([started(), banked(), finish, rewind, resumed()]), ResumeRequest())
    assert decision.verdict is Verdict.RESTORE


# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


def test_K1_R7_accepting_the_loss_restores_the_stale_bank_and_says_stale() -> None:
    """A stamped stale bank with its loss accepted restores as R7, stale.
    Proves ``scratchbank.domain.decide_resume``."""
    timeline = [started(), node("a"), stamped(C1), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest(consents=ACCEPT, checkpoint=C2))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "R7" and decision.stale


def test_K2_a_branch_past_a_rewind_is_stale_though_its_count_equals_the_bank() -> None:
    """Bank at c2, resume at c3 (same length, another branch): refused K2.
    Proves ``scratchbank.domain.decide_resume``."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C3))
    assert decision.refused and decision.rule == "K2" and decision.code == SCRATCH_NOT_PORTABLE


def test_K4_a_rewind_to_before_the_bank_restores_it_and_says_so() -> None:
    """Resume behind the bank: the bank holds every write of the checkpoint; restored K4.
    Proves ``scratchbank.domain.decide_resume``."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K4" and not decision.stale
    assert "later checkpoint" in decision.explanation


@pytest.mark.parametrize(("bank_stamp", "at"), [(None, C2), (C1, None), (None, None)])
def test_K5_without_a_stamp_on_either_side_the_events_decide_as_before(
    bank_stamp: Checkpoint | None, at: Checkpoint | None
) -> None:
    """Unstamped bank or request: the decision is the legacy one, field for field.
    Proves ``scratchbank.domain.decide_resume``."""
    for tail in ([], [node("b")]):
        timeline = [started(), node("a"), stamped(bank_stamp), *tail, resumed()]
        legacy = [started(), node("a"), banked(), *tail, resumed()]
        got = decide_resume(fold(timeline), ResumeRequest(checkpoint=at))
        want = decide_resume(fold(legacy), ResumeRequest())
        assert attrs.evolve(got, bank=None) == attrs.evolve(want, bank=None)


def test_K1_the_refusal_line_names_its_rule_in_words() -> None:
    """A K1 refusal says K1 in words from the shipped rule reference; K1-K5 are all there.
    Proves ``scratchbank.domain.decide_resume``."""
    from scratchbank.adapters.present import decision_text
    from scratchbank.adapters.rules import RULES

    decision = decide_resume(fold([started(), stamped(C1), resumed()]), ResumeRequest(checkpoint=C2))
    assert any(f"K1: {RULES['K1'].title}" in line for line in decision_text(decision))
    assert all(f"K{n}" in RULES for n in range(1, 9))


def test_K6_a_rewind_restores_the_bank_taken_at_its_checkpoint_not_the_newest() -> None:
    """Resume from c1 with banks at c1 and c2: the c1 bank is restored, named K6.
    Proves ``scratchbank.domain.decide_resume``."""
    decision = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K6" and not decision.stale
    assert decision.bank is not None and decision.bank.record == bank_at(C1, "1")
    assert decision.bank.evidence.position == 1
    at_c2 = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C2))
    assert at_c2.rule == "K3" and at_c2.bank is not None and at_c2.bank.record == bank_at(C2, "2")


def test_K6_the_fold_follows_a_restore_record_naming_the_older_bank() -> None:
    """A restore naming c1 and bank #2 makes the c1 bank current; resuming at c1 again is K3.
    Proves ``scratchbank.domain.decide_resume``."""
    back = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1, bank=1)
    state = fold([*checkpoints_run(), back])
    assert state.bank is not None and state.bank.record == bank_at(C1, "1") and state.bank.checkpoint == C1
    assert decide_resume(state, ResumeRequest(checkpoint=C1)).rule == "K3"
    assert decide_resume(state, ResumeRequest(checkpoint=C2)).rule == "K6"  # c2's is still kept


def test_K6_K1_a_checkpoint_without_a_bank_of_its_own_decides_on_the_current_bank() -> None:
    """No bank at c4 (ahead of c2's): the current bank decides (K1), no older bank is picked.
    Proves ``scratchbank.domain.decide_resume``."""
    decision = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C4))
    assert decision.refused and decision.rule == "K1" and decision.code == SCRATCH_NOT_PORTABLE


def test_K7_a_rewind_to_a_swept_bank_is_refused_by_name_with_its_remedy() -> None:
    """Retention 1 keeps c2's bank only: a rewind to c1 is CHECKPOINT_BANK_SWEPT, K7.
    Proves ``scratchbank.domain.decide_resume``."""
    from scratchbank.domain.errors import CheckpointBankSwept
    from scratchbank.domain.remedy import remedy

    state = fold(checkpoints_run())
    decision = decide_resume(state, ResumeRequest(checkpoint=C1, retain=1))
    assert decision.refused and decision.rule == "K7" and decision.code == "CHECKPOINT_BANK_SWEPT"
    assert "swept" in decision.explanation and remedy(decision) == CheckpointBankSwept.remedy
    accepted = decide_resume(state, ResumeRequest(consents=ACCEPT, checkpoint=C1, retain=1))
    assert accepted.verdict is Verdict.RESTORE and accepted.rule == "K4"  # the current bank
    assert decide_resume(state, ResumeRequest(checkpoint=C1, retain=2)).rule == "K6"


def test_K8_a_retention_setting_outside_its_bounds_is_refused_by_name() -> None:
    """Retention is 1..64: anything else is a named error, never a silent default.
    Proves ``scratchbank.domain.ResumeRequest``."""
    for bad in (0, -1, 65, True):
        with pytest.raises(InvalidCheckpoint, match="retention"):
            ResumeRequest(retain=bad)


def test_K6_wire_a_restore_naming_its_bank_survives_and_v2_reads_without() -> None:
    """sandbox_scratch_restored v3 carries ``bank``; a v2 record reads with none."""
    rec = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1, bank=1)
    data = encode(rec)
    assert data["v"] == 3 and data["bank"] == 1 and decode(data) == rec
    old = {k: v for k, v in data.items() if k != "bank"} | {"v": 2}
    assert decode(old) == attrs.evolve(rec, bank=None)


def test_K8_a_snapshot_keeps_the_checkpoints_banks() -> None:
    """The retained history survives a snapshot; an older (v3) snapshot is ignored (folded again).
    Proves ``scratchbank.domain.snapshot.state_from_data``."""
    state = fold(checkpoints_run())
    assert len(state.history) == 2 and state_from_data(state_to_data(state)) == state
    assert state_from_data({**state_to_data(state), "v": 3}) is None


def test_K6_K8_use_case_a_rewind_gets_the_older_scratch_back_and_names_it() -> None:
    """Teardowns at c1 and c2 keep both objects; a resume from c1 restores c1's files.
    Proves ``scratchbank.application.resume.resume``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    _teardown(timeline, store, {"a.txt": b"one"}, C1)
    _teardown(timeline, store, {"a.txt": b"two", "b.txt": b"more"}, C2)
    assert len([o for o in store.objects("run-1") if o.name]) == 2  # retention kept c1's
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.proceeds and out.decision.rule == "K6" and box.files == {"a.txt": b"one"}
    last = timeline.read("run-1")[-1]
    assert isinstance(last, ScratchRestored) and last.checkpoint == C1 and last.bank == 1
    state = fold(timeline.read("run-1"))
    assert state.bank is not None and state.bank.checkpoint == C1 and state.bank.evidence.position == 1


def test_K8_teardown_and_prune_keep_what_retention_says_and_nothing_else() -> None:
    """Retention 2 over four stamped teardowns: the two newest objects stay, the rest go.
    Proves ``scratchbank.application.resume.resume``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    for n, at in enumerate((C1, C2, C4, C5)):
        _teardown(timeline, store, {"n.txt": str(n).encode()}, at, retain=2)
    kept = {o.name for o in store.objects("run-1")}
    state = fold(timeline.read("run-1"))
    assert kept == {k.object for k in state.history[-2:]} and len(kept) == 2
    before = (list(timeline.read("run-1")), kept)
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1, retain=2),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.decision.code == "CHECKPOINT_BANK_SWEPT" and not out.proceeds
    assert (
        list(timeline.read("run-1")),
        {o.name for o in store.objects("run-1")},
    ) == before and box.files == {}


def test_K8_status_lists_the_banks_a_run_holds_and_their_checkpoints() -> None:
    """status: each checkpoint's bank, where it was recorded, and whether retention keeps it.
    Proves ``scratchbank.adapters.present.state_data``."""
    from scratchbank.adapters.present import state_data, state_text

    data = state_data(fold(checkpoints_run()))
    held = data["checkpoint_banks"]
    assert [(h["checkpoint"], h["at"], h["kept"]) for h in held] == [
        ("c1", "record 2", True),
        ("c2", "record 5", True),
    ]
    assert data["bank"]["checkpoint"] == "c2"
    lines = state_text(fold(checkpoints_run()))
    assert any(line.startswith("checkpoint bank: c1: record 2") for line in lines)


def test_K9_a_kept_loop_pass_that_wrote_after_the_bank_is_refused_naming_the_pass() -> None:
    """Passes 2 and 3 wrote after the bank; the rewind replays 3 only: refused K9, naming pass 2.
    Proves ``scratchbank.domain.decide_resume``."""
    timeline = [started(), loop(1), banked(), loop(2), loop(3), rewind_replaying(loop=[3]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.refused and decision.code == SCRATCH_NOT_PORTABLE and decision.rule == "K9"
    assert "loop pass 2" in decision.explanation and "#6 run_rewound" in decision.explanation
    assert [str(e) for e in decision.evidence] == [
        "#3 sandbox_scratch_banked",
        "#4 node_finished",
        "#6 run_rewound",
    ]
    accepted = decide_resume(fold(timeline), ResumeRequest(consents=ACCEPT))
    assert accepted.verdict is Verdict.RESTORE and accepted.rule == "R7" and accepted.stale


def test_K9_an_in_flight_branch_the_rewind_lets_finish_still_counts() -> None:
    """A fan-out's branch (pass 1) wrote after the bank and the rewind does not replay it: refused.
    Proves ``scratchbank.domain.decide_resume``."""
    each = [loop(1, "each"), loop(2, "each")]
    timeline = [started(), banked(), *each, rewind_replaying(each=[2]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.refused and decision.rule == "K9" and "each pass 1" in decision.explanation
    replayed = [started(), banked(), *each, rewind_replaying(each=[1, 2]), resumed()]
    assert decide_resume(fold(replayed), ResumeRequest()).rule == "K9"
    assert decide_resume(fold(replayed), ResumeRequest()).verdict is Verdict.RESTORE


def test_K9_a_finish_without_a_pass_or_a_node_without_passes_is_read_as_R6_says() -> None:
    """No pass on the finish, or none named for its node: the rewind cannot take it back by pass.
    Proves ``scratchbank.domain.decide_resume``."""
    no_pass = [started(), banked(), node("loop", on_cycle=True), rewind_replaying(loop=[1]), resumed()]
    assert decide_resume(fold(no_pass), ResumeRequest()).rule == "R2"
    other = RunRewound(dropped_nodes=("loop", "x"), on_cycle=("loop", "x"), replayed={"x": [1]})
    unnamed = [started(), banked(), loop(1), other, resumed()]
    assert decide_resume(fold(unnamed), ResumeRequest()).rule == "R2"
    not_dropped = [started(), banked(), loop(1), loop(1, "y"), rewind_replaying(loop=[1]), resumed()]
    assert decide_resume(fold(not_dropped), ResumeRequest()).rule == "R2"  # y was not dropped


def test_K9_a_stamped_bank_is_still_decided_by_its_stamp() -> None:
    """Both stamps present: K1-K4 decide; the passes' reading only replaces R6's guess.
    Proves ``scratchbank.domain.decide_resume``."""
    timeline = [started(), loop(1), stamped(C1), loop(2), rewind_replaying(loop=[2]), resumed()]
    assert decide_resume(fold(timeline), ResumeRequest(checkpoint=C2)).rule == "K1"


def test_K9_the_snapshot_keeps_passes_the_kept_by_rewind_and_the_replay() -> None:
    """A snapshot of a K9 state decides as the fold does; a v4 snapshot is not trusted.
    Proves ``scratchbank.domain.snapshot.state_from_data``."""
    kept = [started(), loop(1), banked(), loop(2), loop(3), rewind_replaying(loop=[3])]
    replayed = [started(), loop(1), banked(), loop(2), rewind_replaying(loop=[2])]
    for timeline in (kept, replayed):
        state = fold(timeline)
        assert state_from_data(state_to_data(state)) == state
    assert state_from_data({**state_to_data(fold(kept)), "v": 4}) is None


def test_K8_the_retention_setting_is_read_from_the_environment_surfaces_and_runner_share(
    tmp_path: Path,
) -> None:
    """Unset or empty: 5; 1 and 64 read; the runner's settings are the surfaces' own.
    Proves ``scratchbank.adapters.config.settings_from``."""
    from scratchbank.adapters.config import settings_from
    from scratchbank.adapters.runner_settings import VARIABLES

    assert settings_from(URLS).retain == 5 and settings_from({**URLS, "SCRATCHBANK_RETAIN": ""}).retain == 5
    assert [settings_from({**URLS, "SCRATCHBANK_RETAIN": v}).retain for v in ("1", " 64 ")] == [1, 64]
    assert "SCRATCHBANK_RETAIN" in VARIABLES


def test_K8_K7_a_service_decides_and_prunes_with_its_retention_setting(tmp_path: Path) -> None:
    """bootstrap hands the setting to the service: retain 1 sweeps c1's bank (K7) where 5 keeps it (K6).
    Proves ``scratchbank.adapters.bootstrap.bootstrap``."""
    from scratchbank.adapters.bootstrap import bootstrap
    from scratchbank.adapters.config import home_settings

    with bootstrap(attrs.evolve(home_settings(tmp_path), retain=1), create=True) as service:
        assert service.retain == 1
        service.timeline.append("run-1", checkpoints_run())
        before = service.timeline.read("run-1")
        swept = service.assess("run-1", ResumeRequest(checkpoint=C1)).decision
        assert swept.refused and swept.rule == "K7" and swept.code == "CHECKPOINT_BANK_SWEPT"
        assert service.timeline.read("run-1") == before
        assert kept_flags(service) == [False, True]  # status lists c1's bank as past retention
    with bootstrap(home_settings(tmp_path)) as service:
        assert service.retain == 5
        assert service.assess("run-1", ResumeRequest(checkpoint=C1)).decision.rule == "K6"
        assert kept_flags(service) == [True, True]
    with pytest.raises(InvalidCheckpoint):
        ScratchService(InMemoryTimeline(), InMemoryBankStore(), retain=0)


def test_K8_K7_the_runner_decides_with_its_own_retention_setting(tmp_path: Path) -> None:
    """The runner prunes with SCRATCHBANK_RETAIN, so its gate reads the same: retain 1 refuses K7.
    Proves ``scratchbank.application.service.ScratchService``."""
    from runner_rigs import RecordingInbound, make_rig

    from scratchbank.application.ports import ResumeDelivery
    from scratchbank.application.runner import Handled, RunnerSettings

    timeline = InMemoryTimeline()
    timeline.append("run-1", checkpoints_run()[:-1])
    rig = make_rig(tmp_path, timeline)
    queued = ScratchService(timeline, InMemoryBankStore(), clock=ManualClock(), queue=rig.queue).queue_resume(
        "run-1", ResumeRequest(checkpoint=C1), attempt="a1"
    )
    assert queued.attempt == "a1"  # the surface (retain 5) judged K6 and published
    runner = attrs.evolve(rig.runner(), settings=RunnerSettings("runner-a", retain=1))
    handling = runner.handle(RecordingInbound(ResumeDelivery("run-1", "a1", Consents(), checkpoint=C1)))
    assert handling.handled is Handled.REFUSED
    assert handling.decision is not None and handling.decision.rule == "K7"
