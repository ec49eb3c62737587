"""The wire codec: stable names, versions, strict reading of known records (A6, R15)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scratchbank.domain import TimelineUnreadable, UnknownRecord, decode, decode_all, encode
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


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ({"type": "node_finished", "node": "a"}, "lacks required field 'succeeded'"),
        ({"type": "node_finished", "node": "a", "succeeded": "yes"}, "should be a boolean"),
        ({"type": "node_finished", "node": "a", "succeeded": 1}, "should be a boolean"),
        ({"type": "node_finished", "node": "a", "succeeded": True, "_in_sandbox": "no"}, "boolean"),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": False, "unknown": False},
            "lacks required field 'bytes'",
        ),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": True, "unknown": False, "bytes": 3},
            "more than one",
        ),
        (
            {"type": "sandbox_scratch_banked", "banked": True, "empty": False, "unknown": False, "bytes": -1},
            "non-negative",
        ),
        ({"type": "run_rewound", "dropped_nodes": "a"}, "list of strings"),
        ({"type": "run_status_changed", "status": "sleeping"}, "run status"),
        ({"type": "node_finished", "v": 3, "node": "a", "succeeded": True}, "newer"),
        ({"type": "node_finished", "v": 0, "node": "a", "succeeded": True}, "positive"),
        ({"type": "run_started", "at": "yesterday"}, "ISO 8601"),
        ({"node": "a"}, "string 'type'"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_A6_malformed_known_record_makes_the_timeline_unreadable(obj: Any, says: str) -> None:
    with pytest.raises(TimelineUnreadable, match=says):
        decode(obj)


def test_R15_one_bad_record_makes_the_whole_timeline_unreadable_naming_it() -> None:
    good = encode(node("a"))
    with pytest.raises(TimelineUnreadable, match="record 2"):
        decode_all([good, {"type": "node_finished"}, good])


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
