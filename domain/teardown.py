"""Teardown: bank or not, how tries merge, and what the one record says (T1-T20).

The application layer runs the tries (quiesce, archive, upload) and asks these
functions what each outcome means. Nothing here knows about time except as numbers
it is given (the budget left, how long the last tar pass took).
"""

from __future__ import annotations

import enum

import attrs

from .fold import Evidence, ScratchState
from .objects import object_name
from .records import ScratchBanked

#: T20: the most a bank may hold, compressed.
CAP_BYTES = 256 * 1024 * 1024
#: Facts of the engine the ADR came from: up to 3 tar passes while racing, and another
#: pass only when the time left is at least 3x the last pass.
MAX_TAR_PASSES = 3
RETAR_TIME_FACTOR = 3.0
#: Raced member names kept on the record; the rest is a count.
RACED_NAMES_KEPT = 20


class Seen(enum.IntEnum):
    """What a try learned of the scratch; higher knows more (T9: files > empty > unknown)."""

    UNKNOWN = 0
    EMPTY = 1
    FILES = 2


@attrs.frozen
class Archive:
    """A complete archive of the scratch, taken to the host, with what it holds."""

    bytes: int
    sha256: str
    raced: tuple[str, ...] = ()
    manifest_entries: int | None = None
    manifest_bytes: int | None = None
    manifest_sha256: str | None = None


@attrs.frozen
class Quiesce:
    """Whether every other process of the sandbox was stopped while tar read (T11-T13)."""

    quiesced: bool
    reason: str = ""


@attrs.frozen
class TryOutcome:
    """One banking try: what it saw, the archive it completed, whether that was stored."""

    seen: Seen
    archive: Archive | None = None
    stored: bool = False
    reason: str = ""

    def rank(self) -> int:
        """Order of preference between tries (T9, T16)."""
        if self.seen is not Seen.FILES:
            return int(self.seen)
        if self.stored and self.archive is not None:
            return 5 if not self.archive.raced else 4
        return 3


class TeardownAction(enum.Enum):
    BANK = "bank"  # archive the scratch and store it
    DROP = "drop"  # a finished run keeps no bank: delete it (T5)
    SKIP = "skip"  # nothing to bank and nothing to record


@attrs.frozen
class TeardownPlan:
    action: TeardownAction
    quiesce: bool
    rule: str
    reason: str
    evidence: tuple[Evidence, ...] = ()


def plan_teardown(
    state: ScratchState, *, scratch_host_backed: bool, process_isolated: bool, run_finished: bool
) -> TeardownPlan:
    """What this teardown does (T1, T5, T11, X3)."""
    if scratch_host_backed:
        return TeardownPlan(TeardownAction.SKIP, False, "T1", "the scratch is host-backed")
    if state.hold is not None:
        why = "a failed restore holds the bank until this sandbox ends"
        return TeardownPlan(TeardownAction.SKIP, False, "X3", why, (state.hold,))
    if run_finished:
        return TeardownPlan(TeardownAction.DROP, False, "T5", "a finished run keeps no bank")
    why = "a park, a failure or a failed run may resume: bank the scratch"
    if not process_isolated:
        why += " (not process-isolated: no quiesce, recorded unquiesced)"
    return TeardownPlan(TeardownAction.BANK, process_isolated, "T1", why)


@attrs.frozen
class TryMerge:
    best: TryOutcome
    stop: bool
    rule: str


def merge_try(best: TryOutcome | None, latest: TryOutcome) -> TryMerge:
    """Fold one more try into the best so far, and say whether to try again (T8, T9, A7)."""
    if best is not None and latest.seen < best.seen:
        return TryMerge(best, True, "A7")
    chosen = latest if best is None or latest.rank() >= best.rank() else best
    if chosen.stored or chosen.seen is Seen.EMPTY:
        return TryMerge(chosen, True, "T9")
    return TryMerge(chosen, False, "T8")


def over_cap(size: int, cap: int = CAP_BYTES) -> bool:
    """T20: the archive is larger than a bank may hold."""
    return size > cap


def should_retar(*, raced: bool, passes: int, last_pass_seconds: float, seconds_left: float) -> bool:
    """Run tar again while it races, if budget allows another archive and upload (T16)."""
    if not raced or passes >= MAX_TAR_PASSES:
        return False
    return seconds_left >= RETAR_TIME_FACTOR * last_pass_seconds


def teardown_record(final: TryOutcome, quiesce: Quiesce) -> ScratchBanked:
    """The one record this teardown writes (T6), from the best try it made."""
    record = _outcome_record(final)
    return attrs.evolve(record, unquiesced=not quiesce.quiesced, quiesce_reason=quiesce.reason)


def _outcome_record(final: TryOutcome) -> ScratchBanked:
    if final.seen is Seen.UNKNOWN:
        return ScratchBanked(banked=False, empty=False, unknown=True, bytes=0, reason=final.reason)
    if final.seen is Seen.EMPTY:
        return ScratchBanked(banked=False, empty=True, unknown=False, bytes=0)
    archive = final.archive
    if not final.stored or archive is None:
        size = archive.bytes if archive else 0
        return ScratchBanked(banked=False, empty=False, unknown=False, bytes=size, reason=final.reason)
    return ScratchBanked(
        banked=True,
        empty=False,
        unknown=False,
        bytes=archive.bytes,
        reason=final.reason,
        raced=archive.raced[:RACED_NAMES_KEPT],
        raced_count=len(archive.raced),
        sha256=archive.sha256,
        manifest_entries=archive.manifest_entries,
        manifest_bytes=archive.manifest_bytes,
        manifest_sha256=archive.manifest_sha256,
        object=object_name(archive.sha256),  # A17: the record names the object it banked
    )


def finished_record() -> ScratchBanked:
    """T5: the record of a finished run's teardown, which dropped any bank."""
    return ScratchBanked(
        banked=False, empty=False, unknown=False, finished=True, bytes=0, reason="run finished"
    )


def deletes_bank(final: TryOutcome) -> bool:
    """T4: an empty scratch deletes a previous bank (a finished run's drop is T5)."""
    return final.seen is Seen.EMPTY
