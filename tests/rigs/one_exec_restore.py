"""A restore in one exec on every transport, counted, with a listing that drops a member.

First written for tests/rules/test_X_restore_one_exec_engines.py: A restore into a scripted sandbox
is ONE exec (issue 14): the script stages the bank, lists the staged tree, waits on stdin for the
host's verdict and commits or discards. Every guarantee of the two-phase restore holds in it: until
the host answers with the directory modes, the scratch is byte for byte as it was, and a discard (a
listing that is not the manifest, a host that failed while deciding, an exec that ended before the
verdict) leaves nothing staged beside it (X2, X4)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

import attrs
import pytest

from rigs.real_sandboxes import KeptContainers, Rig
from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.scripted import Exec, ScriptedSandbox
from scratchbank.application.ports import Decide, StagedRestore

ENGINES = ["local", "docker-busybox", "docker-gnu", "podman-busybox", "k8s-double"]


@pytest.fixture(params=ENGINES)
def box(request: pytest.FixtureRequest, kept_containers: KeptContainers) -> Iterator[Rig]:
    """A fresh scratch in the module's kept container (a restore breaks nothing else)."""
    with kept_containers.rig(request.param) as r:
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


# -- the stream end to end (issue 24): the sandbox counts the frames and digests what it read --
def _stage(box: Rig, source: str, stdin: bytes) -> Any:
    from scratchbank.adapters.scripted import RESTORE

    try:
        return box.sandbox.run(
            source + RESTORE, ["stage", box.scratch, "once", "raw", "0"], stdin=io.BytesIO(stdin)
        )
    finally:
        box.sandbox.run(RESTORE, ["discard", box.scratch, "once"])
