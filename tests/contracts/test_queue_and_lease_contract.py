"""One contract per runner port, run against every adapter: in-process and NATS JetStream."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from waiting import eventually

from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue, NatsKvLease
from scratchbank.application.ports import DeliveryQueue, Lease, ResumeDelivery
from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import LeaseLost

ACK_WAIT = 1.0
LAPSE = 0.6


D1 = ResumeDelivery("run-1", "a1", Consents(accept_scratch_loss=True))


def _taken_once_lapsed(lease: Lease, run_id: str, holder: str) -> Any:
    """The server ages a value out on its own schedule (NATS: within about a second past
    the TTL): ask until it is taken, failing past a bound."""
    return eventually(
        lambda: lease.acquire(run_id, holder), timeout=LAPSE + 30.0, what="the lease lapses", interval=0.1
    )


class QueueContract:
    """The delivery queue's contract; a subclass per adapter makes the queue (``make_queue``)."""

    @pytest.fixture
    def queue(self, request: pytest.FixtureRequest) -> Iterator[DeliveryQueue]:
        yield from self.make_queue(request)

    def make_queue(self, request: pytest.FixtureRequest) -> Iterator[DeliveryQueue]:
        raise NotImplementedError

    def test_queue_publication_is_deduplicated_by_message_id(self, queue: DeliveryQueue) -> None:
        """A publisher that sends one publication twice queues it once (Nats-Msg-Id)."""
        assert queue.publish(D1) is True
        assert queue.publish(D1) is False
        got = queue.fetch(2)
        assert got is not None and got.delivery == D1 and got.deliveries == 1
        got.ack()
        assert queue.fetch(0.3) is None

    def test_queue_a_sweepers_republication_is_a_new_message_with_the_same_resume(
        self, queue: DeliveryQueue
    ) -> None:
        """L4: the orphan sweeper's publication of the same attempt is not a duplicate, and
        arrives with its attempt, consents and republication count."""
        assert queue.publish(D1) is True
        first = queue.fetch(2)
        assert first is not None
        first.ack()
        again = ResumeDelivery(D1.run_id, D1.attempt, D1.consents, republished=1)
        assert queue.publish(again) is True
        got = queue.fetch(2)
        assert got is not None and got.delivery == again
        got.ack()

    def test_queue_nak_delivers_again_after_its_delay_with_a_count(self, queue: DeliveryQueue) -> None:
        """A nak'd delivery comes back (not before its delay), counted as the second delivery."""
        queue.publish(D1)
        first = queue.fetch(2)
        assert first is not None
        first.nak(0.5)
        assert queue.fetch(0.2) is None
        again = queue.fetch(3)
        assert again is not None and again.deliveries == 2 and again.delivery == D1
        again.ack()

    def test_queue_unacked_delivery_comes_back_after_the_ack_wait(self, queue: DeliveryQueue) -> None:
        """A runner that went silent (no ack, no nak) loses its delivery to another after ack wait."""
        queue.publish(D1)
        assert queue.fetch(2) is not None
        again = queue.fetch(ACK_WAIT + 3)
        assert again is not None and again.deliveries == 2
        again.ack()

    def test_queue_in_progress_keeps_a_delivery_past_the_ack_wait(self, queue: DeliveryQueue) -> None:
        """While the runner says it is working (L1's refreshes), the delivery is not given again."""
        queue.publish(D1)
        held = queue.fetch(2)
        assert held is not None
        for _ in range(4):
            time.sleep(ACK_WAIT / 2)
            held.in_progress()
        assert queue.fetch(0.2) is None
        held.ack()


class LeaseContract:
    """The run lease's contract; a subclass per adapter makes the lease (``make_lease``)."""

    @pytest.fixture
    def lease(self, request: pytest.FixtureRequest) -> Iterator[Lease]:
        yield from self.make_lease(request)

    def make_lease(self, request: pytest.FixtureRequest) -> Iterator[Lease]:
        raise NotImplementedError

    def test_lease_one_holder_at_a_time(self, lease: Lease) -> None:
        """Of two runners, only one holds the run; another run is free."""
        a = lease.acquire("run-1", "a")
        assert a is not None
        assert lease.acquire("run-1", "b") is None
        assert lease.acquire("run-2", "b") is not None

    def test_lease_lapses_and_the_next_holder_has_a_greater_token(self, lease: Lease) -> None:
        """Unrefreshed past its lapse, the lease is taken; the old holder's refresh fails."""
        a = lease.acquire("run-1", "a")
        assert a is not None
        b = _taken_once_lapsed(lease, "run-1", "b")
        assert b is not None and b.token > a.token
        with pytest.raises(LeaseLost):
            lease.refresh(a)
        lease.release(a)  # never releases b's lease
        assert lease.acquire("run-1", "c") is None

    def test_lease_refresh_keeps_it_and_release_frees_it(self, lease: Lease) -> None:
        a = lease.acquire("run-1", "a")
        assert a is not None
        for _ in range(4):
            time.sleep(LAPSE / 3)
            a = lease.refresh(a)
        assert lease.acquire("run-1", "b") is None
        lease.release(a)
        lease.release(a)  # idempotent
        assert lease.acquire("run-1", "b") is not None

    def test_lease_racing_acquirers_exactly_one_wins(self, lease: Lease) -> None:
        """Eight runners race for one free lease: exactly one takes it."""
        won: list[Any] = []
        start = threading.Barrier(8)

        def take(name: str) -> None:
            start.wait()
            grant = lease.acquire("run-9", name)
            if grant is not None:
                won.append(grant)

        threads = [threading.Thread(target=take, args=(f"r{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(won) == 1


class TestInProcessQueueContract(QueueContract):
    def make_queue(self, request: pytest.FixtureRequest) -> Iterator[DeliveryQueue]:
        yield InProcessQueue(ack_wait=ACK_WAIT)


class TestNatsQueueContract(QueueContract):
    def make_queue(self, request: pytest.FixtureRequest) -> Iterator[DeliveryQueue]:
        conn = NatsConnection(request.getfixturevalue("nats_url"))
        try:
            yield NatsDeliveryQueue(conn, ack_wait=ACK_WAIT, namespace=namespace())
        finally:
            conn.close()


class TestInProcessLeaseContract(LeaseContract):
    def make_lease(self, request: pytest.FixtureRequest) -> Iterator[Lease]:
        yield InProcessLease(lapse=LAPSE)


class TestNatsLeaseContract(LeaseContract):
    def make_lease(self, request: pytest.FixtureRequest) -> Iterator[Lease]:
        conn = NatsConnection(request.getfixturevalue("nats_url"))
        try:
            yield NatsKvLease(conn, lapse=LAPSE, namespace=namespace())
        finally:
            conn.close()
