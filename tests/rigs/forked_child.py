"""A call run in a forked child (as another uid, killed at its timeout), and the hostile tars it reads
(a root directory member, deep implicit parents).

First written for tests/rules/test_[TX]*.py: Findings of an independent attack on the restore path
(issue 10's promises), each a test that fails on the ``attack`` branch as it stands and passes once
the hole is closed."""

from __future__ import annotations

import json
import os
import tarfile
import warnings
from collections.abc import Callable

from hostile import end, member, pax_header, pax_payload, ustar
from waiting import NeverHappened, eventually

NOBODY = 65534


def root_dir(mode: int = 0o755) -> bytes:
    return ustar(member("./", tarfile.DIRTYPE, mode=mode))


def in_child(fn: Callable[[], object], *, uid: int | None = None, timeout: float = 60.0) -> dict[str, object]:
    """Run ``fn`` in a forked child (as ``uid`` when given), killed after ``timeout`` s.
    Returns {"result": repr} or {"raised": repr} or {"timeout": seconds}."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns on fork() with threads alive; the child only runs fn
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            answer = {"result": repr(fn())}
        except BaseException as error:
            answer = {"raised": f"{type(error).__name__}: {error}"}
        os.write(write_fd, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_fd)
    try:
        eventually(lambda: os.waitpid(pid, os.WNOHANG)[0], timeout=timeout, what="the child ends")
    except NeverHappened:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return {"timeout": timeout}
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    return json.loads(data) if data else {"raised": "the child died without an answer"}


# -- T6/X2: implicit parents make the host write ~160x the bank's tar to its temp disk --------
def _deep_unique(n: int) -> bytes:
    """n empty files, each under 126 directories of its own (names 3.9 KB: within the
    4096-byte and 128-deep caps), no directory entries: every parent is implicit."""

    def name(i: int) -> str:
        return f"x{i:06d}" + ("/" + "c" * 30) * 126 + "/f"

    return (
        b"".join(pax_header(pax_payload([("path", name(i))])) + ustar(member("f")) for i in range(n)) + end()
    )
