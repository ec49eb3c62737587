"""X6: the host directory as a restore target (``HostDirectory``, the RestoreTarget port
of application/ports.py, as a sandbox's scratch is one): a checked bank restored into a
directory of this host, never following a link.

The order (ADR 0002, ADR 0004): fetch the bank (within the cap) and check it WHOLE first
(size, digest, manifest, the allow-list, link containment); refuse by name a destination
without the room the bank declares (NoSpaceAtDestination) or with a mount point inside
its old tree (DestinationRefused); only then write, into a fresh sibling of the
destination, and swap it in. Every refusal comes before anything is created or moved.

No ``tarfile.extractall``: every entry is created here under directory file
descriptors (``os.open``/``os.mkdir``/``os.link``/``os.symlink`` with ``dir_fd``,
``O_NOFOLLOW``, ``O_EXCL``), into the fresh sibling:

- directories are walked component by component with ``O_NOFOLLOW | O_DIRECTORY``;
  files are created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (nothing there is reused);
- hard links only to earlier regular files of this restore (the reader refused any
  other), symlinks last (so nothing is ever created through one), then directory
  modes and times, deepest first; modes as banked, setid bits cleared;
- the fresh tree is swapped into place atomically: ``renameat2`` with
  ``RENAME_EXCHANGE`` when something stands at the destination (the old tree is then
  removed, never across a mount point; read-only directories of the old tree are made
  writable first; a removal that still fails is a note, the restore being done),
  ``RENAME_NOREPLACE`` when nothing does. The destination is handled by name: a symlink
  standing there is replaced, the directory it pointed to untouched.
- a cut run context (L5) stops the restore at its next member or chunk, or before the
  swap: LEASE_LOST, the fresh sibling removed, the destination as it was.

Symlink containment is decided by the reader (``Limits(host_directory=True)``) against
the tree as it will stand with all of the bank's links (bank_format/link_containment.py),
before any entry is created.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

import attrs

from scratchbank.application.bank_format.bank_check import BankCheck
from scratchbank.application.bank_format.members import DIR, FILE, HARDLINK, SYMLINK, Member
from scratchbank.application.bank_format.reader import Limits
from scratchbank.application.bank_format.spill_log import MemberLog
from scratchbank.application.cancellation import Cancel
from scratchbank.application.ports import BankStore, Progress
from scratchbank.application.restore import lease_cut, unless_cut
from scratchbank.domain.errors import DestinationRefused, NoSpaceAtDestination
from scratchbank.domain.fold import Bank
from scratchbank.domain.restore import RestoreAttempt, RestoreResult

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
IMPLICIT_MODE = 0o755
T = TypeVar("T")


@attrs.frozen
class Destination:
    """Where the tree goes: the destination's parent (an open fd) and its name there."""

    parent_fd: int
    name: str


def check_free_space(target: Path, needed: int) -> None:
    """Refuse by name when the destination's filesystem has less room than declared.

    Asked of the nearest directory that exists (the destination's parents may not
    yet): a refusal creates nothing."""
    probe = target.parent
    try:
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
    except OSError as error:
        raise DestinationRefused(f"cannot ask {probe} for its free space: {error.strerror}") from None
    free = st.f_bavail * st.f_frsize
    if free < needed:
        raise NoSpaceAtDestination(f"the destination has {free} bytes free; the bank declares {needed}")


def _unescape_mount_path(field: str) -> str:
    """A mount point as /proc/self/mountinfo spells it (space, tab, newline, backslash octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_points() -> list[str] | None:
    """Every mount point of this process's namespace (None: no /proc to ask)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
            return [_unescape_mount_path(line.split(" ")[4]) for line in info if line.count(" ") > 4]
    except OSError:
        return None


def mount_points_inside(target: Path) -> list[str]:
    """Mount points strictly inside the directory at ``target`` (none when it is a link)."""
    if os.path.islink(target) or not os.path.isdir(target):
        return []
    root = os.path.realpath(target) + "/"
    points = _mount_points()
    if points is None:
        return []  # no /proc: the removal still never crosses a device (remove_tree)
    return sorted(p for p in points if p.startswith(root))


def is_mount_point(target: Path) -> bool:
    """Is the directory at ``target`` itself a mount point (a bind mount of the same
    filesystem included, which ``os.path.ismount`` does not see)?"""
    if os.path.islink(target) or not os.path.isdir(target):
        return False
    points = _mount_points()
    if points is None:
        return os.path.ismount(target)
    return os.path.realpath(target) in points


def refuse_mount_points(target: Path) -> None:
    """X6: the old tree is swapped out, then removed: a destination that is itself a
    mount point cannot be swapped (EBUSY), and the removal never goes through a mount
    point inside it. Both are refused first, before anything is written."""
    if is_mount_point(target):
        raise DestinationRefused(
            f"{target} is a mount point: it cannot be swapped for the restored tree; "
            "restore into a directory inside it, or elsewhere"
        )
    inside = mount_points_inside(target)
    if inside:
        raise DestinationRefused(
            f"{target} has a mount point inside ({inside[0]!r}): its old tree cannot be replaced "
            "without deleting what is mounted there; unmount it or restore elsewhere"
        )


@contextmanager
def opened_destination(target: Path) -> Iterator[Destination]:
    """The destination's parent, made when missing; a restore that fails or is cut inside
    removes the (empty) parents made here: a refusal leaves the host as it was."""
    made = [p for p in target.parents if not os.path.lexists(p)]  # deepest first
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        _unmake(made)
        raise DestinationRefused(f"cannot open {target.parent}: {error.strerror}") from None
    try:
        yield Destination(fd, target.name)
    except BaseException:
        _unmake(made)
        raise
    finally:
        os.close(fd)


def _unmake(made: list[Path]) -> None:
    for parent in made:  # deepest first; one that is not empty (someone else's now) stays
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def _settle(fd: int, m: Member) -> None:
    """Give an entry created here its banked mode and time, then close its fd."""
    try:
        os.fchmod(fd, m.mode & 0o777)
        os.utime(fd, (m.mtime, m.mtime))
    finally:
        os.close(fd)


class TreeWriter:
    """Creates one bank's entries under a fresh directory, as the reader accepts them.

    ``member``/``data`` are the reader's callbacks; ``finish`` creates the symlinks
    (from the member log) and sets directory modes and times.
    """

    def __init__(self, root_fd: int) -> None:
        self._root = root_fd
        self._parent: tuple[str, int] | None = None
        self._file: int | None = None
        self._file_member: Member | None = None
        self._root_member: Member | None = None

    def member(self, m: Member) -> None:
        self._close_file()
        if m.path == "":
            self._root_member = m
        elif m.type == DIR:
            self._mkdir(m.path)
        elif m.type == FILE:
            self._file = os.open(self._name(m.path), _NEW_FILE, 0o600, dir_fd=self._dir_of(m.path))
            self._file_member = m
        elif m.type == HARDLINK:
            self._hardlink(m)

    def data(self, chunk: bytes) -> None:
        assert self._file is not None
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._file, view) :]

    def finish(self, log: MemberLog) -> None:
        self._close_file()
        for link in log.members_of(SYMLINK):
            os.symlink(link.linkname, self._name(link.path), dir_fd=self._dir_of(link.path))
            os.utime(
                self._name(link.path),
                (link.mtime, link.mtime),
                dir_fd=self._dir_of(link.path),
                follow_symlinks=False,
            )
        for directory in log.members_of(DIR, deepest_first=True):
            if directory.path:  # the root's own mode and time: set_root
                self._set_dir(directory)
        self._drop_parent()

    def close(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._drop_parent()

    # -- creating, under directory fds ---------------------------------------------------
    @staticmethod
    def _name(path: str) -> str:
        return path.rsplit("/", 1)[-1]

    def _dir_of(self, path: str) -> int:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if self._parent is not None and self._parent[0] == parent:
            return self._parent[1]
        self._drop_parent()
        fd = os.dup(self._root)
        for name in parent.split("/") if parent else ():
            fd = self._descend(fd, name)
        self._parent = (parent, fd)
        return fd

    @staticmethod
    def _descend(fd: int, name: str) -> int:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:  # an implicit parent: the bank has no entry for it
            os.mkdir(name, 0o700, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.fchmod(child, IMPLICIT_MODE)  # its mode now (its path is not kept for later)
        finally:
            os.close(fd)
        return child

    def _mkdir(self, path: str) -> None:
        try:
            os.mkdir(self._name(path), 0o700, dir_fd=self._dir_of(path))
        except FileExistsError:  # made earlier as an implicit parent: it is a real dir
            st = os.stat(self._name(path), dir_fd=self._dir_of(path), follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise

    def _hardlink(self, m: Member) -> None:
        source_dir = os.dup(self._dir_of(m.linkname))
        try:
            os.link(
                self._name(m.linkname),
                self._name(m.path),
                src_dir_fd=source_dir,
                dst_dir_fd=self._dir_of(m.path),
                follow_symlinks=False,
            )
        finally:
            os.close(source_dir)

    def _close_file(self) -> None:
        if self._file is None or self._file_member is None:
            return
        m, fd = self._file_member, self._file
        self._file, self._file_member = None, None
        _settle(fd, m)

    def _set_dir(self, m: Member) -> None:
        _settle(os.open(self._name(m.path), _DIR_FLAGS, dir_fd=self._dir_of(m.path)), m)

    def set_root(self, fd: int) -> None:
        """The restored directory's own mode and time, as banked (0755 when it has none)."""
        m = self._root_member
        os.fchmod(fd, (m.mode if m is not None else IMPLICIT_MODE) & 0o777)
        if m is not None:
            os.utime(fd, (m.mtime, m.mtime))

    def _drop_parent(self) -> None:
        if self._parent is not None:
            os.close(self._parent[1])
            self._parent = None


# -- the fresh sibling and the swap ---------------------------------------------------------
def make_fresh(dest: Destination) -> str:
    name = f".scratchbank-restore-{secrets.token_hex(8)}"
    try:
        os.mkdir(name, 0o700, dir_fd=dest.parent_fd)
    except OSError as error:
        raise DestinationRefused(
            f"cannot create a fresh directory beside {dest.name}: {error.strerror}"
        ) from None
    return name


def open_dir(dest: Destination, name: str) -> int:
    """A directory of the destination's parent, opened without following a link."""
    return os.open(name, _DIR_FLAGS, dir_fd=dest.parent_fd)


def _renameat2(dest: Destination, old: str, new: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(dest.parent_fd, os.fsencode(old), dest.parent_fd, os.fsencode(new), flags)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _exists(dest: Destination, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dest.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def swap_into_place(dest: Destination, fresh: str) -> bool:
    """Put ``fresh`` at the destination's name atomically; True when an old entry was
    exchanged (it then stands under the name ``fresh``)."""
    if not _exists(dest, dest.name):
        try:
            _renameat2(dest, fresh, dest.name, RENAME_NOREPLACE)
            return False
        except OSError as error:
            if error.errno in (errno.EINVAL, errno.ENOSYS):  # no renameat2 on this filesystem
                os.rename(fresh, dest.name, src_dir_fd=dest.parent_fd, dst_dir_fd=dest.parent_fd)
                return False
            if error.errno != errno.EEXIST:  # EEXIST: something arrived meanwhile
                raise
    _renameat2(dest, fresh, dest.name, RENAME_EXCHANGE)
    return True


def remove_entry(dest: Destination, name: str) -> None:
    """Remove one entry of the parent by name, never following a symlink, never
    crossing into another filesystem, making read-only directories of it writable
    first (a non-root user owns them but cannot empty them as they are)."""
    try:
        st = os.stat(name, dir_fd=dest.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _remove_dir(dest.parent_fd, name, st.st_dev)
    else:
        os.unlink(name, dir_fd=dest.parent_fd)


def _remove_dir(parent_fd: int, name: str, device: int) -> None:
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if st.st_dev != device:
        raise OSError(errno.EXDEV, f"{name!r} is on another filesystem (a mount point): not removed")
    if st.st_mode & 0o700 != 0o700:
        os.chmod(name, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=parent_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        if os.fstat(fd).st_ino != st.st_ino:
            raise OSError(errno.EAGAIN, f"{name!r} changed while it was being removed")
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                _remove_dir(fd, entry.name, device)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def remove_old_tree(dest: Destination, name: str, target: Path) -> str:
    """After the swap: remove the old tree; a failure is a note (the restore is done)."""
    try:
        remove_entry(dest, name)
    except (OSError, RecursionError) as error:
        return f"restored; the old tree could not be removed and stays at {target.parent / name}: {error}"
    return ""


@attrs.frozen
class HostRestore:
    """What a host-directory restore did: the bytes restored, and a note (or "")."""

    bytes: int
    note: str = ""


@attrs.frozen
class HostDirectory:
    """The host directory at ``path`` as a RestoreTarget (X6): the scratch is handed over
    (it will never bank again). Built by the caller that names a directory:
    ``Target(host_directory=HostDirectory(path))``."""

    path: Path

    @property
    def hands_over(self) -> bool:
        return True

    def restore(
        self,
        run_id: str,
        bank: Bank,
        *,
        store: BankStore,
        cap: int,
        progress: Progress | None = None,
        cancel: Cancel | None = None,
    ) -> RestoreAttempt:
        """Fetch, check whole, write fresh beside, swap in (module docstring)."""
        got = restore_into_host_directory(run_id, bank, self.path, store=store, cap=cap, cancel=cancel)
        if progress is not None:
            progress("restored", got.bytes, got.bytes)
        return RestoreAttempt(RestoreResult.RESTORED, got.bytes, into_host_dir=True, detail=got.note)


# -- the whole X6 restore ----------------------------------------------------------------------
def restore_into_host_directory(
    run_id: str, bank: Bank, target: Path, *, store: BankStore, cap: int, cancel: Cancel | None = None
) -> HostRestore:
    """Fetch, check whole, then write into a fresh sibling and swap it in.

    Every refusal comes before anything is created or moved (free space, a mount
    point inside the old tree); once the swap is done, the restore is done, and a
    failure to remove the old tree is a note, never a refusal."""
    limits = Limits(host_directory=True)
    with tempfile.TemporaryFile() as fetched:  # the compressed bank (within the cap), read twice
        store.fetch(
            run_id, fetched, max_bytes=cap, name=bank.record.object
        )  # A17: the object the record names
        total = _passes(bank, fetched, limits, cap, cancel=cancel)
        check_free_space(target, max(bank.record.manifest_bytes or 0, total))
        refuse_mount_points(target)
        with opened_destination(target) as dest:
            fresh = _write_fresh(bank, fetched, limits, cap, dest, target, cancel)
            note = remove_old_tree(dest, fresh, target) if fresh else ""
    return HostRestore(bank.record.bytes, note)


def _write_fresh(
    bank: Bank,
    fetched: BinaryIO,
    limits: Limits,
    cap: int,
    dest: Destination,
    target: Path,
    cancel: Cancel | None,
) -> str:
    """Write the tree into a fresh sibling and swap it in: the old tree's name now, or ""."""
    fresh = make_fresh(dest)
    try:
        _passes(bank, fetched, limits, cap, into=(dest, fresh), cancel=cancel)
        if cancel is not None and cancel.is_set():  # L5: never swapped in once cut
            raise lease_cut(cancel)
        exchanged = swap_into_place(dest, fresh)
    except BaseException as error:
        with contextlib.suppress(OSError, RecursionError):
            remove_entry(dest, fresh)
        if isinstance(error, OSError):
            raise DestinationRefused(f"restoring into {target}: {error}") from None
        raise
    return fresh if exchanged else ""


def _passes(
    bank: Bank,
    fetched: BinaryIO,
    limits: Limits,
    cap: int,
    *,
    into: tuple[Destination, str] | None = None,
    cancel: Cancel | None = None,
) -> int:
    """Check the fetched bank whole (and, ``into`` a fresh directory, write its tree)."""
    root_fd = open_dir(*into) if into is not None else None
    tree = TreeWriter(root_fd) if root_fd is not None else None
    check = BankCheck(
        bank.record,
        limits=limits,
        cap=cap,
        on_member=_guarded(cancel, tree.member if tree else None),
        on_data=_guarded(cancel, tree.data if tree else None),
    )
    try:
        fetched.seek(0)
        _feed(fetched, check.write)
        check.finish()
        if tree is not None and root_fd is not None:
            tree.finish(check.log)
            tree.set_root(root_fd)
        return check.reader.total
    finally:
        check.close()
        if tree is not None:
            tree.close()
        if root_fd is not None:
            os.close(root_fd)


def _guarded(cancel: Cancel | None, call: Callable[[T], None] | None) -> Callable[[T], None] | None:
    """The reader's callback, refusing LEASE_LOST once the run context is cut (L5); the
    check-only pass writes nothing and, uncut, needs no callback at all."""
    if cancel is None:
        return call
    return unless_cut(cancel, call if call is not None else _ignore)


def _ignore(_: object) -> None:
    """The check-only pass's callback: nothing is written."""


def _feed(src: BinaryIO, write: Callable[[bytes], int]) -> None:
    while chunk := src.read(1 << 20):
        write(chunk)
