"""The sandbox adapters and their in-sandbox scripts, against real engines (T11-T18, X2).

Every test runs on the local sandbox (unshare), Docker and Podman, each on a BusyBox
and a GNU userland where the test applies.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rigs import CONTAINERS, ENGINES, EXERCISED, Rig, host_sleep, rig
from waiting import eventually

from scratchbank.adapters.scripted import RESTORE as RESTORE_SCRIPT
from scratchbank.application.bank_format.reader import TarReader
from scratchbank.application.bank_format.spill_log import Manifest, manifest_lines
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import RestoreRefused, SandboxGone, StreamBroken


def size_of(r: Rig, path: str) -> int:
    return int(r.sh(f"wc -c < {path}").strip())


# Every task (thread) of every process whose command line names ``$1``, but this shell's:
# one line "<pid> <tid> <state> <ppid>" each (the state follows the ") " that ends the comm).
_STATES = (
    'for t in /proc/[0-9]*/task/[0-9]*; do p=${t#/proc/}; p=${p%%/*}; [ "$p" = "$$" ] && continue; '
    'grep -qsF -- "$1" /proc/$p/cmdline || continue; '
    "{ read -r l < $t/stat; } 2>/dev/null || continue; "
    's=${l##*) }; pp=${s#* }; echo "$p ${t##*/} ${s%% *} ${pp%% *}"; done; true'
)


def running(r: Rig, marker: str) -> list[str]:
    """The tasks (threads) of the processes whose command line names ``marker`` (a writer's
    file or script) that are neither stopped (T) nor gone: "<pid> <tid> <state> <ppid>".
    A task blocked in the kernel (D) on a stopped child counts as stopped: a shell that
    vforked waits there until its child, stopped before its exec, runs again."""
    tasks = [t.split() for t in r.sh(f"set -- '{marker}'; {_STATES}", check=False).splitlines()]
    tasks = [t for t in tasks if len(t) == 4]
    stopped = ("T", "t", "Z", "X")
    parents = {t[3] for t in tasks if t[2] in stopped}
    return [" ".join(t) for t in tasks if t[2] not in stopped and not (t[2] == "D" and t[0] in parents)]


def frozen(r: Rig, marker: str) -> bool:
    """Every process whose command line names ``marker`` is stopped or gone, each of its
    threads included: a state read, not a timed window."""
    return running(r, marker) == []


def grows(r: Rig, path: str) -> None:
    """Waits until ``path`` grows (a writer running again), failing by name past a bound."""
    before = size_of(r, path)
    eventually(lambda: size_of(r, path) > before, what=f"{path} grows", interval=0.1)


def wait_until_written(r: Rig, path: str, seconds: float = 60) -> None:
    eventually(
        lambda: r.sh(f"test -s {path} && echo yes", check=False).strip() == "yes",
        timeout=seconds,
        what=f"a writer writes {path}",
    )


def writer(r: Rig, name: str = "grow") -> str:
    path = f"{r.scratch}/{name}"
    r.sh(f"mkdir -p {r.scratch}")
    r.spawn(f"while :; do echo 0123456789 >> {path}; sleep 0.01; done")
    wait_until_written(r, path)
    return path


@pytest.fixture(params=ENGINES)
def any_rig(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    with rig(request.param) as r:
        yield r


@pytest.fixture(params=CONTAINERS)
def container(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    with rig(request.param) as r:
        yield r


def test_T11_sandboxes_read_as_process_isolated(any_rig: Rig) -> None:
    facts = any_rig.sandbox.facts
    assert facts.process_isolated, facts.isolation
    assert not facts.host_backed


def test_T12_quiesce_freezes_a_writer_and_continue_lets_it_run_again(any_rig: Rig) -> None:
    path = writer(any_rig)
    report = any_rig.sandbox.quiesce(budget_seconds=30, wait_seconds=2)
    try:
        assert report.quiesced, report
        assert report.stopped >= 1
        assert frozen(any_rig, path)
    finally:
        any_rig.sandbox.continue_processes()
    grows(any_rig, path)


def test_T12_a_process_started_after_the_first_stop_is_stopped_too(any_rig: Rig) -> None:
    """A loop that keeps forking new writers: every round stops what started since."""
    r = any_rig
    r.sh(f"mkdir -p {r.scratch}")
    path = f"{r.scratch}/forks"
    r.spawn(f"while :; do (echo x >> {path}; sleep 0.2) & sleep 0.01; done")
    wait_until_written(r, path)
    report = r.sandbox.quiesce(budget_seconds=30, wait_seconds=2)
    try:
        assert report.quiesced, report
        assert running(r, path) == [], report
    finally:
        r.sandbox.continue_processes()


@pytest.mark.parametrize("engine", ["docker-busybox", "podman-busybox"])
def test_T12_host_pid_namespace_is_refused_before_any_signal(engine: str) -> None:
    """In a --pid=host container the script refuses; a canary on the VM is never stopped.

    The quiesce runs as nobody, and so does the canary, so that a broken guard could
    stop nothing but the canary.
    """
    canary = host_sleep(120)
    try:
        with rig(engine, pid_mode="host") as r:
            assert not r.sandbox.facts.process_isolated
            r.sandbox.admin_user = "65534"
            report = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
            assert report.refused and not report.quiesced, report
            assert "initial PID namespace" in " ".join(report.reasons)
            state = Path(f"/proc/{canary.pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
            assert state != "T"
    finally:
        canary.kill()
        canary.wait()


@pytest.mark.parametrize("engine", CONTAINERS)
def test_T13_a_process_of_another_user_is_reported_unquiesced(engine: str) -> None:
    with rig(engine) as r:
        path = writer(r)
        r.sandbox.admin_user = "65534"
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.admin_user = "0"
        r.sandbox.continue_processes()
        assert not report.quiesced and not report.refused, report
        assert any("another user" in why for why in report.reasons), report
        grows(r, path)


@pytest.mark.parametrize("engine", ["docker-busybox", "docker-gnu", "podman-gnu"])
def test_T13_a_writer_that_is_pid_1_means_unquiesced(engine: str) -> None:
    """PID 1 writes with builtins only (one that forks a ``sleep`` waits on it once the
    quiesce stopped it: then it is idle, and its counters say so, ADR 0008)."""
    spin = "i=0; while [ $i -lt 300 ]; do i=$((i + 1)); done"
    loop = f"mkdir -p /tmp/iterion-scratch; while :; do echo x >> /tmp/iterion-scratch/w; {spin}; done"
    with rig(engine, command=["sh", "-c", loop]) as r:
        wait_until_written(r, "/tmp/iterion-scratch/w")
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.continue_processes()
        assert not report.quiesced, report
        assert any("pid 1 (sh)" in why for why in report.reasons), report


def test_T13_a_proc_that_hides_other_users_processes_means_unquiesced() -> None:
    """/proc mounted hidepid: the script cannot check every process, and says so."""
    with rig("local") as r:
        writer(r)
        r.sh("mount -o remount,hidepid=2 /proc")
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.continue_processes()
        assert not report.quiesced and not report.refused, report
        assert any("hidepid" in why for why in report.reasons), report


def test_T13_a_multithreaded_writer_is_stopped_whole() -> None:
    """Every thread of a writer is checked, not just its main thread."""
    with rig("local") as r:
        r.sh(f"mkdir -p {r.scratch}")
        path = f"{r.scratch}/threads"
        code = (
            "import threading,time\n"
            "def w():\n"
            f"    f=open('{path}','a')\n"
            "    while True: f.write('x'*4096); f.flush()\n"
            "[threading.Thread(target=w).start() for _ in range(3)]\n"
            "time.sleep(1000)\n"
        )
        Path(r.scratch, "w.py").write_text(code)
        r.spawn(f"python3 {r.scratch}/w.py")
        wait_until_written(r, path)  # python3 starts slowly on a loaded machine
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=2)
        try:
            assert report.quiesced, report
            assert frozen(r, f"{r.scratch}/w.py")
        finally:
            r.sandbox.continue_processes()


def test_T14_the_watchdog_continues_when_the_banking_side_never_comes_back(any_rig: Rig) -> None:
    path = writer(any_rig)
    report = any_rig.sandbox.quiesce(budget_seconds=2, wait_seconds=1)
    assert report.quiesced, report
    assert frozen(any_rig, path)
    grows(any_rig, path)  # nobody says "cont": the watchdog's budget runs out, it continues them


def test_T17_T18_archive_through_a_link_and_an_empty_scratch(any_rig: Rig) -> None:
    r = any_rig
    real = f"{r.scratch}-real"
    r.sh(
        f"rm -rf {r.scratch} {real}; mkdir -p {real}/sub && echo data > {real}/sub/f && ln -s {real} {r.scratch}"
    )
    out = io.BytesIO()
    report = r.sandbox.archive(out, compress=False, verify=False)
    names = [m.path for m in _members(out.getvalue())]
    assert not report.empty and "sub/f" in names
    r.sh(f"rm -rf {r.scratch} {real}; mkdir -p {r.scratch}")
    assert r.sandbox.archive(io.BytesIO(), compress=False, verify=False).empty
    r.sh(f"rm -rf {r.scratch}")
    assert r.sandbox.archive(io.BytesIO(), compress=True, verify=False).empty


def test_T17_a_socket_in_the_scratch_is_neutral() -> None:
    import socket

    with rig("local") as r:
        r.sh(f"mkdir -p {r.scratch} && echo x > {r.scratch}/f")
        s = socket.socket(socket.AF_UNIX)
        s.bind(f"{r.scratch}/sock")
        try:
            report = r.sandbox.archive(io.BytesIO(), compress=False, verify=False)
            assert not report.empty and report.raced == ()
        finally:
            s.close()


def test_T16_a_writer_racing_an_unquiesced_tar_is_named(any_rig: Rig) -> None:
    """Without quiesce, a file growing while tar reads is named as raced on both tars."""
    r = any_rig
    r.sh(f"mkdir -p {r.scratch} && dd if=/dev/zero of={r.scratch}/big bs=1M count=40 2>/dev/null")
    r.spawn(f"while :; do echo x >> {r.scratch}/big; done")
    raced: tuple[str, ...] = ()
    for _ in range(5):
        raced = r.sandbox.archive(io.BytesIO(), compress=False, verify=True).raced
        if raced:
            break
    assert "./big" in raced


def test_X2_restore_reproduces_files_modes_links_and_mtimes(any_rig: Rig) -> None:
    r = any_rig
    r.sh(
        f"rm -rf {r.scratch}; mkdir -p {r.scratch}/d && cd {r.scratch} && echo hello > f && "
        "chmod 4750 f && ln f hard && ln -s f link && touch -d '2020-01-02 03:04:05' f d"
    )
    banked = io.BytesIO()
    r.sandbox.archive(banked, compress=True, verify=False)
    canonical, _sha, manifest = _canonical(banked.getvalue(), gz=True)
    r.sh(f"rm -rf {r.scratch}")
    _restore(r.sandbox, canonical)
    assert r.sandbox.list_scratch() == manifest
    stat = r.sh(f"cd {r.scratch} && stat -c '%n %a %Y' f hard d && readlink link")
    assert "f 750 1577934245" in stat  # setuid cleared, mtime exact
    assert "hard 750" in stat and "d 755 1577934245" in stat and stat.strip().endswith("f")


def test_X2_a_cut_stream_is_broken_not_refused(any_rig: Rig) -> None:
    r = any_rig
    r.sh(f"rm -rf {r.scratch}; mkdir -p {r.scratch} && echo x > {r.scratch}/f")
    banked = io.BytesIO()
    r.sandbox.archive(banked, compress=False, verify=False)
    canonical, _sha, _ = _canonical(banked.getvalue(), gz=False)
    with pytest.raises(StreamBroken):
        _restore(r.sandbox, canonical, cut=600)
    assert r.sh(f"cat {r.scratch}/f").strip() == "x"  # the old scratch is untouched


@pytest.mark.parametrize("engine", CONTAINERS)
def test_X2_a_read_only_or_full_scratch_is_refused_by_tar(engine: str) -> None:
    with rig(engine, tmpfs={"/tmp/full": "size=64k"}) as r:
        data = b"z" * 200_000
        canonical, sha = _one_file_archive(data)
        r.sandbox.facts = _with_scratch(r.sandbox.facts, "/tmp/full/scratch")
        with pytest.raises(RestoreRefused):
            _restore(r.sandbox, canonical)
        r.sh("mkdir -p /tmp/ro && chmod 555 /tmp/ro")
        r.sandbox.facts = _with_scratch(r.sandbox.facts, "/tmp/ro/scratch")
        with pytest.raises(RestoreRefused):
            _restore_as(r, "65534", canonical, sha)  # nobody cannot write under /tmp/ro


@pytest.mark.parametrize("engine", ["local", "k8s-double"])
def test_X2_a_full_scratch_is_refused_by_tar_in_a_namespace(engine: str) -> None:
    """The sandbox's own mount namespace: a 64 KiB tmpfs that a 200 KB bank cannot fill."""
    with rig(engine) as r:
        full = f"{r.scratch}-full"
        r.sh(f"mkdir -p {full} && mount -t tmpfs -o size=64k tmpfs {full}")
        canonical, _sha = _one_file_archive(b"z" * 200_000)
        r.sandbox.facts = _with_scratch(r.sandbox.facts, f"{full}/scratch")
        with pytest.raises(RestoreRefused):
            _restore(r.sandbox, canonical)


def test_T19_a_sandbox_that_is_gone_is_named() -> None:
    with rig("docker-busybox") as r:
        sandbox = r.sandbox
    with pytest.raises(SandboxGone):
        sandbox.archive(io.BytesIO(), compress=False, verify=False)


def test_engines_listed() -> None:
    """The rigs cover the local sandbox, both container engines and the Kubernetes double; the
    image (tests/test_image.py, which may run first) is the one other engine a test may name."""
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


# -- helpers ------------------------------------------------------------------------------


def _members(tar: bytes):  # type: ignore[no-untyped-def]
    reader = TarReader()
    reader.feed(tar)
    reader.close()
    return reader.members


def _canonical(archive: bytes, *, gz: bool) -> tuple[bytes, str, list[str]]:
    from scratchbank.application.bank_format.gunzip import GzipReader

    out = io.BytesIO()
    writer_ = CanonicalWriter(out)
    reader = TarReader(on_member=writer_.member, on_data=writer_.data)
    if gz:
        gzr = GzipReader(reader.feed, 1 << 30)
        gzr.feed(archive)
        gzr.close()
    else:
        reader.feed(archive)
    reader.close()
    sha = writer_.finish()
    assert Manifest.of(reader.members).entries == len(manifest_lines(reader.members))
    return out.getvalue(), sha, manifest_lines(reader.members)


def _one_file_archive(data: bytes) -> tuple[bytes, str]:
    from scratchbank.application.bank_format.members import DIR, FILE, Member

    out = io.BytesIO()
    w = CanonicalWriter(out)
    w.member(Member("", DIR, 0, 0o755, 0))
    w.member(Member("f", FILE, len(data), 0o644, 0))
    w.data(data)
    sha = w.finish()
    return out.getvalue(), sha


def _with_scratch(facts, scratch: str):  # type: ignore[no-untyped-def]
    import attrs

    return attrs.evolve(facts, scratch=scratch)


def _restore(sandbox, canonical: bytes, *, cut: int | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """Stage then commit, as the restore use case does; a cut stream sends a wrong end frame."""
    from scratchbank.adapters.restore_wire import FramedStream

    listing = io.BytesIO()
    if cut is None:
        staged = sandbox.stage_restore(io.BytesIO(canonical), compressed=False, listing=listing)
    else:
        framed = FramedStream(io.BytesIO(canonical)).read()
        broken = framed[: cut + 8] + b"end %d %s\n" % (len(canonical), b"0" * 64)
        done = sandbox.run(
            RESTORE_SCRIPT, ["stage", sandbox.facts.scratch, "cut", "raw", "0"], stdin=io.BytesIO(broken)
        )
        if done.exit_code == 20:
            raise StreamBroken(done.err)
        raise AssertionError(f"expected a broken stream, got exit {done.exit_code}: {done.err}")
    sandbox.commit_restore(staged)
    return sorted(listing.getvalue().decode().splitlines())


def _restore_as(r: Rig, user: str, canonical: bytes, sha: str) -> None:
    from scratchbank.adapters.restore_wire import TAR_REFUSED, FramedStream
    from scratchbank.adapters.scripted import RESTORE

    done = r.sandbox.run(
        RESTORE,
        ["stage", r.sandbox.facts.scratch, "as-user", "raw", "0"],
        stdin=FramedStream(io.BytesIO(canonical)),  # type: ignore[arg-type]
        user=user,
    )
    if done.exit_code == TAR_REFUSED:
        raise RestoreRefused(done.err)
    raise AssertionError(f"expected a refusal, got exit {done.exit_code}: {done.err}")
