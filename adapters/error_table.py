"""The one error table: every named error's exit status, HTTP status and MCP error kind.

The CLI, the HTTP API and the MCP server all read it, so one error answers alike on every
surface. A row is looked up by the error's class, then by the classes above it: a new
``ScratchbankError`` subclass is mapped by its family (a ``SandboxError`` is a sandbox
failure, a ``SurfaceError`` is bad input) until it gets a row of its own. The README prints
``markdown()``; a test checks that the two agree and that every class in
``domain/errors.py`` has its own row.

Remedies are written in the CLI's words (flags); ``remedy_for`` renders one for another
surface (domain/remedy.py holds the words): JSON fields over HTTP, the tool's arguments over
MCP, Python names in the API.
"""

from __future__ import annotations

import attrs

from scratchbank.domain import errors
from scratchbank.domain.remedy import Surface as Surface
from scratchbank.domain.remedy import error_remedy, say

EXIT_OK, EXIT_USAGE, EXIT_REFUSED, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_INTERNAL = 0, 2, 3, 4, 5, 70

#: The MCP error kind of each exit status: a tool error carries it beside the code.
MCP_KIND = {
    EXIT_USAGE: "invalid_argument",
    EXIT_REFUSED: "refused",
    EXIT_NOT_FOUND: "not_found",
    EXIT_UNAVAILABLE: "unavailable",
    EXIT_INTERNAL: "internal",
}


@attrs.frozen
class Row:
    """How one named error answers on each surface."""

    exit: int
    http: int
    meaning: str

    @property
    def mcp(self) -> str:
        return MCP_KIND[self.exit]


def _row(exit: int, http: int, meaning: str) -> Row:
    return Row(exit, http, meaning)


_BAD = "bad input"
_REFUSED = "refused; nothing was written"
_NOT_FOUND = "not found"
_FAILED = "a store or sandbox failed or cannot be reached"

#: One row per class of domain/errors.py (the coordinator adds the rows of new codes).
ROWS: dict[type[errors.ScratchbankError], Row] = {
    errors.ScratchbankError: _row(EXIT_UNAVAILABLE, 503, _FAILED),
    errors.TimelineUnreadable: _row(EXIT_UNAVAILABLE, 503, "the timeline cannot be read"),
    errors.TimelineConflict: _row(EXIT_UNAVAILABLE, 409, "another writer appended first"),
    errors.TimelineWriteFailed: _row(EXIT_UNAVAILABLE, 503, "the timeline refused a write"),
    errors.TimelineBusy: _row(EXIT_UNAVAILABLE, 503, "the timeline is busy (load); call again"),
    errors.InvalidRunId: _row(EXIT_USAGE, 400, _BAD),
    errors.InvalidCheckpoint: _row(EXIT_USAGE, 400, _BAD),
    errors.BankError: _row(EXIT_UNAVAILABLE, 503, "the bank store failed"),
    errors.BankGone: _row(EXIT_UNAVAILABLE, 503, "the bank is not in the store"),
    errors.BankReadFailed: _row(EXIT_UNAVAILABLE, 503, "reading the bank failed; try again"),
    errors.BankWriteFailed: _row(EXIT_UNAVAILABLE, 503, "writing the bank failed"),
    errors.BankMismatch: _row(EXIT_UNAVAILABLE, 503, "the stored bank is not the recorded one"),
    errors.InvalidBankObject: _row(EXIT_UNAVAILABLE, 503, "a record names an object outside the run's banks"),
    errors.BankUnrecorded: _row(EXIT_REFUSED, 409, "an unrecorded bank an operator must settle"),
    errors.CheckpointBankSwept: _row(EXIT_REFUSED, 409, "a rewind's own bank is past retention"),
    errors.HostileArchive: _row(EXIT_UNAVAILABLE, 503, "the bank failed the host's check"),
    errors.UnreadableArchive: _row(EXIT_UNAVAILABLE, 503, "the bank broke the host's parser"),
    errors.DestinationRefused: _row(EXIT_UNAVAILABLE, 503, "the host directory refused the tree"),
    errors.NoSpaceAtDestination: _row(EXIT_UNAVAILABLE, 503, "no room in the host directory"),
    errors.SandboxError: _row(EXIT_UNAVAILABLE, 503, _FAILED),
    errors.SandboxGone: _row(EXIT_UNAVAILABLE, 409, "the sandbox is gone or stopped"),
    errors.ExecFailed: _row(EXIT_UNAVAILABLE, 503, "the sandbox engine cannot be reached or run it"),
    errors.ArchiveFailed: _row(EXIT_UNAVAILABLE, 503, "tar failed in the sandbox"),
    errors.HostArchiveFailed: _row(EXIT_UNAVAILABLE, 503, "the host could not keep the archive"),
    errors.RestoreRefused: _row(EXIT_UNAVAILABLE, 503, "the sandbox's tar refused the bank"),
    errors.StreamBroken: _row(EXIT_UNAVAILABLE, 503, "the stream to the sandbox broke"),
    errors.OutputOverBound: _row(EXIT_UNAVAILABLE, 503, "the sandbox sent more than its bound"),
    errors.SandboxNotStarted: _row(EXIT_UNAVAILABLE, 503, "a fresh sandbox did not come up"),
    errors.PodImagePull: _row(EXIT_UNAVAILABLE, 503, "the pod's image cannot be pulled"),
    errors.PodUnschedulable: _row(EXIT_UNAVAILABLE, 503, "no node can take the pod"),
    errors.PodEvicted: _row(EXIT_UNAVAILABLE, 503, "the node evicted the pod"),
    errors.PodDeleted: _row(EXIT_UNAVAILABLE, 503, "the pod was deleted while it started"),
    errors.PodStartTimeout: _row(EXIT_UNAVAILABLE, 503, "the pod did not run within its deadline"),
    errors.RunNotFound: _row(EXIT_NOT_FOUND, 404, _NOT_FOUND),
    errors.NoRestoreTarget: _row(EXIT_REFUSED, 400, _REFUSED),
    errors.AttemptReused: _row(EXIT_REFUSED, 409, "an attempt id used before"),
    errors.ResumeSuperseded: _row(EXIT_REFUSED, 409, "another resume holds the run"),
    errors.Fenced: _row(EXIT_REFUSED, 409, "a newer lease holder owns the run"),
    errors.SurfaceError: _row(EXIT_USAGE, 400, _BAD),
    errors.ConfigInvalid: _row(EXIT_USAGE, 400, _BAD),
    errors.HomeNotFound: _row(EXIT_NOT_FOUND, 404, _NOT_FOUND),
    errors.NotAuthorized: _row(EXIT_USAGE, 401, "a write without the token"),
    errors.SandboxNotAllowed: _row(EXIT_USAGE, 403, "a sandbox outside the allow-list"),
    errors.HostNotAllowed: _row(EXIT_USAGE, 421, "a Host the server does not serve"),
    errors.BodyTooLarge: _row(EXIT_USAGE, 413, "a body past the limit"),
    errors.InvalidRequest: _row(EXIT_USAGE, 422, "a body not JSON, or a field unknown or ill-typed"),
    errors.LeaseLost: _row(EXIT_UNAVAILABLE, 503, "the runner's lease lapsed"),
    errors.QueueUnavailable: _row(EXIT_UNAVAILABLE, 503, "the queue cannot be reached"),
    errors.RunLocked: _row(EXIT_REFUSED, 409, "another live holder has the run's lock (retry)"),
    errors.LockLost: _row(EXIT_REFUSED, 409, "the run's lock was taken over or broken"),
    errors.LockUnavailable: _row(EXIT_UNAVAILABLE, 503, "the run's lock cannot be reached"),
}

#: A bug: not a named error (never in ROWS, answered by every surface the same way).
INTERNAL = Row(EXIT_INTERNAL, 500, "a bug in scratchbank")
INTERNAL_CODE = "INTERNAL_ERROR"


def row_of(error: errors.ScratchbankError | type[errors.ScratchbankError]) -> Row:
    """The row of the error's class, else of the nearest class above it (its family)."""
    cls = error if isinstance(error, type) else type(error)
    return next(ROWS[c] for c in cls.__mro__ if c in ROWS)


def exit_code(error: errors.ScratchbankError) -> int:
    return row_of(error).exit


def http_status(error: errors.ScratchbankError) -> int:
    return row_of(error).http


def mcp_kind(error: errors.ScratchbankError) -> str:
    return row_of(error).mcp


def all_error_classes() -> list[type[errors.ScratchbankError]]:
    """Every ScratchbankError class the domain defines, in the order of domain/errors.py."""
    found = [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, errors.ScratchbankError)
        and value.__module__ == errors.__name__
    ]
    return found


def markdown() -> str:
    """The table as the README prints it (a test checks they agree)."""
    lines = [
        "| code | meaning | CLI exit | HTTP | MCP error |",
        "|---|---|---|---|---|",
    ]
    for cls in all_error_classes():
        row = row_of(cls)
        lines.append(f"| `{cls.code}` | {row.meaning} | {row.exit} | {row.http} | `{row.mcp}` |")
    lines.append(
        f"| `{INTERNAL_CODE}` | {INTERNAL.meaning} | {INTERNAL.exit} | {INTERNAL.http} | `{INTERNAL.mcp}` |"
    )
    return "\n".join(lines)


# -- remedies per surface (the words live with the one remedy function, domain/remedy.py) -------


def render(text: str, surface: Surface) -> str:
    """A remedy written with the CLI's flags, in the words of ``surface``."""
    return say(text, surface)


def remedy_for(error: errors.ScratchbankError, surface: Surface) -> str:
    """The error's remedy as ``surface`` says it (an explicit remedy given at raise wins)."""
    return error_remedy(error, surface)
