"""Delivery admission: the consents a resume carries and the runner's delivery rules (C1-C6).

``--force`` accepts a changed source or artifact contract, never the scratch's loss
(C1); the loss needs its own consent (C2). Both belong to one resume call (C3): the
engine drops them when the call returns, so they are passed per decision and never
stored in the state a later resume reads.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from .fold import ScratchState
from .records import AttemptClaimed, AttemptQueued, OrphanSwept, Record, ScratchBanked


@attrs.frozen
class Consents:
    """What the caller of this one resume accepted."""

    force: bool = False
    accept_scratch_loss: bool = False


NONE = Consents()


class Delivery(enum.Enum):
    """What the runner does with a resume delivery it received."""

    CLAIM = "claim"  # the run is queued for this attempt: claim it, its consents apply
    REDELIVERED = "redelivered"  # already claimed for it: go on, but no consent applies (C4)
    SUPERSEDED = "superseded"  # published before the run was last queued: drop it (C6)
    DONE = "done"  # its attempt was claimed and its execution already ended: drop it


@attrs.frozen
class DeliveryVerdict:
    delivery: Delivery
    consents: Consents
    rule: str
    reason: str


def judge_delivery(state: ScratchState, attempt: str, carried: Consents) -> DeliveryVerdict:
    """Admit a delivery published for ``attempt`` carrying ``carried`` consents (C4-C6)."""
    queued = state.queued_attempt
    if queued is not None and queued.attempt != attempt:
        why = f"published for attempt {attempt}, the run is queued for {queued.attempt}"
        return DeliveryVerdict(Delivery.SUPERSEDED, NONE, "C6", why)
    if state.claimed_attempt == attempt:
        why = f"attempt {attempt} was already claimed: a redelivery lends no consent"
        return DeliveryVerdict(Delivery.REDELIVERED, NONE, "C4", why)
    return DeliveryVerdict(Delivery.CLAIM, carried, "C5", f"claims attempt {attempt}")


def attempt_ended(records: Sequence[Record], attempt: str) -> bool:
    """The attempt was claimed and a teardown record followed its last claim.

    A delivery the queue gives again after its run was carried on (an ack lost to a
    server restart) must not carry the run on twice: nothing of it is applied again.
    """
    claims = [i for i, r in enumerate(records) if isinstance(r, AttemptClaimed) and r.attempt == attempt]
    return bool(claims) and any(isinstance(r, ScratchBanked) for r in records[claims[-1] :])


def orphan_parked(records: Sequence[Record], attempt: str) -> bool:
    """The orphan sweeper parked ``attempt`` after it was last queued (L4)."""
    queued = [i for i, r in enumerate(records) if isinstance(r, AttemptQueued) and r.attempt == attempt]
    since = records[queued[-1] :] if queued else records
    return any(isinstance(r, OrphanSwept) and r.parked and r.attempt == attempt for r in since)


def admit(records: Sequence[Record], state: ScratchState, attempt: str, carried: Consents) -> DeliveryVerdict:
    """Admit a delivery: superseded (C6), already carried on, parked by the orphan
    sweeper (L4: a late delivery applies nothing), or judge_delivery's verdict."""
    verdict = judge_delivery(state, attempt, carried)
    if verdict.delivery is Delivery.CLAIM and orphan_parked(records, attempt):
        why = f"attempt {attempt} went unclaimed and the orphan sweeper parked the run: resume it again"
        return DeliveryVerdict(Delivery.DONE, NONE, "L4", why)
    if verdict.delivery is Delivery.REDELIVERED and attempt_ended(records, attempt):
        why = f"attempt {attempt} was claimed and its execution ended: nothing is applied twice"
        return DeliveryVerdict(Delivery.DONE, NONE, "C4", why)
    return verdict
