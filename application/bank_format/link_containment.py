"""Where a bank's symlinks lead once the whole tree stands: inside the root, or out of it.

Checking a link's text alone is not enough: ``l2 -> d/l1/..`` looks contained, but
when ``d/l1 -> ..`` is another link of the same bank, ``l2`` leads to the root's
parent. So each link is resolved as the kernel would, component by component, over
the tree as it will stand with all of the bank's entries and links (read from the
member log), with the kernel's limit of 40 links followed. A component the tree
does not hold is taken as a plain directory: the kernel would stop there (ENOENT),
so the only thing that matters is whether ``..`` ever climbs above the root.

Bounded time (X6): where a link leads depends only on its own path and target, so
each resolution is memoised (a bounded cache of recent links) and a link met again
costs one lookup, not its whole chain; and the components walked over the whole
check are counted against a budget (``WORK_BUDGET``), past which the bank is
refused by name rather than keeping the host busy for hours.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from .members import SYMLINK
from .spill_log import MemberLog
from .tar_header import refuse

MAX_HOPS = 40
WORK_BUDGET = 4_000_000  # components walked in all (a legitimate bank: a few per link)
_MEMO = 65_536


class _Escapes(Exception):
    """Resolution left the root (or looped past the kernel's limit)."""


class _Resolver:
    """Resolves links over the tree to be; memoised; work counted against a budget."""

    def __init__(self, link_of: Callable[[str], str | None], budget: int) -> None:
        self._link_of = link_of
        self._budget = budget
        self._memo: collections.OrderedDict[str, tuple[tuple[str, ...], int]] = collections.OrderedDict()
        self._open: set[str] = set()

    def link(self, path: str, target: str) -> tuple[tuple[str, ...], int]:
        """Where the link ``path -> target`` leads (names under the root), and its hops."""
        hit = self._memo.get(path)
        if hit is not None:
            return hit
        if path in self._open:
            raise _Escapes(target)  # a loop: the kernel gives up (ELOOP); refused
        self._open.add(path)
        try:
            parts, hops = path.split("/")[:-1], [0]
            self._walk(parts, target, hops)
        finally:
            self._open.discard(path)
        self._memo[path] = found = (tuple(parts), hops[0])
        if len(self._memo) > _MEMO:
            self._memo.popitem(last=False)
        return found

    def _walk(self, parts: list[str], target: str, hops: list[int]) -> None:
        if target.startswith("/"):
            raise _Escapes(target)
        for name in target.split("/"):
            self._spend()
            if name in ("", "."):
                continue
            if name == "..":
                if not parts:
                    raise _Escapes(target)
                parts.pop()
                continue
            parts.append(name)
            self._follow(parts, hops)

    def _follow(self, parts: list[str], hops: list[int]) -> None:
        path = "/".join(parts)
        link = self._link_of(path)
        if link is None:
            return
        leads, used = self.link(path, link)
        hops[0] += 1 + used
        if hops[0] > MAX_HOPS:
            raise _Escapes(link)
        parts[:] = leads

    def _spend(self) -> None:
        self._budget -= 1
        if self._budget < 0:
            raise refuse("the bank's symlinks are too tangled to check in bounded time")


def leads_outside(path: str, target: str, link_of: Callable[[str], str | None]) -> bool:
    """True when the symlink ``path -> target`` resolves outside the root."""
    try:
        _Resolver(link_of, WORK_BUDGET).link(path, target)
    except _Escapes:
        return True
    return False


def first_escaping_link(log: MemberLog, budget: int = WORK_BUDGET) -> tuple[str, str] | None:
    """The first symlink of the bank that leads outside the root, with its target.

    Raises HostileArchive when the check would walk more than ``budget`` components."""
    resolver = _Resolver(log.link_of, budget)
    for m in log.members_of(SYMLINK):
        try:
            resolver.link(m.path, m.linkname)
        except _Escapes:
            return m.path, m.linkname
    return None
