"""Banks in any S3-compatible store: ``<prefix>/sessions/<run>/banks/<sha256>.tgz`` (A17).

Objects are content-named and created once: one PutObject with ``If-None-Match: *``
(412 PreconditionFailed on an existing key: the same name is the same content, the put
succeeds; ADR 0006). The object's stamp (run, execution, bytes, sha256, manifest digest,
time) rides as its metadata, written in the same request. The legacy fixed key
``sessions/<run>/scratch.tgz`` (T3) is still read for records that name no object.
Reads stream to the caller's file, recompute the digest and compare. Only S3's
``NoSuchKey`` means the bank is gone: a bare 404, a missing bucket, a 5xx or a network
error means "read again" (X4 vs X5).

Deadlines: a fetch arms a watchdog that shuts the body's socket down at its deadline
(a server or proxy that stops sending mid-object fails the read at once, as
BankReadFailed); a put runs in a thread the caller waits on until its deadline
(BankWriteFailed); a put that lands after it only leaves an object no record names,
never a replaced one (create-only). botocore's own ``read_timeout`` bounds each request
the watchdog cannot reach (headers that never come).
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote

import attrs
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from scratchbank.application.cancellation import Deadline, deadline_of
from scratchbank.application.ports import Placed, StoredBank
from scratchbank.application.streams import CHUNK, TooLarge, copy_hashed
from scratchbank.domain.errors import (
    BankGone,
    BankReadFailed,
    BankWriteFailed,
    HostileArchive,
    InvalidBankObject,
)
from scratchbank.domain.objects import (
    BankStamp,
    Listing,
    StoredObject,
    check_object_name,
    object_name,
    stamp_fields,
    stamp_of,
)
from scratchbank.domain.runs import check_run_id

from .watchdog import Watchdog

DIGEST_KEY = "sha256"
#: The legacy fixed key (T3), read for records that name no object.
LEGACY_NAME = "scratch.tgz"
#: What S3 answers a create-only put whose key exists (AWS, MinIO, moto: 412).
EXISTS = ("PreconditionFailed", "412")
#: the key (beside the store's sessions/) that tells whether the store honours If-None-Match
PROBE_NAME = ".scratchbank-if-none-match"
#: A call given no deadline ends by this many seconds.
CALL_SECONDS = 600.0
#: botocore's per-request read timeout (headers that never come, a body that stalls).
READ_TIMEOUT = 20.0
#: S3 calls one store expects at once (``in_flight``): its client keeps this many connections.
#: botocore's default pool of 10 never blocks a call past it, but each call past the tenth
#: opens a connection and drops it after (a TCP connect and a server thread per call; at 50
#: teardowns at once, 4 of 5 calls): issue 26.
IN_FLIGHT = 64


def s3_client(endpoint_url: str | None = None, *, in_flight: int = IN_FLIGHT, **session: Any) -> Any:
    """An S3 client for ``in_flight`` calls at once (its pool keeps that many connections),
    with the store's retries and timeouts; ``session``: boto3 client arguments (region, keys)."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be a whole number >= 1, not {in_flight!r}")
    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=5,
        read_timeout=READ_TIMEOUT,
        max_pool_connections=in_flight,
    )
    client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config, **session)
    # botocore reads its paginator models at a client's first ``get_paginator`` (every listing
    # of a store): 200 first listings at once each read and parsed them, ~13 ms apiece with
    # the GIL held (issue 26). Read once here, before any call can race it.
    client.can_paginate("list_objects_v2")
    return client


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3BankStore:
    """Banks in an S3 bucket (a BankStore): ``<prefix>/sessions/<run>/banks/<sha256>.tgz``.

    Works against any S3 endpoint (AWS, MinIO, moto's server; ``endpoint_url`` or
    AWS_ENDPOINT_URL) with boto3's usual credentials. Puts are create-only (If-None-Match);
    the stamp and the archive's SHA-256 ride as object metadata; ``fetch`` recomputes and
    compares it, ``stat`` reads it with the size from a one-byte ranged GET (so NoSuchKey
    and NoSuchBucket stay apart). Only NoSuchKey means the bank is gone; anything else is
    BankReadFailed (read again).
    """

    keeps_banks = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or s3_client(endpoint_url, in_flight=in_flight)
        #: does the store honour If-None-Match (None: not known yet; ``_honours``)
        self.honours_if_none_match: bool | None = None

    def folder(self, run_id: str) -> str:
        """The run's own prefix, with its trailing slash."""
        folder = f"sessions/{check_run_id(run_id)}/"
        return f"{self.prefix}/{folder}" if self.prefix else folder

    def key(self, run_id: str, name: str | None = None) -> str:
        """The key of the named object (None: the legacy ``scratch.tgz``)."""
        return self.folder(run_id) + (LEGACY_NAME if name is None else check_object_name(name))

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        name = object_name(sha256)
        key = self.key(run_id, name)
        where = f"s3://{self.bucket}/{key}"
        deadline = deadline_of(deadline, CALL_SECONDS)
        _check_digest(archive, sha256, where)
        fields = {**(stamp_fields(stamp) if stamp is not None else {}), DIGEST_KEY: sha256}
        metadata = {k: quote(v, safe="") for k, v in fields.items()}
        done: dict[str, BaseException | None] = {}
        created: list[bool] = []

        def create() -> None:
            try:
                with open(archive, "rb") as body:
                    self.client.put_object(
                        Bucket=self.bucket, Key=key, Body=body, Metadata=metadata, IfNoneMatch="*"
                    )
                created.append(self._honours())
                done["error"] = None
            except BaseException as error:  # handed to the caller's thread
                done["error"] = error

        worker = threading.Thread(target=create, name=f"s3-put-{run_id}", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline.left()))
        if "error" not in done:
            raise BankWriteFailed(
                f"{where}: the upload did not end within its deadline (it may land later, unnamed)"
            )
        error = done["error"]
        if error is None:  # a 200 is this request's create where the store honours If-None-Match
            return Placed(name, created=created == [True])
        if isinstance(error, ClientError) and _code(error) in EXISTS:
            self._same_content(run_id, name, sha256, where)
            return Placed(name, created=False)
        if isinstance(error, BotoCoreError | ClientError | OSError):
            raise BankWriteFailed(f"{where}: {error}") from error
        raise BankWriteFailed(f"{where}: {error}") from error

    def _honours(self) -> bool:
        """Whether the store honours If-None-Match (some S3-compatibles ignore it: 200 to
        every put, found by attack), asked once a store by putting an empty probe object
        twice: only an honouring store answers 412. Not known: False, so no put says it
        created its object and the teardown looks after its record (A17); a refusal (a
        policy that allows no put beside sessions/) is kept, a network error asked again."""
        if self.honours_if_none_match is None:
            key = f"{self.prefix}/{PROBE_NAME}" if self.prefix else PROBE_NAME
            try:
                for _ in range(2):
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=b"", IfNoneMatch="*")
                self.honours_if_none_match = False
            except ClientError as error:
                self.honours_if_none_match = _code(error) in EXISTS
            except (BotoCoreError, OSError):
                return False
        return self.honours_if_none_match

    def _same_content(self, run_id: str, name: str, sha256: str, where: str) -> None:
        """An existing object of this name: the same content unless its own stamp says not."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(run_id, name))
        except (BotoCoreError, ClientError) as error:
            raise BankWriteFailed(f"{where}: exists, and could not be read back: {error}") from error
        kept = unquote(str(head.get("Metadata", {}).get(DIGEST_KEY, sha256)))
        if kept != sha256:
            raise BankWriteFailed(f"{where}: exists with another digest ({kept}); not replaced")

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        key = self.key(run_id, name)
        where = f"s3://{self.bucket}/{key}"
        deadline = deadline_of(deadline, CALL_SECONDS)
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if _code(error) == "NoSuchKey":
                raise BankGone(f"no bank at {where}") from None
            raise BankReadFailed(f"{where}: {error}") from error
        except BotoCoreError as error:
            raise BankReadFailed(f"{where}: {error}") from error
        body = got["Body"]
        with Watchdog(deadline, lambda: _shut(body)) as dog:
            try:
                size, digest = copy_hashed(body.read, dest.write, limit=max_bytes)
            except TooLarge:
                raise HostileArchive(f"{where} is over {max_bytes} bytes") from None
            except (BotoCoreError, ClientError, OSError, ValueError) as error:
                cut = " (cut at its deadline)" if dog.fired else ""
                raise BankReadFailed(f"{where}: stream broke{cut}: {error}") from error
            finally:
                body.close()
        if dog.fired:
            raise BankReadFailed(f"{where}: the read did not end within its deadline: cut")
        kept = got.get("Metadata", {}).get(DIGEST_KEY)
        if kept is not None and unquote(kept) != digest:
            raise BankReadFailed(f"{where}: checksum mismatch (stored {kept}, read {digest})")
        return StoredBank(size, digest)

    def delete(self, run_id: str, name: str | None = None) -> None:
        """One object (its stamp is its metadata). A put writes no temporary object."""
        key = self.key(run_id, name)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as error:
            raise BankWriteFailed(f"deleting {key}: {error}") from error

    def sweep(self, run_id: str) -> None:
        folder = self.folder(run_id)
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
            for page in pages:
                for obj in page.get("Contents", []):
                    self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
        except (BotoCoreError, ClientError) as error:
            raise BankWriteFailed(f"sweeping {folder}: {error}") from error

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        """Size and SHA-256 of the named object; None on NoSuchKey (nothing else)."""
        key = self.key(run_id, name)
        where = f"s3://{self.bucket}/{key}"
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=key, Range="bytes=0-0")
            got["Body"].close()
        except ClientError as error:
            if _code(error) == "NoSuchKey":
                return None
            raise BankReadFailed(f"{where}: {error}") from error
        except BotoCoreError as error:
            raise BankReadFailed(f"{where}: {error}") from error
        size = int(str(got.get("ContentRange", "/0")).rsplit("/", 1)[-1])
        kept = got.get("Metadata", {}).get(DIGEST_KEY)
        if kept is None:
            with open("/dev/null", "wb") as sink:
                return self.fetch(run_id, sink, max_bytes=size, name=name)
        return StoredBank(size, unquote(str(kept)))

    def objects(self, run_id: str, *, named: Collection[str | None] = ()) -> Sequence[StoredObject]:
        """The run's objects with their stamps: one listing, and one HEAD per bank object
        not in ``named`` (a name the caller's records give: its stamp is never read, and
        the listing says its size; issue 26). Times are the store's, from the listing
        itself (no extra round trip): each object's ``LastModified``, and ``now`` the
        ``Date`` of the first page's response (``_date``: the earliest, so no age is
        overstated; None when the server sent none)."""
        folder = self.folder(run_id)
        found: list[StoredObject] = []
        now: datetime | None = None
        first = True
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
            for page in pages:
                if first:
                    now, first = _date(page), False
                for obj in page.get("Contents", []):
                    rest, size = str(obj["Key"])[len(folder) :], int(obj.get("Size", 0))
                    listed = self._listed(run_id, rest, size, stamped=rest not in named)
                    if listed is not None:
                        found.append(
                            attrs.evolve(listed, stored_at=_modified(obj)) if listed.name else listed
                        )
        except (BotoCoreError, ClientError) as error:
            raise BankReadFailed(f"listing s3://{self.bucket}/{folder}: {error}") from error
        except ValueError as error:  # a page botocore cannot parse (a garbled LastModified)
            raise BankReadFailed(f"listing s3://{self.bucket}/{folder}: unreadable page: {error}") from error
        return Listing(found, now)

    def _listed(self, run_id: str, rest: str, size: int, *, stamped: bool = True) -> StoredObject | None:
        if rest == LEGACY_NAME:
            return StoredObject(None, size)
        try:
            name = check_object_name(rest)
        except InvalidBankObject:
            return None  # not a bank object: never listed, never deleted by housekeeping
        if not stamped:
            return StoredObject(name, size)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(run_id, name))
        except ClientError as error:
            if _code(error) in ("NoSuchKey", "404"):
                return None  # deleted since the listing
            raise
        fields = {str(k): unquote(str(v)) for k, v in head.get("Metadata", {}).items()}
        return StoredObject(name, size, stamp_of(fields))


def _modified(obj: dict[str, Any]) -> datetime | None:
    """An object's ``LastModified`` as the listing gave it (the store's clock; aware UTC)."""
    at = obj.get("LastModified")
    if not isinstance(at, datetime):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _date(page: dict[str, Any]) -> datetime | None:
    """The ``Date`` header of a listing's response: the store's time as it answered (RFC
    7231 requires it of a server with a clock, in GMT); None when absent or unreadable:
    a year past any calendar (OverflowError), or a zone it does not name as GMT or an
    offset (``CET``, none, ``-0000``: read as UTC, a local time ahead of it would age a
    young put; found by attack)."""
    headers = page.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    raw = headers.get("date") if isinstance(headers, dict) else None
    if not isinstance(raw, str):
        return None
    try:
        at = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return at if at.tzinfo is not None else None


def _check_digest(archive: Path, sha256: str, where: str) -> None:
    """A content-named object holds the content its name says: the file is hashed first."""
    digest = hashlib.sha256()
    try:
        with open(archive, "rb") as src:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
    except OSError as error:
        raise BankWriteFailed(f"{where}: {error}") from error
    if digest.hexdigest() != sha256:
        raise BankWriteFailed(f"{where}: {archive} is not the archive its name says (it changed on the host)")


def _shut(body: Any) -> None:
    """Shut the socket under a streaming body down, so a blocked read returns at once
    (closing it from another thread would not wake the read)."""
    sock = _socket_of(body)
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)
    else:
        body.close()


def _socket_of(body: Any) -> socket.socket | None:
    """The socket a botocore StreamingBody reads from (urllib3 2: the response's file)."""
    raw = getattr(body, "_raw_stream", None)
    reader = getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None)
    sock = getattr(reader, "_sock", None)
    if isinstance(sock, socket.socket):
        return sock
    conn = getattr(getattr(raw, "_connection", None), "sock", None)
    return conn if isinstance(conn, socket.socket) else None
