"""Issue 25: a compromised sandbox can neither harm the host nor make a record lie.

The workload replaces binaries on its PATH (the kit's HostileSandbox shadows them with
shell functions ahead of our scripts, over the engine's real transport), chooses its
process names, plants links and fills its disk. Each finding is a test on every engine
it applies to: local, Docker and Podman on BusyBox and GNU, the Kubernetes double.
"""

from __future__ import annotations

import tarfile

import pytest
from rigs.real_sandboxes import ENGINES, rig

from scratchbank.adapters.restore_wire import FramedStream
from scratchbank.adapters.scripted import QUIESCE
from scratchbank.testing.hostile import check_hostile_sandbox


# -- 5 (build). the kit runs on every engine -----------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_kit_every_hostile_scenario_ends_in_a_named_outcome(engine: str) -> None:
    """The shipped kit against each engine's adapter."""
    with rig(engine) as r:
        r.sh(f"mkdir -p {r.scratch} && echo x > {r.scratch}/f")
        outcomes = check_hostile_sandbox(lambda: r.sandbox, flood_bytes=1 << 20)
    assert len(outcomes) >= 5


_ = (QUIESCE, FramedStream, tarfile)
