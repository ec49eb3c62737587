"""A restore into a scripted sandbox is ONE exec (issue 14): the script stages the bank,
lists the staged tree, waits on stdin for the host's verdict and commits or discards.
Every guarantee of the two-phase restore holds in it: until the host answers with the
directory modes, the scratch is byte for byte as it was, and a discard (a listing that
is not the manifest, a host that failed while deciding, an exec that ended before the
verdict) leaves nothing staged beside it (X2, X4)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

import attrs
import pytest
from hostile import end, gz
from rigs import Rig, rig
from test_escape_sandbox import SEED, files, fingerprint, reason, restore

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.scripted import Exec, ScriptedSandbox
from scratchbank.application.ports import Decide, RestoresInOneExec, StagedRestore
from scratchbank.domain.errors import StreamBroken

ENGINES = ["local", "docker-busybox", "docker-gnu", "podman-busybox", "k8s-double"]


@pytest.fixture(params=ENGINES)
def box(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with rig(request.param) as r:
        yield r


@attrs.define
class Counted:
    """The rig's sandbox, counting the execs it runs."""

    inner: ScriptedSandbox
    execs: list[str] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        execute = self.inner.execute

        def counted(exec_: Exec) -> ExecResult:
            self.execs.append(exec_.args[0] if exec_.args else "?")
            return execute(exec_)

        self.inner.execute = counted  # type: ignore[method-assign]


@attrs.define
class DropsFromListing:
    """A real sandbox whose tar silently dropped an entry: the listing the host is shown
    misses its first line (a decorator of the one-exec port)."""

    inner: ScriptedSandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def restore_in_one_exec(
        self, src: BinaryIO, *, compressed: bool, need_bytes: int, decide: Decide, entries: int | None = None
    ) -> str | None:
        def lossy(staged: StagedRestore, listing: BinaryIO) -> Any:
            return decide(staged, io.BytesIO(b"".join(listing.read().splitlines(keepends=True)[1:])))

        return self.inner.restore_in_one_exec(
            src, compressed=compressed, need_bytes=need_bytes, decide=lossy, entries=entries
        )


def test_X2_a_restore_into_a_scripted_sandbox_is_one_exec(box: Rig) -> None:
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
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)
    counted = Counted(box.sandbox)
    out = restore(gz(files("a/new", "top") + end()), DropsFromListing(box.sandbox))  # type: ignore[arg-type]
    assert "refused_in_sandbox" in reason(out) and "partial restore" in reason(out), reason(out)
    assert counted.execs == ["stage"], counted.execs
    assert fingerprint(box) == before


def test_X4_a_host_that_fails_while_deciding_discards_and_says_why(box: Rig) -> None:
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


# -- one pass over the stream (issue 24): the sandbox counts frames, the host digests --------
def _stage(box: Rig, source: str, stdin: bytes) -> Any:
    from scratchbank.adapters.scripted import RESTORE

    try:
        return box.sandbox.run(
            source + RESTORE, ["stage", box.scratch, "once", "raw", "0"], stdin=io.BytesIO(stdin)
        )
    finally:
        box.sandbox.run(RESTORE, ["discard", box.scratch, "once"])


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_X2_the_stage_reads_the_stream_once_without_a_digest_pass(engine: str) -> None:
    """A sha256sum that fails (a stub first on PATH): the stage still stages the bank."""
    import hashlib

    from scratchbank.adapters.restore_wire import FramedStream

    with rig(engine) as box:
        stubs = f"$(dirname {box.scratch})/.stubs"
        box.sh(
            f"mkdir -p {stubs} && for b in sha256sum; do printf '#!/bin/sh\\ncat >/dev/null; exit 97\\n' >{stubs}/$b; chmod +x {stubs}/$b; done"
        )
        tar = files("x") + end()
        done = _stage(box, f'PATH="{stubs}:$PATH"\n', FramedStream(io.BytesIO(tar)).read())
        assert done.exit_code == 0, done.err
        assert done.stdout.startswith(
            b"scratchbank-staged %d %s\n" % (len(tar), hashlib.sha256(tar).hexdigest().encode())
        )


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_X2_a_frame_repeated_on_the_way_is_a_broken_stream(engine: str) -> None:
    """A whole frame sent twice (the end frame right): received is not the count sent, exit 20."""
    from scratchbank.adapters.restore_wire import STREAM_BROKE, FramedStream

    with rig(engine) as box:
        framed = FramedStream(io.BytesIO(files("x") + end())).read()
        first = framed[: framed.index(b"end ")]
        done = _stage(box, "", first + framed)
        assert done.exit_code == STREAM_BROKE, done.err
        assert "received" in done.err
