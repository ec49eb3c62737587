"""The wire codec: stable names, versions, strict reading of known records (A6, R15)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scratchbank.domain import TimelineUnreadable, UnknownRecord, decode, encode
from scratchbank.domain.records import KNOWN_RECORDS, RunStatus, RunStatusChanged
from scratchbank.testing.builders import banked, node, rewound, shared

WIRE_NAMES = {
    "run_started",
    "run_resumed",
    "node_finished",
    "run_rewound",
    "sandbox_scratch_banked",
    "sandbox_scratch_restored",
    "sandbox_shared",
    "scratch_forsaken",
    "attempt_queued",
    "attempt_claimed",
    "run_status_changed",
    "lease_taken",  # the runner's fencing token (issue #13)
    "resume_refused",  # a detached runner's refusal in the run's log (R12)
    "orphan_swept",  # the orphan sweeper published again or parked (L4)
}


def test_wire_names_are_the_adrs_and_stable() -> None:
    assert {cls.WIRE for cls in KNOWN_RECORDS} == WIRE_NAMES


def test_round_trip_keeps_every_field() -> None:
    at = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    for rec in (
        banked(raced=("./a",)),
        node("a", in_sandbox=True, on_cycle=True),
        rewound("a", on_cycle=("a",)),
        shared(copy_based=True),
        RunStatusChanged(status=RunStatus.PAUSED, at=at),
    ):
        assert decode(encode(rec)) == rec


def test_metadata_fields_use_the_adrs_underscored_names() -> None:
    wire = encode(node("a", in_sandbox=True, on_cycle=False))
    assert wire["_in_sandbox"] is True and wire["_on_cycle"] is False
    assert wire["type"] == "node_finished" and wire["v"] == 2


def test_unknown_record_types_are_kept_not_dropped() -> None:
    rec = decode({"type": "llm_usage", "tokens": 3})
    assert rec == UnknownRecord(type="llm_usage", data={"tokens": 3})
    assert encode(rec) == {"type": "llm_usage", "tokens": 3}


def test_older_versions_are_brought_forward_by_upcasters() -> None:
    from scratchbank.domain.records import NodeFinished

    class Later(NodeFinished):
        VERSION = 2

    from scratchbank.domain import wire

    old = {"type": "node_finished", "v": 1, "node": "a", "ok": True}
    saved = wire._BY_WIRE["node_finished"]
    wire._BY_WIRE["node_finished"] = Later
    try:
        upcasters = {("node_finished", 1): lambda d: {**d, "succeeded": d.pop("ok")}}
        rec = decode(old, upcasters=upcasters)
        assert isinstance(rec, Later) and rec.succeeded
        with pytest.raises(TimelineUnreadable, match="no upcaster"):
            decode(old, upcasters={})
    finally:
        wire._BY_WIRE["node_finished"] = saved
