"""Test support shipped with scratchbank, for our tests and for engines' own.

- ``builders``: short constructors for timeline records.
- ``strategies``: hypothesis strategies for realistic timelines (needs ``hypothesis``).
- ``contracts``: conformance checks every adapter of a port must pass.
- ``hostile``: a hostile-sandbox kit (binaries, names and output of a compromised
  sandbox) any ScriptedSandbox engine runs against its own adapter (ADR 0008).
- ``explorer``: a deterministic scheduler that interleaves actors at every port call,
  with faults there, searched exhaustively (sleep sets) or at random (seeded).
- ``interleavings``: the explorer's scenarios over the real use cases, and its model
  of the rules (issue 18).
"""
