"""Mutable per-server state of a running simulator: engines, metrics backend, faults, prefix cache."""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokwatch.sim.config import FaultSettings, ModelProfile, ServerSettings, SimConfig
from tokwatch.sim.engine import Engine, EngineObserver
from tokwatch.sim.power import PowerMeter
from tokwatch.sim.server_metrics import MetricsBackend, make_metrics
from tokwatch.sim.text import PROMPT_TOKENS_PER_WORD
from tokwatch.sim.truth import RequestTruth, TruthStore

PREFIX_CACHE_ENTRIES = 4096  # message prefixes remembered (least recently used dropped first)
VLLM_BLOCK = 16


def message_prefixes(texts: Sequence[str]) -> list[tuple[str, int]]:
    """(key, prompt tokens) of every leading run of messages: [m1], [m1, m2], ..., the whole prompt."""
    digest = hashlib.sha256()
    words = 0
    out = []
    for text in texts:
        digest.update(b"\x00" + text.encode())
        words += len(text.split())
        out.append((digest.hexdigest(), max(1, round(words * PROMPT_TOKENS_PER_WORD))))
    return out


@dataclass
class ModelState:
    """One model's profile plus its runtime-replaceable fault probabilities."""

    profile: ModelProfile
    faults: FaultSettings


class ServerState:
    """Everything one simulated server changes at runtime."""

    def __init__(self, settings: ServerSettings, seed: int, truth: TruthStore) -> None:
        self.settings = settings
        self.seed = seed
        self.truth = truth
        self.models = {m.name: ModelState(m, m.faults) for m in settings.models}
        self.metrics: MetricsBackend = make_metrics(settings)
        self.power = PowerMeter(settings.gpu_power) if settings.gpu_power is not None else None
        self._observers = _BothObservers(self)
        self.engines = [
            Engine(i, settings.kv_capacity_tokens, settings.max_running, self)
            for i in range(settings.data_parallel)
        ]
        self._seq = itertools.count()
        self._bg_seq = itertools.count()
        self._prefix: OrderedDict[str, int] = OrderedDict()

    def get(self) -> EngineObserver:
        """The current metrics backend, and the power meter beside it when the server has GPUs (engines hold
        this state as their observer reference)."""
        return self.metrics if self.power is None else self._observers

    def next_seq(self) -> int:
        """Sequence number of the next client request; drives the deterministic RNG streams."""
        return next(self._seq)

    def next_background_seq(self) -> int:
        """Sequence number of the next background request (own stream: probe draws stay deterministic)."""
        return next(self._bg_seq)

    def engine_for(self, seq: int) -> Engine:
        """Data-parallel engines take requests round-robin."""
        return self.engines[seq % len(self.engines)]

    def model_for(self, name: str | None) -> ModelState | None:
        """The model serving `name`; None/empty picks the first, Ollama's implicit `:latest` tag matches."""
        if not name:
            return next(iter(self.models.values()))
        if name in self.models:
            return self.models[name]
        if self.settings.dialect == "ollama":
            alt = name[: -len(":latest")] if name.endswith(":latest") else name + ":latest"
            return self.models.get(alt)
        return None

    def cached_tokens(self, prompt_texts: Sequence[str], prompt_tokens: int) -> int:
        """Prompt tokens served from the prefix cache. The longest run of leading messages that an earlier
        prompt also started with (the whole prompt when repeated; the previous turn's prompt in a
        conversation) is reused: its full blocks (vLLM) or all of it but the prompt's last token (llama.cpp,
        Ollama). Every message prefix of the prompt is remembered for next time."""
        if not self.settings.prefix_caching:
            return 0
        prefixes = message_prefixes(prompt_texts)
        hit = next((tokens for key, tokens in reversed(prefixes) if key in self._prefix), 0)
        for key, tokens in prefixes:
            self._prefix[key] = tokens
            self._prefix.move_to_end(key)
        while len(self._prefix) > PREFIX_CACHE_ENTRIES:
            self._prefix.popitem(last=False)
        reusable = min(hit, prompt_tokens - 1)
        if reusable <= 0:
            return 0
        if self.settings.dialect in ("llamacpp", "ollama"):
            return reusable
        return (reusable // VLLM_BLOCK) * VLLM_BLOCK

    def restart(self) -> None:
        """What a process restart does to observable state: fresh counters and an empty prefix cache."""
        self.metrics = make_metrics(self.settings)
        self._prefix.clear()
        for engine in self.engines:
            engine.republish()


class _BothObservers:
    """Engine events to the server's current metrics backend and to its power meter."""

    def __init__(self, server: ServerState) -> None:
        self._server = server

    def _all(self) -> tuple[EngineObserver, ...]:
        power = self._server.power
        return (self._server.metrics,) if power is None else (self._server.metrics, power)

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        for o in self._all():
            o.on_state(engine, running, waiting, kv_used)

    def on_scheduled(self, engine: int, rec: RequestTruth) -> None:
        for o in self._all():
            o.on_scheduled(engine, rec)

    def on_token(self, engine: int, rec: RequestTruth, running: int, gap: float | None) -> None:
        for o in self._all():
            o.on_token(engine, rec, running, gap)

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        for o in self._all():
            o.on_preempted(engine, rec)

    def on_finished(self, engine: int, rec: RequestTruth) -> None:
        for o in self._all():
            o.on_finished(engine, rec)


@dataclass
class SimState:
    """The whole simulator: config, servers by name and the ground-truth store."""

    config: SimConfig
    truth: TruthStore
    servers: dict[str, ServerState] = field(default_factory=dict)

    @classmethod
    def build(cls, config: SimConfig) -> SimState:
        """Fresh state for `config`."""
        truth = TruthStore(config.truth_capacity)
        state = cls(config, truth)
        for s in config.servers:
            state.servers[s.name] = ServerState(s, config.seed, truth)
        return state
