"""Resume deliveries and run leases on NATS JetStream (``nats-py``).

Deliveries: a stream ``SB_RESUMES`` on ``sb.resume.<run>``; each publication carries
``Nats-Msg-Id: <run>.<attempt>`` so a publisher that sends twice queues once; runners
share one durable pull consumer (explicit acks, an ack wait, a redelivery count).

Leases (ADR 0005, ADR 0011): the key-value bucket ``sb_leases``, one key per run, with
the lapse as the bucket's TTL: the server ages each value and drops it when nobody
refreshed it in time, so expiry is read from the server's clock, never a runner's.
Taking a lease is ``create`` (refused while a live value is there), so of two runners
exactly one wins; a refresh is ``update(last=rev)``. The revision is a stream sequence
that only grows, so the revision a holder took the lease at is its fencing token.

The runner is synchronous: one event loop runs in a thread of its own and every
call is handed to it. Every client error is translated here (QueueUnavailable,
LeaseLost).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, KeyValueConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from scratchbank.application.ports import Clock, LeaseGrant, ResumeDelivery, SystemClock
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import Checkpoint, checkpoint_of
from scratchbank.domain.errors import InvalidCheckpoint, LeaseLost, QueueUnavailable
from scratchbank.domain.runs import check_run_id

T = TypeVar("T")
CALL_TIMEOUT = 30.0
#: The first connect's deadline: an unreachable server is QUEUE_UNAVAILABLE this soon (the
#: client would try forever, its reconnects being unbounded for a connection once made).
CONNECT_SECONDS = 5.0


def names(namespace: str = "sb") -> tuple[str, str, str, str]:
    """Stream, subject prefix, durable consumer and lease bucket of one deployment."""
    return (
        f"{namespace.upper()}_RESUMES",
        f"{namespace}.resume",
        f"{namespace}-runners",
        f"{namespace}_leases",
    )


class NatsConnection:
    """One connection to a NATS server, its loop in a thread; ``call`` runs a coroutine on it."""

    def __init__(
        self, url: str, *, name: str = "scratchbank", connect_seconds: float = CONNECT_SECONDS
    ) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="nats-loop", daemon=True)
        self._thread.start()
        try:
            self.nc: Client = self.call(self._connect(name, connect_seconds), timeout=connect_seconds + 5)
        except BaseException:
            self._stop_loop()
            raise
        self.js: JetStreamContext = self.nc.jetstream()

    async def _connect(self, name: str, seconds: float) -> Client:
        client = Client()
        options: dict[str, Any] = {  # the client's own annotations say int; it takes seconds
            "connect_timeout": min(5.0, seconds),
            "reconnect_time_wait": 0.5,
        }
        connecting = client.connect(
            self.url, name=name, max_reconnect_attempts=-1, allow_reconnect=True, **options
        )
        handed = False
        try:
            await asyncio.wait_for(connecting, seconds)  # cancelled and ended by then
            handed = True
            return client
        except TimeoutError:
            raise ConnectionError(f"no server answered within {seconds:g} s") from None
        finally:
            if not handed:  # a socket a silent server accepted goes too (found by attack)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 1.0)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the loop; every NATS failure becomes QueueUnavailable."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except (nats.errors.Error, TimeoutError, OSError) as error:
            future.cancel()
            raise QueueUnavailable(f"NATS at {self.url}: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        with contextlib.suppress(QueueUnavailable):
            self.call(self.nc.close(), timeout=5)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def _payload(delivery: ResumeDelivery) -> bytes:
    c = delivery.consents
    body = {
        "run_id": delivery.run_id,
        "attempt": delivery.attempt,
        "force": c.force,
        "accept_scratch_loss": c.accept_scratch_loss,
        "republished": delivery.republished,
    }
    if delivery.checkpoint is not None:  # v2 (ADR 0013): absent on an older delivery
        body["checkpoint"] = list(delivery.checkpoint.lineage)
    return json.dumps(body, sort_keys=True).encode()


def _checkpoint(lineage: object) -> Checkpoint | None:
    """v2's optional checkpoint: a non-empty list of non-empty ids (anything else is malformed)."""
    if lineage is None:
        return None
    if not isinstance(lineage, list):
        raise TypeError(f"checkpoint: a list of ids, not {type(lineage).__name__}")
    try:
        return checkpoint_of(lineage)
    except InvalidCheckpoint as error:
        raise ValueError(error.message) from error


def _delivery(data: bytes) -> ResumeDelivery:
    body = json.loads(data)
    consents = Consents(force=bool(body["force"]), accept_scratch_loss=bool(body["accept_scratch_loss"]))
    again = int(body.get("republished", 0))
    stamp = _checkpoint(body.get("checkpoint"))
    return ResumeDelivery(check_run_id(str(body["run_id"])), str(body["attempt"]), consents, again, stamp)


class NatsInbound:
    """A JetStream message held by a runner until it acks or naks it."""

    def __init__(self, conn: NatsConnection, msg: Msg, delivery: ResumeDelivery) -> None:
        self._conn, self._msg, self.delivery = conn, msg, delivery
        self.deliveries = int(msg.metadata.num_delivered)

    def ack(self) -> None:
        self._conn.call(self._msg.ack_sync(timeout=5))

    def nak(self, delay: float) -> None:
        self._conn.call(self._msg.nak(delay=delay))

    def in_progress(self) -> None:
        self._conn.call(self._msg.in_progress())

    def term(self) -> None:
        self._conn.call(self._msg.term())


class NatsDeliveryQueue:
    """A DeliveryQueue on a JetStream stream with one durable pull consumer."""

    def __init__(
        self, conn: NatsConnection, *, ack_wait: float = 240.0, max_deliver: int = -1, namespace: str = "sb"
    ) -> None:
        self.conn = conn
        self.stream, self.subject, self.durable, _ = names(namespace)
        self.conn.call(self._setup(ack_wait, max_deliver))

    async def _setup(self, ack_wait: float, max_deliver: int) -> None:
        js = self.conn.js
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.subject}.>"],
            storage=StorageType.FILE,
            duplicate_window=120.0,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)
        consumer = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
        )
        self._sub = await js.pull_subscribe(
            f"{self.subject}.>", durable=self.durable, stream=self.stream, config=consumer
        )

    def publish(self, delivery: ResumeDelivery) -> bool:
        subject = f"{self.subject}.{check_run_id(delivery.run_id)}"
        headers = {"Nats-Msg-Id": delivery.msg_id}
        ack = self.conn.call(self.conn.js.publish(subject, _payload(delivery), headers=headers))
        return not ack.duplicate

    def fetch(self, timeout: float) -> NatsInbound | None:
        msgs = self.conn.call(self._fetch(timeout), timeout=timeout + CALL_TIMEOUT)
        if not msgs:
            return None
        msg = msgs[0]
        try:
            delivery = _delivery(msg.data)
        except (ValueError, KeyError, TypeError) as error:
            self.conn.call(msg.term())  # a malformed publication is never retried
            raise QueueUnavailable(f"a malformed delivery was terminated: {error}") from error
        return NatsInbound(self.conn, msg, delivery)

    async def _fetch(self, timeout: float) -> list[Msg]:
        try:
            return await self._sub.fetch(1, timeout=timeout)
        except nats.errors.TimeoutError:
            return []


ACQUIRE_TRIES = 3  # a lease create racing the value's aging out, tried again


class NatsKvLease:
    """A Lease on the JetStream key-value store, expiring by the server's clock (ADR 0011).

    The bucket's TTL is the lapse: the server ages every value and drops one nobody
    refreshed within it. Taking the lease is ``create`` (refused while the key holds a
    live value: KeyWrongLastSequenceError), a refresh ``update(last=revision)`` (resets
    the server-side age; refused once the lease lapsed or was taken), a release
    ``delete(last=revision)``. No holder's clock is compared with another's: ``clock``
    only stamps the value for an operator reading it. The token is the revision the
    lease was taken at (the bucket's stream sequence: it only grows).
    """

    def __init__(
        self,
        conn: NatsConnection,
        *,
        lapse: float = 60.0,
        namespace: str = "sb",
        bucket: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.conn, self.lapse = conn, lapse
        self.clock = clock or SystemClock()
        self.bucket = bucket or names(namespace)[3]
        self.kv: KeyValue = self.conn.call(self._bucket())

    async def _bucket(self) -> KeyValue:
        config = KeyValueConfig(bucket=self.bucket, history=1, ttl=self.lapse, storage=StorageType.FILE)
        try:
            return await self.conn.js.create_key_value(config)
        except nats.js.errors.BadRequestError:  # there with another lapse (an older deployment's)
            stream = f"KV_{self.bucket}"
            info = await self.conn.js.stream_info(stream)
            window = min(info.config.duplicate_window or self.lapse, self.lapse)
            await self.conn.js.update_stream(
                dataclasses.replace(info.config, max_age=self.lapse, duplicate_window=window)
            )
            return await self.conn.js.key_value(self.bucket)

    def _value(self, holder: str) -> bytes:
        """Who holds it, and when it last said so (by its own clock: read by people only)."""
        return json.dumps({"holder": holder, "at": self.clock.now().isoformat()}).encode()

    async def _acquire(self, key: str, holder: str) -> int | None:
        for _ in range(ACQUIRE_TRIES):
            try:
                return await self.kv.create(key, self._value(holder))
            except nats.js.errors.KeyWrongLastSequenceError:
                return None  # a live value: held (the server has not aged it out)
            except nats.js.errors.KeyNotFoundError:
                # the value that made the create fail aged out before the client's check of it
                # (nats-py's create reads the key back to tell a live value from a deleted
                # one): the key is free now, so the create is tried again
                continue
        return None  # the key kept lapsing under our tries: held as far as we know (back off)

    def acquire(self, run_id: str, holder: str) -> LeaseGrant | None:
        rev = self.conn.call(self._acquire(check_run_id(run_id), holder))
        return None if rev is None else LeaseGrant(run_id, holder, rev, rev)

    async def _refresh(self, grant: LeaseGrant) -> int:
        try:
            return await self.kv.update(grant.run_id, self._value(grant.holder), last=grant.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise LeaseLost(
                f"run {grant.run_id}: the lease of {grant.holder} lapsed on the server, was taken or let go"
            ) from None

    def refresh(self, grant: LeaseGrant) -> LeaseGrant:
        rev = self.conn.call(self._refresh(grant))
        return LeaseGrant(grant.run_id, grant.holder, grant.token, rev)

    async def _release(self, grant: LeaseGrant) -> None:
        with contextlib.suppress(nats.js.errors.APIError):  # another holder's by now: kept
            await self.kv.delete(grant.run_id, last=grant.revision)

    def release(self, grant: LeaseGrant) -> None:
        self.conn.call(self._release(grant))
