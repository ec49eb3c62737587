"""The resume and restore use cases end to end, with fakes (R and X rules)."""

from __future__ import annotations

import pytest
from rigs.resume_world import World, checksum

from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.resume import resume
from scratchbank.domain import (
    ResumeRequest,
)
from scratchbank.domain.errors import (
    RunNotFound,
)


def test_RUN_NOT_FOUND_an_empty_timeline_is_named_and_nothing_is_written() -> None:
    w = World()
    before = checksum(w)
    with pytest.raises(RunNotFound) as raised:
        resume("run-404", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=FakeSandbox({}))
    assert raised.value.code == "RUN_NOT_FOUND"
    assert w.timeline.read("run-404") == () and checksum(w) == before
