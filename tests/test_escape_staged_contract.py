"""The staged restore protocol of the Sandbox port, one contract for the fake and the real
sandboxes alike (X2): stage without touching the scratch, list the staged tree (implicit
parents too), discard or commit, refuse what tar cannot read or what does not fit."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator

import pytest
from rigs import rig

from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.bank_format.members import DIR, FILE, SYMLINK, Member
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import RestoreRefused

KINDS = ["fake", "local", "docker-busybox", "docker-gnu"]


@pytest.fixture(params=KINDS)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    if request.param == "fake":
        yield FakeSandbox({"keep": b"mine"})
        return
    with rig(request.param) as r:
        r.sh(f"rm -rf {r.scratch}; mkdir -p {r.scratch} && printf mine > {r.scratch}/keep")
        yield r.sandbox


def canonical() -> bytes:
    out = io.BytesIO()
    w = CanonicalWriter(out)
    w.member(Member("", DIR, 0, 0o755, 1_600_000_000))
    w.member(Member("a/b/f", FILE, 5, 0o644, 1_600_000_000))  # "a" and "a/b" left implicit
    w.data(b"hello")
    w.member(Member("l", SYMLINK, 0, 0o777, 1_600_000_000, "a/b/f"))
    w.finish()
    return out.getvalue()


EXPECTED = sorted(
    json.dumps(e) for e in (["a", "dir", 0], ["a/b", "dir", 0], ["a/b/f", "file", 5], ["l", "symlink", 5])
)


def staged_lines(listing: io.BytesIO) -> list[str]:
    return sorted(line for line in listing.getvalue().decode("ascii").splitlines() if line)


def test_X2_stage_lists_the_tree_and_leaves_the_scratch_until_commit(sandbox: Sandbox) -> None:
    before = sandbox.list_scratch()
    assert before == [json.dumps(["keep", "file", 4])]
    tar, listing = canonical(), io.BytesIO()
    staged = sandbox.stage_restore(io.BytesIO(tar), compressed=False, listing=listing)
    assert (staged.received, staged.sha256) == (len(tar), hashlib.sha256(tar).hexdigest())
    assert staged_lines(listing) == EXPECTED
    assert sandbox.list_scratch() == before
    sandbox.discard_restore(staged)
    assert sandbox.list_scratch() == before
    again = sandbox.stage_restore(io.BytesIO(tar), compressed=False, listing=io.BytesIO())
    sandbox.commit_restore(again)
    assert sandbox.list_scratch() == EXPECTED


def test_X2_a_stream_tar_cannot_read_is_refused_and_nothing_stays(sandbox: Sandbox) -> None:
    before = sandbox.list_scratch()
    with pytest.raises(RestoreRefused):
        sandbox.stage_restore(io.BytesIO(b"not a tar" * 200), compressed=False, listing=io.BytesIO())
    assert sandbox.list_scratch() == before


def test_X2_less_free_space_than_the_bank_needs_is_refused_first(sandbox: Sandbox) -> None:
    before = sandbox.list_scratch()
    with pytest.raises(RestoreRefused):
        sandbox.stage_restore(
            io.BytesIO(canonical()), compressed=False, listing=io.BytesIO(), need_bytes=1 << 60
        )
    assert sandbox.list_scratch() == before
