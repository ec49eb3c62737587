"""Configuration: where the home is, and which adapters the URLs and specs name.

- home: ``--home DIR``, else ``$SCRATCHBANK_HOME``, else the nearest ``var/scratchbank``
  folder found walking up from the working directory. A read never creates one: without
  a home (and without explicit store URLs) a command stops with HOME_NOT_FOUND.
- timeline: ``sqlite:///path/timeline.db`` (default ``HOME/timeline.db``) or
  ``postgresql://user:pw@host:port/db`` (``$SCRATCHBANK_TIMELINE``, ``--timeline``)
- bank store: ``file:///path`` (default ``HOME/banks``) or ``s3://bucket/prefix``
  (``$SCRATCHBANK_BANK``, ``--bank``; endpoint and credentials from the usual boto3
  settings, e.g. AWS_ENDPOINT_URL; ``?in_flight=N``: the S3 calls at once its client
  keeps a connection for, 1 to 1024, default 64)
- queue: ``nats://HOST:PORT`` (``$SCRATCHBANK_QUEUE``, ``--queue``): resumes are judged by
  the surface and published for a runner (``scratchbank runner``); unset, a resume runs in
  this process as before
- sandbox: ``docker:CONTAINER`` (SCRATCHBANK_DOCKER_URL, else DOCKER_HOST, else the local
  socket), ``podman:CONTAINER`` (SCRATCHBANK_PODMAN_URL or CONTAINER_HOST: required, never
  Docker's socket), ``k8s:NAMESPACE/POD`` (kubeconfig or in-cluster), ``local:DIR`` (a
  directory on this machine; its scratch is ``DIR/scratch``)
- retention: ``$SCRATCHBANK_RETAIN`` (K8): how many recent checkpoints' banks a run keeps,
  a whole number from 1 to 64 (default 5); the surfaces and the runner read the same
  variable, so the gate decides with the retention the prune keeps

Each adapter past the core (SQLite, files, local sandboxes) needs its extra installed:
``pip install 'scratchbank[docker]'`` (Docker and Podman), ``[kubernetes]``, ``[s3]``,
``[postgres]``, ``[http]``, ``[nats]``, ``[mcp]`` or ``[all]``; without it the command
stops with CONFIG_INVALID naming the exact pip command.

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
from urllib.parse import ParseResult, parse_qs, quote, unquote
from urllib.parse import urlparse as _urlparse

import attrs

from scratchbank.application.ports import BankStore, RunLock, Sandbox, SnapshotStore, Timeline
from scratchbank.domain.errors import ConfigInvalid, ExecFailed, HomeNotFound, SandboxGone, ScratchbankError
from scratchbank.domain.retention import HISTORY, RETAIN_CHECKPOINTS

DEFAULT_SCRATCH = "/tmp/scratchbank-scratch"
HOME_MARKER = Path("var") / "scratchbank"
SANDBOX_FORMS = "docker:NAME | podman:NAME | k8s:NAMESPACE/POD | local:DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")

#: The module each extra brings, and the extra's name (``pip install 'scratchbank[NAME]'``).
EXTRAS = {
    "docker": "docker",
    "kubernetes": "kubernetes",
    "boto3": "s3",
    "psycopg": "postgres",
    "fastapi": "http",
    "uvicorn": "http",
    "nats": "nats",
    "mcp": "mcp",
}


def require_extra(module: str, extra: str | None = None) -> None:
    """CONFIG_INVALID naming the pip command when ``module`` (an extra's) is not installed."""
    import importlib.util

    extra = extra or EXTRAS[module]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        command = f"pip install 'scratchbank[{extra}]'"
        raise ConfigInvalid(
            f"this needs the {extra!r} extra ({module} is not installed)", remedy=f"run: {command}"
        )


def urlparse(url: str) -> ParseResult:
    """``urllib.parse.urlparse``, whose ValueError (a malformed IPv6 host) is CONFIG_INVALID."""
    try:
        parsed = _urlparse(url)
        parsed.port  # noqa: B018 - a bad port raises only when read
    except ValueError as error:
        raise ConfigInvalid(f"malformed URL {redact(url)[:200]!r}: {error}") from None
    return parsed


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
    #: K8: how many recent checkpoints' banks retention keeps (SCRATCHBANK_RETAIN)
    retain: int = RETAIN_CHECKPOINTS

    def describe(self) -> str:
        where = f"home {self.home.path} ({self.home.how})" if self.home else "no home (explicit URLs)"
        queue = f"; queue {redact(self.queue_url)}" if self.queue_url else ""
        return f"{where}; timeline {redact(self.timeline_url)}; banks {redact(self.bank_url)}{queue}"


def redact(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL in it masked."""
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def _home_dir(path: Path, how: str) -> Home:
    try:
        if path.exists() and not path.is_dir():
            raise ConfigInvalid(f"the home {path} ({how}) is not a directory")
        if not path.is_dir():
            raise HomeNotFound(f"the home {path} ({how}) does not exist")
        os.listdir(path)  # a home this user cannot read is named here, not met as a bug later
        return Home(path.resolve(), how)
    except OSError as error:
        raise ConfigInvalid(
            f"the home {path} ({how}) cannot be read: {error.strerror or error}",
            remedy="give this user read access to the home, or point --home at one it can read",
        ) from None


def find_home(explicit: str | None, env: Mapping[str, str], cwd: Path) -> Home:
    """The explicit home, else SCRATCHBANK_HOME, else the nearest ``var/scratchbank`` up from cwd."""
    if explicit:
        return _home_dir(Path(explicit), "--home")
    if env.get("SCRATCHBANK_HOME"):
        return _home_dir(Path(env["SCRATCHBANK_HOME"]), "SCRATCHBANK_HOME")
    for folder in (cwd, *cwd.parents):
        try:
            found = (folder / HOME_MARKER).is_dir()
        except OSError:  # a folder above this user cannot look into: not a home
            found = False
        if found:
            return _home_dir(folder / HOME_MARKER, f"found from {cwd}")
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
    retain = parse_retain(env.get(RETAIN_VARIABLE))
    return Settings(timeline, bank, found, scratch, queue, retain)


#: K8: the variable the surfaces and the runner read their checkpoint retention from
RETAIN_VARIABLE = "SCRATCHBANK_RETAIN"


def parse_retain(value: str | None) -> int:
    """The retention setting: unset or empty is the default (5); else a whole number from 1
    to 64, or ConfigInvalid naming the variable and the range."""
    if value is None or not value.strip():
        return RETAIN_CHECKPOINTS
    text = value.strip()
    # a digit string is checked before int() reads it: past 4300 digits int() raises ValueError
    if not text.isascii() or not text.isdigit() or len(text) > 8 or not 1 <= int(text) <= HISTORY:
        what = f"a whole number from 1 to {HISTORY}"
        raise ConfigInvalid(
            f"{RETAIN_VARIABLE}={value[:20]!r} is not a checkpoint retention ({what})",
            remedy=f"set {RETAIN_VARIABLE} to how many checkpoints' banks to keep ({what}; default 5)",
        )
    return int(text)


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
    require_extra("nats")
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
    try:
        if path.parent.exists() and not path.parent.is_dir():
            raise ConfigInvalid(f"the timeline's folder {path.parent} is not a directory")
        if not create and not path.is_file():
            raise HomeNotFound(f"no timeline at {path} (a read creates none)")
    except OSError as error:
        raise denied(error, f"the timeline {path}") from None


def denied(error: OSError, what: str) -> ConfigInvalid:
    """An OSError met on a path the settings name (permissions, mostly): the user's to fix."""
    return ConfigInvalid(
        f"{what} cannot be read: {error.strerror or error}",
        remedy="give this user access to it, or point the setting at one it can read",
    )


def _check_postgres(url: str) -> None:
    require_extra("psycopg")
    parsed = urlparse(url)
    try:
        host = parsed.hostname and (parsed.port or True) and parsed.hostname
    except ValueError:  # a port that is not a number
        host = None
    if not host:
        raise ConfigInvalid(f"the timeline URL {redact(url)!r} names no host")


def open_timeline(url: str, *, create: bool = False, read_only: bool = False) -> Timeline:
    """The timeline the URL names. ``create`` lets an engine start a new SQLite file;
    ``read_only`` opens it for reading only (``status``: nothing is written, not even a
    snapshot)."""
    from .event_store import EventStoreTimeline

    _check_timeline_url(url, create=create)
    try:
        return EventStoreTimeline(url, read_only=read_only and not create)
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
        return _s3_store(parsed.netloc, parsed.path, url, s3_in_flight(url, parsed.query))
    raise ConfigInvalid(f"unsupported bank store URL {redact(url)!r} (file:///PATH or s3://BUCKET/PREFIX)")


#: What an ``s3://`` URL's ``?in_flight=N`` may ask for: the S3 calls one store makes at
#: once, a kept connection each (issue 26); past this it is a typo, not a pool.
S3_IN_FLIGHT_MAX = 1024
#: Its default (the S3 store's own ``IN_FLIGHT``, kept here so a URL is checked before boto3 loads).
S3_IN_FLIGHT = 64


def s3_in_flight(url: str, query: str) -> int:
    """The ``in_flight=N`` of an ``s3://`` bank URL (default 64), or ConfigInvalid naming
    it: a whole number from 1 to 1024; any other setting in the query is refused too."""
    given = parse_qs(query, keep_blank_values=True)
    what = f"a whole number from 1 to {S3_IN_FLIGHT_MAX}"
    unknown = sorted(set(given) - {"in_flight"})
    if unknown or (query and not given):
        raise ConfigInvalid(
            f"the bank store URL {redact(url)[:200]!r} has a setting it does not know "
            f"({(unknown or [query])[0][:20]!r}); it takes in_flight=N ({what})"
        )
    values = given.get("in_flight")
    if not values:
        return S3_IN_FLIGHT
    text = values[-1].strip()
    # a digit string is checked before int() reads it: past 4300 digits int() raises ValueError
    digits = text.isascii() and text.isdigit() and len(text) <= 5
    if len(values) > 1 or not digits or not 1 <= int(text) <= S3_IN_FLIGHT_MAX:
        raise ConfigInvalid(
            f"in_flight={values[-1][:20]!r} in the bank store URL is not a count of S3 calls ({what})",
            remedy=f"set in_flight to {what} (default {S3_IN_FLIGHT}), once",
        )
    return int(text)


def _s3_store(bucket: str, prefix: str, url: str, in_flight: int = S3_IN_FLIGHT) -> BankStore:
    require_extra("boto3")
    from .s3_bank import S3BankStore

    try:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        return S3BankStore(bucket, prefix, endpoint_url=endpoint, in_flight=in_flight)
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


#: A resume's remedy for a sandbox it cannot restore into (not the teardown's).
RESUME_SANDBOX_REMEDY = "start the sandbox (or name one that runs) and resume again; nothing was written"


def engine_url(*, podman: bool, env: Mapping[str, str] | None = None) -> str | None:
    """The engine socket a ``docker:``/``podman:`` spec talks to. Podman's must be named
    (SCRATCHBANK_PODMAN_URL or CONTAINER_HOST): with none, Docker's default socket would
    answer for a container of the same name in the other engine."""
    env = os.environ if env is None else env
    if not podman:
        return env.get("SCRATCHBANK_DOCKER_URL") or None
    url = env.get("SCRATCHBANK_PODMAN_URL") or env.get("CONTAINER_HOST") or None
    if url is None:
        raise ConfigInvalid(
            "podman: sandboxes need the Podman socket: set SCRATCHBANK_PODMAN_URL (or CONTAINER_HOST),"
            " e.g. unix:///run/podman/podman.sock",
            remedy="set SCRATCHBANK_PODMAN_URL to Podman's API socket (podman system service)",
        )
    return url


def _docker(container: str, scratch: str, *, podman: bool) -> Sandbox:
    require_extra("docker")
    import docker

    from .docker_sandbox import DockerSandbox, engine_client

    url = engine_url(podman=podman)
    engine = "Podman" if podman else "Docker"
    var = "SCRATCHBANK_PODMAN_URL" if podman else "SCRATCHBANK_DOCKER_URL"
    try:
        client: Any = engine_client(url, timeout=60)
        state = client.containers.get(container).attrs.get("State") or {}
    except docker.errors.NotFound:
        raise SandboxGone(f"no {engine} container {container}", remedy=RESUME_SANDBOX_REMEDY) from None
    except docker.errors.DockerException as error:
        raise ExecFailed(
            f"cannot reach the {engine} engine at {redact(url or 'its default socket')}: {cut(str(error))}",
            remedy=f"start the {engine} engine, or point {var} at its socket",
        ) from None
    if not state.get("Running", False):
        status = state.get("Status") or "not running"
        raise SandboxGone(f"{engine} container {container} is {status}", remedy=RESUME_SANDBOX_REMEDY)
    try:
        return DockerSandbox(container, scratch=scratch, podman=podman, client=client)
    except SandboxGone as error:
        raise SandboxGone(error.message, remedy=RESUME_SANDBOX_REMEDY) from None


def cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _kubernetes(namespace: str, pod: str, scratch: str) -> Sandbox:
    require_extra("kubernetes")
    from .k8s_sandbox import KubernetesSandbox, kubernetes_client

    return KubernetesSandbox(pod, namespace=namespace, scratch=scratch, api_client=kubernetes_client())


def snapshots_of(timeline: Timeline) -> SnapshotStore | None:
    """The event store keeps snapshots beside the timeline; other timelines have none."""
    from .event_store import EventStoreTimeline

    return timeline if isinstance(timeline, EventStoreTimeline) else None


def parse_port(value: str) -> int:
    """A TCP port 1-65535 (0 lets the system pick), or ConfigInvalid."""
    if not value.isdigit() or int(value) > 65535:
        raise ConfigInvalid(f"port {value[:20]!r} is not a TCP port (0-65535)")
    return int(value)
