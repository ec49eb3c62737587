"""Each refusal's consent form on every surface.

First written for tests/test_surface_error_table.py: The one error table (code, exit status, HTTP
status, MCP error), the README that prints it, remedies in each surface's words, and the shipped
rule reference every refusal line names."""

from __future__ import annotations

from typing import Any

from scratchbank.domain.fold import fold
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import banked, node, started, unbanked

#: Each surface's own form of the two consents, and the forms the others use (never its own).
CONSENT_FORMS: dict[str, tuple[str, str]] = {
    "cli": ("--accept-scratch-loss", "--force"),
    "http": ('"accept_scratch_loss": true', '"force": true'),
    "mcp": ("accept_scratch_loss (naming the refusal: its consent_name)", "force: true"),
    "python": ("ResumeRequest(consents=Consents(accept_scratch_loss=True))", "Consents(force=True)"),
}


def _refusals() -> dict[str, tuple[Any, bool, bool]]:
    """Refusal kind -> (decision, names the scratch consent, names force)."""
    banked_then_ran = fold([started(), node("a", "tool"), banked(), node("b", "tool")])
    fresh = fold([started(), node("a", "tool"), banked()])
    return {
        "scratch (R2)": (decide_resume(banked_then_ran, ResumeRequest()), True, False),
        "scratch and force (R2 + source)": (
            decide_resume(banked_then_ran, ResumeRequest(source_changed=True)),
            True,
            True,
        ),
        "force only (source changed)": (
            decide_resume(fresh, ResumeRequest(source_changed=True)),
            False,
            True,
        ),
        "unbanked scratch (R1)": (
            decide_resume(fold([started(), node("a", "tool"), unbanked()]), ResumeRequest()),
            True,
            False,
        ),
    }
