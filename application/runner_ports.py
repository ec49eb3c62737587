"""The ports the runner drives: a delivery queue, a lease, a sandbox provider, an engine.

Each has a real adapter over a server (NATS JetStream for the queue and the lease)
and an in-process one for the embedded default; both pass the same contract tests.
The runner is synchronous: an adapter over an async client runs its own loop.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from typing import Protocol

import attrs

from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.consent import Consents

from .ports import Sandbox, Timeline


@attrs.frozen
class ResumeDelivery:
    """One published resume: the run, the attempt it was published for, its consents (C5).

    ``msg_id`` de-duplicates a publication the publisher sent twice. ``republished``
    counts the orphan sweeper's publications of the same attempt (a new message id,
    the same resume: the same attempt and consents).
    """

    run_id: str
    attempt: str
    consents: Consents = Consents()
    republished: int = 0
    #: the checkpoint the engine resumes from (ADR 0013); None: the events decide (K5)
    checkpoint: Checkpoint | None = None

    @property
    def msg_id(self) -> str:
        again = f".r{self.republished}" if self.republished else ""
        return f"{self.run_id}.{self.attempt}{again}"


class Inbound(Protocol):
    """A delivery as the runner holds it until it acks or naks it."""

    delivery: ResumeDelivery
    deliveries: int  # how many times it was delivered, this one included (1-based)

    def ack(self) -> None: ...

    def nak(self, delay: float) -> None:
        """Deliver it again after ``delay`` seconds."""
        ...

    def in_progress(self) -> None:
        """Tell the queue the runner is still working on it (resets its ack wait)."""
        ...


class DeliveryQueue(Protocol):
    """Where resumes are published and from which runners fetch them.

    Contract: ``publish`` answers False for a publication it already holds (same
    ``msg_id``); a fetched delivery not acked is delivered again (after ``nak``'s delay,
    or after the ack wait); an acked one never is.
    """

    def publish(self, delivery: ResumeDelivery) -> bool: ...

    def fetch(self, timeout: float) -> Inbound | None: ...


@attrs.frozen
class LeaseGrant:
    """A held lease: ``token`` is its fencing token (grows with each new holder);
    ``revision`` is what the next refresh compares and sets."""

    run_id: str
    holder: str
    token: int
    revision: int


class Lease(Protocol):
    """One holder per run at a time; an unrefreshed lease lapses.

    Contract: ``acquire`` answers None while another holder's lease is alive; a lapsed
    lease can be taken, with a token greater than every earlier holder's. ``refresh``
    raises LeaseLost once the lease lapsed and was taken (or vanished). ``release``
    is idempotent and never releases another holder's lease.
    """

    def acquire(self, run_id: str, holder: str) -> LeaseGrant | None: ...

    def refresh(self, grant: LeaseGrant) -> LeaseGrant: ...

    def release(self, grant: LeaseGrant) -> None: ...


class SandboxProvider(Protocol):
    """Starts a fresh sandbox for a run, and tears one down.

    ``orphans`` finds the run's sandboxes this provider did not start: those a runner
    whose lease lapsed left behind (killed or cut off before its teardown). The new
    holder banks them when that is safe, then stops them, before its own claim.
    """

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox: ...

    def stop(self, sandbox: Sandbox) -> None: ...

    def orphans(self, run_id: str) -> Sequence[Sandbox]: ...


class EngineEnd(enum.Enum):
    """How the engine returned: a park or failure can be resumed (L2 arms its ceiling)."""

    PARKED = "parked"
    FAILED = "failed"
    FINISHED = "finished"
    CANCELLED = "cancelled"

    @property
    def resume_can_wait(self) -> bool:
        return self is not EngineEnd.FINISHED


class Engine(Protocol):
    """Continues a run inside a sandbox until it parks, fails, finishes or is cancelled.

    Every write goes through ``timeline`` (the runner hands a fenced one). ``cancel``
    is set when the runner loses its lease (L5).
    """

    def continue_run(
        self, run_id: str, *, sandbox: Sandbox, timeline: Timeline, cancel: threading.Event
    ) -> EngineEnd: ...
