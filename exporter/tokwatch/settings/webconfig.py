"""`--web-config FILE`: TLS and basic auth for the exporter's HTTP server, in the Prometheus exporter-toolkit
format (https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md).

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_ca_file: ca.crt                     # optional: verify client certificates against it
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...                     # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':')
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}

Relative file paths are relative to the web config file, as in exporter-toolkit. Every route is protected,
health checks included (as exporter-toolkit does), so probes of /-/healthy need the credentials too.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from base64 import b64decode
from collections.abc import Awaitable, Callable

import bcrypt
from aiohttp import web
from aiohttp.typedefs import Middleware

from tokwatch.settings.webconfig_file import (
    BcryptHash,
    ClientAuth,
    HTTPServerConfig,
    TLSServerConfig,
    WebConfig,
    bcrypt_cost,
    load_web_config,
    ssl_context,
)

__all__ = [
    "BasicAuth",
    "BcryptHash",
    "ClientAuth",
    "HTTPServerConfig",
    "TLSServerConfig",
    "WebConfig",
    "bcrypt_cost",
    "load_web_config",
    "middleware",
    "ssl_context",
]

_REALM = 'Basic realm="tokwatch", charset="UTF-8"'
_CACHE_MAX = 1024  # remembered credential checks (a scrape every few seconds must not cost a bcrypt)


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes, remembering recent results by a digest."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        # An unknown user is checked against this hash, at the highest cost of the configured ones, so it
        # takes as long as a known user's wrong password: response time does not tell which users exist.
        cost = max((bcrypt_cost(h) for h in users.values()), default=4)
        self._dummy = bcrypt.hashpw(b"tokwatch", bcrypt.gensalt(rounds=cost))
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    @property
    def unknown_user_cost(self) -> int:
        """The bcrypt cost an unknown user's check pays: the highest among the configured users'."""
        return bcrypt_cost(self._dummy)

    @staticmethod
    def _parse(header: str | None) -> tuple[str, str] | None:
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, sep, password = b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return (user, password) if sep else None

    @staticmethod
    def _key(user: str, password: str) -> bytes:
        return hashlib.sha256(f"{user}\0{password}".encode()).digest()

    def known(self, header: str | None) -> bool | None:
        """The remembered answer for these credentials (False for a malformed header), None if not known."""
        creds = self._parse(header)
        if creds is None:
            return False
        with self._lock:
            return self._cache.get(self._key(*creds))

    def check(self, header: str | None) -> bool:
        """True when the header carries a configured user's password (a bcrypt check when not known)."""
        creds = self._parse(header)
        if creds is None:
            return False
        user, password = creds
        key = self._key(user, password)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        hashed = self._users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed or self._dummy) and hashed is not None
        with self._lock:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = ok
        return ok


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(cfg: WebConfig) -> Middleware:
    """aiohttp middleware: basic auth on every route (when users are configured) and the extra headers."""
    auth = BasicAuth(cfg.basic_auth_users) if cfg.basic_auth_users else None
    extra = dict(cfg.http_server_config.headers)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if auth is not None:
            header = request.headers.get("Authorization")
            ok = auth.known(header)
            if ok is None:
                # bcrypt takes ~0.2 s at cost 12: off the loop, so one login does not stall /metrics.
                ok = await asyncio.to_thread(auth.check, header)
            if not ok:
                return web.Response(
                    status=401, text="Unauthorized\n", headers={"WWW-Authenticate": _REALM, **extra}
                )
        response = await handler(request)
        for k, v in extra.items():
            response.headers.setdefault(k, v)
        return response

    return guard
