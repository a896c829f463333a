"""Without the `otel` extra, asking for OTLP export is one line naming the extra (exit 2), never a
traceback; not asking for it works as before."""

from __future__ import annotations

import pytest

from tokwatch.cli import main
from tokwatch.settings.config import load_config_text
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.tracing import extra

HINT = "pip install 'tokwatch[otel]'"


@pytest.fixture
def no_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extra, "find_spec", lambda name: None)
    assert not extra.have_otel()


def test_the_installed_extra_is_found() -> None:
    assert extra.have_otel()  # the test extra installs it: CI runs the OTLP tests


def test_bench_flag_without_the_extra_is_one_line(no_extra: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "bench", "--url", "http://127.0.0.1:9/v1", "--model", "m", "--number", "1",
        "--otlp-endpoint", "http://127.0.0.1:4318",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "otlp_endpoint" in err and HINT in err, err


def test_config_section_without_the_extra_is_one_error(no_extra: None) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("otlp: {endpoint: 'http://127.0.0.1:4318'}\n")
    message = str(info.value)
    assert "otlp" in message and HINT in message
    assert load_config_text("otlp: {}\n").otlp.endpoint is None  # off: no extra needed


def test_sim_flag_without_the_extra_is_one_line(
    no_extra: None, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = tmp_path / "sim.yml"
    sim.write_text("servers: [{name: v, dialect: vllm, models: [{name: m}]}]\n")
    code = main(["sim", "--config", str(sim), "--otlp-endpoint", "http://127.0.0.1:4318"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and HINT in err, err
