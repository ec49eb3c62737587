"""A restore into a real sandbox (local, Docker BusyBox and GNU) from raw bank bytes, and the scratch's
fingerprint before and after.

First written for tests/rules/test_X_engines.py: X2/X4 in real sandboxes: the restore stages, lists
NUL-separated, compares on the host and only then moves into place; every refusal leaves the scratch
byte for byte as it was, with nothing staged left behind (issue 10 hole 4), on BusyBox and GNU
userlands (Docker) and the local sandbox."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import attrs
import pytest
from hostile import member, record_for, ustar

from rigs.real_sandboxes import KeptContainers, Rig
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import ByteSink, Sandbox, StagedRestore
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.domain import ResumeRequest
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started

RIGS = ["local", "docker-busybox", "docker-gnu"]


SEED = "rm -rf {s}; mkdir -p {s}/keep && echo mine > {s}/keep/file && ln -s keep/file {s}/link && chmod 700 {s}/keep"


@pytest.fixture(params=RIGS)
def box(request: pytest.FixtureRequest, kept_containers: KeptContainers) -> Iterator[Rig]:
    """A fresh scratch in the module's kept container (a restore breaks nothing else)."""
    with kept_containers.rig(request.param) as r:
        yield r


def fingerprint(r: Rig) -> str:
    """The scratch byte for byte (names, modes, sizes, times, contents, link targets), and
    anything staged beside it."""
    s = r.scratch
    listing = r.sh(
        f"cd {s} && find . -exec stat -c '%n|%a|%s|%Y|%F' {{}} + | sort && "
        "find . -type f -exec sha256sum {} + | sort && find . -type l -exec readlink {} + | sort",
        check=False,
    )
    return listing + "staged:" + r.beside()


def restore(data: bytes, sandbox: Sandbox) -> ResumeOutcome:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-s", [started(), record])
    store.banks["run-s"] = data
    return resume("run-s", ResumeRequest(), timeline=timeline, store=store, sandbox=sandbox)


def reason(out: ResumeOutcome) -> str:
    assert out.restore is not None and out.restore.park is not None, out
    return out.restore.record.reason


def files(*names: str, size: int = 3) -> bytes:
    return b"".join(ustar(member(n, size=size), b"abc"[:size]) for n in names)


@attrs.define
class LosesAnEntry:
    """A real sandbox whose tar silently dropped one entry (a decorator of the port)."""

    inner: Sandbox

    @property
    def facts(self):  # type: ignore[no-untyped-def]
        return self.inner.facts

    def stage_restore(
        self, src: BinaryIO, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        full = io.BytesIO()
        staged = self.inner.stage_restore(src, compressed=compressed, listing=full, need_bytes=need_bytes)
        listing.write(b"".join(full.getvalue().splitlines(keepends=True)[1:]))
        return staged

    def commit_restore(
        self, staged: StagedRestore, *, dir_modes: Iterable[tuple[str, int]] = ()
    ) -> str | None:
        return self.inner.commit_restore(staged, dir_modes=dir_modes)

    def discard_restore(self, staged: StagedRestore) -> None:
        self.inner.discard_restore(staged)
