"""Fault draws (deterministic per request) and the error bodies each dialect really sends."""

from __future__ import annotations

import json
import random
import socket
import struct
from typing import Any

from aiohttp import web

from tokwatch.sim.config import FAULT_KINDS, FaultSettings

HTTP_FAULTS = frozenset({"http_401", "http_403", "http_429", "http_5xx", "http_529"})
_5XX = (500, 502, 503)


def draw_fault(faults: FaultSettings, rng: random.Random) -> str | None:
    """At most one fault for a request: one uniform draw against the cumulative probabilities."""
    u = rng.random()
    acc = 0.0
    for kind in FAULT_KINDS:
        acc += getattr(faults, kind)
        if u < acc:
            return kind
    return None


def fault_status(kind: str, rng: random.Random) -> int:
    """HTTP status of an HTTP fault (5xx picks 500, 502 or 503)."""
    if kind == "http_5xx":
        return rng.choice(_5XX)
    return int(kind.removeprefix("http_"))


def error_payload(dialect: str, status: int, message: str | None = None) -> Any:
    """The JSON error body of `dialect` for `status`."""
    if dialect == "ollama":
        return {"error": message or _OLLAMA_MESSAGES.get(status, "internal server error")}
    if dialect == "anthropic":
        kind, msg = _ANTHROPIC.get(status, _ANTHROPIC[500])
        return {"type": "error", "error": {"type": kind, "message": message or msg}}
    if dialect == "llamacpp":
        kind = _LLAMACPP_TYPES.get(status, "server_error")
        return {
            "error": {
                "code": status,
                "message": message or _LLAMACPP_MESSAGES.get(status, "error"),
                "type": kind,
            }
        }
    if dialect == "openai":
        msg, kind, code = _OPENAI.get(status, _OPENAI[500])
        return {"error": {"message": message or msg, "type": kind, "param": None, "code": code}}
    # vLLM and SGLang: ErrorResponse wrapped in "error", exception-class type, numeric code.
    msg, kind = _VLLM.get(status, _VLLM[500])
    return {"error": {"message": message or msg, "type": kind, "param": None, "code": status}}


def error_response(
    dialect: str, status: int, request_id: str | None, message: str | None = None
) -> web.Response:
    """A complete error response with the dialect's body and headers."""
    headers = {"x-sim-request-id": request_id} if request_id else {}
    if status == 429:
        headers["Retry-After"] = "1"
    body = json.dumps(error_payload(dialect, status, message))
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def not_found_model(dialect: str, model: str, request_id: str | None) -> web.Response:
    """Unknown model, worded as each server words it."""
    if dialect == "ollama":
        msg = f'model "{model}" not found, try pulling it first'
    elif dialect == "anthropic":
        msg = f"model: {model}"
    elif dialect == "openai":
        return web.json_response(
            {
                "error": {
                    "message": f"The model `{model}` does not exist or you do not have access to it.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "model_not_found",
                }
            },
            status=404,
            headers={"x-sim-request-id": request_id} if request_id else None,
        )
    else:
        msg = f"The model `{model}` does not exist."
    return error_response(dialect, 404, request_id, msg)


def context_exceeded(
    dialect: str, prompt_tokens: int, max_tokens: int, context: int, request_id: str | None
) -> web.Response:
    """A request longer than the model's context, refused as each server refuses it (Ollama truncates the
    prompt instead and never gets here)."""
    headers = {"x-sim-request-id": request_id} if request_id else None
    body: dict[str, Any]
    if dialect == "openai":
        body = {
            "error": {
                "message": f"This model's maximum context length is {context} tokens. However, your messages "
                f"resulted in {prompt_tokens + max_tokens} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    elif dialect == "anthropic":
        message = (
            f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > "
            f"{context}, decrease input length or `max_tokens` and try again"
        )
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    elif dialect == "llamacpp":
        body = {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt_tokens,
                "n_ctx": context,
            }
        }
    elif dialect == "sglang":
        message = (
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
        body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    else:  # vLLM
        message = (
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
        body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return web.json_response(body, status=400, headers=headers)


def reset_connection(request: web.Request) -> None:
    """Abort the TCP connection with an RST (SO_LINGER 0), as a crashed proxy or server would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed: abort() below is then a no-op anyway
    transport.abort()


_OPENAI: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: (
        "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    403: ("You are not allowed to sample from this model.", "invalid_request_error", "permission_denied"),
    429: (
        "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1. "
        "Please try again in 20s.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}
_ANTHROPIC: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    502: ("api_error", "Bad gateway"),
    503: ("api_error", "Service unavailable"),
    529: ("overloaded_error", "Overloaded"),
}
_VLLM: dict[int, tuple[str, str]] = {
    400: ("Invalid request.", "BadRequestError"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "Forbidden"),
    404: ("Not Found", "NotFoundError"),
    429: ("Too Many Requests", "TooManyRequests"),
    500: (
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "InternalServerError",
    ),
    502: ("Bad Gateway", "BadGateway"),
    503: ("The server is overloaded. Please try again later.", "ServiceUnavailableError"),
}
_LLAMACPP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "unavailable_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_LLAMACPP_MESSAGES = {
    400: "Invalid request",
    401: "Invalid API Key",
    403: "Forbidden",
    404: "File Not Found",
    429: "Too many requests",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Loading model",
}
_OLLAMA_MESSAGES = {
    400: "invalid request",
    401: "unauthorized",
    403: "forbidden",
    429: "too many requests, please try again later",
    500: "an error was encountered while running the model",
    502: "bad gateway",
    503: "server busy, please try again.  maximum pending requests exceeded",
}
