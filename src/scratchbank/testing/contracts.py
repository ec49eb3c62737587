"""Contract suites for the ports: subclass one per adapter, define ``make``, let pytest run it.

Every adapter we ship (fakes included) passes these; an engine writing its own
Timeline, BankStore, Sandbox, RunLock or RestoreTarget subclasses the same class to prove
it behaves the same.
Function-style checkers do the same for a test that already has an adapter in hand:
``check_timeline(make)``, ``check_bank_store(make, tmp)`` and ``check_stall(call)`` ("a
stalled call fails in time"), with ``check_sandbox_stalls(sandbox)`` running the
stalls every scripted sandbox transport must survive.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import tarfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.host_archive import HostArchive
from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.bank_format.reader import TarReader
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.ports import (
    BankStore,
    ForwardingBankStore,
    QuiescedArchive,
    RestoresInOneExec,
    RestoreTarget,
    RunLock,
    Sandbox,
    StagedRestore,
    StoredBank,
    Timeline,
    quiesce_and_archive,
)
from scratchbank.domain.errors import (
    ArchiveFailed,
    BankGone,
    BankReadFailed,
    BankWriteFailed,
    ExecFailed,
    HostileArchive,
    InvalidBankObject,
    InvalidRunId,
    LockLost,
    SandboxGone,
    ScratchbankError,
    StreamBroken,
    TimelineConflict,
    TimelineUnreadable,
)
from scratchbank.domain.fold import Bank, Evidence
from scratchbank.domain.objects import UNREFERENCED_AGE, BankStamp, StoredObject, listed_now, object_name
from scratchbank.domain.records import ScratchBanked, UnknownRecord
from scratchbank.domain.restore import RestoreAttempt, RestoreResult
from scratchbank.domain.resume_gate import ResumeDecision, Verdict
from scratchbank.testing.builders import banked, node, started

HOSTILE_IDS = ("../etc", "a/b", "", ".", "..", "a\x00b", "/abs", "x" * 200)


class TimelineContract:
    """What every Timeline does. Subclasses define ``make(self) -> Timeline``."""

    def make(self) -> Timeline:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_a_new_run_reads_empty(self) -> None:
        assert tuple(self.make().read("run-new")) == ()

    def test_records_read_back_in_order_unknown_types_kept(self) -> None:
        t = self.make()
        recs = [started(), UnknownRecord(type="llm_usage", data={"n": 1}), banked(), node("a")]
        assert t.append("run-1", recs[:2]) == 2
        assert t.append("run-1", recs[2:], expected=2) == 4
        assert tuple(t.read("run-1")) == tuple(recs)
        assert tuple(t.read("run-2")) == ()

    def test_append_with_a_stale_expectation_is_a_named_conflict(self) -> None:
        t = self.make()
        t.append("run-1", [started()])
        with pytest.raises(TimelineConflict):
            t.append("run-1", [node("a")], expected=0)
        assert len(t.read("run-1")) == 1

    def test_racing_writers_exactly_one_wins(self) -> None:
        t = self.make()
        t.append("run-r", [started()])
        results: list[Any] = []
        barrier = threading.Barrier(4)

        def writer(i: int) -> None:
            barrier.wait()
            try:
                results.append(t.append("run-r", [node(f"w{i}")], expected=1))
            except TimelineConflict as error:
                results.append(error)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(r for r in results if isinstance(r, int)) == [2]
        assert sum(isinstance(r, TimelineConflict) for r in results) == 3
        assert len(t.read("run-r")) == 2

    def test_appends_without_expectation_never_lose_a_record(self) -> None:
        t = self.make()
        threads = [threading.Thread(target=lambda i=i: t.append("run-m", [node(f"n{i}")])) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(t.read("run-m")) == 6

    def test_hostile_run_ids_are_refused(self) -> None:
        t = self.make()
        for bad in HOSTILE_IDS:
            with pytest.raises(InvalidRunId):
                t.read(bad)
            with pytest.raises(InvalidRunId):
                t.append(bad, [started()])


def _archive(tmp: Path, payload: bytes, name: str = "a.tgz") -> tuple[Path, str]:
    path = tmp / name
    path.write_bytes(payload)
    return path, hashlib.sha256(payload).hexdigest()


STAMPED_AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _stamp(run_id: str, execution: str, payload: bytes) -> BankStamp:
    return BankStamp(
        run_id, execution, len(payload), hashlib.sha256(payload).hexdigest(), "m" * 64, STAMPED_AT
    )


class BankStoreContract:
    """What every BankStore that keeps banks does (A17, ADR 0006). Subclasses define
    ``make(self, tmp)``."""

    def make(self, tmp: Path) -> BankStore:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_put_then_fetch_returns_the_same_bytes_and_digest(self, tmp_path: Path) -> None:
        """A put names its object by content; a fetch of that name gives back its bytes."""
        store = self.make(tmp_path)
        payload = bytes(range(256)) * 4096 + b"tail"
        path, digest = _archive(tmp_path, payload)
        name = store.put("run-1", path, sha256=digest)
        assert name == object_name(digest)
        out = io.BytesIO()
        got = store.fetch("run-1", out, max_bytes=1 << 30, name=name)
        assert (got.bytes, got.sha256) == (len(payload), digest)
        assert out.getvalue() == payload

    def test_A17_a_put_never_replaces_another_bank(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """Two puts of different content: two objects, each fetchable as it was put."""
        store = self.make(tmp_path)
        names = {}
        for payload in (b"first" * 100, b"second"):
            path, digest = _archive(tmp_path, payload)
            names[payload] = store.put("run-1", path, sha256=digest)
        for payload, name in names.items():
            out = io.BytesIO()
            store.fetch("run-1", out, max_bytes=1 << 20, name=name)
            assert out.getvalue() == payload
        assert store.stat("run-1") is None  # nothing written at the legacy key

    def test_A17_a_put_of_the_same_content_is_idempotent_and_keeps_its_first_stamp(  # noqa: N802 - named for its rule
        self, tmp_path: Path
    ) -> None:
        """Create-only: the same name is the same content; the first put's stamp stays."""
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"same" * 50)
        first = store.put("run-1", path, sha256=digest, stamp=_stamp("run-1", "@1", b"same" * 50))
        again = store.put("run-1", path, sha256=digest, stamp=_stamp("run-1", "@7", b"same" * 50))
        assert first == again
        listed = list(store.objects("run-1"))
        assert [(o.name, o.bytes) for o in listed] == [(first, 200)]
        assert listed[0].stamp == _stamp("run-1", "@1", b"same" * 50)

    def test_A17_a_put_says_it_created_its_object_only_when_it_did(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """A ``Placed`` answer with ``created`` is this put's create: a second put of the
        same content never says so (a teardown trusts it to skip A17's look; issue 26).
        A listing given the names may leave their stamps out, never the names or sizes."""
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"once" * 50)
        first = store.put("run-1", path, sha256=digest, stamp=_stamp("run-1", "@1", b"once" * 50))
        again = store.put("run-1", path, sha256=digest, stamp=_stamp("run-1", "@2", b"once" * 50))
        assert not getattr(again, "created", False)
        listed = store.objects("run-1", named={first})
        assert [(o.name, o.bytes) for o in listed] == [(first, 200)]

    def test_N3_objects_list_a_runs_banks_with_their_stamps(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """The listing names each object of the run with the stamp it was put with."""
        store = self.make(tmp_path)
        assert list(store.objects("run-1")) == []
        path, digest = _archive(tmp_path, b"one")
        stamp = _stamp("run-1", "@3", b"one")
        name = store.put("run-1", path, sha256=digest, stamp=stamp)
        other, odigest = _archive(tmp_path, b"two", "b.tgz")
        store.put("run-2", other, sha256=odigest)
        listed = store.objects("run-1")
        assert [attrs.evolve(o, stored_at=None) for o in listed] == [StoredObject(name, 3, stamp)]
        assert store.stat("run-1", name) == StoredBank(3, digest)

    def test_A17_objects_are_timed_by_the_store_never_by_their_writer(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """A listing says when the store created each bank object and what time the store
        says it is (``Listing.now``), both by the store's clock: a fresh object is under
        the bound's age, whatever its writer's stamp says (A17's bound ages by these; issue 26)."""
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"timed")
        stamp = attrs.evolve(_stamp("run-1", "@3", b"timed"), at=datetime(2001, 1, 1, tzinfo=UTC))
        name = store.put("run-1", path, sha256=digest, stamp=stamp)
        listed = store.objects("run-1")
        now = listed_now(listed)
        assert now is not None, "the listing carries the store's time (Listing.now)"
        [found] = listed
        assert (found.name, found.stamp) == (name, stamp)
        assert found.stored_at is not None
        # the store's clock at both ends (S3's Date has whole seconds, LastModified finer)
        assert timedelta(seconds=-1) <= now - found.stored_at < UNREFERENCED_AGE
        again = store.put("run-1", path, sha256=digest, stamp=_stamp("run-1", "@4", b"timed"))
        assert again == name
        assert [o.stored_at for o in store.objects("run-1")] == [found.stored_at]  # not re-created

    def test_A17_a_put_whose_file_is_not_its_digest_is_refused(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """A put never stores bytes under a name that is not theirs; nothing is left."""
        store = self.make(tmp_path)
        path, _digest = _archive(tmp_path, b"actual")
        with pytest.raises(BankWriteFailed):
            store.put("run-1", path, sha256=hashlib.sha256(b"claimed").hexdigest())
        assert list(store.objects("run-1")) == []

    def test_A17_names_outside_the_bank_prefix_are_refused(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        """A hostile record's object name never addresses anything but a bank object."""
        store = self.make(tmp_path)
        for bad in (
            "../run-2/banks/" + "a" * 64 + ".tgz",
            "banks/../x.tgz",
            "scratch.tgz",
            "banks/A.tgz",
            "",
        ):
            with pytest.raises(InvalidBankObject):
                store.fetch("run-1", io.BytesIO(), max_bytes=10, name=bad)
            with pytest.raises(InvalidBankObject):
                store.delete("run-1", bad)
            with pytest.raises(InvalidBankObject):
                store.stat("run-1", bad)

    def test_missing_bank_is_gone(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        with pytest.raises(BankGone):
            store.fetch("run-none", io.BytesIO(), max_bytes=10)
        with pytest.raises(BankGone):
            store.fetch("run-none", io.BytesIO(), max_bytes=10, name=object_name("0" * 64))

    def test_delete_removes_one_object_and_sweep_all_both_idempotent(self, tmp_path: Path) -> None:
        """delete: that object only; sweep: every object of the run."""
        store = self.make(tmp_path)
        kept, kdigest = _archive(tmp_path, b"kept", "k.tgz")
        keep = store.put("run-1", kept, sha256=kdigest)
        path, digest = _archive(tmp_path, b"x" * 10)
        name = store.put("run-1", path, sha256=digest)
        store.delete("run-1", name)
        store.delete("run-1", name)
        with pytest.raises(BankGone):
            store.fetch("run-1", io.BytesIO(), max_bytes=100, name=name)
        store.fetch("run-1", io.BytesIO(), max_bytes=100, name=keep)
        store.sweep("run-1")
        store.sweep("run-1")
        with pytest.raises(BankGone):
            store.fetch("run-1", io.BytesIO(), max_bytes=100, name=keep)
        assert list(store.objects("run-1")) == []

    def test_runs_do_not_share_banks(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"mine")
        name = store.put("run-a", path, sha256=digest)
        store.sweep("run-b")
        with pytest.raises(BankGone):
            store.fetch("run-b", io.BytesIO(), max_bytes=100, name=name)
        store.fetch("run-a", io.BytesIO(), max_bytes=100, name=name)

    def test_fetch_past_the_cap_is_refused(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"z" * 5000)
        name = store.put("run-1", path, sha256=digest)
        with pytest.raises(HostileArchive):
            store.fetch("run-1", io.BytesIO(), max_bytes=4999, name=name)

    def test_hostile_run_ids_are_refused(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"x")
        for bad in HOSTILE_IDS:
            with pytest.raises(InvalidRunId):
                store.put(bad, path, sha256=digest)
            with pytest.raises(InvalidRunId):
                store.fetch(bad, io.BytesIO(), max_bytes=10)
            with pytest.raises(InvalidRunId):
                store.objects(bad)


def _run_contract(contract: object, *args: Any) -> list[str]:
    """Run every ``test_*`` method of a contract instance; the names of those that ran."""
    ran = []
    for name in sorted(dir(contract)):
        if name.startswith("test_"):
            getattr(contract, name)(*args)
            ran.append(name)
    return ran


def check_timeline(make: Callable[[], Timeline]) -> list[str]:
    """Run the Timeline contract against ``make()`` (a fresh, empty timeline each call).

    Raises AssertionError (or the adapter's own error) on the first clause it breaks;
    returns the clauses it passed.
    """

    class _Bound(TimelineContract):
        def make(self) -> Timeline:
            return make()

    return _run_contract(_Bound())


def check_bank_store(make: Callable[[Path], BankStore], tmp: Path) -> list[str]:
    """Run the BankStore contract against ``make(folder)`` (a fresh store each call);
    each clause gets a fresh folder under ``tmp``. Returns the clauses it passed."""

    class _Bound(BankStoreContract):
        def make(self, tmp: Path) -> BankStore:
            return make(tmp)

    contract, ran = _Bound(), []
    for name in sorted(n for n in dir(contract) if n.startswith("test_")):
        folder = tmp / name
        folder.mkdir(parents=True, exist_ok=True)
        getattr(contract, name)(folder)
        ran.append(name)
    return ran


# ---- Sandboxes ---------------------------------------------------------------------


class SandboxContract:
    """What every Sandbox does, from banking's side (T2, T11-T15, T19) and restoring's
    (X1: a banked scratch comes back as it was; X4: a discarded restore changes nothing).

    Subclasses define ``sandbox`` (a context manager yielding a fresh sandbox with an
    empty scratch) and ``write`` (put files in its scratch; a name with ``/`` creates
    its directories). Optional, each skipping what needs it: ``kill`` (make the
    sandbox gone), ``start_workload`` and ``stopped`` (a process the quiesce stops, and
    whether any process is stopped), ``unquiescable`` (leave a process the quiesce can
    neither stop nor check), ``refusing`` (make the quiesce refuse), ``break_scratch``
    (make tar fail on the scratch).
    """

    def sandbox(self) -> contextlib.AbstractContextManager[Sandbox]:  # pragma: no cover - abstract
        raise NotImplementedError

    def write(self, sandbox: Sandbox, files: dict[str, bytes]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def kill(self, sandbox: Sandbox) -> None:
        pytest.skip("this sandbox cannot be made gone in a test")

    def start_workload(self, sandbox: Sandbox) -> None:
        """Start a process the quiesce can stop (default: none)."""

    def stopped(self, sandbox: Sandbox) -> bool | None:
        """Is any process of the sandbox stopped? None: this contract cannot tell."""
        return None

    def unquiescable(self, sandbox: Sandbox) -> None:
        pytest.skip("this sandbox cannot be left partly quiesced in a test")

    def refusing(self, sandbox: Sandbox) -> None:
        pytest.skip("this sandbox's quiesce cannot be made to refuse in a test")

    def break_scratch(self, sandbox: Sandbox) -> None:
        pytest.skip("this sandbox's tar cannot be made to fail in a test")

    def _bank_pass(self, box: Sandbox, sink: io.BytesIO | None = None) -> QuiescedArchive:
        return quiesce_and_archive(
            box, sink if sink is not None else io.BytesIO(), budget_seconds=30, wait_seconds=2, compress=False
        )

    FILES: ClassVar[dict[str, bytes]] = {
        "verify.sh": b"#!/bin/sh\nexit 0\n",
        "clone/src/main.c": b"int main(){}\n" * 100,
    }

    def test_T2_archive_streams_every_file_and_directory_as_a_tar(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            sink = io.BytesIO()
            report = box.archive(sink, compress=False, verify=False)
            assert not report.empty
            assert report.raced == ()
            with tarfile.open(fileobj=io.BytesIO(sink.getvalue()), mode="r:") as tar:
                members = {m.name.removeprefix("./"): m for m in tar if m.name not in (".", "./")}
                data = {n: tar.extractfile(m).read() for n, m in members.items() if m.isfile()}  # type: ignore[union-attr]
        assert data == self.FILES
        assert members["clone"].isdir()
        assert members["clone/src"].isdir()

    def test_T2_the_host_archive_holds_the_manifest_teardown_records(self, tmp_path: Path) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            sink = HostArchive(tmp_path / "a.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30)
            box.archive(sink, compress=False, verify=True)
            facts = sink.finish()
        assert not facts.refused
        assert facts.manifest is not None
        assert facts.manifest.entries == len(self.FILES) + 2  # two files, clone/, clone/src/
        assert facts.manifest.bytes == sum(map(len, self.FILES.values()))
        assert hashlib.sha256((tmp_path / "a.tgz").read_bytes()).hexdigest() == facts.sha256

    def test_T2_T4_an_empty_scratch_archives_as_empty(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            sink = io.BytesIO()
            assert box.archive(sink, compress=False, verify=False).empty

    def test_T14_quiesce_reports_and_continue_is_idempotent(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            report = box.quiesce(budget_seconds=30, wait_seconds=2)
            assert report.quiesced or report.refused or report.reasons
            box.continue_processes()
            box.continue_processes()

    def test_T11_T14_quiesce_and_archive_then_nothing_stays_stopped(self) -> None:  # noqa: N802 - named for its rule
        """One quiesced pass archives every file; a sandbox with its own call continues the
        processes itself after a clean pass, else they stay stopped for the caller."""
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            self.start_workload(box)
            sink = io.BytesIO()
            done = self._bank_pass(box, sink)
            assert done.failure is None
            assert done.archive is not None
            assert not done.archive.empty
            assert _files(sink.getvalue()) == self.FILES
            report = done.quiesce
            assert report.quiesced or report.refused or report.reasons
            if report.quiesced and done.archive.raced == ():
                assert done.continued is hasattr(box, "quiesce_and_archive")
            if not done.continued:
                assert self.stopped(box) is not False or not report.quiesced
                box.continue_processes()
            assert self.stopped(box) is not True

    def test_T13_quiesce_and_archive_reports_a_partial_quiesce_and_archives(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            self.unquiescable(box)
            done = self._bank_pass(box)
            assert not done.quiesce.quiesced
            assert not done.quiesce.refused
            assert done.quiesce.reasons
            assert done.archive is not None
            assert not done.archive.empty
            if not done.continued:
                box.continue_processes()
            assert self.stopped(box) is not True

    def test_T12_quiesce_and_archive_reports_a_refusal_and_leaves_nothing_stopped(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            self.refusing(box)
            done = self._bank_pass(box)
            assert done.quiesce.refused
            assert not done.quiesce.quiesced
            assert done.quiesce.reasons
            assert done.archive is not None
            assert not done.archive.empty
            assert done.continued
            assert self.stopped(box) is not True

    def test_T14_a_failing_archive_reports_the_quiesce_and_leaves_continue_to_the_caller(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            self.start_workload(box)
            self.break_scratch(box)
            done = self._bank_pass(box)
            assert done.archive is None
            assert isinstance(done.failure, ArchiveFailed)
            assert done.quiesce.quiesced, done.quiesce
            assert not done.continued
            assert self.stopped(box) is not False
            box.continue_processes()
            assert self.stopped(box) is not True

    def test_T19_a_gone_sandbox_raises_sandbox_gone(self) -> None:  # noqa: N802 - named for its rule
        with self.sandbox() as box:
            self.write(box, {"f": b"x"})
            self.kill(box)
            with pytest.raises(SandboxGone):
                box.archive(io.BytesIO(), compress=False, verify=False)

    def test_X1_a_banked_scratch_restores_as_it_was(self) -> None:  # noqa: N802 - named for its rule
        """Banked by the teardown use case, restored by the resume use case, through this
        adapter alone: the scratch lists as it did when it was banked (X1, T2)."""
        from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
        from scratchbank.application.resume import resume
        from scratchbank.application.teardown import bank_at_teardown
        from scratchbank.domain import ResumeRequest

        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            before = box.list_scratch()
            timeline, store = InMemoryTimeline(), InMemoryBankStore()
            timeline.append("run-c", [started()])
            report = bank_at_teardown(
                "run-c", timeline=timeline, store=store, sandbox=box, run_finished=False
            )
            assert report.record.banked, report
            self.write(box, {"after-the-bank": b"x"})
            out = resume("run-c", ResumeRequest(), timeline=timeline, store=store, sandbox=box)
            assert out.proceeds, out
            assert box.list_scratch() == before

    def test_X4_a_discarded_restore_leaves_the_scratch_as_it_was(self) -> None:  # noqa: N802 - named for its rule
        """A host verdict of discard (restore_in_one_exec's ``decide`` answering None, or
        the two phases' discard_restore) leaves the scratch listing as it was and nothing
        staged (a second discard is harmless)."""
        with self.sandbox() as box:
            self.write(box, dict(self.FILES))
            before = box.list_scratch()
            bank = io.BytesIO()
            with tarfile.open(fileobj=bank, mode="w", format=tarfile.PAX_FORMAT) as tar:
                info = tarfile.TarInfo("other")
                info.size = 3
                tar.addfile(info, io.BytesIO(b"new"))
            if isinstance(box, RestoresInOneExec):
                seen: list[StagedRestore] = []
                verdict = box.restore_in_one_exec(
                    io.BytesIO(bank.getvalue()),
                    compressed=False,
                    need_bytes=3,
                    decide=lambda s, _: seen.append(s),
                )
                assert verdict is None
                assert len(seen) == 1
            else:
                staged = box.stage_restore(
                    io.BytesIO(bank.getvalue()), compressed=False, listing=io.BytesIO()
                )
                box.discard_restore(staged)
                box.discard_restore(staged)
            assert box.list_scratch() == before


def _files(tar_bytes: bytes) -> dict[str, bytes]:
    """The regular files of a plain tar stream, by name without "./"."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


# ---- Stalls: a stalled call fails in time ------------------------------------------

#: What a stalled call may raise: every one names the transport's failure.
STALL_ERRORS: tuple[type[ScratchbankError], ...] = (StreamBroken, ExecFailed, BankReadFailed, BankWriteFailed)


def check_stall(
    call: Callable[[Deadline], object],
    *,
    seconds: float = 2.0,
    grace: float = 5.0,
    expect: tuple[type[BaseException], ...] = STALL_ERRORS,
) -> float:
    """A stalled call fails in time: ``call(deadline)`` (the test arranges that it stalls)
    must raise one of ``expect`` no later than ``seconds + grace`` after it started.

    The call runs in a thread, so one that never returns fails the check instead of
    hanging the suite. Returns how long the call took, in seconds.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            call(Deadline.after(seconds))
            outcome["returned"] = True
        except BaseException as error:
            outcome["error"] = error
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds + grace)
    assert not thread.is_alive(), f"the stalled call was still running {seconds + grace:.1f} s later"
    assert "error" in outcome, "the stalled call returned as if it had succeeded"
    assert isinstance(outcome["error"], expect), f"raised {outcome['error']!r}, not one of {expect}"
    took: float = outcome["took"]
    return took


class StalledSource:
    """A stream that gives ``first`` bytes, then blocks until released (a stalled upload)."""

    def __init__(self, first: int = 1 << 16) -> None:
        self.left = first
        self.released = threading.Event()

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            self.released.wait(120)
            return b""
        chunk = min(self.left, n if n > 0 else self.left)
        self.left -= chunk
        return b"\0" * chunk


class FailingSource:
    """A stream that gives ``first`` bytes, then fails (a bank read that broke midway)."""

    def __init__(self, first: int = 1 << 16) -> None:
        self.left = first

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            raise OSError(5, "the source broke midway")
        chunk = min(self.left, n if n > 0 else self.left)
        self.left -= chunk
        return b"\0" * chunk


def check_sandbox_stalls(sandbox: Any, *, seconds: float = 2.0, grace: float = 5.0) -> dict[str, float]:
    """The stalls every scripted transport must survive, each failing in time by name:

    - an exec that hangs (ExecFailed at its deadline),
    - a stream out that stops mid-transfer (StreamBroken at its deadline),
    - a stream in whose source stalls (StreamBroken at its deadline),
    - a stream in whose source fails (StreamBroken at once: the writer's error is raised).

    ``sandbox`` is a ``ScriptedSandbox`` (its ``run`` takes a ``deadline``). Returns the
    time each took.
    """
    times: dict[str, float] = {}
    stalled = StalledSource()
    try:
        times["exec hangs"] = check_stall(
            lambda d: sandbox.run("sleep 1000", [], deadline=d),
            seconds=seconds,
            grace=grace,
            expect=(ExecFailed,),
        )
        times["stream out stalls"] = check_stall(
            lambda d: sandbox.run("head -c 65536 /dev/zero; sleep 1000", [], stdout=io.BytesIO(), deadline=d),
            seconds=seconds,
            grace=grace,
            expect=(StreamBroken,),
        )
        times["stream in stalls"] = check_stall(
            lambda d: sandbox.run("cat >/dev/null", [], stdin=stalled, deadline=d),
            seconds=seconds,
            grace=grace,
            expect=(StreamBroken,),
        )
        times["stream in fails"] = check_stall(
            lambda d: sandbox.run("cat >/dev/null; sleep 1000", [], stdin=FailingSource(), deadline=d),
            seconds=seconds,
            grace=grace,
            expect=(StreamBroken,),
        )
    finally:
        stalled.released.set()
    assert times["stream in fails"] < seconds, "a failed source must be raised at once, not at the deadline"
    return times


__all__ = [
    "STALL_ERRORS",
    "BankStoreContract",
    "FailingSource",
    "SandboxContract",
    "StalledSource",
    "TimelineContract",
    "TimelineUnreadable",
    "check_bank_store",
    "check_sandbox_stalls",
    "check_stall",
    "check_timeline",
]


# ---- The run's lock (A16, ADR 0007) -------------------------------------------------


class RunLockContract:
    """What every RunLock adapter promises (``application/ports.py``).

    Subclass with ``make`` (a fresh, empty lock store) and ``pass_time`` (let the store's
    clock move on: a ManualClock's advance, or a real pause for a server's clock);
    ``TTL`` is the lease the clauses take (short where time really passes).
    """

    TTL: ClassVar[float] = 30.0

    def make(self) -> RunLock:  # pragma: no cover - abstract
        raise NotImplementedError

    def pass_time(self, lock: RunLock, seconds: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_A16_one_live_holder_and_a_released_lock_is_taken_with_a_greater_token(self) -> None:  # noqa: N802
        lock = self.make()
        first = lock.acquire("run-1", "x-a", ttl=self.TTL)
        assert first is not None
        assert first.holder == "x-a"
        assert lock.acquire("run-1", "x-b", ttl=self.TTL) is None
        assert lock.acquire("run-2", "x-b", ttl=self.TTL) is not None  # runs do not share locks
        lock.release(first)
        second = lock.acquire("run-1", "x-b", ttl=self.TTL)
        assert second is not None
        assert second.token > first.token

    def test_A16_a_lapsed_holder_is_taken_over_and_fenced(self) -> None:  # noqa: N802
        lock = self.make()
        old = lock.acquire("run-1", "x-old", ttl=self.TTL)
        assert old is not None
        self.pass_time(lock, self.TTL * 1.5)
        held = lock.holder("run-1")
        assert held is not None
        assert held.holder == "x-old"
        assert not held.live
        new = lock.acquire("run-1", "x-new", ttl=self.TTL)
        assert new is not None
        assert new.token > old.token
        with pytest.raises(LockLost):
            lock.refresh(old, ttl=self.TTL)
        lock.release(old)  # never releases another holder's lease
        assert lock.acquire("run-1", "x-third", ttl=self.TTL) is None
        assert lock.refresh(new, ttl=self.TTL).token == new.token

    def test_A16_status_shows_who_since_when_and_the_token(self) -> None:  # noqa: N802
        lock = self.make()
        assert lock.holder("run-1") is None
        grant = lock.acquire("run-1", "x-a", ttl=self.TTL)
        assert grant is not None
        held = lock.holder("run-1")
        assert held is not None
        assert held.live
        assert (held.holder, held.token, held.since) == ("x-a", grant.token, grant.since)
        lock.release(grant)
        lock.release(grant)  # idempotent
        assert lock.holder("run-1") is None

    def test_A16_breaking_a_lock_fences_its_holder(self) -> None:  # noqa: N802
        lock = self.make()
        grant = lock.acquire("run-1", "x-a", ttl=self.TTL)
        assert grant is not None
        broken = lock.break_lock("run-1", by="operator")
        assert broken is not None
        assert broken.holder == "x-a"
        assert broken.token == grant.token
        with pytest.raises(LockLost):
            lock.refresh(grant, ttl=self.TTL)
        after = lock.acquire("run-1", "x-b", ttl=self.TTL)
        assert after is not None
        assert after.token > grant.token + 1

    def test_A16_racing_threads_get_exactly_one_grant(self) -> None:  # noqa: N802
        lock = self.make()
        barrier = threading.Barrier(8)
        grants: list[object] = []

        def race(i: int) -> None:
            barrier.wait(timeout=30)
            grants.append(lock.acquire("run-1", f"x-{i}", ttl=self.TTL))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sum(g is not None for g in grants) == 1
        assert len(grants) == 8


def check_run_lock(
    make: Callable[[], RunLock], pass_time: Callable[[RunLock, float], None], ttl: float
) -> list[str]:
    """Run the RunLock contract against ``make()``; returns the clauses it passed."""

    class _Bound(RunLockContract):
        TTL = ttl

        def make(self) -> RunLock:
            return make()

        def pass_time(self, lock: RunLock, seconds: float) -> None:
            pass_time(lock, seconds)

    return _run_contract(_Bound())


# ---- The restore target (a sandbox's scratch, a host directory) ------------------------------


def _ustar(name: str, data: bytes = b"", *, directory: bool = False) -> bytes:
    """One member as plain ustar (the name unchecked: a hostile one is the point)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.size, info.mode, info.mtime = len(data), 0o755 if directory else 0o644, 1_700_000_000
    return info.tobuf(tarfile.USTAR_FORMAT) + data + b"\x00" * ((-len(data)) % 512)


def _bank(*members: bytes) -> bytes:
    return gzip.compress(b"".join(members) + b"\x00" * 1024, mtime=0)


def faithful_record(data: bytes, manifest_bytes: int | None = None) -> ScratchBanked:
    """A faithful record of ``data``: its size and SHA-256, and the manifest the host's
    reader computes when it accepts the bank (none when it refuses)."""
    manifest = None
    with contextlib.suppress(HostileArchive):
        reader = TarReader()
        gunzip = GzipReader(reader.feed, 1 << 30)
        gunzip.feed(data)
        gunzip.close()
        reader.close()
        manifest = reader.log.manifest()
    return ScratchBanked(
        banked=True,
        empty=False,
        unknown=False,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        manifest_entries=manifest.entries if manifest else None,
        manifest_bytes=manifest_bytes
        if manifest_bytes is not None
        else (manifest.bytes if manifest else None),
        manifest_sha256=manifest.sha256 if manifest else None,
    )


class _CutOnFetch(ForwardingBankStore):
    """A store whose fetch cuts the run context first (the lease lost mid-restore, L5)."""

    def __init__(self, inner: BankStore, cancel: Cancel) -> None:
        super().__init__(inner)
        self.cancel = cancel

    def before(self, call: str, run_id: str) -> None:
        if call == "fetch":
            self.cancel.cut("the lease was lost")


class RestoreTargetContract:
    """What every RestoreTarget does (application/ports.py), where a sandbox's scratch and a
    host directory share behaviour (X1-X6, L5): a checked bank is restored as its manifest;
    a refusal (a hostile member, bytes not as recorded, more than the room, a cut run
    context) leaves the target byte for byte as it was.

    Subclasses define ``hands_over`` (what the target says), ``make`` (a target holding
    an old tree), ``listing`` (what stands at the target, sorted manifest lines) and
    ``checksum`` (everything the target can see, staged and leftover trees included).
    """

    RUN = "run-t"
    GOOD = _bank(
        _ustar("./", directory=True),
        _ustar("sub", directory=True),
        _ustar("sub/f", b"abc"),
        _ustar("top", b"t"),
    )
    EXPECTED = sorted([line_of("sub", "dir", 0), line_of("sub/f", "file", 3), line_of("top", "file", 1)])
    HOSTILE = _bank(_ustar("ok", b"o"), _ustar("../escape", b"x"))
    OTHER = _bank(_ustar("top", b"T"))  # a valid bank, not the recorded one

    hands_over: ClassVar[bool]

    def make(self, tmp: Path) -> RestoreTarget:  # pragma: no cover - abstract
        raise NotImplementedError

    def listing(self, target: RestoreTarget) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def checksum(self, target: RestoreTarget) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _restore(
        self,
        target: RestoreTarget,
        stored: bytes,
        *,
        recorded: bytes | None = None,
        manifest_bytes: int | None = None,
        cancel: Cancel | None = None,
    ) -> RestoreAttempt:
        from scratchbank.adapters.memory import InMemoryBankStore
        from scratchbank.application.restore import restore_bank

        record = faithful_record(recorded if recorded is not None else stored, manifest_bytes)
        memory = InMemoryBankStore()
        memory.banks[self.RUN] = stored
        store: BankStore = memory if cancel is None else _CutOnFetch(memory, cancel)
        bank = Bank(Evidence(1, ScratchBanked.WIRE), record, 1)
        decision = ResumeDecision(Verdict.RESTORE, "X1", "restore", bank=bank)
        return restore_bank(self.RUN, decision, store=store, into=target, cancel=cancel)

    def test_a_checked_bank_is_restored_as_its_manifest(self, tmp_path: Path) -> None:
        """X1, X6: through the port, RESTORED with the bank's bytes; the tree is its manifest."""
        target = self.make(tmp_path)
        got = self._restore(target, self.GOOD)
        assert got.result is RestoreResult.RESTORED, got
        assert got.bytes == len(self.GOOD)
        assert got.into_host_dir is self.hands_over
        assert self.listing(target) == self.EXPECTED
        assert target.hands_over is self.hands_over

    def test_a_hostile_bank_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X3, X6: a member leading out of the tree: refused on the host, the target as it was."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        got = self._restore(target, self.HOSTILE)
        assert got.result is RestoreResult.REFUSED_ON_HOST, got
        assert self.checksum(target) == before

    def test_a_bank_not_as_recorded_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X3: stored bytes whose size and digest are not the record's: refused, the target as it was."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        got = self._restore(target, self.OTHER, recorded=self.GOOD)
        assert got.result is RestoreResult.REFUSED_ON_HOST, got
        assert self.checksum(target) == before

    def test_a_bank_larger_than_the_room_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X2, X6: a bank declaring more bytes than the target has free: refused first."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        got = self._restore(target, self.GOOD, manifest_bytes=1 << 60)
        assert got.result in (RestoreResult.REFUSED_ON_HOST, RestoreResult.REFUSED_IN_SANDBOX), got
        assert self.checksum(target) == before

    def test_a_restore_cut_midway_is_lease_lost_and_changes_nothing(self, tmp_path: Path) -> None:
        """L5: the run context cut once the fetch began: LEASE_LOST, nothing moved into place."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        got = self._restore(target, self.GOOD, cancel=Cancel())
        assert got.result is not RestoreResult.RESTORED, got
        assert "LEASE_LOST" in got.detail, got
        assert self.checksum(target) == before
