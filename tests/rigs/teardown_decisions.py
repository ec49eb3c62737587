"""The teardown's plan from records (``plan_teardown``): clean and raced archives, a quiesce.

First written for tests/rules/test_[ATX]*.py: Teardown decisions, rule by rule (T1, T4-T6, T9, T11,
T13, T16, T19, T20, X3, A7)."""

from __future__ import annotations

from scratchbank.domain import (
    Archive,
    Quiesce,
    fold,
    plan_teardown,
)

CLEAN = Archive(bytes=500, sha256="a" * 64)


RACED = Archive(bytes=600, sha256="b" * 64, raced=("./log.txt",))


QUIET = Quiesce(quiesced=True)


def plan(records=(), *, host_backed=False, isolated=True, finished=False):  # type: ignore[no-untyped-def]
    return plan_teardown(
        fold(records), scratch_host_backed=host_backed, process_isolated=isolated, run_finished=finished
    )
