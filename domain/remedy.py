"""The one remedy function: every surface and record reads its hint from here (C10).

A generic "--force" advice sent operators round again, each turn a claim and a pod;
so the hint is derived from the refusal itself, never written by a surface.

Remedies are written in the CLI's words (its flags); ``say`` renders one for another
surface: JSON fields over HTTP, the tool's arguments over MCP, and Python names for an
engine that embeds the library (``ResumeRequest(consents=Consents(accept_scratch_loss=True))``,
``service.status(run_id)``). A named error raised to an engine says its remedy in Python
words (``str(error)``, ``error.remedy_in("python")``); its ``remedy`` stays the CLI's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from .errors import BankUnrecorded, CheckpointBankSwept, TimelineUnreadable
from .resume_gate import RESUME_INVALID, SCRATCH_NOT_PORTABLE, CauseKind, ResumeDecision

if TYPE_CHECKING:
    from .errors import ScratchbankError

_LOSS = (
    "relaunch the run fresh; or resume it accepting the scratch's loss "
    "(--accept-scratch-loss) to continue as it stands"
)

_FORCE_WHAT = {
    CauseKind.SOURCE_CHANGED: "the source changed",
    CauseKind.ARTIFACT_CONTRACT_CHANGED: "the artifact contract changed",
    CauseKind.COPY_BASED_DIVERGENCE: "the parent's copy-based sandbox diverged",
}


def _force_phrase(decision: ResumeDecision) -> str:
    return " and ".join(_FORCE_WHAT[c.kind] for c in decision.force_causes)


def remedy(decision: ResumeDecision, surface: Surface = "cli") -> str:
    """The hint an operator sees for this decision ('' when nothing needs doing), in the
    words of ``surface`` (the CLI's flags unless told)."""
    return say(_remedy(decision), surface)


def _remedy(decision: ResumeDecision) -> str:
    if decision.code == SCRATCH_NOT_PORTABLE:
        hint = _LOSS
        if decision.also_needs_force:
            hint += f"; {_force_phrase(decision)} too: add --force to accept that"
        elif decision.keep_force:
            hint += f"; {_force_phrase(decision)} too: keep --force"
        return hint
    if decision.code == RESUME_INVALID:
        hint = f"{_force_phrase(decision)}: resume with --force to accept that"
        if decision.keep_accept_scratch_loss:
            hint += "; keep --accept-scratch-loss"
        return hint
    if decision.code == CheckpointBankSwept.code:
        hint = CheckpointBankSwept.remedy  # K7, ADR 0013
        if decision.also_needs_force:
            hint += f"; {_force_phrase(decision)} too: add --force to accept that"
        return hint
    if decision.code == BankUnrecorded.code:
        return BankUnrecorded.remedy  # N3, ADR 0006
    if decision.refused:
        return TimelineUnreadable.remedy
    return ""


# -- the words of each surface ---------------------------------------------------------------
Surface = Literal["cli", "http", "mcp", "python"]

_WORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "cli": (),
    "http": (
        (r"--accept-scratch-loss", '"accept_scratch_loss": true'),
        (r"--force", '"force": true'),
        (r"--sandbox ", '"sandbox": '),
        (r"--home DIR|--home", "the server's home"),
    ),
    "mcp": (
        (r"--accept-scratch-loss", "accept_scratch_loss (naming the refusal: its consent_name)"),
        (r"--force", "force: true"),
        (r"--sandbox ", "sandbox: "),
        (r"--home DIR|--home", "the server's home"),
    ),
    "python": (  # first match first: the longer phrases before their parts
        (r"\(--accept-scratch-loss\)", "(ResumeRequest(consents=Consents(accept_scratch_loss=True)))"),
        (r"--accept-scratch-loss", "Consents(accept_scratch_loss=True)"),
        (r"resume with --force", "resume with ResumeRequest(consents=Consents(force=True))"),
        (r"--force", "Consents(force=True)"),
        (r"--sandbox ", "Target(sandbox=...) for "),
        (r"--home DIR|--home", "open_home(DIR)"),
        (r"--allow-sandbox", "ApiSettings(sandboxes=...)"),
        (r"--queue", "Settings(queue_url=...)"),
        (r"status RUN --break-lock", "service.break_lock(run_id)"),
        (
            r"resume accepting the scratch's loss(?! \()",
            "resume accepting the scratch's loss "
            "(ResumeRequest(consents=Consents(accept_scratch_loss=True)))",
        ),
        (r"status shows", "service.status(run_id) shows"),
        (r"`status`|its status", "service.status(run_id)"),
        (r"`scratchbank --help` and the README's Operators section", "the README's embedding section"),
    ),
}

#: Remedies that are not a word-for-word rendering on a surface, by error code.
_OWN: dict[tuple[str, str], str] = {
    ("NO_RESTORE_TARGET", "http"): (
        'name where to restore: "sandbox": "docker:NAME" in the body (an allowed one)'
    ),
    ("NO_RESTORE_TARGET", "mcp"): 'name where to restore: sandbox: "docker:NAME" (an allowed one)',
    ("NO_RESTORE_TARGET", "python"): (
        "pass a Target: service.resume(run_id, request, Target(sandbox=...)) or Target(host_directory=...)"
    ),
    ("HOME_NOT_FOUND", "python"): (
        "call open_home(DIR) (it creates the home) or give bootstrap() explicit URLs"
    ),
    ("RUN_NOT_FOUND", "http"): "check the run id; the server reads the timeline it was started with",
    ("RUN_NOT_FOUND", "mcp"): (
        "check the run id (runs_needing_operator lists runs); the server reads one timeline"
    ),
    ("RUN_NOT_FOUND", "python"): (
        "check the run id and the timeline the service was opened on (open_home(DIR))"
    ),
}


def say(text: str, surface: Surface) -> str:
    """A remedy written with the CLI's flags, in the words of ``surface``."""
    for pattern, words in _WORDS[surface]:
        text = re.sub(pattern, words, text)
    return text


def error_remedy(error: ScratchbankError, surface: Surface) -> str:
    """The error's remedy as ``surface`` says it (an explicit remedy given at raise wins
    over a surface's own wording of the class's remedy; it is still rendered)."""
    if "remedy" not in vars(error):  # the class's own remedy: a surface may say it its own way
        for cls in type(error).__mro__:
            own = _OWN.get((getattr(cls, "code", ""), surface))
            if own is not None and "code" in vars(cls):
                return own
    return say(error.remedy, surface)
