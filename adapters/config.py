"""The composition root: adapters chosen by configuration (URLs), one place only.

- timeline: ``sqlite:///path/timeline.db`` (the embedded default) or
  ``postgresql://user:pw@host:port/db``
- bank store: ``file:///path`` (default) or ``s3://bucket/prefix`` (endpoint and
  credentials from the usual boto3 settings, e.g. AWS_ENDPOINT_URL)
- sandbox: ``docker:CONTAINER``, ``podman:CONTAINER`` (socket from
  SCRATCHBANK_PODMAN_URL or CONTAINER_HOST), ``local:DIR`` or ``none``
Defaults live under ``$SCRATCHBANK_HOME`` (``./var/scratchbank`` when unset).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from scratchbank.application.ports import BankStore, Sandbox, SnapshotStore, Timeline

from .docker_sandbox import DockerSandbox
from .event_store import EventStoreTimeline
from .fs_bank import FilesystemBankStore
from .s3_bank import S3BankStore

DEFAULT_SCRATCH = "/tmp/iterion-scratch"


def home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("SCRATCHBANK_HOME", "var/scratchbank")).resolve()


def timeline_url(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SCRATCHBANK_TIMELINE") or f"sqlite:///{home(env)}/timeline.db"


def bank_url(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SCRATCHBANK_BANK") or f"file://{home(env)}/banks"


def open_timeline(url: str) -> Timeline:
    if url.startswith("sqlite:///"):
        Path(urlparse(url).path).parent.mkdir(parents=True, exist_ok=True)
    return EventStoreTimeline(url)


def open_bank_store(url: str) -> BankStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FilesystemBankStore(parsed.path)
    if parsed.scheme == "s3":
        return S3BankStore(parsed.netloc, parsed.path, endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    raise ValueError(f"unsupported bank store URL {url!r} (file:///... or s3://bucket/prefix)")


def open_sandbox(spec: str, scratch: str = DEFAULT_SCRATCH) -> Sandbox | None:
    kind, _, target = spec.partition(":")
    if kind == "none":
        return None
    if kind == "docker":
        return DockerSandbox(target, scratch=scratch, base_url=os.environ.get("SCRATCHBANK_DOCKER_URL"))
    if kind == "podman":
        url = os.environ.get("SCRATCHBANK_PODMAN_URL") or os.environ.get("CONTAINER_HOST")
        return DockerSandbox(target, scratch=scratch, base_url=url, podman=True)
    raise ValueError(f"unsupported sandbox {spec!r} (docker:NAME, podman:NAME or none)")


def snapshots_of(timeline: Timeline) -> SnapshotStore | None:
    """The event store keeps snapshots beside the timeline; other timelines have none."""
    return timeline if isinstance(timeline, EventStoreTimeline) else None
