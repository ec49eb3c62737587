"""Node kinds, and what the current workflow says when a finish did not record it.

A finish records where its node ran (``_in_sandbox``) and whether it lies on a cycle
(``_on_cycle``). Only when a record lacks them does the reader fall back: first to
the kind the finish recorded, then to the current workflow, and a node nobody knows
counts as a writer (R3: the source may have changed since; guessing "harmless"
would revert a write in silence).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

#: Kinds that run in the sandbox and so may write the scratch (agent, judge, tool,
#: subbot, LLM router). Any kind not listed as engine-side counts as a writer too.
SANDBOX_KINDS = frozenset({"agent", "judge", "tool", "subbot", "llm_router"})

#: Kinds the engine runs itself: they never write the scratch (R5).
ENGINE_SIDE_KINDS = frozenset(
    {"human", "compute", "emit", "wait", "await_answers", "done", "fail", "condition_router"}
)


def kind_writes_scratch(kind: str) -> bool:
    """A node of this kind may have written the scratch (unknown kinds: yes)."""
    return kind not in ENGINE_SIDE_KINDS


@attrs.frozen
class Workflow:
    """What the current workflow source says of its nodes: the fallback of last resort."""

    kinds: Mapping[str, str] = attrs.field(factory=dict)
    on_cycle: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)

    def knows(self, node: str) -> bool:
        return node in self.kinds


NO_WORKFLOW = Workflow()
