"""The HTTP API's settings (``ApiSettings``): what its operator lets callers do, from flags
and the environment (the token, the sandbox allow-list, the served Host names, the body limit,
the bind). Never set by a request body; an open bind without a token is refused here.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

import attrs

from scratchbank.domain import errors

from . import config


@attrs.frozen
class ApiSettings:
    """What the server lets callers do: set by its operator, never by a request body."""

    token: str
    sandboxes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    max_body: int = 64 << 10
    scratch: str = config.DEFAULT_SCRATCH
    bind: str = "127.0.0.1"
    port: int = 8080
    generated: bool = False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _token(token_file: str | None, env: Mapping[str, str]) -> str | None:
    path = token_file or env.get("SCRATCHBANK_API_TOKEN_FILE")
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise errors.ConfigInvalid(f"cannot read the token file {path}: {error}") from None
        if len(token) < 16:
            raise errors.ConfigInvalid(f"the token in {path} is shorter than 16 characters")
        return token
    return env.get("SCRATCHBANK_API_TOKEN") or None


def api_settings(
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    token_file: str | None = None,
    sandboxes: list[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ApiSettings:
    """The server's settings from flags and environment; refuses an open bind without a token."""
    env = os.environ if env is None else env
    token = _token(token_file, env)
    if token is None and not _loopback(host):
        raise errors.ConfigInvalid(
            f"refusing to serve on {host} without a token (SCRATCHBANK_API_TOKEN[_FILE])"
        )
    return ApiSettings(
        token or secrets.token_urlsafe(24),
        tuple(sandboxes or _listed(env, "SCRATCHBANK_API_SANDBOXES")),
        ("127.0.0.1", "localhost", "[::1]", host, *_listed(env, "SCRATCHBANK_API_HOSTS")),
        scratch=env.get("SCRATCHBANK_SCRATCH") or config.DEFAULT_SCRATCH,
        bind=host,
        port=port,
        generated=token is None,
    )


def _listed(env: Mapping[str, str], var: str) -> list[str]:
    return [item.strip() for item in env.get(var, "").split(",") if item.strip()]
