"""The engine scheduler on its own: admission limits, KV preemption order, resumption."""

from __future__ import annotations

import asyncio

from tokwatch.sim.engine import Engine, EngineObserver, Sequence
from tokwatch.sim.server_metrics import NoMetrics
from tokwatch.sim.truth import RequestTruth


class _Counting(NoMetrics):
    def __init__(self) -> None:
        self.preempted: list[str] = []
        self.states: list[tuple[int, int, int]] = []

    def on_preempted(self, engine: int, rec: RequestTruth) -> None:
        self.preempted.append(rec.request_id)

    def on_state(self, engine: int, running: int, waiting: int, kv_used: int) -> None:
        self.states.append((running, waiting, kv_used))


class _Ref:
    def __init__(self, obs: _Counting) -> None:
        self.obs = obs

    def get(self) -> EngineObserver:
        return self.obs


def _seq(name: str, kv: int) -> Sequence:
    return Sequence(RequestTruth(name, "s", "m", "vllm", "/", 0, 0, True, 0.0, kv, None, 1), kv=kv)


async def test_admission_limit_and_fifo() -> None:
    obs = _Counting()
    engine = Engine(0, None, 1, _Ref(obs))
    a, b = _seq("a", 5), _seq("b", 5)
    await asyncio.wait_for(engine.admit(a), 1)
    waiter = asyncio.create_task(engine.admit(b))
    await asyncio.sleep(0)
    assert not b.running and list(engine.waiting) == [b]
    engine.release(a)
    await asyncio.wait_for(waiter, 1)
    assert b.running and obs.states[-1] == (1, 0, 5)


async def test_newest_is_preempted_and_resumes() -> None:
    obs = _Counting()
    engine = Engine(0, 20, 8, _Ref(obs))
    old, new = _seq("old", 9), _seq("new", 9)
    await engine.admit(old)
    await engine.admit(new)
    engine.on_token(old, None)
    engine.on_token(old, 0.01)
    engine.on_token(old, 0.01)  # 12 + 9 = 21 > 20
    assert obs.preempted == ["new"] and not new.running and new.rec.preemptions == 1
    assert engine.kv_used == 12 and engine.waiting[0] is new
    resumed = asyncio.create_task(engine.wait_running(new))
    await asyncio.sleep(0)
    assert not resumed.done()
    engine.release(old)
    await asyncio.wait_for(resumed, 1)
    assert new.running and engine.kv_used == 9


async def test_lone_request_is_never_preempted() -> None:
    obs = _Counting()
    engine = Engine(0, 4, 8, _Ref(obs))
    only = _seq("only", 10)  # bigger than the whole cache: admitted because the engine is empty
    await asyncio.wait_for(engine.admit(only), 1)
    engine.on_token(only, None)
    assert only.running and obs.preempted == []
