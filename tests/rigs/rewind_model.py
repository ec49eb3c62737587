"""K9 and K8 read plainly: a model of which writes a rewind takes back, the loop-pass records and the
hypothesis strategies of timelines with rewinds.

First written for tests/rules/test_[KN]*.py: Attacks on K9 (a rewind's replay read from the
timeline) and K8's retention setting."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from scratchbank.domain.records import Record, RunRewound
from scratchbank.testing.builders import banked, node, restored, started, went_on_without


def loop(pass_: int, name: str = "loop") -> Record:
    return attrs.evolve(node(name, on_cycle=True), pass_=pass_)


class Counted(str):
    """A node name that counts the equality tests made against it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


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
