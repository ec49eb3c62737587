"""The fold's state as plain data, so that a long timeline need not be folded from the
start every time (snapshots). A snapshot is a cache: one this build cannot read is
ignored and the timeline folded from its first record, never trusted half-way.
"""

from __future__ import annotations

from typing import Any

from .checkpoints import Checkpoint
from .fold import Adoption, Bank, Evidence, ScratchState, StaleWrite
from .records import AttemptQueued, RunStatus, ScratchBanked
from .retention import Kept
from .wire import decode, encode

#: Bump when ScratchState changes shape: older snapshots are then ignored.
#: v4 (ADR 0013, K8): the checkpoints' banks retention reads (``history``).
#: v5 (K9): a stale write's pass and the rewind that kept it; the rewind that replayed (``replayed``).
SNAPSHOT_VERSION = 5


def _ev(ev: Evidence | None) -> list[Any] | None:
    return None if ev is None else [ev.position, ev.type]


def _unev(data: Any) -> Evidence | None:
    return None if data is None else Evidence(int(data[0]), str(data[1]))


def _stamp(bank: Bank) -> list[str] | None:
    """ADR 0013: the bank's current stamp (a snapshot without it reads its record's)."""
    return None if bank.checkpoint is None else list(bank.checkpoint.lineage)


def state_to_data(state: ScratchState) -> dict[str, Any]:
    bank = state.bank
    adoption = state.adoption
    return {
        "v": SNAPSHOT_VERSION,
        "records": state.records,
        "bank": None
        if bank is None
        else [_ev(bank.evidence), encode(bank.record), bank.current_since, _stamp(bank)],
        "stale_writes": [
            [_ev(w.evidence), w.node, w.on_cycle, w.pass_, _ev(w.kept_by)] for w in state.stale_writes
        ],
        "replayed": _ev(state.replayed),
        "unbanked": _ev(state.unbanked),
        "unbanked_reason": state.unbanked_reason,
        "forsaken": _ev(state.forsaken),
        "host_backed": _ev(state.host_backed),
        "last_teardown": _ev(state.last_teardown),
        "banking_ended": _ev(state.banking_ended),
        "latest_execution": _ev(state.latest_execution),
        "latest_execution_id": state.latest_execution_id,
        "adoption": None
        if adoption is None
        else [_ev(adoption.evidence), adoption.scratch_container_local, adoption.parent_copy_based],
        "hold": _ev(state.hold),
        "queued_attempt": None if state.queued_attempt is None else encode(state.queued_attempt),
        "claimed_attempt": state.claimed_attempt,
        "status": None if state.status is None else state.status.value,
        "unknown_records": state.unknown_records,
        "named_objects": sorted(state.named_objects, key=lambda n: (n is not None, n or "")),
        "history": [[list(k.checkpoint.lineage), encode(k.record), k.position] for k in state.history],
    }


def _history(data: Any) -> tuple[Kept, ...] | None:
    kept: list[Kept] = []
    for lineage, record, position in data:
        rec = decode(record)
        if not isinstance(rec, ScratchBanked):
            return None
        kept.append(Kept(Checkpoint(lineage), rec, int(position)))
    return tuple(kept)


def state_from_data(data: Any) -> ScratchState | None:
    """The state a snapshot holds, or None when it is not one this build can trust."""
    try:
        if data.get("v") != SNAPSHOT_VERSION:
            return None
        bank = None
        if data["bank"] is not None:
            ev, record, since, *stamp = data["bank"]
            rec = decode(record)
            if not isinstance(rec, ScratchBanked):
                return None
            checkpoint = rec.checkpoint if not stamp else None if stamp[0] is None else Checkpoint(stamp[0])
            bank = Bank(_unev(ev), rec, int(since), checkpoint)  # type: ignore[arg-type]
        queued = None
        if data["queued_attempt"] is not None:
            rec2 = decode(data["queued_attempt"])
            if not isinstance(rec2, AttemptQueued):
                return None
            queued = rec2
        history = _history(data["history"])
        if history is None:
            return None
        adoption = None
        if data["adoption"] is not None:
            ev, local, copy = data["adoption"]
            adoption = Adoption(_unev(ev), bool(local), bool(copy))  # type: ignore[arg-type]
        return ScratchState(
            records=int(data["records"]),
            bank=bank,
            stale_writes=tuple(
                StaleWrite(_unev(ev), str(node), cyc, pass_, _unev(kept))  # type: ignore[arg-type]
                for ev, node, cyc, pass_, kept in data["stale_writes"]
            ),
            replayed=_unev(data["replayed"]),
            unbanked=_unev(data["unbanked"]),
            unbanked_reason=str(data["unbanked_reason"]),
            forsaken=_unev(data["forsaken"]),
            host_backed=_unev(data["host_backed"]),
            last_teardown=_unev(data["last_teardown"]),
            banking_ended=_unev(data["banking_ended"]),
            latest_execution=_unev(data["latest_execution"]),
            latest_execution_id=data.get("latest_execution_id"),
            adoption=adoption,
            hold=_unev(data["hold"]),
            queued_attempt=queued,
            claimed_attempt=data["claimed_attempt"],
            status=None if data["status"] is None else RunStatus(data["status"]),
            unknown_records=int(data["unknown_records"]),
            named_objects=frozenset(None if n is None else str(n) for n in data["named_objects"]),
            history=history,
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None
    except Exception:  # a TimelineUnreadable from decode: the snapshot is not trusted
        return None
