"""Consents and the runner's delivery rules (C1-C6).

``--force`` accepts a changed source or artifact contract, never the scratch's loss
(C1); the loss needs its own consent (C2). Both belong to one resume call (C3): the
engine drops them when the call returns, so they are passed per decision and never
stored in the state a later resume reads.
"""

from __future__ import annotations

import enum

import attrs

from .fold import ScratchState


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
