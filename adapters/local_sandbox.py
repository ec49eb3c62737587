"""A local sandbox: a directory, and commands in a PID namespace of their own.

The namespace is held open by a sleeping init (``unshare --pid --fork --mount-proc``);
every command enters it with ``nsenter``, so a quiesce sees exactly the sandbox's own
processes. Where the machine does not allow ``unshare``, commands run as plain
processes and the sandbox says it is not process-isolated (no quiesce, T11/T13).
The scratch dies with the sandbox, so it is not host-backed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from scratchbank.application.ports import SandboxFacts
from scratchbank.domain.errors import ExecFailed, SandboxGone, StreamBroken

from .exec_output import ExecResult
from .exec_pump import CHUNK, STDERR, STDOUT, InputClosed, pump
from .scripted import Exec, ScriptedSandbox


def _real_file(f: object) -> bool:
    try:
        f.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the command and everything it started (nsenter forks into the namespace)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


#: The variable that marks every process a local sandbox starts (with the sandbox's own
#: value): ``destroy`` ends each one still running, a child that detached (setsid) too.
SANDBOX_VAR = "SCRATCHBANK_LOCAL_SANDBOX"


def _marked(value: str) -> list[int]:
    """The host's live processes started by one local sandbox: those whose environment (as
    it was when they started: a script cannot shed it by unsetting a variable) carries
    ``value``. Never this process. (Not by session or group: once a command is reaped its
    number may be another process's.) One read a process: a zombie's environ reads empty,
    so it is never found (a scan runs at least twice a close: it must stay cheap)."""
    wanted = f"{SANDBOX_VAR}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _poll(wanted: dict[int, int]) -> list[int]:
    """The descriptors of ``wanted`` (fd: events) that are ready (or hung up, or failed):
    blocks until one is. Any descriptor number (``select.select`` stops at 1,023)."""
    poller = select.poll()
    for fd, events in wanted.items():
        poller.register(fd, events)
    return [fd for fd, _ in poller.poll()]


class _LocalExec:
    """One local command as the exec pump drives it (adapters/exec_pump.py): its pipes
    are read and written without blocking, beside a wake pipe that ``cut`` and
    ``stop_input`` write to, so a pipe a detached child still holds never holds the call."""

    def __init__(self, proc: subprocess.Popen[bytes], wants_input: bool) -> None:
        self.proc, self.wants_input = proc, wants_input
        self._wake_r, self._wake_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        self._open = {
            f.fileno(): channel
            for f, channel in ((proc.stdout, STDOUT), (proc.stderr, STDERR))
            if f is not None
        }
        for fd in (*self._open, *([proc.stdin.fileno()] if proc.stdin else [])):
            os.set_blocking(fd, False)
        self._cut = False
        self._closed = False
        self._guard = threading.Lock()  # a late cut never writes to a closed (reused) fd

    def send(self, chunk: bytes) -> None:
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        view = memoryview(chunk)
        while view:
            # poll, not select: a process with 200 calls at once holds descriptors past
            # select()'s 1,024 (ValueError, once reported as a broken stream: issue 26)
            ready = _poll({self._wake_r: select.POLLIN, self._stop_r: select.POLLIN, fd: select.POLLOUT})
            if self._wake_r in ready or self._stop_r in ready:
                raise InputClosed("cut")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError as error:  # the command closed its end
                raise InputClosed(str(error)) from error

    def close_input(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def stop_input(self) -> None:
        with self._guard, contextlib.suppress(OSError):
            if not self._closed:
                os.write(self._stop_w, b"x")

    def receive(self) -> tuple[int, bytes] | None:
        while self._open:
            ready = _poll({**dict.fromkeys(self._open, select.POLLIN), self._wake_r: select.POLLIN})
            if self._wake_r in ready:
                return self._left_over()
            for fd in ready:
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                if data:
                    return self._open[fd], data
                del self._open[fd]
        return None

    def _left_over(self) -> tuple[int, bytes] | None:
        """Cut: what the pipes already hold is still the exec's output (a bank's quiesce
        report, written before its tar was cut). Each pipe is read once, without waiting:
        a detached child that keeps writing never holds the call."""
        while self._open:
            fd, channel = self._open.popitem()
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # nothing buffered (BlockingIOError) or the pipe is gone
                continue
            if data:
                return channel, data
        return None

    def cut(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._cut = True
            _kill_group(self.proc)
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def exit_code(self) -> int:
        code = self.proc.wait()
        if code < 0 and not self._cut:
            raise StreamBroken(f"the command was killed by signal {-code}")
        return code

    def close(self) -> None:
        if self._cut:  # killed with its group: collect it (never left a zombie)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        # the command's pipes (a detached child's end stays its own: it ends at the reap)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        with self._guard:
            self._closed = True
            for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _exec_done(child: int) -> bool:
    """The namespace's init has become ``sleep``: unshare mounts the namespace's own /proc
    in the child before it execs, so an ``nsenter`` between its fork and its exec saw the
    host's /proc (a quiesce refused it as the host's PID namespace, under load)."""
    try:
        return Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep\0")
    except OSError:
        return False


class LocalSandbox(ScriptedSandbox):
    """A sandbox on this machine. ``isolate=False`` runs commands as plain processes."""

    def __init__(self, root: str | Path | None = None, *, isolate: bool = True) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="scratchbank-local-"))
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / "scratch"
        self._init: subprocess.Popen[bytes] | None = None
        self._spawned: list[subprocess.Popen[bytes]] = []
        self._mark = secrets.token_hex(8)
        self.ns_pid: int | None = None
        why = "commands run as plain host processes"
        if isolate and shutil.which("unshare") and shutil.which("nsenter"):
            why = self._start_namespace() or why
        self.admin_user = None
        self.facts = SandboxFacts(
            scratch=str(scratch),
            host_backed=False,
            process_isolated=self.ns_pid is not None,
            isolation=why,
            engine="local",
        )

    def _start_namespace(self) -> str | None:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed on every path below
        init = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
        children = Path(f"/proc/{init.pid}/task/{init.pid}/children")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if init.poll() is not None:
                errors.seek(0)
                err = errors.read().decode(errors="replace")
                errors.close()
                return f"unshare is not permitted here ({err.strip()[:200]})"
            try:
                pids = children.read_text().split()
            except OSError:
                pids = []
            if pids and _exec_done(int(pids[0])):
                errors.close()
                self._init, self.ns_pid = init, int(pids[0])
                return "own PID namespace (unshare)"
            time.sleep(0.01)
        init.kill()
        init.wait()
        errors.close()
        return "unshare did not start in time"

    def _argv(self, cmd: list[str]) -> list[str]:
        """``cmd`` as started in the sandbox's namespaces (entered when it has its own)."""
        if self.ns_pid is None:
            return cmd
        if self._init is None or self._init.poll() is not None:
            raise SandboxGone("the local sandbox's namespace has ended")
        return ["nsenter", "--target", str(self.ns_pid), "--pid", "--mount", "--", *cmd]

    def spawn(self, command: str) -> subprocess.Popen[bytes]:
        """Start a long-running command inside the sandbox (the workload, in tests)."""
        proc = subprocess.Popen(
            self._argv(Exec(command).argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, SANDBOX_VAR: self._mark},
        )
        self._spawned.append(proc)
        return proc

    def execute(self, exec_: Exec) -> ExecResult:
        argv = self._argv(exec_.argv)
        stdin, stdout = exec_.stdin, exec_.stdout
        direct_in = stdin is not None and _real_file(stdin)
        direct_out = stdout is not None and _real_file(stdout)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin if direct_in else (subprocess.PIPE if stdin else subprocess.DEVNULL),
                stdout=stdout if direct_out else subprocess.PIPE,  # type: ignore[arg-type]
                stderr=subprocess.PIPE,
                start_new_session=True,
                env={**os.environ, SANDBOX_VAR: self._mark},
            )
        except OSError as error:
            raise ExecFailed(f"cannot run in the local sandbox: {error}") from error
        running = _LocalExec(proc, wants_input=stdin is not None and not direct_in)
        return pump(running, exec_, stdout=not direct_out, name="local-exec")

    def destroy(self) -> None:
        """End every process of the sandbox and remove its directory: its namespace's, and
        on the host every process its commands started (by the mark in their environment), a
        writer that outlived its exec or detached from it included (a host harm otherwise:
        a loop reparented to init, burning a core)."""
        if self._init is not None and self._init.poll() is None:
            try:
                os.killpg(self._init.pid, signal.SIGKILL)
            except OSError:
                self._init.kill()
            self._init.wait(timeout=10)
        for proc in self._spawned:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self._end_the_rest()
        shutil.rmtree(self.root, ignore_errors=True)

    def _end_the_rest(self, rounds: int = 20) -> None:
        """SIGKILL every host process the sandbox started, until a pass (the second at
        least) kills nothing: a process caught inside an execve reads an empty environ, so
        one empty scan proves nothing (as the cut call's reap); one that forked between a
        scan and its kill is found by the next. Bounded: ``rounds`` passes at most."""
        for done in range(1, rounds + 1):
            hit = False
            for pid in _marked(self._mark):
                hit = _kill_marked(pid, self._mark) or hit
            if not hit and done >= 2:
                return
            time.sleep(0.01)


def _kill_marked(pid: int, value: str) -> bool:
    """SIGKILL ``pid`` if the process it names now still carries the mark: held by a
    pidfd first, its environ read again, signalled through the pidfd (a number a scan
    found may be another process's by the kill: never signalled). Whether it was signalled."""
    wanted = f"{SANDBOX_VAR}={value}".encode()
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if wanted not in f.read().split(b"\0"):
                return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
