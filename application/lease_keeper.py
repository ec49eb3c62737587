"""Keeping a run's lease while the runner works on it (L1, L2, L5).

A thread refreshes the lease every interval, through the engine's run and teardown
and the runner's post-engine steps. When a refresh fails, or the hold goes past a
ceiling (``domain.lease.past_ceiling``), the keeper lets the lease go and cuts
``cancel``: the run context the engine and the teardown's bank ride, so a bank in
flight stops at once (every port call's deadline rides it: the transport's watchdog
cuts the exec or upload). What does not ride that context still lands (ADR 0005, L5):
the processes are continued on their own budget; the record of a bank that reached
the store is written on its own, refused by the fence once a newer holder wrote.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import attrs

from scratchbank.domain.errors import LeaseLost, ScratchbankError
from scratchbank.domain.lease import HoldBudgets, HoldClock, LeaseTiming, past_ceiling

from .cancellation import Cancel
from .ports import Clock, Lease, LeaseGrant


class LeaseKeeper:
    """Refreshes one grant on its interval until stopped; cancels past a ceiling or a loss."""

    def __init__(
        self, lease: Lease, grant: LeaseGrant, hold: HoldBudgets, timing: LeaseTiming, clock: Clock
    ) -> None:
        self.lease, self.grant, self.hold, self.timing, self.clock = lease, grant, hold, timing, clock
        self.cancel = Cancel()
        self.refreshes = 0
        self.note = ""
        #: the run context was cut before the engine returned (its run, not only the bank)
        self.engine_cut = False
        self._hold = HoldClock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_refresh: Callable[[], None] | None = None
        self._refreshed_at = clock.monotonic()

    def start(self, on_refresh: Callable[[], None] | None = None) -> None:
        self._on_refresh = on_refresh
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)
        self._thread.start()

    def engine_returned(self, *, resume_can_wait: bool) -> None:
        """Arm the post-engine ceiling (L2) when a resume can wait on the run."""
        self.engine_cut = self.cancel.is_set()
        self._hold = attrs.evolve(
            self._hold, engine_returned_at=self.clock.monotonic(), resume_can_wait=resume_can_wait
        )

    def cancelled(self) -> None:
        """The run was cancelled: arm the teardown ceiling (L2)."""
        self._hold = attrs.evolve(self._hold, cancelled_at=self.clock.monotonic())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.timing.interval):
            ceiling = past_ceiling(self._hold, self.clock.monotonic(), self.hold)
            if ceiling is not None:
                self._let_go(f"past the {ceiling}: the lease was let go (L5)")
                return
            try:
                self.grant = self.lease.refresh(self.grant)
                self.refreshes += 1
                self._refreshed_at = self.clock.monotonic()
            except LeaseLost as error:
                self._let_go(f"the refresh failed ({error.code}): the run context is cancelled (L5)")
                return
            except ScratchbankError as error:  # the store did not answer: the lease is ours until it lapses
                if self.clock.monotonic() - self._refreshed_at >= self.timing.lapse:
                    self._let_go(
                        f"no refresh within the lapse ({error.code}): the run context is cancelled (L5)"
                    )
                    return
                continue
            if self._on_refresh is not None:
                with contextlib.suppress(ScratchbankError):
                    self._on_refresh()

    def _let_go(self, why: str) -> None:
        self.note = why
        self.cancel.cut(why)
        with contextlib.suppress(LeaseLost, ScratchbankError):
            self.lease.release(self.grant)
