"""The cancellation model: a run context's ``Cancel`` and a call's ``Deadline``.

A deadline bounds one call (an exec, a stream, a store put or fetch, a timeline append),
so that a call that stalls cannot spend more than the budget that is left; deadlines
are real time, because the transports that honour them wait on sockets and processes,
not on a test clock. A ``Cancel`` cuts every call riding it at once (L5). A
``CancelScope`` owns a deadline, its cancel and the threads it starts, and joins them on
exit (ADR 0008): nothing outlives it silently.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from types import TracebackType

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


# -- one cancellation scope (trio's cancel scopes are the model) ------------------------------
#: How long a scope's exit waits, after cutting, for its threads to end.
GRACE_SECONDS = 2.0

_log = logging.getLogger("scratchbank.cancellation")


class CancelScope:
    """A scope owns its deadline, its cancel and the threads it starts: nothing outlives it.

    ``with CancelScope(deadline) as scope:`` arms the deadline (real time, like every
    ``Deadline``): when it passes, or the deadline's own run context (``Deadline.cancel``)
    or an enclosing scope is cancelled, the scope's ``cancel`` is cut and every hook
    registered with ``on_cut`` runs once (the transport's cut). ``scope.deadline`` is the
    deadline its calls ride (cut with the scope). Threads started with ``start`` are the
    scope's: on exit it waits for them until its deadline (an exit by an exception cuts
    first), then cuts, then gives them ``grace`` seconds more; a thread still alive after
    that is named in ``outlived`` and logged, never left silently.
    """

    def __init__(
        self,
        deadline: Deadline | float | None = None,
        *,
        parent: CancelScope | None = None,
        grace: float = GRACE_SECONDS,
        name: str = "scope",
    ) -> None:
        given = Deadline.after(float(deadline)) if isinstance(deadline, int | float) else deadline
        self.name, self.grace = name, grace
        self.cancel = Cancel()
        at = given.at if given is not None else time.monotonic() + 10 * 365 * 86400.0
        if parent is not None:
            at = min(at, parent.deadline.at)
        self.deadline: Deadline = Deadline(at, self.cancel)
        #: cut by its deadline or a cancel from outside (an enclosing scope, the run context)
        self.fired = False
        #: the names of the threads still alive after the exit's grace
        self.outlived: tuple[str, ...] = ()
        outer = (given.cancel if given is not None else None, parent.cancel if parent is not None else None)
        self._outer = [c for c in outer if c is not None]
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._exited = False
        self._timer: threading.Timer | None = None
        self._unhooks: list[Callable[[], None]] = []

    # -- cutting ------------------------------------------------------------------------
    def on_cut(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once when the scope is cut (at once if it already is); errors of a
        hook are its own (a transport already closed)."""
        self._unhooks.append(self.cancel.on_set(lambda: _quietly(hook)))

    def cut(self, why: str) -> None:
        """Cancel the scope now (its children and hooks with it)."""
        self.cancel.cut(why)

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._exited:
                return
            self.fired = True
        self.cut(why)

    def _fire_from(self, outer: Cancel) -> Callable[[], None]:
        return lambda: self._fire(outer.why or "cancelled")

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    # -- threads ------------------------------------------------------------------------
    def start(self, target: Callable[[], object], name: str) -> threading.Thread:
        """Start ``target`` on a thread the scope owns (joined on exit)."""
        thread = threading.Thread(target=target, name=f"{self.name}:{name}", daemon=True)
        with self._lock:
            if self._exited:
                raise RuntimeError(f"the scope {self.name} has exited: it starts no thread")
            self._threads.append(thread)
        thread.start()
        return thread

    def __enter__(self) -> CancelScope:
        self._timer = threading.Timer(self.deadline.left(), self._fire, ("the deadline passed",))
        self._timer.name = f"{self.name}:deadline"
        self._timer.daemon = True
        self._timer.start()
        for outer in self._outer:
            self._unhooks.append(outer.on_set(self._fire_from(outer)))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.cut(f"the scope exited by {kind.__name__}")
        me = threading.current_thread()
        threads = [t for t in self._threads if t is not me]
        for thread in threads:  # a clean exit: its threads have until the deadline
            thread.join(timeout=self.deadline.left())
        if any(t.is_alive() for t in threads):
            if not self.cancelled:  # the threads ran to the deadline
                self._fire("the deadline passed")
            until = time.monotonic() + self.grace
            for thread in threads:
                thread.join(timeout=max(0.0, until - time.monotonic()))
        with self._lock:
            self._exited = True
        if self._timer is not None:
            self._timer.cancel()
            if self._timer is not me:
                self._timer.join()
        for unhook in self._unhooks:
            unhook()
        self.outlived = tuple(t.name for t in threads if t.is_alive())
        if self.outlived:
            _log.warning(
                "scope %s: thread(s) %s did not stop within %.1f s of the cut",
                self.name,
                ", ".join(self.outlived),
                self.grace,
            )


def _quietly(hook: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):
        hook()
