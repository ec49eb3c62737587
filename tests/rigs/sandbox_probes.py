"""Probes into a real sandbox: a writer that grows a file, frozen or running processes, a canonical
archive restored as a user.

First written for tests/test_sandboxes.py: The sandbox adapters and their in-sandbox scripts,
against real engines (T11-T18, X2)."""

from __future__ import annotations

import io

import pytest
from waiting import eventually

from rigs.real_sandboxes import ENGINES, KeptContainers, Rig, rig
from scratchbank.adapters.scripted import RESTORE as RESTORE_SCRIPT
from scratchbank.application.bank_format.reader import TarReader
from scratchbank.application.bank_format.spill_log import Manifest, manifest_lines
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import RestoreRefused, StreamBroken


def size_of(r: Rig, path: str) -> int:
    return int(r.sh(f"wc -c < {path}").strip())


# Every task (thread) of every process whose command line names ``$1``, but this shell's:
# one line "<pid> <tid> <state> <ppid>" each (the state follows the ") " that ends the comm).
_STATES = (
    'for t in /proc/[0-9]*/task/[0-9]*; do p=${t#/proc/}; p=${p%%/*}; [ "$p" = "$$" ] && continue; '
    'grep -qsF -- "$1" /proc/$p/cmdline || continue; '
    "{ read -r l < $t/stat; } 2>/dev/null || continue; "
    's=${l##*) }; pp=${s#* }; echo "$p ${t##*/} ${s%% *} ${pp%% *}"; done; true'
)


def running(r: Rig, marker: str) -> list[str]:
    """The tasks (threads) of the processes whose command line names ``marker`` (a writer's
    file or script) that are neither stopped (T) nor gone: "<pid> <tid> <state> <ppid>".
    A task blocked in the kernel (D) on a stopped child counts as stopped: a shell that
    vforked waits there until its child, stopped before its exec, runs again."""
    tasks = [t.split() for t in r.sh(f"set -- '{marker}'; {_STATES}", check=False).splitlines()]
    tasks = [t for t in tasks if len(t) == 4]
    stopped = ("T", "t", "Z", "X")
    parents = {t[3] for t in tasks if t[2] in stopped}
    return [" ".join(t) for t in tasks if t[2] not in stopped and not (t[2] == "D" and t[0] in parents)]


def frozen(r: Rig, marker: str) -> bool:
    """Every process whose command line names ``marker`` is stopped or gone, each of its
    threads included: a state read, not a timed window."""
    return running(r, marker) == []


def grows(r: Rig, path: str) -> None:
    """Waits until ``path`` grows (a writer running again), failing by name past a bound."""
    before = size_of(r, path)
    eventually(lambda: size_of(r, path) > before, what=f"{path} grows", interval=0.1)


def wait_until_written(r: Rig, path: str, seconds: float = 60) -> None:
    eventually(
        lambda: r.sh(f"test -s {path} && echo yes", check=False).strip() == "yes",
        timeout=seconds,
        what=f"a writer writes {path}",
    )


def writer(r: Rig, name: str = "grow") -> str:
    path = f"{r.scratch}/{name}"
    r.sh(f"mkdir -p {r.scratch}")
    r.spawn(f"while :; do echo 0123456789 >> {path}; sleep 0.01; done")
    wait_until_written(r, path)
    return path


@pytest.fixture(params=ENGINES)
def any_rig(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A fresh sandbox of every engine, for a test that breaks it (kills, quiesce, floods)."""
    with rig(request.param) as r:
        yield r


@pytest.fixture(params=ENGINES)
def kept_rig(request: pytest.FixtureRequest, kept_containers: KeptContainers):  # type: ignore[no-untyped-def]
    """A fresh scratch of every engine, the containers kept for the module (``KeptContainers``)."""
    with kept_containers.rig(request.param) as r:
        yield r


def _members(tar: bytes):  # type: ignore[no-untyped-def]
    reader = TarReader()
    reader.feed(tar)
    reader.close()
    return reader.members


def _canonical(archive: bytes, *, gz: bool) -> tuple[bytes, str, list[str]]:
    from scratchbank.application.bank_format.gunzip import GzipReader

    out = io.BytesIO()
    writer_ = CanonicalWriter(out)
    reader = TarReader(on_member=writer_.member, on_data=writer_.data)
    if gz:
        gzr = GzipReader(reader.feed, 1 << 30)
        gzr.feed(archive)
        gzr.close()
    else:
        reader.feed(archive)
    reader.close()
    sha = writer_.finish()
    assert Manifest.of(reader.members).entries == len(manifest_lines(reader.members))
    return out.getvalue(), sha, manifest_lines(reader.members)


def _one_file_archive(data: bytes) -> tuple[bytes, str]:
    from scratchbank.application.bank_format.members import DIR, FILE, Member

    out = io.BytesIO()
    w = CanonicalWriter(out)
    w.member(Member("", DIR, 0, 0o755, 0))
    w.member(Member("f", FILE, len(data), 0o644, 0))
    w.data(data)
    sha = w.finish()
    return out.getvalue(), sha


def _with_scratch(facts, scratch: str):  # type: ignore[no-untyped-def]
    import attrs

    return attrs.evolve(facts, scratch=scratch)


def _restore(sandbox, canonical: bytes, *, cut: int | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """Stage then commit, as the restore use case does; a cut stream sends a wrong end frame."""
    from scratchbank.adapters.restore_wire import FramedStream

    listing = io.BytesIO()
    if cut is None:
        staged = sandbox.stage_restore(io.BytesIO(canonical), compressed=False, listing=listing)
    else:
        framed = FramedStream(io.BytesIO(canonical)).read()
        broken = framed[: cut + 8] + b"end %d %s\n" % (len(canonical), b"0" * 64)
        done = sandbox.run(
            RESTORE_SCRIPT, ["stage", sandbox.facts.scratch, "cut", "raw", "0"], stdin=io.BytesIO(broken)
        )
        if done.exit_code == 20:
            raise StreamBroken(done.err)
        raise AssertionError(f"expected a broken stream, got exit {done.exit_code}: {done.err}")
    sandbox.commit_restore(staged)
    return sorted(listing.getvalue().decode().splitlines())


def _restore_as(r: Rig, user: str, canonical: bytes, sha: str) -> None:
    from scratchbank.adapters.restore_wire import TAR_REFUSED, FramedStream
    from scratchbank.adapters.scripted import RESTORE

    done = r.sandbox.run(
        RESTORE,
        ["stage", r.sandbox.facts.scratch, "as-user", "raw", "0"],
        stdin=FramedStream(io.BytesIO(canonical)),  # type: ignore[arg-type]
        user=user,
    )
    if done.exit_code == TAR_REFUSED:
        raise RestoreRefused(done.err)
    raise AssertionError(f"expected a refusal, got exit {done.exit_code}: {done.err}")
