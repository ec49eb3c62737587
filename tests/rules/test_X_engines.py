"""Rules X: restoring the bank into the new sandbox. The engines tier's tests of X1, X2, X4, X5, X6
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
from hostile import corpus, end, gz, member, pax_header, pax_payload, record_for, ustar
from rigs.forked_child import NOBODY, in_child, root_dir
from rigs.host_directory_restore import restore_into
from rigs.real_sandboxes import (  # noqa: F401 - a fixture
    CONTAINERS,
    SCRATCH,
    KeptContainers,
    Rig,
    kept_containers,
    rig,
)
from rigs.s3_buckets import new_bucket, s3_client
from rigs.sandbox_probes import (
    _canonical,
    _one_file_archive,
    _restore,
    _restore_as,
    _with_scratch,
    any_rig,  # noqa: F401 - a fixture
    kept_rig,  # noqa: F401 - a fixture
)
from rigs.sandbox_restores import (
    SEED,
    LosesAnEntry,
    box,  # noqa: F401 - a fixture
    files,
    fingerprint,
    reason,
    restore,
)
from rigs.stalls import (
    STALL_SECONDS,
    TIMES,
    _Endless,
    s3_bucket,  # noqa: F401 - a fixture
    through_proxy,  # noqa: F401 - a fixture
)

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.cancellation import Deadline
from scratchbank.application.resume import resume
from scratchbank.domain import SCRATCH_NOT_PORTABLE, RestoreResult, ResumeRequest
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed, RestoreRefused, StreamBroken
from scratchbank.domain.records import ScratchBanked, ScratchRestored
from scratchbank.testing.builders import started
from scratchbank.testing.contracts import check_stall

# ---- from tests/rules/test_[TX]*.py: Findings of an independent attack on the restore path (issue 10's promises), each a test that fails on the ``attack`` branch as it stands and passes once the hole is closed.


# -- X2, most severe: a bank writes outside the scratch in a BusyBox sandbox ------------------------
def test_X2_a_bank_never_creates_a_file_outside_the_scratch_in_a_busybox_sandbox() -> None:
    """The reader checks a member's parents against a cache of directories (``_dirs``)
    and finds a symlink standing where an implicit parent was only when the member log's
    batch lands (``MemberLog.flush``, every 2,048 rows, or at the end). Bytes:

      ./  f (4 bytes "PWN")  fifo d/p (d: implicit, in the cache; fifos are not streamed)
      2,100 fifos (the batch with ``d`` lands)  e -> /tmp/victim  d -> e
      hard link d/pwned -> f

    The reader refuses the bank at its end ("'d' is a parent of earlier members but not a
    directory"), but the canonical stream has already carried ``e``, ``d`` and ``d/pwned``
    into the sandbox. BusyBox tar creates ``d -> e`` at once, defers ``e -> /tmp/victim``
    and the hard link to the end, then makes ``e`` and ``link(f, d/pwned)``: through the
    two links the hard link lands at ``/tmp/victim/pwned``. The host reports
    REFUSED_ON_HOST and discards the staging directory; ``/tmp/victim/pwned`` ("PWN")
    stays (any directory on the container's root filesystem works: ``/etc`` too)."""
    raw = (
        root_dir()
        + ustar(member("f", size=4), b"PWN\n")
        + ustar(member("d/p", tarfile.FIFOTYPE))
        + b"".join(ustar(member(f"q{i}", tarfile.FIFOTYPE)) for i in range(2100))
        + ustar(member("e", tarfile.SYMTYPE, linkname="/tmp/victim"))
        + ustar(member("d", tarfile.SYMTYPE, linkname="e"))
        + ustar(member("d/pwned", tarfile.LNKTYPE, linkname="f"))
        + end()
    )
    with rig("docker-busybox") as r:
        r.sh("mkdir -p /tmp/victim && echo canary > /tmp/victim/canary")
        out = restore(gz(raw), r.sandbox)
        victim = r.sh("ls -A /tmp/victim").split()
    assert victim == ["canary"], out.restore.record.reason if out.restore else out


def test_X2_the_reader_never_streams_a_member_under_a_path_it_already_streamed_as_a_symlink() -> None:
    """The same bank at the reader (no Docker): what ``on_member`` hands the canonical
    writer must never hold a member under a path it has already handed over as a symlink,
    whatever the bank says later. Today it streams ``e``, ``d -> e`` and then ``d/pwned``
    and only refuses at the end. Proves ``scratchbank.application.bank_format.reader.TarReader``."""
    from scratchbank.application.bank_format.reader import TarReader
    from scratchbank.domain.errors import HostileArchive

    raw = (
        root_dir()
        + ustar(member("f", size=4), b"PWN\n")
        + ustar(member("d/p", tarfile.FIFOTYPE))
        + b"".join(ustar(member(f"q{i}", tarfile.FIFOTYPE)) for i in range(2100))
        + ustar(member("d", tarfile.SYMTYPE, linkname="e"))
        + ustar(member("d/pwned", tarfile.LNKTYPE, linkname="f"))
        + end()
    )
    streamed: list[str] = []
    links: set[str] = set()
    under_a_link: list[str] = []

    def on_member(m: object) -> None:
        path, kind = m.path, m.type  # type: ignore[attr-defined]
        if any(path.startswith(link + "/") for link in links):
            under_a_link.append(path)
        if kind == "symlink":
            links.add(path)
        streamed.append(path)

    reader = TarReader(on_member=on_member)

    def read_all() -> None:
        reader.feed(raw)
        reader.close()

    with pytest.raises(HostileArchive):
        read_all()
    assert under_a_link == [], streamed[-3:]


# -- X4, most severe: a refused restore wipes a scratch that is a mount point ------------------
@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X4_a_refused_restore_into_a_scratch_that_is_a_mount_point_leaves_it_as_it_was(flavour: str) -> None:
    """The scratch is its own filesystem (a 1 MiB tmpfs; a volume or an emptyDir is the
    same). restore.sh checks free space on the scratch's *parent*, stages there, and at
    commit, since a mount point cannot be renamed, first deletes every entry of the
    scratch and then moves the staged entries in one by one: the 1.5 MB bank fills the
    mount mid-move. The restore is refused (RESTORE_REFUSED), but the scratch has lost
    its own files and holds a half-copied bank (and the staging stays beside it).
    Proves ``scratchbank.application.resume.resume``."""
    with rig(f"docker-{flavour}", tmpfs={SCRATCH: "size=1m"}) as r:
        r.sh(f"mkdir -p {SCRATCH}/keep && echo mine > {SCRATCH}/keep/file && ln -s keep/file {SCRATCH}/link")
        before = fingerprint(r)
        bank = b"".join(ustar(member(f"big{i}", size=300_000), b"y" * 300_000) for i in range(5))
        out = restore(gz(root_dir() + bank + end()), r.sandbox)
        assert out.restore is not None
        if out.restore.park is not None:  # refused: then nothing may have changed
            assert fingerprint(r) == before, out.restore.record.reason
        else:  # or it fits after all (the old tree's room counted): then it is all there
            assert r.sh(f"cat {SCRATCH}/big4 | wc -c").strip() == "300000"


# -- X2/X5: a bank with a mode-0 directory is "a broken stream" forever in a non-root sandbox ---
@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X2_a_mode_0_directory_in_a_non_root_sandbox_is_never_a_broken_stream(flavour: str) -> None:
    """A sandbox whose user is not root (user 1000). The bank holds one directory of mode
    000 (``chmod 000 d`` inside any sandbox makes it). The sandbox's tar extracts it, then
    restore.sh's ``find`` cannot read it and exits 12, which the adapter reports as
    STREAM_BROKEN: the run parks *without a code*, which X5 reserves for a transport
    failure the runner redelivers and no consent skips, so the same bank is tried again
    and again and the run can never go on. The staging directory is also left beside the
    scratch. It must be a restore (or a refusal with SCRATCH_NOT_PORTABLE, X4) that leaves
    nothing staged. Proves ``scratchbank.application.resume.resume``."""
    with rig(f"docker-{flavour}", user="1000") as r:
        r.sh(f"mkdir -p {SCRATCH}/keep && echo mine > {SCRATCH}/keep/file && chown -R 1000 {SCRATCH}")
        before = fingerprint(r)
        raw = root_dir() + ustar(member("locked", tarfile.DIRTYPE, mode=0)) + ustar(member("f", size=1), b"z")
        out = restore(gz(raw + end()), r.sandbox)
        assert out.restore is not None
        park = out.restore.park
        assert park is None or park.code == SCRATCH_NOT_PORTABLE, out.restore.record.reason
        if park is not None:
            assert fingerprint(r) == before
        assert r.beside() == "0"


# -- X6/X2: restoring over a tree with a read-only directory, as a non-root host --------------
def test_X6_a_restore_over_a_read_only_directory_is_named_and_leaves_nothing_beside() -> None:
    """The host process is not root (uid 65534 here). A first bank holds ``ro/`` mode 0555
    with a file in it (a Go module cache looks like that). A second restore into the same
    directory swaps the new tree in, then cannot remove the old one: a raw PermissionError
    escapes ``resume()`` (no restore record, no park, ``run_resumed`` standing) and the old
    tree stays beside the destination as ``.scratchbank-restore-*``."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    base = Path(tempfile.mkdtemp(prefix="sb-attack-"))  # reachable by the other uid
    base.chmod(0o755)
    outer = base / "outer"
    (outer / "dest").mkdir(parents=True)
    (outer / "canary").write_text("canary")
    for p in (outer, outer / "dest", outer / "canary"):
        os.chown(p, NOBODY, NOBODY)
    bank = gz(
        root_dir()
        + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
        + ustar(member("ro/f", size=1), b"r")
        + end()
    )

    def twice() -> object:
        first = restore_into(bank, outer / "dest")
        assert first.proceeds, first
        second = restore_into(bank, outer / "dest")
        assert second.restore is not None and isinstance(second.restore.record, ScratchRestored)
        return second.restore.record.reason or "restored"

    try:
        answer = in_child(twice, uid=NOBODY)
        left = sorted(p.name for p in outer.iterdir())
    finally:
        shutil.rmtree(base)  # as root
    assert "result" in answer, answer
    assert left == ["canary", "dest"]


# -- X6: a 1.4 KB bank pins the host for minutes (hours at the member cap) --------------------
def test_X6_symlink_containment_of_a_tiny_bank_is_decided_in_bounded_time(tmp_path: Path) -> None:
    """40 symlinks ``c0 -> a/a/.../a/../../.../c1`` ... ``c39 -> f`` (each target 4 KB:
    800 components down, 800 back up; contained), and a few ``sN -> c0``. The containment
    check (bank_format/link_containment.py) resolves every link from scratch, component by component, with
    one SQLite lookup per component and 40 hops each: ~64k lookups per link, about 2-3 s of
    one core per link here. This 1.4 KB bank takes ~100 s; 200k ``sN`` links (still a
    few hundred KB gzip'd, within every cap) would take days. No named refusal, no bound.
    A linear check (memoised resolution, or a work budget refused by name) takes well under
    a second. Proves ``scratchbank.application.resume.resume``."""
    chain = b"".join(
        pax_header(pax_payload([("linkpath", "a/" * 800 + "../" * 800 + (f"c{k + 1}" if k < 39 else "f"))]))
        + ustar(member(f"c{k}", tarfile.SYMTYPE, linkname="x"))
        for k in range(40)
    )
    short = b"".join(ustar(member(f"s{i}", tarfile.SYMTYPE, linkname="c0")) for i in range(20))
    bank = gz(root_dir() + ustar(member("f", size=1), b"z") + chain + short + end())
    assert len(bank) < 2000

    def go() -> object:
        out = restore_into(bank, tmp_path / "dest")
        return out.proceeds

    answer = in_child(go, timeout=20.0)
    assert "timeout" not in answer, "a 1.4 KB bank kept the host restore busy for more than 20 s"
    assert "result" in answer, answer


# -- X4: a "refused" commit that already replaced the scratch (non-root sandbox) ----------------
@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X4_a_commit_reported_refused_has_not_replaced_the_scratch(flavour: str) -> None:
    """Non-root sandbox (user 1000) whose scratch holds a read-only directory ``ro/``
    (0555, with a file: a Go module cache, a checked-out read-only tree). restore.sh
    commit moves the old scratch aside, moves the staged tree in, then ``rm -rf`` of the
    old tree fails on ``ro/`` and, being commit's last command, makes it exit non-zero:
    the restore is recorded as refused (RESTORE_REFUSED, X4 parks SCRATCH_NOT_PORTABLE)
    while the scratch already holds the bank's tree, and the old scratch is left beside
    it as ``.scratchbank-staged.*.old``. Either the restore succeeded (and nothing is left
    beside the scratch) or it was refused and the scratch is byte for byte as it was.
    Proves ``scratchbank.application.resume.resume``."""
    with rig(f"docker-{flavour}", user="1000") as r:
        r.sh(
            f"mkdir -p {SCRATCH}/ro && echo mine > {SCRATCH}/ro/file && chmod 555 {SCRATCH}/ro "
            f"&& chown -R 1000 {SCRATCH}"
        )
        before = fingerprint(r)
        out = restore(gz(root_dir() + ustar(member("new", size=3), b"new") + end()), r.sandbox)
        assert out.restore is not None
        if out.restore.park is not None:
            assert fingerprint(r) == before, out.restore.record.reason
        leftovers = r.beside()
        assert leftovers == "0"


# -- X1/X2: BusyBox as non-root cannot restore a read-only directory at all -------------------
def test_X2_a_read_only_directory_restores_in_a_non_root_busybox_sandbox() -> None:
    """A benign bank: ``ro/`` mode 0555 holding ``ro/f``. GNU tar (non-root) restores it
    (it delays directory modes); BusyBox tar creates ``ro`` 0555 first and then cannot
    create ``ro/f``: every resume of such a run is refused (RESTORE_REFUSED), so the
    bank can never be restored into a BusyBox sandbox that does not run as root.
    Proves ``scratchbank.application.resume.resume``."""
    with rig("docker-busybox", user="1000") as r:
        r.sh(f"mkdir -p {SCRATCH} && chown -R 1000 {SCRATCH}")
        raw = (
            root_dir()
            + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
            + ustar(member("ro/f", size=1, mode=0o444), b"z")
            + end()
        )
        out = restore(gz(raw), r.sandbox)
        assert out.proceeds, out.restore.record.reason if out.restore else out
        assert r.sh(f"cat {SCRATCH}/ro/f") == "z"


# -- X4/X6: removing the old scratch crosses mount points and deletes what is mounted there ------
@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X4_a_restore_never_deletes_files_of_a_volume_mounted_inside_the_scratch(
    flavour: str, tmp_path: Path
) -> None:
    """The sandbox has a host directory mounted inside its scratch (``scratch/cache``: a
    shared cache volume). Any bank, even a one-file one: restore.sh commit moves the old
    scratch aside (the mount moves with it) and ``rm -rf``s it, which walks into the
    mount and deletes the host's files, then fails on the mount point itself (EBUSY),
    so the restore is reported refused while the scratch was replaced, and the old tree
    stays beside it. The host directory must keep its files.
    Proves ``scratchbank.application.resume.resume``."""
    host = tmp_path / "volume"
    host.mkdir()
    (host / "precious").write_text("keep me")
    with rig(f"docker-{flavour}", volumes={str(host): {"bind": f"{SCRATCH}/cache", "mode": "rw"}}) as r:
        r.sh(f"echo mine > {SCRATCH}/own")
        out = restore(gz(root_dir() + ustar(member("new", size=1), b"z") + end()), r.sandbox)
        assert out.restore is not None
    assert sorted(p.name for p in host.iterdir()) == ["precious"], out.restore.record.reason
    assert (host / "precious").read_text() == "keep me"


def test_X6_replacing_the_old_tree_never_deletes_through_a_mount_point_inside_it(tmp_path: Path) -> None:
    """Host-directory restore (X6) over a destination that has a directory bind-mounted
    inside it (``dest/cache`` -> ``outside``). After the swap, ``shutil.rmtree`` of the old
    tree walks into the mount and deletes ``outside/data`` (outside the destination), then
    fails on the mount point (EBUSY): a raw OSError escapes ``resume()`` and the old tree
    stays beside the destination as ``.scratchbank-restore-*``."""
    import ctypes
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    (dest / "cache").mkdir(parents=True)
    (dest / "old").write_text("old")
    outside.mkdir()
    (outside / "data").write_text("precious")
    bank = gz(root_dir() + ustar(member("f", size=1), b"z") + end())

    def in_own_mount_namespace() -> object:
        if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) != 0:  # CLONE_NEWNS
            return "no mount namespace"
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "--bind", str(outside), str(dest / "cache")], check=True)
        out = restore_into(bank, dest)
        return out.restore.record.reason if out.restore else "no restore"

    answer = in_child(in_own_mount_namespace)
    if answer == {"result": repr("no mount namespace")}:
        pytest.skip("cannot make a mount namespace here")
    assert (outside / "data").exists(), answer
    assert "raised" not in answer, answer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "outside"]


def test_X6_a_destination_that_is_itself_a_mount_point_is_refused_by_name_before_any_write(
    tmp_path: Path,
) -> None:
    """The destination is itself a mount point (a volume): it cannot be swapped (EBUSY). It is
    refused first, naming the mount point, not after the whole tree was written beside it and
    the swap failed with a remedy about permissions or space; the volume keeps its files.
    Proves ``scratchbank.adapters.host_directory.refuse_mount_points``."""
    import ctypes
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    volume, dest = tmp_path / "volume", tmp_path / "dest"
    volume.mkdir()
    dest.mkdir()
    (volume / "old").write_text("old")
    bank = gz(root_dir() + ustar(member("f", size=1), b"z") + end())

    def in_own_mount_namespace() -> object:
        if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) != 0:  # CLONE_NEWNS
            return "no mount namespace"
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "--bind", str(volume), str(dest)], check=True)
        out = restore_into(bank, dest)
        return out.restore.record.reason if out.restore else "no restore"

    answer = in_child(in_own_mount_namespace)
    if answer == {"result": repr("no mount namespace")}:
        pytest.skip("cannot make a mount namespace here")
    assert "is a mount point" in str(answer) and "DESTINATION_REFUSED" in str(answer), answer
    assert sorted(p.name for p in volume.iterdir()) == ["old"] and (volume / "old").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "volume"]


# -- X6 (minor): a refused host-directory restore still creates the destination's parents ------
def test_X6_a_restore_refused_for_space_creates_nothing_outside_the_destination(tmp_path: Path) -> None:
    """The destination ``tmp/new/deeper/dest`` does not exist yet. The restore is refused
    (NO_SPACE_AT_DESTINATION: the bank declares more than the disk has), yet
    ``opened_destination`` has already made ``new/`` and ``new/deeper/`` (mkdir -p of the
    parent happens before the free-space check): a refused restore changed the host."""
    bank = gz(root_dir() + ustar(member("f", size=1), b"z") + end())
    out = restore_into(bank, tmp_path / "new" / "deeper" / "dest", manifest_bytes=1 << 60)
    assert out.restore is not None and out.restore.park is not None
    assert "NO_SPACE_AT_DESTINATION" in out.restore.record.reason
    assert list(tmp_path.iterdir()) == []


# -- X4: a refusal leaves the staged tree behind when it holds a read-only directory -----------
def test_X4_a_refused_restore_leaves_nothing_staged_in_a_non_root_gnu_sandbox() -> None:
    """Non-root GNU sandbox (user 1000). The bank holds ``ro/`` (0555) with ``ro/f``, then
    a member the host refuses (``../escape``). GNU tar still applies its delayed directory
    modes when the stream is cut, so ``ro`` ends 0555 with a file in it, and both
    restore.sh's ``rm -rf "$staged"`` and the host's discard fail silently: each refused
    try leaves a ``.scratchbank-staged.*`` tree (the whole bank, up to the cap) beside
    the scratch, and every retry adds one more. Proves ``scratchbank.application.resume.resume``."""
    with rig("docker-gnu", user="1000") as r:
        r.sh(f"mkdir -p {SCRATCH}/keep && echo mine > {SCRATCH}/keep/file && chown -R 1000 {SCRATCH}")
        before = fingerprint(r)
        raw = (
            root_dir()
            + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
            + ustar(member("ro/f", size=1), b"z")
            + ustar(member("../escape", size=1), b"x")
            + end()
        )
        out = restore(gz(raw), r.sandbox)
        assert out.restore is not None and "refused_on_host" in out.restore.record.reason
        assert fingerprint(r) == before  # its last line counts what is staged beside the scratch


# ---- from tests/contracts/test_bank_store_contract.py: The BankStore contract against every adapter, and each adapter's own edges.


@pytest.mark.s3
def test_X5_missing_bucket_is_read_again_not_gone(s3_endpoint: str) -> None:
    """Missing bucket is read again not gone: ``scratchbank.adapters.s3_bank.S3BankStore``."""
    store = S3BankStore("no-such-bucket-" + uuid.uuid4().hex[:8], client=s3_client(s3_endpoint))
    with pytest.raises(BankReadFailed) as caught:
        store.fetch("run-1", io.BytesIO(), max_bytes=10)
    assert not isinstance(caught.value, BankGone)


@pytest.mark.s3
def test_X4_only_no_such_key_is_gone(s3_endpoint: str) -> None:
    """Only no such key is gone: ``scratchbank.adapters.s3_bank.S3BankStore``."""
    store = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    with pytest.raises(BankGone):
        store.fetch("run-1", io.BytesIO(), max_bytes=10)


def test_X5_unreachable_s3_is_read_again() -> None:
    """Unreachable s3 is read again: ``scratchbank.adapters.s3_bank.S3BankStore``."""
    store = S3BankStore("b", client=s3_client("http://127.0.0.1:9"))
    with pytest.raises(BankReadFailed):
        store.fetch("run-1", io.BytesIO(), max_bytes=10)
    with pytest.raises(BankWriteFailed):
        store.delete("run-1")


# ---- from tests/test_deadlines.py: Every call has a deadline (T8, T14, X5): a stalled transport fails in time, by name.


@pytest.mark.parametrize("engine", ["local", "docker-busybox", "podman-busybox", "k8s-double"])
def test_X2_a_command_that_exits_without_reading_its_stdin_ends_with_its_own_status(
    engine: str, kept_containers: KeptContainers
) -> None:
    """A restore refused before it reads its stream (no room, a mount point) exits at once:
    its exit status is the answer, never a cut at the deadline while the host still tries
    to send a stream nobody reads (Docker kept the hijacked socket open: 80 s per refusal).
    Proves ``scratchbank.application.cancellation.Deadline.after``."""
    with kept_containers.rig(engine) as r:
        deadline = Deadline.after(60)
        done = r.sandbox.run("exit 21", [], stdin=_Endless(), deadline=deadline)  # type: ignore[arg-type]
        assert done.exit_code == 21
        # Not a speed goal: the exec must not have sat out its deadline (60 s) waiting on a
        # send nobody reads; an exec here takes a few seconds at most, even on a loaded machine.
        assert deadline.left() > 30, "the exec waited for its deadline after the command exited"


def test_X5_a_fetch_whose_stream_stalls_mid_object_fails_in_time(
    through_proxy: tuple[S3BankStore, S3BankStore], tmp_path: Path
) -> None:
    """A fetch whose stream stalls mid object fails in time:
    ``scratchbank.adapters.s3_bank.S3BankStore.fetch``."""
    direct, stalled = through_proxy
    bank = tmp_path / "bank.tgz"
    bank.write_bytes(bytes(range(256)) * (16 << 10))  # 4 MiB, far past the proxy's 256 KiB
    name = direct.put("run-1", bank, sha256=hashlib.sha256(bank.read_bytes()).hexdigest())
    took = check_stall(
        lambda d: stalled.fetch("run-1", io.BytesIO(), max_bytes=1 << 30, name=name, deadline=d),
        seconds=STALL_SECONDS,
        expect=(BankReadFailed,),
    )
    TIMES["s3"] = {**TIMES.get("s3", {}), "fetch stalls": took}
    print(f"\nstall times {TIMES}")


# ---- from tests/test_end_to_end.py: Bank in one real container, restore into a new one: Docker and Podman, a real S3 server and a real PostgreSQL timeline. Then the hostile corpus against real tars.


@pytest.mark.parametrize("engine", ["docker-busybox", "docker-gnu"])
def test_X2_the_hostile_corpus_never_reaches_the_sandbox(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_containers: KeptContainers
) -> None:
    """Each hostile bank, recorded as banked with its true size and digest, is refused on
    the host; the sandbox's filesystem is untouched and the host's temp area is clean
    (this test's own temp area: other processes share /tmp).
    Proves ``scratchbank.application.resume.resume``."""
    import hashlib
    import os
    import tempfile

    from scratchbank.adapters.memory import InMemoryTimeline

    store = FilesystemBankStore(tmp_path / "banks")
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    with kept_containers.rig(engine) as r:
        r.sh("mkdir -p /tmp/outside && echo safe > /tmp/outside/sentinel && touch /tmp/marker && sleep 1")
        for name, data, _ in corpus():
            timeline = InMemoryTimeline()
            src = tmp_path / "bank.tgz"
            src.write_bytes(data)
            name = store.put("run-h", src, sha256=hashlib.sha256(data).hexdigest())
            timeline.append(
                "run-h",
                [
                    started(),
                    ScratchBanked(
                        banked=True,
                        empty=False,
                        unknown=False,
                        bytes=len(data),
                        sha256=hashlib.sha256(data).hexdigest(),
                        object=name,
                    ),
                ],
            )
            out = resume("run-h", ResumeRequest(), timeline=timeline, store=store, sandbox=r.sandbox)
            assert out.restore is not None and out.restore.park is not None, name
            assert out.restore.park.code == SCRATCH_NOT_PORTABLE, name
            assert "refused_on_host" in out.restore.record.reason, (name, out.restore.record.reason)
        changed = r.sh(
            "find / -xdev -newer /tmp/marker ! -path '/proc*' ! -path '/sys*' ! -path '/dev*' "
            "! -path /tmp ! -path /tmp/marker 2>/dev/null",
            check=False,
        ).split()
        assert changed == []
        assert r.sh("cat /tmp/outside/sentinel").strip() == "safe"
    assert os.listdir(own_tmp) == []


# ---- from tests/rules/test_X_engines.py: X2/X4 in real sandboxes: the restore stages, lists NUL-separated, compares on the host and only then moves into place; every refusal leaves the scratch byte for byte as it was, with nothing staged left behind (issue 10 hole 4), on BusyBox and GNU userlands (Docker) and the local sandbox.


def test_X4_every_refusal_leaves_the_scratch_byte_for_byte_as_it_was(box: Rig) -> None:
    """Every refusal leaves the scratch byte for byte as it was: ``scratchbank.application.resume.resume``."""
    box.sh(SEED.format(s=box.scratch))
    before = fingerprint(box)
    many = files(*(f"d/f{i}" for i in range(200)))
    cases = {
        # valid members streamed first, then one the host refuses: the staging is discarded
        "refused on the host mid-stream": (
            gz(many + files("../escape") + end()),
            box.sandbox,
            "refused_on_host",
        ),
        "a corrupt gzip trailer": (gz(files("a") + end())[:-8] + b"\x00" * 8, box.sandbox, "refused_on_host"),
        "a partial restore": (gz(files("a", "b") + end()), LosesAnEntry(box.sandbox), "partial restore"),
    }
    for name, (data, sandbox, says) in cases.items():
        out = restore(data, sandbox)  # type: ignore[arg-type]
        assert says in reason(out), (name, reason(out))
        assert fingerprint(box) == before, name


def test_X4_a_tar_refusal_in_the_sandbox_leaves_the_scratch_as_it_was() -> None:
    """A tar refusal in the sandbox leaves the scratch as it was:
    ``scratchbank.application.resume.resume``."""
    with rig("docker-busybox", tmpfs={"/tmp/full": "size=256k"}) as r:
        r.sandbox.facts = attrs.evolve(r.sandbox.facts, scratch="/tmp/full/scratch")
        r.scratch = "/tmp/full/scratch"
        r.sh(SEED.format(s=r.scratch))
        before = fingerprint(r)
        big = ustar(member("big", size=400_000), bytes(range(256)) * 1562 + b"x" * 128)
        assert "refused_in_sandbox" in reason(restore(gz(big + end()), r.sandbox))
        assert fingerprint(r) == before


def test_X2_names_with_a_newline_and_any_byte_restore_and_list(box: Rig) -> None:
    """Names with a newline and any byte restore and list: ``scratchbank.application.resume.resume``."""
    names = ["new\nline", "tab\there", "back\\slash", "bytes-\udcff\udcfe", "sp ace", "dash-start"]
    raw = ustar(member("./", tarfile.DIRTYPE)) + b"".join(
        member(n, size=1).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + b"z" + b"\x00" * 511
        for n in names
    )
    out = restore(gz(raw + end()), box.sandbox)
    assert out.proceeds, out
    listed = box.sandbox.list_scratch()
    assert sorted(json.loads(line)[0] for line in listed) == sorted(names)


def test_X2_the_old_scratch_goes_after_the_commit_and_leftovers_at_the_next_stage(box: Rig) -> None:
    """The commit swaps the new tree in and removes the old one after the exec (the
    resume does not wait for it); an old tree a stopped sandbox left beside the scratch
    (``.scratchbank-staged.*.old``, read-only inside as a module cache is) is removed by
    the next restore's stage. Nothing of either stays, and the scratch is the bank's.
    Proves ``scratchbank.application.resume.resume``."""
    s = box.scratch
    box.sh(SEED.format(s=s))
    left = f"$(dirname {s})/.scratchbank-staged.dead.old"
    box.sh(f"mkdir -p {left}/ro && echo old > {left}/ro/f && chmod 555 {left}/ro")
    out = restore(gz(files("a/new", "top") + end()), box.sandbox)
    assert out.proceeds, out
    assert box.beside() == "0"
    assert box.sh(f"cat {s}/a/new") == "abc" and box.sh(f"ls {s}") == "a\ntop\n"


def test_X2_implicit_parent_directories_are_accepted(box: Rig) -> None:
    """Implicit parent directories are accepted: ``scratchbank.application.resume.resume``."""
    out = restore(gz(files("a/b/c/deep", "a/x", "top") + end()), box.sandbox)
    assert out.proceeds, out
    assert box.sh(f"cat {box.scratch}/a/b/c/deep") == "abc"


def test_X6_a_host_backed_scratch_holds_links_out_but_nothing_on_the_host_follows_them(
    tmp_path: Path,
) -> None:
    """In a sandbox links out are allowed by design: only the sandbox's tar creates them,
    and the host reads the staged tree as a listing, never through a link.
    Proves ``scratchbank.application.resume.resume``."""
    host = tmp_path / "scratch"
    host.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("untouched")
    volumes = {str(tmp_path): {"bind": "/tmp/hostdir", "mode": "rw"}}
    with rig("docker-busybox", volumes=volumes) as r:
        r.sandbox.facts = attrs.evolve(r.sandbox.facts, scratch="/tmp/hostdir/scratch")
        raw = ustar(member("./", tarfile.DIRTYPE)) + ustar(
            member("out", tarfile.SYMTYPE, linkname="../outside")
        )
        raw += ustar(member("abs", tarfile.SYMTYPE, linkname=str(outside / "secret"))) + files("f")
        out = restore(gz(raw + end()), r.sandbox)
        assert out.proceeds, out
    assert (host / "out").is_symlink() and (host / "f").read_bytes() == b"abc"
    assert (
        sorted(p.name for p in outside.iterdir()) == ["secret"]
        and (outside / "secret").read_text() == "untouched"
    )


def test_X2_thousands_of_long_names_list_exactly_on_busybox() -> None:
    """BusyBox's `xargs -0` splits names at its buffer boundaries; the listing must not.
    Proves ``scratchbank.application.resume.resume``."""
    names = [f"d{i % 40}/a-rather-long-file-name-to-fill-buffers-{i:05d}.json" for i in range(3000)]
    with rig("docker-busybox") as r:
        out = restore(gz(files(*names, size=1) + end()), r.sandbox)
        assert out.proceeds, out
        listed = [json.loads(line)[0] for line in r.sandbox.list_scratch()]
    assert sorted(p for p in listed if "/" in p) == sorted(names)


def test_X2_the_canonical_stream_may_go_gzip_level_1(box: Rig) -> None:
    """For a slow transport: the same staged restore over a gzip'd canonical stream.
    Proves ``scratchbank.application.resume.check_resume``."""
    from scratchbank.application.restore import restore_bank
    from scratchbank.application.resume import check_resume

    data = gz(files("z/one", "two") + end())
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-z", [started(), record])
    store.banks["run-z"] = data
    decision = check_resume(timeline, "run-z", ResumeRequest())
    attempt = restore_bank("run-z", decision, store=store, sandbox=box.sandbox, gzip_level=1)
    assert attempt.result is RestoreResult.RESTORED, attempt
    assert box.sh(f"cat {box.scratch}/z/one {box.scratch}/two") == "abcabc"


@pytest.mark.parametrize("flavour", ["busybox", "gnu"])
def test_X1_directory_modes_are_restored_as_banked_in_a_non_root_sandbox(flavour: str) -> None:
    """The stream carries directories u+rwx (a non-root tar must fill them) and commit
    applies the banked modes deepest first: a 0555 directory holding a file, a 0500 one
    under it and a name with a space and a newline all end with their banked modes.
    Proves ``scratchbank.application.resume.resume``."""
    with rig(f"docker-{flavour}", user="1000") as r:
        r.sh(f"mkdir -p {r.scratch} && chown -R 1000 {r.scratch}")
        raw = (
            ustar(member("./", tarfile.DIRTYPE, mode=0o755))
            + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
            + ustar(member("ro/in ner\n", tarfile.DIRTYPE, mode=0o500))
            + ustar(member("ro/in ner\n/f", size=1, mode=0o444), b"z")
            + ustar(member("ro/g", size=1, mode=0o644), b"y")
            + end()
        )
        out = restore(gz(raw), r.sandbox)
        assert out.proceeds, out.restore.record.reason if out.restore else out
        modes = r.sh(f"cd {r.scratch} && stat -c '%a' ro ro/in*").split()
        assert modes == ["555", "500"]
        assert r.sh(f"cat {r.scratch}/ro/g") == "y"


# ---- from tests/test_sandboxes.py: The sandbox adapters and their in-sandbox scripts, against real engines (T11-T18, X2).


def test_X2_restore_reproduces_files_modes_links_and_mtimes(kept_rig: Rig) -> None:
    """Restore reproduces files modes links and mtimes:
    ``scratchbank.application.bank_format.spill_log.manifest_lines``."""
    r = kept_rig
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


def test_X2_a_cut_stream_is_broken_not_refused(kept_rig: Rig) -> None:
    """A cut stream is broken not refused:
    ``scratchbank.application.bank_format.spill_log.manifest_lines``."""
    r = kept_rig
    r.sh(f"rm -rf {r.scratch}; mkdir -p {r.scratch} && echo x > {r.scratch}/f")
    banked = io.BytesIO()
    r.sandbox.archive(banked, compress=False, verify=False)
    canonical, _sha, _ = _canonical(banked.getvalue(), gz=False)
    with pytest.raises(StreamBroken):
        _restore(r.sandbox, canonical, cut=600)
    assert r.sh(f"cat {r.scratch}/f").strip() == "x"  # the old scratch is untouched


@pytest.mark.parametrize("engine", CONTAINERS)
def test_X2_a_read_only_or_full_scratch_is_refused_by_tar(engine: str) -> None:
    """A read only or full scratch is refused by tar:
    ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
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
    """The sandbox's own mount namespace: a 64 KiB tmpfs that a 200 KB bank cannot fill.
    Proves ``scratchbank.application.bank_format.writer.CanonicalWriter``."""
    with rig(engine) as r:
        full = f"{r.scratch}-full"
        r.sh(f"mkdir -p {full} && mount -t tmpfs -o size=64k tmpfs {full}")
        canonical, _sha = _one_file_archive(b"z" * 200_000)
        r.sandbox.facts = _with_scratch(r.sandbox.facts, f"{full}/scratch")
        with pytest.raises(RestoreRefused):
            _restore(r.sandbox, canonical)


# ---- The restore stream's form, chosen per engine and per bank (issue 24, ADR 0003 addendum 2026-12-02).
#: The form each engine's restore stream takes ("z": gzip level 1, "raw": a plain tar) for a
#: bank that compresses well and for one that does not (``restore.GZIP_BELOW``).
STREAM_FORMS = {
    "local": ("raw", "raw"),
    "docker-busybox": ("z", "raw"),
    "podman-busybox": ("raw", "raw"),
    "k8s-double": ("z", "raw"),
}


def _form_bank(compressible: bool) -> tuple[bytes, dict[str, bytes]]:
    """A small bank of text that gzips ~50x, or of random bytes that does not gzip at all."""
    import random

    rng = random.Random(24)
    bodies = {
        f"d/{i}.txt": (b"line %d of a log\n" % i) * 400 if compressible else rng.randbytes(16_000)
        for i in range(4)
    }
    raw = ustar(member("d", tarfile.DIRTYPE, mode=0o755))
    raw += b"".join(ustar(member(n, size=len(b)), b) for n, b in bodies.items())
    return gz(raw + end()), bodies


def _stream_forms(sandbox: Any) -> list[str]:
    """The form (``z`` or ``raw``) of every restore stream ``sandbox`` stages from now on."""
    forms: list[str] = []
    execute = sandbox.execute

    def spy(exec_: Any) -> Any:
        if exec_.args[:1] == ("stage",):
            forms.append(exec_.args[3])
        return execute(exec_)

    sandbox.execute = spy
    return forms


@pytest.mark.parametrize("name", sorted(STREAM_FORMS))
def test_X2_the_restore_stream_form_is_chosen_per_engine_and_bank(
    name: str, kept_containers: KeptContainers
) -> None:
    """Each engine's resume streams a compressible bank and an incompressible one in the
    form measured for it (ADR 0003), and both restore byte for byte.
    Proves ``scratchbank.application.restore.stream_gzip_level``."""
    with kept_containers.rig(name) as r:
        forms = _stream_forms(r.sandbox)
        for compressible in (True, False):
            data, bodies = _form_bank(compressible)
            out = restore(data, r.sandbox)
            assert out.proceeds, out
            got = r.sh(f"cd {r.scratch} && md5sum d/*.txt")
            assert got.split() == [
                w for n, b in sorted(bodies.items()) for w in (hashlib.md5(b).hexdigest(), n)
            ]
    assert tuple(forms) == STREAM_FORMS[name]


def test_X2_a_sandbox_without_gunzip_takes_the_chosen_gzip_stream_plain(
    kept_containers: KeptContainers,
) -> None:
    """A GNU sandbox whose ``gzip`` is gone refuses the gzipped stream before reading it
    (nothing staged) and the same restore sends it plain: restored, not refused.
    Proves ``scratchbank.application.restore.SandboxTarget``."""
    data, bodies = _form_bank(compressible=True)
    with kept_containers.rig("docker-gnu") as r:
        forms = _stream_forms(r.sandbox)
        gzip = r.sh("command -v gzip").strip()
        r.sh(f"mv {gzip} {gzip}.gone")
        try:
            out = restore(data, r.sandbox)
        finally:
            r.sh(f"mv {gzip}.gone {gzip}")
        assert out.proceeds, out
        assert r.sh(f"cat {r.scratch}/d/0.txt").encode() == bodies["d/0.txt"]
        assert r.beside() == "0"
    assert forms == ["z", "raw"]
