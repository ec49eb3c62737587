"""Configuration: where the home is, and which adapters the URLs and specs name.

- home: ``--home DIR``, else ``$SCRATCHBANK_HOME``, else the nearest ``var/scratchbank``
  folder found walking up from the working directory. A read never creates one: without
  a home (and without explicit store URLs) a command stops with HOME_NOT_FOUND.
- timeline: ``sqlite:///path/timeline.db`` (default ``HOME/timeline.db``) or
  ``postgresql://user:pw@host:port/db`` (``$SCRATCHBANK_TIMELINE``, ``--timeline``)
- bank store: ``file:///path`` (default ``HOME/banks``) or ``s3://bucket/prefix``
  (``$SCRATCHBANK_BANK``, ``--bank``; endpoint and credentials from the usual boto3
  settings, e.g. AWS_ENDPOINT_URL)
- queue: ``nats://HOST:PORT`` (``$SCRATCHBANK_QUEUE``, ``--queue``): resumes are judged by
  the surface and published for a runner (``scratchbank runner``); unset, a resume runs in
  this process as before
- sandbox: ``docker:CONTAINER``, ``podman:CONTAINER`` (socket from SCRATCHBANK_PODMAN_URL
  or CONTAINER_HOST), ``k8s:NAMESPACE/POD`` (kubeconfig or in-cluster), ``local:DIR``
  (a directory on this machine; its scratch is ``DIR/scratch``)

The default scratch path in a container or pod is ``/tmp/scratchbank-scratch``. Every
bad setting is a named error (ConfigInvalid, HomeNotFound); a password in a URL is never
echoed in one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

import attrs

from scratchbank.application.ports import BankStore, RunLock, Sandbox, SnapshotStore, Timeline
from scratchbank.domain.errors import ConfigInvalid, HomeNotFound, ScratchbankError

DEFAULT_SCRATCH = "/tmp/scratchbank-scratch"
HOME_MARKER = Path("var") / "scratchbank"
SANDBOX_FORMS = "docker:NAME | podman:NAME | k8s:NAMESPACE/POD | local:DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


@attrs.frozen
class Home:
    """The folder holding ``timeline.db`` and ``banks/``, and how it was chosen."""

    path: Path
    how: str


@attrs.frozen
class Settings:
    """What the surfaces need to open the adapters: URLs and where they came from."""

    timeline_url: str
    bank_url: str
    home: Home | None = None
    scratch: str = DEFAULT_SCRATCH
    queue_url: str | None = None

    def describe(self) -> str:
        where = f"home {self.home.path} ({self.home.how})" if self.home else "no home (explicit URLs)"
        queue = f"; queue {redact(self.queue_url)}" if self.queue_url else ""
        return f"{where}; timeline {redact(self.timeline_url)}; banks {redact(self.bank_url)}{queue}"


def redact(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL in it masked."""
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def _home_dir(path: Path, how: str) -> Home:
    if path.exists() and not path.is_dir():
        raise ConfigInvalid(f"the home {path} ({how}) is not a directory")
    if not path.is_dir():
        raise HomeNotFound(f"the home {path} ({how}) does not exist")
    return Home(path.resolve(), how)


def find_home(explicit: str | None, env: Mapping[str, str], cwd: Path) -> Home:
    """The explicit home, else SCRATCHBANK_HOME, else the nearest ``var/scratchbank`` up from cwd."""
    if explicit:
        return _home_dir(Path(explicit), "--home")
    if env.get("SCRATCHBANK_HOME"):
        return _home_dir(Path(env["SCRATCHBANK_HOME"]), "SCRATCHBANK_HOME")
    for folder in (cwd, *cwd.parents):
        if (folder / HOME_MARKER).is_dir():
            return Home((folder / HOME_MARKER).resolve(), f"found from {cwd}")
    raise HomeNotFound(f"no --home, no SCRATCHBANK_HOME, and no {HOME_MARKER} above {cwd}")


def settings_from(
    env: Mapping[str, str] | None = None,
    *,
    home: str | None = None,
    timeline: str | None = None,
    bank: str | None = None,
    queue: str | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Flags over environment; the home is looked for only when a URL is left to default."""
    env = os.environ if env is None else env
    timeline = timeline or env.get("SCRATCHBANK_TIMELINE") or None
    bank = bank or env.get("SCRATCHBANK_BANK") or None
    found = None
    if home or env.get("SCRATCHBANK_HOME") or not (timeline and bank):
        found = find_home(home, env, cwd or Path.cwd())
    timeline = timeline or f"sqlite://{found.path if found else ''}/timeline.db"
    bank = bank or f"file://{found.path if found else ''}/banks"
    scratch = env.get("SCRATCHBANK_SCRATCH") or DEFAULT_SCRATCH
    queue = check_queue_url(queue or env.get("SCRATCHBANK_QUEUE") or None)
    return Settings(timeline, bank, found, scratch, queue)


def check_queue_url(url: str | None) -> str | None:
    """A ``nats://HOST:PORT`` queue URL as given, None for none, or ConfigInvalid."""
    if url is None:
        return None
    parsed = urlparse(url)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:  # a port that is not a number, or out of range
        port_ok = False
    if parsed.scheme not in ("nats", "tls") or not parsed.hostname or not port_ok:
        raise ConfigInvalid(f"unsupported queue URL {redact(url)[:200]!r} (nats://HOST:PORT)")
    return url


def bank_folder(url: str) -> Path:
    """The folder of a ``file://`` bank store URL (a runner process banks on disk), or ConfigInvalid."""
    parsed = urlparse(url)
    if parsed.scheme != "file" or not parsed.path or parsed.netloc not in ("", "localhost"):
        raise ConfigInvalid(f"a runner banks on disk for now: {redact(url)!r} is not a file:/// bank URL")
    return Path(unquote(parsed.path))


def home_settings(path: Path) -> Settings:
    """An embedding engine's settings: everything under one home folder it names."""
    home = Home(path.resolve(), "given")
    return Settings(f"sqlite://{home.path}/timeline.db", f"file://{home.path}/banks", home)


def _sqlite_path(url: str) -> Path:
    from .event_store import env_for_url

    name = env_for_url(url)["SQLITE_DBNAME"]
    if name in ("", ":memory:") or name.endswith("/"):
        raise ConfigInvalid(f"the timeline URL {url!r} names no database file")
    return Path(name)


def _check_timeline_url(url: str, *, create: bool) -> None:
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        return _check_sqlite(_sqlite_path(url), create=create)
    if scheme in ("postgres", "postgresql"):
        return _check_postgres(url)
    raise ConfigInvalid(f"unsupported timeline URL {redact(url)!r} (sqlite:///PATH or postgresql://...)")


def _check_sqlite(path: Path, *, create: bool) -> None:
    if path.parent.exists() and not path.parent.is_dir():
        raise ConfigInvalid(f"the timeline's folder {path.parent} is not a directory")
    if not create and not path.is_file():
        raise HomeNotFound(f"no timeline at {path} (a read creates none)")


def _check_postgres(url: str) -> None:
    parsed = urlparse(url)
    try:
        host = parsed.hostname and (parsed.port or True) and parsed.hostname
    except ValueError:  # a port that is not a number
        host = None
    if not host:
        raise ConfigInvalid(f"the timeline URL {redact(url)!r} names no host")


def open_timeline(url: str, *, create: bool = False) -> Timeline:
    """The timeline the URL names. ``create`` lets an engine start a new SQLite file."""
    from .event_store import EventStoreTimeline

    _check_timeline_url(url, create=create)
    try:
        return EventStoreTimeline(url)
    except ScratchbankError as error:
        raise type(error)(_masked(error.message, url)) from None


def open_run_lock(url: str) -> RunLock:
    """The run's lock next to the timeline the URL names (A16, ADR 0007): a ``.locks``
    SQLite file beside a SQLite timeline, a lease table in a PostgreSQL one."""
    from .run_lock import PostgresRunLock, SqliteRunLock

    if urlparse(url).scheme == "sqlite":
        return SqliteRunLock(_sqlite_path(url).with_suffix(".locks"))
    try:
        return PostgresRunLock(url)
    except ScratchbankError as error:
        raise type(error)(_masked(error.message, url)) from None


def _masked(message: str, url: str) -> str:
    password = urlparse(url).password
    message = redact(message)
    for form in {password, unquote(password or ""), quote(password or "")} - {None, ""}:
        message = message.replace(str(form), "***")
    return message


def open_bank_store(url: str) -> BankStore:
    """The bank store the URL names (nothing is created until a bank is put)."""
    parsed = urlparse(url)
    if parsed.scheme == "file" and parsed.path and parsed.netloc in ("", "localhost"):
        if Path(parsed.path).exists() and not Path(parsed.path).is_dir():
            raise ConfigInvalid(f"the bank folder {parsed.path} is not a directory")
        from .fs_bank import FilesystemBankStore

        return FilesystemBankStore(unquote(parsed.path))
    if parsed.scheme == "s3" and parsed.netloc:
        return _s3_store(parsed.netloc, parsed.path, url)
    raise ConfigInvalid(f"unsupported bank store URL {redact(url)!r} (file:///PATH or s3://BUCKET/PREFIX)")


def _s3_store(bucket: str, prefix: str, url: str) -> BankStore:
    from .s3_bank import S3BankStore

    try:
        return S3BankStore(bucket, prefix, endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    except Exception as error:  # botocore's ValueError for a bad endpoint, a bad region...
        raise ConfigInvalid(f"cannot set up {redact(url)}: {_masked(str(error), url)}") from None


def parse_sandbox(spec: str) -> tuple[str, str]:
    """(kind, target) of a sandbox spec, or ConfigInvalid naming the forms it takes."""
    kind, sep, target = spec.partition(":")
    ok = bool(sep) and kind in ("docker", "podman", "k8s", "local")
    if kind == "k8s":
        namespace, _, pod = target.partition("/")
        ok = ok and bool(_NAME.fullmatch(namespace)) and bool(_NAME.fullmatch(pod))
    elif kind == "local":
        # absolute and already normal: no '..' can walk out of a directory an allow-list names
        ok = ok and target.startswith("/") and "\x00" not in target and os.path.normpath(target) == target
    else:
        ok = ok and bool(_NAME.fullmatch(target))
    if not ok:
        raise ConfigInvalid(f"unsupported sandbox {spec[:200]!r} ({SANDBOX_FORMS})")
    return kind, target


def open_sandbox(spec: str, scratch: str = DEFAULT_SCRATCH) -> Sandbox:
    """The sandbox the spec names; it must exist (SandboxGone otherwise)."""
    kind, target = parse_sandbox(spec)
    if kind == "local":
        return _local(Path(target))
    if kind == "k8s":
        namespace, _, pod = target.partition("/")
        return _kubernetes(namespace, pod, scratch)
    return _docker(target, scratch, podman=kind == "podman")


def _local(root: Path) -> Sandbox:
    from .local_sandbox import LocalSandbox

    if not root.is_dir():
        raise ConfigInvalid(f"local:{root}: not an existing directory (its scratch is {root}/scratch)")
    # A restore target needs no PID namespace (that is for quiescing at teardown).
    return LocalSandbox(root, isolate=False)


def _docker(container: str, scratch: str, *, podman: bool) -> Sandbox:
    import docker

    from .docker_sandbox import DockerSandbox

    var = "SCRATCHBANK_PODMAN_URL" if podman else "SCRATCHBANK_DOCKER_URL"
    url = os.environ.get(var) or (os.environ.get("CONTAINER_HOST") if podman else None)
    try:
        client: Any = docker.DockerClient(base_url=url, timeout=60)
    except docker.errors.DockerException as error:
        engine = "Podman" if podman else "Docker"
        raise ConfigInvalid(f"cannot reach the {engine} engine ({var}): {error}") from None
    return DockerSandbox(container, scratch=scratch, podman=podman, client=client)


def _kubernetes(namespace: str, pod: str, scratch: str) -> Sandbox:
    from kubernetes import client as k8s
    from kubernetes import config as kube_config

    from .k8s_sandbox import KubernetesSandbox

    configuration = k8s.Configuration()
    try:
        kube_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except Exception:  # no kubeconfig here: maybe we run in a pod
        try:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except Exception as error:
            raise ConfigInvalid(f"no Kubernetes configuration (KUBECONFIG or in-cluster): {error}") from None
    api = k8s.ApiClient(configuration)
    return KubernetesSandbox(pod, namespace=namespace, scratch=scratch, api_client=api)


def snapshots_of(timeline: Timeline) -> SnapshotStore | None:
    """The event store keeps snapshots beside the timeline; other timelines have none."""
    from .event_store import EventStoreTimeline

    return timeline if isinstance(timeline, EventStoreTimeline) else None


def parse_port(value: str) -> int:
    """A TCP port 1-65535 (0 lets the system pick), or ConfigInvalid."""
    if not value.isdigit() or int(value) > 65535:
        raise ConfigInvalid(f"port {value[:20]!r} is not a TCP port (0-65535)")
    return int(value)
