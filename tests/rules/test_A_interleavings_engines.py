"""Rules A: readings this project chose where the design is open. The engines tier's tests of A16, A17,
A18 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). They sit apart from test_A_engines.py so that a parallel run (--dist
loadfile) can give their minutes to a worker of their own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from rigs.explorer_worlds import (
    EXHAUSTIVE,
    SEED,
    SQLITE_SCHEDULES,
    THREE,
    _AlwaysGrants,
    _Cell,
    _first_then,
    _no_thread_left,
    _toy,
    _Unfenced,
    fresh_database,
    none_found,
    world,  # noqa: F401 - a fixture
)
from waiting import eventually

from scratchbank.testing import explorer
from scratchbank.testing.clocks import ManualClock
from scratchbank.testing.explorer import (
    STALL_SECONDS,
    Bounds,
    Fault,
    Port,
    Pruned,
    Schedule,
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
)

# ---- from tests/rules/test_[ACL]*.py: Issue 18, item 5: the interleaving explorer over the real use cases and adapters.


def test_A18_teardowns_of_an_older_and_a_newer_sandbox_never_revert_the_newer(world: World) -> None:
    """A18: every interleaving of the old sandbox's late teardown and the newer one's.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    none_found(explore_scenario(world, Scenario("resumed", ("old", "new")), EXHAUSTIVE))


def test_A16_an_engine_resume_never_goes_on_while_the_first_teardown_banks(world: World) -> None:
    """A16/R10: every interleaving of the first teardown and an engine-side execution.
    Proves ``scratchbank.application.run_lock.start_run``."""
    none_found(explore_scenario(world, Scenario("fresh", ("old", "exec")), EXHAUSTIVE))


def test_A16_racing_resumes_run_one_execution(world: World) -> None:
    """A16/C7: every interleaving of two resumes of one parked run: one runs.
    Proves ``scratchbank.application.run_lock.start_run``."""
    none_found(explore_scenario(world, Scenario("parked", ("resume", "exec")), EXHAUSTIVE))


def test_A17_a_late_teardown_and_a_resume_never_destroy_the_recorded_bank(world: World) -> None:
    """A17: every interleaving of a late teardown of the old sandbox and a resume.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    none_found(explore_scenario(world, Scenario("parked", ("old", "resume")), EXHAUSTIVE))


def test_A16_A17_A18_three_actors_random_schedules_on_sqlite(fast_dir: Path) -> None:
    """A16-A18, C3-C5: SQLITE_SCHEDULES distinct three-actor schedules drawn at random on
    the SQLite timeline and lock (another seed), shared out over two processes.
    Proves ``scratchbank.application.run_lock.start_run``."""
    found = keep(sample_in_parallel(fast_dir, THREE, schedules=SQLITE_SCHEDULES, seed=SEED + 1000))
    assert found.schedules >= SQLITE_SCHEDULES, f"only {found.schedules} drawn of {SQLITE_SCHEDULES}"
    assert found.violations == 0, found.report()


def test_A16_a_planted_fence_removal_is_found_and_named(world: World) -> None:
    """A16: with the fences removed (the timeline's claim by position, and the run's lock
    where the service takes one) the explorer reports a violation, names the schedule
    that found it, and that schedule replays to the same violation.
    Proves ``scratchbank.application.run_lock.start_run``."""
    world.wrap_timeline = _Unfenced
    world.wrap_lock = _AlwaysGrants
    scenario = Scenario("parked", ("resume", "exec"))
    found = keep(explore_scenario(world, scenario, Bounds(max_faults=0)), counted=False)
    assert found.violations >= 1, found.report()
    kind, (trace, _violation) = next(iter(sorted(found.found.items())))
    print(f"planted fence found {kind} by schedule: {show(trace)}")
    _again, violations = run_one(world, scenario, replay(trace))
    assert kind in {v.kind for v in violations}


@pytest.mark.postgres
def test_A16_on_postgresql_an_engine_resume_never_goes_on_while_the_first_teardown_banks(
    fast_dir: Path, postgres_url: str
) -> None:
    """A16/R10 on a PostgreSQL timeline (a fresh database): every interleaving.
    Proves ``scratchbank.application.run_lock.start_run``."""
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
    run after the kill, never beside it. Proves ``scratchbank.application.run_lock.start_run``."""
    url = f"sqlite:///{fast_dir}/timeline.db"
    with filesystem_world(fast_dir, url) as world:
        none_found(explore_kills(world, url, scenario, victim))


def test_A16_the_search_checks_one_schedule_per_class_of_equivalent_interleavings() -> None:
    """A16 (the explorer's own proof): independent calls commute (one schedule), calls
    that conflict are interleaved every way (C(4, 2) = 6 for two writers of two calls).
    Proves ``scratchbank.application.run_lock.start_run``."""
    assert _toy({"p": "one", "q": "two"}, 3, "write") == 1
    assert _toy({"p": "one", "q": "one"}, 3, "read") == 1
    assert _toy({"p": "one", "q": "one"}, 2, "write") == 6
    assert _toy({"p": "one", "q": "one", "r": "one"}, 1, "write") == 6


def test_A16_random_schedules_are_reproducible_from_their_seed(world: World) -> None:
    """A16 (the explorer's own proof): the same seed draws the same schedules.
    Proves ``scratchbank.application.run_lock.start_run``."""
    scenario = Scenario("fresh", ("old", "resume", "sweep"))
    first = explore_random(
        "a", lambda c: run_one(world, scenario, c), Bounds(max_faults=2), 3, schedules=15, seed=7
    )
    again = explore_random(
        "b", lambda c: run_one(world, scenario, c), Bounds(max_faults=2), 3, schedules=15, seed=7
    )
    assert first.traces == again.traces
    assert len(first.traces) == 15


def test_A18_a_teardown_whose_first_read_failed_never_records_over_a_newer_execution(world: World) -> None:
    """A18/A16 (issue 18, class 1): the first teardown's first read fails (a blip), a newer
    execution tries to run and bank, then the teardown goes on: nothing is reverted (R2)
    and nothing is lost in silence (the execution waits for the teardown's lock: A16).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    trace, violations = run_one(
        world, Scenario("fresh", ("old", "exec")), _first_then("old", Fault.RAISE, "exec")
    )
    assert not violations, f"{show(trace)}: {violations}"


def test_A16_dead_actors_and_their_grants_leave_no_thread_behind(world: World) -> None:
    """A16 (the explorer's own proof): schedules whose actors die at their pause points,
    holding the run's lock or not, end with as many threads as they started with (a dead
    actor's thread unwinds; no grant is kept alive once its schedule is checked).
    Proves ``scratchbank.application.run_lock.start_run``."""
    _no_thread_left(
        world, (Scenario("fresh", ("old", "exec", "resume")), Scenario("parked", ("old", "resume", "exec")))
    )


def test_A16_a_memoised_verdict_is_the_verdict_checked_afresh(
    fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A16 (the explorer's own proof): with the fences removed, the random sample's verdicts
    with the end-of-schedule memo (``_fingerprint``: every schedule's run id read as one) are
    those checked afresh, schedule by schedule, violations found. Proves
    ``scratchbank.application.run_lock.start_run``."""
    import scratchbank.testing.interleavings as kit

    def verdicts(root: Path) -> dict[tuple[int, str], list[str]]:
        seen: dict[tuple[int, str], list[str]] = {}
        for k, scenario in enumerate(THREE):
            with filesystem_world(root / f"s{k}", memory=True) as world:
                world.wrap_timeline, world.wrap_lock = _Unfenced, _AlwaysGrants

                def run(chooser: Any, scenario: Scenario = scenario, world: World = world, k: int = k) -> Any:
                    trace, violations = run_one(world, scenario, chooser)
                    seen[(k, show(trace))] = sorted(v.kind for v in violations)
                    return trace, violations

                explore_random(scenario.name, run, Bounds(max_faults=2), 3, schedules=8, seed=SEED + k)
        return seen

    memoised = verdicts(fast_dir / "memo")
    monkeypatch.setattr(kit, "_fingerprint", lambda *_args: None)
    afresh = verdicts(fast_dir / "afresh")
    assert memoised == afresh
    assert any(memoised.values()), "the planted fence removal found nothing"


def _cell_port(label: str, *, own_thread_only: bool = False) -> Port:
    return Port(
        label,
        label,
        reads_by_name,
        lambda m, why: RuntimeError(f"{label}.{m}: {why}"),
        own_thread_only=own_thread_only,
    )


def _scripted(faults: list[Fault]) -> Any:
    """A chooser: the first paused actor, with the next fault of ``faults`` (then none)."""
    left = list(faults)

    def chooser(paused: Any) -> tuple[str, Fault]:
        return paused[0].actor, (left.pop(0) if left else Fault.NONE)

    return chooser


def _actor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("actor-")]


def test_A16_an_actor_that_stops_moving_is_reported_as_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """A16 (the explorer's own proof): an actor that neither reaches its first pause point,
    nor pauses or ends after a grant, within HANG_SECONDS (real seconds) ends its schedule
    as a hang naming it and the call it was granted; released, it never reaches a port.
    Proves ``scratchbank.application.run_lock.start_run``."""
    monkeypatch.setattr(explorer, "HANG_SECONDS", 0.2)
    stuck = threading.Event()
    cell = _Cell()

    def hung(first: bool) -> str:
        schedule = Schedule(_scripted([]))
        port = schedule.proxy("p", _cell_port("cell"), cell)

        def body() -> None:
            if first:
                stuck.wait()
            port.read()
            stuck.wait()
            port.write(1)

        schedule.actor("p", body)
        return schedule.run().hang

    try:
        assert hung(True).startswith("p did not reach its first pause point")
        assert hung(False).startswith("p neither paused nor ended within 0.2 s after cell.read")
    finally:
        stuck.set()
    eventually(lambda: not _actor_threads(), what="the hung actors' threads unwound", timeout=30)
    assert cell.value == 0


def test_A16_a_port_call_from_another_thread_of_an_actor_is_refused_or_paused_as_the_actor() -> None:
    """A16 (the explorer's own proof): on an own-thread-only port (the lock, the lease) a
    call from a thread the actor started (a grant's refresh thread) is refused by the
    port's error, untouched and unscheduled; on any other port it pauses as its actor
    (a restore's producer thread while the actor waits on its pipe).
    Proves ``scratchbank.application.run_lock.start_run``."""
    held, stored = _Cell(), _Cell()
    schedule = Schedule(_scripted([]))
    lock = schedule.proxy("p", _cell_port("lock", own_thread_only=True), held)
    store = schedule.proxy("p", _cell_port("store"), stored)
    refused: list[str] = []

    def helper() -> None:
        try:
            lock.write(1)
        except RuntimeError as error:
            refused.append(str(error))
        store.write(2)

    def body() -> None:
        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        lock.write(3)

    schedule.actor("p", body)
    ran = schedule.run()
    assert [str(step) for step in ran.trace] == ["p:store.write", "p:lock.write"]
    assert (held.value, stored.value) == (3, 2)
    assert refused == ["lock.write: called outside its actor's thread (refused, untouched)"]


def test_A16_each_fault_at_a_pause_point_does_what_it_names() -> None:
    """A16 (the explorer's own proof): raise (the call does not happen: the port's error),
    stall (the actor's clock moves STALL_SECONDS, then the error), lost (the call
    happens, then the error), die (the actor never continues: its thread unwinds at the
    schedule's end and nothing reaches the port); the other actor runs on.
    Proves ``scratchbank.application.run_lock.start_run``."""
    cell, other = _Cell(), _Cell()
    clock = ManualClock()
    schedule = Schedule(_scripted([Fault.RAISE, Fault.STALL, Fault.LOST, Fault.NONE, Fault.DIE]))
    port = schedule.proxy("p", _cell_port("cell"), cell)
    theirs = schedule.proxy("q", _cell_port("other"), other)

    def body() -> list[str]:
        seen = []
        for value in (1, 2, 3, 4):
            try:
                port.write(value)
                seen.append("ok")
            except RuntimeError:
                seen.append(f"error at {cell.value}")
        port.write(5)  # dies here
        return seen

    schedule.actor("p", body, clock=clock)
    schedule.actor("q", lambda: theirs.write(7))
    before = clock.elapsed
    ran = schedule.run()
    assert ran.ends["p"].result is None and ran.ends["p"].dead and ran.ends["p"].steps == 5
    assert (cell.value, other.value, clock.elapsed - before) == (4, 7, STALL_SECONDS)
    assert [str(step) for step in ran.trace] == [
        "p:cell.write!raise",
        "p:cell.write!stall",
        "p:cell.write!lost",
        "p:cell.write",
        "p:cell.write!die",
        "q:other.write",
    ]
    assert not _actor_threads()


def test_A16_a_chooser_that_gives_up_ends_the_schedule_and_every_actor_thread() -> None:
    """A16 (the explorer's own proof): a chooser's error (a pruned or diverged schedule)
    is raised by ``run``, with every actor's thread unwound and no port touched after it.
    Proves ``scratchbank.application.run_lock.start_run``."""
    cells = {name: _Cell() for name in "pq"}
    picks: list[str] = []

    def chooser(paused: Any) -> tuple[str, Fault]:
        if picks:
            raise Pruned("sleep-set blocked")
        picks.append(paused[-1].actor)
        return paused[-1].actor, Fault.NONE

    schedule = Schedule(chooser)
    for name in "pq":
        port = schedule.proxy(name, _cell_port(name), cells[name])
        schedule.actor(name, lambda port=port: [port.write(n) for n in (1, 2)])
    with pytest.raises(Pruned):
        schedule.run()
    assert picks == ["q"] and (cells["p"].value, cells["q"].value) == (0, 1)
    assert not _actor_threads()
