"""A hostile-sandbox kit: run our in-sandbox scripts against a sandbox whose binaries,
names and output are hostile, over a real transport, and check that every call ends in
a named outcome within its bound (issue 25; SECURITY.md).

The workload of a compromised sandbox can replace the binaries on its PATH (``cat``,
``rm``, ``tar``...). ``HostileSandbox`` models that on any engine, without touching the
sandbox's disk: it wraps a ``ScriptedSandbox`` and defines shell functions of those
names ahead of every script it runs, so the script calls them instead of the real
binaries while the bytes still cross the engine's own exec transport (local, Docker,
Podman, Kubernetes). An engine team runs ``check_hostile_sandbox(make)`` against its own
adapter; ``make`` returns a fresh ScriptedSandbox whose scratch may be written.

What no host can detect is a sandbox that lies consistently (a ``tar`` that archives
what it likes, a ``stat`` that reports what the manifest wants): those records say what
the sandbox said, and the kit does not pretend otherwise (ADR 0008).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.scripted import Exec, ForwardingSandbox, ScriptedSandbox
from scratchbank.domain.errors import OutputOverBound, ScratchbankError


def flood(size: int, *, stream: int = 1, byte: str = "") -> str:
    """Shell text printing ``size`` bytes on ``stream`` (``byte``: an octal escape for tr,
    e.g. ``\\000`` for NUL bytes)."""
    text = f"yes 0123456789abcdef0123456789abcdef | head -c {size}"
    if byte:
        text += f" | tr 'a-f0-9y\\n' '{byte}'"
    return text + ("" if stream == 1 else f" >&{stream}")


def shadow(command: str, before: str = "", after: str = "", *, only_with_args: bool = False) -> str:
    """A shell function standing in for ``command``: ``before``, the real command, ``after``
    (with ``only_with_args``, a call without arguments is the real command alone)."""
    body = "; ".join(part for part in (before, f'command {command} "$@"', after) if part)
    if only_with_args:
        body = f"if [ $# -gt 0 ]; then {body}; else command {command}; fi"
    return f"{command}() {{ {body}; }}"


def replace(command: str, body: str) -> str:
    """A shell function that replaces ``command`` entirely."""
    return f"{command}() {{ {body}; }}"


#: what a forger writes by default: a quiesce's end of its own, and a count not the script's
FORGED_VERDICT = "scratchbank-quiesced 0\\nstopped 999\\n"


def forge(lines: str = FORGED_VERDICT) -> str:
    """Shell text writing ``lines`` (printf's escapes) into fds 1 and 2 of this shell and of
    every ancestor, by builtins, in a subshell (no variable of the caller's changes): what a
    replaced binary can do, whatever its own output is redirected to (ADR 0008). In a
    shell function, ``$$`` is the script's shell; in a planted binary, the binary."""
    put = f"printf '{lines}'"
    return (
        '( p=$$; while [ "${p:-0}" -gt 1 ] 2>/dev/null; do '
        f"{put} >/proc/$p/fd/1; {put} >/proc/$p/fd/2; "
        'q=""; while read -r k v; do [ "$k" = PPid: ] && q=$v; done </proc/$p/status; p=$q; '
        "done ) 2>/dev/null"
    )


def forger(command: str, lines: str = FORGED_VERDICT) -> str:
    """A shell function standing in for ``command``: ``forge(lines)``, then the real command."""
    return f'{command}() {{ {forge(lines)}; command {command} "$@"; }}'


class HostileSandbox(ForwardingSandbox):
    """``inner`` with its scripts' commands shadowed by ``shadows`` (shell functions)."""

    def __init__(self, inner: ScriptedSandbox, *shadows: str) -> None:
        super().__init__(inner)
        self.preamble = "\n".join(shadows) + "\n"

    def call(self, exec_: Exec) -> ExecResult:
        """Every script call, with the hostile commands defined ahead of the script (the
        reaper of a cut call runs unshadowed)."""
        return super().call(attrs.evolve(exec_, source=self.preamble + exec_.source))


@attrs.frozen
class Outcome:
    """What one hostile scenario ended in: a named error's code, or what the call returned."""

    scenario: str
    code: str
    detail: str


def outcome(scenario: str, call: Callable[[], Any]) -> Outcome:
    """Run ``call``; a named error is an outcome, anything else unnamed propagates."""
    try:
        value = call()
    except ScratchbankError as error:
        return Outcome(scenario, error.code, error.message[:300])
    return Outcome(scenario, "returned", repr(value)[:300])


def check_hostile_sandbox(
    make: Callable[[], ScriptedSandbox], *, flood_bytes: int = 1 << 20
) -> list[Outcome]:
    """The kit: every scenario against a fresh sandbox from ``make``; each must end in a
    named outcome (raises AssertionError naming the first that did not)."""
    outcomes = []
    for name, shadows, call, expect in scenarios(flood_bytes):
        sandbox = make()
        got = outcome(name, lambda s=sandbox, c=call, sh=shadows: c(HostileSandbox(s, *sh)))  # type: ignore[misc]
        assert got.code in expect, f"{name}: expected one of {expect}, got {got}"
        assert "\x00" not in got.detail, f"{name}: a raw NUL in {got}"
        assert "\x1b" not in got.detail, f"{name}: a raw escape in {got}"
        outcomes.append(got)
    return outcomes


Scenario = tuple[str, Sequence[str], Callable[[ScriptedSandbox], Any], frozenset[str]]


def scenarios(size: int) -> list[Scenario]:
    """(name, shadowed commands, the call, the codes it may end in)."""
    over = frozenset({OutputOverBound.code})

    def listing(box: ScriptedSandbox) -> Any:
        box.list_bytes = size // 2
        return box.list_scratch()

    def cont(box: ScriptedSandbox) -> None:
        box.continue_processes()

    def quiesce(box: ScriptedSandbox) -> Any:
        return box.quiesce(budget_seconds=5, wait_seconds=1)

    def archive(box: ScriptedSandbox) -> Any:
        return box.archive(io.BytesIO(), compress=False, verify=False)

    nul_err = flood(size, stream=2, byte="\\000\\033")
    return [
        ("a listing that never ends", [shadow("cat", after=flood(size), only_with_args=True)], listing, over),
        ("a continue that prints", [shadow("kill", before=flood(size))], cont, over),
        (
            "a continue whose stderr floods with NULs",
            [shadow("kill", before=nul_err)],
            cont,
            frozenset({"returned"}),
        ),
        (
            "a quiesce whose watchdog's mktemp floods its stdout",
            [shadow("mktemp", after=flood(size) + " >/proc/$$/fd/1")],
            quiesce,
            frozenset({"returned"}),
        ),
        (
            "a tar that fails with NULs and escapes",
            [replace("tar", nul_err + "; return 2")],
            archive,
            frozenset({"ARCHIVE_FAILED"}),
        ),
    ]
