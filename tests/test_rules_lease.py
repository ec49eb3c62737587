"""The run's lease while banking (L1-L5): ceilings, back-off, sweeper cutoff, the keeper.

The figures the tests hold the code to are the ADR's (RULES.md L3, L4): 56 minutes,
31 of them the storage bank's, and 2 h 30; the back-off shape is read from L4's text.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from pathlib import Path

import attrs
from nats_server import NatsServer
from nats_server import namespace as nats_namespace
from runner_rigs import make_rig, queue_resume
from waiting import NeverHappened, eventually

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsKvLease
from scratchbank.adapters.sandbox_provider import OWNER, LocalSandboxProvider
from scratchbank.adapters.scripted import BANK, Exec
from scratchbank.adapters.watchdog import Watchdog
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.lease_keeper import LeaseKeeper
from scratchbank.application.ports import Sandbox, SystemClock
from scratchbank.application.runner import Handled, Handling, Runner
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
from scratchbank.domain.objects import BankStamp
from scratchbank.domain.records import LeaseTaken, NodeFinished, RunStarted, ScratchBanked
from scratchbank.testing.builders import banked, started
from scratchbank.testing.clocks import ManualClock

B, T = HoldBudgets(), LeaseTiming()
MIN = 60.0


def test_L3_unwind_ceiling_is_56_minutes_with_the_defaults() -> None:
    """Both ceilings together: 56 minutes, of which the 31-minute storage bank is most."""
    assert unwind_ceiling(B) == 56 * MIN
    assert teardown_ceiling(B) + post_engine_ceiling(B) == unwind_ceiling(B)
    assert B.storage_bank == 31 * MIN
    assert B.storage_bank > unwind_ceiling(B) / 2


def test_L3_ceiling_follows_each_budget() -> None:
    """Raising any one budget raises the ceiling by as much."""
    for field in attrs.fields(HoldBudgets):
        bigger = attrs.evolve(B, **{field.name: getattr(B, field.name) + 7})
        assert unwind_ceiling(bigger) == unwind_ceiling(B) + 7, field.name


def test_L4_backoff_halves_from_one_interval_to_ceiling_plus_lapse() -> None:
    """First delay one lease interval, last the whole ceiling plus the lapse, each half the next."""
    delays = backoff_delays(B, T)
    assert delays[0] == T.interval
    assert delays[-1] == unwind_ceiling(B) + T.lapse
    for shorter, longer in itertools.pairwise(delays[1:]):
        assert shorter * 2 == longer
    assert delays[1] / 2 <= T.interval < delays[1]


def test_L4_the_last_retry_outwaits_a_whole_hold() -> None:
    """A delivery meeting a hold just taken still finds it gone at its last retry."""
    assert delay_for(max_deliveries(B, T) - 1, B, T) == unwind_ceiling(B) + T.lapse
    assert delay_for(max_deliveries(B, T), B, T) is None
    assert delay_for(1, B, T) == T.interval


def test_L4_sweeper_cutoff_is_2h30_with_the_defaults() -> None:
    """Every delivery at its rank's longest delay (its back-off plus an ack wait)."""
    assert sweeper_cutoff(B, T) == 150 * MIN
    longest = sum(backoff_delays(B, T)) + max_deliveries(B, T) * T.ack_wait
    assert longest <= sweeper_cutoff(B, T) < longest + MIN


def test_L2_teardown_ceiling_counts_from_a_cancellation_to_the_engine_return() -> None:
    """No ceiling while the engine runs uncancelled; past teardown + margin once cancelled."""
    assert past_ceiling(HoldClock(), 10_000.0, B) is None
    cancelled = HoldClock(cancelled_at=0.0)
    assert past_ceiling(cancelled, teardown_ceiling(B), B) is None
    assert past_ceiling(cancelled, teardown_ceiling(B) + 1, B) == "teardown ceiling"


def test_L2_post_engine_ceiling_is_armed_only_when_a_resume_can_wait() -> None:
    """An engine that returned an error arms it; a finished run's bank runs to its own budget."""
    parked = HoldClock(engine_returned_at=0.0, resume_can_wait=True)
    assert past_ceiling(parked, post_engine_ceiling(B) + 1, B) == "post-engine ceiling"
    assert past_ceiling(parked, post_engine_ceiling(B), B) is None
    finished = HoldClock(engine_returned_at=0.0, resume_can_wait=False)
    assert past_ceiling(finished, 10 * unwind_ceiling(B), B) is None


def _short(lapse: float = 0.3) -> tuple[InProcessLease, HoldBudgets, LeaseTiming]:
    return InProcessLease(lapse=lapse), HoldBudgets(), LeaseTiming(interval=0.05, lapse=lapse)


def test_L1_keeper_refreshes_through_the_hold() -> None:
    """While kept, the lease outlives its lapse many times over: nobody else can take it."""
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
    """The post-engine ceiling passes: the lease is released and the run context cancelled."""
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
    """The lease lapsed and was taken: the refresh fails and the run context is cancelled."""
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


# ---- L5: the bank in flight stops; what does not ride the run context still lands ----


class StuckArchive(LocalSandbox):
    """A real local sandbox whose tar blocks until cut (a hung filesystem); it says when
    the archive is running and counts the continues (T14)."""

    def __init__(self, root: Path | None = None) -> None:
        super().__init__(root)
        self.continues = 0

    def execute(self, exec_: Exec) -> ExecResult:
        source = exec_.source
        if source == BANK:  # quiesced for real; the marker is written where tar would start
            tar = 'archive_scratch "$1" "$2" "$verify"'
            source = source.replace(tar, f"touch {self.root}/archiving; exec sleep 1000\n{tar}")
            assert source != BANK
        return super().execute(attrs.evolve(exec_, source=source))

    def wait_archiving(self, bound: float = 30.0) -> bool:
        try:
            return eventually((self.root / "archiving").exists, timeout=bound, interval=0.02)
        except NeverHappened:
            return False

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        super().continue_processes(deadline=deadline)
        self.continues += 1


def _states(box: LocalSandbox) -> list[str]:
    """The state letter of every process in the sandbox (after the last ") ")."""
    out = box.run("cat /proc/[0-9]*/stat 2>/dev/null", []).stdout.decode(errors="replace")
    return [line.rsplit(") ", 1)[1].split()[0] for line in out.splitlines() if ") " in line]


def test_L5_T14_a_teardown_whose_lease_is_lost_mid_archive_stops_and_still_continues_processes() -> None:
    """The run context is cut while tar runs: the exec is cut at once (the banking budget is an
    hour), nothing is stored or recorded, the sandbox is left, and its processes run again."""
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
        assert report.quiesce is not None and report.quiesce.quiesced
        assert box.continues == 1 and "T" not in _states(box)  # T14: continued all the same
    finally:
        box.destroy()


class CutAfterPut(InMemoryBankStore):
    """The lease is lost the moment the upload lands: the bank reached the store."""

    def __init__(self, cancel: Cancel) -> None:
        super().__init__()
        self.cancel = cancel

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        name = super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)
        self.cancel.cut("past the post-engine ceiling: the lease was let go (L5)")
        return name


def test_L5_T7_a_bank_that_reached_the_store_before_the_cut_is_still_recorded() -> None:
    """The record does not ride the run context: a stored bank is recorded (the fence alone
    refuses it once a newer holder wrote), and the sandbox is not left."""
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
    """The lease was let go before the teardown began: nothing runs, nothing is written."""
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
    """A deadline riding the run context has passed once cut; a watchdog armed on it fires."""
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


class StuckProvider(LocalSandboxProvider):
    """Runner A's sandboxes: their tar blocks until cut."""

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        root = self.base / f"{run_id}-{uuid.uuid4().hex[:8]}"
        sandbox = StuckArchive(root)
        init = sandbox._init.pid if sandbox._init is not None else None
        (root / OWNER).write_text(json.dumps({"run": run_id, "init": init}))
        self.started.append(sandbox)
        return sandbox


def test_L5_a_runner_past_its_ceiling_lets_go_and_a_second_runner_takes_over(tmp_path: Path) -> None:
    """On a real NATS KV lease (lapse 60 s): runner A parks the run, its bank hangs past the
    post-engine ceiling; A lets the lease go and leaves the sandbox. Runner B takes the lease
    at once, banks what A left, and carries the run on with that scratch restored."""
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


def run_bounded(runner: Runner) -> Handling:
    """One delivery on a thread, joined with a generous bound (a hang fails, not a timing)."""
    out: list[Handling | None] = []
    worker = threading.Thread(target=lambda: out.append(runner.run_once(5)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the runner did not let go: its bank was never cut"
    assert out and out[0] is not None
    return out[0]


# ---- the keeper waits on its clock (issue 25, build item 0): no real sleeping ----


def test_L1_the_keeper_refreshes_on_its_clock_not_on_real_time() -> None:
    """Driven by a ManualClock: one refresh per interval the clock passes, none between."""
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
    """The post-engine ceiling passes on the ManualClock: the run context is cut, no sleeping."""
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
