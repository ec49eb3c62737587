"""The embedded default's queue and lease: in this process, behind the same ports.

``InProcessQueue`` behaves as the JetStream adapter does (de-duplication by message
id, redelivery after a nak's delay or the ack wait, a delivery count per message);
``InProcessLease`` as the key-value lease does (compare-and-set on a revision that
only grows, a lapse after which another holder may take it). Both pass the contract
suites in ``tests/contracts/test_queue_and_lease_contract.py``.
"""

from __future__ import annotations

import threading

import attrs

from scratchbank.application.ports import Clock, LeaseGrant, ResumeDelivery, SystemClock
from scratchbank.domain.errors import LeaseLost


@attrs.define
class _Message:
    delivery: ResumeDelivery
    available_at: float
    deliveries: int = 0
    acked: bool = False


@attrs.define
class InProcessInbound:
    """A delivery held by a runner until it acks or naks it."""

    delivery: ResumeDelivery
    deliveries: int
    _queue: InProcessQueue
    _message: _Message

    def ack(self) -> None:
        self._queue._settle(self._message, acked=True, delay=0.0)

    def nak(self, delay: float) -> None:
        self._queue._settle(self._message, acked=False, delay=delay)

    def in_progress(self) -> None:
        self._queue._settle(self._message, acked=False, delay=self._queue.ack_wait)


class InProcessQueue:
    """A DeliveryQueue in this process: FIFO by availability, redelivered until acked."""

    def __init__(self, *, ack_wait: float = 240.0, clock: Clock | None = None) -> None:
        self.ack_wait = ack_wait
        self.clock = clock or SystemClock()
        self._messages: list[_Message] = []
        self._ids: set[str] = set()
        self._cond = threading.Condition()

    def publish(self, delivery: ResumeDelivery) -> bool:
        with self._cond:
            if delivery.msg_id in self._ids:
                return False
            self._ids.add(delivery.msg_id)
            self._messages.append(_Message(delivery, self.clock.monotonic()))
            self._cond.notify_all()
            return True

    def _ready(self) -> _Message | None:
        now = self.clock.monotonic()
        ready = [m for m in self._messages if not m.acked and m.available_at <= now]
        return min(ready, key=lambda m: m.available_at) if ready else None

    def fetch(self, timeout: float) -> InProcessInbound | None:
        deadline = self.clock.monotonic() + timeout
        with self._cond:
            while (message := self._ready()) is None:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.05))
            message.deliveries += 1
            message.available_at = self.clock.monotonic() + self.ack_wait
            return InProcessInbound(message.delivery, message.deliveries, self, message)

    def _settle(self, message: _Message, *, acked: bool, delay: float) -> None:
        with self._cond:
            message.acked = message.acked or acked
            if not message.acked:
                message.available_at = self.clock.monotonic() + delay
            self._cond.notify_all()

    def pending(self) -> int:
        """How many publications are not acked yet."""
        with self._cond:
            return sum(not m.acked for m in self._messages)


@attrs.frozen
class _Held:
    holder: str
    token: int
    revision: int
    expires_at: float


class InProcessLease:
    """A Lease in this process: one holder per run, lapsing ``lapse`` seconds after a refresh."""

    def __init__(self, *, lapse: float = 60.0, clock: Clock | None = None) -> None:
        self.lapse = lapse
        self.clock = clock or SystemClock()
        self._held: dict[str, _Held] = {}
        self._revision = 0
        self._lock = threading.Lock()

    def acquire(self, run_id: str, holder: str) -> LeaseGrant | None:
        with self._lock:
            held = self._held.get(run_id)
            if held is not None and held.expires_at > self.clock.monotonic():
                return None
            self._revision += 1
            rev = self._revision
            self._held[run_id] = _Held(holder, rev, rev, self.clock.monotonic() + self.lapse)
            return LeaseGrant(run_id, holder, rev, rev)

    def refresh(self, grant: LeaseGrant) -> LeaseGrant:
        with self._lock:
            held = self._held.get(grant.run_id)
            if held is None or held.revision != grant.revision:
                raise LeaseLost(f"run {grant.run_id}: the lease of {grant.holder} was taken or let go")
            self._revision += 1
            expires = self.clock.monotonic() + self.lapse
            self._held[grant.run_id] = attrs.evolve(held, revision=self._revision, expires_at=expires)
            return attrs.evolve(grant, revision=self._revision)

    def release(self, grant: LeaseGrant) -> None:
        with self._lock:
            held = self._held.get(grant.run_id)
            if held is not None and held.revision == grant.revision:
                del self._held[grant.run_id]
