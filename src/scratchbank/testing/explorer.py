"""An interleaving explorer: a deterministic scheduler over real use cases (issue 18, item 5).

Actors are callables, each run in a thread of its own (pooled: kept across schedules); exactly
one runs at a time, handing over directly (``Schedule``). Every
call an actor makes on a port (any public method of any port object it was handed
through ``Schedule.proxy``: timeline read/append, store put/fetch/stat/delete/sweep,
sandbox exec-level calls, lock calls) is a *pause point*: the actor stops there and the
scheduler picks who goes next, and with what fault:

- ``raise``: the call does not happen; the port's own named retryable error is raised
  (TimelineUnreadable / TimelineWriteFailed, BankReadFailed / BankWriteFailed,
  ExecFailed, ...).
- ``stall``: the call does not happen and takes past its deadline: the actor's own
  ManualClock is advanced by ``STALL_SECONDS`` (no real waiting), then the same error.
- ``die``: the actor dies for good at that point: its thread is never continued, holding
  whatever it held. (When the schedule ends the thread is released with ``ActorDied``,
  a BaseException, and every port call it would still make raises ``ActorDied`` before
  touching the port: nothing it does after its death reaches shared state.)
- ``lost``: the call takes effect, then its reply is lost (the same error is raised
  after the commit). Offered for calls that write.

A schedule is identified by its trace: the sequence of (actor, call, fault).

Search
------
``explore_all`` enumerates the interleavings of a fixed set of actors depth-first, by
stateless replay (each schedule re-runs from a fresh world). The space is bounded by:

- depth: the first ``depth`` pause points of each actor are interleaved; an actor past
  its ``depth``-th call runs on alone once no actor within its depth can move (no more
  branching, no more faults);
- faults: at most ``max_faults`` faults per schedule; ``die``/``stall``/``lost`` only at
  calls on shared ports (a private port's call, e.g. an actor's own sandbox, is offered
  ``raise`` only: dying there is the same, for every other actor, as dying at its next
  shared call, since nothing else ever reads that port);
- a partial-order reduction with *sleep sets* (Godefroid 1996). Two steps of different
  actors are independent when they touch different resources, or both only read the
  same one; a step whose fault keeps the call from happening (raise, stall, die) touches
  nothing shared. Independent steps commute: running them in either order reaches the
  same shared state (timeline, store, other actors' states), because what an actor does
  between two of its pause points touches only its own memory and its own temporary
  files. Sleep sets then explore exactly one schedule of every equivalence class of
  complete schedules (Mazurkiewicz trace) of the bounded space, and prune a prefix as
  soon as every step enabled there has already been covered in an equivalent order
  (counted as ``pruned``, never checked). Calls of unknown methods count as writes
  (conservative: more schedules, never fewer).

``explore_random`` draws schedules at random from a seeded generator (reproducible),
counting distinct traces, until it has as many as asked (or runs out of draws).

Each complete schedule is then checked by the caller's ``check`` (the invariants live
with the scenarios: ``scratchbank.testing.interleavings``).
"""

from __future__ import annotations

import contextvars
import enum
import functools
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from scratchbank.domain import errors as named

#: How far a stalled call moves its actor's clock: past every per-call deadline and the
#: record budget (30 s) of the use cases.
STALL_SECONDS = 31.0
#: Real seconds the scheduler waits for the granted actor to reach its next pause point
#: (it never waits on a test clock): past it the schedule is reported as a hang.
HANG_SECONDS = 30.0


class Fault(enum.Enum):
    NONE = "-"
    RAISE = "raise"
    STALL = "stall"
    DIE = "die"
    LOST = "lost"


#: Faults that keep the call from happening: such a step touches nothing shared.
NO_EFFECT = frozenset({Fault.RAISE, Fault.STALL, Fault.DIE})


class ActorDied(BaseException):
    """Raised in a dead actor's thread when the schedule ends, and at any port call it
    would still make: nothing it does after its death reaches a port."""


class Nondeterministic(Exception):
    """A replayed prefix did not reach the same pause points: the actors or the world
    they run in are not deterministic (a bug of the scenario, never a schedule)."""


class Pruned(Exception):
    """A schedule the search abandoned (sleep-set blocked): it is never checked."""


@attrs.frozen
class Port:
    """How the explorer sees one port object: a label, the resource it touches, which
    methods only read, its own retryable error, and calls that never pause.

    ``private``: no other actor ever calls it (an actor's own sandbox).
    ``passthrough``: calls run without a pause point (a call that blocks on another
    thread of the same actor, e.g. a sandbox reading a pipe the store call feeds).
    """

    label: str
    resource: str
    reads: Callable[[str], bool]
    error: Callable[[str, str], Exception]
    private: bool = False
    passthrough: frozenset[str] = frozenset()
    #: a call from a thread that is not its actor's own (a grant's refresh thread) fails
    #: with the port's error, untouched and unscheduled (else: it pauses as the actor, as
    #: a restore's producer thread does while the actor waits on its pipe)
    own_thread_only: bool = False


_READ_NAMES = re.compile(r"^(read|load|fetch|stat|get|list|head|exists|holder|status|peek|who|objects)")


def reads_by_name(method: str) -> bool:
    """A method that only reads, by its name (anything else counts as a write)."""
    return bool(_READ_NAMES.match(method))


def timeline_port(resource: str = "timeline") -> Port:
    def error(method: str, why: str) -> Exception:
        kind = named.TimelineUnreadable if reads_by_name(method) else named.TimelineWriteFailed
        return kind(f"explorer: timeline.{method}: {why}")

    return Port("timeline", resource, reads_by_name, error)


def store_port(resource: str = "store") -> Port:
    def error(method: str, why: str) -> Exception:
        kind = named.BankReadFailed if reads_by_name(method) else named.BankWriteFailed
        return kind(f"explorer: store.{method}: {why}")

    return Port("store", resource, reads_by_name, error)


def sandbox_port(label: str) -> Port:
    def error(method: str, why: str) -> Exception:
        return named.ExecFailed(f"explorer: {label}.{method}: {why}")

    return Port(label, label, lambda _m: False, error, private=True, passthrough=frozenset({"stage_restore"}))


def lock_error_class() -> type[Exception]:
    """The lock port's own retryable error (LockUnavailable, once the lock lands)."""
    kind: type[Exception] = getattr(named, "LockUnavailable", named.ExecFailed)
    return kind


def lock_port(resource: str = "lock") -> Port:
    def error(method: str, why: str) -> Exception:
        return lock_error_class()(f"explorer: lock.{method}: {why}")

    return Port("lock", resource, reads_by_name, error, own_thread_only=True)


@attrs.frozen
class Call:
    """A call an actor is paused at."""

    port: str
    method: str
    resource: str
    writes: bool
    private: bool

    def __str__(self) -> str:
        return f"{self.port}.{self.method}"


@attrs.frozen
class Step:
    """One step of a schedule: who moved, at which call, with which fault."""

    actor: str
    call: str
    fault: Fault

    def __str__(self) -> str:
        return f"{self.actor}:{self.call}" + ("" if self.fault is Fault.NONE else f"!{self.fault.value}")


Trace = tuple[Step, ...]


def show(trace: Trace) -> str:
    """A trace as one line (the schedule's name in reports)."""
    return " > ".join(str(step) for step in trace)


@attrs.frozen
class Pending:
    """An actor paused at a call, and how many steps it has taken."""

    actor: str
    call: Call
    steps: int


#: Picks the next step among the paused actors: (actor, fault), or raises Pruned.
Chooser = Callable[[Sequence[Pending]], tuple[str, Fault]]


class _Actor:
    def __init__(self, name: str, body: Callable[[], Any]) -> None:
        self.name = name
        self.body = body
        #: held while the actor waits at a pause point; released once per grant (a baton of
        #: its own: a grant wakes this actor's thread and no other)
        self.baton = threading.Lock()
        self.baton.acquire()
        #: released once the actor's body has unwound (its thread is back in the pool)
        self.exited = threading.Lock()
        self.exited.acquire()
        self.started = False
        self.waiting = False
        self.ident: int | None = None
        self.pending: Call | None = None
        self.grant: Fault | None = None
        self.running = False
        self.done = False
        self.dead = False
        self.released = False
        self.steps = 0
        self.result: Any = None
        self.error: BaseException | None = None


#: The name of a pooled actor thread between schedules.
IDLE = "explorer-idle"


class _Worker:
    """A pooled thread that runs actor bodies, one at a time, each in a fresh context."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: Callable[[], None] | None = None
        self.thread = threading.Thread(target=self._loop, name=IDLE, daemon=True)
        self.thread.start()

    def give(self, name: str, job: Callable[[], None]) -> None:
        self.job = job
        self.thread.name = name
        self.wake.release()

    def _loop(self) -> None:
        while True:
            self.wake.acquire()
            job, self.job = self.job, None
            if job is None:
                return
            contextvars.Context().run(job)
            if not self.pool.back(self):
                return


class _Pool:
    """Actor threads kept across schedules: a schedule's actors start by a lock's release,
    not by three new threads (each a start, a wake-up of its starter and a join)."""

    KEEP = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, name: str, job: Callable[[], None]) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        (worker or _Worker(self)).give(name, job)

    def back(self, worker: _Worker) -> bool:
        with self._lock:
            if len(self._idle) >= self.KEEP:
                return False
            self._idle.append(worker)
            return True


_POOL = _Pool()


@attrs.frozen
class ActorEnd:
    """How an actor ended: its result, the error it raised, or its death."""

    name: str
    result: Any
    error: BaseException | None
    dead: bool
    steps: int


@attrs.frozen
class Ran:
    """One schedule run to its end (or its hang)."""

    trace: Trace
    ends: dict[str, ActorEnd]
    hang: str = ""


class Schedule:
    """One schedule: actors added with ``actor``, ports wrapped with ``proxy``, run by ``run``.

    Hand-offs are direct: the actor that stops (at a pause point, or at its end) asks the
    chooser itself, under the schedule's lock, and wakes only the actor granted (its own
    baton), or goes on without waiting at all when it is granted itself; the caller of
    ``run`` sleeps until the schedule ends, waking only to judge a hang (no actor's turn
    moved for ``HANG_SECONDS``). The steps, their order and the chooser's calls are those
    of a scheduler thread granting one actor at a time: the same traces for the same
    choosers."""

    def __init__(self, chooser: Chooser) -> None:
        self._chooser = chooser
        self._mu = threading.Lock()
        self._actors: dict[str, _Actor] = {}
        self._order: list[str] = []
        self._trace: list[Step] = []
        self._clocks: dict[str, Any] = {}
        #: the actor whose turn it is (started or granted, not yet paused or ended)
        self._turn: _Actor | None = None
        self._starting = 0
        self._over = False
        #: released once, when the schedule ends (no actor can move, or the chooser raised)
        self._ended = threading.Lock()
        self._ended.acquire()
        self._failure: BaseException | None = None
        self._since = 0.0
        self._choosing = False
        self._stage = ""

    # -- wiring ------------------------------------------------------------------------
    def actor(self, name: str, body: Callable[[], Any], *, clock: Any = None) -> None:
        """Add an actor; ``clock`` (a ManualClock) is what a stall advances."""
        self._actors[name] = _Actor(name, body)
        self._order.append(name)
        if clock is not None:
            self._clocks[name] = clock

    def proxy(self, actor: str, port: Port, target: Any) -> Any:
        """``target`` as ``actor`` sees it: every public method a pause point."""
        return PortProxy(self, actor, port, target)

    # -- the actor's side ----------------------------------------------------------------
    def pause(self, actor: str, call: Call) -> Fault:
        """Called by a proxy before the call: wait for the scheduler's grant."""
        me = self._actors[actor]
        with self._mu:
            if me.dead:
                raise ActorDied(actor)
            me.pending = call
            me.waiting = True
            nxt: _Actor | None = None
            if self._turn is me:
                me.running = False
                nxt = self._next()
            if nxt is me:  # granted again at once: no hand-off, no wait
                return self._take(me)
        if nxt is not None:
            self._go(nxt)
        me.baton.acquire()
        with self._mu:
            return self._take(me)

    def _take(self, me: _Actor) -> Fault:
        if me.released:
            raise ActorDied(me.name)
        fault = me.grant
        assert fault is not None
        me.grant = None
        me.pending = None
        return fault

    def on_own_thread(self, actor: str) -> bool:
        return self._actors[actor].ident == threading.get_ident()

    def check_alive(self, actor: str) -> None:
        if self._actors[actor].dead:
            raise ActorDied(actor)

    def stall(self, actor: str) -> None:
        clock = self._clocks.get(actor)
        if clock is not None:
            clock.advance(STALL_SECONDS)

    def _main(self, me: _Actor) -> None:
        me.ident = threading.get_ident()
        try:
            me.result = me.body()
        except ActorDied:
            me.dead = True
        except BaseException as error:
            me.error = error
        finally:
            with self._mu:
                me.done = True
                me.running = False
                nxt = self._next() if self._turn is me else None
            if nxt is not None:
                self._go(nxt)
            threading.current_thread().name = IDLE
            me.exited.release()

    # -- the scheduler's side (run by whichever thread ends a turn) ------------------------
    def _next(self) -> _Actor | None:
        """Under the lock, at the end of a turn: the next actor to start, or the one the
        chooser grants (its grant set), or None (the schedule ended)."""
        self._turn = None
        if self._over:
            return None
        if self._starting < len(self._order):
            me = self._actors[self._order[self._starting]]
            self._starting += 1
            return self._give(me, f"{me.name} did not reach its first pause point within {HANG_SECONDS} s")
        while True:
            paused = [
                Pending(a.name, a.pending, a.steps)
                for a in (self._actors[n] for n in self._order)
                if not a.done and not a.dead and a.pending is not None
            ]
            if not paused:
                self._end()
                return None
            self._choosing = True
            try:
                name, fault = self._chooser(paused)
            except BaseException as error:
                self._failure = error
                self._end()
                return None
            finally:
                self._choosing = False
            me = self._actors[name]
            assert me.pending is not None
            self._trace.append(Step(name, str(me.pending), fault))
            me.steps += 1
            if fault is Fault.DIE:
                me.dead = True
                continue
            me.grant = fault
            me.waiting = False
            return self._give(
                me, f"{name} neither paused nor ended within {HANG_SECONDS} s after {me.pending}"
            )

    def _give(self, me: _Actor, stage: str) -> _Actor:
        me.running = True
        self._turn = me
        self._stage = stage
        self._since = time.monotonic()
        return me

    def _end(self) -> None:
        self._over = True
        self._ended.release()

    def _go(self, me: _Actor) -> None:
        """Outside the lock: start ``me`` on a pooled thread, or hand it its baton."""
        if me.started:
            me.baton.release()
        else:
            me.started = True
            _POOL.run(f"actor-{me.name}", functools.partial(self._main, me))

    def run(self) -> Ran:
        with self._mu:
            self._since = time.monotonic()
            first = self._next()
        if first is not None:
            self._go(first)
        hang = ""
        try:
            hang = self._wait()
        finally:
            self._release()
        if self._failure is not None:
            raise self._failure
        ends = {a.name: ActorEnd(a.name, a.result, a.error, a.dead, a.steps) for a in self._actors.values()}
        return Ran(tuple(self._trace), ends, hang)

    def _wait(self) -> str:
        """Sleep until the schedule ends; a turn that has not moved for HANG_SECONDS (real
        seconds: never a test clock) ends it as a hang."""
        while True:
            left = self._since + HANG_SECONDS - time.monotonic()
            if self._ended.acquire(timeout=max(left, 0.001)):
                return ""
            with self._mu:
                if self._over:
                    continue  # it ended just now
                if self._choosing:  # a chooser that waits (a parent's answer) is not a hang
                    self._since = time.monotonic()
                    continue
                if time.monotonic() - self._since < HANG_SECONDS:
                    continue
                self._over = True
                return self._stage

    def _release(self) -> None:
        with self._mu:
            self._over = True
            for me in self._actors.values():
                if not me.done:
                    me.dead = True
                    me.released = True
                    if me.waiting:
                        me.waiting = False
                        me.baton.release()
        for me in self._actors.values():
            if me.started:
                me.exited.acquire(timeout=HANG_SECONDS)


class PortProxy:
    """Any port object, every public method a pause point (module docstring).

    Attributes that are not callables (``facts``, ``keeps_banks``) pass through; a method
    the target lacks is missing here too (``getattr(proxy, name, None)`` stays None).
    """

    def __init__(self, schedule: Schedule, actor: str, port: Port, target: Any) -> None:
        self._schedule = schedule
        self._actor = actor
        self._port = port
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or not callable(attr):
            return attr
        port = self._port
        call = Call(port.label, name, port.resource, not port.reads(name), port.private)

        def paused(*args: Any, **kwargs: Any) -> Any:
            schedule = self._schedule
            if port.own_thread_only and not schedule.on_own_thread(self._actor):
                raise port.error(name, "called outside its actor's thread (refused, untouched)")
            schedule.check_alive(self._actor)
            if name in port.passthrough:
                return attr(*args, **kwargs)
            fault = schedule.pause(self._actor, call)
            if fault is Fault.STALL:
                schedule.stall(self._actor)
                raise port.error(name, "stalled past its deadline")
            if fault is Fault.RAISE:
                raise port.error(name, "failed (a blip)")
            result = attr(*args, **kwargs)
            if fault is Fault.LOST:
                raise port.error(name, "the reply was lost after the commit")
            return result

        return paused


# -- search ------------------------------------------------------------------------------


def faults_at(call: Call, allowed: frozenset[Fault]) -> list[Fault]:
    """The faults offered at a call (module docstring: private calls only ``raise``)."""
    if call.private:
        return [f for f in (Fault.RAISE,) if f in allowed]
    offered = [Fault.RAISE, Fault.STALL, Fault.DIE] + ([Fault.LOST] if call.writes else [])
    return [f for f in offered if f in allowed]


def independent(a: tuple[str, Call, Fault], b: tuple[str, Call, Fault]) -> bool:
    """Do two steps of a schedule commute? (module docstring)"""
    if a[0] == b[0]:
        return False
    if a[2] in NO_EFFECT or b[2] in NO_EFFECT:
        return True
    if a[1].resource != b[1].resource:
        return True
    return not (a[1].writes or b[1].writes)


Key = tuple[str, Fault]


@attrs.define
class _Frame:
    options: list[tuple[str, Call, Fault]]
    sleep: dict[Key, tuple[str, Call, Fault]]
    index: int = 0

    @property
    def current(self) -> tuple[str, Call, Fault]:
        return self.options[self.index]

    def child_sleep(self) -> dict[Key, tuple[str, Call, Fault]]:
        here = self.current
        before = {**self.sleep, **{(o[0], o[2]): o for o in self.options[: self.index]}}
        return {k: s for k, s in before.items() if independent(s, here)}


@attrs.frozen
class Bounds:
    depth: int = 12
    max_faults: int = 0
    faults: frozenset[Fault] = frozenset(Fault) - {Fault.NONE}


def _faults_used(trace: Iterable[tuple[str, Call, Fault]]) -> int:
    return sum(1 for step in trace if step[2] is not Fault.NONE)


class _Depth:
    """The depth bound: actors past it run on alone, first by order, no faults."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds

    def split(self, paused: Sequence[Pending]) -> tuple[list[Pending], Pending | None]:
        within = [p for p in paused if p.steps < self.bounds.depth]
        return within, (None if within else paused[0])


class Exhaustive:
    """Depth-first enumeration with sleep sets, by replay (module docstring)."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.depth = _Depth(bounds)
        self.stack: list[_Frame] = []
        self.at = 0
        self.finished = False

    def chooser(self, paused: Sequence[Pending]) -> tuple[str, Fault]:
        within, alone = self.depth.split(paused)
        if alone is not None:
            return alone.actor, Fault.NONE
        if self.at < len(self.stack):
            frame = self.stack[self.at]
            actor, call, _fault = frame.current
            if not any(p.actor == actor and p.call == call for p in within):
                raise Nondeterministic(f"replaying step {self.at + 1}: {actor} is not paused at {call}")
        else:
            frame = self._frame(within)
            self.stack.append(frame)
        self.at += 1
        return frame.current[0], frame.current[2]

    def _frame(self, within: Sequence[Pending]) -> _Frame:
        sleep = self.stack[-1].child_sleep() if self.stack else {}
        budget = self.bounds.max_faults - _faults_used(f.current for f in self.stack)
        options: list[tuple[str, Call, Fault]] = []
        for p in within:
            options.append((p.actor, p.call, Fault.NONE))
            if budget > 0:
                options += [(p.actor, p.call, f) for f in faults_at(p.call, self.bounds.faults)]
        sleep = {k: s for k, s in sleep.items() if any(p.actor == k[0] for p in within)}
        options = [o for o in options if (o[0], o[2]) not in sleep]
        if not options:
            raise Pruned("sleep-set blocked")
        return _Frame(options, sleep)

    def next(self) -> bool:
        """After a schedule: move to the next one; False when the space is done."""
        del self.stack[self.at :]
        self.at = 0
        while self.stack:
            top = self.stack[-1]
            if top.index + 1 < len(top.options):
                top.index += 1
                return True
            self.stack.pop()
        self.finished = True
        return False


class Randomly:
    """Seeded random choices: who goes next uniformly, a fault with ``fault_rate``."""

    def __init__(self, seed: int, bounds: Bounds, fault_rate: float = 0.15) -> None:
        self.rng = random.Random(seed)
        self.bounds = bounds
        self.depth = _Depth(bounds)
        self.fault_rate = fault_rate
        self.used = 0

    def reset(self) -> None:
        self.used = 0

    def chooser(self, paused: Sequence[Pending]) -> tuple[str, Fault]:
        within, alone = self.depth.split(paused)
        if alone is not None:
            return alone.actor, Fault.NONE
        pick = within[self.rng.randrange(len(within))]
        offered = faults_at(pick.call, self.bounds.faults)
        if offered and self.used < self.bounds.max_faults and self.rng.random() < self.fault_rate:
            self.used += 1
            return pick.actor, offered[self.rng.randrange(len(offered))]
        return pick.actor, Fault.NONE


# -- results -----------------------------------------------------------------------------


@attrs.frozen
class Violation:
    """A broken invariant: its class (the rule and what broke) and the details."""

    rule: str
    what: str
    detail: str = ""

    @property
    def kind(self) -> str:
        return f"{self.rule}: {self.what}"


@attrs.define
class Exploration:
    """What a search explored: schedules checked, pruned, and violations by class, each
    with the first schedule (its trace) that found it."""

    name: str
    depth: int
    actors: int
    schedules: int = 0
    pruned: int = 0
    #: schedules run (a random search's draws: the distinct ones are ``schedules``)
    draws: int = 0
    violations: int = 0
    seconds: float = 0.0
    found: dict[str, tuple[Trace, Violation]] = attrs.Factory(dict)
    traces: set[Trace] = attrs.Factory(set)
    #: counted in the session's line (a planted fence's exploration is not)
    counted: bool = True

    def add(self, trace: Trace, violations: Sequence[Violation]) -> None:
        self.schedules += 1
        self.violations += 1 if violations else 0
        for v in violations:
            self.found.setdefault(v.kind, (trace, v))

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (
            f"explored {self.schedules} schedules (depth {self.depth}, {self.actors} actors), "
            f"{self.violations} violations"
        )

    def report(self) -> str:
        """Every class found, with the first schedule that found it."""
        lines = [f"{self.name}: {self.line()} [{self.pruned} pruned, {self.rate:.0f} schedules/s]"]
        for kind, (trace, violation) in sorted(self.found.items()):
            lines.append(f"  {kind}\n    schedule: {show(trace)}\n    {violation.detail}")
        return "\n".join(lines)


#: Runs one schedule with a chooser and checks it: (trace, violations).
Runner = Callable[[Chooser], tuple[Trace, Sequence[Violation]]]


def explore_all(name: str, run: Runner, bounds: Bounds, actors: int, limit: int = 1_000_000) -> Exploration:
    """Every schedule of the bounded space, one per equivalence class (module docstring)."""
    found = Exploration(name, bounds.depth, actors)
    search = Exhaustive(bounds)
    started = time.monotonic()
    while found.schedules + found.pruned < limit:
        try:
            trace, violations = run(search.chooser)
        except Pruned:
            found.pruned += 1
        else:
            found.add(trace, violations)
        if not search.next():
            break
    found.seconds = time.monotonic() - started
    return found


def explore_random(
    name: str, run: Runner, bounds: Bounds, actors: int, *, schedules: int, seed: int, draws: int = 0
) -> Exploration:
    """``schedules`` distinct schedules (by trace) drawn at random, seeded."""
    found = Exploration(name, bounds.depth, actors)
    search = Randomly(seed, bounds)
    started = time.monotonic()
    tries = 0
    while len(found.traces) < schedules and tries < (draws or schedules * 4):
        tries += 1
        search.reset()
        trace, violations = run(search.chooser)
        if trace in found.traces:
            continue
        found.traces.add(trace)
        found.add(trace, violations)
    found.seconds = time.monotonic() - started
    found.draws = tries
    return found


def replay(trace: Trace) -> Chooser:
    """A chooser that follows a recorded trace (to reproduce a schedule that found a
    violation); past its end, the first paused actor goes on without faults."""
    steps: Iterator[Step] = iter(trace)

    def chooser(paused: Sequence[Pending]) -> tuple[str, Fault]:
        step = next(steps, None)
        if step is None:
            return paused[0].actor, Fault.NONE
        if not any(p.actor == step.actor for p in paused):
            raise Pruned(f"the trace diverged at {step}")
        return step.actor, step.fault

    return chooser


#: Every exploration this process ran, for the test session's summary line.
EXPLORED: list[Exploration] = []


def keep(exploration: Exploration, *, counted: bool = True) -> Exploration:
    """Add an exploration to the session's line (``summary_line``)."""
    exploration.counted = counted
    EXPLORED.append(exploration)
    return exploration


def summary_line(explored: Sequence[Exploration] | None = None) -> str:
    """``explored N schedules (depth D, A actors), V violations`` over the session."""
    kept = [e for e in (EXPLORED if explored is None else explored) if e.counted]
    schedules = sum(e.schedules for e in kept)
    depth = max((e.depth for e in kept), default=0)
    actors = max((e.actors for e in kept), default=0)
    violations = sum(e.violations for e in kept)
    rate = schedules / sum(e.seconds for e in kept) if kept and sum(e.seconds for e in kept) else 0.0
    return (
        f"explored {schedules} schedules (depth {depth}, {actors} actors), {violations} violations"
        f" [{rate:.0f} schedules/s]"
    )
