"""The engine's checkpoint stamp and how a bank's stamp compares with a resume's (ADR 0013).

A ``Checkpoint`` is the lineage of checkpoint ids from the run's start to where the
run stands; the engine mints a new id after every pass that writes the scratch. Two
stamps compare by lineage, never by a count: after a rewind, equal lengths can come
from different branches. Pure values and functions, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs

from .errors import InvalidCheckpoint


def _check_lineage(_: object, __: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    if not value or not all(isinstance(i, str) and i for i in value):
        raise InvalidCheckpoint("a checkpoint is a non-empty list of non-empty ids")


@attrs.frozen
class Checkpoint:
    """Where a run stands: its checkpoint ids from the run's start, oldest first."""

    lineage: tuple[str, ...] = attrs.field(converter=tuple, validator=_check_lineage)

    @property
    def id(self) -> str:
        return self.lineage[-1]

    def __str__(self) -> str:
        return f"checkpoint {self.id} ({len(self.lineage)} in its lineage)"


def checkpoint_of(ids: Iterable[object]) -> Checkpoint:
    """A checkpoint from a surface's or a delivery's list of ids (InvalidCheckpoint when
    it is not a non-empty list of non-empty strings)."""
    lineage: Any = tuple(ids)
    return Checkpoint(lineage)


class Position(enum.Enum):
    """Where a resume's checkpoint stands against its bank's (K1-K4)."""

    AHEAD = "ahead"  # K1: the run wrote after the bank: stale
    DIVERGED = "diverged"  # K2: another branch past a rewind: stale
    EXACT = "exact"  # K3: the bank is the checkpoint's scratch
    BEHIND = "behind"  # K4: a rewind to before the bank: the bank holds more

    @property
    def stale(self) -> bool:
        return self in (Position.AHEAD, Position.DIVERGED)

    @property
    def rule(self) -> str:
        return _RULES[self]


_RULES = {Position.AHEAD: "K1", Position.DIVERGED: "K2", Position.EXACT: "K3", Position.BEHIND: "K4"}


def compare(bank: Checkpoint, resume: Checkpoint) -> Position:
    """Where ``resume`` stands against ``bank``, read from their lineages alone."""
    b, k = bank.lineage, resume.lineage
    if b == k:
        return Position.EXACT
    if len(b) < len(k) and k[: len(b)] == b:
        return Position.AHEAD
    if len(k) < len(b) and b[: len(k)] == k:
        return Position.BEHIND
    return Position.DIVERGED
