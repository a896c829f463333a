"""How a request gets to its origin: straight, or through an HTTP proxy, and with which TLS settings.

The HTTP client asks a `RouteSource` (an endpoint's reach settings, `tokwatch.settings.reach`) for the route
of every
request's origin; connections are pooled per origin and route, so two routes never share a connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ProxyHop:
    """An HTTP proxy: HTTPS origins through a CONNECT tunnel, plain HTTP ones by absolute-form requests."""

    host: str
    port: int
    # The Proxy-Authorization value ("Basic ..."), a secret: never in a repr, a log line or an error.
    authorization: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """The proxy as logs and errors may name it (no credentials)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Route:
    """The way to one origin: `proxy` (None: straight), the TLS context for HTTPS (None: the client's own,
    the system trust store) and the name the server's certificate must carry (None: the URL's host)."""

    proxy: ProxyHop | None = None
    ssl_context: ssl.SSLContext | None = None
    server_name: str | None = None


DIRECT = Route()


class RouteSource(Protocol):
    """Where the routes of an endpoint's requests come from (`tokwatch.settings.reach.Reach`); `secrets` are
    the
    credentials its routes carry, for redactors."""

    secrets: tuple[str, ...]

    def route(self, scheme: str, host: str, port: int) -> Route:
        """The route to scheme://host:port now (a rotated client certificate gives a new TLS context)."""
        ...
