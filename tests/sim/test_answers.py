"""The simulator's answer table (`answers:`): known answers, the truth accuracy tests score against."""

from __future__ import annotations

import aiohttp
import pytest
from simhelpers import chat_body, read_sse, sim_config

from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.sim.testing import run_sim

CFG = """
servers:
  - name: oa
    dialect: openai
    models:
      - name: m
        decode_tps: 2000
        answers:
          "What is 2 plus 2?": " 4"
          "What is 3 times 3?": "nine, I think"
"""


def _ask(text: str, **extra: object) -> dict[str, object]:
    body = chat_body(max_tokens=8, **extra)
    body["messages"] = [{"role": "user", "content": text}]
    return body


async def _content(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[str, str]:
    async with http.post(f"{url}/oa/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        read = await read_sse(resp)
    deltas = [e["choices"][0] for e in read.events if e.get("choices")]
    text = "".join(c["delta"].get("content") or "" for c in deltas)
    finish = next(c["finish_reason"] for c in deltas if c.get("finish_reason"))
    return text, finish


async def test_a_known_question_gets_its_answer_and_stops(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        assert await _content(http, sim.url, _ask("Question: What is 2 plus 2?\nAnswer:")) == (" 4", "stop")
        # a few-shot prompt: the key found last (the item's own question) answers
        prompt = "Question: What is 2 plus 2?\nAnswer: 4\n\nQuestion: What is 3 times 3?\nAnswer:"
        assert await _content(http, sim.url, _ask(prompt)) == ("nine, I think", "stop")
        truth = sim.last_truth()
        assert truth is not None and truth.tokens == 3  # "nine," " I" " think": one token per word
        # no key in the prompt: the usual words, up to max_tokens
        text, finish = await _content(http, sim.url, _ask("What is 5 plus 5?"))
        assert finish == "length" and text.startswith("The speed")


async def test_ignore_eos_carries_on_past_the_answer_to_max_tokens(http: aiohttp.ClientSession) -> None:
    async with run_sim(sim_config(CFG)) as sim:
        text, finish = await _content(http, sim.url, _ask("What is 2 plus 2?", ignore_eos=True))
    assert finish == "length" and text.startswith(" 4 ") and len(text.split()) == 8


def test_an_empty_answer_is_refused() -> None:
    with pytest.raises(ConfigError, match="answers"):
        sim_config(CFG.replace('" 4"', '"  "'))
