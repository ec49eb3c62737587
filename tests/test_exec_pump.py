"""One exec pump for every transport (issue 25, build item 0; ADR 0008): the pump owns
stdin's feeding, the bounded sinks, the deadline and the cut; a transport supplies only
send/receive/cut. Driven here through a scripted transport (no engine): the engines'
own runs are tests/test_deadlines.py, test_hostile_sandbox.py and test_sandboxes.py."""

from __future__ import annotations

import ast
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import scratchbank.adapters as adapters_pkg
from scratchbank.adapters.exec_output import Bounded, ExecResult
from scratchbank.adapters.exec_pump import STDERR, STDOUT, InputClosed, pump
from scratchbank.adapters.scripted import REAP, Exec, ForwardingSandbox, ScriptedSandbox
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.domain.errors import ExecFailed, OutputOverBound, StreamBroken

HUNG = 30.0


class Scripted:
    """An exec whose output is ``chunks``; then, when ``hold``, it holds its output open
    (a detached child kept the pipe) until cut. ``reads`` stdin when ``reads`` is set."""

    def __init__(
        self, chunks: list[tuple[int, bytes]], *, hold: bool = False, reads: bool = True, code: int = 0
    ) -> None:
        self.chunks, self.hold, self.reads, self.code = list(chunks), hold, reads, code
        self.wants_input = True
        self.cuts = 0
        self.received = bytearray()
        self.closed_input = self.stopped = self.closed = False
        self._cut = threading.Event()
        self._stop = threading.Event()

    def send(self, chunk: bytes) -> None:
        if not self.reads:  # a peer that stopped reading: the send blocks until told
            self._stop.wait(HUNG)
            raise InputClosed("not read")
        self.received += chunk

    def close_input(self) -> None:
        self.closed_input = True

    def stop_input(self) -> None:
        self.stopped = True
        self._stop.set()

    def receive(self) -> tuple[int, bytes] | None:
        if self.chunks:
            return self.chunks.pop(0)
        if self.hold:
            self._cut.wait(HUNG)
        return None

    def cut(self) -> None:
        self.cuts += 1
        self._cut.set()
        self._stop.set()

    def exit_code(self) -> int:
        return self.code

    def close(self) -> None:
        self.closed = True


class Stalled(io.RawIOBase):
    """A source that gives its bytes, then blocks until the host answers (a restore's
    verdict); ``abandon`` is how the pump says the exec has ended."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.answered = threading.Event()

    def read(self, n: int = -1) -> bytes:
        if self.data:
            out, self.data = self.data, b""
            return out
        self.answered.wait(HUNG)
        return b""

    def abandon(self) -> None:
        self.answered.set()


class Failing(io.RawIOBase):
    def read(self, n: int = -1) -> bytes:
        raise OSError("the bank store's stream dropped")


def drive(started: Scripted, stdin: object, stdout: Bounded | None, deadline: Deadline) -> ExecResult:
    """``pump`` one call whose Exec carries these streams and this deadline."""
    return pump(started, Exec("", stdin=stdin, stdout=stdout, deadline=deadline))  # type: ignore[arg-type]


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before, "a thread outlived its call"


def test_H7_the_pump_feeds_stdin_drains_both_channels_and_returns_the_exit_code(no_thread_left: None) -> None:
    """Every byte in, stdout to the sink, stderr as its tail, the exec's own status."""
    exec_ = Scripted([(STDOUT, b"out"), (STDERR, b"err")], code=3)
    sink = Bounded(100, "test")
    done = drive(exec_, io.BytesIO(b"x" * 5000), sink, Deadline.after(HUNG))
    assert (done.exit_code, sink.getvalue(), done.stderr) == (3, b"out", b"err")
    assert bytes(exec_.received) == b"x" * 5000 and exec_.closed_input and exec_.closed
    assert exec_.cuts == 0  # an exec that ended is never cut (its watchdog lives on)


def test_H7_a_call_returns_at_its_deadline_whatever_holds_its_output(no_thread_left: None) -> None:
    """A detached child holds the output open: the deadline cuts, the call says so by name."""
    exec_ = Scripted([(STDOUT, b"partial")], hold=True)
    with pytest.raises(StreamBroken, match="deadline"):
        drive(exec_, None, Bounded(100, "test"), Deadline.after(0.1))
    assert exec_.cuts >= 1 and exec_.closed
    quiet = Scripted([], hold=True)
    with pytest.raises(ExecFailed, match="deadline"):  # no streams: given up, ExecFailed
        drive(quiet, None, None, Deadline.after(0.1))


def test_L5_a_cancelled_run_context_cuts_the_exec_at_once(no_thread_left: None) -> None:
    """The run context is cancelled (the lease let go): the exec is cut long before its deadline."""
    cancel = Cancel()
    exec_ = Scripted([], hold=True)
    timer = threading.Timer(0.05, cancel.cut, ("lease lost",))
    timer.start()
    with pytest.raises(ExecFailed):
        drive(exec_, None, None, Deadline.after(3600.0, cancel))
    timer.join()
    assert exec_.cuts >= 1


def test_X5_a_source_that_fails_cuts_the_exec_and_is_named(no_thread_left: None) -> None:
    """The bank's stream drops mid-restore: StreamBroken naming stdin, the exec cut at once."""
    exec_ = Scripted([], hold=True)
    with pytest.raises(StreamBroken, match="stdin stream broke"):
        drive(exec_, Failing(), Bounded(100, "t"), Deadline.after(3600.0))
    assert exec_.cuts >= 1


def test_H1_output_past_its_bound_cuts_the_exec_and_raises_its_own_name(no_thread_left: None) -> None:
    """A sink's OutputOverBound passes through as itself after the exec is cut."""
    exec_ = Scripted([(STDOUT, b"y" * 10)] * 5, hold=True)
    with pytest.raises(OutputOverBound):
        drive(exec_, None, Bounded(25, "the listing"), Deadline.after(3600.0))
    assert exec_.cuts >= 1


def test_H7_a_source_waiting_on_the_host_is_abandoned_when_the_exec_ends(no_thread_left: None) -> None:
    """A restore refused early: the verdict's source is told, the feeder ends with the call."""
    source = Stalled(b"frame")
    exec_ = Scripted([(STDOUT, b"refused")], code=21)
    done = drive(exec_, source, Bounded(100, "t"), Deadline.after(3600.0))
    assert done.exit_code == 21 and source.answered.is_set() and exec_.stopped


def test_H7_a_peer_that_stops_reading_does_not_hold_the_call(no_thread_left: None) -> None:
    """The exec exits without reading stdin: the blocked send is released, its status stands."""
    exec_ = Scripted([(STDERR, b"no space")], reads=False, code=1)
    done = drive(exec_, io.BytesIO(b"z" * 100), None, Deadline.after(3600.0))
    assert done.exit_code == 1 and exec_.cuts == 0


def test_H7_no_transport_keeps_its_own_feeder() -> None:
    """local, Docker/Podman and Kubernetes start no thread of their own: the pump's scope does."""
    root = Path(adapters_pkg.__file__).parent
    for name in ("local_sandbox.py", "docker_sandbox.py", "k8s_sandbox.py", "watchdog.py"):
        banned = {"Thread", "Feeder"} | ({"Timer"} if name != "watchdog.py" else set())
        tree = ast.parse((root / name).read_text())
        named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        named |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not banned & named, name  # the stores' Watchdog keeps its deadline timer


#: the exec's parts as a signature: a function taking them all repeats what ``Exec`` holds
EXEC_PARTS = {"stdin", "stdout", "user", "deadline"}


def test_H7_what_to_run_is_one_Exec_value_no_transport_or_proxy_repeats_its_signature() -> None:
    """Only ScriptedSandbox.run (the tests' convenience) spells the exec's parts as
    parameters: the transports, the pump and the proxies take one ``Exec``."""
    src = Path(adapters_pkg.__file__).parent.parent  # the installed package's root
    spelled = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if params >= EXEC_PARTS:
                    spelled.append(f"{path.relative_to(src)}:{node.name}")
    assert spelled == ["adapters/scripted.py:run"], spelled


class Recording(ScriptedSandbox):
    """A sandbox whose transport records each Exec (and fails the first when told)."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[Exec] = []
        self.fail = fail
        self.list_bytes = 7

    def execute(self, exec_: Exec) -> ExecResult:
        self.seen.append(exec_)
        if self.fail and len(self.seen) == 1:
            raise StreamBroken("cut")
        return ExecResult(0)


def test_H7_a_proxy_forwards_the_Exec_whole_and_overrides_only_what_it_changes() -> None:
    """The hostile kit over a forwarding base: the call's Exec reaches the transport with
    its streams, user, deadline and token; only the source is shadowed, never the reaper's."""
    from scratchbank.testing.hostile import HostileSandbox

    inner = Recording(fail=True)
    inner.facts = None  # type: ignore[assignment]
    hostile = HostileSandbox(inner, "tar() { :; }")
    assert isinstance(hostile, ForwardingSandbox) and hostile.list_bytes == 7
    sink, deadline = Bounded(10, "t"), Deadline.after(HUNG)
    with pytest.raises(StreamBroken):
        hostile.call(Exec("echo", ["a"], stdout=sink, user="u", deadline=deadline))
    call, reaper = inner.seen
    assert call.source == "tar() { :; }\necho" and call.args == ("a",)
    assert (call.stdout, call.user, call.deadline) == (sink, "u", deadline) and call.token
    assert reaper.source == REAP and reaper.args == (call.token,) and reaper.user == "u"
