"""May a child run in its parent's sandbox? (S1, S5)

A child that can park, adopted into a sandbox whose scratch lives in the container,
would later resume alone, in a sandbox without that scratch: refuse the adoption up
front instead of refusing its resume later.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .records import SandboxShared

#: Permission modes under which an LLM node's gate asks the human.
ASKING_MODES = frozenset({"ask", "default", "interactive"})


@attrs.frozen
class ChildNode:
    """What the adoption check needs to know of one node of the child workflow.

    ``gate_on`` is read from the policy the child's executor arms, so a gate the
    launch imposes counts (S1).
    """

    name: str
    kind: str
    interactive: bool = False
    permission_mode: str | None = None
    has_ask_rules: bool = False
    gate_on: bool = False


def can_park(node: ChildNode) -> str | None:
    """Why this node can park the child, or None (S1)."""
    if node.kind == "human":
        return f"{node.name} is a human gate"
    if node.interactive:
        return f"{node.name} is interactive"
    if node.permission_mode in ASKING_MODES:
        return f"{node.name}'s permission mode '{node.permission_mode}' asks"
    if node.has_ask_rules and node.gate_on:
        return f"{node.name}'s ask rules apply under a gate that is on"
    return None


@attrs.frozen
class AdoptionDecision:
    adopt: bool
    rule: str
    reason: str
    record: SandboxShared | None = None
    record_required: bool = False


def decide_adoption(
    child: Sequence[ChildNode], *, scratch_container_local: bool, parent_copy_based: bool
) -> AdoptionDecision:
    """Adopt, with the record to write within its budget first (S5), or refuse (S1)."""
    parkers = [why for why in map(can_park, child) if why]
    if parkers and scratch_container_local:
        reason = "the child can park and the parent's scratch is container-local: " + "; ".join(parkers)
        return AdoptionDecision(False, "S1", reason)
    record = SandboxShared(
        scratch_container_local=scratch_container_local, parent_copy_based=parent_copy_based
    )
    why = "adopted; the record must be written within its budget before the child runs"
    return AdoptionDecision(True, "S5", why, record=record, record_required=True)
