"""A bank's members as the reader accepted them: the kinds, the member, the manifest
and a comparison of a restored tree with the manifest; PathTaken, the
conflict a member log reports."""

from __future__ import annotations

import attrs

FILE, DIR, SYMLINK, HARDLINK, FIFO = "file", "dir", "symlink", "hardlink", "fifo"
IMPLICIT = "implicit"  # a parent directory with no entry of its own


@attrs.frozen
class Member:
    path: str  # normalised, relative, no "./"; "" is the archive's root directory
    type: str
    size: int
    mode: int
    mtime: int
    linkname: str = ""


@attrs.frozen
class Comparison:
    """How a restored tree differs from the manifest (implicit parent dirs allowed)."""

    missing: int
    unexpected: int

    @property
    def same(self) -> bool:
        return self.missing == 0 and self.unexpected == 0


class PathTaken(Exception):
    """A member at a path the log already holds (a duplicate, or a non-directory where
    an implicit parent stands)."""

    def __init__(self, path: str, existing: str) -> None:
        super().__init__(path)
        self.path, self.existing = path, existing
