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
from rigs.real_sandboxes import Rig, kept_containers, rig  # noqa: F401 - a fixture
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
        assert "got md5" in done.err


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


# ---- issue 24: the restore at the speed of a bare extract. The staged tree is listed in one
# walk where the sandbox's find is GNU's (BusyBox: its two walks), and the host digests the
# stream once (the framing's digest; the canonical writer takes none for a sandbox).

_TRICKY = (
    "mkdir -p {s}/d && printf abc >{s}/d/f && ln -s d/f {s}/l && mkfifo {s}/p && printf 12345 >'{s}/n\nx'"
)


@pytest.mark.parametrize("engine", ["local", "docker-busybox", "podman-gnu"])
def test_X2_the_tree_is_listed_in_one_walk_where_find_is_gnu(engine: str) -> None:
    """GNU find lists in one walk, BusyBox in two: ``write_listing`` reads the same manifest lines from both."""
    import tempfile

    from scratchbank.adapters.restore_wire import write_listing
    from scratchbank.adapters.scripted import RESTORE
    from scratchbank.application.bank_format.manifest_line import line_of

    with rig(engine) as box:
        box.sh(f"rm -rf {box.scratch} && mkdir -p {box.scratch}")
        box.sh(_TRICKY.format(s=box.scratch))
        done = box.sandbox.run(RESTORE, ["list", box.scratch])
        assert done.exit_code == 0, done.err
        first_stat = done.stdout.split(b"\n", 2)[1][:1]
        assert (first_stat == b":") == (engine != "docker-busybox"), done.stdout[:200]
        with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as lines:
            raw.write(done.stdout)
            raw.seek(0)
            write_listing(raw, lines)
            lines.seek(0)
            got = sorted(lines.read().decode("ascii").splitlines())
    want = [("d", "dir", 0), ("d/f", "file", 3), ("l", "symlink", 3), ("n\nx", "file", 5), ("p", "fifo", 0)]
    assert got == sorted(line_of(*entry) for entry in want)


def test_X2_the_host_digests_the_stream_into_a_sandbox_once() -> None:
    """``restore_bank`` digests the stream once (``FramedStream``'s): the canonical writer takes none."""
    import hashlib
    import types

    from scratchbank.adapters import restore_wire
    from scratchbank.application.bank_format import writer

    hashed = {"framing": 0, "writer": 0}

    def counting(who: str) -> types.SimpleNamespace:
        def algorithm(name: str) -> type:
            class Counted:
                def __init__(self, **options: bool) -> None:
                    self._h = hashlib.new(name, **options)

                def update(self, data: bytes) -> None:
                    hashed[who] += len(data)
                    self._h.update(data)

                def hexdigest(self) -> str:
                    return self._h.hexdigest()

            return Counted

        return types.SimpleNamespace(sha256=algorithm("sha256"), md5=algorithm("md5"))

    with pytest.MonkeyPatch.context() as patch, rig("local") as box:
        patch.setattr(restore_wire, "hashlib", counting("framing"))
        patch.setattr(writer, "hashlib", counting("writer"))
        out = restore(gz(files("a/new", "top") + end()), box.sandbox)
        assert out.proceeds, out
    assert hashed["framing"] > 0 and hashed["writer"] == 0, hashed
