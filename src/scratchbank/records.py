"""Public constructors for the records an engine writes on a run's timeline.

An engine records what happened; scratchbank decides from it. Each constructor asks for
what a decision reads, by name, so nothing important is left to a default:

    >>> from scratchbank.records import node_finished, run_started
    >>> run_started().WIRE
    'run_started'
    >>> node_finished("write-notes", "tool", in_sandbox=True, on_cycle=False).in_sandbox
    True

The teardown's and the restore's records are written by ``bank_at_teardown`` and ``resume``.
"""

from __future__ import annotations

from scratchbank.domain.records import NodeFinished, RunResumed, RunRewound, RunStarted

__all__ = ["node_finished", "run_resumed", "run_rewound", "run_started"]


def run_started() -> RunStarted:
    """A run's first execution starts (a newer execution may still be banking: R10)."""
    return RunStarted()


def run_resumed(attempt: str | None = None) -> RunResumed:
    """The engine resumes the run as ``attempt`` (consents are the call's own: C3)."""
    return RunResumed(attempt=attempt)


def node_finished(
    name: str,
    kind: str,
    *,
    in_sandbox: bool,
    on_cycle: bool,
    succeeded: bool = True,
    answered: bool = False,
) -> NodeFinished:
    """A node finished. ``in_sandbox``: it ran in the sandbox (agent, judge, tool, subbot, LLM
    router: R3); ``on_cycle``: it lies on a loop or foreach (R6); ``answered``: a paused node
    finished by its answer (R5). A failed node (``succeeded=False``) re-runs (R4)."""
    return NodeFinished(
        node=name, kind=kind, succeeded=succeeded, answered=answered, in_sandbox=in_sandbox, on_cycle=on_cycle
    )


def run_rewound(*dropped: str, on_cycle: tuple[str, ...] = ()) -> RunRewound:
    """A rewind dropped these nodes; those on a loop still count (R6)."""
    return RunRewound(dropped_nodes=tuple(dropped), on_cycle=on_cycle)
