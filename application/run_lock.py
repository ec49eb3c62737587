"""Holding the run's lock (A16, ADR 0007): take it or refuse by name, keep it, hand it on.

``take`` acquires the lock for an execution (its id is the holder) or raises RunLocked
(retryable) while another holder is live, after waiting ``wait`` seconds. ``HeldLock``
keeps a grant alive (a refresh every third of the lease) until it is released or lost:
``ScratchService`` holds one per execution it started, from the resume's claim to the
teardown's record. ``LOCAL`` is the process-local lock a lock-less caller of the
exported functions gets (threads only; position fencing still holds across processes).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from scratchbank.domain.errors import LeaseLost, LockLost, LockUnavailable, QueueUnavailable, RunLocked
from scratchbank.domain.records import RunStarted
from scratchbank.domain.runs import check_run_id

from .ports import Clock, Lease, LeaseGrant, LockGrant, LockHolder, RunLock, SystemClock, Timeline

#: The lease of an execution's lock: it lapses this long after its last refresh.
LOCK_TTL = 60.0
#: How long a lock-less resume waits on a live holder before RUN_LOCKED (0: refuse at once).
LOCK_WAIT = 0.0


def new_execution() -> str:
    """A fresh execution id (A18): written on its start record and its teardown's."""
    return f"x-{uuid.uuid4().hex[:16]}"


def take(
    lock: RunLock,
    run_id: str,
    holder: str,
    *,
    ttl: float = LOCK_TTL,
    wait: float = LOCK_WAIT,
    clock: Clock | None = None,
) -> LockGrant:
    """The run's lock for ``holder``, or RunLocked naming the live holder (retryable)."""
    clock = clock or SystemClock()
    start = clock.monotonic()
    pause = 0.05
    while True:
        grant = lock.acquire(run_id, holder, ttl=ttl)
        if grant is not None:
            return grant
        left = wait - (clock.monotonic() - start)
        if left <= 0:
            raise _locked(lock, run_id)
        clock.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)


def _locked(lock: RunLock, run_id: str) -> RunLocked:
    try:
        held = lock.holder(run_id)
    except LockUnavailable:
        held = None
    if held is None:
        return RunLocked(f"run {run_id}: another holder has the run's lock; nothing was read or written")
    return RunLocked(
        f"run {run_id}: the run's lock is held by {held.holder} since {held.since.isoformat()} "
        f"(token {held.token}, lease until {held.expires.isoformat()}); nothing was read or written",
        holder=held.holder,
        token=held.token,
    )


class HeldLock:
    """A grant kept alive in the background until ``release`` (or until it is lost).

    ``lost`` is set with the reason once a refresh failed for good (LockLost): the
    holder is fenced and must stop writing; a store that does not answer is tried again
    on the next tick while the lease still runs.
    """

    def __init__(self, lock: RunLock, grant: LockGrant, *, ttl: float = LOCK_TTL) -> None:
        self.lock, self.grant, self.ttl = lock, grant, ttl
        self.lost = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._keep_alive()

    def _keep_alive(self) -> None:
        """Start the refresh thread (the testing kit's explorer, whose clocks stand still,
        holds its grants with a subclass that starts none)."""
        self._thread = threading.Thread(target=self._loop, name=f"run-lock-{self.grant.run_id}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.grant = self.lock.refresh(self.grant, ttl=self.ttl)
            except LockLost as error:
                self.lost = error.message
                return
            except LockUnavailable:
                continue

    def stop(self) -> None:
        """Stop refreshing WITHOUT letting the lock go (as a process that dies: the lease
        lapses on its own)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.ttl)

    def release(self) -> None:
        """Stop refreshing and let the lock go (idempotent; a lost grant is not another's)."""
        self.stop()
        with contextlib.suppress(LockUnavailable):  # the lease lapses on its own
            self.lock.release(self.grant)


# ---- The row logic every lease-row adapter shares, and the in-memory lock --------------

Row = tuple[str, int, float, float]  # holder, token, since, expires (epoch seconds)


def epoch_time(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def lost(grant: LockGrant) -> LockLost:
    return LockLost(f"run {grant.run_id}: the lock is no longer {grant.holder}'s (token {grant.token})")


class RowLock:
    """The lock's logic over one row per run, on a store that runs one transaction at a time."""

    clock: Clock

    def _txn(self) -> contextlib.AbstractContextManager[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _get(self, txn: Any, run_id: str) -> Row | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _put(self, txn: Any, run_id: str, row: Row) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _now(self) -> float:
        return self.clock.now().timestamp()

    def acquire(self, run_id: str, holder: str, *, ttl: float) -> LockGrant | None:
        check_run_id(run_id)
        if not holder:
            raise ValueError("a lock holder needs a name")
        with self._txn() as txn:
            now = self._now()
            row = self._get(txn, run_id)
            if row is not None and row[0] and row[3] > now:
                return None
            token = (row[1] if row is not None else 0) + 1
            self._put(txn, run_id, (holder, token, now, now + ttl))
        return LockGrant(run_id, holder, token, epoch_time(now), epoch_time(now + ttl))

    def refresh(self, grant: LockGrant, *, ttl: float) -> LockGrant:
        with self._txn() as txn:
            now = self._now()
            row = self._get(txn, grant.run_id)
            if row is None or row[0] != grant.holder or row[1] != grant.token:
                raise lost(grant)
            self._put(txn, grant.run_id, (row[0], row[1], row[2], now + ttl))
        return LockGrant(grant.run_id, grant.holder, grant.token, grant.since, epoch_time(now + ttl))

    def release(self, grant: LockGrant) -> None:
        with self._txn() as txn:
            row = self._get(txn, grant.run_id)
            if row is not None and row[0] == grant.holder and row[1] == grant.token:
                self._put(txn, grant.run_id, ("", row[1], row[2], self._now()))

    def holder(self, run_id: str) -> LockHolder | None:
        check_run_id(run_id)
        with self._txn() as txn:
            row = self._get(txn, run_id)
            now = self._now()
        if row is None or not row[0]:
            return None
        return LockHolder(row[0], row[1], epoch_time(row[2]), epoch_time(row[3]), row[3] > now)

    def break_lock(self, run_id: str, *, by: str) -> LockHolder | None:
        check_run_id(run_id)
        with self._txn() as txn:
            now = self._now()
            row = self._get(txn, run_id)
            if row is None:
                return None
            self._put(txn, run_id, ("", row[1] + 1, now, now))
        if not row[0]:
            return None
        return LockHolder(row[0], row[1], epoch_time(row[2]), epoch_time(row[3]), row[3] > now)


class MemoryRunLock(RowLock):
    """The lock in this process's memory (tests, the memory engine): threads only."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._rows: dict[str, Row] = {}
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def _txn(self) -> Iterator[Any]:
        with self._mutex:
            yield self._rows

    def _get(self, txn: Any, run_id: str) -> Row | None:
        return self._rows.get(run_id)

    def _put(self, txn: Any, run_id: str, row: Row) -> None:
        self._rows[run_id] = row


#: The lock a lock-less caller of ``resume(...)`` gets: this process's threads only.
LOCAL = MemoryRunLock()


def start_run(
    run_id: str,
    *,
    timeline: Timeline,
    lock: RunLock,
    clock: Clock | None = None,
    execution: str | None = None,
    ttl: float = LOCK_TTL,
    wait: float = LOCK_WAIT,
) -> tuple[str, LockGrant]:
    """A first execution (or an engine's own restart) under the run's lock (A16): take it,
    then write ``run_started {execution}`` at the version read. Answers the execution id
    and its grant, which the execution keeps until its teardown recorded. RunLocked while
    another holder is live; TimelineConflict (the lock let go) when the run moved between
    the read and the write."""
    clock = clock or SystemClock()
    execution = execution or new_execution()
    grant = take(lock, run_id, execution, ttl=ttl, wait=wait, clock=clock)
    try:
        at = len(timeline.read(run_id))
        timeline.append(run_id, [RunStarted(at=clock.now(), execution=execution)], expected=at)
    except BaseException:
        lock.release(grant)
        raise
    return execution, grant


# ---- The runner's JetStream KV lease, handed in (ADR 0005, 0007) -----------------------


class HandedLock:
    """The runner's JetStream KV lease as the run's lock (ADR 0005, 0007).

    The runner hands in the grant it holds: for that run ``acquire`` answers it (the
    service never contends with its own holder), ``refresh`` refreshes the runner's lease
    and ``release`` leaves it to the runner. Any other run goes through the lease itself.
    Expiry is the lease's (its value's ``expires``, the KV's compare-and-set).
    """

    def __init__(
        self,
        lease: Lease,
        grant: LeaseGrant | None = None,
        *,
        lapse: float = 60.0,
        clock: Clock | None = None,
    ) -> None:
        self.lease, self.lapse, self.clock = lease, lapse, clock or SystemClock()
        self.handed = grant
        self._grants: dict[tuple[str, int], LeaseGrant] = {}
        self._since: dict[tuple[str, int], datetime] = {}
        if grant is not None:
            self._keep(grant)

    def _keep(self, grant: LeaseGrant) -> LockGrant:
        key = (grant.run_id, grant.token)
        self._grants[key] = grant
        since = self._since.setdefault(key, self.clock.now())
        expires = self.clock.now() + timedelta(seconds=self.lapse)
        return LockGrant(grant.run_id, grant.holder, grant.token, since, expires)

    def _is_handed(self, run_id: str) -> bool:
        return self.handed is not None and self.handed.run_id == run_id

    def acquire(self, run_id: str, holder: str, *, ttl: float) -> LockGrant | None:
        if self._is_handed(run_id):
            assert self.handed is not None
            return self._keep(self.handed)
        try:
            grant = self.lease.acquire(run_id, holder)
        except QueueUnavailable as error:
            raise LockUnavailable(error.message) from error
        return None if grant is None else self._keep(grant)

    def refresh(self, grant: LockGrant, *, ttl: float) -> LockGrant:
        held = self._grants.get((grant.run_id, grant.token))
        if held is None:
            raise lost(grant)
        try:
            fresh = self.lease.refresh(held)
        except LeaseLost as error:
            raise LockLost(error.message) from error
        if self._is_handed(grant.run_id):
            self.handed = fresh
        return self._keep(fresh)

    def release(self, grant: LockGrant) -> None:
        if self._is_handed(grant.run_id):
            return  # the runner's: it lets its lease go itself
        held = self._grants.pop((grant.run_id, grant.token), None)
        if held is not None:
            self.lease.release(held)

    def holder(self, run_id: str) -> LockHolder | None:
        if self._is_handed(run_id):
            assert self.handed is not None
            g = self._keep(self.handed)
            return LockHolder(g.holder, g.token, g.since, g.expires, True)
        return None  # the KV lease offers no read through its port

    def break_lock(self, run_id: str, *, by: str) -> LockHolder | None:
        raise LockUnavailable(
            "the runner's lease ends by lapsing (stop the runner); the lock cannot break it",
            remedy="stop the runner that holds the run's lease; the next holder takes it over",
        )
