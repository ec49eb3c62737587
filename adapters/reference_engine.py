"""A small reference engine: nodes are shell commands run in the run's sandbox.

A workflow is a list of nodes. A ``tool`` (or ``agent``) node runs its command in the
sandbox's scratch and writes ``node_finished`` with ``_in_sandbox`` and ``_on_cycle``
as the executing workflow says (R3). A ``human`` node parks the run the first time it
is reached (``run_status_changed {paused}``) and is answered by the resume that
follows (``node_finished {answered}``, R5). A ``subbot`` node runs its children in
the parent's sandbox through the adoption use case (S1, S5); a child's ``human``
node parks the child alone. Nodes already finished are not run again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import attrs

from scratchbank.application.adoption import adopt_child
from scratchbank.application.ports import Clock, EngineEnd, Sandbox, SystemClock, Timeline
from scratchbank.domain.adoption import ChildNode
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.records import NodeFinished, Record, RunResumed, RunStatus, RunStatusChanged

from .scripted import ScriptedSandbox

IN_SCRATCH = 'mkdir -p "$1" && cd "$1" && eval "$2"'


@attrs.frozen
class Node:
    """One node: its kind, the shell command it runs, and a child workflow for a subbot."""

    name: str
    kind: str = "tool"
    command: str = "true"
    on_cycle: bool = False
    children: tuple[Node, ...] = ()


def _finished(records: Sequence[Record]) -> set[str]:
    return {r.node for r in records if isinstance(r, NodeFinished) and r.succeeded}


def _answered(records: Sequence[Record]) -> bool:
    """The last park, not answered yet, then the resume of another attempt: answered.

    The same attempt delivered again (its runner died after the park) answers nothing.
    """
    parked = [i for i, r in enumerate(records) if _is(r, RunStatus.PAUSED)]
    if not parked:
        return False
    since = records[parked[-1] :]
    if any(isinstance(r, NodeFinished) and r.answered for r in since):
        return False  # that park was another gate's, answered already
    before = [r.attempt for r in records[: parked[-1]] if isinstance(r, RunResumed)]
    parked_in = before[-1] if before else None
    return any(isinstance(r, RunResumed) and r.attempt != parked_in for r in since)


def _is(record: Record, status: RunStatus) -> bool:
    return isinstance(record, RunStatusChanged) and record.status is status


@attrs.define
class ReferenceEngine:
    """Runs ``workflow`` to its next park, failure or end. ``timeline`` is the raw one
    the children's records go to; the parent's go through the runner's fenced one."""

    workflow: tuple[Node, ...]
    timeline: Timeline
    clock: Clock = attrs.Factory(SystemClock)
    log: list[str] = attrs.Factory(list)

    def continue_run(
        self, run_id: str, *, sandbox: Sandbox, timeline: Timeline, cancel: threading.Event
    ) -> EngineEnd:
        return self._run(run_id, self.workflow_of(run_id), sandbox, timeline, cancel)

    def _run(
        self,
        run_id: str,
        nodes: Sequence[Node],
        sandbox: Sandbox,
        timeline: Timeline,
        cancel: threading.Event,
    ) -> EngineEnd:
        for node in nodes:
            if cancel.is_set():
                return EngineEnd.CANCELLED
            records = timeline.read(run_id)
            if node.name in _finished(records):
                continue
            end = self._node(run_id, node, records, sandbox, timeline, cancel)
            if end is not None:
                return end
        timeline.append(run_id, [RunStatusChanged(status=RunStatus.FINISHED)])
        return EngineEnd.FINISHED

    def _node(
        self,
        run_id: str,
        node: Node,
        records: Sequence[Record],
        sandbox: Sandbox,
        timeline: Timeline,
        cancel: threading.Event,
    ) -> EngineEnd | None:
        if node.kind == "human":
            return self._gate(run_id, node, records, timeline)
        if node.kind == "subbot":
            return self._subbot(run_id, node, sandbox, timeline, cancel)
        ok = self._shell(sandbox, node)
        finish = NodeFinished(
            node=node.name, succeeded=ok, kind=node.kind, in_sandbox=True, on_cycle=node.on_cycle
        )
        if not ok:
            timeline.append(run_id, [finish, RunStatusChanged(status=RunStatus.FAILED)])
            return EngineEnd.FAILED
        timeline.append(run_id, [finish])
        return None

    def _gate(
        self, run_id: str, node: Node, records: Sequence[Record], timeline: Timeline
    ) -> EngineEnd | None:
        if _answered(records):
            answer = NodeFinished(
                node=node.name, succeeded=True, kind="human", answered=True, in_sandbox=False
            )
            timeline.append(run_id, [answer])
            return None
        timeline.append(run_id, [RunStatusChanged(status=RunStatus.PAUSED)])
        self.log.append(f"{run_id}: parked at {node.name}")
        return EngineEnd.PARKED

    def _shell(self, sandbox: Sandbox, node: Node) -> bool:
        if not isinstance(sandbox, ScriptedSandbox):
            raise TypeError("the reference engine runs shell commands: it needs a scripted sandbox")
        try:
            done = sandbox.run(IN_SCRATCH, [sandbox.facts.scratch, node.command])
        except ScratchbankError as error:
            self.log.append(f"{node.name}: {error}")
            return False
        self.log.append(f"{node.name}: exit {done.exit_code}")
        return done.exit_code == 0

    def _subbot(
        self, run_id: str, node: Node, sandbox: Sandbox, timeline: Timeline, cancel: threading.Event
    ) -> EngineEnd | None:
        child_run = f"{run_id}.{node.name}"
        child = [ChildNode(c.name, c.kind) for c in node.children]
        adoption = adopt_child(
            child_run,
            child,
            parent_run=run_id,
            parent=sandbox.facts,
            parent_copy_based=False,
            timeline=self.timeline,
            clock=self.clock,
        )
        self.log.append(f"{node.name}: adoption {adoption.rule}: {adoption.reason}")
        ok = False
        if adoption.adopted:
            child_end = self._run(child_run, node.children, sandbox, self.timeline, cancel)
            ok = child_end is EngineEnd.FINISHED
            if not ok:
                self.log.append(
                    f"{node.name}: the child {child_run} {child_end.value}; it resumes alone (S2)"
                )
        # The parent goes on either way: a refused child did not run here (S1, S5); a
        # parked one waits for its own resume (S2).
        finish = NodeFinished(node=node.name, succeeded=ok, kind="subbot", in_sandbox=True, on_cycle=False)
        timeline.append(run_id, [finish])
        return None

    def workflow_of(self, run_id: str) -> tuple[Node, ...]:
        """The parent's workflow, or a subbot child's (``<parent>.<node>``) when resumed alone."""
        parent, _, name = run_id.rpartition(".")
        for node in self.workflow if parent else ():
            if node.kind == "subbot" and node.name == name:
                return node.children
        return self.workflow
