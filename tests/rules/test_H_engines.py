"""Rules H: a hostile sandbox: what it sends is bounded and nothing it plants is believed (ADR 0008).
The engines tier's tests of H1, H2, H3, H4, H5, H6, H7 (tests/tiers.py: a file of tests/rules/ has
its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import shlex
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hostile import end, gz, member, ustar
from rigs.hostile_sandbox import (
    TRANSPORTS,
    _pid1_idle,
    _wait_for,
    box,  # noqa: F401 - a fixture
    files,
)
from rigs.real_sandboxes import CONTAINERS, SCRATCH, Rig, _container, engine_url, rig
from rigs.sandbox_probes import frozen
from rigs.sandbox_restores import fingerprint, restore
from waiting import eventually

from scratchbank.adapters.docker_sandbox import IDLE_POOLS, DockerSandbox
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import QUIESCE, Exec, ScriptedSandbox
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.ports import QuiesceReport
from scratchbank.domain.errors import ExecFailed, OutputOverBound, RestoreRefused, StreamBroken
from scratchbank.testing.hostile import HostileSandbox, flood, forge, forger, replace, shadow

# ---- from tests/test_hostile_sandbox.py: Issue 25: a compromised sandbox can neither harm the host nor make a record lie.


# -- 1. a listing, a staging and list_scratch bounded by what the host expects --------------
def test_H1_a_listing_that_floods_past_the_manifest_is_refused_and_changes_nothing(box: Rig) -> None:
    """The restore's listing step printing far more than two entries can take: a named
    refusal in the sandbox (X4, SANDBOX_OUTPUT_OVER_BOUND), the scratch as it was.
    Proves ``scratchbank.application.resume.resume``."""
    box.sh(f"rm -rf {box.scratch}; mkdir -p {box.scratch} && echo mine > {box.scratch}/keep")
    before = fingerprint(box)
    hostile = HostileSandbox(box.sandbox, shadow("cat", after=flood(2 << 20), only_with_args=True))
    out = restore(gz(files("a", "b") + end()), hostile)
    assert out.restore is not None and out.restore.park is not None, out
    assert "refused_in_sandbox: SANDBOX_OUTPUT_OVER_BOUND" in out.restore.record.reason, (
        out.restore.record.reason
    )
    assert fingerprint(box) == before


def test_H1_list_scratch_past_its_bound_is_a_named_refusal(box: Rig) -> None:
    """``list_scratch`` has no manifest to go by: a fixed bound, past it OutputOverBound."""
    box.sh(f"mkdir -p {box.scratch} && echo x > {box.scratch}/f")
    hostile = HostileSandbox(box.sandbox, shadow("cat", after=flood(2 << 20), only_with_args=True))
    hostile.list_bytes = 1 << 16
    with pytest.raises(OutputOverBound):
        hostile.list_scratch()
    assert [line.split(",")[0] for line in box.sandbox.list_scratch()] == ['["f"']


# -- 2. steps that should print nothing; stderr tails; text into records -------------------
def test_H2_a_step_that_should_print_nothing_is_cut_past_a_few_KiB(box: Rig) -> None:
    """The continue step (no stdout sink) whose ``rm`` prints 2 MiB: a named refusal, the
    host holds no more than the bound. Proves ``scratchbank.application.ports.Sandbox.continue_processes``."""
    hostile = HostileSandbox(box.sandbox, shadow("kill", before=flood(2 << 20)))
    with pytest.raises(OutputOverBound) as caught:
        hostile.continue_processes()
    assert "4096" in caught.value.message


def test_H2_stderr_is_a_capped_tail_and_reaches_a_record_escaped_and_cut(box: Rig) -> None:
    """A tar that fails with 3 MiB of NULs and escapes on stderr: the host keeps a 64 KiB
    tail, and the ArchiveFailed message (what the record's reason gets) holds no raw
    control byte and at most 2,000 characters of the sandbox's text."""
    from scratchbank.domain.errors import ArchiveFailed

    box.sh(f"mkdir -p {box.scratch} && echo x > {box.scratch}/f")
    nul = flood(3 << 20, stream=2, byte="\\000\\033")
    hostile = HostileSandbox(box.sandbox, f"tar() {{ {nul}; return 2; }}")
    done = hostile.call(Exec("tar"))
    assert len(done.stderr) <= 64 << 10
    with pytest.raises(ArchiveFailed) as caught:
        hostile.archive(io.BytesIO(), compress=False, verify=False)
    text = caught.value.message
    assert "\x00" not in text and "\x1b" not in text and len(text) < 2200, text[:200]


# -- 3. no root step follows a name the workload planted -----------------------------------
@pytest.mark.parametrize("engine", CONTAINERS)
def test_H3_the_quiesce_as_root_never_follows_a_link_planted_in_tmp(engine: str, tmp_path: Path) -> None:
    """An unprivileged workload links the old fixed watchdog flag (and a few other names
    a script could use) to a root-owned file of a host directory mounted in: quiesce and
    continue (as root) leave it byte for byte. Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"root-owned file of the host, 37 bytes")
    victim.chmod(0o600)
    with rig(engine, volumes={str(tmp_path): {"bind": "/tmp/hostdir", "mode": "rw"}}) as r:
        for name in (".scratchbank-watchdog", ".scratchbank-wd", ".sb-before", ".sb-after"):
            r.sh(f"ln -s /tmp/hostdir/victim /tmp/{name}", user="65534")
        report = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
        r.sandbox.continue_processes()
        assert report.quiesced, report
    assert victim.read_bytes() == b"root-owned file of the host, 37 bytes"


# -- 4 and 5. quiesce believes no name ----------------------------------------------------
@pytest.mark.parametrize("engine", CONTAINERS)
def test_H4_a_process_named_to_look_stopped_is_read_as_running(engine: str) -> None:
    """A root writer whose name is ``w) T 1`` and a newline, quiesced by a non-root user
    that cannot stop it: read from ``State:`` it runs, so the bank is unquiesced.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.spawn``."""
    with rig(engine) as r:
        path = f"{r.scratch}/forged"
        r.sh(f"mkdir -p {r.scratch}")
        r.spawn(f"printf 'w) T 1 1\\n' > /proc/$$/comm; while :; do echo x >> {path}; sleep 0.01; done")
        _wait_for(r, path)
        r.sandbox.admin_user = "65534"
        try:
            report = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
        finally:
            r.sandbox.admin_user = "0"
            r.sandbox.continue_processes()
        assert not report.quiesced, report
        assert any("another user" in why or "still running" in why for why in report.reasons), report


@pytest.mark.parametrize("engine", CONTAINERS)
def test_H5_a_pid_1_named_sleep_that_writes_is_not_proven_idle(engine: str) -> None:
    """PID 1 renames itself ``sleep`` and keeps writing: unquiesced on its record,
    whatever it calls itself."""
    # builtins only: a writer that forked a sleep would wait on it once it is stopped
    spin = "i=0; while [ $i -lt 300 ]; do i=$((i + 1)); done"
    loop = (
        "printf sleep > /proc/$$/comm; mkdir -p /tmp/iterion-scratch; "
        f"while :; do echo x >> /tmp/iterion-scratch/w; {spin}; done"
    )
    with rig(engine, command=["sh", "-c", loop]) as r:
        _wait_for(r, f"{r.scratch}/w")
        assert r.sh("cat /proc/1/comm").strip() == "sleep"
        report = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
        r.sandbox.continue_processes()
        assert not report.quiesced, report
        assert any("pid 1" in why for why in report.reasons), report


def test_H5_an_idle_pid_1_is_still_quiesced(box: Rig) -> None:
    """The other side: a PID 1 that sleeps and writes nothing is proven idle.
    Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    report = box.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
    box.sandbox.continue_processes()
    assert report.quiesced, report


def test_H5_an_idle_pid_1_is_proven_over_its_window_not_a_fixed_wait() -> None:
    """PID 1 unmoved: proven idle once 0.2 s have passed since its first read (the stop rounds
    count), reading every 0.05 s, never a fixed 0.5 s wait on each teardown.
    Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    rc, waits, report = _pid1_idle("wchar: 7 syscw: 1 ")
    assert rc == 0, report
    assert waits == ["5"] * 3, waits  # reads at +0.05 .. +0.2 s: three short waits


def test_H5_a_pid_1_that_writes_within_the_window_is_not_idle_at_once() -> None:
    """PID 1's counters moved by the next read: not proven idle, said at once (no wait).
    Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    rc, waits, report = _pid1_idle("wchar: $n syscw: $n ")
    assert rc == 1 and "wrote during the quiesce" in report, report
    assert waits == [], waits


# -- 6. a full disk during the extract is the sandbox's refusal (X4), not X5 --------------
@pytest.mark.parametrize("engine", TRANSPORTS)
def test_H6_X4_a_disk_that_fills_during_the_extract_is_refused_not_broken(engine: str) -> None:
    """/tmp (the scratch's parent and the script's work files) is a 256 KiB tmpfs, and a
    400 KB bank fills it mid-extract (no size declared up front): RestoreRefused, never
    StreamBroken, and the old scratch byte for byte."""
    tmpfs = {"tmpfs": {"/tmp": "size=256k"}} if engine not in ("local", "k8s-double") else {}
    with rig(engine, **tmpfs) as r:
        if not tmpfs:
            r.sh("mount -t tmpfs -o size=256k tmpfs /tmp")
        scratch = "/tmp/scratch"
        r.sandbox.facts = attrs.evolve(r.sandbox.facts, scratch=scratch)
        r.scratch = scratch
        r.sh(f"mkdir -p {scratch} && echo mine > {scratch}/keep")
        before = fingerprint(r)
        big = ustar(member("big", size=400_000), b"q" * 400_000)
        listing = io.BytesIO()
        with pytest.raises(RestoreRefused):
            r.sandbox.stage_restore(io.BytesIO(big + end()), compressed=False, listing=listing)
        assert fingerprint(r) == before


# -- 7. a cut call ends everything it started ---------------------------------------------
def test_H7_a_cut_call_ends_every_process_it_started_even_one_that_detached(box: Rig) -> None:
    """A call cut at its deadline whose script started a writer that detached (setsid)
    and holds its stdout, and one that stayed in its group: after the cut neither writes.
    Proves ``scratchbank.adapters.scripted.Exec``."""
    box.sh(f"mkdir -p {box.scratch}")
    held, grouped = f"{box.scratch}/held", f"{box.scratch}/grouped"
    loop = "while :; do echo x >> {}; sleep 0.05; done"
    source = (
        f"setsid sh -c '{loop.format(held)}' & sh -c '{loop.format(grouped)}' </dev/null >/dev/null 2>&1 & "
        "sleep 1000"
    )
    with pytest.raises((StreamBroken, ExecFailed)):
        box.sandbox.call(Exec(source, deadline=Deadline.after(3)))
    eventually(lambda: frozen(box, held), timeout=30, what="the detached writer ends with the cut")
    eventually(lambda: frozen(box, grouped), timeout=30, what="the grouped writer ends with the cut")


@pytest.mark.parametrize("isolate", [True, False], ids=["own-pid-namespace", "plain-processes"])
def test_H7_no_process_of_an_exec_survives_its_local_sandboxs_close(isolate: bool) -> None:
    """An exec that returned while a writer it started floods a closed stderr, one in its
    process group and one that detached (setsid) :
    once the sandbox is closed, neither runs on the host (never a loop burning a core,
    reparented to init). Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.destroy``."""
    marker = f"flood-{uuid.uuid4().hex[:10]}"
    loop = "while :; do echo y >&2; sleep 0.05; done"
    box = LocalSandbox(isolate=isolate)
    try:
        assert box.facts.process_isolated == isolate, box.facts.isolation
        done = box.run(
            f"setsid sh -c '{loop}' {marker} </dev/null >/dev/null 2>&- & "
            f"sh -c '{loop}' {marker} </dev/null >/dev/null 2>&- & "
            "echo started",
            [],
        )
        assert done.exit_code == 0 and done.stdout == b"started\n", done
        eventually(lambda: len(_live(marker)) == 2, timeout=60, what="both writers run")
    finally:
        box.destroy()
    try:
        eventually(
            lambda: _live(marker) == [],
            timeout=60,
            what="no writer survives the close",
            detail=lambda: _live(marker),
        )
    finally:
        for pid in _live(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _sleeper(mark: str | None) -> subprocess.Popen[bytes]:
    """A host process (sleep) carrying a local sandbox's mark in its environment, or none."""
    from scratchbank.adapters.local_sandbox import SANDBOX_VAR

    env = {k: v for k, v in os.environ.items() if k != SANDBOX_VAR}
    if mark is not None:
        env[SANDBOX_VAR] = mark
    return subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True)


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` was ended (waits a bounded while for it; kills it if not)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if proc.returncode is None:
        proc.kill()
        proc.wait()
        return False
    return True


def test_H7_a_process_missed_by_one_scan_is_ended_by_the_next_on_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A marked process caught inside an execve reads an empty environ: a first scan that
    finds nothing is not taken as proof (as the cut call's reap, edce6aa).
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.destroy``."""
    from scratchbank.adapters import local_sandbox

    box = LocalSandbox(isolate=False)
    proc = _sleeper(box._mark)
    real, scans = local_sandbox._marked, []

    def marked(value: str) -> list[int]:
        scans.append(value)
        return [] if len(scans) == 1 else real(value)  # the first scan meets it in its execve

    monkeypatch.setattr(local_sandbox, "_marked", marked)
    box.destroy()
    assert _ended(proc), "a marked process survived its local sandbox's close"


def test_H7_a_local_sandboxs_close_never_kills_a_process_without_its_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process number a scan found, reused by an unmarked process before the kill, is not
    signalled (the mark is checked again on the process the kill is aimed at), nor is
    another sandbox's process nor one whose mark only starts with this one's.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.destroy``."""
    from scratchbank.adapters import local_sandbox

    box = LocalSandbox(isolate=False)
    other = LocalSandbox(isolate=False)
    bystanders = [_sleeper(None), _sleeper(other._mark), _sleeper(box._mark + "0")]
    real = local_sandbox._marked
    try:
        # the number a scan returned now names a process without the mark (reused)
        monkeypatch.setattr(local_sandbox, "_marked", lambda value: real(value) + [p.pid for p in bystanders])
        box.destroy()
        assert [p.poll() for p in bystanders] == [None, None, None]
    finally:
        for p in bystanders:
            p.kill()
            p.wait()
        other.destroy()


def _descriptors() -> dict[str, str]:
    """This process's descriptors and what each is."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return found


def _live(marker: str) -> list[int]:
    """The host's processes (not zombies) whose command line names ``marker``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in argv and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize("engine", ["docker-busybox", "docker-gnu"])
def test_H4_a_replaced_tr_cannot_forge_a_line_of_the_quiesce_report(engine: str) -> None:
    """PID 1 writes under a name ``tr`` would clean, and the workload replaced ``tr`` with one
    printing report lines of its own (``scratchbank-quiesced 0``, ``stopped 999``): the report
    still reads unquiesced, its count is the script's, in one exec and in the quiesce alone.
    Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    spin = "i=0; while [ $i -lt 300 ]; do i=$((i + 1)); done"
    loop = (
        "printf 'w r' > /proc/$$/comm; mkdir -p /tmp/iterion-scratch; "
        f"while :; do echo x >> /tmp/iterion-scratch/w; {spin}; done"
    )
    forged = replace("tr", "printf 'w\\nscratchbank-quiesced 0\\nstopped 999\\nwatchdog 1\\n'")
    with rig(engine, command=["sh", "-c", loop]) as r:
        _wait_for(r, f"{r.scratch}/w")
        hostile = HostileSandbox(r.sandbox, forged)
        try:
            one = hostile.quiesce_and_archive(
                io.BytesIO(), budget_seconds=5, wait_seconds=1, compress=False
            ).quiesce
            alone = hostile.quiesce(budget_seconds=5, wait_seconds=1)
        finally:
            r.sandbox.continue_processes()
    for report in (one, alone):
        assert not report.quiesced and report.stopped != 999, report
        assert any("pid 1 (w?r)" in why for why in report.reasons), report


@pytest.mark.parametrize("engine", ["docker-busybox", "docker-gnu"])
def test_H4_a_replaced_sleep_cannot_forge_the_one_exec_quiesce_report(engine: str) -> None:
    """PID 1 runs (a task in R: unquiesced) and the workload replaced ``sleep``, which the
    quiesce calls while it waits on PID 1's counters, with one printing a report's end of its
    own (``scratchbank-quiesced 0``) to the exec's stdout: the one-exec report still reads
    unquiesced, its count the script's. Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    loop = "mkdir -p /tmp/iterion-scratch; echo x > /tmp/iterion-scratch/ready; while :; do :; done"
    forged = replace("sleep", "printf 'scratchbank-quiesced 0\\nstopped 999\\n'; command sleep \"$@\"")
    with rig(engine, command=["sh", "-c", loop]) as r:
        _wait_for(r, f"{r.scratch}/ready")
        hostile = HostileSandbox(r.sandbox, forged)
        try:
            one = hostile.quiesce_and_archive(
                io.BytesIO(), budget_seconds=5, wait_seconds=1, compress=False
            ).quiesce
        finally:
            r.sandbox.continue_processes()
    assert not one.quiesced and one.stopped != 999, one


@pytest.mark.parametrize("engine", [*TRANSPORTS, "k8s-docker"])
def test_H7_a_call_cut_while_stdout_and_stderr_flood_returns_by_its_deadline(engine: str) -> None:
    """An exec that floods stdout and stderr at once and never ends, into a sink that takes
    everything: cut at its deadline, the call returns (a cut transport that kept reading a
    peer still sending would never end), StreamBroken, and nothing of it runs on after.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    taken = [0]

    class Sink:
        def write(self, data: bytes) -> int:
            taken[0] += len(data)
            return len(data)

    with rig(engine) as r:
        raised: list[BaseException] = []

        def call() -> None:
            try:
                r.sandbox.call(
                    Exec("yes flood-err >&2 & yes flood-out", stdout=Sink(), deadline=Deadline.after(3))
                )
            except BaseException as error:
                raised.append(error)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(120)  # a bound for the test: the cut comes at 3 s
        assert not caller.is_alive(), f"the cut call never returned ({taken[0]} bytes taken)"
        assert len(raised) == 1 and isinstance(raised[0], StreamBroken), raised
        assert taken[0] > 0
        eventually(
            lambda: "flood" not in r.sh("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False),
            timeout=60,
            what="no flood runs on",
        )


class _WroteSink:
    """A call's stdout that says when the exec first wrote, and keeps nothing."""

    def __init__(self, wrote: threading.Event) -> None:
        self.wrote = wrote

    def write(self, data: bytes) -> int:
        self.wrote.set()
        return len(data)


def _cut_at_its_first_write(r: Rig, source: str) -> None:
    """A call of ``source`` on its own thread, cut once the exec first wrote; it must return."""
    wrote, cancel = threading.Event(), Cancel()

    def call(sink: _WroteSink = _WroteSink(wrote)) -> None:
        with contextlib.suppress(StreamBroken):
            r.sandbox.call(Exec(source, stdout=sink, deadline=Deadline.after(120, cancel)))

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert wrote.wait(60), "the exec never wrote"
    cancel.cut("cut by the test")
    caller.join(60)
    assert not caller.is_alive(), "a cut call never returned"


@pytest.mark.parametrize("engine", [*TRANSPORTS, "k8s-docker"])
def test_H7_cut_calls_leave_no_descriptor_or_thread_behind_on_the_host(engine: str) -> None:
    """Calls cut mid-stream (one that floods both streams, one whose detached child holds its
    pipes), round after round: the host's threads come back to what they were after the first round,
    its descriptors too but for the engine client's pool of idle API connections. Proves ``scratchbank.adapters.exec_pump.pump``."""
    sources = ["yes flood-err >&2 & yes flood-out", "setsid sh -c 'sleep 1000' & echo held; exec sleep 1000"]

    def cut_round(r: Rig) -> None:
        for source in sources:
            _cut_at_its_first_write(r, source)

    def held() -> tuple[int, int]:
        gc.collect()  # a descriptor only garbage still holds is freed here, not leaked
        return len(os.listdir("/proc/self/fd")), threading.active_count()

    # the engine's client keeps at most this many idle API connections: two here (docker-py
    # keeps up to 25 pools of 10 by default), so that a few calls leaking a descriptor each pass it
    pooled = 2 if engine in CONTAINERS else 0
    with rig(engine, **({"pool": pooled} if pooled else {})) as r:
        cut_round(r)
        fds, threads = held()
        for _ in range(3):  # 6 cut calls and their reaps: a descriptor each would pass the pool
            cut_round(r)
        eventually(
            lambda: held()[0] <= fds + pooled and held()[1] <= threads,
            timeout=60,
            what="descriptors and threads back",
            detail=lambda: (held(), fds, threads, _descriptors()),
        )


def test_H7_a_detached_child_still_in_its_execs_is_reaped_with_its_cut_call() -> None:
    """A call whose detached child (``setsid sh -c 'sleep 1001'``) is still going through its
    execs when the call is cut at its first output: the reap ends it, call after call (one
    pass over /proc missed it about once in ten cuts on the Kubernetes double, where the cut
    does not end the exec first: a process inside an execve reads an empty environ).
    Proves ``scratchbank.adapters.scripted.ScriptedSandbox.call``."""
    source = "setsid sh -c 'sleep 1001' & echo held; exec sleep 1000"
    count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100[01]' || true"
    survived = 0
    with rig("k8s-double") as r:
        for _ in range(20):  # a race: each cut is one more chance to miss it
            _cut_at_its_first_write(r, source)
            if r.sh(count, check=False).strip() != "0":
                survived += 1
                r.sh("pkill -f 'sleep 100[01]' || killall sleep", check=False)
    assert survived == 0, f"{survived} of 20 cut calls left their detached child running"


# -- 4b. no command the quiesce looks up on the sandbox's filesystem can forge its verdict ----
#: every command looked up on the sandbox's filesystem that the quiesce (and the one-exec
#: bank before its verdict) ran in round 3, and tar, the first the archive runs after it
FORGED_TOOLS = ["readlink", "date", "sleep", "mktemp", "setsid", "rm", "rmdir", "tar"]
#: of those, a shell function stands in for these (tar: the first after the verdict; rm and
#: rmdir ran in the watchdog's own shell and in the continue: as binaries, below)
AS_FUNCTIONS = ["readlink", "date", "sleep", "mktemp", "setsid", "tar"]
#: PID 1 keeps writing, every 0.05 s, asleep between (a builtin timed read: BusyBox's ash
#: and GNU's bash have one; a PID 1 that forked a sleep would wait on it once it is stopped)
WRITING_PID1 = (
    "printf 'w r' > /proc/$$/comm; mkdir -p /tmp/iterion-scratch; mkfifo /tmp/tick; exec 3<>/tmp/tick; "
    "while :; do echo x >> /tmp/iterion-scratch/w; read -t 0.05 -u 3 _; done"
)


def _writing_pid1(engine: str) -> list[str]:
    return ["bash" if engine.endswith("gnu") else "sh", "-c", WRITING_PID1]


@pytest.fixture(scope="module")
def writing_gnu() -> Iterator[Rig]:
    """One GNU container whose PID 1 keeps writing, for the module (a forger leaves no damage)."""
    with rig("docker-gnu", command=_writing_pid1("docker-gnu")) as r:
        _wait_for(r, f"{r.scratch}/w")
        yield r


def _unforged(report: QuiesceReport) -> None:
    assert not report.quiesced and report.stopped != 999, report
    assert any("pid 1 (w?r)" in why for why in report.reasons), report


def _bank(sandbox: ScriptedSandbox, sink: io.BytesIO, r: Rig) -> QuiesceReport:
    """The one-exec bank's quiesce report; what it left stopped continued."""
    one = sandbox.quiesce_and_archive(sink, budget_seconds=5, wait_seconds=1, compress=False)
    if not one.continued:
        r.sandbox.continue_processes()
    return one.quiesce


@pytest.mark.parametrize("tool", AS_FUNCTIONS)
def test_H4_no_tool_the_quiesce_runs_can_forge_the_one_exec_verdict(writing_gnu: Rig, tool: str) -> None:
    """A forger for ``tool`` (run before the command, as one earlier in PATH would) writes
    ``scratchbank-quiesced 0`` and ``stopped 999`` to the script's stdout and stderr and to
    every ancestor's while PID 1 writes: the one-exec record is unquiesced, PID 1 named, its
    count the script's (round 3's quiesce ran readlink, date, sleep, mktemp, setsid, rm and
    rmdir before its verdict; tar runs after it, where no report line is taken). GNU (dash);
    BusyBox below, every forger at once. Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    sink = io.BytesIO()
    _unforged(_bank(HostileSandbox(writing_gnu.sandbox, forger(tool)), sink, writing_gnu))
    if tool == "tar":  # it ran, after the verdict: its lines are the stream's, never the report's
        assert b"stopped 999" in sink.getvalue()


def test_H4_no_tool_can_forge_a_busybox_quiesce_either() -> None:
    """BusyBox's ash, a forger for every tool at once, PID 1 writing: the one-exec bank reads
    unquiesced, PID 1 named, its count the script's (the quiesce alone: GNU, below).
    Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    with rig("docker-busybox", command=_writing_pid1("docker-busybox")) as r:
        _wait_for(r, f"{r.scratch}/w")
        hostile = HostileSandbox(r.sandbox, *map(forger, FORGED_TOOLS))
        sink = io.BytesIO()
        _unforged(_bank(hostile, sink, r))
    assert b"stopped 999" in sink.getvalue()


def test_H4_forging_binaries_in_path_cannot_make_a_quiesce_read_quiesced(writing_gnu: Rig) -> None:
    """Real binaries earlier in PATH (/usr/local/bin, GNU image: Debian's BusyBox ash runs its
    applets from its own binary) for every tool, each forging as above and then running the
    real one, PID 1 writing: the one-exec bank and the quiesce alone read unquiesced, PID 1
    named, their counts the script's; tar's forged lines are the stream's.
    Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    plant = "; ".join(
        f"real=$(command -v {tool}); "
        f'printf \'#!/bin/sh\\n%s\\nexec %s "$@"\\n\' {shlex.quote(forge())} "$real" > /usr/local/bin/{tool}; '
        f"chmod 755 /usr/local/bin/{tool}"
        for tool in FORGED_TOOLS
    )
    r = writing_gnu
    r.sh(plant)
    sink = io.BytesIO()
    try:
        one = _bank(r.sandbox, sink, r)
        alone = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
    finally:
        r.sandbox.continue_processes()
        r.sh("cd /usr/local/bin && /bin/rm -f " + " ".join(FORGED_TOOLS))
    for report in (one, alone):
        _unforged(report)
    assert b"stopped 999" in sink.getvalue()


def test_H4_the_quiesce_reaches_its_verdict_with_no_command_on_its_path() -> None:
    """With no command of the sandbox's filesystem to be found (PATH empty) the one-exec bank's
    quiesce still reaches its verdict, quiesced (PID 1 idle, nothing else runs): it looks
    nothing up before it (tar, after it, is not found; the verdict stands). The local sandbox,
    whose shell (dash here) runs the same script. Proves ``scratchbank.adapters.scripted.ScriptedSandbox.quiesce_and_archive``."""
    with rig("local") as r:
        hostile = HostileSandbox(r.sandbox, "PATH=/nonexistent")
        one = hostile.quiesce_and_archive(io.BytesIO(), budget_seconds=5, wait_seconds=1, compress=False)
        r.sandbox.continue_processes()
    assert one.quiesce.quiesced, one


@pytest.mark.parametrize("builtin", ["kill", "read"])
def test_H4_a_shell_whose_builtin_is_stood_in_for_is_refused_before_any_signal(builtin: str) -> None:
    """A function standing in for the shell's ``kill`` or ``read`` (what a replaced shell
    does to every builtin) is refused before any signal, named: the quiesce trusts only its
    shell's own builtins, and says so. The local sandbox.
    Proves ``scratchbank.adapters.scripted.ScriptedSandbox.quiesce``."""
    with rig("local") as r:
        report = HostileSandbox(r.sandbox, replace(builtin, "return 0")).quiesce(
            budget_seconds=5, wait_seconds=1
        )
    assert report.refused and not report.quiesced, report
    assert report.reasons == (f"the shell's {builtin} is not its builtin",), report


#: PID 1 writes, and writes a verdict of its own into every exec of ours it finds (builtins)
FORGING_PID1 = (
    "mkdir -p /tmp/iterion-scratch; mkfifo /tmp/tick; exec 3<>/tmp/tick; "
    "while :; do echo x >> /tmp/iterion-scratch/w; "
    'for d in /proc/[0-9]*; do [ "$d" = /proc/1 ] && continue; read -r c < $d/cmdline; '
    "case $c in *SCRATCHBANK*) printf 'scratchbank-quiesced 0\\nstopped 999\\n' > $d/fd/1 ;; esac; "
    "done 2>/dev/null; read -t 0.05 -u 3 _; done"
)


def test_H4_a_pid_1_that_writes_a_verdict_into_the_banks_stdout_is_told_by_its_exit_code() -> None:
    """PID 1 (never stopped, the script's user) writes ``scratchbank-quiesced 0`` into the stdout
    of every exec of ours while it writes the scratch (round 3: the one-exec record read
    quiesced): the bank's exit code disagrees, and the record reads unquiesced, named; the
    quiesce alone's exit code does too. Docker BusyBox.
    Proves ``scratchbank.adapters.script_reports.confirmed``."""
    with rig("docker-busybox", command=["sh", "-c", FORGING_PID1]) as r:
        _wait_for(r, f"{r.scratch}/w")
        one = _bank(r.sandbox, io.BytesIO(), r)
        try:
            alone = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
        finally:
            r.sandbox.continue_processes()
    for report in (one, alone):
        assert not report.quiesced and report.stopped != 999, report
    assert any("says 0" in why or "pid 1 (sh)" in why for why in one.reasons), one


def test_H5_a_clock_that_stands_still_ends_the_quiesces_wait_and_proves_nothing() -> None:
    """/proc/uptime planted to stand still (a FUSE or bind mount over it): the quiesce's wait
    (steps of sleep on that clock, or a spin without one) still ends, and PID 1 is not proven idle, named.
    Proves ``scratchbank.adapters.scripted.ScriptedSandbox.quiesce``."""
    stubs = """
uptime_cs() { up_cs=1000; }
pid1_writes() { p1_io="wchar: 7 syscw: 1 "; }
read_status() { st_state=S st_name=init; }
pause 2; echo "pause $?"
pid1_writes; p1_before=$p1_io; p1_since=1000
reasons="" q_out=""
pid1_idle; rc=$?
printf '%s' "$q_out"
exit $rc
"""
    done = subprocess.run(
        ["sh", "-c", "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + stubs], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 1 and done.stdout.startswith("pause 1\n"), done
    assert "the clock (/proc/uptime) stands still: not proven idle" in done.stdout, done


@pytest.mark.parametrize("engine", ["docker-busybox", "podman-busybox"])
def test_H7_a_container_sandboxs_own_engine_client_keeps_few_idle_connections(engine: str) -> None:
    """A Docker/Podman sandbox built from a URL (its own engine client) keeps a few idle API
    connections, not one per exec URL: docker-py keeps a pool per URL (up to 25) and an
    exec's URLs are its own, so each sandbox held ~9-11 sockets after 10-20 execs, and 200
    sandboxes at once in one process pass a default descriptor limit of 1,024. Proves
    ``scratchbank.adapters.docker_sandbox.DockerSandbox``."""
    kind = engine.split("-")[0]
    with _container(engine) as (box, _client):
        sandbox = DockerSandbox(box.id, scratch=SCRATCH, base_url=engine_url(kind), podman=kind == "podman")
        sandbox.call(Exec("echo warm"))
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(10):
            sandbox.call(Exec("echo hi"))
        gc.collect()
        grown = len(os.listdir("/proc/self/fd")) - before
        sandbox.client.close()
    assert grown <= IDLE_POOLS, f"{grown} more descriptors held after 10 execs"
