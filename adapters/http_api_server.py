"""The HTTP API's server: its socket, bound first so that a bad address or a port in use is
named, and uvicorn serving the API's routes on it (``scratchbank serve``); the MCP server
binds its socket here too.
"""

from __future__ import annotations

import socket

from scratchbank.application.service import ScratchService
from scratchbank.domain import errors

from .http_api import create_app
from .http_api_settings import ApiSettings


def serve(service: ScratchService, api: ApiSettings) -> None:  # pragma: no cover - CLI entry
    import sys

    import uvicorn

    sock = listen(api)
    print(
        f"scratchbank API on http://{api.bind}:{sock.getsockname()[1]}; writes need the bearer token",
        file=sys.stderr,
    )
    if api.generated:
        print(f"generated token (this run only): {api.token}", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(create_app(service, api), log_level="warning"))
    server.run(sockets=[sock])


def listen(api: ApiSettings) -> socket.socket:
    """The server's socket, bound here so that a bad address or a port in use is named."""
    family = socket.AF_INET6 if ":" in api.bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((api.bind.strip("[]"), api.port))
    except OSError as error:
        sock.close()
        raise errors.ConfigInvalid(
            f"cannot listen on {api.bind}:{api.port}: {error.strerror or error}"
        ) from None
    return sock
