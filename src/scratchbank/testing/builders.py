"""Short constructors for timeline records, so a test reads as the story it tells."""

from __future__ import annotations

from scratchbank.domain.records import (
    NodeFinished,
    RunResumed,
    RunRewound,
    RunStarted,
    SandboxShared,
    ScratchBanked,
    ScratchForsaken,
    ScratchRestored,
)


def started() -> RunStarted:
    return RunStarted()


def resumed(
    attempt: str | None = None, *, force: bool = False, accept_scratch_loss: bool = False
) -> RunResumed:
    return RunResumed(attempt=attempt, force=force, accept_scratch_loss=accept_scratch_loss)


def node(
    name: str,
    kind: str | None = "agent",
    *,
    ok: bool = True,
    answered: bool = False,
    in_sandbox: bool | None = None,
    on_cycle: bool | None = False,
) -> NodeFinished:
    """A node's finish; ``in_sandbox`` None leaves the metadata out (fallback to kind)."""
    return NodeFinished(
        node=name,
        kind=kind,
        succeeded=ok,
        answered=answered,
        in_sandbox=in_sandbox,
        on_cycle=on_cycle,
    )


def banked(size: int = 1000, *, raced: tuple[str, ...] = (), sha256: str = "0" * 64) -> ScratchBanked:
    return ScratchBanked(
        banked=True,
        empty=False,
        unknown=False,
        bytes=size,
        raced=raced,
        raced_count=len(raced),
        sha256=sha256,
    )


def empty() -> ScratchBanked:
    return ScratchBanked(banked=False, empty=True, unknown=False, bytes=0)


def unknown(reason: str = "sandbox gone") -> ScratchBanked:
    return ScratchBanked(banked=False, empty=False, unknown=True, bytes=0, reason=reason)


def unbanked(reason: str = "over the 256 MiB cap", size: int = 300 << 20) -> ScratchBanked:
    return ScratchBanked(banked=False, empty=False, unknown=False, bytes=size, reason=reason)


def finished_teardown() -> ScratchBanked:
    return ScratchBanked(banked=False, empty=False, unknown=False, finished=True, bytes=0)


def restored(*, stale: bool = False, accepted: bool = False, host_backed: bool = False) -> ScratchRestored:
    return ScratchRestored(restored=True, stale=stale, accepted=accepted, bytes=1000, host_backed=host_backed)


def restore_failed(reason: str = "stream broke") -> ScratchRestored:
    return ScratchRestored(restored=False, stale=False, accepted=False, reason=reason)


def went_on_without(reason: str = "loss accepted") -> ScratchRestored:
    return ScratchRestored(restored=False, stale=False, accepted=True, reason=reason)


def rewound(*dropped: str, on_cycle: tuple[str, ...] | None = None) -> RunRewound:
    return RunRewound(dropped_nodes=dropped, on_cycle=on_cycle)


def shared(*, container_local: bool | None = True, copy_based: bool = False) -> SandboxShared:
    return SandboxShared(scratch_container_local=container_local, parent_copy_based=copy_based)


def forsaken(*, forced: bool = False, accepted: bool = True) -> ScratchForsaken:
    return ScratchForsaken(forced=forced, accepted=accepted)
