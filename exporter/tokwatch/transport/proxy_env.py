"""Which proxy the environment names for a URL: HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and NO_PROXY, matched
the way curl and Go's net/http do (docs/configuration.md, "Reaching endpoints"). Pure functions.

NO_PROXY is a comma- or space-separated list; an entry matches a host when it is
- `*`: every host;
- an IP address (`10.1.2.3`, `::1`): that address literally (no name is resolved);
- a CIDR block (`10.0.0.0/8`, `fd00::/8`): an IP address host inside it;
- a name (`example.com`, `.example.com`, `*.example.com`): that host and every host under it;
- any of these with `:port` (`example.com:8443`, `[::1]:8080`): only for that port.
Names compare case-insensitively, a trailing dot ignored. Loopback is not exempt by itself (Go's client
exempts it, curl does not): list `localhost,127.0.0.1,::1` to keep local endpoints off the proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class NoProxyRule:
    """One NO_PROXY entry, parsed: a network (IP or CIDR), or a domain suffix; `port` None for any port."""

    network: IpNetwork | None
    domain: str | None
    port: int | None

    def matches(self, host: str, port: int) -> bool:
        """Whether a request to host:port bypasses the proxy by this entry."""
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            try:
                return ipaddress.ip_address(host) in self.network
            except ValueError:
                return False
        assert self.domain is not None
        name = host.lower().rstrip(".")
        return self.domain == "*" or name == self.domain or name.endswith("." + self.domain)


def parse_no_proxy(value: str) -> tuple[NoProxyRule, ...]:
    """The rules of a NO_PROXY value; raises ValueError naming an entry that cannot be one."""
    rules = []
    for raw in value.replace(" ", ",").split(","):
        entry = raw.strip()
        if entry:
            rules.append(_rule(entry))
    return tuple(rules)


def _rule(entry: str) -> NoProxyRule:
    if entry == "*":
        return NoProxyRule(None, "*", None)
    host, port = _split_port(entry)
    try:
        return NoProxyRule(ipaddress.ip_network(host, strict=False), None, port)
    except ValueError:
        pass
    if "/" in host:
        raise ValueError(f"no_proxy entry {entry!r} is not a valid CIDR block")
    name = host.lower().removeprefix("*").lstrip(".").rstrip(".")
    if not name or any(c in name for c in " *[]@"):
        raise ValueError(f"no_proxy entry {entry!r} is not a host name, address, CIDR block or '*'")
    return NoProxyRule(None, name, port)


def _split_port(entry: str) -> tuple[str, int | None]:
    """(host, port) of `host`, `host:port`, `[v6]:port`, a bare IPv6 address (no port) or a CIDR block."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, _port(entry, rest.removeprefix(":")) if rest else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"no_proxy entry {entry!r} has an invalid port")
    return int(text)


def bypasses(rules: tuple[NoProxyRule, ...], host: str, port: int) -> bool:
    """Whether host:port is exempt from the proxy by any of `rules`."""
    return any(rule.matches(host, port) for rule in rules)


def _env(environ: Mapping[str, str], name: str) -> str | None:
    """The upper-case variable, else the lower-case one (both spellings are in use); empty counts as unset."""
    for key in (name.upper(), name.lower()):
        value = environ.get(key, "").strip()
        if value:
            return value
    return None


def environment_proxy(environ: Mapping[str, str], scheme: str) -> str | None:
    """The proxy URL the environment names for `scheme` ("http" or "https"): HTTPS_PROXY or HTTP_PROXY,
    else ALL_PROXY; a value without a scheme is taken as http:// (as curl and Go do). None: no proxy."""
    value = _env(environ, f"{scheme}_proxy") or _env(environ, "all_proxy")
    if value is None:
        return None
    return value if "://" in value else f"http://{value}"


def environment_no_proxy(environ: Mapping[str, str]) -> str:
    """NO_PROXY (or no_proxy) as set, "" when unset."""
    return _env(environ, "no_proxy") or ""
