"""Run ids: what a valid one looks like, so no adapter can be led outside a run's place."""

from __future__ import annotations

import re

from .errors import InvalidRunId

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    """Return the id if it is safe as a path component and an object key; else raise."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise InvalidRunId(f"invalid run id {run_id!r}")
    return run_id
