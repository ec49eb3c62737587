"""The run of the limits' tests (N4-N6).

First written for tests/rules/test_N_adapters.py: The limits the rules name (N4-N6): what is not
guaranteed, and what the records say then."""

from __future__ import annotations

RUN = "run-limits"
