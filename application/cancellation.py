"""The cancellation model: a run context's ``Cancel`` and a call's ``Deadline``.

A deadline bounds one call (an exec, a stream, a store put or fetch, a timeline append),
so that a call that stalls cannot spend more than the budget that is left; deadlines
are real time, because the transports that honour them wait on sockets and processes,
not on a test clock. A ``Cancel`` cuts every call riding it at once (L5).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import attrs


class Cancel(threading.Event):
    """A run context's cancellation (L5): set once, it cuts every call riding it at once.

    A ``threading.Event`` (the engine waits on it as such) that also calls the hooks
    watchdogs registered (``on_set``), so a blocked exec, stream or upload is cut the
    moment the lease keeper lets go, not at its deadline.
    """

    def __init__(self) -> None:
        super().__init__()
        self.why = ""
        self._hooks: dict[int, Callable[[], None]] = {}
        self._guard = threading.Lock()
        self._next = 0

    def cut(self, why: str) -> None:
        """Cancel, saying why (the keeper's note: a ceiling passed, the lease lost)."""
        self.why = self.why or why
        self.set()

    def set(self) -> None:
        with self._guard:
            super().set()
            hooks = list(self._hooks.values())
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` once set (at once if already set); returns the unhook."""
        with self._guard:
            if not self.is_set():
                key, self._next = self._next, self._next + 1
                self._hooks[key] = hook
                return lambda: self._unhook(key)
        hook()
        return lambda: None

    def _unhook(self, key: int) -> None:
        with self._guard:
            self._hooks.pop(key, None)


@attrs.frozen
class Deadline:
    """When one port call must have ended, on ``time.monotonic()``; cut short by ``cancel``.

    Transports read ``left()`` for socket timeouts and watchdogs and raise their own
    named error (StreamBroken, ExecFailed, BankReadFailed...) once it has passed. A
    deadline riding a run context (``cancel``) has passed the moment it is cancelled
    (L5), and watchdogs hook it (``on_cancel``) to cut the transport at once.
    """

    at: float
    cancel: Cancel | None = attrs.field(default=None, eq=False)

    @classmethod
    def after(cls, seconds: float, cancel: Cancel | None = None) -> Deadline:
        return cls(time.monotonic() + max(0.0, seconds), cancel)

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def left(self) -> float:
        return 0.0 if self.cancelled() else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return self.cancelled() or time.monotonic() >= self.at

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` when the run context is cancelled; returns the unhook."""
        return self.cancel.on_set(hook) if self.cancel is not None else (lambda: None)


#: The deadline of the port call this thread is making (``calls_within``): a port whose
#: signature carries none (the Timeline) reads it to bound its own waits (ADR 0010).
_CALLER: ContextVar[Deadline | None] = ContextVar("scratchbank_caller_deadline", default=None)


def caller_deadline() -> Deadline | None:
    """The deadline the caller's port call must end by (``calls_within``), None when none was set."""
    return _CALLER.get()


@contextlib.contextmanager
def calls_within(deadline: Deadline) -> Iterator[Deadline]:
    """Port calls made inside end by ``deadline`` (or an earlier one already set);
    ``retry_within`` sets each try's."""
    outer = _CALLER.get()
    token = _CALLER.set(deadline if outer is None or deadline.at <= outer.at else outer)
    try:
        yield deadline
    finally:
        _CALLER.reset(token)


def deadline_of(deadline: Deadline | None, default_seconds: float) -> Deadline:
    """The deadline a transport honours: the caller's, else one ``default_seconds`` away."""
    return deadline if deadline is not None else Deadline.after(default_seconds)
