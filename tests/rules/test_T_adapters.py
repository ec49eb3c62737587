"""Rules T: teardown: banking the scratch when a sandbox stops. The adapters tier's tests of T1, T2,
T6, T8, T20 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from hostile import end, gz, member, pax_header, pax_payload, ustar
from rigs.host_archive import (
    CODECS,
    NoSleep,
    full_tmpdir,  # noqa: F401 - a fixture
    raw_tar,
    stream,
)
from rigs.long_timelines import TAIL, long_run_refusing_whole_reads, long_run_with_tail
from rigs.many_members import _read
from rigs.resume_world import FILES, World
from rigs.tar_reader import read, with_pax

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryTimeline
from scratchbank.application.bank_format.gzip_codec import GzipCodec
from scratchbank.application.bank_format.host_archive import BATCH, HostArchive
from scratchbank.application.bank_format.reader import Limits
from scratchbank.application.recording import Claim
from scratchbank.application.resume import resume
from scratchbank.application.teardown import Budgets, _Checked, _first_read, _replan, bank_at_teardown
from scratchbank.domain import ResumeRequest, fold
from scratchbank.domain.errors import ArchiveFailed, HostArchiveFailed, HostileArchive
from scratchbank.testing.builders import node, started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_[TX]*.py: The reader's grammar (issue 10, Build 1): every header field read with a range, PAX records on an allow-list, a reader that only moves forward, and one boundary where any parse failure becomes a named refusal (X2 on the host, T6 at bank time).


# -- PAX mtime: out of range was an OverflowError that escaped (issue 10 hole 3) ----------
@pytest.mark.parametrize(
    ("mtime", "says"),
    [
        ("1e400", "bad PAX mtime"),
        ("inf", "bad PAX mtime"),
        ("99999999999999999999", "out of range"),
        ("-5", "out of range"),
    ],
)
def test_T6_an_out_of_range_pax_mtime_is_a_named_refusal(mtime: str, says: str) -> None:
    """An out of range pax mtime is a named refusal:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match=says):
        read(with_pax([("mtime", mtime)]))


def test_T6_at_bank_time_such_a_bank_is_refused_by_name_not_raised(tmp_path: object) -> None:
    """HostArchive (teardown) gets a named refusal, so the teardown still records (T6)."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    sink = HostArchive(tmp_path / "bank.tgz", gzipped_input=True, gzip_level=1, cap=1 << 20)
    sink.write(gz(with_pax([("mtime", "1e400")])))
    facts = sink.finish()
    assert facts.manifest is None and "bad PAX mtime" in facts.refused


# ---- from tests/test_host_archive.py: The bank as it arrives on the host (T2, T20, X2, ADR 0003): compressed, hashed, written and checked in lanes beside the stream, in the gzip format any tar opens, whichever codec wrote it.


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.library}-{c.level}")
def test_T2_a_raw_stream_is_stored_as_one_gzip_any_gunzip_opens_with_its_digest(
    tmp_path: Path, codec: GzipCodec
) -> None:
    """What the host file holds is one gzip of exactly the tar sent, and the facts describe that file.
    Proves ``scratchbank.application.bank_format.host_archive.HostArchive``."""
    raw = raw_tar()
    assert len(raw) > 2 * BATCH
    facts = stream(
        HostArchive(tmp_path / "b.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30, codec=codec), raw
    )
    stored = (tmp_path / "b.tgz").read_bytes()
    assert gzip.decompress(stored) == raw
    assert facts.bytes == len(stored)
    assert facts.sha256 == hashlib.sha256(stored).hexdigest()
    assert facts.manifest is not None and facts.manifest.entries == 40
    assert facts.refused == ""


def test_T2_a_sandbox_gzipped_stream_is_stored_byte_for_byte(tmp_path: Path) -> None:
    """compress_in_sandbox: the host stores what it was sent and checks it through gunzip.
    Proves ``scratchbank.application.bank_format.host_archive.HostArchive``."""
    sent = gzip.compress(raw_tar(), compresslevel=6)
    facts = stream(HostArchive(tmp_path / "b.tgz", gzipped_input=True, gzip_level=1, cap=1 << 30), sent)
    assert (tmp_path / "b.tgz").read_bytes() == sent
    assert facts.sha256 == hashlib.sha256(sent).hexdigest()
    assert facts.manifest is not None and facts.manifest.entries == 40


def test_T20_past_the_cap_the_host_counts_the_whole_archive_but_writes_no_more(tmp_path: Path) -> None:
    """The cap is judged on the whole compressed size; the file stops growing at the cap.
    Proves ``scratchbank.application.bank_format.host_archive.HostArchive``."""
    raw = raw_tar(files=30, size=200_000)
    whole = stream(HostArchive(tmp_path / "a.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30), raw)
    cap = whole.bytes // 3
    capped = stream(HostArchive(tmp_path / "c.tgz", gzipped_input=False, gzip_level=1, cap=cap), raw)
    assert capped.bytes == whole.bytes
    assert capped.sha256 == whole.sha256
    assert (tmp_path / "c.tgz").stat().st_size <= cap


def test_T8_a_host_file_that_cannot_be_written_is_named_and_the_stream_still_drains() -> None:
    """/dev/full refuses every write (ENOSPC): write() keeps taking the stream, finish() names it."""
    sink = HostArchive(Path("/dev/full"), gzipped_input=False, gzip_level=1, cap=1 << 30)
    raw = raw_tar(files=60, size=100_000)
    for i in range(0, len(raw), 65_536):
        sink.write(raw[i : i + 65_536])  # never raises: a transport must drain its stream
    with pytest.raises(HostArchiveFailed) as caught:
        sink.finish()
    assert caught.value.code == "HOST_ARCHIVE_FAILED"
    assert isinstance(caught.value, ArchiveFailed)  # so banking tries again (T8)
    assert "No space left" in caught.value.message


def test_T8_a_host_out_of_temporary_space_retries_then_records_why_and_keeps_the_earlier_bank(
    full_tmpdir: Path, tmp_path: Path
) -> None:
    """HOST_ARCHIVE_FAILED is tried again within the budget, recorded by name, and stores nothing.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    import os

    store = FilesystemBankStore(tmp_path / "banks")
    earlier = tmp_path / "earlier.tgz"
    earlier.write_bytes(gzip.compress(raw_tar(files=2)))
    name = store.put("run-1", earlier, sha256=hashlib.sha256(earlier.read_bytes()).hexdigest())
    before = hashlib.sha256(store.path("run-1", name).read_bytes()).hexdigest()
    timeline = InMemoryTimeline()
    timeline.append("run-1", [started()])
    box = FakeSandbox({"noise.bin": os.urandom(512 << 10)})
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=box, run_finished=False, clock=NoSleep()
    )
    assert not report.record.banked
    assert "could not keep the archive" in report.record.reason
    assert len(report.tries) == Budgets().bank_tries
    assert hashlib.sha256(store.path("run-1", name).read_bytes()).hexdigest() == before


# ---- from tests/rules/test_[TX]*.py: Issue 14 (X2, T6): the member cap is what a user may bank (2M: a million tiny files fits); the host's guard is the member log's temp-disk budget (``Limits.member_log_bytes``), refused by name before the temp disk fills, at bank time and at restore time alike.


def test_T6_implicit_parents_count_against_the_member_log_budget() -> None:
    """Few members, each under 126 parents of its own: the implicit parents' rows fill the
    log, not the member count; the budget refuses them by name.
    Proves ``scratchbank.application.bank_format.reader.TarReader``."""
    deep = b"".join(
        pax_header(pax_payload([("path", f"x{i:06d}" + ("/" + "c" * 30) * 126 + "/f")])) + ustar(member("f"))
        for i in range(400)
    )
    with pytest.raises(HostileArchive, match="temp-disk budget"):
        _read(iter([deep + end()]), Limits(member_log_bytes=1 << 20))
    accepted = _read(iter([deep + end()]), Limits())
    assert accepted.log.count == 400
    accepted.log.close()


# ---- from tests/test_resume_use_case.py: The resume and restore use cases end to end, with fakes (R and X rules).


def test_T6_X1_records_carry_the_time_of_the_clock_the_engine_gave() -> None:
    """Records carry the time of the clock the engine gave:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    clock = ManualClock()
    clock.advance(90)
    bank_at_teardown(
        "run-1",
        timeline=w.timeline,
        store=w.store,
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    clock.advance(30)
    resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=FakeSandbox({}), clock=clock)
    banked_rec, resumed_rec, restored_rec = w.timeline.read("run-1")[-3:]
    assert banked_rec.at == ManualClock.EPOCH + timedelta(seconds=90)
    assert resumed_rec.at == restored_rec.at == ManualClock.EPOCH + timedelta(seconds=120)
    assert banked_rec.at.tzinfo is not None


# ---- from tests/test_snapshots.py: Snapshots of the fold on the event store: same decisions, faster on long histories.


def test_T1_the_teardowns_plan_reads_the_snapshot_and_the_tail_only(tmp_path: Path) -> None:
    """The teardown's plan on a long run with a snapshot: records read <= tail + a constant.
    Proves ``scratchbank.domain.objects.object_name``."""
    timeline, _, _, _ = long_run_with_tail(tmp_path)
    notes: list[str] = []
    first = _first_read(timeline, "run-1", None, Budgets(), ManualClock(), notes, snapshots=timeline)
    assert timeline.handed <= TAIL + 2
    records = timeline.read("run-1")
    assert first.state == fold(records) and first.claim is not None
    assert first.claim.position == len(records) and notes == []
    assert first.mine is not None and first.mine.label == f"@{len(records) - TAIL}"


def test_T8_a_conflict_is_planned_again_on_the_snapshot_and_the_tail(tmp_path: Path) -> None:
    """_replan after a conflict: snapshot + tail, and the claim it plans at is the run's length.
    Proves ``scratchbank.application.teardown._first_read``."""
    timeline, _, _, _ = long_run_refusing_whole_reads(tmp_path)
    first = _first_read(timeline, "run-1", None, Budgets(), ManualClock(), [], snapshots=timeline)
    assert first.claim is not None
    checked = _Checked(timeline, "run-1", first.claim, first.mine, None, snapshots=timeline)
    timeline.append("run-1", [node("late", "tool")])
    timeline.handed = 0
    claim, lost = _replan(timeline, first.claim, FakeSandbox({"f": b"x"}), False, checked)
    assert lost == "" and claim == Claim("run-1", first.claim.position + 1)
    assert timeline.handed <= 2 * (TAIL + 2)


def test_T1_a_whole_teardown_on_a_long_run_never_reads_it_whole(tmp_path: Path) -> None:
    """bank_at_teardown on a run with a snapshot: plan, checks, record and prune on snapshot + tail."""
    timeline, store, _, _ = long_run_refusing_whole_reads(tmp_path)
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox({"f": b"the scratch"}),
        run_finished=False,
        clock=ManualClock(),
        snapshots=timeline,
    )
    assert report.recorded, report.notes
    assert timeline.handed <= 4 * (TAIL + 4)


def test_T11_a_local_sandboxs_first_command_sees_its_own_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The namespace is ready only once its init runs: unshare mounts the namespace's /proc in
    its child before the exec, and a command entered between the two saw the host's /proc (a
    quiesce then refused the sandbox as the host's PID namespace). An unshare slow to mount
    (a shim: the same steps, a pause before the mount) shows it every time.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox``."""
    real = shutil.which("unshare")
    if real is None or not Path("/proc/self/ns/pid").exists():
        pytest.skip("no unshare here")
    shim = tmp_path / "bin" / "unshare"
    shim.parent.mkdir()
    shim.write_text(
        f"#!/bin/sh\nexec {real} --pid --fork --mount --propagation private --kill-child "
        "sh -c 'sleep 0.3; mount -t proc proc /proc && exec sleep infinity'\n"
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    sandbox = LocalSandbox()
    try:
        assert sandbox.facts.process_isolated, sandbox.facts  # its own namespace, through the shim
        assert sandbox.run("cat /proc/1/cmdline", []).stdout.split(b"\0")[:2] == [b"sleep", b"infinity"]
    finally:
        sandbox.destroy()
