"""Exception/answer -> status mapping, all in tokwatch.probes.status."""

from __future__ import annotations

import pytest

from tokwatch.figures.result import RunResult, Status
from tokwatch.probes.status import (
    apply,
    classify_exception,
    classify_http_status,
    judge_answer,
    model_matches,
    unreadable_answer,
)
from tokwatch.settings.redact import Redactor
from tokwatch.streams.events import StreamProtocolError
from tokwatch.transport.http import HttpStatusError, TransportError


@pytest.mark.parametrize(
    ("code", "status", "cls"),
    [
        (429, Status.RATE_LIMITED, "http_429"),
        (401, Status.AUTH_FAILURE, "http_401"),
        (403, Status.AUTH_FAILURE, "http_403"),
        (500, Status.PROVIDER_ERROR, "http_5xx"),
        (503, Status.PROVIDER_ERROR, "http_5xx"),
        (404, Status.PROVIDER_ERROR, "http_4xx"),
    ],
)
def test_http_codes(code: int, status: Status, cls: str) -> None:
    c = classify_http_status(code, "body")
    assert c is not None and (c.status, c.error_class) == (status, cls)
    assert classify_exception(HttpStatusError(code, "x")).status is status


def test_2xx_is_not_a_failure() -> None:
    assert classify_http_status(200) is None and classify_http_status(204) is None


@pytest.mark.parametrize(
    ("exc", "status", "cls"),
    [
        (TransportError("timeout", "connect", "t"), Status.TIMEOUT, "connect_timeout"),
        (TransportError("timeout", "body", "t"), Status.TIMEOUT, "read_timeout"),
        (TransportError("timeout", "response", "t"), Status.TIMEOUT, "read_timeout"),
        (TransportError("connect", "connect", "refused"), Status.UNREACHABLE, "connect"),
        (TransportError("dns", "connect", "nx"), Status.UNREACHABLE, "dns"),
        (TransportError("tls", "connect", "cert"), Status.UNREACHABLE, "tls"),
        (TransportError("reset", "body", "reset"), Status.PROVIDER_ERROR, "reset"),
        (TransportError("reset", "response", "reset"), Status.UNREACHABLE, "reset"),
        (TransportError("too_large", "body", "big"), Status.PROVIDER_ERROR, "too_large"),
        (TransportError("protocol", "response", "bad"), Status.PROVIDER_ERROR, "bad_http"),
        (StreamProtocolError("malformed_json", "x"), Status.PROVIDER_ERROR, "malformed_json"),
        (StreamProtocolError("bad_shape", "x"), Status.PROVIDER_ERROR, "bad_shape"),
        (StreamProtocolError("stream_error", "x"), Status.PROVIDER_ERROR, "stream_error"),
        (TimeoutError(), Status.TIMEOUT, "read_timeout"),
        (RuntimeError("boom"), Status.PROVIDER_ERROR, "internal"),
    ],
)
def test_exceptions(exc: BaseException, status: Status, cls: str) -> None:
    c = classify_exception(exc)
    assert (c.status, c.error_class) == (status, cls)


def test_apply_redacts_and_truncates() -> None:
    r = RunResult(endpoint="e", started_at=0.0, status=Status.OK)
    c = classify_http_status(401, "invalid key sk-secret-123456 " + "x" * 1000)
    assert c is not None
    apply(r, c, Redactor(["sk-secret-123456"]))
    assert r.status is Status.AUTH_FAILURE and r.error_class == "http_401"
    assert r.error_message is not None and "sk-secret" not in r.error_message and len(r.error_message) <= 500


def test_judge_answer() -> None:
    r = RunResult(endpoint="e", started_at=0.0, status=Status.OK, tokens_per_second=50.0)
    assert judge_answer(r, completion_tokens=256, max_tokens=256, short_output="degraded") is None
    c = judge_answer(r, completion_tokens=100, max_tokens=256, short_output="degraded")
    assert c is not None and (c.status, c.error_class) == (Status.DEGRADED, "short_output")
    assert judge_answer(r, completion_tokens=100, max_tokens=256, short_output="ok") is None
    r.tokens_per_second = None
    c = judge_answer(r, completion_tokens=256, max_tokens=256, short_output="ok")
    assert c is not None and c.error_class == "no_timing"


@pytest.mark.parametrize(
    ("answered", "configured", "aliases", "match"),
    [
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", (), True),
        ("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", (), True),
        ("llama3.2:latest", "llama3.2", (), True),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b-instruct", (), True),
        ("/models/other.gguf", "smollm2", (), False),
        ("gpt-4o", "gpt-4o-mini", (), False),
        ("served-name", "my-model", ("served-name",), True),
        ("anything", "my-model", ("*",), True),
    ],
)
def test_model_matches(answered: str, configured: str, aliases: tuple[str, ...], match: bool) -> None:
    assert model_matches(answered, configured, aliases) is match


def test_judge_answer_order_and_validation_rules() -> None:
    r = RunResult(endpoint="e", started_at=0.0, status=Status.OK, tokens_per_second=50.0)
    common = {"completion_tokens": 10, "max_tokens": 10, "short_output": "degraded"}
    assert judge_answer(r, **common, text_bytes=40, answered_model="m", configured_model="m") is None
    c = judge_answer(r, **common, text_bytes=1)
    assert c is not None and (c.status, c.error_class) == (Status.PROVIDER_ERROR, "implausible_tokens")
    c = judge_answer(r, **common, max_plausible_tps=20.0)
    assert c is not None and c.error_class == "implausible_rate"
    c = judge_answer(r, **common, answered_model="x", configured_model="m")
    assert c is not None and (c.status, c.error_class) == (Status.DEGRADED, "model_mismatch")


def test_unreadable_answers() -> None:
    assert unreadable_answer("text/event-stream", 3, 100, 200) is None
    html = unreadable_answer("text/html; charset=utf-8", 0, 100, 200)
    assert html is not None and (html.status, html.error_class) == (Status.PROVIDER_ERROR, "not_json")
    empty = unreadable_answer("text/event-stream", 0, 0, 200)
    assert empty is not None and empty.error_class == "not_json"
