"""Ollama probe: /api/chat (or /api/generate) with engine timings from the final `done` object."""

from __future__ import annotations

from typing import Any, Literal

from tokwatch.config import server_root
from tokwatch.probes.base import ProbeContext
from tokwatch.probes.http import HttpProbe, RequestPlan, chat_messages
from tokwatch.result import RunResult, TimingSource
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamParser
from tokwatch.streams.ollama import OllamaStreamParser
from tokwatch.timing import ollama_engine_tps, ollama_server_wall_tps

# Ollama reports a few milliseconds of load_duration even when the model is already resident; a reload of
# an evicted model takes hundreds of milliseconds at least. Anything above this counts as a cold load.
COLD_LOAD_MIN_NS = 100_000_000


class OllamaProbe(HttpProbe):
    """`engine` = eval_count / eval_duration; `server_wall` = eval_count / total_duration when stripped."""

    kind = "ollama"

    def url(self, ctx: ProbeContext) -> str:
        """/api/chat or /api/generate by `endpoint.ollama_api`."""
        return f"{server_root(ctx.endpoint.base_url)}/api/{ctx.endpoint.ollama_api}"

    def body(self, ctx: ProbeContext, plan: RequestPlan) -> dict[str, Any]:
        """Native request; `stream` is always explicit because Ollama defaults to streaming."""
        body: dict[str, Any] = {
            "model": ctx.endpoint.model,
            "stream": plan.stream,
            "options": {"num_predict": plan.max_tokens, "temperature": ctx.settings.temperature},
        }
        if ctx.endpoint.ollama_api == "chat":
            body["messages"] = chat_messages(plan)
        else:
            body["prompt"] = plan.prompt
            if plan.system_prompt:
                body["system"] = plan.system_prompt
        return body

    def parser(self) -> StreamParser:
        """NDJSON lines."""
        return OllamaStreamParser()

    def parse_whole(self, obj: Any, t: float) -> list[StreamEvent]:
        """A non-streamed answer is one `done: true` object."""
        return OllamaStreamParser().parse_object(obj, t)

    def server_total(self, col: StreamCollector) -> tuple[int | None, Literal["usage", "engine"]]:
        """eval_count from the final object."""
        if col.ollama is not None and col.ollama.eval_count is not None:
            return col.ollama.eval_count, "engine"
        return None, "engine"

    def server_candidates(self, col: StreamCollector, result: RunResult) -> dict[TimingSource, float]:
        """Engine figure, or the total-duration figure when the upstream strips eval_duration."""
        out: dict[TimingSource, float] = {}
        final = col.ollama
        if final is None:
            return out
        result.prompt_tokens = final.prompt_eval_count
        if final.load_duration_ns is not None:
            result.cold = final.load_duration_ns > COLD_LOAD_MIN_NS
        engine = ollama_engine_tps(final.eval_count, final.eval_duration_ns)
        if engine is not None:
            out[TimingSource.ENGINE] = engine
        elif final.eval_duration_ns is None:
            wall = ollama_server_wall_tps(final.eval_count, final.total_duration_ns)
            if wall is not None:
                out[TimingSource.SERVER_WALL] = wall
        return out
