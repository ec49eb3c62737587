"""Rules L: the runner's lease while it banks. The engines tier's tests of L1, L2, L3, L4, L5
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import hashlib
import itertools
import threading
import uuid
from pathlib import Path

import attrs
import pytest
from nats_server import (
    NatsServer,
    nats_url,  # noqa: F401 - a fixture
)
from nats_server import namespace as nats_namespace
from rigs.lease_timing import (
    MIN,
    B,
    CutAfterPut,
    StuckArchive,
    StuckProvider,
    T,
    _short,
    _states,
    run_bounded,
)
from rigs.lossy_runner import RUN, LosableLease, LosesLeaseMidFetch, OvertakenAfterRead
from rigs.outbox import (
    HOUR,
    T0,
    DownQueue,
    Listing,
    LosesAfter,
    RunsFirst,
    _orphans,
    _queued,
    _rig_with_lost_publication,
    store,  # noqa: F401 - a fixture
)
from rigs.swept_cluster import (
    SWEEP,
    Swept,
    _waiting_on_a_lock,
    acted,
    assert_swept_once_and_carried_on,
    orphan,
    swept,  # noqa: F401 - a fixture
)
from runner_rigs import checksum, delivery_actor, make_rig, queue_resume, sweeper_actor
from test_runner_faults import events, paused, show, wait_for
from waiting import eventually

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsKvLease
from scratchbank.adapters.watchdog import Watchdog
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.lease_keeper import LeaseKeeper
from scratchbank.application.orphans import SWEEPER_KEY, Sweeper
from scratchbank.application.ports import SystemClock
from scratchbank.application.runner import Handled
from scratchbank.application.teardown import Budgets, NothingRecorded, TeardownReport, bank_at_teardown
from scratchbank.domain.lease import (
    HoldBudgets,
    HoldClock,
    LeaseTiming,
    backoff_delays,
    delay_for,
    max_deliveries,
    past_ceiling,
    post_engine_ceiling,
    sweeper_cutoff,
    teardown_ceiling,
    unwind_ceiling,
)
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    LeaseTaken,
    NodeFinished,
    OrphanSwept,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.testing.builders import banked, started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_L_engines.py: The run's lease while banking (L1-L5): ceilings, back-off, sweeper cutoff, the keeper.


def test_L3_unwind_ceiling_is_56_minutes_with_the_defaults() -> None:
    """Both ceilings together: 56 minutes, of which the 31-minute storage bank is most.
    Proves ``scratchbank.domain.lease.unwind_ceiling``."""
    assert unwind_ceiling(B) == 56 * MIN
    assert teardown_ceiling(B) + post_engine_ceiling(B) == unwind_ceiling(B)
    assert B.storage_bank == 31 * MIN
    assert B.storage_bank > unwind_ceiling(B) / 2


def test_L3_ceiling_follows_each_budget() -> None:
    """Raising any one budget raises the ceiling by as much.
    Proves ``scratchbank.domain.lease.unwind_ceiling``."""
    for field in attrs.fields(HoldBudgets):
        bigger = attrs.evolve(B, **{field.name: getattr(B, field.name) + 7})
        assert unwind_ceiling(bigger) == unwind_ceiling(B) + 7, field.name


def test_L4_backoff_halves_from_one_interval_to_ceiling_plus_lapse() -> None:
    """First delay one lease interval, last the whole ceiling plus the lapse, each half the next.
    Proves ``scratchbank.domain.lease.backoff_delays``."""
    delays = backoff_delays(B, T)
    assert delays[0] == T.interval
    assert delays[-1] == unwind_ceiling(B) + T.lapse
    for shorter, longer in itertools.pairwise(delays[1:]):
        assert shorter * 2 == longer
    assert delays[1] / 2 <= T.interval < delays[1]


def test_L4_the_last_retry_outwaits_a_whole_hold() -> None:
    """A delivery meeting a hold just taken still finds it gone at its last retry.
    Proves ``scratchbank.domain.lease.delay_for``."""
    assert delay_for(max_deliveries(B, T) - 1, B, T) == unwind_ceiling(B) + T.lapse
    assert delay_for(max_deliveries(B, T), B, T) is None
    assert delay_for(1, B, T) == T.interval


def test_L4_sweeper_cutoff_is_2h30_with_the_defaults() -> None:
    """Every delivery at its rank's longest delay (its back-off plus an ack wait).
    Proves ``scratchbank.domain.lease.sweeper_cutoff``."""
    assert sweeper_cutoff(B, T) == 150 * MIN
    longest = sum(backoff_delays(B, T)) + max_deliveries(B, T) * T.ack_wait
    assert longest <= sweeper_cutoff(B, T) < longest + MIN


def test_L2_teardown_ceiling_counts_from_a_cancellation_to_the_engine_return() -> None:
    """No ceiling while the engine runs uncancelled; past teardown + margin once cancelled.
    Proves ``scratchbank.domain.lease.past_ceiling``."""
    assert past_ceiling(HoldClock(), 10_000.0, B) is None
    cancelled = HoldClock(cancelled_at=0.0)
    assert past_ceiling(cancelled, teardown_ceiling(B), B) is None
    assert past_ceiling(cancelled, teardown_ceiling(B) + 1, B) == "teardown ceiling"


def test_L2_post_engine_ceiling_is_armed_only_when_a_resume_can_wait() -> None:
    """An engine that returned an error arms it; a finished run's bank runs to its own budget.
    Proves ``scratchbank.domain.lease.past_ceiling``."""
    parked = HoldClock(engine_returned_at=0.0, resume_can_wait=True)
    assert past_ceiling(parked, post_engine_ceiling(B) + 1, B) == "post-engine ceiling"
    assert past_ceiling(parked, post_engine_ceiling(B), B) is None
    finished = HoldClock(engine_returned_at=0.0, resume_can_wait=False)
    assert past_ceiling(finished, 10 * unwind_ceiling(B), B) is None


def test_L1_keeper_refreshes_through_the_hold() -> None:
    """While kept, the lease outlives its lapse many times over: nobody else can take it.
    Proves ``scratchbank.application.lease_keeper.LeaseKeeper``."""
    lease, hold, timing = _short()
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    keeper = LeaseKeeper(lease, grant, hold, timing, SystemClock())
    keeper.start()
    try:
        eventually(lambda: keeper.refreshes >= 12, timeout=30, what="12 refreshes", interval=0.02)
        assert lease.acquire("run-1", "b") is None
    finally:
        keeper.stop()
    assert keeper.refreshes >= 12 and not keeper.cancel.is_set()


def test_L5_past_a_ceiling_the_keeper_lets_go_and_cancels_the_run() -> None:
    """The post-engine ceiling passes: the lease is released and the run context cancelled.
    Proves ``scratchbank.domain.lease.HoldBudgets``."""
    lease, _, timing = _short(lapse=30.0)
    tiny = HoldBudgets(0, 0, 0, 0, 0, 0, 0.1)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    keeper = LeaseKeeper(lease, grant, tiny, timing, SystemClock())
    keeper.start()
    keeper.engine_returned(resume_can_wait=True)
    try:
        assert keeper.cancel.wait(5)
    finally:
        keeper.stop()
    assert "post-engine ceiling" in keeper.note
    assert lease.acquire("run-1", "b") is not None  # let go: another runner takes it at once


def test_L5_a_refresh_that_fails_cancels_the_run() -> None:
    """The lease lapsed and was taken: the refresh fails and the run context is cancelled.
    Proves ``scratchbank.adapters.inprocess.InProcessLease``."""
    _, hold, timing = _short(lapse=0.1)
    clock = ManualClock()
    lease = InProcessLease(lapse=0.1, clock=clock)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    clock.advance(0.15)  # past the lapse on the lease's clock
    taken = lease.acquire("run-1", "b")
    assert taken is not None and taken.token > grant.token
    keeper = LeaseKeeper(lease, grant, hold, timing, SystemClock())
    keeper.start()
    try:
        assert keeper.cancel.wait(5)
    finally:
        keeper.stop()
    assert "LEASE_LOST" in keeper.note


def test_L5_T14_a_teardown_whose_lease_is_lost_mid_archive_stops_and_still_continues_processes() -> None:
    """The run context is cut while tar runs: the exec is cut at once (the banking budget is an
    hour), nothing is stored or recorded, the sandbox is left, and its processes run again.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    box = StuckArchive()
    cancel = Cancel()
    reports: list[TeardownReport] = []
    try:
        box.run('mkdir -p "$1" && echo x > "$1/f"', [box.facts.scratch])
        box.spawn("sleep 1000")  # the workload the quiesce stops
        teardown = threading.Thread(
            target=lambda: reports.append(
                bank_at_teardown(
                    "run-1",
                    timeline=timeline,
                    store=store,
                    sandbox=box,
                    run_finished=False,
                    budgets=Budgets(banking_seconds=3600.0),
                    cancel=cancel,
                )
            ),
            daemon=True,
        )
        teardown.start()
        assert box.wait_archiving(), "the archive never started"
        cancel.cut("the refresh failed (LEASE_LOST): the run context is cancelled (L5)")
        teardown.join(30)  # a bound for the test, not a timing assertion: an uncut tar sleeps 1000 s
        assert not teardown.is_alive(), "the cancel did not cut the archive"
        (report,) = reports
        assert report.cut.startswith("the refresh failed") and report.sandbox_left
        assert not report.recorded and report.record == NothingRecorded("cut", report.cut)
        assert [r.WIRE for r in timeline.read("run-1")] == ["run_started"]  # nothing recorded
        assert store.only("run-1") is None  # nothing stored
        # the quiesce stopped the workload, but a cut exec's verdict line is no confirmed
        # verdict (H4): unquiesced, named, its stopped count kept for the continue (T14)
        assert report.quiesce is not None and not report.quiesce.quiesced and report.quiesce.stopped > 0
        assert "cut before its exit code" in report.quiesce.reasons[0]
        assert box.continues == 1 and "T" not in _states(box)  # T14: continued all the same
    finally:
        box.destroy()


def test_L5_T14_what_an_exec_wrote_before_its_cut_still_reaches_its_sink(tmp_path: Path) -> None:
    """A cut ends the exec at once, yet what it had already written (a bank's quiesce report,
    ahead of its tar) is still read into the sink: ``_LocalExec.receive`` drains the pipes once."""
    from scratchbank.adapters.local_sandbox import LocalSandbox
    from scratchbank.adapters.scripted import Exec
    from scratchbank.domain.errors import StreamBroken

    box = LocalSandbox(tmp_path / "box", isolate=False)
    go, written = tmp_path / "go", tmp_path / "written"
    first, release = threading.Event(), threading.Event()
    got = bytearray()

    class HeldSink:  # holds the pump on its first chunk until the cut has happened
        def write(self, data: bytes) -> int:
            got.extend(data)
            first.set()
            release.wait(30)
            return len(data)

    cancel = Cancel()
    source = (
        'printf first; while [ ! -e "$1" ]; do sleep 0.01; done; printf second; : > "$2"; exec sleep 1000'
    )
    raised: list[BaseException] = []

    def call() -> None:
        try:
            box.call(
                Exec(source, [str(go), str(written)], stdout=HeldSink(), deadline=Deadline.after(60, cancel))
            )
        except BaseException as error:
            raised.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        assert first.wait(30), "the exec never wrote"
        go.touch()
        eventually(written.exists, timeout=30, what="the second write, left in the pipe")
        cancel.cut("the refresh failed (LEASE_LOST): the run context is cancelled (L5)")
        release.set()
        caller.join(30)  # a bound for the test: an uncut exec sleeps 1000 s
        assert not caller.is_alive(), "the cut did not end the call"
    finally:
        release.set()
    assert bytes(got) == b"firstsecond"
    assert len(raised) == 1 and isinstance(raised[0], StreamBroken)


def test_L5_T7_a_bank_that_reached_the_store_before_the_cut_is_still_recorded() -> None:
    """The record does not ride the run context: a stored bank is recorded (the fence alone
    refuses it once a newer holder wrote), and the sandbox is not left.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, cancel = InMemoryTimeline(), Cancel()
    store = CutAfterPut(cancel)
    timeline.append("run-1", [started()])
    box = FakeSandbox(files={"f": b"x"})
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=box, run_finished=False, cancel=cancel
    )
    assert report.cut and report.recorded and not report.sandbox_left
    last = timeline.read("run-1")[-1]
    assert isinstance(last, ScratchBanked) and last.banked and store.only("run-1") is not None


def test_L5_a_teardown_already_cut_touches_neither_the_sandbox_nor_the_store() -> None:
    """The lease was let go before the teardown began: nothing runs, nothing is written.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store, cancel = InMemoryTimeline(), InMemoryBankStore(), Cancel()
    timeline.append("run-1", [started(), banked()])
    cancel.cut("past the teardown ceiling: the lease was let go (L5)")
    box = FakeSandbox(files={"f": b"x"})
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=box, run_finished=True, cancel=cancel
    )
    assert report.sandbox_left and report.tries == ()
    assert (box.quiesces, box.archives, box.continued) == (0, 0, 0)
    assert [r.WIRE for r in timeline.read("run-1")] == ["run_started", "sandbox_scratch_banked"]


def test_L5_a_cancel_cuts_a_deadline_and_its_watchdog_at_once() -> None:
    """A deadline riding the run context has passed once cut; a watchdog armed on it fires.
    Proves ``scratchbank.application.cancellation.Cancel``."""
    cancel = Cancel()
    deadline = Deadline.after(3600.0, cancel)
    fired = threading.Event()
    with Watchdog(deadline, fired.set) as dog:
        assert not deadline.passed() and deadline.left() > 3000
        cancel.cut("lease lost")
        assert fired.is_set() and dog.fired
    assert deadline.passed() and deadline.left() == 0.0
    late = threading.Event()
    with Watchdog(Deadline.after(3600.0, cancel), late.set):
        assert late.is_set()  # armed after the cut: fires at once


def test_L5_a_runner_past_its_ceiling_lets_go_and_a_second_runner_takes_over(tmp_path: Path) -> None:
    """On a real NATS KV lease (lapse 60 s): runner A parks the run, its bank hangs past the
    post-engine ceiling; A lets the lease go and leaves the sandbox. Runner B takes the lease
    at once, banks what A left, and carries the run on with that scratch restored.
    Proves ``scratchbank.adapters.nats_queue.NatsConnection``."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    conn = NatsConnection(server.url)
    stuck = StuckProvider(tmp_path / "sandboxes")
    try:
        tl = InMemoryTimeline()
        lease = NatsKvLease(conn, lapse=60.0, namespace=nats_namespace())
        rig = make_rig(tmp_path, tl, lease=lease)
        tl.append("run-1", [RunStarted()])
        timing = LeaseTiming(interval=0.1, lapse=60.0)
        tiny = HoldBudgets(60, 0, 0, 0, 0, 0, 0.3)
        a = attrs.evolve(rig, provider=stuck).runner("runner-a", timing)
        a.settings = attrs.evolve(a.settings, hold=tiny, teardown=Budgets(banking_seconds=3600.0))
        queue_resume(tl, rig.queue, "run-1", "a1")
        first = run_bounded(a)
        assert first.handled is Handled.LET_GO, first.detail
        assert first.teardown is not None and "post-engine ceiling" in first.teardown.cut
        assert not [r for r in tl.read("run-1") if isinstance(r, ScratchBanked)]  # A recorded nothing
        (left,) = stuck.started
        assert (left.root / "scratch" / "clone" / "README.md").exists()  # left, not torn down
        queue_resume(tl, rig.queue, "run-1", "a2")
        second = rig.runner("runner-b", timing).run_once(5)
        assert second is not None and second.handled is Handled.RAN, second.detail
        records = tl.read("run-1")
        taken = [r for r in records if isinstance(r, LeaseTaken)]
        assert [t.holder for t in taken] == ["runner-a", "runner-b"] and taken[1].token > taken[0].token
        banks = [r for r in records if isinstance(r, ScratchBanked)]
        assert banks[0].banked  # B's takeover banked what A left
        measured = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
        assert measured and measured[0].succeeded  # it read the clone A's sandbox held
    finally:
        for box in stuck.started:
            box.destroy()
        conn.close()
        server.stop()


def test_L1_the_keeper_refreshes_on_its_clock_not_on_real_time() -> None:
    """Driven by a ManualClock: one refresh per interval the clock passes, none between.
    Proves ``scratchbank.adapters.inprocess.InProcessLease``."""
    from scratchbank.testing.clocks import ManualClock

    clock = ManualClock()
    lease = InProcessLease(lapse=3600.0)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    keeper = LeaseKeeper(lease, grant, HoldBudgets(), LeaseTiming(interval=60.0, lapse=180.0), clock)
    keeper.start()
    try:
        clock.until_waiting(1)
        assert keeper.refreshes == 0
        clock.advance(60.0)
        clock.until_waiting(1)  # back at its interval, after one refresh
        assert keeper.refreshes == 1
        clock.advance(30.0)  # half an interval: it stays parked
        clock.until_waiting(1)
        assert keeper.refreshes == 1
        clock.advance(30.0)
        clock.until_waiting(1)
        assert keeper.refreshes == 2 and not keeper.cancel.is_set()
    finally:
        keeper.stop()


def test_L5_past_a_ceiling_on_the_keepers_clock_it_lets_go() -> None:
    """The post-engine ceiling passes on the ManualClock: the run context is cut, no sleeping.
    Proves ``scratchbank.domain.lease.post_engine_ceiling``."""
    from scratchbank.testing.clocks import ManualClock

    clock = ManualClock()
    lease = InProcessLease(lapse=3600.0)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    hold = HoldBudgets()
    keeper = LeaseKeeper(lease, grant, hold, LeaseTiming(interval=60.0, lapse=180.0), clock)
    keeper.start()
    keeper.engine_returned(resume_can_wait=True)
    try:
        clock.until_waiting(1)
        clock.advance(post_engine_ceiling(hold) + 60.0)
        assert keeper.cancel.wait(30.0)  # a safety net, not a timed assertion
    finally:
        keeper.stop()
    assert "post-engine ceiling" in keeper.note


# ---- from tests/rules/test_[CL]*.py: The runner and the queue, exactly once (issue #19): a claim whose reply was lost keeps its consent (C4), one queueing path at the judged version (C5, C6), every lost append settled by reading.


def test_L5_a_holder_fenced_mid_teardown_changes_nothing_in_the_store(tmp_path: Path) -> None:
    """A newer holder took the run right after this holder's teardown read it: the finished
    run's drop (T5) is refused FENCED before it reaches the store; the bank the newer
    holder reads is still there, and nothing of this holder lands after its token.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    from scratchbank.adapters.memory import FakeSandbox
    from scratchbank.application.fencing import FencedBankStore, FencedTimeline, Token
    from scratchbank.application.teardown import bank_at_teardown
    from scratchbank.domain.errors import Fenced
    from scratchbank.testing.clocks import ManualClock

    tl = OvertakenAfterRead()
    store = InMemoryBankStore()
    (tmp_path / "bank").write_bytes(b"a bank")
    sha = hashlib.sha256(b"a bank").hexdigest()
    name = store.put(RUN, tmp_path / "bank", sha256=sha)
    banked = ScratchBanked(banked=True, empty=False, unknown=False, bytes=6, sha256=sha, object=name)
    tl.append(RUN, [RunStarted(), banked, AttemptQueued(attempt="a1"), AttemptClaimed(attempt="a1")])
    fenced = FencedTimeline(tl, RUN, Token("runner-a", 1, "a1"))
    fenced.announce()
    tl.armed = True
    with pytest.raises(Fenced):
        bank_at_teardown(
            RUN,
            timeline=fenced,
            store=FencedBankStore(store, fenced),
            sandbox=FakeSandbox({"./notes.txt": b"scratch"}),
            run_finished=True,
            clock=ManualClock(),
        )
    assert store.stat(RUN, name) is not None
    assert [r.WIRE for r in tl.read(RUN)][-1] == "lease_taken"


def test_L5_a_holder_that_loses_its_lease_mid_restore_stops_it_at_once(tmp_path: Path) -> None:
    """The lease is lost while the bank streams in: the restore stops (nothing committed into
    the scratch), its record names LEASE_LOST (X5: read again), no node runs, the delivery is
    left for the next holder (not acked). Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    from runner_rigs import RecordingInbound

    from scratchbank.domain.records import NodeFinished

    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append(RUN, [RunStarted()])
    queue_resume(tl, rig.queue, RUN, "a1")
    first = rig.runner().run_once(1)
    assert first is not None and first.handled is Handled.RAN, first.detail
    nodes_before = sum(isinstance(r, NodeFinished) for r in tl.read(RUN))
    lease = LosableLease()
    rig.lease = lease  # type: ignore[assignment]
    rig.store = LosesLeaseMidFetch(rig.store, lease)  # type: ignore[assignment]
    queue_resume(tl, rig.queue, RUN, "a2")
    fetched = rig.queue.fetch(1)
    assert fetched is not None
    inbound = RecordingInbound(fetched.delivery)
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.LET_GO, handled.detail
    assert not inbound.acked
    records = tl.read(RUN)
    restores = [r for r in records if isinstance(r, ScratchRestored)]
    assert restores and not restores[-1].restored and "LEASE_LOST" in restores[-1].reason
    assert sum(isinstance(r, NodeFinished) for r in records) == nodes_before  # the engine never ran


@pytest.mark.parametrize("skew", [90.0, -90.0])
def test_L1_a_runner_whose_clock_is_off_by_90_s_cannot_take_a_held_lease(
    nats_url: str,
    skew: float,
) -> None:
    """The holder refreshes on time; a runner whose clock is 90 s ahead (or behind) is refused
    while the lease lives: expiry is the server's (the bucket's TTL), never a runner's clock.
    Proves ``scratchbank.adapters.nats_queue.NatsConnection``."""
    from nats_server import namespace

    from scratchbank.adapters.nats_queue import NatsConnection, NatsKvLease
    from scratchbank.testing.clocks import ManualClock

    ns = namespace()
    conn_a, conn_b = NatsConnection(nats_url), NatsConnection(nats_url)
    try:
        holder_clock, skewed_clock = ManualClock(), ManualClock()
        skewed_clock.advance(skew)
        a = NatsKvLease(conn_a, lapse=5.0, namespace=ns, clock=holder_clock)
        b = NatsKvLease(conn_b, lapse=5.0, namespace=ns, clock=skewed_clock)
        held = a.acquire(RUN, "runner-a")
        assert held is not None
        assert b.acquire(RUN, "runner-b") is None
        held = a.refresh(held)  # on time
        assert b.acquire(RUN, "runner-b") is None
        a.release(held)
        taken = b.acquire(RUN, "runner-b")
        assert taken is not None and taken.token > held.token
    finally:
        conn_a.close()
        conn_b.close()


# ---- from tests/rules/test_L_engines.py: The outbox (L4, issue #19): no run left queued for ever.


def test_L4_the_timeline_lists_runs_queued_and_unclaimed_past_the_cutoff(store: EventStoreTimeline) -> None:
    """Listed: queued (or republished) at or before the cutoff and not claimed since. Not listed:
    claimed, parked, queued after the cutoff, never queued.
    Proves ``scratchbank.domain.records.RunStarted``."""
    store.append("run-old", [RunStarted(), _queued(T0)])
    store.append("run-claimed", [RunStarted(), _queued(T0), AttemptClaimed(attempt="a1")])
    store.append("run-new", [RunStarted(), _queued(T0 + 2 * HOUR)])
    parked = OrphanSwept(at=T0, attempt="a1", parked=True, reason="unclaimed")
    store.append("run-parked", [RunStarted(), _queued(T0), parked])
    again = OrphanSwept(at=T0 + 2 * HOUR, attempt="a1", parked=False, reason="unclaimed")
    store.append("run-republished", [RunStarted(), _queued(T0), again])
    requeued = [RunStarted(), _queued(T0 - HOUR), AttemptClaimed(attempt="a1"), _queued(T0, "a2")]
    store.append("run-requeued", requeued)
    store.append("run-never", [RunStarted()])
    assert store.queued_unclaimed(T0 + HOUR) == ["run-old", "run-requeued"]
    assert store.queued_unclaimed(T0 + 3 * HOUR) == ["run-new", "run-old", "run-republished", "run-requeued"]
    assert store.queued_unclaimed(T0 - 2 * HOUR) == []


def test_L4_one_sweeper_at_a_time_the_other_changes_nothing() -> None:
    """While one runner holds the sweeper's lease, another's sweep looks at nothing.
    Proves ``scratchbank.adapters.inprocess.InProcessQueue``."""
    tl, queue, lease, clock = InMemoryTimeline(), InProcessQueue(), InProcessLease(lapse=60.0), ManualClock()
    runs = _orphans(tl, 3)
    clock.advance(4 * HOUR.total_seconds())
    held = lease.acquire(SWEEPER_KEY, "runner-a")
    assert held is not None
    listing = Listing(runs)
    before = [checksum(tl, r) for r in runs]
    b = Sweeper(lease, listing, tl, queue, "runner-b", cutoff=600.0, clock=clock).sweep_once()
    assert not b.held and listing.asked == 0
    assert [checksum(tl, r) for r in runs] == before and queue.fetch(0.01) is None
    lease.release(held)
    a = Sweeper(lease, listing, tl, queue, "runner-a", cutoff=600.0, clock=clock).sweep_once()
    assert a.held and [s.acted for s in a.swept] == [True, True, True]
    assert all(isinstance(tl.read(r)[-1], OrphanSwept) for r in runs)


def test_L4_a_sweeper_that_loses_its_lease_stops_sweeping() -> None:
    """The lease is refreshed before each run: once lost, no further run is swept.
    Proves ``scratchbank.adapters.inprocess.InProcessQueue``."""
    tl, queue, clock = InMemoryTimeline(), InProcessQueue(), ManualClock()
    runs = _orphans(tl, 4)
    clock.advance(4 * HOUR.total_seconds())
    report = Sweeper(
        LosesAfter(2), Listing(runs), tl, queue, "runner-a", cutoff=600.0, clock=clock
    ).sweep_once()  # type: ignore[arg-type]
    assert report.held and len(report.swept) == 2 and "LEASE_LOST" in report.detail
    assert [isinstance(tl.read(r)[-1], OrphanSwept) for r in runs] == [True, True, False, False]


def test_L4_C7_a_delivery_that_claims_between_the_sweepers_read_and_write_wins(tmp_path: Path) -> None:
    """The sweeper read the run queued; a runner claims and carries it on; the sweeper's record
    conflicts: it writes and publishes nothing, and the run was claimed once.
    Proves ``scratchbank.adapters.inprocess.InProcessLease``."""
    clock, actor = ManualClock(), []  # type: ignore[var-annotated]
    tl = RunsFirst(OrphanSwept, actor)
    rig = _rig_with_lost_publication(tmp_path, tl, clock)
    actor.append(delivery_actor(rig, "run-1", "a1"))
    report = sweeper_actor(tl, rig.queue, InProcessLease(), Listing(["run-1"]), cutoff=600.0, clock=clock)()
    assert report.held and [s.acted for s in report.swept] == [False]
    records = tl.read("run-1")
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert not [r for r in records if isinstance(r, OrphanSwept)]
    assert rig.queue.fetch(0.05) is None  # nothing republished


def test_L4_C7_a_sweep_between_a_deliverys_admission_and_its_claim_claims_once(tmp_path: Path) -> None:
    """A runner admitted the delivery; the sweeper republishes before its claim lands: the claim
    conflicts and is read again (redelivered); the republication claims; the run is claimed once
    and every later delivery of the attempt applies nothing.
    Proves ``scratchbank.adapters.inprocess.InProcessLease``."""
    clock, actor = ManualClock(), []  # type: ignore[var-annotated]
    tl = RunsFirst(AttemptClaimed, actor)
    rig = _rig_with_lost_publication(tmp_path, tl, clock)
    actor.append(
        sweeper_actor(tl, rig.queue, InProcessLease(), Listing(["run-1"]), cutoff=600.0, clock=clock)
    )
    first = delivery_actor(rig, "run-1", "a1")()
    assert first.handled is Handled.REDELIVER, first.detail
    republished = rig.runner().run_once(1)
    assert republished is not None and republished.handled is Handled.RAN, republished.detail
    assert republished.delivery.republished == 1
    late = delivery_actor(rig, "run-1", "a1")()
    assert late.handled is Handled.DONE, late.detail
    records = tl.read("run-1")
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert [r.parked for r in records if isinstance(r, OrphanSwept)] == [False]


def test_L4_a_run_whose_publication_failed_is_found_by_the_outbox_and_carried_on(tmp_path: Path) -> None:
    """queue_resume appended attempt_queued, then its publication failed (QUEUE_UNAVAILABLE): the
    timeline lists the run past the cutoff, the sweeper publishes it again, a runner claims it."""
    from scratchbank.adapters.memory import InMemoryBankStore
    from scratchbank.application.service import ScratchService
    from scratchbank.domain.errors import QueueUnavailable
    from scratchbank.domain.resume_gate import ResumeRequest

    clock = ManualClock()
    tl = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    try:
        tl.append("run-1", [RunStarted()])
        down = ScratchService(tl, InMemoryBankStore(), clock=clock, queue=DownQueue())
        with pytest.raises(QueueUnavailable):
            down.queue_resume("run-1", ResumeRequest(), attempt="a1")
        rig = make_rig(tmp_path, tl)
        assert tl.queued_unclaimed(clock.now()) == ["run-1"]
        clock.advance(600.0)
        report = sweeper_actor(tl, rig.queue, InProcessLease(), tl, cutoff=600.0, clock=clock)()
        assert [s.acted for s in report.swept] == [True]
        handled = rig.runner().run_once(1)
        assert handled is not None and handled.handled is Handled.RAN, handled.detail
        assert [r.attempt for r in tl.read("run-1") if isinstance(r, AttemptClaimed)] == ["a1"]
        assert tl.queued_unclaimed(clock.now()) == []
    finally:
        tl.close()


# ---- from tests/rules/test_L_engines.py: The outbox on real servers (issue #19): runner processes sweep the runs the timeline lists as queued and unclaimed, one sweeper at a time, through a NATS restart.


@pytest.mark.postgres
def test_L4_the_sweeper_under_two_runner_processes_publishes_each_lost_run_once(swept: Swept) -> None:
    """Two runner processes, each sweeping on its schedule: every run whose publication was
    lost is published again exactly once (one orphan_swept), claimed and carried on.
    Proves ``scratchbank.domain.records.RunStarted``."""
    c = swept
    runs = sorted(orphan(c) for _ in range(4))
    _, a_log = c.runner("a", **SWEEP)
    _, b_log = c.runner("b", **SWEEP)
    for run in runs:
        wait_for(paused(c, run), "the swept run is carried on to its park", c, run)
    assert_swept_once_and_carried_on(c, runs)
    assert acted(a_log, b_log) == runs
    sweeps = [e for log in (a_log, b_log) for e in events(log) if e["event"] == "sweep"]
    assert {e["holder"] for e in sweeps} <= {"a", "b"}
    show(c, runs[0], a_log, b_log)


@pytest.mark.postgres
def test_L4_a_NATS_restart_during_a_sweep_leaves_no_run_queued(swept: Swept) -> None:
    """The sweep is held mid-way (a run's row locked), NATS restarts, the lock goes: the sweep
    goes on or the next one does; every run is published again once and carried on.
    Proves ``scratchbank.domain.records.RunStarted``."""
    import psycopg

    c = swept
    runs = sorted(orphan(c, f"run-{i}-{uuid.uuid4().hex[:6]}") for i in range(5))
    held = psycopg.connect(c.db)  # a transaction that holds the third run's next version
    held.execute(
        "INSERT INTO stored_events (originator_id, originator_version, topic, state) VALUES (%s, 3, 'x', '')",
        (runs[2],),
    )
    try:
        _, log = c.runner("a", **SWEEP)
        wait_for(lambda: _waiting_on_a_lock(c), "the sweep waits on the third run", c, runs[2])
        c.nats.stop()
        wait_for(lambda: not c.nats.answers(), "the server is down", c, None)  # the runner's connection drops
        c.nats.start()
    finally:
        held.rollback()
        held.close()
    for run in runs:
        wait_for(paused(c, run), "every run is carried on to its park", c, run)
    assert_swept_once_and_carried_on(c, runs)
    show(c, runs[2], log)
