"""Helpers and fixtures of the tests first written in tests/rules/test_N_adapters.py (The limits the rules
name (N4-N6): what is not guaranteed, and what the records say then.), shared by the rule tests
filed by family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

RUN = "run-limits"
