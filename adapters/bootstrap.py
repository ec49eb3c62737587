"""The composition root: configuration -> adapters -> the service. Nothing else wires.

The CLI, the HTTP API and an embedding engine all get their ``ScratchService`` here::

    service = bootstrap(settings_from(os.environ))          # operators: a home must exist
    service = open_home("/var/lib/my-engine/scratchbank")   # an engine: created if new

A read never creates a timeline (``create=False``); an engine's home is created.
"""

from __future__ import annotations

from pathlib import Path

from scratchbank.application.clock import Clock, SystemClock
from scratchbank.application.service import ScratchService

from .config import Settings, home_settings, open_bank_store, open_timeline, snapshots_of


def bootstrap(settings: Settings, *, create: bool = False, clock: Clock | None = None) -> ScratchService:
    """Open the timeline and bank store the settings name, and hand back the service."""
    store = open_bank_store(settings.bank_url)
    timeline = open_timeline(settings.timeline_url, create=create)
    return ScratchService(timeline, store, snapshots_of(timeline), clock or SystemClock())


def open_home(path: str | Path, *, clock: Clock | None = None) -> ScratchService:
    """An engine's service on the embedded default: SQLite and banks under one folder."""
    home = Path(path)
    home.mkdir(parents=True, exist_ok=True)
    return bootstrap(home_settings(home), create=True, clock=clock)


def close(service: ScratchService) -> None:
    """Release what the adapters hold open (the timeline's connections)."""
    closer = getattr(service.timeline, "close", None)
    if callable(closer):
        closer()
