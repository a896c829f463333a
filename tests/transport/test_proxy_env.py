"""Which proxy the environment names, and NO_PROXY matching as curl and Go's net/http do it (pure functions;
the real runs through a proxy are in tests/test_reach_proxy.py)."""

from __future__ import annotations

import pytest

from tokwatch.transport.proxy_env import bypasses, environment_no_proxy, environment_proxy, parse_no_proxy


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "bypassed"),
    [
        ("*", "anything.example", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),  # a name covers its subdomains
        ("example.com", "notexample.com", 443, False),  # ... and only them, not a longer name
        (".example.com", "api.example.com", 443, True),
        (".example.com", "example.com", 443, True),  # leading dot: the domain itself too (curl)
        ("*.example.com", "a.b.example.com", 443, True),
        ("EXAMPLE.com.", "Api.Example.COM", 443, True),  # case and a trailing dot do not matter
        ("example.com:8443", "example.com", 8443, True),
        ("example.com:8443", "example.com", 443, False),  # a port limits the entry to it
        ("10.0.0.0/8", "10.1.2.3", 80, True),
        ("10.0.0.0/8", "11.1.2.3", 80, False),
        ("10.0.0.0/8", "ten.example", 80, False),  # a CIDR block matches addresses, no lookup
        ("192.168.1.7", "192.168.1.7", 80, True),
        ("192.168.1.7", "192.168.1.8", 80, False),
        ("::1", "::1", 8080, True),
        ("fd00::/8", "fd12::1", 443, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 8081, False),
        ("127.0.0.1", "localhost", 80, False),  # names and addresses are not resolved into each other
        ("", "127.0.0.1", 80, False),  # loopback is not exempt by itself (curl; Go exempts it)
        ("internal.corp, localhost  127.0.0.1", "127.0.0.1", 80, True),  # commas and spaces separate
    ],
)
def test_no_proxy_matching(no_proxy: str, host: str, port: int, bypassed: bool) -> None:
    assert bypasses(parse_no_proxy(no_proxy), host, port) is bypassed


@pytest.mark.parametrize(
    ("entry", "problem"),
    [("10.0.0.0/33", "not a valid CIDR block"), ("host:99999", "invalid port"), ("a b*c", "not a host name")],
)
def test_a_broken_no_proxy_entry_is_named(entry: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_no_proxy(entry)


def test_environment_proxy_precedence_and_spelling() -> None:
    env = {"HTTPS_PROXY": "http://secure:3128", "http_proxy": "plain:8080", "ALL_PROXY": "http://all:1"}
    assert environment_proxy(env, "https") == "http://secure:3128"
    assert environment_proxy(env, "http") == "http://plain:8080"  # lower case counts; no scheme: http://
    assert environment_proxy({"all_proxy": "http://all:1"}, "https") == "http://all:1"  # the fallback
    assert environment_proxy({"HTTPS_PROXY": "", "https_proxy": " "}, "https") is None  # empty is unset
    assert environment_proxy({"HTTPS_PROXY": "http://u:1"}, "http") is None  # no HTTP proxy for http
    assert environment_no_proxy({"no_proxy": "a,b"}) == "a,b"
    assert environment_no_proxy({"NO_PROXY": "x", "no_proxy": "y"}) == "x"
    assert environment_no_proxy({}) == ""
