"""How tokwatch reaches an endpoint: its TLS settings (`tls_config`) and its proxy (`proxy_url`,
`proxy_password_file`, `proxy_from_environment`, `no_proxy`), with blackbox_exporter's names and meanings
(docs/configuration.md, "Reaching endpoints").

The settings are validated where they are written (a file that cannot be read or a key that does not match
its certificate is a `file:line: field` config error); `probe:` holds the defaults every endpoint takes
unless it sets its own (`inherit_reach`). At run time a `Reach` gives the HTTP client the route of each
request (`tokwatch.transport.http_route`): the probe, the server-counter scrapes and `tokwatch bench` open
their
connections through the same one. Certificate and key files are followed through rotation.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar, cast
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator, BaseModel, field_validator, model_validator

from tokwatch.settings.file_version import file_version
from tokwatch.settings.redact import Redactor
from tokwatch.settings.strict_yaml import ConfigError, StrictModel
from tokwatch.transport.http_route import DIRECT, ProxyHop, Route
from tokwatch.transport.proxy_env import (
    NoProxyRule,
    bypasses,
    environment_no_proxy,
    environment_proxy,
    parse_no_proxy,
)

log = logging.getLogger("tokwatch")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_ROUTES_KEPT = 64  # routes remembered per endpoint: its base URL's and metrics URL's origins in practice


def _readable(path: str) -> str:
    """`path` when the file can be read, else ValueError naming the file and why (never its content)."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


class TlsConfig(StrictModel):
    """blackbox_exporter's `tls_config`: `ca_file` (PEM CA certificates that replace the system trust store
    for this endpoint), `cert_file`/`key_file` (a client certificate, mutual TLS), `server_name` (the name
    sent as SNI and checked in the server's certificate, instead of the URL's host), `insecure_skip_verify`
    (accept any certificate: never in production), `min_version` (TLS10..TLS13; default Python's, TLS 1.2)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] | None = None

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, v: str | None) -> str | None:
        if v is None:
            return v
        _readable(v)
        try:
            ssl.create_default_context().load_verify_locations(cafile=v)
        except ssl.SSLError as exc:
            raise ValueError(f"{v} holds no usable PEM CA certificate ({exc.reason or exc})") from None
        return v

    @field_validator("cert_file", "key_file")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        return v if v is None else _readable(v)

    @field_validator("server_name")
    @classmethod
    def _server_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(c in v for c in " /:@")):
            raise ValueError(f"{v!r} is not a host name")
        return v

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both or neither")
        try:
            tls_context(self)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"cert_file/key_file: cannot load the client certificate {self.cert_file} with the key "
                f"{self.key_file}: {_ssl_reason(exc)}"
            ) from None
        return self


def _ssl_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the key does not match the certificate"
    if reason == "PEM lib":
        return "not a PEM certificate and key"
    return str(reason or getattr(exc, "strerror", None) or exc)


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """A client context for `tls` (files read now); raises ssl.SSLError or OSError when they do not load.

    Without `ca_file` the system trust store is used (which `SSL_CERT_FILE`/`SSL_CERT_DIR` replace
    process-wide); with it only its CAs are trusted, as blackbox_exporter does."""
    if tls.ca_file is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=tls.ca_file)
    else:
        ctx = ssl.create_default_context()
    if tls.cert_file is not None and tls.key_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.min_version is not None:
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    return ctx


def _check_proxy_url(v: str) -> str:
    parts = urlsplit(v)
    scheme = parts.scheme.lower()
    if scheme == "https":
        raise ValueError(
            "https:// proxies are not supported: give the proxy's http:// address (the tunnel to an "
            "HTTPS endpoint stays TLS from tokwatch to the endpoint)"
        )
    if scheme != "http":
        raise ValueError(f"{parts.scheme or 'no'} scheme: a proxy_url is http://[user[:password]@]host:port")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise ValueError("invalid port") from None
    if not parts.hostname:
        raise ValueError("no host: a proxy_url is http://[user[:password]@]host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("a proxy_url has no path or query: http://[user[:password]@]host:port")
    return v


def _check_no_proxy(v: str) -> str:
    parse_no_proxy(v)
    return v


# blackbox_exporter's proxy settings, as field types (their checks travel with them).
ProxyUrl = Annotated[str, AfterValidator(_check_proxy_url)]
NoProxy = Annotated[str, AfterValidator(_check_no_proxy)]
ProxyPasswordFile = Annotated[str, AfterValidator(_readable)]

PROXY_FIELDS = ("proxy_url", "proxy_password_file", "proxy_from_environment")


class ReachFields(Protocol):
    """The reach settings a settings model carries (an endpoint, or `probe:` for the defaults)."""

    tls_config: TlsConfig | None
    proxy_url: str | None
    proxy_password_file: str | None
    proxy_from_environment: bool | None
    no_proxy: str | None


def check_proxy_fields(settings: ReachFields) -> None:
    """The proxy settings that cannot go together; raises ValueError naming them."""
    if settings.proxy_url is not None and settings.proxy_from_environment:
        raise ValueError("set proxy_url or proxy_from_environment: true, not both")
    if settings.proxy_password_file is not None:
        if settings.proxy_url is None:
            raise ValueError("proxy_password_file needs proxy_url with the user name: http://USER@host:port")
        parts = urlsplit(settings.proxy_url)
        if not parts.username:
            raise ValueError("proxy_password_file needs the user name in proxy_url: http://USER@host:port")
        if parts.password is not None:
            raise ValueError("proxy_url carries a password already: drop it or proxy_password_file")


M = TypeVar("M", bound=BaseModel)


def inherit_reach(defaults: ReachFields, endpoint: M) -> M:
    """`endpoint` with the reach settings of `defaults` it does not set itself: `tls_config` whole, the
    proxy (`proxy_url`, `proxy_password_file`, `proxy_from_environment`) whole, `no_proxy` alone."""
    own = cast(ReachFields, endpoint)
    update: dict[str, Any] = {}
    if own.tls_config is None and defaults.tls_config is not None:
        update["tls_config"] = defaults.tls_config
    if all(getattr(own, name) is None for name in PROXY_FIELDS):
        update.update({name: getattr(defaults, name) for name in PROXY_FIELDS if getattr(defaults, name)})
    if own.no_proxy is None and defaults.no_proxy is not None:
        update["no_proxy"] = defaults.no_proxy
    return endpoint.model_copy(update=update) if update else endpoint


def _authorization(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def _read_password(name: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"endpoint {name}: cannot read proxy_password_file {path}: {why}") from None


def _hop(name: str, url: str, password_file: str | None = None) -> tuple[ProxyHop, tuple[str, ...]]:
    """The proxy of an http:// URL and its secrets (password, Proxy-Authorization value)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if password_file is not None:
        password = _read_password(name, password_file)
    authorization = _authorization(user or "", password or "") if user or password else None
    secrets = tuple(s for s in (password, authorization, authorization and authorization[6:]) if s)
    return ProxyHop(parts.hostname, parts.port or 80, authorization), secrets


class _TlsFiles:
    """An endpoint's TLS context, rebuilt when one of its files changed (a renewed client certificate is
    used by the next connection, without a restart); while the new files do not load (a rotation half
    done), the last context that did stays in use and one warning says why."""

    def __init__(self, name: str, tls: TlsConfig) -> None:
        self._name = name
        self._tls = tls
        self._paths = tuple(p for p in (tls.ca_file, tls.cert_file, tls.key_file) if p is not None)
        self._seen = self._versions()
        try:
            self.context = tls_context(tls)
        except (ssl.SSLError, OSError) as exc:  # changed since the config was validated
            raise ConfigError(f"endpoint {name}: tls_config: {_ssl_reason(exc)}") from None

    def _versions(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(file_version(p) for p in self._paths)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection (a stat of each file: microseconds, before the request)."""
        if not self._paths:
            return self.context
        versions = self._versions()
        if versions != self._seen:
            self._seen = versions
            try:
                self.context = tls_context(self._tls)
                log.info("endpoint %s: tls_config files changed; new connections use them", self._name)
            except (ssl.SSLError, OSError) as exc:
                log.warning(
                    "endpoint %s: tls_config: the changed files do not load (%s); the previous ones stay "
                    "in use", self._name, _ssl_reason(exc),
                )  # fmt: skip
        return self.context


class Reach:
    """One endpoint's way out (a `tokwatch.transport.http_route.RouteSource`): proxy by origin, TLS context.

    Built at (re)load time from its settings and the environment then in force; raises ConfigError naming
    the problem (an unreadable password file, an environment proxy that is not an http:// URL)."""

    def __init__(self, name: str, settings: ReachFields, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.name = name
        tls = settings.tls_config
        self._server_name = tls.server_name if tls is not None else None
        self._tls = _TlsFiles(name, tls) if tls is not None else None
        self._proxies: dict[str, ProxyHop] = {}  # by scheme of the origin
        secrets: list[str] = []
        no_proxy = settings.no_proxy or ""
        if settings.proxy_url is not None:
            hop, hop_secrets = _hop(name, settings.proxy_url, settings.proxy_password_file)
            self._proxies = {"http": hop, "https": hop}
            secrets += hop_secrets
        elif settings.proxy_from_environment:
            for scheme in ("http", "https"):
                url = environment_proxy(env, scheme)
                if url is None:
                    continue
                try:
                    _check_proxy_url(url)
                except ValueError as exc:
                    shown = Redactor()(url)
                    raise ConfigError(
                        f"endpoint {name}: proxy_from_environment: the {scheme} proxy {shown}: {exc}"
                    ) from None
                hop, hop_secrets = _hop(name, url)
                self._proxies[scheme] = hop
                secrets += hop_secrets
            no_proxy = ",".join(v for v in (environment_no_proxy(env), no_proxy) if v)
        try:
            self._no_proxy: tuple[NoProxyRule, ...] = parse_no_proxy(no_proxy)
        except ValueError as exc:
            raise ConfigError(f"endpoint {name}: NO_PROXY: {exc}") from None
        self.secrets = tuple(secrets)
        self._routes: dict[tuple[str, str, int], ProxyHop | None] = {}

    def proxy_for(self, scheme: str, host: str, port: int) -> ProxyHop | None:
        """The proxy a request to scheme://host:port goes through, None for straight."""
        key = (scheme, host, port)
        if key in self._routes:
            return self._routes[key]
        hop = self._proxies.get(scheme)
        if hop is not None and bypasses(self._no_proxy, host, port):
            hop = None
        if len(self._routes) < _ROUTES_KEPT:
            self._routes[key] = hop
        return hop

    def route(self, scheme: str, host: str, port: int) -> Route:
        """The route to scheme://host:port now."""
        proxy = self.proxy_for(scheme, host, port)
        if scheme != "https" or self._tls is None:
            return Route(proxy) if proxy is not None else DIRECT
        return Route(proxy, self._tls.current(), self._server_name)


def reach_secrets(name: str, settings: ReachFields) -> tuple[str, ...]:
    """The proxy credentials of an endpoint's settings, for the redactor; raises ConfigError when its
    proxy_password_file cannot be read."""
    return Reach(name, settings).secrets


def warn_insecure(endpoints: Mapping[str, ReachFields]) -> None:
    """One warning per endpoint whose certificate is not verified (at start and at every reload)."""
    for name, settings in endpoints.items():
        tls = settings.tls_config
        if tls is not None and tls.insecure_skip_verify:
            log.warning(
                "endpoint %s: tls_config.insecure_skip_verify is true: its server's certificate is not "
                "verified, so anyone on the path can answer in its place", name,
            )  # fmt: skip
