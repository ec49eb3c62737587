"""The tiers plugin's scheduler for pytest-xdist (tests/tiers.py): ``--dist loadfile`` in the
collection's order (SLOW_FIRST), with SPREAD's tests each a unit of its own."""

from __future__ import annotations

import types
from typing import Any

from tiers import pytest_xdist_make_scheduler


class Node:
    """A worker as the scheduler sees it: what it was sent, by collection index."""

    shutting_down = False

    def __init__(self, name: str) -> None:
        self.gateway = types.SimpleNamespace(id=name)
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(workers: int) -> Any:
    option = types.SimpleNamespace(loadscopereorder=True)
    values = {"dist": "loadfile", "tx": [f"{workers}*popen"]}
    config = types.SimpleNamespace(option=option, getvalue=values.__getitem__)
    return pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]


#: a collection as tests/tiers.py orders it: a long file of one test first, then files of many
COLLECTION = [
    "tests/rules/test_A_interleavings_sampled_engines.py::test_chunk[0]",
    "tests/rules/test_A_interleavings_sampled_engines.py::test_chunk[1]",
    "tests/test_long.py::test_one",
    *[f"tests/test_many.py::test_{i}" for i in range(9)],
    *[f"tests/test_more.py::test_{i}" for i in range(6)],
]


def test_the_first_workers_start_on_the_first_files_collected_not_the_files_of_most_tests() -> None:
    """pytest-xdist's default (``--loadscope-reorder``) hands out the files with the most tests
    first, so the slowest file of one test started last (the whole suite waited ~6 min on it):
    the scheduler keeps the collection's order, and the chunks of a SPREAD file go to different
    workers."""
    scheduler = _scheduler(3)
    nodes = [Node(f"gw{i}") for i in range(3)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    first = [COLLECTION[node.sent[0]] for node in nodes]
    assert first == COLLECTION[:3]
    assert scheduler.config.option.loadscopereorder is False


def test_only_the_files_of_SPREAD_are_split_into_single_tests() -> None:
    """A file not in SPREAD stays one unit (its module fixtures are set up once, on one worker)."""
    scheduler = _scheduler(2)
    assert scheduler._split_scope(COLLECTION[0]) == COLLECTION[0]
    assert scheduler._split_scope("tests/test_many.py::test_3") == "tests/test_many.py"
    assert _scheduler_for("load") is None


def _scheduler_for(dist: str) -> Any:
    config = types.SimpleNamespace(option=types.SimpleNamespace(), getvalue={"dist": dist}.__getitem__)
    return pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
