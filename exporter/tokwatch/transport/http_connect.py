"""Opening one HTTP connection and timing its phases: name lookup, TCP connect (happy eyeballs), the
proxy's tunnel, TLS.

The phases are measured where they happen (docs/methodology.md, "Network phases"): the lookup around
`getaddrinfo` (skipped for an address), the connect from the first socket's creation to the winner's
connection, one round trip as the winner's own connect, through a proxy the CONNECT request's send to its
2xx answer (lookup and connect are then the proxy's), the TLS handshake from TCP (or the tunnel) up to the
protocol's `connection_made` (which asyncio and uvloop call once the handshake completed). Over TLS the
certificates the server sent are kept as DER bytes (parsed later, off the measurement path:
`tokwatch.transport.cert_expiry`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohappyeyeballs

from tokwatch.transport.http_route import ProxyHop
from tokwatch.transport.kernel_stamps import KernelStampedTransport

HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended connection attempt delay
_MADE_WAIT_TURNS = 100
_MAX_PROXY_HEAD = 16 * 1024  # a CONNECT answer's head larger than this is not a proxy's
_ENCODING_DER = 2  # _ssl.ENCODING_DER: what the pre-3.13 chain's certificate objects are asked for


class ProxyError(OSError):
    """The proxy did not open the tunnel (refused, answered something else, or closed)."""


@dataclass(frozen=True, slots=True)
class ConnectionSetup:
    """How one connection was opened, in seconds per phase (docs/methodology.md, "Network phases").

    `resolve_s`: the DNS lookup (0.0 for an IP address); `connect_s`: TCP connect, every address tried;
    `tls_s`: the TLS handshake (0.0 over plain HTTP); `rtt_s`: the TCP connect of the address that answered
    alone, i.e. one network round trip. `ready_at` is the `perf_counter()` when the connection could carry
    its first request. Through a proxy (`proxied`) lookup, connect and round trip are the proxy's and
    `proxy_connect_s` is its tunnel's set-up (0.0 without a tunnel). `peer_chain`: the DER certificates the
    server sent, leaf first (the leaf alone where the Python has no way to the rest; empty without TLS).
    """

    ready_at: float
    resolve_s: float
    connect_s: float
    tls_s: float
    rtt_s: float
    tls: bool
    proxy_connect_s: float = 0.0
    proxied: bool = False
    peer_chain: tuple[bytes, ...] = ()

    @property
    def set_up_s(self) -> float:
        """The whole set-up: lookup, TCP connect, TLS handshake and any proxy tunnel."""
        return self.resolve_s + self.connect_s + self.tls_s + self.proxy_connect_s


class TimedProtocol(asyncio.Protocol):
    """A connection protocol that notes when `connection_made` ran (after any TLS handshake): subclasses
    set `made_at` there."""

    made_at: float | None = None

    def data_received_at(self, data: bytes, stamp: float) -> None:
        """A read with the kernel's receive time (`KernelStampedTransport`); by default the plain callback."""
        self.data_received(data)


P = TypeVar("P", bound=TimedProtocol)


def _address_info(host: str, port: int) -> list[aiohappyeyeballs.AddrInfoType] | None:
    """The one address of `host` when it is an IP address (no lookup, no executor thread), else None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6:
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))]
    return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]


async def open_connection(
    factory: Callable[[], P],
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None,
    kernel_stamps: bool = False,
    proxy: ProxyHop | None = None,
    server_name: str | None = None,
) -> tuple[P, ConnectionSetup]:
    """Connect to host:port (over TLS with `ssl_context`, checking the certificate for `server_name`, else
    `host`) and return the protocol and the phases; plain TCP with `kernel_stamps` reads through
    `KernelStampedTransport` (the kernel's receive time on every read). With `proxy` the TCP connection
    goes to the proxy: over TLS through a CONNECT tunnel to host:port, else as is (the caller sends
    absolute-form requests).

    Raises `socket.gaierror` for a failed lookup, `ProxyError` for a tunnel the proxy did not open,
    `ssl.SSLError` for a failed handshake and `OSError` when no address could be connected; the caller's
    deadline bounds all of it.
    """
    loop = asyncio.get_running_loop()
    begun = time.perf_counter()
    dial_host, dial_port = (proxy.host, proxy.port) if proxy is not None else (host, port)
    address = _address_info(dial_host, dial_port)
    looked_up = address is None
    infos: list[aiohappyeyeballs.AddrInfoType] = (
        address
        if address is not None
        else list(
            await loop.getaddrinfo(dial_host, dial_port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        )
    )
    if not infos:
        raise socket.gaierror(socket.EAI_NONAME, f"no address for {dial_host}")
    created: dict[int, float] = {}

    def stamped_socket(info: aiohappyeyeballs.AddrInfoType) -> socket.socket:
        family, type_, proto, _, _ = info
        sock = socket.socket(family=family, type=type_, proto=proto)
        created[sock.fileno()] = time.perf_counter()
        return sock

    first_try = time.perf_counter()
    sock = await aiohappyeyeballs.start_connection(
        infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, socket_factory=stamped_socket
    )
    tcp_at = time.perf_counter()
    winner_at = created.get(sock.fileno(), first_try)
    first_at = min(created.values(), default=first_try)
    tunnelled = proxy is not None and ssl_context is not None
    try:
        if tunnelled:
            assert proxy is not None
            await _open_tunnel(loop, sock, host, port, proxy)
        tunnel_at = time.perf_counter() if tunnelled else tcp_at
        if kernel_stamps and ssl_context is None:
            proto = factory()
            stamped = KernelStampedTransport(sock, proto)
            stamped.start()
            transport: asyncio.BaseTransport = stamped
        else:
            transport, proto = await loop.create_connection(
                factory,
                sock=sock,
                ssl=ssl_context,
                server_hostname=(server_name or host) if ssl_context is not None else None,
            )
    except BaseException:
        sock.close()
        raise
    for _ in range(_MADE_WAIT_TURNS):  # uvloop calls connection_made one loop turn after returning
        if proto.made_at is not None:
            break
        await asyncio.sleep(0)
    if proto.made_at is None:
        transport.close()
        raise ConnectionError("the connection was never made")
    ready_at = proto.made_at
    tls = ssl_context is not None
    return proto, ConnectionSetup(
        ready_at=ready_at,
        resolve_s=max(0.0, first_at - begun) if looked_up else 0.0,
        connect_s=max(0.0, tcp_at - first_at),
        tls_s=max(0.0, ready_at - tunnel_at) if tls else 0.0,
        rtt_s=max(0.0, tcp_at - winner_at),
        tls=tls,
        proxy_connect_s=max(0.0, tunnel_at - tcp_at),
        proxied=proxy is not None,
        peer_chain=_peer_chain(transport.get_extra_info("ssl_object")) if tls else (),
    )


async def _open_tunnel(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, host: str, port: int, proxy: ProxyHop
) -> None:
    """Ask the proxy for a tunnel to host:port on the connected `sock` (RFC 9110 CONNECT); returns once it
    answered 2xx, raises ProxyError otherwise."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > _MAX_PROXY_HEAD:
            raise ProxyError(f"proxy {proxy.shown}: CONNECT answer larger than {_MAX_PROXY_HEAD} bytes")
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise ProxyError(f"proxy {proxy.shown} closed the connection before answering CONNECT")
        head += data
    # Nothing may follow the answer: the server speaks only after our TLS ClientHello.
    if not head.endswith(b"\r\n\r\n"):
        raise ProxyError(f"proxy {proxy.shown} sent bytes after its CONNECT answer")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProxyError(f"proxy {proxy.shown} answered CONNECT with {status_line[:80]!r}")
    if not 200 <= int(parts[1]) < 300:
        reason = parts[2] if len(parts) > 2 else ""
        raise ProxyError(f"proxy {proxy.shown} refused the tunnel to {authority}: HTTP {parts[1]} {reason}")


def _peer_chain(ssl_object: ssl.SSLObject | None) -> tuple[bytes, ...]:
    """The DER certificates the server sent, leaf first: Python 3.13's `get_unverified_chain`, on 3.10-3.12
    the same method of the C object beneath `SSLObject` (made public in 3.13), else the leaf alone. A few
    microseconds of copying at set-up; nothing is parsed here (`tokwatch.transport.cert_expiry` does, after
    the run)."""
    if ssl_object is None:
        return ()
    get = getattr(ssl_object, "get_unverified_chain", None)
    if get is None:
        get = getattr(getattr(ssl_object, "_sslobj", None), "get_unverified_chain", None)
    if get is not None:
        try:
            chain = get() or []
            return tuple(c if isinstance(c, bytes) else c.public_bytes(_ENCODING_DER) for c in chain)
        except (AttributeError, ValueError, ssl.SSLError):
            pass
    leaf = ssl_object.getpeercert(binary_form=True)
    return (leaf,) if leaf else ()
