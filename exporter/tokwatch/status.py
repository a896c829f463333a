"""The one place where failures and answers become a run status and a bounded `error_class`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tokwatch.http import HttpStatusError, TransportError
from tokwatch.result import RunResult, Status
from tokwatch.streams import StreamProtocolError

MAX_ERROR_MESSAGE = 500


@dataclass(frozen=True, slots=True)
class Classification:
    """A non-ok outcome: status, short error class and an unredacted human message."""

    status: Status
    error_class: str
    message: str


def classify_http_status(code: int, body: str = "") -> Classification | None:
    """Status for an HTTP answer code; None for 2xx."""
    if 200 <= code < 300:
        return None
    detail = f"HTTP {code}" + (f": {body.strip()[:300]}" if body.strip() else "")
    if code == 429:
        return Classification(Status.RATE_LIMITED, "http_429", detail)
    if code in (401, 403):
        return Classification(Status.AUTH_FAILURE, f"http_{code}", detail)
    if code >= 500:
        return Classification(Status.PROVIDER_ERROR, "http_5xx", detail)
    return Classification(Status.PROVIDER_ERROR, "http_4xx" if code >= 400 else "http_other", detail)


def classify_exception(exc: BaseException) -> Classification:
    """Status for anything a request or a parser raised."""
    if isinstance(exc, TransportError):
        msg = str(exc)
        if exc.kind == "timeout":
            return Classification(
                Status.TIMEOUT, "connect_timeout" if exc.phase == "connect" else "read_timeout", msg
            )
        if exc.kind in ("connect", "dns", "tls"):
            return Classification(Status.UNREACHABLE, exc.kind, msg)
        if exc.kind == "too_large":
            return Classification(Status.PROVIDER_ERROR, "too_large", msg)
        if exc.kind == "reset":
            return Classification(Status.PROVIDER_ERROR, "reset", msg)
        return Classification(Status.PROVIDER_ERROR, "bad_http", msg)
    if isinstance(exc, HttpStatusError):
        return classify_http_status(exc.status, exc.body) or Classification(
            Status.PROVIDER_ERROR, "http_other", str(exc)
        )
    if isinstance(exc, StreamProtocolError):
        return Classification(Status.PROVIDER_ERROR, exc.error_class, str(exc))
    if isinstance(exc, TimeoutError):
        return Classification(Status.TIMEOUT, "read_timeout", "timed out")
    return Classification(Status.PROVIDER_ERROR, "internal", f"{type(exc).__name__}: {exc}")


class Outcome(Protocol):
    """Anything that carries a run's verdict: a probe's RunResult or a benchmark request's record."""

    status: Status
    error_class: str | None
    error_message: str | None


R = TypeVar("R", bound=Outcome)


def apply(result: R, outcome: Classification, redact: Callable[[str], str]) -> R:
    """Record a non-ok outcome on the result with a redacted, bounded message."""
    result.status = outcome.status
    result.error_class = outcome.error_class
    result.error_message = redact(outcome.message)[:MAX_ERROR_MESSAGE]
    return result


def judge_answer(
    result: RunResult, *, completion_tokens: int | None, max_tokens: int, short_output: str
) -> Classification | None:
    """Degraded when an answered run has no timing or fewer tokens than requested; None when ok."""
    if result.tokens_per_second is None:
        return Classification(Status.DEGRADED, "no_timing", "no timing source gave a tok/s figure")
    if short_output != "ok" and (completion_tokens or 0) < max_tokens:
        return Classification(
            Status.DEGRADED,
            "short_output",
            f"{completion_tokens or 0} of {max_tokens} requested tokens"
            + (f" (finish_reason {result.finish_reason})" if result.finish_reason else ""),
        )
    return None
