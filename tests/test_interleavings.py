"""Issue 18, item 5: the interleaving explorer over the real use cases and adapters.

Two actors: every schedule of their port calls (the first 12 pause points of each, sleep-set
reduced: see ``scratchbank.testing.explorer``), without faults in CI
(``SCRATCHBANK_EXPLORER_FAULTS=1``: with one fault anywhere); three actors: 10,000
distinct random schedules (seeded, up to two faults each: raise, stall, die, lost reply) on
the timeline and lock in memory and 1,000 more on SQLite, each shared out over two processes
(``SCRATCHBANK_EXPLORER_SCHEDULES`` / ``_SQLITE_SCHEDULES`` to change the counts); the
runner's delivery and the outbox sweeper among three actors (``_RUNNER_SCHEDULES``). Each is
checked against the model of the rules in ``scratchbank.testing.interleavings``. The
session's summary prints one line (conftest).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from scratchbank.application.ports import Timeline
from scratchbank.domain.records import Record
from scratchbank.testing.explorer import (
    Bounds,
    Chooser,
    Exploration,
    Fault,
    Pending,
    Port,
    Schedule,
    explore_all,
    explore_random,
    keep,
    reads_by_name,
    replay,
    show,
)
from scratchbank.testing.interleavings import (
    Scenario,
    World,
    explore_kills,
    explore_scenario,
    filesystem_world,
    run_one,
    sample_in_parallel,
    sample_scenarios,
)

SEED = 18
#: Faults per schedule in the exhaustive searches: 0 in CI (every interleaving; the
#: random search draws up to two faults per schedule); 1 for the long run (~20x longer).
EXHAUSTIVE = Bounds(max_faults=int(os.environ.get("SCRATCHBANK_EXPLORER_FAULTS", "0")))


@pytest.fixture
def world(fast_dir: Path) -> Iterator[World]:
    with filesystem_world(fast_dir) as made:
        yield made


@pytest.fixture
def runner_world(fast_dir: Path) -> Iterator[World]:
    """A world whose run lock is a runner's lease (ADR 0007), for the runner's actors."""
    with filesystem_world(fast_dir, runner=True) as made:
        yield made


def none_found(found: Exploration) -> None:
    keep(found)
    assert found.violations == 0, found.report()


def test_A18_teardowns_of_an_older_and_a_newer_sandbox_never_revert_the_newer(world: World) -> None:
    """A18: every interleaving of the old sandbox's late teardown and the newer one's."""
    none_found(explore_scenario(world, Scenario("resumed", ("old", "new")), EXHAUSTIVE))


def test_A16_an_engine_resume_never_goes_on_while_the_first_teardown_banks(world: World) -> None:
    """A16/R10: every interleaving of the first teardown and an engine-side execution."""
    none_found(explore_scenario(world, Scenario("fresh", ("old", "exec")), EXHAUSTIVE))


def test_A16_racing_resumes_run_one_execution(world: World) -> None:
    """A16/C7: every interleaving of two resumes of one parked run: one runs."""
    none_found(explore_scenario(world, Scenario("parked", ("resume", "exec")), EXHAUSTIVE))


def test_A17_a_late_teardown_and_a_resume_never_destroy_the_recorded_bank(world: World) -> None:
    """A17: every interleaving of a late teardown of the old sandbox and a resume."""
    none_found(explore_scenario(world, Scenario("parked", ("old", "resume")), EXHAUSTIVE))


THREE = (
    Scenario("resumed", ("old", "new", "resume")),
    Scenario("fresh", ("old", "exec", "resume")),
    Scenario("resumed", ("old", "new", "delete")),
    Scenario("resumed", ("new", "resume", "resume!")),
    Scenario("fresh", ("old", "resume!", "sweep")),
    Scenario("parked", ("old", "resume", "exec")),
)


#: How many random three-actor schedules (the issue asks for at least 10,000), on the
#: timeline and the run's lock in memory (``filesystem_world(memory=True)``: the same
#: fences, half a schedule's cost), the store on real files; SQLITE_SCHEDULES more on the
#: SQLite timeline and lock. The 10,000 run in tests/test_interleavings_sampled.py, a file of
#: their own so that the suite's workers share the rest of this one. Measured on this shared 2-core machine (load 9-14): 18.7 ms of CPU a
#: schedule in memory (32-47 ms on SQLite), 10,000 in 470-560 s of wall time under that load
#: (~21 schedules/s), ~100-120 s when the two cores are free (estimated from the CPU time).
SQLITE_SCHEDULES = int(os.environ.get("SCRATCHBANK_EXPLORER_SQLITE_SCHEDULES", "1000"))


def test_A16_A17_A18_three_actors_random_schedules_on_sqlite(fast_dir: Path) -> None:
    """A16-A18, C3-C5: SQLITE_SCHEDULES distinct three-actor schedules drawn at random on
    the SQLite timeline and lock (another seed), shared out over two processes."""
    found = keep(sample_in_parallel(fast_dir, THREE, schedules=SQLITE_SCHEDULES, seed=SEED + 1000))
    assert found.schedules >= SQLITE_SCHEDULES, f"only {found.schedules} drawn of {SQLITE_SCHEDULES}"
    assert found.violations == 0, found.report()


class _Unfenced:
    """The timeline with its fence removed: ``expected`` is ignored (every append lands)."""

    def __init__(self, inner: Timeline) -> None:
        self.inner = inner

    def read(self, run_id: str) -> Any:
        return self.inner.read(run_id)

    def append(self, run_id: str, records: list[Record], *, expected: int | None = None) -> int:
        return self.inner.append(run_id, records)


class _AlwaysGrants:
    """The run's lock (A16, ADR 0007's RunLock) with its fence removed: a held lock is
    broken and taken, a lost grant refreshes as if it were still held."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def acquire(self, run_id: str, holder: str, *, ttl: float) -> Any:
        grant = self.inner.acquire(run_id, holder, ttl=ttl)
        if grant is None:
            self.inner.break_lock(run_id, by="planted")
            grant = self.inner.acquire(run_id, holder, ttl=ttl)
        return grant

    def refresh(self, grant: Any, *, ttl: float) -> Any:
        try:
            return self.inner.refresh(grant, ttl=ttl)
        except Exception:
            return grant


def test_A16_a_planted_fence_removal_is_found_and_named(world: World) -> None:
    """A16: with the fences removed (the timeline's claim by position, and the run's lock
    where the service takes one) the explorer reports a violation, names the schedule
    that found it, and that schedule replays to the same violation."""
    world.wrap_timeline = _Unfenced
    world.wrap_lock = _AlwaysGrants
    scenario = Scenario("parked", ("resume", "exec"))
    found = keep(explore_scenario(world, scenario, Bounds(max_faults=0)), counted=False)
    assert found.violations >= 1, found.report()
    kind, (trace, _violation) = next(iter(sorted(found.found.items())))
    print(f"planted fence found {kind} by schedule: {show(trace)}")
    _again, violations = run_one(world, scenario, replay(trace))
    assert kind in {v.kind for v in violations}


def fresh_database(postgres_url: str) -> str:
    import psycopg

    name = "explore_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.mark.postgres
def test_A16_on_postgresql_an_engine_resume_never_goes_on_while_the_first_teardown_banks(
    fast_dir: Path, postgres_url: str
) -> None:
    """A16/R10 on a PostgreSQL timeline (a fresh database): every interleaving."""
    with filesystem_world(fast_dir, fresh_database(postgres_url)) as world:
        none_found(explore_scenario(world, Scenario("fresh", ("old", "exec")), EXHAUSTIVE))


@pytest.mark.parametrize(
    ("scenario", "victim"),
    [(Scenario("fresh", ("old", "exec")), "old"), (Scenario("parked", ("resume", "exec")), "resume")],
    ids=["first-teardown", "racing-resume"],
)
def test_A16_a_real_process_killed_at_each_pause_point(
    fast_dir: Path, scenario: Scenario, victim: str
) -> None:
    """A16: the victim runs in a real process SIGKILLed at each of its pause points in
    turn; the others then run and the model holds (the victim's sandbox is lost, the
    timeline and the store stay usable). Green before and after the fixes: the others
    run after the kill, never beside it."""
    url = f"sqlite:///{fast_dir}/timeline.db"
    with filesystem_world(fast_dir, url) as world:
        none_found(explore_kills(world, url, scenario, victim))


class _Cell:
    """A toy port: one value, read and written."""

    def __init__(self) -> None:
        self.value = 0

    def read(self) -> int:
        return self.value

    def write(self, value: int) -> None:
        self.value = value


def _toy(resources: dict[str, str], calls: int, method: str) -> int:
    """How many schedules the exhaustive search checks for actors each making ``calls``
    calls of ``method`` on the resource ``resources[actor]``."""
    cells = {name: _Cell() for name in set(resources.values())}

    def run(chooser: Any) -> tuple[Any, list[Any]]:
        schedule = Schedule(chooser)
        for actor, resource in resources.items():
            port = schedule.proxy(
                actor, Port(resource, resource, reads_by_name, RuntimeError), cells[resource]
            )
            schedule.actor(
                actor,
                lambda port=port: [
                    getattr(port, method)(*(() if method == "read" else (1,))) for _ in range(calls)
                ],
            )
        return schedule.run().trace, []

    return explore_all("toy", run, Bounds(), len(resources)).schedules


def test_A16_the_search_checks_one_schedule_per_class_of_equivalent_interleavings() -> None:
    """A16 (the explorer's own proof): independent calls commute (one schedule), calls
    that conflict are interleaved every way (C(4, 2) = 6 for two writers of two calls)."""
    assert _toy({"p": "one", "q": "two"}, 3, "write") == 1
    assert _toy({"p": "one", "q": "one"}, 3, "read") == 1
    assert _toy({"p": "one", "q": "one"}, 2, "write") == 6
    assert _toy({"p": "one", "q": "one", "r": "one"}, 1, "write") == 6


def test_A16_random_schedules_are_reproducible_from_their_seed(world: World) -> None:
    """A16 (the explorer's own proof): the same seed draws the same schedules."""
    scenario = Scenario("fresh", ("old", "resume", "sweep"))
    first = explore_random(
        "a", lambda c: run_one(world, scenario, c), Bounds(max_faults=2), 3, schedules=15, seed=7
    )
    again = explore_random(
        "b", lambda c: run_one(world, scenario, c), Bounds(max_faults=2), 3, schedules=15, seed=7
    )
    assert first.traces == again.traces
    assert len(first.traces) == 15


def _first_then(actor: str, fault: Fault, then: str) -> Chooser:
    """A policy: ``actor``'s first call with ``fault``, then ``then`` while it can move."""
    taken: list[str] = []

    def chooser(paused: Sequence[Pending]) -> tuple[str, Fault]:
        if not taken:
            taken.append(actor)
            return actor, fault
        ready = [p.actor for p in paused]
        return (then if then in ready else ready[0]), Fault.NONE

    return chooser


def test_A18_a_teardown_whose_first_read_failed_never_records_over_a_newer_execution(world: World) -> None:
    """A18/A16 (issue 18, class 1): the first teardown's first read fails (a blip), a newer
    execution tries to run and bank, then the teardown goes on: nothing is reverted (R2)
    and nothing is lost in silence (the execution waits for the teardown's lock: A16)."""
    trace, violations = run_one(
        world, Scenario("fresh", ("old", "exec")), _first_then("old", Fault.RAISE, "exec")
    )
    assert not violations, f"{show(trace)}: {violations}"


def _dies_at(victim: str, at: int) -> Chooser:
    """A policy: actors take turns in order; ``victim`` dies at its ``at``-th call."""
    steps: dict[str, int] = {}

    def chooser(paused: Sequence[Pending]) -> tuple[str, Fault]:
        pick = min(paused, key=lambda p: (steps.get(p.actor, 0), p.actor))
        steps[pick.actor] = steps.get(pick.actor, 0) + 1
        return pick.actor, (Fault.DIE if pick.actor == victim and steps[pick.actor] == at else Fault.NONE)

    return chooser


def _no_thread_left(world: World, scenarios: Sequence[Scenario]) -> None:
    """Each actor of each scenario dies at its first, second and fourth call in turn: no
    violation, and as many threads after as before."""
    import threading

    before = threading.active_count()
    for scenario in scenarios:
        for victim in scenario.actors:
            for at in (1, 2, 4):
                trace, violations = run_one(world, scenario, _dies_at(victim, at))
                assert not violations, f"{show(trace)}: {violations}"
    for ended in threading.enumerate():  # a call's watchdog, cancelled as its call ended
        if isinstance(ended, threading.Timer) and ended.finished.is_set():
            ended.join()
    assert threading.active_count() == before, [t.name for t in threading.enumerate()]


def test_A16_dead_actors_and_their_grants_leave_no_thread_behind(world: World) -> None:
    """A16 (the explorer's own proof): schedules whose actors die at their pause points,
    holding the run's lock or not, end with as many threads as they started with (a dead
    actor's thread unwinds; no grant is kept alive once its schedule is checked)."""
    _no_thread_left(
        world, (Scenario("fresh", ("old", "exec", "resume")), Scenario("parked", ("old", "resume", "exec")))
    )


def test_L5_dead_runner_actors_leave_no_thread_behind(runner_world: World) -> None:
    """L5/A16 (the explorer's own proof): a runner's delivery (its lease keeper) and the
    outbox sweeper that die at their pause points leave no thread behind."""
    _no_thread_left(runner_world, (Scenario("queued!", ("deliver", "outbox", "resume!")),))


#: The runner's delivery (``deliver``: a runner handling the queued attempt, redelivered
#: once when it asks) and the outbox sweeper (``outbox``) among the other actors (issue 19).
RUNNER = (
    Scenario("queued", ("deliver", "old", "resume")),
    Scenario("queued!", ("deliver", "new", "outbox")),
    Scenario("queued", ("deliver", "outbox", "exec")),
    Scenario("queued!", ("deliver", "outbox", "resume!")),
)
RUNNER_SCHEDULES = int(os.environ.get("SCRATCHBANK_EXPLORER_RUNNER_SCHEDULES", "200"))


def test_C4_L4_A16_a_runner_delivery_and_the_sweeper_among_three_actors(runner_world: World) -> None:
    """C4, L4, A16-A18 (issue 19): RUNNER_SCHEDULES random three-actor schedules (seeded,
    up to two faults) of a runner's delivery, the outbox sweeper, teardowns and resumes:
    no silent revert, the recorded bank kept, one execution at a time, a lost claim reply
    keeps its consent, no run left queued once the sweeper runs."""
    found = keep(sample_scenarios(runner_world, RUNNER, schedules=RUNNER_SCHEDULES, seed=SEED))
    assert found.schedules >= RUNNER_SCHEDULES
    assert found.violations == 0, found.report()


def test_C4_a_planted_guess_of_a_lost_claim_reply_is_found(
    runner_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C4 (issue 19, hole 1): every schedule of a consenting delivery with one lost reply
    holds; with the runner's settle-by-reading removed (a lost reply taken as not landed)
    the explorer finds the claim that drops its consent, by the schedule
    ``deliver:timeline.read > deliver:lease.acquire > deliver:timeline.read >
    deliver:timeline.append!lost > ...`` (the claim landed, its reply lost; the
    redelivery reads it claimed and lends no consent)."""
    from scratchbank.application import fencing

    scenario = Scenario("queued!", ("deliver",))
    lost_only = Bounds(max_faults=1, faults=frozenset({Fault.LOST}))
    none_found(explore_scenario(runner_world, scenario, lost_only))

    def guess(_timeline: Any, _run_id: str, _records: Any, _at: int, lost: Exception) -> int:
        raise lost

    monkeypatch.setattr(fencing, "settle_append", guess)
    found = keep(explore_scenario(runner_world, scenario, lost_only), counted=False)
    kind = "C3-C5: a claim carries consents its call did not give"
    assert kind in found.found, found.report()
    trace, _violation = found.found[kind]
    print(f"planted guess found by schedule: {show(trace)}")
    assert [str(s) for s in trace[:4]] == [
        "deliver:timeline.read",
        "deliver:lease.acquire",
        "deliver:timeline.read",
        "deliver:timeline.append!lost",
    ]
