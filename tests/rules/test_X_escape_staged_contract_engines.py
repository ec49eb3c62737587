"""Rules X: restoring the bank into the new sandbox. The engines tier's tests of X2 (tests/tiers.py: a
file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). These sit apart from test_X_engines.py: a name of theirs (a test's or a
fixture's) is another test's there."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from rigs.staged_restore import (
    EXPECTED,
    canonical,
    sandbox,  # noqa: F401 - a fixture
    staged_lines,
)

from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import RestoreRefused

# ---- from tests/rules/test_X_escape_staged_contract_engines.py: The staged restore protocol of the Sandbox port, one contract for the fake and the real sandboxes alike (X2): stage without touching the scratch, list the staged tree (implicit parents too), discard or commit, refuse what tar cannot read or what does not fit.


def test_X2_stage_lists_the_tree_and_leaves_the_scratch_until_commit(sandbox: Sandbox) -> None:
    """Stage lists the tree and leaves the scratch until commit:
    ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
    before = sandbox.list_scratch()
    assert before == [json.dumps(["keep", "file", 4])]
    tar, listing = canonical(), io.BytesIO()
    staged = sandbox.stage_restore(io.BytesIO(tar), compressed=False, listing=listing)
    assert (staged.received, staged.digest) == (len(tar), hashlib.md5(tar).hexdigest())
    assert staged_lines(listing) == EXPECTED
    assert sandbox.list_scratch() == before
    sandbox.discard_restore(staged)
    assert sandbox.list_scratch() == before
    again = sandbox.stage_restore(io.BytesIO(tar), compressed=False, listing=io.BytesIO())
    sandbox.commit_restore(again)
    assert sandbox.list_scratch() == EXPECTED


def test_X2_a_stream_tar_cannot_read_is_refused_and_nothing_stays(sandbox: Sandbox) -> None:
    """A stream tar cannot read is refused and nothing stays:
    ``scratchbank.application.ports.Sandbox.list_scratch``."""
    before = sandbox.list_scratch()
    with pytest.raises(RestoreRefused):
        sandbox.stage_restore(io.BytesIO(b"not a tar" * 200), compressed=False, listing=io.BytesIO())
    assert sandbox.list_scratch() == before


def test_X2_less_free_space_than_the_bank_needs_is_refused_first(sandbox: Sandbox) -> None:
    """Less free space than the bank needs is refused first:
    ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
    before = sandbox.list_scratch()
    with pytest.raises(RestoreRefused):
        sandbox.stage_restore(
            io.BytesIO(canonical()), compressed=False, listing=io.BytesIO(), need_bytes=1 << 60
        )
    assert sandbox.list_scratch() == before
