"""X2/X4 in real sandboxes: the restore stages, lists NUL-separated, compares on the host
and only then moves into place; every refusal leaves the scratch byte for byte as it
was, with nothing staged left behind (issue 10 hole 4), on BusyBox and GNU userlands
(Docker) and the local sandbox."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import attrs
import pytest
from hostile import end, gz, member, record_for, ustar
from rigs import Rig, rig

from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import ByteSink, Sandbox, StagedRestore
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.domain import RestoreResult, ResumeRequest
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started

RIGS = ["local", "docker-busybox", "docker-gnu"]
SEED = "rm -rf {s}; mkdir -p {s}/keep && echo mine > {s}/keep/file && ln -s keep/file {s}/link && chmod 700 {s}/keep"


@pytest.fixture(params=RIGS)
def box(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with rig(request.param) as r:
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


def test_X4_every_refusal_leaves_the_scratch_byte_for_byte_as_it_was(box: Rig) -> None:
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)
    many = files(*(f"d/f{i}" for i in range(200)))
    cases = {
        # valid members streamed first, then one the host refuses: the staging is discarded
        "refused on the host mid-stream": (
            gz(many + files("../escape") + end()),
            box.sandbox,
            "refused_on_host",
        ),
        "a corrupt gzip trailer": (gz(files("a") + end())[:-8] + b"\x00" * 8, box.sandbox, "refused_on_host"),
        "a partial restore": (gz(files("a", "b") + end()), LosesAnEntry(box.sandbox), "partial restore"),
    }
    for name, (data, sandbox, says) in cases.items():
        out = restore(data, sandbox)  # type: ignore[arg-type]
        assert says in reason(out), (name, reason(out))
        assert fingerprint(box) == before, name


def test_X4_a_tar_refusal_in_the_sandbox_leaves_the_scratch_as_it_was() -> None:
    with rig("docker-busybox", tmpfs={"/tmp/full": "size=256k"}) as r:
        r.sandbox.facts = attrs.evolve(r.sandbox.facts, scratch="/tmp/full/scratch")
        r.scratch = "/tmp/full/scratch"
        r.sh(SEED.format(s=r.scratch))
        before = fingerprint(r)
        big = ustar(member("big", size=400_000), bytes(range(256)) * 1562 + b"x" * 128)
        assert "refused_in_sandbox" in reason(restore(gz(big + end()), r.sandbox))
        assert fingerprint(r) == before


def test_X2_names_with_a_newline_and_any_byte_restore_and_list(box: Rig) -> None:
    names = ["new\nline", "tab\there", "back\\slash", "bytes-\udcff\udcfe", "sp ace", "dash-start"]
    raw = ustar(member("./", tarfile.DIRTYPE)) + b"".join(
        member(n, size=1).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + b"z" + b"\x00" * 511
        for n in names
    )
    out = restore(gz(raw + end()), box.sandbox)
    assert out.proceeds, out
    listed = box.sandbox.list_scratch()
    assert sorted(json.loads(line)[0] for line in listed) == sorted(names)


def test_X2_the_old_scratch_goes_after_the_commit_and_leftovers_at_the_next_stage(box: Rig) -> None:
    """The commit swaps the new tree in and removes the old one after the exec (the
    resume does not wait for it); an old tree a stopped sandbox left beside the scratch
    (``.scratchbank-staged.*.old``, read-only inside as a module cache is) is removed by
    the next restore's stage. Nothing of either stays, and the scratch is the bank's."""
    s = box.scratch
    box.sh(SEED.format(s=s))
    left = f"$(dirname {s})/.scratchbank-staged.dead.old"
    box.sh(f"mkdir -p {left}/ro && echo old > {left}/ro/f && chmod 555 {left}/ro")
    out = restore(gz(files("a/new", "top") + end()), box.sandbox)
    assert out.proceeds, out
    assert box.beside() == "0"
    assert box.sh(f"cat {s}/a/new") == "abc" and box.sh(f"ls {s}") == "a\ntop\n"


def test_X2_implicit_parent_directories_are_accepted(box: Rig) -> None:
    out = restore(gz(files("a/b/c/deep", "a/x", "top") + end()), box.sandbox)
    assert out.proceeds, out
    assert box.sh(f"cat {box.scratch}/a/b/c/deep") == "abc"


def test_X6_a_host_backed_scratch_holds_links_out_but_nothing_on_the_host_follows_them(
    tmp_path: Path,
) -> None:
    """In a sandbox links out are allowed by design: only the sandbox's tar creates them,
    and the host reads the staged tree as a listing, never through a link."""
    host = tmp_path / "scratch"
    host.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("untouched")
    volumes = {str(tmp_path): {"bind": "/tmp/hostdir", "mode": "rw"}}
    with rig("docker-busybox", volumes=volumes) as r:
        r.sandbox.facts = attrs.evolve(r.sandbox.facts, scratch="/tmp/hostdir/scratch")
        raw = ustar(member("./", tarfile.DIRTYPE)) + ustar(
            member("out", tarfile.SYMTYPE, linkname="../outside")
        )
        raw += ustar(member("abs", tarfile.SYMTYPE, linkname=str(outside / "secret"))) + files("f")
        out = restore(gz(raw + end()), r.sandbox)
        assert out.proceeds, out
    assert (host / "out").is_symlink() and (host / "f").read_bytes() == b"abc"
    assert (
        sorted(p.name for p in outside.iterdir()) == ["secret"]
        and (outside / "secret").read_text() == "untouched"
    )


def test_X2_thousands_of_long_names_list_exactly_on_busybox() -> None:
    """BusyBox's `xargs -0` splits names at its buffer boundaries; the listing must not."""
    names = [f"d{i % 40}/a-rather-long-file-name-to-fill-buffers-{i:05d}.json" for i in range(3000)]
    with rig("docker-busybox") as r:
        out = restore(gz(files(*names, size=1) + end()), r.sandbox)
        assert out.proceeds, out
        listed = [json.loads(line)[0] for line in r.sandbox.list_scratch()]
    assert sorted(p for p in listed if "/" in p) == sorted(names)


def test_X2_the_canonical_stream_may_go_gzip_level_1(box: Rig) -> None:
    """For a slow transport: the same staged restore over a gzip'd canonical stream."""
    from scratchbank.application.restore import restore_bank
    from scratchbank.application.resume import check_resume

    data = gz(files("z/one", "two") + end())
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-z", [started(), record])
    store.banks["run-z"] = data
    decision = check_resume(timeline, "run-z", ResumeRequest())
    attempt = restore_bank("run-z", decision, store=store, sandbox=box.sandbox, gzip_level=1)
    assert attempt.result is RestoreResult.RESTORED, attempt
    assert box.sh(f"cat {box.scratch}/z/one {box.scratch}/two") == "abcabc"


@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X1_directory_modes_are_restored_as_banked_in_a_non_root_sandbox(flavour: str) -> None:
    """The stream carries directories u+rwx (a non-root tar must fill them) and commit
    applies the banked modes deepest first: a 0555 directory holding a file, a 0500 one
    under it and a name with a space and a newline all end with their banked modes."""
    with rig(f"docker-{flavour}", user="1000") as r:
        r.sh(f"mkdir -p {r.scratch} && chown -R 1000 {r.scratch}")
        raw = (
            ustar(member("./", tarfile.DIRTYPE, mode=0o755))
            + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
            + ustar(member("ro/in ner\n", tarfile.DIRTYPE, mode=0o500))
            + ustar(member("ro/in ner\n/f", size=1, mode=0o444), b"z")
            + ustar(member("ro/g", size=1, mode=0o644), b"y")
            + end()
        )
        out = restore(gz(raw), r.sandbox)
        assert out.proceeds, out.restore.record.reason if out.restore else out
        modes = r.sh(f"cd {r.scratch} && stat -c '%a' ro ro/in*").split()
        assert modes == ["555", "500"]
        assert r.sh(f"cat {r.scratch}/ro/g") == "y"
