"""Fencing: a stale lease holder can never land a write after the new holder's first one.

The runner hands the engine (and the resume and teardown use cases) a FencedTimeline
in place of the timeline. Its first append carries the holder's token in a
``lease_taken`` record; every append is made with ``expected=`` the position it last
saw, a prefix it checked holds no newer token. Of two holders racing, the stale one
either lands before the new holder's first record (its append was at exactly that
position) or its append conflicts, it re-reads, meets the newer token and is refused
``Fenced``. This works on every Timeline adapter, with no schema change.

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

from scratchbank.domain.errors import Fenced, TimelineConflict
from scratchbank.domain.records import LeaseTaken, Record

from .ports import Timeline

APPEND_TRIES = 20


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
            length = self.inner.append(run_id, batch, expected=at)
        except TimelineConflict:
            self._checked(run_id)  # raises Fenced when a newer holder wrote
            raise
        self.announced, self.position = True, length
        self.writes += 1
        return length
