"""HTTP/1.1 framing without I/O: every body framing fed at every split point gives the same bytes."""

from __future__ import annotations

import gzip

import pytest

from tokwatch.transport.http_wire import (
    INFLATE_SLICE_BYTES,
    ChunkedBody,
    Inflater,
    LengthBody,
    ProtocolError,
    UntilCloseBody,
    body_framing,
    content_decoder,
    encode_request,
    parse_head,
    parse_url,
)

CHUNKED = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"


def _feed_split(body: ChunkedBody | LengthBody, data: bytes, cuts: list[int]) -> bytes:
    out, prev = [], 0
    for cut in [*cuts, len(data)]:
        out.append(body.feed(data[prev:cut]))
        prev = cut
    return b"".join(out)


def test_chunked_body_at_every_split_point() -> None:
    for cut in range(len(CHUNKED) + 1):
        body = ChunkedBody()
        assert _feed_split(body, CHUNKED, [cut]) == b"hello world", cut
        assert body.done and body.extra == b""


def test_chunked_body_byte_by_byte_and_bytes_after_its_end() -> None:
    body = ChunkedBody()
    assert _feed_split(body, CHUNKED + b"HTTP/1.1", list(range(1, len(CHUNKED) + 8))) == b"hello world"
    assert body.done and body.extra == b"HTTP/1.1"


def test_chunked_body_one_read_with_many_chunks_and_a_pending_one() -> None:
    body = ChunkedBody()
    assert body.feed(b"3\r\nabc\r\n3\r\ndef\r\na\r\n0123") == b"abcdef0123"
    assert not body.done
    assert body.feed(b"456789\r\n0\r\n\r\n") == b"456789"
    assert body.done and body.closed()  # a finished body stays complete when the connection closes


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"zz\r\n", "bad chunk size"),
        (b"3\r\nabcXY", "CRLF"),
        (b"f" * 2000, "too long"),
        (b"-1\r\n", "bad chunk"),
    ],
)
def test_chunked_body_rejects_bad_framing(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        ChunkedBody().feed(data)


def test_a_chunked_body_cut_short_is_not_complete() -> None:
    body = ChunkedBody()
    body.feed(b"5\r\nhel")
    assert not body.closed()


def test_length_body_and_extra_bytes() -> None:
    body = LengthBody(5)
    assert body.feed(b"he") == b"he" and not body.done
    assert body.feed(b"llo!!") == b"llo" and body.done and body.extra == b"!!"
    assert LengthBody(0).done


def test_until_close_body_ends_at_close() -> None:
    body = UntilCloseBody()
    assert body.feed(b"abc") == b"abc" and not body.done
    assert body.closed() and body.done


def test_head_parsing_and_framing_choice() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: 1\r\nx-a: 2\r\nConnection: keep-alive")
    assert head.status == 200 and head.reason == "OK" and head.keep_alive
    assert head.headers["content-length"] == "3" and head.headers.get("X-A") == "1, 2"
    assert "CONTENT-LENGTH" in head.headers and len(head.headers) == 3
    assert isinstance(body_framing(head, head_request=False), LengthBody)
    chunked = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9")
    assert isinstance(body_framing(chunked, head_request=False), ChunkedBody)  # chunked wins (RFC 9112 6.3)
    plain = parse_head(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain")
    assert isinstance(body_framing(plain, head_request=False), UntilCloseBody) and not plain.keep_alive
    assert body_framing(parse_head(b"HTTP/1.1 204 No Content"), head_request=False).done
    assert body_framing(head, head_request=True).done
    assert not parse_head(b"HTTP/1.1 200 OK\r\nConnection: close").keep_alive


@pytest.mark.parametrize(
    "raw",
    [b"SSH-2.0-OpenSSH", b"HTTP/1.1 abc OK", b"HTTP/1.1 200 OK\r\nno colon here", b"HTTP/1.1 200\r\n a: b"],
)
def test_bad_heads_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(raw)


def test_conflicting_content_lengths_are_rejected() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4")
    with pytest.raises(ProtocolError, match="Content-Length"):
        body_framing(head, head_request=False)


def test_gzip_coded_body_is_decoded() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip")
    decoder = content_decoder(head)
    assert decoder is not None
    coded = gzip.compress(b"metric 1\n" * 100)
    assert (
        decoder.decompress(coded[:10]) + decoder.decompress(coded[10:]) + decoder.flush()
        == b"metric 1\n" * 100
    )
    assert content_decoder(parse_head(b"HTTP/1.1 200 OK")) is None


def test_urls_and_request_bytes() -> None:
    target = parse_url("https://[::1]:8443/v1/chat?x=1")
    assert (target.scheme, target.host, target.port, target.path) == ("https", "::1", 8443, "/v1/chat?x=1")
    assert target.host_header == "[::1]:8443"
    plain = parse_url("http://Example.com")
    assert (
        plain.origin == ("http", "example.com", 80)
        and plain.path == "/"
        and plain.host_header == "example.com"
    )
    req = encode_request("POST", plain, {"User-Agent": "t"}, b"{}")
    assert req == b"POST / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\nContent-Length: 2\r\n\r\n{}"
    for bad in ("ftp://x/", "http:///path", "http://h:99999/"):
        with pytest.raises(ValueError):
            parse_url(bad)
    with pytest.raises(ValueError, match="line break"):
        encode_request("GET", plain, {"X": "a\r\nInjected: 1"}, None)


def test_an_inflater_bounds_every_step_and_stops_at_the_cap() -> None:
    """A gzip bomb (64 MiB of zeros in ~64 KiB) never comes out larger than the cap plus one slice, and no
    step inflates much more than its budget; a normal body comes out whole, in any steps."""
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip")
    decoder = content_decoder(head)
    assert decoder is not None
    cap = 1024 * 1024
    inflater = Inflater(decoder, cap)
    inflater.add(1.0, gzip.compress(bytes(64 * 1024 * 1024)))
    steps = []
    while inflater.pending and not inflater.exceeded:
        steps.append(sum(len(p) for _, p in inflater.step(100_000)))
    assert inflater.exceeded and inflater.produced <= cap + 1
    assert max(steps) < 100_000 + INFLATE_SLICE_BYTES and len(steps) > 5
    assert inflater.finish() == b""

    text = b"metric 1\n" * 50_000
    decoder = content_decoder(head)
    assert decoder is not None
    inflater = Inflater(decoder, 10 * len(text))
    coded = gzip.compress(text)
    out = []
    for i in range(0, len(coded), 100):
        inflater.add(float(i), coded[i : i + 100])
        while inflater.pending:
            out += [p for _, p in inflater.step(1000)]
    assert b"".join(out) + inflater.finish() == text and not inflater.exceeded
