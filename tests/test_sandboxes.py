"""The sandbox adapters and their in-sandbox scripts, against real engines (T11-T18, X2).

Every test runs on the local sandbox (unshare), Docker and Podman, each on a BusyBox
and a GNU userland where the test applies.
"""

from __future__ import annotations

import pytest
from rigs.real_sandboxes import CONTAINERS, ENGINES, EXERCISED, rig


@pytest.fixture(params=CONTAINERS)
def container(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    with rig(request.param) as r:
        yield r


def test_engines_listed() -> None:
    """The rigs cover the local sandbox, both container engines and the Kubernetes double; the
    image (tests/rules/test_P_engines.py, which may run first) is the one other engine a test may name."""
    assert {e.split("-")[0] for e in ENGINES} == {"local", "docker", "podman", "k8s"}
    known = {
        "local",
        "docker",
        "podman",
        "image",
        "kubernetes (API double)",
        "kubernetes (API double, docker pods)",
    }
    assert known >= EXERCISED
