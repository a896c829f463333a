"""Every fault over real HTTP: status codes and bodies, mid-stream errors, stall, reset, admin changes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.sim.testing import run_sim

CFG = """
seed: 11
servers:
  - name: v
    dialect: vllm
    models: [{name: m, decode_tps: 2000, fault_after_tokens: 2, stall_seconds: 30s}]
  - name: o
    dialect: openai
    models: [{name: m, decode_tps: 2000}]
  - name: l
    dialect: llamacpp
    models: [{name: m, decode_tps: 2000, fault_after_tokens: 1}]
  - name: ol
    dialect: ollama
    models: [{name: m, decode_tps: 2000, fault_after_tokens: 1}]
"""


@pytest.mark.parametrize(
    ("fault", "statuses"),
    [("http_401", {401}), ("http_403", {403}), ("http_429", {429}), ("http_5xx", {500, 502, 503})],
)
@pytest.mark.parametrize("server", ["v", "o", "l"])
async def test_http_faults_openai_shapes(
    http: aiohttp.ClientSession, fault: str, statuses: set[int], server: str
) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults(server, "m", **{fault: 1.0})
        async with http.post(f"{sim.url}/{server}/v1/chat/completions", json=chat_body()) as resp:
            status, body = resp.status, await resp.json()
            retry_after = resp.headers.get("Retry-After")
            truth = sim.truth(resp.headers["x-sim-request-id"])
    assert status in statuses
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str)
    assert {"message", "type", "code"} <= set(body["error"])
    assert (retry_after is not None) == (status == 429)
    assert truth is not None and truth.fault == fault and truth.http_status == status and truth.tokens == 0


async def test_http_fault_ollama_shape(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults("ol", "m", http_429=1.0)
        async with http.post(f"{sim.url}/ol/api/chat", json={"model": "m", "messages": []}) as resp:
            assert resp.status == 429
            body = await resp.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)


async def test_error_mid_stream_after_200(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults("v", "m", error_mid_stream=1.0)
        async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=6)) as resp:
            assert resp.status == 200
            read = await read_sse(resp)
        sim.set_faults("ol", "m", error_mid_stream=1.0)
        async with http.post(f"{sim.url}/ol/api/chat", json={"model": "m", "messages": []}) as resp:
            lines = [json.loads(x) for x in (await resp.text()).splitlines()]
        async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(stream=False)) as resp:
            buffered = resp.status
    # role chunk, two content chunks (fault_after_tokens: 2), then the error event and no [DONE]
    assert len(read.events) == 4 and "error" in read.events[-1] and not read.done
    assert read.events[-1]["error"]["code"] == 500
    assert lines[-1] == {"error": "an error was encountered while running the model"} and len(lines) == 2
    assert buffered == 500


async def test_malformed_json_and_wrong_shape(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults("o", "m", malformed_json=1.0)
        async with http.post(f"{sim.url}/o/v1/chat/completions", json=chat_body(stream=False)) as resp:
            assert resp.status == 200
            text = await resp.text()
        async with http.post(f"{sim.url}/o/v1/chat/completions", json=chat_body()) as resp:
            raw = (await resp.read()).decode()
        sim.set_faults("o", "m", wrong_shape=1.0)
        async with http.post(f"{sim.url}/o/v1/chat/completions", json=chat_body(stream=False)) as resp:
            shaped = await resp.json()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    last_data = [ln for ln in raw.splitlines() if ln.startswith("data: ")][-1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(last_data[len("data: ") :])
    assert "choices" in shaped and not isinstance(shaped["choices"], list)


async def test_reset_aborts_connection(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults("v", "m", reset=1.0)
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(max_tokens=6)) as resp:
                await resp.read()
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{sim.url}/v/v1/chat/completions", json=chat_body(stream=False)) as resp:
                await resp.read()
        truth = sim.last_truth("v")
    assert truth is not None and truth.fault == "reset" and not truth.completed


async def test_stall_is_cancellable(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        sim.set_faults("v", "m", stall=1.0)
        url = f"{sim.url}/v/v1/chat/completions"
        async with http.post(url, json=chat_body(max_tokens=6)) as resp:
            assert resp.status == 200
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(read_sse(resp), timeout=0.5)
        engine = sim.server("v").engines[0]
        for _ in range(100):  # the handler is cancelled when the client goes away
            if not engine.running:
                break
            await asyncio.sleep(0.02)
        assert not engine.running
        truth = sim.last_truth("v")
        assert truth is not None and truth.tokens == 2 and not truth.completed
        with pytest.raises(asyncio.TimeoutError):
            async with asyncio.timeout(0.3):
                async with http.post(url, json=chat_body(stream=False)) as resp:
                    await resp.read()
    # leaving run_sim with a stalled handler still returns promptly (handlers are cancelled)


async def test_admin_routes(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        admin = f"{sim.url}/_sim/servers/o/models/m/faults"
        async with http.post(admin, json={"http_429": 1.0}) as resp:
            assert resp.status == 200 and (await resp.json())["faults"]["http_429"] == 1.0
        async with http.post(f"{sim.url}/o/v1/chat/completions", json=chat_body()) as resp:
            limited = resp.status
        async with http.post(admin, json={}) as resp:
            assert resp.status == 200
        async with http.post(f"{sim.url}/o/v1/chat/completions", json=chat_body(stream=False)) as resp:
            rid = resp.headers["x-sim-request-id"]
            healthy = resp.status
        async with http.get(f"{sim.url}/_sim/requests/{rid}") as resp:
            truth = await resp.json()
        async with http.post(admin, json={"http_429": 0.8, "reset": 0.8}) as resp:
            too_much = (resp.status, await resp.json())
        async with http.post(admin, json={"bogus": 0.1}) as resp:
            unknown = (resp.status, await resp.json())
        async with http.post(f"{sim.url}/_sim/servers/o/models/zzz/faults", json={}) as resp:
            no_model = resp.status
        async with http.get(f"{sim.url}/_sim/requests/nope") as resp:
            no_truth = resp.status
    assert limited == 429 and healthy == 200
    assert truth["request_id"] == rid and truth["tokens"] == 8 and len(truth["generated_at"]) == 8
    assert too_much[0] == 400 and "sum to" in too_much[1]["error"]
    assert unknown[0] == 400 and "bogus: unknown fault" in unknown[1]["error"]
    assert no_model == 404 and no_truth == 404


async def test_fault_draws_are_deterministic() -> None:
    cfg = sim_config(CFG.replace("stall_seconds: 30s}", "stall_seconds: 30s, faults: {http_429: 0.5}}"))
    outcomes: list[list[int]] = []
    for _ in range(2):
        async with run_sim(cfg) as sim, aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(12):
                async with http.post(
                    f"{sim.url}/v/v1/chat/completions", json=chat_body(stream=False)
                ) as resp:
                    statuses.append(resp.status)
                    await resp.read()
            outcomes.append(statuses)
    assert outcomes[0] == outcomes[1]
    assert {200, 429} == set(outcomes[0])
