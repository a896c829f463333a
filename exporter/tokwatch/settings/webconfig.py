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
import os
import ssl
import threading
from base64 import b64decode
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Literal

import bcrypt
from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import AfterValidator, Field

from tokwatch.settings.strict_yaml import ConfigError, StrictModel, read_config_file, validate_yaml

ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
_REALM = 'Basic realm="tokwatch", charset="UTF-8"'
_CACHE_MAX = 1024  # remembered credential checks (a scrape every few seconds must not cost a bcrypt)


class TLSServerConfig(StrictModel):
    """exporter-toolkit's `tls_server_config` (the settings tokwatch supports)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    min_version: Literal["TLS12", "TLS13"] = "TLS12"


class HTTPServerConfig(StrictModel):
    """exporter-toolkit's `http_server_config`: extra response headers."""

    headers: dict[str, str] = Field(default_factory=dict)


def _bcrypt_hash(value: str) -> str:
    if not value.startswith(("$2a$", "$2b$", "$2y$")) or len(value) != 60:
        raise ValueError("the password must be a bcrypt hash ($2b$..., 60 characters), not the password")
    cost = value[4:6]
    if value[6] != "$" or not cost.isdigit() or not 4 <= int(cost) <= 31:
        raise ValueError(f"the bcrypt hash has no valid cost (04-31) after {value[:4]}")
    return value


def bcrypt_cost(hashed: str | bytes) -> int:
    """The cost (log2 rounds) of a validated bcrypt hash: `$2b$12$...` -> 12."""
    return int(hashed[4:6])


BcryptHash = Annotated[str, AfterValidator(_bcrypt_hash)]


class WebConfig(StrictModel):
    """The whole web config file."""

    tls_server_config: TLSServerConfig | None = None
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)


def load_web_config(path: str | os.PathLike[str]) -> tuple[WebConfig, Path]:
    """Read and validate a web config file; returns it and its directory (base of relative paths)."""
    text, name = read_config_file(path)
    cfg = validate_yaml(text, name, WebConfig)
    base = Path(path).resolve().parent
    tls = cfg.tls_server_config
    if tls is not None:
        files = [("cert_file", tls.cert_file), ("key_file", tls.key_file)]
        if tls.client_ca_file:
            files.append(("client_ca_file", tls.client_ca_file))
        for field, value in files:
            if not (base / value).is_file():
                raise ConfigError(f"{name}: tls_server_config.{field}: no such file: {value}")
        if tls.client_auth_type != "NoClientCert" and not tls.client_ca_file:
            needs_ca = tls.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
            if needs_ca:
                raise ConfigError(
                    f"{name}: tls_server_config.client_auth_type: {tls.client_auth_type} needs client_ca_file"
                )
        ssl_context(cfg, base, name)  # the certificate and key must load now, not at the first connection
    return cfg, base


def ssl_context(cfg: WebConfig, base: Path, name: str = "web config") -> ssl.SSLContext | None:
    """The server TLS context, or None without `tls_server_config`; ConfigError when files do not load."""
    tls = cfg.tls_server_config
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(base / tls.cert_file, base / tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{name}: tls_server_config: cannot load cert_file/key_file: {exc}") from None
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=str(base / tls.client_ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{name}: tls_server_config.client_ca_file: cannot load: {exc}") from None
    # Python's ssl cannot request a certificate without verifying it, so "any"/"request" verify when given.
    ctx.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "RequestClientCert": ssl.CERT_OPTIONAL,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAnyClientCert": ssl.CERT_REQUIRED,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[tls.client_auth_type]
    return ctx


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
