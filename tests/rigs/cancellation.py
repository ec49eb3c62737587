"""Helpers and fixtures of the tests first written in tests/rules/test_[HT]*.py (One cancellation
scope (issue 25, build item 0): a scope owns its deadline, its cancel and its threads, and joins
them on exit; nothing outlives it silently. And ``retry_within``, the one retry loop (its ``again``
and ``stop``).), shared by the rule tests filed by family in tests/rules/ and by the tests that
stayed."""

from __future__ import annotations

#: a safety net for waits on events other threads set (never a timed assertion)
HUNG = 30.0
