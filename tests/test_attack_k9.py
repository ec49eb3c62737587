"""Attacks on K9 (a rewind's replay read from the timeline) and K8's retention setting.

Each test is named after the rule it holds the code to; a hypothesis model written from
the rule text (not the code) checks the fold's verdict on generated loop/fan-out runs.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchbank.domain import ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.errors import ConfigInvalid, TimelineUnreadable
from scratchbank.domain.fold import ScratchState, step
from scratchbank.domain.records import Record, RunRewound
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, node, restored, resumed, started, went_on_without


def loop(pass_: int, name: str = "loop") -> Record:
    return attrs.evolve(node(name, on_cycle=True), pass_=pass_)


# K8: odd values of SCRATCHBANK_RETAIN


@pytest.mark.parametrize("value", ["0" * 5000 + "5", "9" * 4301, "+5", "1e1", "\u0665", "0x5"])
def test_K8_an_odd_retention_setting_is_named_never_a_traceback(value: str) -> None:
    """A digit string past Python's int limit, a sign, an exponent, a unicode digit: ConfigInvalid."""
    from scratchbank.adapters.config import parse_retain

    with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_RETAIN=.*from 1 to 64"):
        parse_retain(value)


def test_K8_leading_zeros_and_surrounding_whitespace_read_as_the_number() -> None:
    """'05' and ' 5\\n' are 5: a whole number, written loosely."""
    from scratchbank.adapters.config import parse_retain

    assert [parse_retain(v) for v in ("05", " 5\n", "\t64", "001")] == [5, 5, 64, 1]


# K9 on the wire: hostile _pass / _replayed_passes


class Counted(str):
    """A node name that counts the equality tests made against it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_K9_a_rewind_naming_many_nodes_decodes_in_linear_time() -> None:
    """2000 dropped nodes with replayed passes: the stray check compares each name a few times, not N times."""
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
    """A rewind of 2000 loop nodes after 2000 pass writes: each write's lookup is constant, not a scan."""
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
    """A unicode node name and a pass past 2**64 are read and written back unchanged."""
    huge = 10**30
    rewind = RunRewound(dropped_nodes=("n\u00e9\u6f22",), replayed={"n\u00e9\u6f22": [huge, 1]})
    assert decode(encode(rewind)) == rewind
    finish = loop(huge, "n\u00e9\u6f22")
    assert decode(encode(finish)) == finish
    decision = decide_resume(fold([started(), banked(), finish, rewind, resumed()]), ResumeRequest())
    assert decision.verdict is Verdict.RESTORE


# K9 against a model written from the rule text


@attrs.frozen
class Model:
    """The rule, read plainly: the writes after the bank, each (node, pass); a rewind drops
    nodes and names passes; a write is taken back when its node was dropped and its pass
    is named (K9), or, naming none for it, when the node lies on no cycle (R6)."""

    writes: tuple[tuple[str, int | None, bool], ...] = ()

    def finished(self, name: str, pass_: int | None, on_cycle: bool) -> Model:
        return Model((*self.writes, (name, pass_, on_cycle)))

    def rewound(self, dropped: frozenset[str], named: dict[str, frozenset[int]]) -> Model:
        def back(name: str, pass_: int | None, on_cycle: bool) -> bool:
            if name not in dropped:
                return False
            if name in named and pass_ is not None:
                return pass_ in named[name]
            return not on_cycle

        return Model(tuple(w for w in self.writes if not back(*w)))


NODES = ("a", "b", "c")
EVENTS = st.one_of(
    st.tuples(
        st.just("finish"), st.sampled_from(NODES), st.one_of(st.none(), st.integers(1, 4)), st.booleans()
    ),
    st.tuples(
        st.just("rewind"),
        st.frozensets(st.sampled_from(NODES), min_size=1),
        st.dictionaries(st.sampled_from(NODES), st.frozensets(st.integers(1, 5), min_size=1), max_size=3),
    ),
    st.tuples(st.just("bank")),
    st.tuples(st.just("restored"), st.booleans()),
    st.tuples(st.just("went_on_without")),
)


def _records(events: list[tuple[Any, ...]]) -> tuple[list[Record], Model | None]:
    records: list[Record] = [started()]
    model: Model | None = None
    for event in events:
        if event[0] == "bank":
            records.append(banked())
            model = Model()
        elif event[0] == "restored":  # X1/R7: the bank is the scratch again; later writes count
            records.append(restored(stale=event[1], accepted=event[1]))
            model = model and Model()
        elif event[0] == "went_on_without":  # R7/A3: the loss accepted, the bank forsaken
            records.append(went_on_without())
            model = None
        elif event[0] == "finish":
            _, name, pass_, on_cycle = event
            records.append(attrs.evolve(node(name, on_cycle=on_cycle), pass_=pass_))
            model = model and model.finished(name, pass_, on_cycle)
        else:
            _, dropped, named = event
            named = {k: v for k, v in named.items() if k in dropped}
            records.append(RunRewound(dropped_nodes=tuple(sorted(dropped)), replayed=named or None))
            model = model and model.rewound(dropped, {k: frozenset(v) for k, v in named.items()})
    return records, model


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=14), st.integers(0, 14))
def test_N2_K9_the_fold_restores_exactly_when_the_model_says_every_write_was_taken_back(
    events: list[tuple[Any, ...]], cut: int
) -> None:
    """Generated loops, fan-outs, nested rewinds, never-run passes, restores, consents: restore iff no write survives."""
    records, model = _records(events)
    records.append(resumed())
    state = fold(records)
    decision = decide_resume(state, ResumeRequest())
    if model is None:
        return
    if model.writes:
        assert decision.refused, (records, model)
    else:
        assert decision.verdict is Verdict.RESTORE and not decision.refused, (records, decision)
    cut = min(cut, len(records))
    snap = state_from_data(state_to_data(fold(records[:cut])))
    assert snap is not None
    resumed_state: ScratchState = snap
    for record in records[cut:]:
        resumed_state = step(resumed_state, record)
    assert resumed_state == state  # a snapshot mid-loop, then more passes, folds as the whole
