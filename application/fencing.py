"""Fencing: a stale lease holder can never land a write after the new holder's first one.

The runner hands the engine (and the resume and teardown use cases) a FencedTimeline
in place of the timeline. Its first append carries the holder's token in a
``lease_taken`` record; every append is made with ``expected=`` the position it last
saw, a prefix it checked holds no newer token. Of two holders racing, the stale one
either lands before the new holder's first record (its append was at exactly that
position) or its append conflicts, it re-reads, meets the newer token and is refused
``Fenced``. This works on every Timeline adapter, with no schema change. The token rides the
holder's store writes too (``FencedBankStore``): a put or delete first reads the fence
and is refused ``Fenced`` once a newer holder wrote, so a holder cut off mid-teardown
never replaces the bank its successor's takeover stores.

An append whose reply is lost (``TimelineWriteFailed``, ``TimelineUnreadable``: the
store may have committed it) is settled by reading, never by guessing
(``settle_append``): the batch found at its position is ours and landed; other records
there are a conflict (or ``Fenced`` past a newer token); nothing there means it did
not land and the error stands. A claim whose reply was lost therefore carries on as
the claim it is, with its delivery's consents (C4), instead of meeting itself on
redelivery as "already claimed".

The resume and teardown use cases claim by position (application/recording.py): each
counts its own records to know where its next append must land. A fenced timeline
handed to them must already be announced (``announce``, or the runner's claim), so
that the token is not slipped into their first batch behind their backs; from then
on the fenced writer appends exactly what they give it, at the position they name,
and a conflict past a newer token is ``Fenced`` (the stale holder stops) while one
without is theirs to read (their own ``ResumeSuperseded`` or lost teardown).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from scratchbank.domain.errors import Fenced, TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import LeaseTaken, Record

from .ports import BankStore, ForwardingBankStore, Timeline

APPEND_TRIES = 20

#: An append's reply was lost: the store may or may not have committed it.
LOST_REPLY = (TimelineWriteFailed, TimelineUnreadable)


def settle_append(
    timeline: Timeline, run_id: str, records: Sequence[Record], at: int, lost: Exception
) -> int:
    """An append at ``at`` whose reply was ``lost``: read what the store holds and settle it.

    Returns the length past our batch when the batch is found at ``at`` (it landed);
    raises TimelineConflict when other records sit there, and ``lost`` again when
    nothing does (it did not land) or the store cannot be read.
    """
    try:
        held = tuple(timeline.read(run_id))
    except TimelineUnreadable:
        raise lost from None
    if held[at : at + len(records)] == tuple(records):
        return at + len(records)
    if len(held) > at:
        raise TimelineConflict(f"run {run_id}: another writer appended past {at} records") from lost
    raise lost


@attrs.frozen
class Token:
    """A lease holder's fencing token for one run."""

    holder: str
    token: int
    attempt: str | None = None


def newer_token(records: Sequence[Record], mine: Token) -> LeaseTaken | None:
    """The first lease record with a token newer than ``mine``, if any."""
    for record in records:
        if isinstance(record, LeaseTaken) and record.token > mine.token:
            return record
    return None


def _refuse(run_id: str, newer: LeaseTaken, mine: Token) -> Fenced:
    why = f"run {run_id}: {newer.holder} took the lease with token {newer.token} > {mine.token}"
    return Fenced(why)


class FencedTimeline:
    """A Timeline for one lease holder on one run: reads and writes refuse once fenced."""

    def __init__(self, inner: Timeline, run_id: str, token: Token) -> None:
        self.inner, self.run_id, self.token = inner, run_id, token
        self.position: int | None = None
        self.announced = False
        self.writes = 0

    def _checked(self, run_id: str) -> Sequence[Record]:
        records = self.inner.read(run_id)
        newer = newer_token(records, self.token)
        if newer is not None:
            raise _refuse(run_id, newer, self.token)
        self.position = len(records)
        return records

    def read(self, run_id: str) -> Sequence[Record]:
        self._own(run_id)
        return self._checked(run_id)

    def _own(self, run_id: str) -> None:
        if run_id != self.run_id:
            raise ValueError(f"this fenced timeline is for run {self.run_id}, not {run_id}")

    def _batch(self, records: Sequence[Record]) -> list[Record]:
        if self.announced:
            return list(records)
        t = self.token
        return [LeaseTaken(holder=t.holder, token=t.token, attempt=t.attempt), *records]

    def announce(self) -> int:
        """Write the token alone at the position last read (read first when none was).

        Call it before a use case that counts its own positions writes through this
        timeline. A no-op once announced; Fenced past a newer token.
        """
        if self.announced:
            return self.position if self.position is not None else len(self._checked(self.run_id))
        at = self.position if self.position is not None else len(self._checked(self.run_id))
        return self._append_at(self.run_id, [], at)

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        """Append at the position last seen (or ``expected``); refuse Fenced past a newer token."""
        self._own(run_id)
        if expected is not None:
            return self._append_at(run_id, records, expected)
        for _ in range(APPEND_TRIES):
            at = self.position if self.position is not None else len(self._checked(run_id))
            try:
                return self._append_at(run_id, records, at)
            except TimelineConflict:
                self.position = None  # another writer of this lease's run (an operator): read again
        raise TimelineConflict(f"run {run_id}: lost {APPEND_TRIES} fenced append races in a row")

    def _append_at(self, run_id: str, records: Sequence[Record], at: int) -> int:
        batch = self._batch(records)
        try:
            try:
                length = self.inner.append(run_id, batch, expected=at)
            except LOST_REPLY as lost:  # settled by reading, never by guessing
                length = settle_append(self.inner, run_id, batch, at, lost)
        except TimelineConflict:
            self._checked(run_id)  # raises Fenced when a newer holder wrote
            raise
        self.announced, self.position = True, length
        self.writes += 1
        return length


class FencedBankStore(ForwardingBankStore):
    """The bank store as one lease holder writes it: each put, delete and sweep reads the
    fence first and is refused ``Fenced`` past a newer token (reads pass through)."""

    def __init__(self, inner: BankStore, fenced: FencedTimeline) -> None:
        super().__init__(inner)
        self.fenced = fenced

    def before(self, call: str, run_id: str) -> None:
        if call not in self.WRITES:
            return
        self.fenced._own(run_id)
        newer = newer_token(self.fenced.inner.read(run_id), self.fenced.token)
        if newer is not None:
            raise _refuse(run_id, newer, self.fenced.token)
