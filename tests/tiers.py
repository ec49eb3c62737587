"""The suite's three tiers, marked on every test by the file it lives in (a pytest plugin,
loaded by ``-p tiers`` from pyproject.toml):

- ``pure``: the domain, the use cases over in-memory adapters, the property tests. No process is
  started and no socket is opened: a guard makes either fail the test. ``./dev test -m pure``
  runs them in seconds, with no engine or server started.
- ``adapters``: this machine's own parts: SQLite files, the filesystem store, local sandboxes
  (unshare), the CLI and runner as processes.
- ``engines``: the real engines and servers: Docker, Podman, the Kubernetes API double, S3,
  PostgreSQL, NATS, the image.

A file of tests/rules/ has its tier in its name (``test_T.py`` pure, ``test_T_adapters.py``,
``test_T_engines.py``). Any other file not listed here is ``engines`` (the tier that assumes
the most) until it is placed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PURE = {
    "test_host_check",
    "test_rules_checkpoints",
    "test_rules_restore",
    "test_rules_resume",
    "test_surface_clocks",
    "test_teardown_use_case",
    "test_terminal",
    "test_tiers",
    "test_traceability",
    "test_wire",
    "test_canonical_header",
    "test_checkpoints",
    "test_fuzz_sandbox_output",
    "test_guarantees",
    "test_header_grammar",
    "test_host_archive_chunks",
    "test_run_machine",
    "test_surfaces_agree",
    "test_teardown_machine",
}
ADAPTERS = {
    "test_architecture",
    "test_cli_explain",
    "test_cli_operators",
    "test_deploy",
    "test_host_archive",
    "test_k8s_real",
    "test_load_without_lies",
    "test_readme",
    "test_resume_use_case",
    "test_runner_claims",
    "test_runner_deliveries",
    "test_snapshots",
    "test_surface_error_table",
    "test_fuzz_banks",
}
TIERS = ("pure", "adapters", "engines")
#: The slowest files, slowest first (the sum of their tests' setup, call and teardown, in s, of a
#: whole-suite run with 4 workers on the loaded machine: /work/dur-s5.xml of 2026-12-02, 3,454 s
#: in all; "~": estimated after session 5's cuts): they are collected first, and
#: pytest_xdist_make_scheduler below keeps that order, so that each starts on the first free
#: worker and the short files fill in around them (a long file that starts last bounds the wall
#: time). The sampled explorer's six chunks (SPREAD) go where one chunk's size puts them.
SLOW_FIRST = (
    "test_T_engines",  # 295
    "test_H_engines",  # 185
    "test_X_engines",  # 190, ~165 (kept containers)
    "test_P_engines",  # 162
    "test_A_interleavings_engines",  # 157, ~120 (the explorer's memo)
    "test_A_engines",  # 134
    "test_guarantees",  # 118
    "test_runner_faults",  # 103
    "test_surface_operator_findings",  # 87
    "test_A_interleavings_sampled_engines",  # 857 (six chunks of 96-170), ~460 (six of ~80)
    "test_sandbox_contract",  # 79
    "test_C_engines",  # 74
    "test_X_restore_one_exec_engines",  # 93, ~70 (kept containers)
    "test_surface_errors",  # 68
    "test_X_adapters",  # 65
    "test_surface_core_install",  # 61
    "test_run_machine",  # 45
    "test_cli_operators",  # 43
    "test_surface_queue",  # 43
    "test_C_interleavings_engines",  # 41
    "test_fuzz_banks",  # 39
    "test_R_engines",  # 36
    "test_checkpoints",  # 32
    "test_end_to_end",  # 32
    "test_R_load_without_lies_adapters",  # 30
    "test_L_engines",  # 26
    "test_teardown_machine",  # 21
    "test_hostile_sandbox",  # 21
    "test_quickstart",  # 20
    "test_http_api",  # 20
    "test_cli_sandboxes",  # 16
    "test_k8s",  # 15
    "test_runner_story",  # 15
    "test_R_adapters",  # 15
    "test_fuzz_sandbox_output",  # 14
    "test_X_escape_staged_contract_engines",  # 14
)


#: Files whose tests are independent chunks of one long job: under ``--dist loadfile`` each test
#: of theirs is a unit of its own, so the chunks run on whichever workers are free.
SPREAD = ("test_A_interleavings_sampled_engines",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` as it is, but in the collection's order (SLOW_FIRST: pytest-xdist's
    default, ``--loadscope-reorder``, sorts the files by their number of tests instead, so a long
    file of few tests started last), and with SPREAD's tests each a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowestFirst(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if Path(nodeid.split("::", 1)[0]).stem in SPREAD:
                return nodeid
            return str(super()._split_scope(nodeid))

    config.option.loadscopereorder = False
    return SlowestFirst(config, log)


def tier_of(path: Path) -> str:
    if path.parent.name == "rules":  # tests/rules/test_T.py, test_T_adapters.py, test_T_engines.py
        return next((tier for tier in TIERS[1:] if path.stem.endswith(f"_{tier}")), "pure")
    if path.stem in PURE:
        return "pure"
    if path.stem in ADAPTERS:
        return "adapters"
    return "engines"


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in zip(
        TIERS, ("no process, no socket", "this machine's own parts", "real engines and servers"), strict=True
    ):
        config.addinivalue_line("markers", f"{tier}: the {tier} tier ({what})")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(Path(str(item.fspath))))
    rank = {stem: i for i, stem in enumerate(SLOW_FIRST)}
    # a stable sort: each file's tests stay together and in their order
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))


class ImpureCall(AssertionError):
    """A test of the pure tier started a process or opened a connection."""


@pytest.fixture(autouse=True)
def _pure_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A pure test that starts a process or connects a socket fails: the tier is a promise."""
    if request.node.get_closest_marker("pure") is None:
        yield
        return

    def refuse(what: str) -> Any:
        def call(*_args: Any, **_kwargs: Any) -> Any:
            raise ImpureCall(f"a test of the pure tier {what}: place its file in tests/tiers.py")

        return call

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("started a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("opened a connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("opened a connection"))
    yield


def files_of(tier: str, root: Path) -> list[str]:
    """The test files of ``tier`` under ``root`` (tests/, property_tests/): ``./dev test -m pure``
    collects only these, so that no other tier's imports (engines' clients) are paid for."""
    names = {"pure": PURE, "adapters": ADAPTERS}[tier]
    found = [
        p for d in ("tests", "tests/rules", "property_tests") for p in sorted((root / d).glob("test_*.py"))
    ]
    return [str(p.relative_to(root)) for p in found if p.stem in names or tier_of(p) == tier]


if __name__ == "__main__":
    import sys

    print("\n".join(files_of(sys.argv[1], Path(__file__).resolve().parents[1])))


#: ``SCRATCHBANK_TEST_TIMELINE=FILE``: each test's worker, start and end (the monotonic clock,
#: s), the CPU seconds its worker process spent meanwhile (every thread of it) and those of
#: the child processes it waited for, and its id, appended to FILE, one line a test: where a
#: parallel run's time and CPU went (collection, the tail, a worker idle, the costliest tests).
#: Measurement only; nothing reads it back.
_TIMELINE = os.environ.get("SCRATCHBANK_TEST_TIMELINE", "")
_STARTED: dict[str, tuple[float, float, float]] = {}


def _children_cpu() -> float:
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _TIMELINE:
        _STARTED[nodeid] = (time.monotonic(), time.process_time(), _children_cpu())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _TIMELINE and nodeid in _STARTED:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        start, cpu, children = _STARTED.pop(nodeid)
        used, waited = time.process_time() - cpu, _children_cpu() - children
        with open(_TIMELINE, "a") as out:
            out.write(f"{worker}\t{start:.3f}\t{time.monotonic():.3f}\t{used:.3f}\t{waited:.3f}\t{nodeid}\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _TIMELINE and "PYTEST_XDIST_WORKER" not in os.environ:
        now = time.monotonic()
        with open(_TIMELINE, "a") as out:
            out.write(f"session\t{now:.3f}\t{now:.3f}\t0\t0\t-\n")
