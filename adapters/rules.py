"""The rule reference that ships with the package: every rule id the outputs name, in words.

Refusals, plans and records name their rule by id (``R2``, ``X4``...); ``scratchbank rules
R2`` prints what it means, and every refusal line says it in words (``title``). This is
our own summary, not the catalogue's text: the catalogue is the source of the numbering.
"""

from __future__ import annotations

import re

import attrs


@attrs.frozen
class Rule:
    id: str
    title: str
    text: str


_FAMILIES = {
    "T": "teardown: banking the scratch when a sandbox stops",
    "S": "subbot children that share their parent's sandbox",
    "R": "the resume gate: refuse or go on, before anything moves",
    "X": "restoring the bank into the new sandbox",
    "C": "consents and the runner's deliveries",
    "L": "the runner's lease while it banks",
    "N": "known limits, and where this project goes further",
    "A": "readings this project chose where the design is open",
    "K": "checkpoint stamps: staleness read from the checkpoint itself (ADR 0013)",
    "H": "a hostile sandbox: what it sends is bounded and nothing it plants is believed (ADR 0008)",
    "P": "deploying: the runner, its settings, its image and its Kubernetes pods (ADR 0012)",
}


def _load() -> dict[str, Rule]:
    from importlib.resources import files

    text = files(__package__ or "scratchbank.adapters").joinpath("rules.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {rid: Rule(rid, title, text) for rid, title, text in (line.split("|", 2) for line in lines)}


RULES: dict[str, Rule] = _load()

_ID = re.compile(r"\b([TSRXCLNAKHP]\d{1,2})\b")


def title(rule_id: str) -> str:
    """``R2 (a node ran after the bank)``; several ids (``R2, X4``) each get theirs."""
    return _ID.sub(
        lambda m: f"{m.group(1)}: {RULES[m.group(1)].title}" if m.group(1) in RULES else m.group(1), rule_id
    )


def family(rule_id: str) -> str:
    return _FAMILIES.get(rule_id[:1], "")


def describe(rule_id: str) -> list[str]:
    """The reference lines for one rule id (KeyError for an id the reference lacks)."""
    rule = RULES[rule_id.upper()]
    return [f"{rule.id}: {rule.title}", f"  {rule.text}", f"  ({family(rule.id)})"]


def listing() -> list[str]:
    return [f"{rule.id:>4}  {rule.title}" for rule in RULES.values()]
