"""Rules X: restoring the bank into the new sandbox. The engines tier's tests of X2, X4
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). These sit apart from test_X_engines.py: a name of theirs (a test's or a
fixture's) is another test's there."""

from __future__ import annotations

import io
from typing import BinaryIO

import pytest
from hostile import end, gz
from rigs.one_exec_restore import (
    Counted,
    DropsFromListing,
    _stage,
    box,  # noqa: F401 - a fixture
)
from rigs.real_sandboxes import Rig, rig
from rigs.sandbox_restores import SEED, files, fingerprint, reason, restore

from scratchbank.application.ports import RestoresInOneExec, StagedRestore
from scratchbank.domain.errors import StreamBroken

# ---- from tests/rules/test_X_restore_one_exec_engines.py: A restore into a scripted sandbox is ONE exec (issue 14): the script stages the bank, lists the staged tree, waits on stdin for the host's verdict and commits or discards. Every guarantee of the two-phase restore holds in it: until the host answers with the directory modes, the scratch is byte for byte as it was, and a discard (a listing that is not the manifest, a host that failed while deciding, an exec that ended before the verdict) leaves nothing staged beside it (X2, X4).


def test_X2_a_restore_into_a_scripted_sandbox_is_one_exec(box: Rig) -> None:
    """A restore into a scripted sandbox is one exec: ``scratchbank.application.resume.resume``."""
    box.sh(SEED.format(s=box.scratch))
    counted = Counted(box.sandbox)
    assert isinstance(box.sandbox, RestoresInOneExec)
    out = restore(gz(files("a/new", "top") + end()), box.sandbox)
    assert out.proceeds, out
    assert counted.execs == ["stage"], counted.execs
    assert box.sh(f"cat {box.scratch}/a/new") == "abc"
    assert box.sh(f"ls {box.scratch}") == "a\ntop\n"
    assert box.beside() == "0"


def test_X4_a_listing_that_is_not_the_manifest_is_discarded_in_the_same_exec(box: Rig) -> None:
    """A listing that is not the manifest is discarded in the same exec:
    ``scratchbank.application.resume.resume``."""
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)
    counted = Counted(box.sandbox)
    out = restore(gz(files("a/new", "top") + end()), DropsFromListing(box.sandbox))  # type: ignore[arg-type]
    assert "refused_in_sandbox" in reason(out) and "partial restore" in reason(out), reason(out)
    assert counted.execs == ["stage"], counted.execs
    assert fingerprint(box) == before


def test_X4_a_host_that_fails_while_deciding_discards_and_says_why(box: Rig) -> None:
    """A host that fails while deciding discards and says why: ``scratchbank.domain.errors.StreamBroken``."""
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)

    def broken(staged: StagedRestore, listing: BinaryIO) -> None:
        raise StreamBroken("the host could not read the listing")

    with pytest.raises(StreamBroken, match="could not read the listing"):
        box.sandbox.restore_in_one_exec(
            io.BytesIO(files("x") + end()), compressed=False, need_bytes=0, decide=broken
        )
    assert fingerprint(box) == before


def test_X4_a_discard_verdict_leaves_the_scratch_as_it_was(box: Rig) -> None:
    """A discard verdict leaves the scratch as it was:
    ``scratchbank.application.ports.RestoresInOneExec.restore_in_one_exec``."""
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)
    seen: list[StagedRestore] = []

    def no(staged: StagedRestore, listing: BinaryIO) -> None:
        seen.append(staged)

    assert (
        box.sandbox.restore_in_one_exec(
            io.BytesIO(files("x") + end()), compressed=False, need_bytes=0, decide=no
        )
        is None
    )
    assert len(seen) == 1 and seen[0].received == len(files("x") + end())
    assert fingerprint(box) == before


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_X2_a_byte_changed_on_the_way_is_a_broken_stream(engine: str) -> None:
    """A file's byte changed in a data frame (count and end frame right, tar extracts it):
    the digest of what was read is not the end frame's, exit 20 (size AND digest end to end).
    Proves ``scratchbank.adapters.restore_wire.FramedStream``."""
    from scratchbank.adapters.restore_wire import STREAM_BROKE, FramedStream

    with rig(engine) as box:
        framed = FramedStream(io.BytesIO(files("x") + end())).read()
        at = framed.index(b"abc")
        changed = framed[:at] + b"abd" + framed[at + 3 :]
        done = _stage(box, "", changed)
        assert done.exit_code == STREAM_BROKE, done.err
        assert "got sha256" in done.err


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_X2_a_frame_repeated_on_the_way_is_a_broken_stream(engine: str) -> None:
    """A whole frame sent twice (the end frame right): received is not the count sent, exit 20.
    Proves ``scratchbank.adapters.restore_wire.FramedStream``."""
    from scratchbank.adapters.restore_wire import STREAM_BROKE, FramedStream

    with rig(engine) as box:
        framed = FramedStream(io.BytesIO(files("x") + end())).read()
        first = framed[: framed.index(b"end ")]
        done = _stage(box, "", first + framed)
        assert done.exit_code == STREAM_BROKE, done.err
        assert "received" in done.err
