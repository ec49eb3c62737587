"""A timeline that queues before the claim, and a runner with no sandboxes.

First written for tests/test_runner_deliveries.py: The runner on the embedded default: deliveries,
consents, refusals (C3-C8, R10-R12, L4)."""

from __future__ import annotations

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import ExecFailed
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
)


class _QueuesBeforeClaim(InMemoryTimeline):
    """A timeline an operator queues a newer attempt on just as the runner claims."""

    def __init__(self, inner: InMemoryTimeline, attempt: str) -> None:
        self.inner, self.attempt, self.fired = inner, attempt, False

    def read(self, run_id: str):  # type: ignore[no-untyped-def]
        return self.inner.read(run_id)

    def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
        if not self.fired and any(isinstance(r, AttemptClaimed) for r in records):
            self.fired = True
            self.inner.append(run_id, [AttemptQueued(attempt=self.attempt)])
        return self.inner.append(run_id, records, expected=expected)


class _NoSandboxes:
    """A provider whose engine refuses to start sandboxes (a node pool with no room)."""

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        raise ExecFailed("no room for a sandbox")

    def stop(self, sandbox: Sandbox) -> None: ...

    def orphans(self, run_id: str) -> list[Sandbox]:
        return []
