"""Streaming helpers shared by the use cases and adapters: bounded, hashed copies.

Host memory must not grow with archive size, so every copy goes through a fixed
buffer and every digest is computed on the way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

CHUNK = 1 << 20


class TooLarge(Exception):
    """A copy met more than its limit."""


def copy_hashed(
    read: Callable[[int], bytes],
    write: Callable[[bytes], object],
    *,
    limit: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> tuple[int, str]:
    """Copy until EOF through a 1 MiB buffer; return (bytes, sha256 hex).

    With ``limit``, raise TooLarge as soon as more than ``limit`` bytes arrive (it never
    reads past limit + one chunk).
    """
    digest = hashlib.sha256()
    total = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return total, digest.hexdigest()
        total += len(chunk)
        if limit is not None and total > limit:
            raise TooLarge(f"more than {limit} bytes")
        digest.update(chunk)
        write(chunk)
        if on_chunk is not None:
            on_chunk(total)
