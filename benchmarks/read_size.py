"""What one socket read costs by the size of the buffer it asks for: asyncio's transports read with
`recv(256 KiB)`, tokwatch's kernel-stamped transport (`tokwatch.transport.kernel_stamps`) with `recvmsg(64
KiB,
ancillary)`.

A 300-byte message (one SSE chunk) is sent on a local socket pair and read back, `--reads` times per way;
printed: µs per send + read, and the ratio to the first row (the baseline, asyncio's way).

    python benchmarks/read_size.py [--reads 200000] [--size 300]
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable

ANC = socket.CMSG_SPACE(16)


def per_read_us(b: socket.socket, msg: bytes, reads: int, read: Callable[[], object]) -> float:
    """µs per send + read, median of three passes."""
    passes = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reads):
            b.send(msg)
            read()
        passes.append((time.perf_counter() - t) / reads * 1e6)
    return sorted(passes)[1]


def main() -> None:
    """Time each way of reading and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=300)
    args = ap.parse_args()
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        msg = b"x" * args.size
        buf = bytearray(64 * 1024)
        view = memoryview(buf)

        def into() -> bytes:
            n, _, _, _ = a.recvmsg_into([buf], ANC)
            return bytes(view[:n])

        ways: list[tuple[str, Callable[[], object]]] = [
            ("recv(256 KiB) (asyncio's transports)", lambda: a.recv(256 * 1024)),
            ("recvmsg(256 KiB, ancillary)", lambda: a.recvmsg(256 * 1024, ANC)),
            (
                "recvmsg(64 KiB, ancillary) (tokwatch.transport.kernel_stamps)",
                lambda: a.recvmsg(64 * 1024, ANC),
            ),
            ("recv(64 KiB)", lambda: a.recv(64 * 1024)),
            ("recvmsg_into(64 KiB buffer) + copy", into),
        ]
        rows = [(name, per_read_us(b, msg, args.reads, read)) for name, read in ways]
    base = rows[0][1]
    print(f"{args.reads} reads of {args.size} bytes per way (send + read, median of 3 passes)")
    print("| read | µs per send + read | x baseline |")
    print("|---|---:|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} | {us / base:.2f} |")


if __name__ == "__main__":
    main()
