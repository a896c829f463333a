"""Opening one HTTP connection and timing its phases: name lookup, TCP connect (happy eyeballs), TLS.

The phases are measured where they happen (docs/methodology.md, "Network phases"): the lookup around
`getaddrinfo` (skipped for an address), the connect from the first socket's creation to the winner's
connection, one round trip as the winner's own connect, the TLS handshake from TCP up to the protocol's
`connection_made` (which asyncio and uvloop call once the handshake completed).
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

from tokwatch.transport.kernel_stamps import KernelStampedTransport

HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended connection attempt delay
_MADE_WAIT_TURNS = 100


@dataclass(frozen=True, slots=True)
class ConnectionSetup:
    """How one connection was opened, in seconds per phase (docs/methodology.md, "Network phases").

    `resolve_s`: the DNS lookup (0.0 for an IP address); `connect_s`: TCP connect, every address tried;
    `tls_s`: the TLS handshake (0.0 over plain HTTP); `rtt_s`: the TCP connect of the address that answered
    alone, i.e. one network round trip. `ready_at` is the `perf_counter()` when the connection could carry
    its first request.
    """

    ready_at: float
    resolve_s: float
    connect_s: float
    tls_s: float
    rtt_s: float
    tls: bool


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
) -> tuple[P, ConnectionSetup]:
    """Connect to host:port (over TLS with `ssl_context`) and return the protocol and the phases; plain TCP
    with `kernel_stamps` reads through `KernelStampedTransport` (the kernel's receive time on every read).

    Raises `socket.gaierror` for a failed lookup, `ssl.SSLError` for a failed handshake and `OSError` when
    no address could be connected; the caller's deadline bounds all of it.
    """
    loop = asyncio.get_running_loop()
    begun = time.perf_counter()
    address = _address_info(host, port)
    looked_up = address is None
    infos: list[aiohappyeyeballs.AddrInfoType] = (
        address
        if address is not None
        else list(await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP))
    )
    if not infos:
        raise socket.gaierror(socket.EAI_NONAME, f"no address for {host}")
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
    try:
        if kernel_stamps and ssl_context is None:
            proto = factory()
            stamped = KernelStampedTransport(sock, proto)
            stamped.start()
            transport: asyncio.BaseTransport = stamped
        else:
            transport, proto = await loop.create_connection(
                factory, sock=sock, ssl=ssl_context, server_hostname=host if ssl_context is not None else None
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
        tls_s=max(0.0, ready_at - tcp_at) if tls else 0.0,
        rtt_s=max(0.0, tcp_at - winner_at),
        tls=tls,
    )
