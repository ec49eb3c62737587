"""Rules X: restoring the bank into the new sandbox. The adapters tier's tests of X1, X2, X3, X4, X5,
X6, X7 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
import threading
import types
import zlib
from pathlib import Path
from typing import Any

import pytest
from hostile import corpus, end, gz, member, pax_header, pax_payload, set_field, ustar
from hypothesis import given, settings
from hypothesis import strategies as st
from rigs.delivery_timelines import _NoSandboxes
from rigs.host_archive import stream
from rigs.host_directory_restore import (
    CHAIN,
    _bank,
    outer,  # noqa: F401 - a fixture
    refused,
    restore_into,
    root_dir,
    tree_digest,
)
from rigs.landed_records import FILES, RestoreRecordFails, parked, restored_records
from rigs.many_members import OLD_CAP, _empty_files, _read
from rigs.resume_world import ACCEPT, RESTORE_STEPS, FaultySandbox, FaultyStore, World, _failing_fetch
from rigs.tar_reader import (
    FIELDS,
    HARMLESS,
    _block,
    _Buggy,
    _many,
    _peak_while_reading,
    canonical,
    read,
    with_pax,
)
from runner_rigs import RecordingInbound, make_rig

from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.memory import FakeSandbox, InMemoryTimeline
from scratchbank.adapters.present import outcome_data, outcome_text
from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.host_archive import HostArchive
from scratchbank.application.bank_format.listing import load_listing
from scratchbank.application.bank_format.manifest_line import parse_line
from scratchbank.application.bank_format.members import Member
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.spill_log import DEFAULT_BUDGET, MemberLog
from scratchbank.application.bank_format.tar_header import DROPPED_PAX_KEYS, USED_PAX_KEYS
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.resume import resume
from scratchbank.application.runner import Handled
from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    RestoreAttempt,
    RestoreResult,
    ResumeRequest,
    Verdict,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.domain.errors import (
    HostileArchive,
    StreamBroken,
    TimelineWriteFailed,
    UnreadableArchive,
)
from scratchbank.domain.records import AttemptQueued, RunResumed, RunStarted, ScratchRestored
from scratchbank.testing.builders import banked, node, started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_X_adapters.py: X6: a bank restored into a host directory never changes anything outside it, whatever its bytes (issue 10 holes 1-3), through the public ``resume()`` with a faithfully recorded bank (real size, SHA-256 and manifest digest).


# -- hole 1: a negative PAX size moved the reader backwards -------------------------------------
def test_X6_a_negative_pax_size_is_refused_and_nothing_changes(outer: Path) -> None:
    """A negative pax size is refused and nothing changes: ``scratchbank.application.resume.resume``."""
    before = tree_digest(outer)
    victim = outer / "sibling" / "secret"
    evil = ustar(member("x", tarfile.SYMTYPE, linkname=str(victim))) + ustar(member("x2", size=4), b"PWND")
    raw = (
        root_dir() + pax_header(pax_payload([("size", "-1536")])) + ustar(member("a", size=0)) + evil + end()
    )
    out = restore_into(gz(raw), outer / "dest")
    refused(out, "bad PAX size")
    assert tree_digest(outer) == before


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1)], ids=["link-first", "link-last"])
def test_X6_a_symlink_out_through_other_links_of_the_bank_is_refused(
    outer: Path, order: tuple[int, ...]
) -> None:
    """A symlink out through other links of the bank is refused: ``scratchbank.application.resume.resume``."""
    before = tree_digest(outer)
    out = restore_into(gz(root_dir() + b"".join(CHAIN[i] for i in order) + end()), outer / "dest")
    refused(out, "points outside the scratch ('d/l1/..')")
    assert tree_digest(outer) == before


@pytest.mark.parametrize(
    ("name", "target"),
    [("abs", "/etc"), ("up", "../sibling"), ("deep", "a/../../x"), ("loop", "loop/x")],
)
def test_X6_links_leading_out_or_looping_are_refused(outer: Path, name: str, target: str) -> None:
    """Links leading out or looping are refused: ``scratchbank.application.resume.resume``."""
    before = tree_digest(outer)
    out = restore_into(
        gz(root_dir() + ustar(member(name, tarfile.SYMTYPE, linkname=target)) + end()), outer / "dest"
    )
    refused(out, "points outside the scratch")
    assert tree_digest(outer) == before


def test_X6_links_that_stay_inside_through_other_links_are_restored(outer: Path) -> None:
    """Links that stay inside through other links are restored: ``scratchbank.application.resume.resume``."""
    raw = (
        root_dir()
        + CHAIN[0]
        + ustar(member("d/l1", tarfile.SYMTYPE, linkname="."))
        + ustar(member("l2", tarfile.SYMTYPE, linkname="d/l1/.."))
        + ustar(member("f", size=2), b"ok")
        + end()
    )
    outside = tree_digest(outer, skip=outer / "dest")
    out = restore_into(gz(raw), outer / "dest")
    assert out.proceeds, out
    assert (
        os.readlink(outer / "dest" / "l2") == "d/l1/.."
        and (outer / "dest" / "l2" / "f").read_bytes() == b"ok"
    )
    assert tree_digest(outer, skip=outer / "dest") == outside


def test_X6_modes_as_banked_setid_cleared_and_the_directory_not_0700(outer: Path) -> None:
    """Modes as banked setid cleared and the directory not 0700: ``scratchbank.application.resume.resume``."""
    out = restore_into(_bank(), outer / "dest")
    assert out.proceeds, out
    dest = outer / "dest"
    mode = {
        p: stat.S_IMODE((dest / p).lstat().st_mode) for p in ("", "sub", "sub/tool", "ro", "ro/f", "implicit")
    }
    assert mode == {"": 0o751, "sub": 0o711, "sub/tool": 0o755, "ro": 0o555, "ro/f": 0o444, "implicit": 0o755}
    assert (dest / "sub").stat().st_mtime == 1_600_000_000
    assert (dest / "hard").stat().st_ino == (dest / "sub" / "tool").stat().st_ino
    assert not (dest / "old.txt").exists()
    rec = out.restore.record if out.restore else None
    assert isinstance(rec, ScratchRestored) and rec.host_backed


def test_X6_a_destination_that_is_a_symlink_is_replaced_by_name(outer: Path) -> None:
    """The link is swapped out and removed; the directory it pointed to is untouched.
    Proves ``scratchbank.application.resume.resume``."""
    (outer / "dest-link").symlink_to(outer / "sibling")
    before = tree_digest(outer / "sibling")
    out = restore_into(_bank(), outer / "dest-link")
    assert out.proceeds, out
    assert (
        not (outer / "dest-link").is_symlink()
        and (outer / "dest-link" / "sub" / "tool").read_bytes() == b"run"
    )
    assert tree_digest(outer / "sibling") == before


def test_X6_the_swap_leaves_no_half_tree_and_no_sibling_behind(outer: Path) -> None:
    """The swap leaves no half tree and no sibling behind: ``scratchbank.application.resume.resume``."""
    out = restore_into(_bank(), outer / "dest")
    assert out.proceeds, out
    assert sorted(p.name for p in outer.iterdir()) == ["canary.txt", "dest", "sibling"]
    assert restore_into(_bank(), outer / "new" / "dest").proceeds  # a missing parent is made
    assert sorted(p.name for p in (outer / "new").iterdir()) == ["dest"]


def test_X6_less_free_space_than_declared_is_refused_by_name_first(outer: Path) -> None:
    """Less free space than declared is refused by name first: ``scratchbank.application.resume.resume``."""
    before = tree_digest(outer)
    out = restore_into(_bank(), outer / "dest", manifest_bytes=1 << 60)
    refused(out, "NO_SPACE_AT_DESTINATION")
    assert tree_digest(outer) == before
    assert sorted(p.name for p in outer.iterdir()) == ["canary.txt", "dest", "sibling"]


def test_X6_a_member_the_host_refuses_midway_changes_nothing(outer: Path) -> None:
    """Checked whole before the first entry is created: a late refusal leaves no trace.
    Proves ``scratchbank.application.resume.resume``."""
    before = tree_digest(outer)
    raw = root_dir() + ustar(member("fine", size=2), b"ok") + ustar(member("../escape", size=1), b"x") + end()
    refused(restore_into(gz(raw), outer / "dest"), "'..'")
    assert tree_digest(outer) == before


# ---- from tests/rules/test_[TX]*.py: The reader's grammar (issue 10, Build 1): every header field read with a range, PAX records on an allow-list, a reader that only moves forward, and one boundary where any parse failure becomes a named refusal (X2 on the host, T6 at bank time).


# -- PAX sizes: the hole that let a bank move the reader backwards (issue 10 hole 1) -------
@pytest.mark.parametrize("size", ["-1024", "-1", "+5", "5 ", "0x5", "1e3", ""])
def test_X2_a_pax_size_off_the_grammar_is_refused(size: str) -> None:
    """A pax size off the grammar is refused: ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="bad PAX size"):
        read(with_pax([("size", size)]))


def test_X2_a_pax_size_that_contradicts_the_ustar_size_is_refused() -> None:
    """A pax size that contradicts the ustar size is refused:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="contradicts the header's size"):
        read(with_pax([("size", "4")]))


def test_X2_a_pax_size_equal_to_the_ustar_size_is_read() -> None:
    """A pax size equal to the ustar size is read:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    assert [m.size for m in read(with_pax([("size", "5")])).members] == [5]


@pytest.mark.parametrize(("name", "start", "raw", "says"), FIELDS, ids=[f[0] for f in FIELDS])
def test_X2_a_header_field_off_its_grammar_or_range_is_refused(
    name: str, start: int, raw: bytes, says: str
) -> None:
    """A header field off its grammar or range is refused:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match=says):
        read(set_field(_block(), start, raw) + end())


def test_X2_a_base_256_size_within_range_is_read() -> None:
    """A base 256 size within range is read: ``scratchbank.application.bank_format.reader.TarReader``."""
    block = set_field(_block(), 124, b"\x80" + b"\x00" * 10 + b"\x05")
    assert [m.size for m in read(block + b"hello" + b"\x00" * 507 + end()).members] == [5]


def test_X2_a_header_without_ustar_magic_is_refused() -> None:
    """A header without ustar magic is refused: ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="not a ustar or GNU tar header"):
        read(set_field(_block(), 257, b"\x00" * 8) + end())


@pytest.mark.parametrize("key", sorted(DROPPED_PAX_KEYS))
def test_X2_a_harmless_pax_key_is_normalised_away(key: str) -> None:
    """A harmless pax key is normalised away:
    ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
    (info,) = canonical(with_pax([(key, HARMLESS[key])]))
    assert key not in info.pax_headers and (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")


def test_X2_the_used_pax_keys_are_honoured_and_rewritten_from_the_validated_member() -> None:
    """The used pax keys are honoured and rewritten from the validated member:
    ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
    assert {"path", "linkpath", "size", "mtime"} == USED_PAX_KEYS
    raw = with_pax([("path", "long/" * 30 + "name"), ("size", "5"), ("mtime", "1600000000.75")])
    raw = (
        raw[:-1024]
        + pax_header(pax_payload([("linkpath", "t" * 120)]))
        + ustar(member("l", tarfile.SYMTYPE, linkname="ignored"))
        + end()
    )
    f, link = canonical(raw)
    assert (f.name, f.size, f.mtime) == ("long/" * 30 + "name", 5, 1600000000)
    assert (link.name, link.linkname) == ("l", "t" * 120)


@pytest.mark.parametrize(
    "key",
    [
        "comment",
        "charset",
        "SCHILY.xattr.user.x",
        "LIBARCHIVE.creationtime",
        "SCHILY.fflags",
        "realtime.any",
        "security.selinux",
    ],
)
def test_X2_an_unknown_pax_key_is_refused_by_name(key: str) -> None:
    """An unknown pax key is refused by name: ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match=f"PAX key '{key}' is not accepted"):
        read(with_pax([(key, "x")]))


def test_X2_a_hdrcharset_other_than_binary_or_utf8_is_refused() -> None:
    """A hdrcharset other than binary or utf8 is refused:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="hdrcharset 'latin-1' is not accepted"):
        read(with_pax([("hdrcharset", "latin-1")]))


def test_X2_a_pax_key_given_twice_is_refused() -> None:
    """A pax key given twice is refused: ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="given twice"):
        read(with_pax([("path", "a"), ("path", "b")]))


def test_X2_two_pax_headers_for_one_member_are_refused() -> None:
    """Two pax headers for one member are refused:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    raw = pax_header(pax_payload([("path", "a")])) + with_pax([("mtime", "5")])
    with pytest.raises(HostileArchive, match="two PAX headers"):
        read(raw)


@pytest.mark.parametrize("payload", [b"5 a=b\n", b"06 a=b\n", b"7 a=bXY", b"x a=b\n", b"7 =b\nxx"])
def test_X2_a_malformed_pax_record_is_refused(payload: bytes) -> None:
    """A malformed pax record is refused: ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match="malformed PAX"):
        read(pax_header(payload) + ustar(member("f")) + end())


def test_X2_any_parser_failure_becomes_a_named_refusal_at_one_boundary() -> None:
    """Any parser failure becomes a named refusal at one boundary:
    ``scratchbank.application.bank_format.reader.TarReader.feed``."""
    reader = _Buggy()
    with pytest.raises(UnreadableArchive, match="OverflowError") as first:
        reader.feed(ustar(member("f")))
    assert first.value.code == "ARCHIVE_UNREADABLE"
    with pytest.raises(UnreadableArchive):  # a reader that failed stays failed
        reader.close()


def test_X2_the_gzip_reader_is_the_same_boundary() -> None:
    """The gzip reader is the same boundary: ``scratchbank.application.bank_format.gunzip.GzipReader``."""
    gunzip = GzipReader(_Buggy().feed, 1 << 20)
    with pytest.raises(UnreadableArchive):
        gunzip.feed(gz(ustar(member("f")) + end()))


def test_X2_a_failure_of_what_consumes_the_stream_passes_through_unnamed() -> None:
    """A broken pipe into a sandbox is not a hostile bank: it keeps its own type.
    Proves ``scratchbank.application.bank_format.reader.TarReader``."""

    def broken(_: object) -> None:
        raise BrokenPipeError("the sandbox went away")

    reader = TarReader(on_member=broken)
    with pytest.raises(BrokenPipeError):
        GzipReader(reader.feed, 1 << 20).feed(gz(ustar(member("f")) + end()))


# -- forward only ------------------------------------------------------------------------------
def test_X2_implicit_parents_are_accepted_and_a_later_non_directory_there_is_refused() -> None:
    """Implicit parents are accepted and a later non directory there is refused:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    members = read(ustar(member("a/b/f")) + ustar(member("a", tarfile.DIRTYPE)) + end()).members
    assert sorted((m.path, m.type) for m in members) == [("a", "dir"), ("a/b/f", "file")]
    with pytest.raises(HostileArchive, match="parent of earlier members but not a directory"):
        read(ustar(member("a/f")) + ustar(member("a", tarfile.SYMTYPE, linkname="/etc")) + end())


def test_X2_a_size_that_claims_more_than_the_archive_holds_is_truncation() -> None:
    """A size that claims more than the archive holds is truncation:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    block = set_field(_block(), 124, b"%011o\x00" % 4096)
    with pytest.raises(HostileArchive, match="truncated"):
        read(block + b"x" * 512 + end())


def test_X2_host_memory_does_not_grow_with_the_member_count() -> None:
    """The members go to disk (SQLite), in batches: 10x the members, the same Python peak.
    Proves ``scratchbank.application.bank_format.reader.TarReader``."""
    small, large = _many(1_000), _many(10_000)
    growth = _peak_while_reading(large) - _peak_while_reading(small)
    assert growth < 1 << 20, f"{growth} bytes more for 9,000 more members"


# ---- from tests/test_host_archive.py: The bank as it arrives on the host (T2, T20, X2, ADR 0003): compressed, hashed, written and checked in lanes beside the stream, in the gzip format any tar opens, whichever codec wrote it.


@pytest.mark.parametrize(("name", "data", "says"), corpus(), ids=[c[0] for c in corpus()])
def test_X2_a_hostile_raw_stream_is_refused_by_name_while_still_stored_and_hashed(
    tmp_path: Path, name: str, data: bytes, says: str
) -> None:
    """The refusal is a named reason on the facts (recorded, never banked), not an exception.
    Proves ``scratchbank.application.bank_format.host_archive.HostArchive``."""
    if "gzip" in says:
        pytest.skip("a gzip-level case: only a sandbox-compressed bank carries its own gzip")
    try:
        raw = gzip.decompress(data)
    except (OSError, EOFError, zlib.error):
        pytest.skip("a broken gzip stream: only a sandbox-compressed bank can carry one")
    limits = Limits(uncompressed_bytes=1 << 30)
    sink = HostArchive(tmp_path / "h.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30, limits=limits)
    facts = stream(sink, raw)
    assert re.search(says.replace("(", r"\("), facts.refused), facts
    assert facts.manifest is None
    assert facts.sha256 == hashlib.sha256((tmp_path / "h.tgz").read_bytes()).hexdigest()


def test_X2_a_stream_the_check_cannot_even_parse_is_refused_not_trusted(tmp_path: Path) -> None:
    """A PAX mtime of "inf" (an overflow, not a format error) still ends in a refusal by name.
    Proves ``scratchbank.application.bank_format.host_archive.HostArchive``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"mtime": "inf"}
        tar.addfile(info, io.BytesIO(b""))
    facts = stream(
        HostArchive(tmp_path / "i.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30), out.getvalue()
    )
    assert facts.refused.startswith("bank refused on the host"), facts
    assert facts.manifest is None


# ---- from tests/test_load_without_lies.py: Issue 26: load without lies. A report says ``recorded`` only for a record known to have landed; a busy timeline waits for a call slot and is never read as unreadable (R15).


def test_X7_a_lost_restore_record_is_reported_as_not_recorded() -> None:
    """A best-effort restore record that never landed: the report and its data say so.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = RestoreRecordFails(lands=False)
    store = parked(timeline)
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=box, clock=ManualClock())
    assert out.restore is not None and out.restore.record.restored and not out.restore.must_record
    assert restored_records(timeline) == []
    assert not out.recorded
    assert out.proceeds and box.files == FILES  # X7 as it was: that record decides nothing
    data = outcome_data(out)
    assert data["restore"]["recorded"] is False and data["proceeds"] is True
    assert any("not written" in line for line in outcome_text(out))


def test_X7_a_restore_record_that_landed_despite_an_error_is_recorded() -> None:
    """An append that failed on the way back but landed: re-read, it is recorded.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = RestoreRecordFails(lands=True)
    store = parked(timeline)
    out = resume(
        "run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({}), clock=ManualClock()
    )
    assert len(restored_records(timeline)) == 1
    assert out.recorded and out.proceeds
    assert out.claim is not None and out.claim.position == len(timeline.read("run-1"))
    assert outcome_data(out)["restore"]["recorded"] is True


# ---- from tests/rules/test_[TX]*.py: Issue 14 (X2, T6): the member cap is what a user may bank (2M: a million tiny files fits); the host's guard is the member log's temp-disk budget (``Limits.member_log_bytes``), refused by name before the temp disk fills, at bank time and at restore time alike.


def test_X2_a_bank_past_the_old_200k_member_cap_is_accepted() -> None:
    """200,001 members (and 201 implicit parents): accepted with the default limits.
    Proves ``scratchbank.application.bank_format.reader.TarReader``."""
    assert Limits().members >= 1_000_000
    assert Limits().member_log_bytes == DEFAULT_BUDGET
    reader = _read(_empty_files(OLD_CAP + 1), Limits())
    try:
        assert reader.log.count == OLD_CAP + 1
        assert reader.log.manifest().entries == OLD_CAP + 1
        assert reader.log.disk_bytes() < Limits().member_log_bytes
    finally:
        reader.log.close()


def test_X2_a_bank_over_the_member_log_budget_is_refused_by_name() -> None:
    """Far fewer members than the cap, but a member log past a (small) budget: refused,
    naming the budget, while the log is still within a batch of it.
    Proves ``scratchbank.application.bank_format.reader.TarReader``."""
    budget = 1 << 20
    reader = TarReader(Limits(member_log_bytes=budget))

    def feed_all() -> None:
        for piece in _empty_files(50_000):
            reader.feed(piece)
        reader.close()

    with pytest.raises(HostileArchive, match=r"temp-disk budget \(1048576 bytes, Limits.member_log_bytes\)"):
        feed_all()
    assert reader.log.disk_bytes() < budget + (1 << 20)  # refused within one batch of the budget
    assert reader.log.count < 50_000
    reader.log.close()


def test_X2_a_restored_trees_listing_past_the_budget_breaks_the_stream_by_name() -> None:
    """The sandbox's listing lands in the same log: past twice the budget, StreamBroken
    names it (a legitimate listing is smaller than the members' rows)."""
    log = MemberLog(budget=1 << 20)
    listing = io.BytesIO(b"".join(b'["d/f%09d", "file", 0]\n' % i for i in range(100_000)))
    with pytest.raises(StreamBroken, match=r"temp-disk budget \(1048576 bytes"):
        load_listing(log, listing)
    log.close()


def test_X2_a_listing_line_that_is_json_but_not_a_triple_breaks_the_stream_by_name() -> None:
    """A listing line such as ``5`` or ``null`` is StreamBroken by name, never a raw TypeError (issue 24)."""
    for line in (
        b"5\n",
        b"null\n",
        b'["a", "file"]\n',
        b'["a", "file", -1]\n',
        b'["\\u00e9", "file", 1, 2]\n',
    ):
        log = MemberLog()
        with pytest.raises(StreamBroken, match="unreadable listing line"):
            load_listing(log, io.BytesIO(b'["a", "file", 0]\n' + line))
        log.close()


def test_X2_a_listing_read_in_bulk_compares_as_line_by_line() -> None:
    """Issue 24 item 1: the listing is read in batches; a tree equal to the manifest is the same, one entry off is not.
    Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    log = MemberLog()
    log.add_implicit("d")
    for i in range(5000):
        log.add(Member(f"d/f{i:05d}", "file", i, 0o644, 0))
    lines = b"".join(b'["d/f%05d", "file", %d]\n' % (i, i) for i in range(5000))
    assert load_listing(log, io.BytesIO(b'["d", "dir", 0]\n' + lines)).same
    log.close()
    log = MemberLog()
    log.add_implicit("d")
    for i in range(5000):
        log.add(Member(f"d/f{i:05d}", "file", i, 0o644, 0))
    off = load_listing(
        log,
        io.BytesIO(
            b'["d", "dir", 0]\n' + lines.replace(b'"d/f04999", "file", 4999', b'"d/f04999", "file", 1')
        ),
    )
    assert (off.missing, off.unexpected) == (1, 1)
    log.close()


def _compared(lines: bytes, *, decode_all: bool = False) -> tuple[int, int] | str:
    """load_listing's comparison of ``lines`` with a small manifest, or its refusal's name."""
    from scratchbank.application.bank_format import listing as listing_module

    log = MemberLog()
    log.add_implicit("d")
    log.add(Member("d/a b", "file", 3, 0o644, 0))
    log.add(Member('d/q"\\\n\t\x7f', "file", 4, 0o644, 0))
    log.add(Member("e", "dir", 0, 0o755, 0))
    log.add(Member("d/\u00e9", "file", 2, 0o644, 0))
    try:
        with pytest.MonkeyPatch.context() as patch:
            if decode_all:  # the path every line took before issue 24: parse_line, then line_of
                patch.setattr(listing_module, "_CANONICAL", re.compile(b"(?!)"))
            got = load_listing(log, io.BytesIO(lines))
        return (got.missing, got.unexpected)
    except StreamBroken as error:
        return type(error).__name__
    finally:
        log.close()


_LISTED = [
    b'["d", "dir", 0]\n',
    b'["e", "dir", 0]\n',
    b'["d/a b", "file", 3]\n',
    b'["d/q\\"\\\\\\n\\t\\u007f", "file", 4]\n',
    b'["d/\\u00e9", "file", 2]\n',
]
_VARIANTS = [
    b'["d/a\\u0020b", "file", 3]\n',  # the same path, not canonical
    b'["d\\/a b", "file", 3]\n',
    b'[ "d/a b", "file", 3]\n',
    b'["d/a b", "file", 03]\n',
    b'["d/a b", "file", -3]\n',
    b'["d/a b", "file", 3.0]\n',
    b'["d/a b", "file", 99999999999999999999]\n',
    b'["d/a b", "File", 3]\n',
    b'["d/a b", "file", 3]',
    b'["d/a\tb", "file", 3]\n',  # a raw control byte: not JSON
    b'["d/a\\qb", "file", 3]\n',  # an escape JSON has not
    b'["d/a b", "file", 3] \n',
    b'["d/x", "symlink", 0]\n',
    b'["d/x", "fifo", 0]\n',
    b'["d/x", "other", 7]\n',
    b'["d/\xc3\xa9", "file", 2]\n',
    b"5\n",
    b"\n",
]


def test_X2_a_canonical_listing_line_is_compared_without_its_json_decoded_again() -> None:
    """Issue 24 item 1: a line exactly as line_of writes it skips parse_line; only a line that is not, and a
    directory's the manifest lacks (its implicit-parent check), are decoded."""
    from scratchbank.application.bank_format import listing as listing_module

    decoded: list[bytes] = []

    def counting(raw: bytes) -> tuple[str, str, int]:
        decoded.append(raw)
        return parse_line(raw)

    files = b"".join(b'["d/f%05d", "file", %d]\n' % (i, i) for i in range(5000))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(listing_module, "parse_line", counting)
        log = MemberLog()
        for i in range(5000):
            log.add(Member(f"d/f{i:05d}", "file", i, 0o644, 0))
        log.add_implicit("d")
        got = load_listing(log, io.BytesIO(b'["d", "dir", 0]\n' + files + b'["d\\/f00001", "file", 1]\n'))
        log.close()
    assert (got.missing, got.unexpected) == (0, 0)  # "d\\/f00001" is d/f00001's line, once decoded
    assert decoded == [b'["d\\/f00001", "file", 1]\n', b'["d", "dir", 0]']  # with its newline, as before


def test_X2_a_listing_compares_and_refuses_as_when_every_line_was_decoded() -> None:
    """Issue 24 item 1, differential: ``load_listing`` compares and refuses as when every line was decoded."""
    assert _compared(b"".join(_LISTED)) == (0, 0)
    assert (
        _compared(b'["d/a b", "file", 99999999999999999999]\n') == "StreamBroken"
    )  # was a raw OverflowError
    for i, line in enumerate(_LISTED):
        without = b"".join(_LISTED[:i] + _LISTED[i + 1 :])
        assert _compared(without) == _compared(without, decode_all=True), line
    for variant in _VARIANTS:
        for lines in (b"".join(_LISTED) + variant, variant + b"".join(_LISTED[1:])):
            assert _compared(lines) == _compared(lines, decode_all=True), variant


def test_X2_a_listing_is_compared_as_a_merge_that_lands_no_row_per_entry() -> None:
    """Issue 24 item 1: the listing is merged, sorted, with the manifest: the member log's temp disk does not grow with it.
    Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    log = MemberLog()
    for i in range(20_000):
        log.add(Member(f"d/f{i:05d}", "file", i, 0o644, 0))
    log.add(Member("d", "dir", 0, 0o755, 0))
    log.manifest()  # as the bank's check does: the manifest lines indexed
    before = log.disk_bytes()
    lines = b"".join(b'["d/f%05d", "file", %d]\n' % (i, i) for i in reversed(range(20_000)))
    assert load_listing(log, io.BytesIO(lines + b'["d", "dir", 0]\n')).same
    assert log.disk_bytes() == before
    log.close()


_NAMES = st.text(alphabet='ab/"\\\n\u00e9', min_size=1, max_size=4)


def _logged_members(
    explicit: dict[str, tuple[str, int]], implicit: set[str], extra: list[tuple[str, str, int]]
) -> tuple[MemberLog, set[str], list[tuple[str, str, int]]]:
    """The member log of ``explicit`` members and ``implicit`` parents, their manifest lines,
    and the pool of (path, kind, size) a listing draws its lines from (``extra`` added)."""
    from scratchbank.application.bank_format.manifest_line import line_of

    log = MemberLog()
    manifest: set[str] = set()
    for path, (kind, size) in explicit.items():
        link = "x" * size if kind == "symlink" else ""
        log.add(Member(path, kind, size if kind == "file" else 0, 0o644, 0, link))
        manifest.add(line_of(path, kind, size if kind != "dir" else 0))
    for path in implicit:
        log.add_implicit(path)
    pool = [(p, k, s if k != "dir" else 0) for p, (k, s) in explicit.items()]
    pool += [(p, "dir", 0) for p in implicit] + extra
    return log, manifest, pool


@settings(max_examples=150, deadline=None)
@given(
    explicit=st.dictionaries(
        _NAMES, st.tuples(st.sampled_from(["file", "dir", "symlink"]), st.integers(0, 3))
    ),
    implicit=st.sets(_NAMES, max_size=4),
    extra=st.lists(st.tuples(_NAMES, st.sampled_from(["file", "dir", "fifo", "other"]), st.integers(0, 3))),
    picks=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["same", "size", "plain", "blank"]))),
    spill=st.booleans(),
)
def test_X2_a_merged_listing_counts_as_the_not_exists_queries_did(
    explicit: dict[str, tuple[str, int]],
    implicit: set[str],
    extra: list[tuple[str, str, int]],
    picks: list[tuple[int, str]],
    spill: bool,
) -> None:
    """Issue 24 item 1, differential: the sorted merge counts missing and unexpected lines as
    SQL's NOT EXISTS did (repeats, implicit parents, non-canonical lines, runs spilled to disk and merged).
    Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    from scratchbank.application.bank_format import listing as listing_module
    from scratchbank.application.bank_format.manifest_line import line_of

    implicit -= set(explicit)
    log, manifest, pool = _logged_members(explicit, implicit, extra)
    listed: list[tuple[str, str, int]] = []
    raw = b""
    for at, how in picks:
        if not pool:
            break
        path, kind, size = pool[at % len(pool)]
        size += how == "size"
        listed.append((path, kind, size))
        line = line_of(path, kind, size).encode("ascii")
        raw += (
            (line.replace(b'", "', b'","') if how == "plain" else line)
            + b"\n"
            + (b"\n" if how == "blank" else b"")
        )
    seen = {line_of(*entry) for entry in listed}
    missing = len(manifest - seen)
    unexpected = sum(
        1 for p, k, s in listed if line_of(p, k, s) not in manifest and not (k == "dir" and p in implicit)
    )
    with pytest.MonkeyPatch.context() as patch:
        if spill:
            patch.setattr(listing_module, "RUN_BYTES", 16)
            patch.setattr(listing_module, "_BATCH_BYTES", 30)
            patch.setattr(listing_module, "_BLOCK", 2)
            patch.setattr(listing_module, "_MAX_RUNS", 3)
        got = load_listing(log, io.BytesIO(raw))
    log.close()
    assert (got.missing, got.unexpected) == (missing, unexpected)


#: The comparison before issue 24 (5d3e427: listing.py's loop and spill_log.py's NOT EXISTS
#: queries), copied as the reference the merge must agree with on any listing.
_OLD_CANONICAL = re.compile(
    rb'\["((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\bfnrt])*)", '
    rb'"(file|symlink|fifo|other)", (0|[1-9][0-9]{0,17})\]\n?'
)


def _old_comparison(manifest: set[str], implicit: set[str], raw: bytes) -> tuple[int, int] | str:
    """What the SQLite compare of 5d3e427 said of ``raw``: (missing, unexpected), or its refusal."""
    from scratchbank.application.bank_format.manifest_line import line_of

    rows: list[tuple[str, str, str | None]] = []  # the listing table: line, type, path (key)
    try:
        for line in io.BytesIO(raw).readlines():
            if (m := _OLD_CANONICAL.fullmatch(line)) is not None:
                rows.append((line.rstrip(b"\n").decode("ascii"), m[2].decode("ascii"), None))
            elif line.strip():
                path, kind, size = parse_line(line)
                rows.append((line_of(path, kind, size), kind, path))
    except StreamBroken as error:
        return type(error).__name__
    listed = {row[0] for row in rows}
    missing = sum(1 for line in manifest if line not in listed)
    unexpected = sum(
        1 for line, kind, path in rows if line not in manifest and not (kind == "dir" and path in implicit)
    )
    return (missing, unexpected)


def test_X2_a_listing_line_in_another_json_encoding_is_refused_as_before() -> None:
    """A listing line that is a manifest line in UTF-16 (json.loads sniffs the encoding) was
    unreadable with its newline (odd length): the merge, which split the newline off, took it
    for the entry. Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    log = MemberLog()
    log.add(Member("a", "file", 0, 0o644, 0))
    log.add(Member("b", "file", 0, 0o644, 0))
    raw = '["a", "file", 0]'.encode("utf-16-le") + b'\n["b", "file", 0]\n'
    assert _old_comparison({'["a", "file", 0]', '["b", "file", 0]'}, set(), raw) == "StreamBroken"
    with pytest.raises(StreamBroken, match="unreadable listing line"):
        load_listing(log, io.BytesIO(raw))
    log.close()


def test_X2_a_listing_line_longer_than_a_read_is_not_copied_again_per_read() -> None:
    """A hostile listing's line of many reads (no newline for MiBs) is held as it comes, not
    copied whole again at every read, on its way in nor back from its spilled run: a 64 MiB
    line took 40 s of CPU (16 MiB 2.3 s), 0.8 s after. Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    from scratchbank.application.bank_format import listing as listing_module

    copied = [0]

    class Piece(bytes):
        """A read's bytes, counting what a concatenation onto them copies."""

        def __radd__(self, other: bytes) -> bytes:
            copied[0] += len(other) + len(self)
            return bytes(other) + bytes(self)

    class Reads(io.BytesIO):
        def read(self, size: int | None = -1, /) -> bytes:
            return Piece(super().read(size))

    line = b'["' + b"a" * (1 << 20) + b'", "file", 0]\n'
    log = MemberLog()
    log.add(Member("b", "file", 0, 0o644, 0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(listing_module, "_BATCH_BYTES", 1 << 12)
        patch.setattr(listing_module, "RUN_BYTES", 16)  # spilled, and read back from its run
        patch.setattr(listing_module, "tempfile", types.SimpleNamespace(TemporaryFile=Reads))
        got = load_listing(log, Reads(line + b'["b", "file", 0]\n'))
    log.close()
    assert (got.missing, got.unexpected) == (0, 1)
    assert copied[0] <= 4 * len(line), copied[0]


_HOSTILE_FORMS = [
    "as is",
    "plain",
    "utf-16",
    "utf-16 bom",
    "utf-8 bom",
    "utf-32",
    "cr",
    "space",
    "slash",
    "garbage",
]


def _hostile_form(line: bytes, how: str, junk: bytes) -> bytes:
    """A listing line (no newline) as a hostile sandbox might write it instead."""
    text = line.decode("ascii")
    return {
        "as is": line,
        "plain": line.replace(b'", "', b'","'),
        "utf-16": text.encode("utf-16-le"),
        "utf-16 bom": text.encode("utf-16"),
        "utf-8 bom": b"\xef\xbb\xbf" + line,
        "utf-32": text.encode("utf-32-le"),
        "cr": line + b"\r",
        "space": b" " + line + b" ",
        "slash": line.replace(b"/", b"\\/"),
        "garbage": junk,
    }[how]


@settings(max_examples=200, deadline=None)
@given(
    explicit=st.dictionaries(
        _NAMES, st.tuples(st.sampled_from(["file", "dir", "symlink"]), st.integers(0, 2))
    ),
    implicit=st.sets(_NAMES, max_size=3),
    extra=st.lists(st.tuples(_NAMES, st.sampled_from(["file", "dir", "fifo", "other"]), st.integers(0, 2))),
    picks=st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from(_HOSTILE_FORMS), st.binary(max_size=6)), max_size=12
    ),
    end_newline=st.booleans(),
    batch=st.integers(1, 64),
    spill=st.booleans(),
)
def test_X2_a_hostile_listing_compares_and_refuses_as_the_old_sqlite_compare_did(
    explicit: dict[str, tuple[str, int]],
    implicit: set[str],
    extra: list[tuple[str, str, int]],
    picks: list[tuple[int, str, bytes]],
    end_newline: bool,
    batch: int,
    spill: bool,
) -> None:
    """Issue 24 item 1, differential against the code it replaced: any listing (lines in other
    encodings, with a BOM, a CR, garbage, repeats, read in batches cut anywhere, runs spilled
    and merged) gets the old comparison or the old refusal.
    Proves ``scratchbank.application.bank_format.listing.load_listing``."""
    from scratchbank.application.bank_format import listing as listing_module
    from scratchbank.application.bank_format.manifest_line import line_of

    implicit -= set(explicit)
    log, manifest, pool = _logged_members(explicit, implicit, extra)
    lines = [
        _hostile_form(line_of(*pool[at % len(pool)]).encode("ascii") if pool else b"", how, junk)
        for at, how, junk in picks
    ]
    raw = b"\n".join(lines) + (b"\n" if end_newline and lines else b"")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(listing_module, "_BATCH_BYTES", batch)
            if spill:
                patch.setattr(listing_module, "RUN_BYTES", 16)
                patch.setattr(listing_module, "_BLOCK", 2)
                patch.setattr(listing_module, "_MAX_RUNS", 3)
            compared = load_listing(log, io.BytesIO(raw))
        got: tuple[int, int] | str = (compared.missing, compared.unexpected)
    except StreamBroken as error:
        got = type(error).__name__
    finally:
        log.close()
    assert got == _old_comparison(manifest, implicit, raw)


def _listed(raw_listing: bytes) -> list[str]:
    import tempfile

    from scratchbank.adapters.restore_wire import write_listing

    with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as lines:
        raw.write(raw_listing)
        raw.seek(0)
        write_listing(raw, lines)
        lines.seek(0)
        return lines.read().decode("ascii").splitlines()


def test_X2_a_sandbox_listings_long_name_is_not_copied_again_per_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile sandbox's name of many reads (no NUL for MiBs) is held as its pieces, not
    copied whole again at every 64 KiB read (its length squared).
    Proves ``scratchbank.adapters.restore_wire.write_listing``."""
    from scratchbank.adapters import restore_wire

    copied = [0]

    class Piece(bytes):
        """A read's bytes, counting what a concatenation onto them copies."""

        def __radd__(self, other: bytes) -> bytes:
            copied[0] += len(other) + len(self)
            return bytes(other) + bytes(self)

    real = os.pread
    monkeypatch.setattr(
        restore_wire, "os", types.SimpleNamespace(pread=lambda fd, n, at: Piece(real(fd, n, at)))
    )
    name = b"./" + b"a" * (1 << 20)
    stats, names = b":f 0\n:f 1\n", name + b"\x00./b\x00"
    lines = _listed(b"%d %d\n" % (len(stats), len(names)) + stats + names)
    assert lines == [f'["{"a" * (1 << 20)}", "file", 0]', '["b", "file", 1]']
    assert copied[0] <= 4 * len(name), copied[0]


def test_X2_a_plain_one_walk_listing_is_written_in_bulk_not_an_entry_at_a_time() -> None:
    """Issue 24 item 2: a one-walk listing of plain names is written a batch at a time (no per-entry call).
    Proves ``scratchbank.adapters.restore_wire.write_listing``."""
    from scratchbank.adapters import restore_wire

    calls: list[bytes] = []

    def counting(stat_line: bytes, name: bytes) -> str:
        calls.append(name)
        return str(_per_entry(stat_line, name))

    _per_entry = restore_wire._manifest_line
    stats = b"".join(b":f %d\n" % i for i in range(5000)) + b":d 4096\n"
    names = b"".join(b"./d/f%05d.py\0" % i for i in range(5000)) + b"./d\0"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(restore_wire, "_manifest_line", counting)
        got = _listed(b"%d %d\n" % (len(stats), len(names)) + stats + names)
    assert got == [f'["d/f{i:05d}.py", "file", {i}]' for i in range(5000)] + ['["d", "dir", 0]']
    assert calls == []


_STAT_LINES = st.sampled_from(
    [
        b":f 3",
        b":d 4096",
        b":l 0",
        b":p 0",
        b":s 0",
        b":f 007",
        b":f 0",
        b":x 1",
        b"81a4 7",
        b"41ed 9",
        b":f",
        b"",
    ]
)
_NAME_BYTES = st.binary(max_size=6).map(lambda b: b"./" + b.replace(b"\0", b"a")) | st.sampled_from(
    [b"./a", b"./a b", b'./q"', b"./\\", b"a", b"./\xc3\xa9", b"./\x7f"]
)


_PLAIN_ENTRIES = st.lists(
    st.tuples(
        st.sampled_from([b":f 3", b":d 4096", b":l 0", b":p 0", b":f 0"]),
        st.sampled_from([b"./a", b"./a b", b"./d/e.py", b"./", b"./~!"]),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    entries=st.booleans().flatmap(
        lambda plain: _PLAIN_ENTRIES if plain else st.lists(st.tuples(_STAT_LINES, _NAME_BYTES), max_size=12)
    ),
    cut=st.integers(-2, 2),
)
def test_X2_a_listing_written_in_bulk_reads_and_refuses_as_an_entry_at_a_time(
    entries: list[tuple[bytes, bytes]], cut: int
) -> None:
    """Issue 24 item 2, differential: ``write_listing``'s batches write the lines, and refuse, as an entry at a time."""
    from scratchbank.adapters import restore_wire

    stats = b"".join(s + b"\n" for s, _ in entries[: max(0, len(entries) + min(cut, 0))])
    names = b"".join(n + b"\0" for _, n in entries[: max(0, len(entries) - max(cut, 0))])
    raw = b"%d %d\n" % (len(stats), len(names)) + stats + names

    def written(*, one_at_a_time: bool) -> list[str] | str:
        with pytest.MonkeyPatch.context() as patch:
            if one_at_a_time:
                patch.setattr(restore_wire, "_PLAIN_STATS", re.compile(b"(?!)"))
            try:
                return _listed(raw)
            except StreamBroken as error:
                return type(error).__name__

    assert written(one_at_a_time=False) == written(one_at_a_time=True)


def test_X2_a_one_walk_listing_reads_find_type_letters_and_an_unknown_letter_breaks_the_stream() -> None:
    """Issue 24: restore.sh's one-walk ":TYPE SIZE" lines (GNU find's %y) read as stat's do; any other is StreamBroken."""
    stats = b":d 4096\n:f 3\n:l 3\n:p 0\n:s 0\n81a4 7\n"
    names = b"./d\0./d/f\0./l\0./p\0./s\0./n\nx\0"
    got = _listed(b"%d %d\n" % (len(stats), len(names)) + stats + names)
    assert got == [
        '["d", "dir", 0]',
        '["d/f", "file", 3]',
        '["l", "symlink", 3]',
        '["p", "fifo", 0]',
        '["s", "other", 0]',
        '["n\\nx", "file", 7]',
    ]
    for bad in (b":z 1\n", b":ff 1\n", b": 1\n", b":f\n"):
        with pytest.raises(StreamBroken, match="unreadable"):
            _listed(b"%d 4\n" % len(bad) + bad + b"./a\0")


def test_X2_the_stream_into_a_sandbox_goes_in_4_MiB_frames() -> None:
    """Issue 24: ``FramedStream`` sends 4 MiB frames (one ``dd`` each in the sandbox: 256 for 1 GB, not ~1,000)."""
    from scratchbank.adapters.restore_wire import FramedStream

    framed = FramedStream(io.BytesIO(b"x" * (9 << 20)))
    wire = framed.read()
    heads = re.findall(rb"data (\d+)\n", wire)
    assert [int(n) for n in heads] == [4 << 20, 4 << 20, 1 << 20]
    assert wire.endswith(b"end %d %s\n" % (9 << 20, hashlib.md5(b"x" * (9 << 20)).hexdigest().encode()))


def test_X2_the_sandbox_checks_the_restore_stream_by_md5_not_by_its_slow_sha256() -> None:
    """Issue 24: the stream into a sandbox is checked end to end by count and MD5 (BusyBox
    1.35's ``sha256sum`` took 1.4 cpu-s a 197 MB stream, its ``md5sum`` 0.44: ADR 0003).
    Proves ``scratchbank.adapters.restore_wire.FramedStream``."""
    from rigs.real_sandboxes import rig
    from rigs.staged_restore import canonical

    tar = canonical()
    with rig("local") as r:
        staged = r.sandbox.stage_restore(io.BytesIO(tar), compressed=False, listing=io.BytesIO())
        r.sandbox.discard_restore(staged)
    assert (staged.received, staged.digest) == (len(tar), hashlib.md5(tar).hexdigest())


# ---- from tests/test_resume_use_case.py: The resume and restore use cases end to end, with fakes (R and X rules).


def test_X1_the_bank_is_restored_before_the_first_node_and_recorded() -> None:
    """The bank is restored before the first node and recorded:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    out, box = w.resume()
    assert out.proceeds and box.files == FILES
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.restored and not rec.stale


def test_X4_a_bank_that_is_gone_parks_scratch_not_portable_and_holds() -> None:
    """A bank that is gone parks scratch not portable and holds:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    w.store.sweep("run-1")
    out, _ = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE and out.restore.hold
    assert fold(w.timeline.read("run-1")).hold is not None
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == {}
    assert fold(w.timeline.read("run-1")).forsaken is not None


def test_X4_a_resume_without_a_sandbox_on_purpose_parks_scratch_not_portable() -> None:
    """A resume without a sandbox on purpose parks scratch not portable:
    ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, without_sandbox=True)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE


def test_X4_a_bank_replaced_without_its_record_is_never_restored_as_recorded() -> None:
    """The banking process was killed between the upload and the record (N3).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    w.timeline.append("run-1", [])
    other = World()
    other.park({"other": b"unrecorded"})
    bank = fold(w.timeline.read("run-1")).bank
    assert bank is not None and bank.record.object is not None
    w.store.stored["run-1"][bank.record.object] = other.store.only("run-1") or b""  # changed in the store
    out, box = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert "BANK_MISMATCH" in out.restore.record.reason and box.files == {}
    w.store.sweep("run-1")
    assert w.store.objects("run-1") == []  # swept with the run


def test_X4_the_sandbox_refusing_the_bank_parks_with_the_code() -> None:
    """The sandbox refusing the bank parks with the code:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    from scratchbank.domain.errors import RestoreRefused

    w = World()
    w.park()
    box = FakeSandbox({})
    box.faults["restore"] = [RestoreRefused("disk full")]
    out, _ = w.resume(sandbox=box)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE
    assert "disk full" in out.restore.record.reason


@pytest.mark.parametrize("fault", ["store", "stream"])
def test_X5_a_failed_read_parks_without_a_code_and_consent_does_not_skip_it(fault: str) -> None:
    """A failed read parks without a code and consent does not skip it:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    box = FakeSandbox({})
    for request in (ResumeRequest(), ACCEPT):
        if fault == "store":
            w.store.fetch = _failing_fetch  # type: ignore[method-assign]
        else:
            box.faults["restore"] = [StreamBroken("kubectl exited 0 short")]
        out, _ = w.resume(request, sandbox=box)
        assert out.restore is not None and out.restore.park is not None
        assert out.restore.park.code is None and not out.proceeds


def test_X2_a_partial_restore_is_refused_by_name() -> None:
    """A partial restore is refused by name: ``scratchbank.application.teardown.bank_at_teardown``."""

    class Lossy(FakeSandbox):
        def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
            return super().staged_lines(tree)[:-1]  # a file lost on the way

    w = World()
    w.park()
    out, _ = w.resume(sandbox=Lossy({}))
    assert out.restore is not None and out.restore.park is not None
    assert "partial restore" in out.restore.record.reason


def test_X6_a_restore_into_a_host_directory_hands_the_scratch_over(tmp_path: Path) -> None:
    """A restore into a host directory hands the scratch over: ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()
    target = tmp_path / "host-scratch"
    out = resume(
        "run-1",
        ResumeRequest(),
        timeline=w.timeline,
        store=w.store,
        sandbox=None,
        host_directory=HostDirectory(target),
    )
    assert out.proceeds and (target / "clone/README").read_bytes() == b"docs"
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.host_backed
    w.timeline.append("run-1", [node("edit", "agent")])
    out2, _ = w.resume()
    assert out2.decision.verdict is Verdict.GO_ON_WITHOUT and out2.decision.rule == "X6"


def test_X6_the_public_resume_still_takes_a_host_directory_as_a_path(tmp_path: Path) -> None:
    """``scratchbank.resume(..., host_directory=PATH)``: the thin convenience builds the
    HostDirectory adapter (the use case takes the port); the scratch is handed over."""
    import scratchbank

    w = World()
    w.park()
    target = tmp_path / "host-scratch"
    out = scratchbank.resume(
        "run-1", ResumeRequest(), timeline=w.timeline, store=w.store, host_directory=target
    )
    assert out.proceeds and (target / "clone/README").read_bytes() == b"docs"
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.host_backed


def test_X7_a_stale_restore_whose_record_cannot_land_fails_without_a_code() -> None:
    """A stale restore whose record cannot land fails without a code:
    ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()
    w.timeline.append("run-1", [node("measure")])

    class Failing(InMemoryTimeline):
        calls = 0

        def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
            Failing.calls += 1
            if Failing.calls > 1:
                raise TimelineWriteFailed("down")
            return w.timeline.append(run_id, records, expected=expected)

        def read(self, run_id):  # type: ignore[no-untyped-def]
            return w.timeline.read(run_id)

    out = resume(
        "run-1", ACCEPT, timeline=Failing(), store=w.store, sandbox=FakeSandbox({}), clock=ManualClock()
    )
    assert out.restore is not None and out.restore.must_record
    assert not out.recorded and not out.proceeds
    # the next resume restores the bank again: the stale restore was never recorded
    out2, box = w.resume(ACCEPT)
    assert out2.proceeds and box.files == FILES


def test_X4_X5_a_failed_restores_record_names_what_failed() -> None:
    """after_restore: each failed result writes a record whose reason leads with its own name,
    one distinct reason per result (what an operator reads in the timeline)."""
    decision = decide_resume(
        fold([started(), node("clone", "tool", in_sandbox=True), banked()]), ResumeRequest()
    )
    assert decision.verdict is Verdict.RESTORE, decision
    reasons: dict[RestoreResult, str] = {}
    for result in RestoreResult:
        if result is RestoreResult.RESTORED:
            continue
        out = after_restore(decision, RestoreAttempt(result, detail="why"))
        assert out.record.reason == f"{result.name.lower()}: why", out.record
        reasons[result] = out.record.reason
    assert len(set(reasons.values())) == len(reasons)


@pytest.mark.parametrize(("step", "store", "box", "code"), RESTORE_STEPS, ids=[s[0] for s in RESTORE_STEPS])
def test_X3_X4_X5_a_fault_at_any_step_of_the_restore_ends_with_its_record_hold_and_park(
    step: str, store: FaultyStore | None, box: FaultySandbox | None, code: str | None
) -> None:
    """A fault at any step of the restore ends with its record hold and park:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    if store is not None:
        store.banks = w.store.banks
        w.store = store
    out, _ = w.resume(sandbox=box if box is not None else FakeSandbox({}))
    records = w.timeline.read("run-1")
    assert isinstance(records[-2], RunResumed)
    rec = records[-1]
    assert isinstance(rec, ScratchRestored) and not rec.restored and rec.reason
    assert out.restore is not None and out.restore.park is not None and out.restore.hold
    assert out.restore.park.code == code and not out.proceeds
    assert fold(records).hold is not None  # X3: the failed sandbox banks nothing over it


def test_X3_X4_a_host_directory_that_cannot_be_written_ends_with_its_record(tmp_path: Path) -> None:
    """X2/X4: like a sandbox's tar that cannot create the scratch, a host directory that
    cannot be created is a refusal by name (DESTINATION_REFUSED), not a read to retry.
    Proves ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()
    (tmp_path / "a-file").write_text("not a directory")
    target = tmp_path / "a-file" / "scratch"
    out = resume(
        "run-1", ResumeRequest(), timeline=w.timeline, store=w.store, host_directory=HostDirectory(target)
    )
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and not rec.restored and not rec.host_backed
    assert (
        out.restore is not None
        and out.restore.park is not None
        and out.restore.park.code == SCRATCH_NOT_PORTABLE
    )
    assert fold(w.timeline.read("run-1")).hold is not None


# ---- from tests/test_runner_deliveries.py: The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).


def test_X5_a_sandbox_that_will_not_start_is_delivered_again(tmp_path: Path) -> None:
    """A failure a later try may cure: the delivery is nak'd, never acked, the lease let go.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    rig.provider = _NoSandboxes()  # type: ignore[assignment]
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.REDELIVER and "EXEC_FAILED" in handled.detail
    assert not inbound.acked and inbound.naks
    assert rig.lease.acquire("run-1", "runner-b") is not None


def test_X5_a_local_exec_whose_pipes_are_past_descriptor_1024_streams_whole(tmp_path: Path) -> None:
    """200 restores at once with their store sockets hold over 1,024 descriptors: a local
    exec's pipes numbered past select()'s FD_SETSIZE stream like any other, never X5's
    STREAM_BROKEN ("filedescriptor out of range in select()")."""
    from scratchbank.adapters.local_sandbox import LocalSandbox

    null = os.open(os.devnull, os.O_RDONLY)
    held = [null]
    try:
        while held[-1] < 1100:  # the exec's pipes come after these
            held.append(os.dup(null))
        sandbox = LocalSandbox(tmp_path / "box", isolate=False)
        try:
            out = io.BytesIO()
            done = sandbox.run("cat", [], stdin=io.BytesIO(b"x" * 300_000), stdout=out)
        finally:
            sandbox.destroy()
    finally:
        for fd in held:
            os.close(fd)
    assert done.exit_code == 0 and out.getvalue() == b"x" * 300_000


def test_X6_a_restore_cut_before_the_swap_leaves_no_parent_directory_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L5, X6: a restore into a destination whose parents did not exist, cut while the fresh
    copy is written: LEASE_LOST, and the host byte for byte as before (no parent left made).
    Proves ``scratchbank.adapters.host_directory.restore_into_host_directory``."""
    from scratchbank.adapters import host_directory
    from scratchbank.adapters.memory import InMemoryBankStore
    from scratchbank.application.cancellation import Cancel
    from scratchbank.domain.errors import LeaseLost
    from scratchbank.domain.fold import Bank, Evidence
    from scratchbank.domain.records import ScratchBanked
    from scratchbank.testing.contracts import RestoreTargetContract, faithful_record

    data = RestoreTargetContract.GOOD
    store = InMemoryBankStore()
    store.banks["run-t"] = data
    bank = Bank(Evidence(1, ScratchBanked.WIRE), faithful_record(data), 1)
    cancel = Cancel()
    made = host_directory.make_fresh

    def made_then_cut(dest: host_directory.Destination) -> str:
        name = made(dest)
        cancel.cut("the lease was lost")  # the check pass is done: the write pass is cut
        return name

    monkeypatch.setattr(host_directory, "make_fresh", made_then_cut)
    (tmp_path / "canary").write_text("canary")
    before = tree_digest(tmp_path)
    with pytest.raises(LeaseLost):
        host_directory.restore_into_host_directory(
            "run-t", bank, tmp_path / "new" / "deeper" / "dest", store=store, cap=1 << 20, cancel=cancel
        )
    assert tree_digest(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["canary"]


def test_X2_a_bank_the_host_banked_under_a_larger_cap_is_restored_not_refused_as_hostile() -> None:
    """A teardown may bank under a cap larger than a restore's default (``Budgets.cap_bytes``:
    a 1 GB scratch under 4 GiB); the restore's cap never falls below the size the host itself
    recorded, so that bank is restored, not refused REFUSED_ON_HOST "over the cap" (X4: a lost
    bank). A store object not as its record says stays refused (the X2 tests of bytes not
    as recorded). Proves ``scratchbank.application.restore.restore_bank``."""
    from scratchbank.adapters.memory import InMemoryBankStore
    from scratchbank.application.restore import restore_bank
    from scratchbank.application.teardown import Budgets, bank_at_teardown
    from scratchbank.domain import RestoreResult, fold
    from scratchbank.domain.records import ScratchBanked

    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-c", [started()])
    files = {f"f{i}": os.urandom(2000) for i in range(4)}  # ~8 kB that gzip cannot shrink
    report = bank_at_teardown(
        "run-c",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(files=dict(files)),
        run_finished=False,
        budgets=Budgets(cap_bytes=1 << 20),
    )
    assert report.recorded
    record = timeline.read("run-c")[-1]
    assert isinstance(record, ScratchBanked) and record.bytes > 4096
    decision = decide_resume(fold(timeline.read("run-c")), ResumeRequest())
    into = FakeSandbox(files={})
    got = restore_bank("run-c", decision, store=store, sandbox=into, cap=4096)  # below the bank
    assert got.result is RestoreResult.RESTORED, got.detail
    assert into.files == files


def test_X5_a_docker_exec_whose_output_came_with_the_engines_answer_streams_whole() -> None:
    """The engine sent a short command's whole output with its answer's headers (Podman did
    so for 9 of 300 execs on a loaded machine): the frames the header parser already holds
    reach the caller, not only what is still on the socket. Proves
    ``scratchbank.adapters.docker_sandbox.docker_frames``."""
    import http.client
    import socket
    import struct
    from types import SimpleNamespace

    from scratchbank.adapters.docker_sandbox import _DockerExec
    from scratchbank.adapters.exec_pump import STDERR, STDOUT

    def frame(stream: int, data: bytes) -> bytes:
        return struct.pack(">BxxxL", stream, len(data)) + data

    engine, host = socket.socketpair()
    with engine, host:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"
        engine.sendall(answer + frame(1, b"hello\n") + frame(2, b"warn") + frame(1, b"bye\n"))
        engine.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(host)
        response.begin()  # what docker-py does before it hands the socket over
        sock = response.fp.raw  # type: ignore[attr-defined]  # the socket docker-py returns
        sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))
        running = _DockerExec(None, "exec-1", sock, host, wants_input=False)  # type: ignore[arg-type]
        got = []
        while (item := running.receive()) is not None:
            got.append(item)
        response.close()
        running.close()
    assert got == [(STDOUT, b"hello\n"), (STDERR, b"warn"), (STDOUT, b"bye\n")]


def _engine_exec(host: Any, answer_tail: bytes = b"") -> Any:
    """A ``_DockerExec`` over ``host``, the engine's answer parsed as docker-py does."""
    import http.client
    from types import SimpleNamespace

    from scratchbank.adapters.docker_sandbox import _DockerExec

    response = http.client.HTTPResponse(host)
    response.begin()
    sock = response.fp.raw  # type: ignore[attr-defined]  # the socket docker-py returns
    sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))
    return _DockerExec(None, "exec-1", sock, host, wants_input=False)  # type: ignore[arg-type]


_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"


def test_X5_docker_frames_split_across_reads_and_empty_frames_stream_whole() -> None:
    """The engine's frames arrive a byte at a time (headers split across reads), with empty
    frames between: every byte reaches the caller on its stream, nothing more.
    Proves ``scratchbank.adapters.docker_sandbox.docker_frames``."""
    import socket
    import struct

    from scratchbank.adapters.exec_pump import STDERR, STDOUT

    def frame(stream: int, data: bytes) -> bytes:
        return struct.pack(">BxxxL", stream, len(data)) + data

    frames = (
        frame(1, b"")
        + frame(1, b"out")
        + frame(2, b"")
        + frame(2, b"err" * 5)
        + frame(1, b"")
        + frame(1, b"!")
    )
    engine, host = socket.socketpair()
    with engine, host:
        engine.sendall(_ANSWER)

        def trickle() -> None:
            for i in range(len(frames)):
                engine.sendall(frames[i : i + 1])
            engine.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=trickle)
        sender.start()
        running = _engine_exec(host)
        got: dict[int, bytes] = {STDOUT: b"", STDERR: b""}
        while (item := running.receive()) is not None:
            assert item[1], "an empty chunk handed out"
            got[item[0]] += item[1]
        sender.join(60.0)
        running.close()
    assert got == {STDOUT: b"out!", STDERR: b"err" * 5}


def test_X5_a_cut_ends_a_docker_exec_read_blocked_mid_frame_at_once() -> None:
    """The engine went silent in the middle of a frame's header and of a frame's body: the
    cut (the socket shut down) ends the blocked read, which reports the end (no hang).
    Proves ``scratchbank.adapters.docker_sandbox.docker_frames``."""
    import socket
    import struct

    for silent_after in (
        struct.pack(">BxxxL", 1, 2) + b"ab" + b"\x01\x00",
        struct.pack(">BxxxL", 1, 10) + b"abc",
    ):
        engine, host = socket.socketpair()
        with engine, host:
            engine.sendall(_ANSWER + silent_after)
            running = _engine_exec(host)
            got: list[Any] = []
            reader = threading.Thread(target=got.extend, args=(iter(running.receive, None),))
            reader.start()
            running.cut()
            reader.join(60.0)
            assert not reader.is_alive(), "the cut did not end the blocked read"
            running.close()
        assert b"".join(data for _, data in got) in (b"", b"ab", b"abc")


# ---- A small member log answers from memory (no database until a batch lands), as its database would.

_LOG_PATHS = st.text(alphabet="ab/é\udc80 ", min_size=1, max_size=4)
_LOG_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("implicit"), _LOG_PATHS, st.just(""), st.just(0)),
        st.tuples(
            st.sampled_from(["file", "dir", "symlink", "hardlink", "fifo"]),
            _LOG_PATHS,
            _LOG_PATHS,
            st.integers(min_value=0, max_value=2**40),
        ),
    ),
    max_size=30,
)


def _log_answers(log: MemberLog, paths: set[str]) -> tuple[Any, ...]:
    """Everything a member log answers, as values."""
    kinds = ("file", "dir", "symlink", "hardlink", "fifo")
    return (
        [attrs_tuple(m) for m in log],
        {k: [attrs_tuple(m) for m in log.members_of(k)] for k in kinds},
        {k: [attrs_tuple(m) for m in log.members_of(k, deepest_first=True)] for k in kinds},
        list(log.lines()),
        log.manifest(),
        list(log.sorted_lines()),
        {p: (log.kind(p), log.link_of(p), log.file_size(p)) for p in sorted(paths)},
        log.count,
    )


def attrs_tuple(m: Member) -> tuple[Any, ...]:
    return (m.path, m.type, m.size, m.mode, m.mtime, m.linkname)


@settings(max_examples=150, deadline=None)
@given(_LOG_STEPS)
def test_X2_a_small_member_log_answers_from_memory_as_its_database_would(
    steps: list[tuple[str, str, str, int]],
) -> None:
    """A log under one batch keeps its rows in memory and opens no database; every answer
    (the members in order, each kind in both orders, the manifest lines and their bytes, the
    manifest, each path's kind, link and size, the refusals) is what the same log answers
    once every row has landed in its database (a batch of one row).
    Proves ``scratchbank.application.bank_format.spill_log.MemberLog``."""
    from scratchbank.application.bank_format.members import PathTaken

    small, landed = MemberLog(), MemberLog()
    landed.BATCH = 1  # type: ignore[misc]  # every row lands as it comes
    paths: set[str] = set()
    try:
        for kind, path, link, size in steps:
            paths |= {path, link}
            outcomes = []
            for log in (small, landed):
                try:
                    if kind == "implicit":
                        log.add_implicit(path)
                    else:
                        log.add(Member(path, kind, size if kind == "file" else 0, 0o644, 7, link))
                    outcomes.append("added")
                except PathTaken as taken:
                    outcomes.append(str(taken))
            assert outcomes[0] == outcomes[1], (kind, path, outcomes)
        small.finish()
        landed.finish()
        assert small.disk_bytes() == 0, "a log under one batch opened a database"
        assert _log_answers(small, paths) == _log_answers(landed, paths)
    finally:
        small.close()
        landed.close()


def test_X2_a_small_bank_check_opens_no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader of a bank of a few members opens no SQLite database (~0.3 ms each: a
    teardown's check and a restore's comparison of a small scratch); one past a batch does.
    Proves ``scratchbank.application.bank_format.spill_log.MemberLog``."""
    from scratchbank.application.bank_format import spill_log

    opened: list[str] = []
    real = spill_log.sqlite3.connect

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append("db")
        return real(*args, **kwargs)

    monkeypatch.setattr(spill_log.sqlite3, "connect", counted)
    small = io.BytesIO()
    with tarfile.open(fileobj=small, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(20):
            info = tarfile.TarInfo(f"d/f{i}")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    reader = TarReader(Limits())
    reader.feed(small.getvalue())
    reader.close()
    assert reader.members.manifest().entries == 20 and opened == []  # the files (d is implicit: no line)
    reader.members.close()
    log = MemberLog()
    for i in range(MemberLog.BATCH):
        log.add(Member(f"f{i}", "file", 0, 0o644, 0))
    assert opened == ["db"]
    log.close()
