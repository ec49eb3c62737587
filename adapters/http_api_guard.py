"""The HTTP guard (ASGI middleware in front of every route, the API's and the MCP endpoint's):
the Host and Origin checks (421) and the body limit (413), answered before any route runs
with the same ``{error, error_code, remedy}`` body; and the ASGI types it is written in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from scratchbank.domain import errors

from . import config
from .http_api_bodies import error_body, status_of
from .http_api_settings import ApiSettings
from .present import cut

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Guard:
    """ASGI middleware: the Host check (421) and the body limit (413), before any route."""

    def __init__(self, app: ASGIApp, api: ApiSettings) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if _host_name(host) not in self.api.hosts:
            return await send_error(
                send, errors.HostNotAllowed(f"Host {cut(host, 100)!r} is not served here")
            )
        origin = headers.get("origin")
        if origin is not None and _origin_host(origin) not in self.api.hosts:
            why = f"Origin {cut(origin, 100)!r} is not served here (a browser page of another site)"
            return await send_error(send, errors.HostNotAllowed(why))
        declared = headers.get("content-length", "0")
        body = (
            await self._body(receive) if declared.isdigit() and int(declared) <= self.api.max_body else None
        )
        if body is None:
            return await send_error(send, errors.BodyTooLarge(f"the body is over {self.api.max_body} bytes"))
        return await self.app(scope, _replay(body, receive), send)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit (the rest is never kept)."""
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.api.max_body:
                return None
        return body


def _origin_host(origin: str) -> str:
    try:
        parsed = config.urlparse(origin)
    except errors.ConfigInvalid:
        return ""
    host = parsed.hostname or ""
    return f"[{host}]" if ":" in host else host


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


def _replay(body: bytes, then: Receive) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()  # only a disconnect can come now
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def send_error(send: Send, error: errors.ScratchbankError) -> None:
    payload = json.dumps(error_body(error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status_of(error), "headers": headers})
    await send({"type": "http.response.body", "body": payload})
