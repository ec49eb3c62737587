"""The composition root of the service: configuration -> adapters -> ``ScratchService``.

The detached runner is wired in ``runner_process`` (from the same settings) and the
demo wires its own service over in-memory fakes (``demo.py``).

The CLI, the HTTP API and an embedding engine all get their ``ScratchService`` here::

    service = bootstrap(settings_from(os.environ))          # operators: a home must exist
    with open_home("/var/lib/my-engine/scratchbank") as service:   # an engine: created if new
        ...                                                 # closed on the way out

A read never creates a timeline (``create=False``); an engine's home is created.
With a queue URL (``SCRATCHBANK_QUEUE``) the service publishes resumes on NATS for a
detached runner, which ``run_runner`` starts from the same settings (through
``runner_process``: one wiring of the runner, not two).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import attrs

from scratchbank.application.ports import Clock, DeliveryQueue, SystemClock
from scratchbank.application.service import ScratchService

from .config import (
    Settings,
    home_settings,
    open_bank_store,
    open_run_lock,
    open_timeline,
    redact,
    snapshots_of,
)

#: Stream, consumer and lease bucket names shared by the surfaces and the runners.
QUEUE_NAMESPACE = "sb"


@attrs.frozen
class OpenService(ScratchService):
    """The service with what its adapters hold open: ``with`` closes it (``close``)."""

    def __enter__(self) -> OpenService:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        close(self)


def bootstrap(
    settings: Settings, *, create: bool = False, clock: Clock | None = None, read_only: bool = False
) -> OpenService:
    """Open the timeline, bank store and queue the settings name, and hand back the service.
    ``read_only``: for a command that only reads (``status``): the timeline is opened so
    that nothing is written to it."""
    store = open_bank_store(settings.bank_url)
    timeline = open_timeline(settings.timeline_url, create=create, read_only=read_only)
    try:
        queue = open_queue(settings.queue_url) if settings.queue_url else None
    except BaseException:
        _close(timeline)
        raise
    lock = open_run_lock(settings.timeline_url)
    return OpenService(
        timeline,
        store,
        snapshots_of(timeline),
        clock or SystemClock(),
        queue=queue,
        lock=lock,
        retain=settings.retain,
    )


def open_queue(url: str, namespace: str = QUEUE_NAMESPACE) -> DeliveryQueue:
    """The JetStream delivery queue at ``url`` (QueueUnavailable, its URL redacted, if unreachable)."""
    from scratchbank.domain.errors import QueueUnavailable

    from .nats_queue import NatsConnection, NatsDeliveryQueue

    try:
        conn = NatsConnection(url, name="scratchbank-surface")
        return NatsDeliveryQueue(conn, namespace=namespace)
    except QueueUnavailable as error:
        raise QueueUnavailable(redact(error.message)) from None


def runner_argv(
    settings: Settings,
    *,
    workflow: Path,
    sandboxes: Path,
    holder: str = "runner",
    log: Path | None = None,
    namespace: str = QUEUE_NAMESPACE,
) -> list[str]:
    """The arguments of ``runner_process`` for the queue, timeline and banks of ``settings``."""
    from scratchbank.domain.errors import ConfigInvalid

    if not settings.queue_url:
        raise ConfigInvalid("a runner needs a queue: SCRATCHBANK_QUEUE or --queue nats://HOST:PORT")
    argv = ["--nats", settings.queue_url, "--namespace", namespace, "--timeline", settings.timeline_url]
    argv += ["--bank", settings.bank_url, "--sandboxes", str(sandboxes)]
    argv += ["--workflow", str(workflow), "--holder", holder]
    return argv + (["--log", str(log)] if log else [])


def run_runner(settings: Settings, *, workflow: Path, sandboxes: Path, holder: str, log: Path | None) -> int:
    """Run a detached runner on the configured queue until SIGTERM (``scratchbank runner``)."""
    from . import runner_process

    if not workflow.is_file():
        from scratchbank.domain.errors import ConfigInvalid

        raise ConfigInvalid(f"no workflow file {workflow} (a JSON list of {{name, kind, command}})")
    sandboxes.mkdir(parents=True, exist_ok=True)
    argv = runner_argv(settings, workflow=workflow, sandboxes=sandboxes, holder=holder, log=log)
    return runner_process.main(argv)


def open_home(path: str | Path, *, clock: Clock | None = None) -> OpenService:
    """An engine's service on the embedded default: SQLite and banks under one folder.

    ``with open_home(path) as service:`` closes it on the way out. A path that is a file, or
    a folder this user cannot create or read, is CONFIG_INVALID (nothing is created)."""
    from scratchbank.domain.errors import ConfigInvalid

    home = Path(path)
    try:
        if home.exists() and not home.is_dir():
            raise ConfigInvalid(f"the home {home} is not a directory", remedy="name a folder for the home")
        home.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigInvalid(
            f"cannot create the home {home}: {error.strerror or error}",
            remedy="name a folder this user can create and write",
        ) from None
    return bootstrap(home_settings(home), create=True, clock=clock)


def close(service: ScratchService) -> None:
    """Release what the adapters hold open (the run locks of executions it started, A16;
    the timeline's connections)."""
    service.let_go()
    for held in (service.timeline, getattr(service.queue, "conn", None)):
        _close(held)


def _close(held: object) -> None:
    closer = getattr(held, "close", None)
    if callable(closer):
        closer()
