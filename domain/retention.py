"""Retention of recent checkpoints' banks, and a resume's pick among them (ADR 0013, K6-K8).

The fold keeps, newest last, the banks that stamped teardown records took (``history``):
one per checkpoint, at most ``HISTORY`` of them. Retention keeps the newest ``retain``
of those, plus the run's current bank; a rewind to checkpoint K restores the bank taken
at K while retention keeps it (K6), and is refused by name when retention swept it (K7).
Everything else (the sweep, ``needed_objects``) reads the same function, so teardown,
prune and the gate can never disagree on what is kept. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .checkpoints import Checkpoint
from .errors import InvalidCheckpoint
from .records import ScratchBanked

#: The banks of at least this many recent checkpoints (with a bank) are kept by default.
RETAIN_CHECKPOINTS = 5
#: How many checkpoints' banks the fold remembers at most (retention's ceiling): a bank
#: older than this is forgotten, so a rewind to it decides as before retention (K4).
HISTORY = 64


def check_retain(retain: int) -> int:
    """``retain`` if it is a retention setting this build honours (1..HISTORY)."""
    if isinstance(retain, bool) or not isinstance(retain, int) or not 1 <= retain <= HISTORY:
        raise InvalidCheckpoint(f"a checkpoint retention is a whole number from 1 to {HISTORY}: {retain!r}")
    return retain


@attrs.frozen
class Kept:
    """One checkpoint's bank as the fold remembers it: the checkpoint, its teardown
    record (which names its object) and that record's position in the timeline."""

    checkpoint: Checkpoint
    record: ScratchBanked
    position: int

    @property
    def object(self) -> str | None:
        return self.record.object


def remember(history: Sequence[Kept], kept: Kept) -> tuple[Kept, ...]:
    """A stamped bank: it replaces any earlier bank of the same checkpoint; the oldest
    past ``HISTORY`` are forgotten."""
    rest = [k for k in history if k.checkpoint != kept.checkpoint]
    return (*rest, kept)[-HISTORY:]


def forget(history: Sequence[Kept], checkpoint: Checkpoint | None) -> tuple[Kept, ...]:
    """T4: an empty scratch at ``checkpoint`` is that checkpoint's scratch from now on:
    its older bank (if any) goes; other checkpoints' banks stay."""
    if checkpoint is None:
        return tuple(history)
    return tuple(k for k in history if k.checkpoint != checkpoint)


def retained(history: Sequence[Kept], retain: int = RETAIN_CHECKPOINTS) -> tuple[Kept, ...]:
    """The checkpoints' banks retention keeps: the newest ``retain`` (newest last)."""
    return tuple(history[-retain:]) if retain > 0 else ()


def swept(history: Sequence[Kept], retain: int = RETAIN_CHECKPOINTS) -> tuple[Kept, ...]:
    """The checkpoints' banks retention no longer keeps (their objects may be deleted)."""
    return tuple(history[: max(len(history) - retain, 0)])


@attrs.frozen
class Pick:
    """What retention says of a resume from ``checkpoint``: the bank taken at it, still
    kept (K6); or the one taken at it and swept (K7); or neither (the current bank decides)."""

    kept: Kept | None = None
    swept: Kept | None = None


def pick(history: Sequence[Kept], checkpoint: Checkpoint | None, retain: int = RETAIN_CHECKPOINTS) -> Pick:
    """The bank a resume from ``checkpoint`` restores: the one taken at exactly that
    checkpoint, when retention keeps it. A bank taken before it on its lineage lacks the
    writes between (K1) and one taken after holds more (K4): neither is the checkpoint's
    own scratch, so the current bank decides those as before."""
    if checkpoint is None:
        return Pick()
    for k in reversed(retained(history, retain)):
        if k.checkpoint == checkpoint:
            return Pick(kept=k)
    for k in reversed(swept(history, retain)):
        if k.checkpoint == checkpoint:
            return Pick(swept=k)
    return Pick()
