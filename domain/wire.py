"""The wire form of timeline records: flat JSON objects, versioned, strictly read.

A record on the wire is ``{"type": "<wire name>", "v": <version>, "at": <ISO time>?,
...fields}``. Reading is strict for the types this build knows (A6: a missing or
ill-typed field makes the timeline unreadable, never a silent False) and lenient
for the rest (an unknown type is kept as ``UnknownRecord``). A record of a newer
version than this build knows is unreadable: guessing at a future schema could
decide a resume wrongly. Older versions are brought forward by upcasters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import attrs

from .checkpoints import Checkpoint
from .errors import TimelineUnreadable
from .records import (
    BOOL,
    CHECKPOINT,
    INT,
    KNOWN_RECORDS,
    PASSES,
    STATUS,
    STR,
    STRS,
    TIME,
    NodeFinished,
    Record,
    RunRewound,
    RunStatus,
    ScratchBanked,
    UnknownRecord,
)

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

#: (wire name, from version) -> function turning that version's fields into the next's.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    # ADR 0006: a v1 teardown record names no object; it reads as naming the legacy key.
    ("sandbox_scratch_banked", 1): lambda data: data,
    # ADR 0013: records before v3 (banked) and v2 (restored) carry no checkpoint stamp.
    ("sandbox_scratch_banked", 2): lambda data: data,
    ("sandbox_scratch_restored", 1): lambda data: data,
    # K6: a restore before v3 names no bank record (it restored the current bank).
    ("sandbox_scratch_restored", 2): lambda data: data,
    # A queued resume before v2 names no checkpoint (the events decide, K5).
    ("attempt_queued", 1): lambda data: data,
    # K9: a finish before v2 names no pass, a rewind before v2 no replayed passes (R6 decides).
    ("node_finished", 1): lambda data: data,
    ("run_rewound", 1): lambda data: data,
}

_BY_WIRE: dict[str, type[Record]] = {cls.WIRE: cls for cls in KNOWN_RECORDS}
_RESERVED = ("type", "v")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _wire_name(field: attrs.Attribute[Any]) -> str:
    return str(field.metadata.get("wire_name") or field.name)


def _read_value(kind: str, value: Any, name: str, pos: int | None) -> Any:
    """Check one present, non-null field against its kind and convert it."""

    def bad(expected: str) -> TimelineUnreadable:
        return TimelineUnreadable(
            f"field '{name}' should be {expected}, got {type(value).__name__}", position=pos
        )

    if kind == BOOL:
        if not isinstance(value, bool):
            raise bad("a boolean")
        return value
    if kind == INT:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("a non-negative integer")
        return value
    if kind == STR:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if kind == STRS:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return tuple(value)
    if kind == CHECKPOINT:
        if (
            not isinstance(value, list | tuple)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise bad("a checkpoint (a non-empty list of non-empty ids)")
        return Checkpoint(tuple(value))
    if kind == PASSES:
        return _read_passes(value, bad)
    if kind == STATUS:
        try:
            return RunStatus(value)
        except ValueError:
            raise bad("a run status") from None
    if kind == TIME:
        if not isinstance(value, str):
            raise bad("an ISO 8601 time")
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise bad("an ISO 8601 time") from None
    raise AssertionError(f"unknown wire kind {kind}")  # pragma: no cover


def _read_passes(value: Any, bad: Callable[[str], TimelineUnreadable]) -> Any:
    """K9: an object naming, per node, a non-empty list of positive pass numbers."""
    expected = "an object of node -> a non-empty list of positive pass numbers"
    if not isinstance(value, Mapping):
        raise bad(expected)
    for passes in value.values():
        if not isinstance(passes, list | tuple) or not passes:
            raise bad(expected)
        if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in passes):
            raise bad(expected)
    return dict(value)


def _upcast(
    wire_name: str,
    version: int,
    data: dict[str, Any],
    upcasters: Mapping[tuple[str, int], Upcaster],
) -> dict[str, Any]:
    cls = _BY_WIRE[wire_name]
    while version < cls.VERSION:
        step = upcasters.get((wire_name, version))
        if step is None:
            raise TimelineUnreadable(f"no upcaster for {wire_name} v{version}")
        data = step(data)
        version += 1
    return data


def decode(
    obj: Any,
    *,
    position: int | None = None,
    upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
) -> Record:
    """Read one wire object into a record, or raise TimelineUnreadable naming why."""
    try:
        return _decode(obj, position, upcasters)
    except TimelineUnreadable as error:
        if error.position is None and position is not None:
            raise TimelineUnreadable(error.message, position=position) from None
        raise


def _decode(obj: Any, position: int | None, upcasters: Mapping[tuple[str, int], Upcaster]) -> Record:
    if not isinstance(obj, Mapping):
        raise TimelineUnreadable("a record must be a JSON object", position=position)
    type_name = obj.get("type")
    if not isinstance(type_name, str) or not type_name:
        raise TimelineUnreadable("a record needs a string 'type'", position=position)
    version = obj.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TimelineUnreadable("'v' must be a positive integer", position=position)
    cls = _BY_WIRE.get(type_name)
    if cls is None:
        data = {k: v for k, v in obj.items() if k not in _RESERVED}
        return UnknownRecord(type=type_name, data=data)
    if version > cls.VERSION:
        raise TimelineUnreadable(
            f"{type_name} v{version} is newer than this build reads (v{cls.VERSION})",
            position=position,
        )
    data = _upcast(type_name, version, dict(obj), upcasters)
    kwargs: dict[str, Any] = {}
    for field in attrs.fields(cls):
        name = _wire_name(field)
        value = data.get(name)
        if value is None:
            if field.metadata["required"]:
                raise TimelineUnreadable(f"{type_name} lacks required field '{name}'", position=position)
            continue
        kwargs[field.name] = _read_value(field.metadata["wire_kind"], value, name, position)
    record = cls(**kwargs)
    _check_invariants(record, position)
    return record


def _check_invariants(record: Record, position: int | None) -> None:
    if isinstance(record, NodeFinished) and record.pass_ == 0:
        raise TimelineUnreadable("node_finished names pass 0 (passes count from 1)", position=position)
    if isinstance(record, RunRewound) and record.replayed is not None:
        strays = [n for n, _ in record.replayed if not record.drops(n)]
        if strays:
            raise TimelineUnreadable(
                f"run_rewound replays passes of nodes it did not drop: {', '.join(strays)}",
                position=position,
            )
    if isinstance(record, ScratchBanked):
        if record.outcomes() > 1:
            raise TimelineUnreadable(
                "sandbox_scratch_banked claims more than one of banked/empty/unknown/finished",
                position=position,
            )
        if record.banked and record.bytes == 0:
            raise TimelineUnreadable("sandbox_scratch_banked is banked with 0 bytes", position=position)
        if record.object is not None and not _names_its_digest(record):
            raise TimelineUnreadable(
                "sandbox_scratch_banked names an object that is not banks/<its sha256>.tgz", position=position
            )


def _names_its_digest(record: ScratchBanked) -> bool:
    """A17: a record's object is the bank its own digest names, beneath the run's bank prefix."""
    return (
        record.banked
        and record.object == f"banks/{record.sha256}.tgz"
        and _HEX64.fullmatch(record.sha256 or "") is not None
    )


def encode(record: Record) -> dict[str, Any]:
    """Write a record as its wire object (decode(encode(r)) == r)."""
    if isinstance(record, UnknownRecord):
        return {"type": record.type, **dict(record.data)}
    out: dict[str, Any] = {"type": record.WIRE, "v": record.VERSION}
    for field in attrs.fields(type(record)):
        value = getattr(record, field.name)
        if value is None:
            continue
        if field.metadata["wire_kind"] == PASSES:
            value = {node: list(passes) for node, passes in value}
        elif isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, RunStatus):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Checkpoint):
            value = list(value.lineage)
        out[_wire_name(field)] = value
    return out


def decode_all(objs: Iterable[Any]) -> tuple[Record, ...]:
    """Decode a whole timeline; the first bad record makes all of it unreadable (R15)."""
    return tuple(decode(obj, position=i) for i, obj in enumerate(objs))
