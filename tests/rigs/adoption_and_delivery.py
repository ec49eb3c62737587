"""Adoption into a parent's sandbox and the runner's delivery: sandbox facts, a child node, a store
that is down.

First written for tests/rules/test_[CSX]*.py: Adoption into a parent's sandbox (S1, S5) and the
runner's delivery rules (C3-C6)."""

from __future__ import annotations

from collections.abc import Sequence

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import SandboxFacts
from scratchbank.domain import ChildNode, Consents
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.records import Record

TOOL = ChildNode("build", "tool")


ACCEPT = Consents(accept_scratch_loss=True)


CONTAINER = SandboxFacts("/tmp/iterion-scratch", False, True, "own PID namespace")


HOST = SandboxFacts("/tmp/iterion-scratch", True, True, "own PID namespace")


class _StoreDown(InMemoryTimeline):
    """A timeline whose store refuses every write (an outage longer than any budget)."""

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        raise TimelineWriteFailed("the store is down")
