"""Per-request setup shared by every dialect: ids, model lookup, fault and cold-load draws, truth record."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from aiohttp import web

from tokwatch.sim.config import ModelProfile
from tokwatch.sim.engine import Engine
from tokwatch.sim.faults import context_exceeded, draw_fault, not_found_model
from tokwatch.sim.generation import Generation
from tokwatch.sim.profile import Limits, TokenPlan, plan_tokens, request_rng
from tokwatch.sim.runtime import ServerState
from tokwatch.sim.text import answer_tokens, count_prompt_tokens, find_answer
from tokwatch.sim.truth import RequestTruth


@dataclass
class SimRequest:
    """One accepted request, ready to be answered."""

    server: ServerState
    profile: ModelProfile
    model_name: str  # as the client spelled it (echoed back)
    rec: RequestTruth
    plan: TokenPlan
    engine: Engine
    fault: str | None
    load_seconds: float
    stream: bool
    include_usage: bool
    created: int
    body_id: str  # 32 hex characters for response ids

    @property
    def request_id(self) -> str:
        """Id of the request (the x-sim-request-id header and the truth key)."""
        return self.rec.request_id

    def generation(self, *, pings: bool) -> Generation:
        """A generation that runs this request through its engine."""
        return Generation(
            self.server,
            self.profile,
            self.rec,
            self.plan,
            self.engine,
            load_seconds=self.load_seconds,
            pings=pings,
        )


def _asked(limits: Limits, profile: ModelProfile) -> int:
    """The output a request asks for (the model's default when it names none)."""
    return limits.max_tokens if limits.max_tokens is not None else profile.default_max_tokens


def _refused(dialect: str, prompt_tokens: int, asked: int, context: int) -> bool:
    """llama-server refuses a prompt that fills its context (a long output just stops at the end of it);
    the OpenAI-style servers refuse a prompt and output that do not fit together."""
    if dialect == "llamacpp":
        return prompt_tokens >= context
    return prompt_tokens + asked > context


def _answer(profile: ModelProfile, prompt_texts: list[str]) -> tuple[str, ...]:
    """The answer table's tokens for this prompt; empty when the table has none for it."""
    answer = find_answer(profile.answers, prompt_texts)
    return answer_tokens(answer) if answer is not None else ()


def open_request(
    server: ServerState,
    route: str,
    *,
    model_name: str | None,
    prompt_texts: list[str],
    limits: Limits,
    stream: bool,
    include_usage: bool = False,
    background: bool = False,
) -> SimRequest | web.Response:
    """Allocate a sequence number and draw everything random for it; an unknown model gives the 404."""
    arrival = time.perf_counter()
    seq = server.next_background_seq() if background else server.next_seq()
    prefix = "bg-" if background else ""
    request_id = f"sim-{server.settings.name}-{prefix}{seq}"
    state = server.model_for(model_name)
    if state is None and server.settings.dialect == "llamacpp":
        # llama-server answers with its one loaded model whatever name the client sends.
        state = server.model_for(None)
    if state is None:
        return not_found_model(server.settings.dialect, model_name or "", request_id)
    profile = state.profile
    stream_key = f"{prefix}{seq}"
    fault = (
        None
        if background
        else draw_fault(state.faults, request_rng(server.seed, server.settings.name, seq, "fault"))
    )
    load_seconds = profile.warm_load_duration
    cold_draw = request_rng(server.seed, server.settings.name, seq, "load").random()
    if server.settings.dialect == "ollama" and cold_draw < profile.cold_load_probability:
        load_seconds = profile.cold_load_duration
    settings = server.settings
    prompt_tokens = round(count_prompt_tokens(prompt_texts) * settings.prompt_token_scale)
    prompt_tokens += settings.chat_template_tokens
    context, dialect = profile.context_tokens, server.settings.dialect
    if context is not None and dialect == "ollama":
        prompt_tokens = min(prompt_tokens, context)  # Ollama keeps the end of a prompt longer than num_ctx
    elif context is not None and _refused(dialect, prompt_tokens, _asked(limits, profile), context):
        return context_exceeded(dialect, prompt_tokens, _asked(limits, profile), context, request_id)
    engine = server.engine_for(seq)
    rec = RequestTruth(
        request_id=request_id,
        server=server.settings.name,
        model=profile.name,
        dialect=server.settings.dialect,
        route=route,
        seq=seq,
        engine=engine.index,
        stream=stream,
        arrival=arrival,
        prompt_tokens=prompt_tokens,
        max_tokens=limits.max_tokens,
        tokens_per_chunk=profile.tokens_per_chunk,
        background=background,
        fault=fault,
        cold=load_seconds > profile.warm_load_duration,
        cached_tokens=server.cached_tokens(prompt_texts, prompt_tokens),
    )
    if not background:
        server.truth.add(rec)
    gap_seed = f"{server.seed}:{server.settings.name}:{stream_key}:gaps"
    think_seed = f"{server.seed}:{server.settings.name}:{stream_key}:think"
    plan = plan_tokens(
        profile, limits, gap_seed, answer=_answer(profile, prompt_texts), think_seed=think_seed
    )
    rec.think_budget, rec.natural_think_tokens = limits.think_budget, plan.natural_think_tokens
    rec.think_end = plan.think_end
    body_id = hashlib.sha256(f"{server.seed}:{request_id}".encode()).hexdigest()[:32]
    return SimRequest(
        server=server,
        profile=profile,
        model_name=model_name or profile.name,
        rec=rec,
        plan=plan,
        engine=engine,
        fault=fault,
        load_seconds=load_seconds,
        stream=stream,
        include_usage=include_usage,
        created=int(time.time()),
        body_id=body_id,
    )
