"""Test support shipped with scratchbank, for our tests and for engines' own.

- ``builders``: short constructors for timeline records.
- ``strategies``: hypothesis strategies for realistic timelines (needs ``hypothesis``).
- ``contracts``: conformance checks every adapter of a port must pass.
"""
