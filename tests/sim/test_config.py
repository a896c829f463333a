"""sim.yml validation: the example loads; bad input names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.sim.config import load_sim_config, load_sim_config_text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim.yml"


def test_example_config_loads() -> None:
    cfg = load_sim_config(EXAMPLE)
    assert cfg.seed == 42
    vllm = cfg.server("vllm-a")
    assert vllm is not None and vllm.dialect == "vllm"
    fast = vllm.model("fast")
    assert fast is not None and fast.decode_tps == 90 and fast.stall_seconds == 600
    assert {s.dialect for s in cfg.servers} == {"vllm", "llamacpp", "ollama", "openai"}


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load_sim_config_text(text, "sim.yml")
    return str(exc.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "servers:\n  - name: a\n    dialect: vllm\n    modles: []\n",
            "sim.yml:4: servers[0].modles: unknown setting",
        ),
        (
            "servers:\n  - name: a\n    dialect: vllm\n    models:\n      - name: m\n"
            "        decode_tps: -1\n",
            "sim.yml:6: servers[0].models[0].decode_tps: Input should be greater than 0",
        ),
        (
            "servers:\n  - name: a\n    dialect: vllm\n    models:\n      - name: m\n"
            "        ping_interval: soon\n",
            "sim.yml:6: servers[0].models[0].ping_interval: invalid duration 'soon'",
        ),
        (
            "servers:\n  - name: a\n    dialect: vllm\n    models:\n      - name: m\n"
            "        faults: {http_429: 0.6, reset: 0.6}\n",
            "sim.yml:6: servers[0].models[0].faults: fault probabilities sum to 1.2",
        ),
        (
            "servers:\n  - name: a\n    dialect: tgi\n    models: [{name: m}]\n",
            "sim.yml:3: servers[0].dialect:",
        ),
        (
            "servers:\n  - {name: a, dialect: vllm, models: [{name: m}]}\n"
            "  - {name: a, dialect: vllm, models: [{name: m}]}\n",
            "server name 'a' appears twice",
        ),
        (
            "servers:\n  - {name: a, dialect: ollama, legacy_names: true, models: [{name: m}]}\n",
            "legacy_names applies only to dialect vllm",
        ),
        ("servers:\n  - {name: _sim, dialect: vllm, models: [{name: m}]}\n", "servers[0].name: must be"),
        ("servers: [\n", "sim.yml:2: invalid YAML"),
        ("listen: nowhere\nservers: [{name: a, dialect: vllm, models: [{name: m}]}]\n", "must be HOST:PORT"),
        ("seed: 1\n", "sim.yml:1: servers: Field required"),
    ],
)
def test_errors_name_file_line_field(text: str, expected: str) -> None:
    assert expected in _error(text)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_sim_config("/nonexistent/sim.yml")
