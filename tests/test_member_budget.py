"""Issue 14 (X2, T6): the member cap is what a user may bank (2M: a million tiny files
fits); the host's guard is the member log's temp-disk budget (``Limits.member_log_bytes``),
refused by name before the temp disk fills, at bank time and at restore time alike."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from hostile import end, member, pax_header, pax_payload, ustar

from scratchbank.application.bank_format.listing import load_listing
from scratchbank.application.bank_format.members import Member
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.spill_log import DEFAULT_BUDGET, MemberLog
from scratchbank.domain.errors import HostileArchive, StreamBroken

OLD_CAP = 200_000


def _empty_files(n: int) -> Iterator[bytes]:
    """``n`` empty regular files ``d<i // 1000>/f<i>``, one header block each, in 1 MiB pieces
    (built from one template: only the name and the checksum change)."""
    template = bytearray(ustar(member("x" * 20)))
    template[148:156] = b" " * 8
    base = sum(template) - sum(b"x" * 20)
    piece = bytearray()
    for i in range(n):
        name = b"d%06d/f%011d" % (i // 1000, i)  # 20 bytes, as the template
        block = bytearray(template)
        block[0:20] = name
        block[148:156] = b"%06o\x00 " % (base + sum(name))
        piece += block
        if len(piece) >= 1 << 20:
            yield bytes(piece)
            piece.clear()
    yield bytes(piece) + end()


def _read(pieces: Iterator[bytes], limits: Limits) -> TarReader:
    reader = TarReader(limits)
    for piece in pieces:
        reader.feed(piece)
    reader.close()
    return reader


def test_X2_a_bank_past_the_old_200k_member_cap_is_accepted() -> None:
    """200,001 members (and 201 implicit parents): accepted with the default limits."""
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
    naming the budget, while the log is still within a batch of it."""
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


def test_T6_implicit_parents_count_against_the_member_log_budget() -> None:
    """Few members, each under 126 parents of its own: the implicit parents' rows fill the
    log, not the member count; the budget refuses them by name."""
    deep = b"".join(
        pax_header(pax_payload([("path", f"x{i:06d}" + ("/" + "c" * 30) * 126 + "/f")])) + ustar(member("f"))
        for i in range(400)
    )
    with pytest.raises(HostileArchive, match="temp-disk budget"):
        _read(iter([deep + end()]), Limits(member_log_bytes=1 << 20))
    accepted = _read(iter([deep + end()]), Limits())
    assert accepted.log.count == 400
    accepted.log.close()


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
    """Issue 24 item 1: the listing is read in batches; a tree equal to the manifest is the same, one entry off is not."""
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
