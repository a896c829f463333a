"""Counts in messages and pages: "1 server", "2 servers" (never "1 servers")."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and the noun, singular for exactly one: counted(1, "server") -> "1 server"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def counted_value(x: float, noun: str, plural: str | None = None) -> str:
    """A count read from a server (a float) and the noun: counted_value(1.0, "request") -> "1 request"."""
    return f"{x:g} {noun if x == 1 else plural or noun + 's'}"
