"""The explorer's scenarios and its model of the rules (issue 18, item 5).

Actors drive the public service (``ScratchService``, as ``ExplorerService``: the grants it
holds are ``StillHeldLock``s, which no thread refreshes, the clocks standing still) over
real adapters (an SQLite or PostgreSQL ``EventStoreTimeline``, a ``FilesystemBankStore``)
and ``FakeSandbox``es,
each port wrapped by the explorer (``scratchbank.testing.explorer``). Every schedule runs
on a run of its own (a fresh run id in the same timeline and store), from a preset:

- ``fresh``: ``run_started``, node ``a`` finished in the first sandbox ("old", holding
  ``a``): nothing banked yet.
- ``resumed``: ``fresh``, then the old sandbox's teardown banked ``{a}``, a resume
  restored it into a newer sandbox ("new") which ran node ``b`` (``{a, b}``); the old
  sandbox is still there (a slow shutdown, a second teardown call for it).
- ``parked``: ``resumed``, then the newer sandbox's teardown banked ``{a, b}`` (the run
  is parked; resumes restore it).
- ``queued`` / ``queued!``: ``parked``, then queued for the runner's attempt ``deliver``
  through the service's one queueing path (``!``: with ``accept_scratch_loss``); its
  delivery is already with the runner actor (the actors' queue starts empty). Run in a
  runner's world (``filesystem_world(runner=True)``: the run's lock is the runner's
  lease, handed to every service, ADR 0007).

The actors (names are what traces show):

- ``old`` / ``new``: a teardown of that sandbox (``bank_at_teardown``);
- ``exec``: an execution: an engine-side resume into a sandbox of its own, and if it
  goes on, node ``b`` in it (recorded at its claim), then its own teardown;
- ``resume`` / ``resume!``: an engine-side resume into a sandbox of its own (``!``:
  with ``accept_scratch_loss``);
- ``delete``: the run's deletion (its bank swept from the store);
- ``sweep``: the orphan sweeper over the run.
- ``deliver``: a runner handling the queued delivery (``Runner.handle``: the lease, the
  claim, the resume through the fenced timeline, an engine that finishes node
  ``deliver-node`` in its own sandbox, the teardown's bank), redelivered once at once
  when it asks to be (issue 19);
- ``outbox``: one sweep of the outbox under the sweeper's lease (issue 19).

The model (``check``), from RULES.md, never from the code under test. Once every actor
has ended (the dead ones stay dead: their sandboxes are lost), a live execution's
sandbox is torn down alone, then:

- A17/T3: the bank the timeline names is in the store as recorded (``status``);
- R2: no resume (an actor's, or a last one run alone after everything) restores a
  scratch that lacks a node recorded as finished in a sandbox after the start of the
  execution whose scratch it is (every scratch carries a file, ``MARK``, naming that
  execution: the model's lineage; the nodes recorded before that start were judged at
  that execution's own resume);
- A16/R10: no resume goes on without a scratch (no consent) while a node's work was
  neither banked, nor recorded lost (``unknown``/unbanked teardown, accepted loss), nor
  held only by sandboxes that died;
- A16/C7: an execution runs only with its claim (its ``run_resumed``, once), and two
  executions never run at once (none starts while another runs);
- C3-C5: a ``run_resumed`` carries the consents of its own call only (a delivery's first
  claim its delivery's, even when its claim's reply was lost; a redelivery of a claimed
  attempt none: C4), and an accepted loss is written only under a claim whose call gave it;
- L4: once the outbox sweeper ran (a sweep cut short is followed by one alone), the run
  is not left queued with nothing published: claimed, on the queue, or parked;
- T3: a deleted run holds nothing in the store once every actor ended;
- every actor ends by a named error or its result (no raw exception), and reaches its
  next pause point in time (no hang).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.ports import BankStore, LockGrant, ResumeDelivery, RunLock, Timeline
from scratchbank.application.resume import ResumeOutcome, Target
from scratchbank.application.run_lock import LOCK_TTL, HeldLock
from scratchbank.application.service import ScratchService
from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import QueueUnavailable, ScratchbankError
from scratchbank.domain.fold import counts_as_write, fold
from scratchbank.domain.kinds import NO_WORKFLOW
from scratchbank.domain.records import (
    NodeFinished,
    OrphanSwept,
    Record,
    RunResumed,
    RunStarted,
    ScratchBanked,
    ScratchForsaken,
    ScratchRestored,
)
from scratchbank.domain.resume_gate import ResumeRequest, Verdict
from scratchbank.domain.wire import encode

from .clocks import ManualClock
from .explorer import (
    Bounds,
    Chooser,
    Exploration,
    Fault,
    Port,
    Ran,
    Schedule,
    Trace,
    Violation,
    explore_all,
    explore_random,
    lock_port,
    reads_by_name,
    sandbox_port,
    store_port,
    timeline_port,
)

RESUMES = ("exec", "resume", "resume!")
#: The runner's delivery actor, and the attempt it carries (queued by the ``queued`` presets).
DELIVER = "deliver"
#: The SQLite file of the run's lock (A16), beside the world's timeline and store.
LOCKS = "locks.db"
#: A file in every scratch naming the execution whose scratch it is (the model's lineage).
MARK = ".execution"


@attrs.define
class World:
    """The real adapters every schedule shares (each schedule on a run of its own)."""

    timeline: Timeline
    store: BankStore
    store_root: Path | None = None
    prefix: str = "x"
    count: Iterator[int] = attrs.Factory(itertools.count)
    #: wraps the timeline every actor sees (a planted fence removal, a test's spy)
    wrap_timeline: Callable[[Timeline], Any] = lambda timeline: timeline
    templates: dict[str, tuple[Record, ...]] = attrs.Factory(dict)
    #: the run's lock (A16) every service takes, once the service has one; wrapped for
    #: every actor as the timeline is (a planted fence removal: a lock that always grants)
    lock: Any = None
    #: the end-of-schedule verdicts already reached, by fingerprint (``_fingerprint``)
    checked: dict[Any, list[Violation]] = attrs.Factory(dict)
    wrap_lock: Callable[[Any], Any] = lambda lock: lock
    #: the lock's clock (its leases' expiry): advanced past a lease to let a dead holder's lapse
    clock: ManualClock = attrs.Factory(ManualClock)
    #: the runner's lease (a runner's world: the run's lock is this lease, handed: ADR 0007)
    lease: Any = None

    @property
    def template_run(self) -> str:
        return f"{self.prefix}template"

    def run_id(self) -> str:
        return f"{self.prefix}{next(self.count)}"


def node(name: str) -> NodeFinished:
    return NodeFinished(node=name, kind="agent", succeeded=True, in_sandbox=True, on_cycle=False)


class StillHeldLock(HeldLock):
    """A held grant that nothing refreshes: the explorer's clocks stand still, and a refresh
    thread would be a schedule it does not control (was the product's ``keep_alive=False``)."""

    def _keep_alive(self) -> None:
        """No refresh thread."""


class ExplorerService(ScratchService):
    """The public service, holding the grants of the executions it starts or is handed
    without a refresh thread (``StillHeldLock``)."""

    def _hold(self, lock: RunLock, grant: LockGrant) -> HeldLock:
        return StillHeldLock(lock, grant, ttl=self.lock_ttl)


def service(timeline: Any, store: Any, clock: Any = None, lock: Any = None) -> ScratchService:
    """The public service over these ports (and the run's lock, where the service takes one)."""
    extra = {"lock": lock} if lock is not None and "lock" in attrs.fields_dict(ScratchService) else {}
    return ExplorerService(timeline=timeline, store=store, clock=clock or ManualClock(), **extra)


@attrs.define
class Story:
    """One schedule's run: its sandboxes (by label), who owns each, and what happened."""

    run_id: str
    sandboxes: dict[str, FakeSandbox] = attrs.Factory(dict)
    owner: dict[str, str] = attrs.Factory(dict)  # sandbox label -> the actor that ends it
    requests: dict[str, ResumeRequest] = attrs.Factory(dict)
    executions: dict[str, str | None] = attrs.Factory(dict)  # sandbox label -> its execution (A18)
    torn_down: set[str] = attrs.Factory(set)
    restored: dict[str, dict[str, bytes]] = attrs.Factory(dict)  # a resume's scratch once restored
    #: a grant of the run's lock handed to an actor before it starts (an engine's hand-off)
    handed: dict[str, LockGrant] = attrs.Factory(dict)
    services: dict[str, ScratchService] = attrs.Factory(dict)  # each actor's own service
    #: the grants the actors' services still held when the schedule ended, by actor
    held: dict[str, tuple[str, LockGrant]] = attrs.Factory(dict)
    #: the executions running now (a resume that went on, a delivery's engine), and any
    #: execution that started while another ran (A16)
    running: set[str] = attrs.Factory(set)
    overlaps: list[str] = attrs.Factory(list)
    #: the queue the runner's actors publish to (a ``queued`` preset's delivery was
    #: fetched already: it starts empty), the consents the run was queued with
    queue: Any = None
    queued: Consents = Consents()


def hand(mine: ScratchService, grant: LockGrant) -> None:
    """Hand ``grant`` (an execution's, its holder the execution id) to ``mine``: its
    teardown of that execution lets the lock go once recorded (A16). Nothing refreshes
    it (the explorer's clocks stand still)."""
    mine.hand_over(grant)


def take_lock(world: World, run_id: str, execution: str) -> LockGrant | None:
    """The run's lock for ``execution`` (None: no lock in this world)."""
    if world.lock is None:
        return None
    grant = world.lock.acquire(run_id, execution, ttl=LOCK_TTL)
    if grant is None:
        raise RuntimeError(f"run {run_id}: the preset's execution {execution} could not take the lock")
    return grant  # type: ignore[no-any-return]


def collect_held(story: Story) -> None:
    """Stop keeping alive the grants the actors' services still hold, without letting
    them go (a dead actor's lease stays in the lock store until it lapses), and keep
    them by actor."""
    for actor, mine in story.services.items():
        for grant in mine.drop_holds().values():
            story.held[actor] = (grant.holder, grant)


def preset(world: World, name: str) -> Story:
    """The run as it stands when the actors start (module docstring).

    The ``resumed`` preset is made once per world by the real use cases (a teardown, a
    resume), then copied for each schedule: its records appended as they are, its
    store folder copied (so it reads as the real one, whatever the store's layout)."""
    if name.startswith("queued"):
        return _queued(world, accept=name.endswith("!"))
    story = Story(world.run_id())
    story.sandboxes["old"] = FakeSandbox({"a": b"a", MARK: b"e1"})
    story.executions["old"] = "e1"
    if name == "fresh":
        grant = take_lock(world, story.run_id, "e1")
        if grant is not None:
            story.handed["old"] = grant
        world.timeline.append(story.run_id, [RunStarted(at=ManualClock().now(), execution="e1"), node("a")])
        return story
    records = world.templates.get(name)
    if records is None:
        records = world.templates[name] = _resumed(world, parked=name == "parked")
    world.timeline.append(story.run_id, records)
    if world.store_root is None:
        raise ValueError("the resumed preset copies a filesystem store's folder")
    template = world.template_run + ("p" if name == "parked" else "")
    shutil.copytree(world.store_root / "runs" / template, world.store_root / "runs" / story.run_id)
    story.sandboxes["new"] = FakeSandbox({"a": b"a", "b": b"b", MARK: b"setup"})
    story.executions["new"] = execution_of(records, "setup")
    live = story.executions["new"]
    if name == "resumed" and live is not None:  # the newer execution runs: it holds the lock
        grant = take_lock(world, story.run_id, live)
        if grant is not None:
            story.handed["new"] = grant
    return story


def _queued(world: World, *, accept: bool) -> Story:
    """``parked``, then queued for the runner's attempt ``DELIVER`` through the service's
    one queueing path (``accept``: with ``accept_scratch_loss``); its delivery was
    fetched by the runner actor already (the actors' queue starts empty)."""
    from scratchbank.adapters.inprocess import InProcessQueue

    story = preset(world, "parked")
    story.queued = Consents(accept_scratch_loss=accept)
    story.queue = InProcessQueue(clock=ManualClock())
    queuing = ScratchService(
        timeline=world.timeline, store=world.store, clock=ManualClock(), queue=InProcessQueue()
    )
    queued = queuing.queue_resume(story.run_id, ResumeRequest(story.queued), attempt=DELIVER)
    if queued.attempt != DELIVER:
        raise RuntimeError(f"the queued preset could not be made: {queued}")
    return story


def execution_of(records: Sequence[Record], attempt: str) -> str | None:
    """The execution id a resume's claim carries (A18), where its records carry one."""
    for r in records:
        if isinstance(r, RunResumed) and r.attempt == attempt:
            found = getattr(r, "execution", None)
            return found if isinstance(found, str) else None
    return None


_TAKES_EXECUTION: dict[type[ScratchService], bool] = {}


def _takes_execution(kind: type[ScratchService]) -> bool:
    """Does this service's ``bank_at_teardown`` take the execution it banks (A18)? (Asked
    once per class: a signature costs more than the explorer's own step.)"""
    known = _TAKES_EXECUTION.get(kind)
    if known is None:
        known = _TAKES_EXECUTION[kind] = "execution" in inspect.signature(kind.bank_at_teardown).parameters
    return known


@functools.lru_cache(maxsize=4096)
def _timeless(record: Record) -> str:
    """A record as the end-of-schedule memo compares it: its wire form but for its time."""
    return json.dumps({k: v for k, v in encode(record).items() if k != "at"}, sort_keys=True)


def tear_down(mine: ScratchService, run_id: str, sandbox: Any, execution: Callable[[], str | None]) -> Any:
    """``bank_at_teardown`` of a sandbox; told which execution it banks (A18) where the
    service takes it (``execution`` is asked only then)."""
    extra: dict[str, Any] = {}
    if _takes_execution(type(mine)):
        named = execution()
        extra = {} if named is None else {"execution": named}
    return mine.bank_at_teardown(run_id, sandbox, run_finished=False, **extra)


def _resumed(world: World, *, parked: bool) -> tuple[Record, ...]:
    """The ``resumed`` (``parked``) preset's records, made by the real use cases on a run
    of its own (``world.template_run``)."""
    run_id = world.template_run + ("p" if parked else "")
    clock = ManualClock()
    world.timeline.append(run_id, [RunStarted(at=clock.now(), execution="e1"), node("a")])
    real = service(world.timeline, world.store, clock, world.lock)
    tear_down(real, run_id, FakeSandbox({"a": b"a", MARK: b"e1"}), lambda: "e1")
    newer = FakeSandbox()
    outcome = real.resume(run_id, target=Target(sandbox=newer), attempt="setup")
    if not outcome.proceeds or outcome.claim is None or newer.files != {"a": b"a", MARK: b"e1"}:
        raise RuntimeError(f"the resumed preset could not be made: {outcome}")
    world.timeline.append(run_id, [node("b")], expected=outcome.claim.position)
    if parked:
        newer.files = {"a": b"a", "b": b"b", MARK: b"setup"}
        report = tear_down(real, run_id, newer, lambda: execution_of(world.timeline.read(run_id), "setup"))
        if not report.recorded:
            raise RuntimeError(f"the parked preset could not be made: {report}")
    real.let_go()  # the template's own lock
    return tuple(world.timeline.read(run_id))


def _actor(world: World, story: Story, schedule: Schedule, name: str) -> Callable[[], Any]:
    """The body of actor ``name`` with its own proxies and clock."""
    clock = ManualClock()
    timeline = schedule.proxy(name, timeline_port(), world.wrap_timeline(world.timeline))
    store = schedule.proxy(name, store_port(), world.store)
    lock = None if world.lock is None else schedule.proxy(name, lock_port(), world.wrap_lock(world.lock))
    mine = service(timeline, store, clock, lock)
    story.services[name] = mine
    if name in story.handed and lock is not None:
        hand(mine, story.handed[name])
    schedule_actor = schedule.actor
    run = story.run_id
    if name in ("old", "new"):
        story.owner[name] = name
        sandbox = schedule.proxy(name, sandbox_port(name), story.sandboxes[name])

        def teardown() -> Any:
            report = tear_down(mine, run, sandbox, lambda: story.executions.get(name))
            story.torn_down.add(name)
            return report

        schedule_actor(name, teardown, clock=clock)
    elif name in RESUMES:
        own = FakeSandbox()
        label = f"{name}-sb"
        story.sandboxes[label] = own
        story.owner[label] = name
        request = ResumeRequest(Consents(accept_scratch_loss=name.endswith("!")))
        story.requests[name] = request
        target = Target(sandbox=schedule.proxy(name, sandbox_port(label), own))

        def resume() -> ResumeOutcome:
            outcome = mine.resume(run, request, target, attempt=name)
            if outcome.proceeds:  # its execution starts: the scratch is now its own
                story.restored[name] = dict(own.files or {})
                own.files = {**(own.files or {}), MARK: name.encode()}
                _starts(story, name)
            return outcome

        def execution() -> ResumeOutcome:
            outcome = resume()
            if not outcome.proceeds or outcome.claim is None:
                return outcome
            own.files = {**(own.files or {}), f"{name}-node": b"x"}
            timeline.append(run, [node(f"{name}-node")], expected=outcome.claim.position)
            tear_down(mine, run, target.sandbox, lambda: execution_of(world.timeline.read(run), name))
            story.torn_down.add(label)
            story.running.discard(name)
            return outcome

        schedule_actor(name, execution if name == "exec" else resume, clock=clock)
    elif name == "delete":
        schedule_actor(name, lambda: mine.delete_run(run), clock=clock)  # T3 under the lock (A16)
    elif name == "sweep":
        from scratchbank.adapters.inprocess import InProcessQueue
        from scratchbank.application.orphans import sweep_orphans

        queue = InProcessQueue()
        schedule_actor(
            name, lambda: sweep_orphans([run], timeline=timeline, queue=queue, cutoff=0.0, clock=clock)
        )
    elif name == DELIVER:
        schedule_actor(name, _delivery(world, story, schedule, name, timeline, store, clock), clock=clock)
    elif name == "outbox":
        schedule_actor(name, _outbox(world, story, schedule, name, timeline, clock), clock=clock)
    else:
        raise ValueError(f"no actor {name!r}")
    return lambda: None


def _starts(story: Story, name: str) -> None:
    """Execution ``name`` starts: none other may be running (A16)."""
    if story.running - {name}:
        story.overlaps.append(f"{name} started while {', '.join(sorted(story.running))} ran")
    story.running.add(name)


def lease_port(resource: str = "lock") -> Port:
    """The runner's lease (the run's lock in a runner's world: ADR 0007): QueueUnavailable."""

    def error(method: str, why: str) -> Exception:
        return QueueUnavailable(f"explorer: lease.{method}: {why}")

    return Port("lease", resource, reads_by_name, error, own_thread_only=True)


def queue_port(resource: str = "queue") -> Port:
    def error(method: str, why: str) -> Exception:
        return QueueUnavailable(f"explorer: queue.{method}: {why}")

    return Port("queue", resource, reads_by_name, error)


class _Inbound:
    """A delivery as the runner sees it (acks and naks kept for the model)."""

    def __init__(self, delivery: ResumeDelivery, deliveries: int) -> None:
        self.delivery, self.deliveries = delivery, deliveries
        self.acked = False
        self.naks: list[float] = []

    def ack(self) -> None:
        self.acked = True

    def nak(self, delay: float) -> None:
        self.naks.append(delay)

    def in_progress(self) -> None:
        return None


def _delivery(
    world: World, story: Story, schedule: Schedule, name: str, timeline: Any, store: Any, clock: ManualClock
) -> Callable[[], Any]:
    """A runner handling the run's delivery (issue 19), redelivered once at once when it
    asks to be: a sandbox of its own, the resume (restore) through the fenced timeline,
    an engine that finishes node ``deliver-node`` in it, the teardown's bank."""
    from scratchbank.application.runner import Handled, Runner, RunnerSettings

    if world.lease is None:
        raise ValueError("the delivery actor needs a runner's world (filesystem_world(runner=True))")
    label = f"{name}-sb"
    own = FakeSandbox()
    story.sandboxes[label] = own
    story.owner[label] = name
    story.requests[name] = ResumeRequest(story.queued)
    sandbox = schedule.proxy(name, sandbox_port(label), own)
    run = story.run_id

    class Provider:
        def start(self, run_id: str, attempt: str | None = None) -> Any:
            return sandbox

        def stop(self, _sandbox: Any) -> None:
            story.torn_down.add(label)

        def orphans(self, run_id: str) -> list[Any]:
            return []

    class Engine:
        def continue_run(self, run_id: str, *, sandbox: Any, timeline: Any, cancel: Any) -> Any:
            from scratchbank.application.ports import EngineEnd

            story.restored[name] = dict(own.files or {})
            _starts(story, name)
            own.files = {**(own.files or {}), MARK: name.encode(), f"{name}-node": b"x"}
            timeline.append(run_id, [node(f"{name}-node")], expected=len(timeline.read(run_id)))
            return EngineEnd.PARKED

    lease = schedule.proxy(name, lease_port(), world.lease)
    runner = Runner(
        story.queue,
        lease,
        timeline,
        store,
        Provider(),
        Engine(),
        RunnerSettings(f"runner-{name}"),
        None,
        clock,
    )

    def deliver() -> Any:
        delivery = ResumeDelivery(run, DELIVER, story.queued)
        handling = runner.handle(_Inbound(delivery, 1))
        if handling.handled is Handled.REDELIVER:  # the queue's redelivery, at once
            handling = runner.handle(_Inbound(delivery, 2))
        story.running.discard(name)
        return handling

    return deliver


def _outbox(
    world: World, story: Story, schedule: Schedule, name: str, timeline: Any, clock: ManualClock
) -> Callable[[], Any]:
    """One sweep of the outbox (issue 19) under the sweeper's lease, over this run."""
    from scratchbank.application.orphans import Sweeper

    if world.lease is None or story.queue is None:
        raise ValueError("the outbox actor needs a runner's world and a queued preset")
    run = story.run_id

    class Listing:
        def queued_unclaimed(self, before: Any) -> list[str]:
            return [run]

    lease = schedule.proxy(name, lease_port(), world.lease)
    queue = schedule.proxy(name, queue_port(), story.queue)
    return Sweeper(lease, Listing(), timeline, queue, "sweeper", cutoff=0.0, clock=clock).sweep_once


# -- the model ---------------------------------------------------------------------------


def counted_nodes(records: Sequence[Record]) -> list[tuple[int, str]]:
    """(position, node) of every finish that writes the scratch (R2-R5)."""
    return [
        (i, r.node)
        for i, r in enumerate(records)
        if isinstance(r, NodeFinished) and counts_as_write(r, NO_WORKFLOW)
    ]


def _loss_named_after(records: Sequence[Record], position: int) -> bool:
    """A record after ``position`` names the scratch's loss (an unknown or unbanked
    teardown, R1/R14/A13; an accepted loss, R7/R13/A3)."""
    for r in records[position + 1 :]:
        if isinstance(r, ScratchBanked) and not (r.banked or r.empty or r.finished):
            return True
        if isinstance(r, ScratchForsaken) or (isinstance(r, ScratchRestored) and r.accepted):
            return True
    return False


@attrs.frozen
class Seen:
    """One resume's claim and what its sandbox ended with."""

    actor: str
    outcome: ResumeOutcome | None  # None: a runner's delivery (what it did read from its records)
    files: dict[str, bytes]
    claim: int  # the position of its run_resumed
    consented: bool
    #: a delivery's restore, from the ``scratch_restored`` after its claim
    delivered_restored: bool = False

    def went(self) -> tuple[bool, bool, str]:
        """(restored a bank, went on without one, the rule it named)."""
        if self.outcome is None:
            return self.delivered_restored, not self.delivered_restored, "the runner's resume"
        decision, restore = self.outcome.decision, self.outcome.restore
        restored = decision.verdict is Verdict.RESTORE and restore is not None and restore.record.restored
        return restored, decision.verdict is Verdict.GO_ON_WITHOUT, decision.rule


def _started_at(records: Sequence[Record], execution: str) -> int:
    """Where the execution that wrote a scratch started (-1: unknown, every node counts)."""
    if execution == "e1":
        return next((i for i, r in enumerate(records) if isinstance(r, RunStarted)), -1)
    return next(
        (i for i, r in enumerate(records) if isinstance(r, RunResumed) and r.attempt == execution), -1
    )


def _claim_of(records: Sequence[Record], actor: str) -> list[int]:
    return [i for i, r in enumerate(records) if isinstance(r, RunResumed) and r.attempt == actor]


def check_resume(seen: Seen, records: Sequence[Record], lost: Callable[[str], bool]) -> list[Violation]:
    """R2 and A16/R10 for one resume that went on (module docstring)."""
    have = set(seen.files)
    missing = [(i, n) for i, n in counted_nodes(records[: seen.claim]) if n not in have]
    if not missing or seen.consented:
        return []
    restored, without, rule = seen.went()
    if restored:
        # Nodes recorded before the restored scratch's own execution started were judged
        # at that execution's resume; a node recorded after it is what R2 forbids reverting.
        began = _started_at(records, seen.files.get(MARK, b"").decode())
        missing = [(i, n) for i, n in missing if i > began]
        names = ", ".join(f"{n} (#{i + 1})" for i, n in missing)
        return (
            []
            if not missing
            else [
                Violation(
                    "R2",
                    "a resume restored a scratch older than a node recorded finished in a sandbox after it",
                    f"{seen.actor} restored {sorted(have)}; lacks {names}",
                )
            ]
        )
    if without:
        unexcused = [(i, n) for i, n in missing if not (_loss_named_after(records, i) or lost(n))]
        if unexcused:
            return [
                Violation(
                    "A16/R10",
                    "a resume went on without a scratch nobody recorded as lost (silent loss)",
                    f"{seen.actor} went on without {', '.join(n for _, n in unexcused)} ({rule})",
                )
            ]
    return []


def check_consents(records: Sequence[Record], requests: dict[str, ResumeRequest]) -> list[Violation]:
    """C3-C5: each claim carries its own call's consents (a delivery's first, its
    redeliveries none: C4); an accepted loss only under one."""
    found: list[Violation] = []
    consenting = False
    claimed: set[str] = set()
    for i, r in enumerate(records):
        if isinstance(r, RunResumed | RunStarted):
            request = requests.get(r.attempt or "") if isinstance(r, RunResumed) else None
            if isinstance(r, RunResumed) and r.attempt in claimed and r.attempt == DELIVER:
                request = ResumeRequest()  # C4: a redelivery of a claimed attempt lends no consent
            if isinstance(r, RunResumed) and r.attempt:
                claimed.add(r.attempt)
            consenting = isinstance(r, RunResumed) and r.accept_scratch_loss
            if isinstance(r, RunResumed) and request is not None:
                asked = request.consents
                if (r.accept_scratch_loss, r.force) != (asked.accept_scratch_loss, asked.force):
                    found.append(
                        Violation("C3-C5", "a claim carries consents its call did not give", f"#{i + 1}")
                    )
        accepted = isinstance(r, ScratchForsaken) or (isinstance(r, ScratchRestored) and r.accepted)
        if accepted and not consenting:
            found.append(
                Violation("C3-C5", "a loss was accepted under a claim without that consent", f"#{i + 1}")
            )
    return found


def _ran_sweep(trace: Trace) -> bool:
    return any(
        s.actor == "delete" and s.call.endswith(".sweep") and s.fault in (Fault.NONE, Fault.LOST)
        for s in trace
    )


def _leftovers(world: World, run_id: str) -> list[str]:
    if world.store_root is None:
        return ["stored bank"] if world.store.stat(run_id) is not None else []
    folder = world.store_root / "runs" / run_id
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def check(world: World, story: Story, ran: Ran) -> list[Violation]:
    """Every invariant of the model on one schedule's end (module docstring)."""
    found: list[Violation] = []
    collect_held(story)
    if ran.hang:
        found.append(Violation("deadline", "an actor hung past its deadline", ran.hang))
    for end in ran.ends.values():
        if end.error is not None and not isinstance(end.error, ScratchbankError):
            found.append(
                Violation("named-errors", "an actor ended by an unnamed error", f"{end.name}: {end.error!r}")
            )
    dead = {name for name, end in ran.ends.items() if end.dead}
    records = tuple(world.timeline.read(story.run_id))
    seen = _resumes_seen(story, ran, records, found)
    if len([s for s in seen if s.outcome is not None and s.outcome.proceeds]) > 1:
        who = ", ".join(s.actor for s in seen if s.outcome is not None and s.outcome.proceeds)
        found.append(Violation("A16", "two executions ran the run at once", who))
    for overlap in story.overlaps:
        found.append(Violation("A16", "an execution started while another ran", overlap))
    seen += _deliveries_seen(story, ran, records, found)
    found += _check_outbox(world, story, ran)
    records = tuple(world.timeline.read(story.run_id))
    if _ran_sweep(ran.trace):
        left = _leftovers(world, story.run_id)
        if left:
            found.append(Violation("T3", "a deleted run holds objects in the store", ", ".join(left)))
        return found
    key = _fingerprint(world, story, seen, dead, records)
    if key is None:
        return found + _check_end(world, story, seen, dead)
    known = world.checked.get(key)
    if known is None:
        known = world.checked[key] = _check_end(world, story, seen, dead)
    return found + known


def _check_end(world: World, story: Story, seen: Sequence[Seen], dead: set[str]) -> list[Violation]:
    """The invariants that tear down, read the store and resume once more."""
    found: list[Violation] = []
    _tear_down_live(world, story, seen, dead)
    records = tuple(world.timeline.read(story.run_id))
    lost = _lost(story, dead)
    for s in seen:
        found += check_resume(s, records, lost)
    found += check_consents(records, story.requests)
    found += _check_store(world, story.run_id)
    found += _final_resume(world, story, lost)
    return found


def _fingerprint(
    world: World, story: Story, seen: Sequence[Seen], dead: set[str], records: Sequence[Record]
) -> str | None:
    """Everything ``_check_end`` reads, as a value: two schedules that end in equal
    fingerprints end in the same verdicts (the timeline's records but for their times,
    the run's objects in the store by content, every sandbox's files, who is dead, what
    each resume saw). None (never memoised) without a filesystem store to read. With a
    lock: its holder and token, and the grants the actors still held (the teardowns of
    the live ones let them go, the dead ones' lapse)."""
    if world.store_root is None:
        return None
    locked: tuple[Any, ...] = ()
    if world.lock is not None:
        holder = world.lock.holder(story.run_id)
        locked = (
            None if holder is None else (holder.holder, holder.token),
            tuple(sorted((actor, e, g.token) for actor, (e, g) in story.held.items())),
        )
    timeless = tuple(_timeless(r) for r in records)
    folder = world.store_root / "runs" / story.run_id
    stored = tuple(
        (
            str(p.relative_to(folder)),
            # a stamp as written (it names its run and execution: renamed below), else a digest
            p.read_text(errors="replace")
            if p.name.endswith(".stamp")
            else hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    )
    sandboxes = tuple(
        (
            label,
            tuple(sorted((sb.files or {}).items())),
            story.owner.get(label) in dead,
            label in story.torn_down,
        )
        for label, sb in sorted(story.sandboxes.items())
    )
    resumes = tuple(
        (
            s.actor,
            None if s.outcome is None else s.outcome.decision.verdict,
            None if s.outcome is None else s.outcome.restore,
            tuple(sorted(s.files.items())),
            s.claim,
            s.consented,
            s.delivered_restored,
        )
        for s in seen
    )
    requests = tuple(sorted((name, r.consents) for name, r in story.requests.items()))
    return anonymous(repr((timeless, stored, sandboxes, resumes, requests, locked)), story.run_id)


#: The ids the product draws at random (``new_execution``, ``new_attempt``): names, never values.
_DRAWN_IDS = re.compile(r"\b(?:x|op)-[0-9a-f]{16}\b")


def anonymous(text: str, run_id: str) -> str:
    """``text`` with the schedule's run id read as one placeholder (every schedule runs on a
    run of its own: an object's stamp names its run; the template's stays apart) and each
    randomly drawn execution or attempt id renamed by its first appearance (``<1>``, ...):
    the verdicts depend on which ids are equal, never on their values, so two ends equal up
    to such a renaming are checked once."""
    text = re.sub(rf"(?<![\w-]){re.escape(run_id)}(?![\w-])", "<run>", text)
    names: dict[str, str] = {}
    return _DRAWN_IDS.sub(lambda m: names.setdefault(m.group(0), f"<{len(names) + 1}>"), text)


def _resumes_seen(story: Story, ran: Ran, records: Sequence[Record], found: list[Violation]) -> list[Seen]:
    seen: list[Seen] = []
    for name in RESUMES:
        end = ran.ends.get(name)
        if end is None:
            continue
        claims = _claim_of(records, name)
        outcome = end.result if isinstance(end.result, ResumeOutcome) else None
        if len(claims) > 1:
            found.append(
                Violation("C7", "one resume claimed the run twice", f"{name}: {len(claims)} run_resumed")
            )
        if outcome is None or not outcome.proceeds:
            continue
        if not claims:
            found.append(Violation("C7", "an execution runs without its claim", name))
            continue
        files = story.restored.get(name, {})
        consented = story.requests[name].consents.accept_scratch_loss
        seen.append(Seen(name, outcome, files, claims[0], consented))
    return seen


def _deliveries_seen(story: Story, ran: Ran, records: Sequence[Record], found: list[Violation]) -> list[Seen]:
    """A delivery whose engine ran: it ran under its claim (its ``run_resumed``), from
    the scratch its resume restored (or without one)."""
    if DELIVER not in ran.ends or DELIVER not in story.restored:
        return []
    claims = _claim_of(records, DELIVER)
    if not claims:
        found.append(Violation("C7", "an execution runs without its claim", DELIVER))
        return []
    restored = any(isinstance(r, ScratchRestored) and r.restored for r in records[claims[0] :])
    consented = story.queued.accept_scratch_loss
    return [Seen(DELIVER, None, story.restored[DELIVER], claims[0], consented, restored)]


def _left_queued(story: Story, records: Sequence[Record]) -> str | None:
    """The queued attempt nobody claimed, published or parked (None: none is left)."""
    state = fold(records)
    queued = state.queued_attempt
    if queued is None or state.claimed_attempt == queued.attempt:
        return None
    if any(isinstance(r, RunResumed) and r.attempt == queued.attempt for r in records):
        return None
    if any(isinstance(r, OrphanSwept) and r.attempt == queued.attempt and r.parked for r in records):
        return None
    if story.queue is not None and story.queue.pending() > 0:
        return None
    return queued.attempt


def _check_outbox(world: World, story: Story, ran: Ran) -> list[Violation]:
    """L4 (issue 19): no run left queued for ever once the sweeper runs. A sweep the
    schedule cut short (a fault, its lease lost, its death) leaves the run to the next
    sweep: that one runs alone here, once the dead holders' leases lapsed, and the run
    is then claimed, its delivery on the queue, or parked."""
    if "outbox" not in ran.ends or world.lease is None:
        return []
    if _left_queued(story, world.timeline.read(story.run_id)) is None:
        return []
    from scratchbank.application.orphans import Sweeper

    run = story.run_id

    class Listing:
        def queued_unclaimed(self, before: Any) -> list[str]:
            return [run]

    world.clock.advance(LOCK_TTL + 1)
    report = Sweeper(
        world.lease, Listing(), world.timeline, story.queue, "final-sweep", cutoff=0.0, clock=ManualClock()
    ).sweep_once()
    left = _left_queued(story, world.timeline.read(run))
    if left is None:
        return []
    return [Violation("L4", "a run left queued for ever after the sweeper ran", f"attempt {left}: {report}")]


def _tear_down_live(world: World, story: Story, seen: Sequence[Seen], dead: set[str]) -> None:
    """An execution still live at the end is torn down alone (its sandbox stops)."""
    records = tuple(world.timeline.read(story.run_id))
    for s in seen:
        label = f"{s.actor}-sb"
        if label in story.torn_down or s.actor in dead:
            continue
        mine = service(world.timeline, world.store, lock=world.lock)
        kept = story.held.get(s.actor)
        if kept is not None and world.lock is not None:
            hand(mine, kept[1])
        tear_down(mine, story.run_id, story.sandboxes[label], lambda s=s: execution_of(records, s.actor))  # type: ignore[misc]
        story.torn_down.add(label)


def _lost(story: Story, dead: set[str]) -> Callable[[str], bool]:
    """Is every sandbox holding node ``n`` lost with its dead actor?"""

    def lost(n: str) -> bool:
        holders = [label for label, sb in story.sandboxes.items() if n in (sb.files or {})]
        return all(story.owner.get(label) in dead for label in holders)

    return lost


def _check_store(world: World, run_id: str) -> list[Violation]:
    """A17/T3: the bank the timeline names is in the store as recorded."""
    report = service(world.timeline, world.store, lock=world.lock).status(run_id)
    if report.store.verdict in ("no bank", "matches"):
        return []
    verdict = report.store.verdict
    return [
        Violation(
            "A17", f"the store does not hold the recorded bank as recorded ({verdict})", report.store.detail
        )
    ]


def _final_resume(world: World, story: Story, lost: Callable[[str], bool]) -> list[Violation]:
    """The next resume, alone: restores the latest recorded bank or refuses by name (R2).
    A dead actor's lease lapses first (the lock's clock moves past it)."""
    world.clock.advance(LOCK_TTL + 1)
    sandbox = FakeSandbox()
    final = service(world.timeline, world.store, lock=world.lock)
    try:
        outcome = final.resume(story.run_id, target=Target(sandbox=sandbox), attempt="final")
    except ScratchbankError:
        return []  # refused by name
    finally:
        final.let_go()  # its execution ends here: no grant (nor its refresh thread) outlives the check
    if not outcome.proceeds:
        return []
    records = tuple(world.timeline.read(story.run_id))
    claims = _claim_of(records, "final")
    if not claims:
        return [Violation("C7", "an execution runs without its claim", "final")]
    return check_resume(Seen("final", outcome, dict(sandbox.files or {}), claims[0], False), records, lost)


# -- running ---------------------------------------------------------------------------


@attrs.frozen
class Scenario:
    preset: str
    actors: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.preset}: {' + '.join(self.actors)}"


def run_one(world: World, scenario: Scenario, chooser: Chooser) -> tuple[Trace, list[Violation]]:
    """One schedule of ``scenario`` on a fresh run, checked."""
    story = preset(world, scenario.preset)
    schedule = Schedule(chooser)
    for name in scenario.actors:
        _actor(world, story, schedule, name)
    ran = schedule.run()
    return ran.trace, check(world, story, ran)


def explore_scenario(
    world: World, scenario: Scenario, bounds: Bounds = Bounds(), limit: int = 1_000_000
) -> Exploration:
    """Every schedule of a scenario (bounded, reduced: see the explorer's docstring)."""
    return explore_all(
        scenario.name, lambda c: run_one(world, scenario, c), bounds, len(scenario.actors), limit=limit
    )


def sample_scenarios(
    world: World,
    scenarios: Sequence[Scenario],
    *,
    schedules: int,
    seed: int,
    bounds: Bounds = Bounds(max_faults=2),
) -> Exploration:
    """``schedules`` distinct random schedules, shared out over ``scenarios`` (seeded)."""
    total = Exploration("random", bounds.depth, max(len(s.actors) for s in scenarios))
    share = -(-schedules // len(scenarios))
    for i, scenario in enumerate(scenarios):
        part = explore_random(
            scenario.name,
            lambda c, s=scenario: run_one(world, s, c),  # type: ignore[misc]
            bounds,
            len(scenario.actors),
            schedules=share,
            seed=seed + i,
        )
        total.schedules += part.schedules
        total.draws += part.draws
        total.violations += part.violations
        total.seconds += part.seconds
        for kind, found in part.found.items():
            total.found.setdefault(kind, found)
    return total


def _sample_worker(
    root: str, url: str | None, scenarios: Sequence[Scenario], share: int, seed: int, memory: bool = False
) -> Exploration:
    """One process's share of a parallel sample (its own world under ``root``)."""
    with filesystem_world(Path(root), url, memory=memory) as world:
        found = sample_scenarios(world, scenarios, schedules=share * len(scenarios), seed=seed)
    found.traces = set()
    return found


def sample_in_parallel(
    root: Path,
    scenarios: Sequence[Scenario],
    *,
    schedules: int,
    seed: int,
    workers: int = 2,
    timeline_url: Callable[[int], str | None] = lambda _worker: None,
    memory: bool = False,
) -> Exploration:
    """``sample_scenarios`` shared out over ``workers`` processes, each with whole
    scenarios of its own (so traces stay distinct), each in a world of its own."""
    import concurrent.futures
    import multiprocessing

    share = -(-schedules // len(scenarios))
    parts = [list(scenarios[w::workers]) for w in range(workers)]
    context = multiprocessing.get_context("forkserver")  # forked from a server with this module
    context.set_forkserver_preload([__name__])
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [
            pool.submit(
                _sample_worker, str(root / f"w{w}"), timeline_url(w), part, share, seed + 100 * w, memory
            )
            for w, part in enumerate(parts)
            if part
        ]
        results = [f.result() for f in futures]
    total = Exploration("random", results[0].depth, max(len(s.actors) for s in scenarios))
    for part in results:
        total.schedules += part.schedules
        total.violations += part.violations
        total.seconds = max(total.seconds, part.seconds)
        for kind, found in part.found.items():
            total.found.setdefault(kind, found)
    return total


@contextlib.contextmanager
def filesystem_world(
    root: Path, timeline_url: str | None = None, *, memory: bool = False, runner: bool = False
) -> Iterator[World]:
    """A world over an SQLite timeline file (or ``timeline_url``) and a filesystem store.

    ``runner``: the run's lock is a runner's lease (``InProcessLease`` on the world's
    clock, handed to every service as ``HandedLock``: ADR 0007), for the runner's actors.
    ``memory``: the timeline and the run's lock in this process's memory (the same
    fences: an append at a stale position and a held lock are refused), the store still
    real files: about half the cost of a schedule (no SQLite connection, no watchdog
    thread per call), for the large random samples; the exhaustive searches, the
    PostgreSQL one and the killed processes keep the SQL adapters."""
    from scratchbank.adapters.event_store import EventStoreTimeline
    from scratchbank.adapters.fs_bank import FilesystemBankStore
    from scratchbank.adapters.memory import InMemoryTimeline
    from scratchbank.adapters.run_lock import SqliteRunLock
    from scratchbank.application.run_lock import MemoryRunLock

    root.mkdir(parents=True, exist_ok=True)
    timeline: Any = (
        InMemoryTimeline() if memory else EventStoreTimeline(timeline_url or f"sqlite:///{root}/timeline.db")
    )
    clock = ManualClock()
    try:
        lock: Any = MemoryRunLock(clock=clock) if memory else SqliteRunLock(root / LOCKS, clock=clock)
        lease: Any = None
        if runner:  # the runner's lease is the run's lock (ADR 0007): every actor's service takes it
            from scratchbank.adapters.inprocess import InProcessLease
            from scratchbank.application.run_lock import HandedLock

            lease = InProcessLease(lapse=LOCK_TTL, clock=clock)
            lock = HandedLock(lease, lapse=LOCK_TTL, clock=clock)
        banks = root / "banks"
        yield World(timeline, FilesystemBankStore(banks), banks, lock=lock, clock=clock, lease=lease)
    finally:
        if not memory:
            timeline.close()
        shutil.rmtree(root / "banks", ignore_errors=True)


# -- real processes killed at each pause point ---------------------------------------------


def _killable(
    url: str, store_root: str, run_id: str, preset_name: str, victim: str, elapsed: float, conn: Any
) -> None:
    """A child process: the victim actor alone, asking its parent before every port call
    (the run's lock on the parent's SQLite file, its clock where the parent's stands)."""
    from scratchbank.adapters.event_store import EventStoreTimeline
    from scratchbank.adapters.fs_bank import FilesystemBankStore
    from scratchbank.adapters.run_lock import SqliteRunLock

    from .explorer import Pending

    timeline = EventStoreTimeline(url)
    clock = ManualClock()
    clock.advance(elapsed)
    lock = SqliteRunLock(Path(store_root).parent / LOCKS, clock=clock)
    world = World(timeline, FilesystemBankStore(store_root), Path(store_root), lock=lock, clock=clock)
    story = Story(run_id)
    story.sandboxes["old"] = FakeSandbox({"a": b"a", MARK: b"e1"})
    story.executions["old"] = "e1"
    if preset_name in ("resumed", "parked"):
        story.sandboxes["new"] = FakeSandbox({"a": b"a", "b": b"b", MARK: b"setup"})
        story.executions["new"] = execution_of(timeline.read(run_id), "setup")
    held = lock.holder(run_id)
    if held is not None and held.live and held.holder == story.executions.get(victim):
        story.handed[victim] = LockGrant(run_id, held.holder, held.token, held.since, held.expires)

    def ask(paused: Sequence[Pending]) -> tuple[str, Fault]:
        conn.send(str(paused[0].call))
        conn.recv()
        return paused[0].actor, Fault.NONE

    schedule = Schedule(ask)
    _actor(world, story, schedule, victim)
    schedule.run()
    conn.send("")


def explore_kills(world: World, timeline_url: str, scenario: Scenario, victim: str) -> Exploration:
    """The victim actor runs in a real process, SIGKILLed at its first, second, ...
    pause point (and once not at all); the other actors then run, and the schedule is
    checked with the victim dead (its sandbox lost)."""
    import multiprocessing
    import os
    import signal
    import time

    from .explorer import ActorEnd, Step, replay

    found = Exploration(f"killed: {scenario.name} ({victim})", 0, len(scenario.actors))
    # A fork server that imported this module once forks each victim: a real process of its
    # own, SIGKILLed as before, without a fresh interpreter's imports per pause point.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    started = time.monotonic()
    for point in itertools.count():
        story = preset(world, scenario.preset)
        _actor(world, story, Schedule(replay(())), victim)  # its sandbox and owner, never run
        mine, theirs = context.Pipe()
        child = context.Process(
            target=_killable,
            args=(
                timeline_url,
                str(world.store_root),
                story.run_id,
                scenario.preset,
                victim,
                world.clock.elapsed,
                theirs,
            ),
        )
        child.start()
        steps: list[Step] = []
        killed = False
        while mine.poll(60):
            call = mine.recv()
            if not call:
                break
            if len(steps) == point:
                os.kill(child.pid or 0, signal.SIGKILL)
                killed = True
                steps.append(Step(victim, call, Fault.DIE))
                break
            steps.append(Step(victim, call, Fault.NONE))
            mine.send("go")
        child.join(60)
        found.depth = max(found.depth, len(steps))
        others = Schedule(replay(()))
        for name in scenario.actors:
            if name != victim:
                _actor(world, story, others, name)
        ran = others.run()
        ends = {**ran.ends, victim: ActorEnd(victim, None, None, killed, len(steps))}
        trace = (*steps, *ran.trace)
        found.add(trace, check(world, story, Ran(trace, ends, ran.hang)))
        if not killed:
            break
    found.seconds = time.monotonic() - started
    return found
