"""Anthropic's Messages API as api.anthropic.com speaks it: POST /v1/messages, `x-api-key` and a required
`anthropic-version`, named SSE events (message_start, content_block_start/delta/stop with thinking and text
blocks, ping, message_delta with the usage, message_stop), error events and its error bodies (529
overloaded_error included)."""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

from tokwatch.sim.context import SimRequest, open_request
from tokwatch.sim.dialects.base import Formatter, dumps
from tokwatch.sim.dialects.common import BadRequest, int_field, phase_texts, read_json_object
from tokwatch.sim.faults import error_payload, error_response
from tokwatch.sim.generation import Chunk, Generation
from tokwatch.sim.profile import Limits
from tokwatch.sim.responder import respond
from tokwatch.sim.runtime import ServerState
from tokwatch.sim.text import message_texts

_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn"}


def _signature(req: SimRequest) -> str:
    """An opaque thinking-block signature (clients pass it back unread; it is no text and no token)."""
    return hashlib.sha256(f"sig:{req.body_id}".encode()).hexdigest()


class MessagesFormatter(Formatter):
    """POST /v1/messages: every record an `event:` + `data:` pair; blocks open and close as the phase goes
    from thinking to text."""

    def __init__(self, req: SimRequest) -> None:
        super().__init__(req)
        self._block: str | None = None  # the open content block's type
        self._index = -1

    def frame(self, obj: Any) -> bytes:
        """One or more named events (a list when a chunk also opens or closes a block)."""
        records = obj if isinstance(obj, list) else [obj]
        return b"".join(f"event: {r['type']}\ndata: {dumps(r)}\n\n".encode() for r in records)

    def done(self) -> bytes | None:
        """No terminator: `message_stop` ends the stream."""
        return None

    def ping(self) -> bytes:
        """Anthropic's pings are events of their own, not SSE comments."""
        return self.frame({"type": "ping"})

    def _usage(self, *, final: bool) -> dict[str, Any]:
        rec = self.req.rec
        usage: dict[str, Any] = {
            "input_tokens": rec.prompt_tokens - rec.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": rec.cached_tokens,
            "output_tokens": rec.tokens if final else 1,
        }
        return usage

    def start(self) -> list[Any]:
        """message_start, with the prompt's usage."""
        req = self.req
        message: dict[str, Any] = {
            "id": f"msg_{req.body_id[:24]}",
            "type": "message",
            "role": "assistant",
            "model": req.model_name,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": self._usage(final=False),
        }
        return [{"type": "message_start", "message": message}]

    def _close_block(self) -> list[dict[str, Any]]:
        if self._block is None:
            return []
        out: list[dict[str, Any]] = []
        if self._block == "thinking":
            sig = {"type": "signature_delta", "signature": _signature(self.req)}
            out.append({"type": "content_block_delta", "index": self._index, "delta": sig})
        out.append({"type": "content_block_stop", "index": self._index})
        self._block = None
        return out

    def chunk(self, chunk: Chunk) -> Any:
        """A thinking or text delta, opening its block (and closing the previous one) when the phase turns."""
        kind = "thinking" if chunk.phase == "think" else "text"
        out: list[dict[str, Any]] = []
        if self._block != kind:
            out.extend(self._close_block())
            self._index += 1
            self._block = kind
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {
                    "type": "text",
                    "text": "",
                }
            )
            out.append({"type": "content_block_start", "index": self._index, "content_block": block})
        delta = (
            {"type": "thinking_delta", "thinking": chunk.text}
            if kind == "thinking"
            else {"type": "text_delta", "text": chunk.text}
        )
        out.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        return out

    def finish(self, gen: Generation) -> list[Any]:
        """The last block's stop, message_delta with the stop reason and the output count, message_stop."""
        reason = _STOP_REASONS.get(self.req.rec.finish_reason or "stop", "end_turn")
        return [
            *self._close_block(),
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": self.req.rec.tokens},
            },
            {"type": "message_stop"},
        ]

    def body(self, gen: Generation) -> Any:
        """The non-streamed message: a thinking block (when the model thinks), then the text block."""
        req = self.req
        think, output = phase_texts(req)
        content: list[dict[str, Any]] = []
        if think:
            content.append({"type": "thinking", "thinking": think, "signature": _signature(req)})
        content.append({"type": "text", "text": output})
        return {
            "id": f"msg_{req.body_id[:24]}",
            "type": "message",
            "role": "assistant",
            "model": req.model_name,
            "content": content,
            "stop_reason": _STOP_REASONS.get(req.rec.finish_reason or "stop", "end_turn"),
            "stop_sequence": None,
            "usage": self._usage(final=True),
        }

    def wrong_shape(self) -> Any:
        """A message_delta whose delta is not an object."""
        return {"type": "content_block_delta", "index": 0, "delta": "none"}

    def error_event(self, *, overloaded: bool = False) -> bytes:
        """An `error` event: overloaded_error, else api_error."""
        return self.frame(error_payload(self.dialect, 529 if overloaded else 500))

    def malformed(self) -> bytes:
        """A truncated event: the JSON never closes."""
        return b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"ty\n\n'


def _system_texts(system: Any) -> list[str]:
    """The system prompt as a string or a list of text blocks."""
    if system is None:
        return []
    if isinstance(system, str):
        return [system]
    if isinstance(system, list):
        return [str(b.get("text", "")) for b in system if isinstance(b, dict) and b.get("type") == "text"]
    raise BadRequest("system: must be a string or a list of text blocks")


async def handle_anthropic_route(
    server: ServerState, request: web.Request, path: str
) -> web.StreamResponse | None:
    """Serve /v1/messages; None when `path` is not an Anthropic route."""
    if request.method != "POST" or path != "v1/messages":
        return None
    try:
        if not request.headers.get("anthropic-version"):
            raise BadRequest("anthropic-version: header is required")
        body = await read_json_object(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: Field required")
        if any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
            raise BadRequest(
                'messages: Unexpected role "system". The Messages API accepts a top-level `system` '
                'parameter, not "system" as an input message role.'
            )
        max_tokens = int_field(body, "max_tokens", minimum=1)
        if max_tokens is None:
            raise BadRequest("max_tokens: Field required")
        texts = [*_system_texts(body.get("system")), *message_texts(messages)]
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream: Input should be a valid boolean")
        model = body.get("model")
        if not isinstance(model, str):
            raise BadRequest("model: Field required")
        budget = _thinking_budget(body, max_tokens)
    except BadRequest as exc:
        return error_response("anthropic", 400, None, str(exc))
    opened = open_request(
        server,
        request.path,
        model_name=model,
        prompt_texts=texts,
        limits=Limits(max_tokens, think=budget is not None, think_budget=budget),
        stream=stream,
        include_usage=True,
    )
    if isinstance(opened, web.Response):
        return opened
    return await respond(opened, request, MessagesFormatter(opened))


def _thinking_budget(body: dict[str, Any], max_tokens: int) -> int | None:
    """`thinking: {type: enabled, budget_tokens}`'s budget, refused as the Messages API refuses it: under
    1,024 tokens, not below max_tokens, or with a temperature other than 1 (None: thinking not enabled)."""
    thinking = body.get("thinking")
    if thinking is None:
        return None
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
        raise BadRequest("thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled'")
    if thinking["type"] == "disabled":
        return None
    budget = int_field(thinking, "budget_tokens")
    if budget is None:
        raise BadRequest("thinking.enabled.budget_tokens: Field required")
    if budget < 1024:
        raise BadRequest("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if budget >= max_tokens:
        raise BadRequest("`max_tokens` must be greater than `thinking.budget_tokens`")
    if body.get("temperature") not in (None, 1, 1.0):
        raise BadRequest("`temperature` may only be set to 1 when thinking is enabled")
    return budget
