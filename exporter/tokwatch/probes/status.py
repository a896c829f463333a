"""The one place where failures and answers become a run status and a bounded `error_class`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tokwatch.figures.result import RunResult, Status
from tokwatch.streams.events import StreamProtocolError
from tokwatch.transport.http import HttpStatusError, TransportError

MAX_ERROR_MESSAGE = 500
_SPECIAL_TOKEN_SLACK = 8
CONTEXT_EXCEEDED = "context_exceeded"
# How servers refuse a request longer than the model's context (lower-cased substrings of the error body):
# OpenAI's code, vLLM's "maximum context length" / "maximum model length", llama.cpp's error type and
# message, SGLang's "longer than the model's context length", Ollama's "context length".
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "maximum model length",
    "exceed_context_size",
    "exceeds the available context size",
    "longer than the model's context length",
    "context length",
    "exceed context limit",  # Anthropic's
    "prompt is too long",
)


# An error the server reported in its answer, by what its type says (any other: provider_error).
_STREAM_ERROR_STATUS = {
    "overloaded": Status.RATE_LIMITED,
    "rate_limit": Status.RATE_LIMITED,
    "auth_error": Status.AUTH_FAILURE,
}


@dataclass(frozen=True, slots=True)
class Classification:
    """A non-ok outcome: status, short error class and an unredacted human message."""

    status: Status
    error_class: str
    message: str


def classify_http_status(code: int, body: str = "", location: str | None = None) -> Classification | None:
    """Status for an HTTP answer code; None for 2xx. `location` is a redirect's target (not followed)."""
    if 200 <= code < 300:
        return None
    if 300 <= code < 400 and location:
        # tokwatch's client follows no redirect: name where the endpoint moved so the config can say so.
        detail = f"HTTP {code}: redirected to {location[:200]} (not followed: set base_url to that address)"
        return Classification(Status.PROVIDER_ERROR, "http_other", detail)
    detail = f"HTTP {code}" + (f": {body.strip()[:300]}" if body.strip() else "")
    if code in (400, 413, 422) and any(m in body.lower() for m in _CONTEXT_MARKERS):
        return Classification(Status.PROVIDER_ERROR, CONTEXT_EXCEEDED, detail)
    if code == 429:
        return Classification(Status.RATE_LIMITED, "http_429", detail)
    if code == 529:  # Anthropic's "overloaded": come back later, as a 429 says
        return Classification(Status.RATE_LIMITED, "http_529", detail)
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
        if exc.kind in ("connect", "dns", "tls", "proxy"):
            return Classification(Status.UNREACHABLE, exc.kind, msg)
        if exc.kind == "too_large":
            return Classification(Status.PROVIDER_ERROR, "too_large", msg)
        if exc.kind == "reset":
            # Closed before any response byte: nothing answered (a crashed or restarting server).
            if exc.phase != "body":
                return Classification(Status.UNREACHABLE, "reset", msg)
            return Classification(Status.PROVIDER_ERROR, "reset", msg)
        return Classification(Status.PROVIDER_ERROR, "bad_http", msg)
    if isinstance(exc, HttpStatusError):
        return classify_http_status(exc.status, exc.body) or Classification(
            Status.PROVIDER_ERROR, "http_other", str(exc)
        )
    if isinstance(exc, StreamProtocolError):
        return Classification(
            _STREAM_ERROR_STATUS.get(exc.error_class, Status.PROVIDER_ERROR), exc.error_class, str(exc)
        )
    if isinstance(exc, TimeoutError):
        return Classification(Status.TIMEOUT, "read_timeout", "timed out")
    return Classification(Status.PROVIDER_ERROR, "internal", f"{type(exc).__name__}: {exc}")


def context_exceeded(
    refusal: Classification, workload: str, input_tokens: int | None, max_tokens: int
) -> Classification:
    """A context-length refusal with the workload named, so the message says what to change."""
    size = f"{input_tokens} input + " if input_tokens is not None else ""
    return Classification(
        refusal.status,
        refusal.error_class,
        f"workload {workload} ({size}{max_tokens} output tokens) does not fit the model's context: shrink "
        f"the workload or set the endpoint's workloads ({refusal.message})",
    )


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


def unreadable_answer(content_type: str, events: int, size: int, http_status: int) -> Classification | None:
    """A 2xx answer that is not the API's protocol: an HTML page, or a body that held no event at all."""
    if "text/html" in content_type.lower():
        return Classification(
            Status.PROVIDER_ERROR, "not_json", f"a {http_status} answer in HTML ({size} bytes), not the API's"
        )
    if events == 0:
        return Classification(
            Status.PROVIDER_ERROR,
            "not_json",
            f"a {http_status} answer with no event of the API in {size} bytes ({content_type or 'no type'})",
        )
    return None


def model_matches(answered: str, configured: str, aliases: Sequence[str] = ()) -> bool:
    """True when the answer's `model` names the configured model (docs/methodology.md, "Answer validation").

    Equal after normalising (case, a directory path, `.gguf`, Ollama's `:latest`), an alias, or the
    configured name followed by a variant suffix (`-2024-07-18` snapshots, `-135m-instruct.q4_1` files).
    """
    if "*" in aliases:
        return True
    got = _normal_model(answered)
    for name in (configured, *aliases):
        want = _normal_model(name)
        if got == want or (want and got.startswith((f"{want}-", f"{want}.", f"{want}:", f"{want}_"))):
            return True
    return False


def _normal_model(name: str) -> str:
    name = name.strip().lower().rsplit("/", 1)[-1]
    name = name.removesuffix(".gguf").removesuffix(":latest")
    return name


def implausible_tokens(completion_tokens: int, text_bytes: int | None) -> Classification | None:
    """More tokens claimed than the text could hold: every token is at least one byte of text (byte-level
    tokenizers); a few special tokens (end of turn, reasoning markers) may carry none, hence the slack."""
    if text_bytes is not None and completion_tokens > text_bytes + _SPECIAL_TOKEN_SLACK:
        return Classification(
            Status.PROVIDER_ERROR,
            "implausible_tokens",
            f"{completion_tokens} tokens claimed for {text_bytes} bytes of text",
        )
    return None


def model_mismatch(
    answered_model: str | None, configured_model: str | None, model_aliases: Sequence[str] = ()
) -> Classification | None:
    """An answer that names another model than the configured one (`model_matches`)."""
    if answered_model is None or configured_model is None:
        return None
    if model_matches(answered_model, configured_model, model_aliases):
        return None
    return Classification(
        Status.DEGRADED,
        "model_mismatch",
        f"answered by model {answered_model[:120]!r}, configured {configured_model[:120]!r}",
    )


def judge_run(
    result: RunResult,
    *,
    completion_tokens: int | None,
    max_tokens: int,
    short_output: str,
    max_plausible_tps: float | None = None,
) -> Classification | None:
    """The probe's run verdict, after the answer's (`tokwatch.probes.exchange.answer_verdict`): the chosen
    tok/s plausible and present, the output as long as asked for; None when ok."""
    tps = result.tokens_per_second
    if max_plausible_tps is not None and tps is not None and tps > max_plausible_tps:
        return Classification(
            Status.PROVIDER_ERROR,
            "implausible_rate",
            f"{tps:,.0f} tok/s from {result.source} is above the plausible {max_plausible_tps:,.0f} tok/s",
        )
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


def judge_answer(
    result: RunResult,
    *,
    completion_tokens: int | None,
    max_tokens: int,
    short_output: str,
    text_bytes: int | None = None,
    answered_model: str | None = None,
    configured_model: str | None = None,
    model_aliases: Sequence[str] = (),
    max_plausible_tps: float | None = None,
) -> Classification | None:
    """The answer's rules on tokens and model, then the run's (`judge_run`); None when ok (every rule:
    docs/methodology.md)."""
    return (
        implausible_tokens(completion_tokens or 0, text_bytes)
        or model_mismatch(answered_model, configured_model, model_aliases)
        or judge_run(
            result,
            completion_tokens=completion_tokens,
            max_tokens=max_tokens,
            short_output=short_output,
            max_plausible_tps=max_plausible_tps,
        )
    )
