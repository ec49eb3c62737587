"""The staged restore on every kind of sandbox (fake, local, Docker): a canonical bank and its staged
listing.

First written for tests/rules/test_X_escape_staged_contract_engines.py: The staged restore protocol
of the Sandbox port, one contract for the fake and the real sandboxes alike (X2): stage without
touching the scratch, list the staged tree (implicit parents too), discard or commit, refuse what
tar cannot read or what does not fit."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from rigs.real_sandboxes import rig
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.bank_format.members import DIR, FILE, SYMLINK, Member
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.application.ports import Sandbox

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
