"""The Ollama kind: /api/chat (or /api/generate), engine timings from the final `done` object, /api/ps."""

from __future__ import annotations

from typing import Any, Literal

from tokwatch.figures.result import TimingSource
from tokwatch.figures.timing import ollama_engine_tps, ollama_prefill_tps, ollama_server_wall_tps
from tokwatch.probes.base import ProbeContext
from tokwatch.probes.http import ChatRequest, HttpProbe, RequestPlan
from tokwatch.settings.access import with_query
from tokwatch.settings.config import server_root
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.streams.ollama import OllamaStreamParser

# Ollama reports a few milliseconds of load_duration even when the model is already resident; a reload of
# an evicted model takes hundreds of milliseconds at least. Anything above this counts as a cold load.
COLD_LOAD_MIN_NS = 100_000_000


class OllamaProbe(HttpProbe):
    """`engine` = eval_count / eval_duration; `server_wall` = eval_count / total_duration when stripped."""

    kind = "ollama"
    ollama_signals = True
    event_separator = b"\n"  # NDJSON: one object a line

    @classmethod
    def url(cls, base_url: str) -> str:
        """/api/chat (a probe with `ollama_api: generate` goes to /api/generate: see `request`)."""
        return f"{server_root(base_url)}/api/chat"

    @classmethod
    def body(cls, request: ChatRequest) -> dict[str, Any]:
        """Native chat request; `stream` is always explicit because Ollama defaults to streaming.

        Ollama has no fixed-output fields (`fixed_output` is ignored).
        """
        return {
            "model": request.model,
            "stream": request.stream,
            "options": {"num_predict": request.max_tokens, "temperature": request.temperature},
            "messages": list(request.messages),
        }

    @classmethod
    def with_thinking(cls, body: dict[str, Any], budget: int | None) -> dict[str, Any]:
        """`think: true`: Ollama has no think budget, so only `num_predict` bounds the think phase."""
        return {**body, "think": True}

    @classmethod
    def parser(cls) -> StreamParser:
        """NDJSON lines."""
        return OllamaStreamParser()

    @classmethod
    def parse_whole(cls, obj: Any, t: float) -> list[StreamEvent]:
        """A non-streamed answer is one `done: true` object."""
        return OllamaStreamParser().parse_object(obj, t)

    def request(self, ctx: ProbeContext, plan: RequestPlan) -> tuple[str, dict[str, Any]]:
        """/api/chat, or /api/generate with the prompt and system prompt as fields (`endpoint.ollama_api`)."""
        url, body = super().request(ctx, plan)
        if ctx.endpoint.ollama_api == "chat":
            return url, body
        del body["messages"]
        body["prompt"] = plan.prompt
        if plan.system_prompt:
            body["system"] = plan.system_prompt
        return with_query(f"{server_root(ctx.endpoint.base_url)}/api/generate", ctx.endpoint.query), body

    @classmethod
    def server_total(cls, col: StreamCollector) -> tuple[int | None, Literal["usage", "engine"]]:
        """eval_count from the final object."""
        if col.ollama is not None and col.ollama.eval_count is not None:
            return col.ollama.eval_count, "engine"
        return None, "engine"

    @classmethod
    def server_prompt(cls, col: StreamCollector) -> tuple[int | None, int | None]:
        """prompt_eval_count (the prompt tokens Ollama evaluated) and prompt_eval_cached_count if sent."""
        final = col.ollama
        return (None, None) if final is None else (final.prompt_eval_count, final.prompt_eval_cached_count)

    @classmethod
    def server_prefill(cls, col: StreamCollector) -> float | None:
        """prompt_eval_count / prompt_eval_duration."""
        final = col.ollama
        if final is None:
            return None
        return ollama_prefill_tps(final.prompt_eval_count, final.prompt_eval_duration_ns)

    @classmethod
    def server_cold(cls, col: StreamCollector) -> bool | None:
        """load_duration above COLD_LOAD_MIN_NS: the model was loaded for this request."""
        final = col.ollama
        if final is None or final.load_duration_ns is None:
            return None
        return final.load_duration_ns > COLD_LOAD_MIN_NS

    @classmethod
    def server_candidates(cls, col: StreamCollector) -> dict[TimingSource, float]:
        """Engine figure, or the total-duration figure when the upstream strips eval_duration."""
        out: dict[TimingSource, float] = {}
        final = col.ollama
        if final is None:
            return out
        engine = ollama_engine_tps(final.eval_count, final.eval_duration_ns)
        if engine is not None:
            out[TimingSource.ENGINE] = engine
        elif final.eval_duration_ns is None:
            wall = ollama_server_wall_tps(final.eval_count, final.total_duration_ns)
            if wall is not None:
                out[TimingSource.SERVER_WALL] = wall
        return out
