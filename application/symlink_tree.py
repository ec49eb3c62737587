"""Where a bank's symlinks lead once the whole tree stands: inside the root, or out of it.

Checking a link's text alone is not enough: ``l2 -> d/l1/..`` looks contained, but
when ``d/l1 -> ..`` is another link of the same bank, ``l2`` leads to the root's
parent. So each link is resolved as the kernel would, component by component, over
the tree as it will stand with all of the bank's entries and links (read from the
member log), with the kernel's limit of 40 links followed. A component the tree
does not hold is taken as a plain directory: the kernel would stop there (ENOENT),
so the only thing that matters is whether ``..`` ever climbs above the root.
"""

from __future__ import annotations

from collections.abc import Callable

from .manifest import SYMLINK, MemberLog

MAX_HOPS = 40


class _Escapes(Exception):
    """Resolution left the root (or looped past the kernel's limit)."""


def _resolve(parts: list[str], target: str, link_of: Callable[[str], str | None], hops: list[int]) -> None:
    """Walk ``target`` from the directory ``parts`` (a list of names under the root)."""
    if target.startswith("/"):
        raise _Escapes(target)
    for name in target.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise _Escapes(target)
            parts.pop()
            continue
        parts.append(name)
        link = link_of("/".join(parts))
        if link is not None:
            hops[0] += 1
            if hops[0] > MAX_HOPS:
                raise _Escapes(target)
            parts.pop()
            _resolve(parts, link, link_of, hops)


def leads_outside(path: str, target: str, link_of: Callable[[str], str | None]) -> bool:
    """True when the symlink ``path -> target`` resolves outside the root."""
    parts = path.split("/")[:-1]
    try:
        _resolve(parts, target, link_of, [0])
    except _Escapes:
        return True
    return False


def first_escaping_link(log: MemberLog) -> tuple[str, str] | None:
    """The first symlink of the bank that leads outside the root, with its target."""

    def link_of(path: str) -> str | None:
        return log.link_of(path)

    for m in log.members_of(SYMLINK):
        if leads_outside(m.path, m.linkname, link_of):
            return m.path, m.linkname
    return None
