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
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, BinaryIO

from scratchbank.application.cancellation import Deadline, deadline_of
from scratchbank.application.ports import ByteSink, SandboxFacts
from scratchbank.domain.errors import ExecFailed, OutputOverBound, SandboxGone, StreamBroken

from .scripted import EXEC_SECONDS, ExecResult, Output, ScriptedSandbox, command
from .watchdog import Feeder, Watchdog

CHUNK = 1 << 20


def _real_file(f: object) -> bool:
    try:
        f.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
    return True


class _Pump(Feeder):
    """Copies one stream to another. A failing source (not the peer closing early) is kept
    in ``error`` and cuts the command, so that nobody waits for bytes that will not come."""

    def __init__(
        self,
        src: IO[bytes],
        dst: IO[bytes] | ByteSink,
        close_dst: bool,
        dog: Watchdog,
        close_src: bool = False,
    ) -> None:
        super().__init__(src, dog)
        self.dst, self.close_dst, self.close_src = dst, close_dst, close_src

    def run(self) -> None:
        # Into a command's stdin, each chunk goes at once: a source that waits between
        # chunks (a restore's verdict waits for the listing) must not leave the last one
        # in the pipe's buffer.
        flush = getattr(self.dst, "flush", None) if self.close_dst else None
        try:
            while chunk := self._read():
                self.dst.write(chunk)
                if flush is not None:
                    flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the command closed its end: its exit status says why
        except BaseException as error:  # the sink failed: raised by the caller
            self.error = error
            self.dog.cut_now()
        finally:
            if self.close_dst:
                with contextlib.suppress(OSError):
                    self.dst.close()  # type: ignore[union-attr]
            if self.close_src:  # a command's output pipe: closed by its reader only (a
                # close from another thread would wait for this read to return)
                with contextlib.suppress(OSError):
                    self.src.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the command and everything it started (nsenter forks into the namespace)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


class LocalSandbox(ScriptedSandbox):
    """A sandbox on this machine. ``isolate=False`` runs commands as plain processes."""

    def __init__(self, root: str | Path | None = None, *, isolate: bool = True) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="scratchbank-local-"))
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / "scratch"
        self._init: subprocess.Popen[bytes] | None = None
        self._spawned: list[subprocess.Popen[bytes]] = []
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
            if pids:
                errors.close()
                self._init, self.ns_pid = init, int(pids[0])
                return "own PID namespace (unshare)"
            time.sleep(0.01)
        init.kill()
        init.wait()
        errors.close()
        return "unshare did not start in time"

    def _argv(self, source: str, args: Sequence[str], token: str | None = None) -> list[str]:
        cmd = command(source, args, token)
        if self.ns_pid is None:
            return cmd
        if self._init is None or self._init.poll() is not None:
            raise SandboxGone("the local sandbox's namespace has ended")
        return ["nsenter", "--target", str(self.ns_pid), "--pid", "--mount", "--", *cmd]

    def spawn(self, command: str) -> subprocess.Popen[bytes]:
        """Start a long-running command inside the sandbox (the workload, in tests)."""
        proc = subprocess.Popen(
            self._argv(command, []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._spawned.append(proc)
        return proc

    def run(
        self,
        source: str,
        args: Sequence[str],
        *,
        stdin: BinaryIO | None = None,
        stdout: ByteSink | None = None,
        user: str | None = None,
        deadline: Deadline | None = None,
        token: str | None = None,
    ) -> ExecResult:
        deadline = deadline_of(deadline, EXEC_SECONDS)
        argv = self._argv(source, args, token)
        direct_in = stdin is not None and _real_file(stdin)
        direct_out = stdout is not None and _real_file(stdout)
        output = Output(stdout)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin if direct_in else (subprocess.PIPE if stdin else subprocess.DEVNULL),
                stdout=stdout if direct_out else subprocess.PIPE,  # type: ignore[arg-type]
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            raise ExecFailed(f"cannot run in the local sandbox: {error}") from error
        with Watchdog(deadline, lambda: _kill_group(proc)) as dog:
            pumps, code = _drive(proc, stdin, output, direct_in, direct_out, dog)
        _raise_cut(dog, pumps, streaming=stdin is not None or stdout is not None)
        if code < 0:
            raise StreamBroken(f"the command was killed by signal {-code}")
        return output.result(code)

    def destroy(self) -> None:
        """End every process of the sandbox and remove its directory."""
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
        shutil.rmtree(self.root, ignore_errors=True)


class _Into:
    """A ByteSink over one of Output's channels."""

    def __init__(self, channel: Callable[[bytes], None]) -> None:
        self.write = channel


def _drive(
    proc: subprocess.Popen[bytes],
    stdin: BinaryIO | None,
    output: Output,
    direct_in: bool,
    direct_out: bool,
    dog: Watchdog,
) -> tuple[list[_Pump], int]:
    """Pump the streams the command does not read or write directly (stderr always, as
    a capped tail); wait for its end."""
    pumps = []
    if stdin is not None and not direct_in:
        assert proc.stdin is not None
        pumps.append(_Pump(stdin, proc.stdin, True, dog))
    if not direct_out:
        assert proc.stdout is not None
        pumps.append(_Pump(proc.stdout, _Into(output.stdout), False, dog, close_src=True))  # type: ignore[arg-type]
    assert proc.stderr is not None
    pumps.append(_Pump(proc.stderr, _Into(output.stderr), False, dog, close_src=True))  # type: ignore[arg-type]
    for p in pumps:
        p.start()
    code = proc.wait()
    for p in pumps:  # one blocked on a stalled source is not waited for, nor stdin's once
        # the command has ended (nobody reads it: a source waiting on the host, as a
        # restore's verdict does, would otherwise hold the call until its deadline); an
        # output pipe a detached child still holds is left to its reader, which ends
        # once the call's reap (ScriptedSandbox.call) has ended that child
        p.join(timeout=0.2 if dog.fired or p.close_dst else max(1.0, dog.deadline.left()))
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    return pumps, code


def _raise_cut(dog: Watchdog, pumps: list[_Pump], *, streaming: bool) -> None:
    """The deadline cut the command, or a pump's source or sink failed: say so by name."""
    if dog.fired:
        why = "the command did not end within its deadline: cut"
        raise StreamBroken(why) if streaming else ExecFailed(why)
    failed = next((p.error for p in pumps if p.error is not None), None)
    if isinstance(failed, OutputOverBound):
        raise failed  # the sandbox said too much: its own name, not a broken stream
    if failed is not None:
        raise StreamBroken(f"the stream broke on the host side: {failed!r}")
