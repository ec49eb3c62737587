"""What a hostile sandbox prints back, fuzzed against the host's parsers (issue 25, build 5).

Reports, listings, counts and trailers are generated around the shapes the scripts
print (valid lines, forged lines, names with newlines and NULs, huge counts, floods),
then fed to the host parsers as any transport would hand them over (arbitrary chunks).
Every input ends in a named outcome (a report, a listing, or a ScratchbankError with a
code), never a raw traceback, with host memory and disk bounded by the stream's bound,
and every piece of sandbox text that reaches a report is escaped and cut.
"""

from __future__ import annotations

import io
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from scratchbank.adapters.exec_output import SAID_CHARS, Bounded, said
from scratchbank.adapters.restore_wire import _Conversation, _staged_header, write_listing
from scratchbank.adapters.script_reports import QuiesceHead, archive_report, bank_status, quiesce_report
from scratchbank.domain.errors import OutputOverBound, ScratchbankError

LINES = st.sampled_from(
    [
        b"stopped 3",
        b"stopped x",
        b"stopped 99999999999999999999",
        b"refused: this is the host's initial PID namespace",
        b"unquiesced: pid 1 (sleep) wrote during the quiesce",
        b"watchdog 12",
        b"scratchbank-quiesced 0",
        b"scratchbank-quiesced 4",
        b"scratchbank-quiesced 00000000000000000000000000000001",
        b"scratchbank-bank: continued",
        b"scratchbank-bank: left stopped",
        b"command terminated with exit code 1",
        b"tar: ./f: file changed as we read it",
        b"scratchbank: raced: ./f",
        b"scratchbank: note: the old scratch stays at /x",
        b"scratchbank-staged 10 " + b"a" * 64,
        b"1 1",
        b"99999999999999999 1",
        b"41ed 4096",
        b"81a4 3",
        b"zz 3",
        b"./a\x00./b\x00",
        b"\x00\x1b[31m\r",
    ]
)
NOISE = st.binary(max_size=64)
CHUNKS = st.lists(st.one_of(LINES.map(lambda b: b + b"\n"), NOISE), max_size=30).map(b"".join)
CODES = st.integers(min_value=-1, max_value=300)


def clean(text: str) -> bool:
    return all(c.isprintable() for c in text)


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


@given(CODES, CHUNKS, st.binary(max_size=200))
def test_quiesce_report_is_a_report_with_escaped_reasons(code: int, out: bytes, err: bytes) -> None:
    """Any exit code and report lines: a QuiesceReport whose reasons are printable."""
    lines = out.decode("utf-8", "replace").splitlines()
    report = quiesce_report(code, lines, said(err))
    assert all(clean(why) for why in report.reasons)
    assert report.quiesced == (code == 0)


@given(CHUNKS, st.integers(min_value=1, max_value=97), st.booleans())
def test_the_bank_scripts_stdout_is_split_or_refused_within_its_bound(
    out: bytes, size: int, flood: bool
) -> None:
    """QuiesceHead over any stdout, in any chunking: a report and the rest passed on, or
    no report yet, or OutputOverBound once the report passes its bound: never more held."""
    dest = io.BytesIO()
    head = QuiesceHead(dest)
    head.LIMIT = 4096  # type: ignore[misc]
    data = out + (b"y" * 5000 if flood else b"")
    try:
        for chunk in chunked(data, size):
            head.write(chunk)
    except OutputOverBound:
        assert head.report is None
        return
    if head.report is None:
        assert len(data) <= head.LIMIT + size
    else:
        assert all(clean(why) for why in head.report.reasons)


@given(CODES, CHUNKS)
def test_tar_stderr_and_the_bank_status_end_in_a_report_or_a_named_failure(code: int, err: bytes) -> None:
    """bank.sh's stderr: a status and tar's warnings, or ArchiveFailed; text escaped."""
    status, rest = bank_status(err)
    assert isinstance(status, str)
    failed: ScratchbankError | None = None
    try:
        report = archive_report(code, rest)
    except ScratchbankError as error:
        failed = error
    if failed is not None:
        assert failed.code
        assert clean(failed.message)
        assert len(failed.message) < SAID_CHARS + 100
        return
    assert all(clean(n) for n in report.notices)


@given(CHUNKS, st.integers(min_value=0, max_value=50), st.integers(min_value=1, max_value=97))
def test_a_listing_ends_in_manifest_lines_or_a_named_failure_within_its_bound(
    body: bytes, entries: int, size: int
) -> None:
    """A restore's conversation output, any bytes in any chunking: the host file never
    takes more than the bound, and the verdict sees manifest lines or a named failure."""
    seen: list[object] = []
    with tempfile.TemporaryFile() as raw:

        def then() -> None:
            _staged_header(raw, "t")
            with tempfile.TemporaryFile() as lines:
                write_listing(raw, lines)
                seen.append(lines.tell())

        bound = 1024 + 64 * entries
        talk = _Conversation(raw, then, give_up=lambda: None, bound=bound, after=64)
        try:
            for chunk in chunked(body, size):
                talk.write(chunk)
        except OutputOverBound:
            pass
        raw.seek(0, io.SEEK_END)
        assert raw.tell() <= bound
    if talk.error is not None:
        assert isinstance(talk.error, ScratchbankError) and talk.error.code


@given(st.binary(max_size=3000), st.integers(min_value=0, max_value=2000))
def test_a_bounded_sink_holds_at_most_its_bound(data: bytes, limit: int) -> None:
    """Bounded: everything up to the bound, OutputOverBound on the byte past it."""
    sink = Bounded(limit, "fuzz")
    over = False
    try:
        for chunk in chunked(data, 7):
            sink.write(chunk)
    except OutputOverBound:
        over = True
    assert over == (len(data) > limit)
    assert len(sink.getvalue()) <= limit


@given(st.binary(max_size=10_000))
def test_sandbox_text_is_escaped_and_cut(raw: bytes) -> None:
    """said(): printable, at most SAID_CHARS characters, whatever the bytes."""
    text = said(raw)
    assert clean(text) and len(text) <= SAID_CHARS
