"""X6: a checked bank restored into a host directory, never following a link.

No ``tarfile.extractall``: every entry is created here under directory file
descriptors (``os.open``/``os.mkdir``/``os.link``/``os.symlink`` with ``dir_fd``,
``O_NOFOLLOW``, ``O_EXCL``), into a fresh sibling of the destination:

- directories are walked component by component with ``O_NOFOLLOW | O_DIRECTORY``;
  files are created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (nothing there is reused);
- hard links only to earlier regular files of this restore (the reader refused any
  other), symlinks last (so nothing is ever created through one), then directory
  modes and times, deepest first; modes as banked, setid bits cleared;
- the fresh tree is swapped into place atomically: ``renameat2`` with
  ``RENAME_EXCHANGE`` when something stands at the destination (the old tree is then
  removed), ``RENAME_NOREPLACE`` when nothing does. The destination is handled by
  name: a symlink standing there is replaced, the directory it pointed to untouched.

Symlink containment is decided by the reader (``Limits(host_directory=True)``) against
the tree as it will stand with all of the bank's links (symlink_tree.py), before any
entry is created. Free space at the destination is checked against the declared total
first (NoSpaceAtDestination).
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import DestinationRefused, NoSpaceAtDestination
from scratchbank.domain.fold import Bank

from .bank_check import BankCheck
from .manifest import DIR, FILE, HARDLINK, SYMLINK, Member, MemberLog
from .ports import BankStore
from .tarstream import Limits

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
IMPLICIT_MODE = 0o755


@attrs.frozen
class Destination:
    """Where the tree goes: the destination's parent (an open fd) and its name there."""

    parent_fd: int
    name: str


def check_free_space(dest: Destination, needed: int) -> None:
    """Refuse by name when the destination's filesystem has less room than declared."""
    st = os.statvfs(dest.parent_fd)
    free = st.f_bavail * st.f_frsize
    if free < needed:
        raise NoSpaceAtDestination(f"the destination has {free} bytes free; the bank declares {needed}")


@contextmanager
def opened_destination(target: Path) -> Iterator[Destination]:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise DestinationRefused(f"cannot open {target.parent}: {error.strerror}") from None
    try:
        yield Destination(fd, target.name)
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
        try:
            os.fchmod(fd, m.mode & 0o777)
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)

    def _set_dir(self, m: Member) -> None:
        fd = os.open(self._name(m.path), _DIR_FLAGS, dir_fd=self._dir_of(m.path))
        try:
            os.fchmod(fd, m.mode & 0o777)
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)

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


def swap_into_place(dest: Destination, fresh: str) -> None:
    """Put ``fresh`` at the destination's name atomically; remove what stood there."""
    if not _exists(dest, dest.name):
        try:
            _renameat2(dest, fresh, dest.name, RENAME_NOREPLACE)
            return
        except OSError as error:
            if error.errno in (errno.EINVAL, errno.ENOSYS):  # no renameat2 on this filesystem
                os.rename(fresh, dest.name, src_dir_fd=dest.parent_fd, dst_dir_fd=dest.parent_fd)
                return
            if error.errno != errno.EEXIST:  # EEXIST: something arrived meanwhile
                raise
    _renameat2(dest, fresh, dest.name, RENAME_EXCHANGE)
    remove_entry(dest, fresh)  # the old tree, now under the fresh name


def remove_entry(dest: Destination, name: str) -> None:
    """Remove one entry of the parent by name, never following a symlink."""
    try:
        st = os.stat(name, dir_fd=dest.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dest.parent_fd)
    else:
        os.unlink(name, dir_fd=dest.parent_fd)


# -- the whole X6 restore ----------------------------------------------------------------------
def restore_into_host_directory(run_id: str, bank: Bank, target: Path, *, store: BankStore, cap: int) -> int:
    """Fetch, check whole, then write into a fresh sibling and swap it in; the bytes restored."""
    limits = Limits(host_directory=True)
    with tempfile.TemporaryFile() as fetched:  # the compressed bank (within the cap), read twice
        store.fetch(run_id, fetched, max_bytes=cap)
        total = _passes(bank, fetched, limits, cap)
        with opened_destination(target) as dest:
            check_free_space(dest, max(bank.record.manifest_bytes or 0, total))
            fresh = make_fresh(dest)
            try:
                _passes(bank, fetched, limits, cap, into=(dest, fresh))
                swap_into_place(dest, fresh)
            except BaseException as error:
                remove_entry(dest, fresh)
                if isinstance(error, OSError):
                    raise DestinationRefused(f"restoring into {target}: {error}") from None
                raise
    return bank.record.bytes


def _passes(
    bank: Bank, fetched: BinaryIO, limits: Limits, cap: int, *, into: tuple[Destination, str] | None = None
) -> int:
    """Check the fetched bank whole (and, ``into`` a fresh directory, write its tree)."""
    root_fd = open_dir(*into) if into is not None else None
    tree = TreeWriter(root_fd) if root_fd is not None else None
    check = BankCheck(
        bank.record,
        limits=limits,
        cap=cap,
        on_member=tree.member if tree else None,
        on_data=tree.data if tree else None,
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


def _feed(src: BinaryIO, write: Callable[[bytes], int]) -> None:
    while chunk := src.read(1 << 20):
        write(chunk)
