"""Secrets never survive redaction, whatever form they take in a URL, a header or a DSN."""

from __future__ import annotations

import pytest

from tokwatch.settings.redact import MASK, Redactor, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("GET https://api.example/v1/metrics?key=AIzaSyD-abcdef123 failed", "AIzaSyD-abcdef123"),
        ("https://blob.example/m?sv=2024&sig=Zm9vYmFy%2Bqq&se=1", "Zm9vYmFy%2Bqq"),
        ("http://h/metrics?token=t0k3n&x=1", "t0k3n"),
        ("http://h/metrics?access_token=abc", "abc"),
        ("http://admin:hunter22@h:9090/metrics", "hunter22"),
        ("http://:hunter22@h/metrics", "hunter22"),
        ("Authorization: Basic YWRtaW46aHVudGVyMjI=", "YWRtaW46aHVudGVyMjI="),
        ("Authorization: Bearer sk-abcdef123456", "sk-abcdef123456"),
        ("host=db user=tw password='two words here' dbname=tw", "two words here"),
        ("host=db password=plainpass dbname=tw", "plainpass"),
        ("postgresql://tw:s3cr3t@db:5432/tw", "s3cr3t"),
    ],
)
def test_credentials_are_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out
    for part in secret.split():
        assert part not in out


def test_known_secret_values_are_masked_anywhere() -> None:
    assert Redactor(["sk-live-123456"])("a sk-live-123456 b") == f"a {MASK} b"


def test_ordinary_text_is_left_alone() -> None:
    text = "GET http://127.0.0.1:8000/v1/models?limit=5 took 12 ms (status=ok)"
    assert redact(text) == text


def test_a_dsn_password_with_at_signs_is_masked_whole() -> None:
    """The last `@` of the authority ends the userinfo (as urllib reads it): nothing of the password is
    left to pass for a host name, in free text or in the store's description of the DSN."""
    from tokwatch.storage.postgres import describe_dsn, normalize_dsn

    dsn = "postgresql://tw:p@ss@w0rd@db.example:5432/tw"
    text = redact(f"cannot connect to {dsn}: timeout")
    assert text == "cannot connect to postgresql://tw:***@db.example:5432/tw: timeout"
    assert describe_dsn(dsn) == "postgresql://tw@db.example:5432/tw"
    assert normalize_dsn(dsn) == "postgresql://tw:p%40ss%40w0rd@db.example:5432/tw"
    assert normalize_dsn("postgresql://tw:plain@db/tw") == "postgresql://tw:plain@db/tw"  # unchanged


def test_an_echo_of_any_eight_characters_of_a_key_is_masked() -> None:
    key = "sk-proj-ABCDEFGHijklmnopQRSTUVWX"
    r = Redactor([key])
    # A provider echoing 16 of the 24 characters after the prefix, and another its last 8.
    assert (
        r("Incorrect API key provided: ABCDEFGHijklmnop. See docs")
        == "Incorrect API key provided: ***. See docs"
    )
    assert r("key ending in QRSTUVWX is revoked") == "key ending in *** is revoked"
    # Seven characters are not enough to mask (they would catch ordinary words), and unrelated text stays.
    assert r("ABCDEFG and the rest") == "ABCDEFG and the rest"


def test_two_keys_sharing_a_fragment_are_each_masked_whole() -> None:
    r = Redactor(["sk-rotated-NEW-key-0002", "sk-expired-OLD-key-0001"])
    assert r("x sk-rotated-NEW-key-0002 sk-expired-OLD-key-0001") == "x *** ***"
