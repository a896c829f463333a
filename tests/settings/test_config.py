"""Config loading: typed models, defaults from seed 000, and errors naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokwatch.cli import main
from tokwatch.probes import metrics_url
from tokwatch.settings.config import load_config, load_config_text, server_root
from tokwatch.settings.setting_values import parse_duration
from tokwatch.settings.strict_yaml import ConfigError

BASE = """
endpoints:
  - name: local
    kind: openai
    base_url: http://127.0.0.1:8000/v1
    model: m
"""


def errors_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "t.yml")
    return str(info.value)


def test_defaults_follow_seed_000() -> None:
    cfg = load_config_text(BASE)
    assert cfg.probe.prompt == "Explain theory of relativity simply"
    assert cfg.probe.temperature == 0 and cfg.probe.max_tokens == 256 and cfg.probe.system_prompt is None
    assert cfg.probe.warmup is True
    assert cfg.schedule.interval == 3600 and cfg.schedule.offset == 1800
    # sequential within a server (as the seed's one-after-another), servers side by side
    assert cfg.schedule.per_server == 1 and cfg.schedule.parallelism == 4
    assert [s.value for s in cfg.probe.timing_preference] == [
        "engine",
        "vllm_metrics",
        "server_wall",
        "client_stream",
        "client_wall",
    ]
    assert cfg.endpoints[0].effective_timeout == 30.0  # loopback


def test_remote_endpoint_gets_60s_and_private_30s() -> None:
    cfg = load_config_text(
        BASE
        + "  - {name: cloud, kind: openai, base_url: 'https://api.example.com/v1', model: m}\n"
        + "  - {name: lan, kind: ollama, base_url: 'http://192.168.1.5:11434', model: m}\n"
    )
    assert cfg.endpoint("cloud").effective_timeout == 60.0  # type: ignore[union-attr]
    assert cfg.endpoint("lan").effective_timeout == 30.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "seconds"), [("500ms", 0.5), ("30s", 30), ("15m", 900), ("1h", 3600), ("7d", 604800), (12, 12)]
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


def test_unknown_key_names_file_line_and_field() -> None:
    msg = errors_of(BASE + "    bogus: 1\n")
    assert msg == "t.yml:7: endpoints[0].bogus: unknown setting"


def test_bad_value_names_line() -> None:
    msg = errors_of(BASE.replace("kind: openai", "kind: tgi"))
    assert msg.startswith("t.yml:4: endpoints[0].kind: Input should be")


def test_cross_field_errors() -> None:
    assert "offset (7200s) must be shorter than interval (3600s)" in errors_of(
        "schedule: {interval: 1h, offset: 2h}\n"
    )
    assert "repeats the name 'local'" in errors_of(BASE + BASE.split("endpoints:\n")[1])
    msg = errors_of(BASE + "    api_key_env: A\n    api_key_file: /x\n")
    assert "set only one of api_key, api_key_env and api_key_file" in msg
    assert "reserved by tokwatch" in errors_of(BASE + "    labels: {status: x}\n")
    for name in ("window", "percentile"):  # labels of the window families
        assert "reserved by tokwatch" in errors_of(BASE + f"    labels: {{{name}: x}}\n")


def test_invalid_yaml_names_line() -> None:
    assert errors_of("endpoints:\n  - name: [\n").startswith("t.yml:3: invalid YAML")


def test_duplicate_key_is_an_error() -> None:
    assert "duplicate key 'listen'" in errors_of("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n")


def test_env_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_KEY", "sk-secret-value")
    cfg = load_config_text(BASE + "    api_key: ${TW_KEY}\n")
    assert cfg.endpoints[0].resolve_api_key() == "sk-secret-value"
    assert "sk-secret-value" not in repr(cfg)  # SecretStr
    assert errors_of(BASE + "    api_key: ${TW_MISSING}\n") == (
        "t.yml:7: endpoints[0].api_key: environment variable TW_MISSING is not set"
    )
    assert load_config_text(BASE.replace("model: m", "model: ${TW_MISSING:-fallback}")).endpoints[
        0
    ].model == ("fallback")


def test_api_key_from_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-from-file\n")
    cfg = load_config_text(BASE + f"    api_key_file: {key}\n")
    assert cfg.endpoints[0].resolve_api_key() == "sk-from-file"


def test_metrics_url_default_strips_v1() -> None:
    assert server_root("http://h:1/vllm-a/v1/") == "http://h:1/vllm-a"
    cfg = load_config_text(BASE.replace("kind: openai", "kind: vllm"))
    assert metrics_url(cfg.endpoints[0]) == "http://127.0.0.1:8000/metrics"
    assert metrics_url(load_config_text(BASE).endpoints[0]) is None


def test_probe_overrides_per_endpoint() -> None:
    cfg = load_config_text(BASE + "    stream: false\n    max_tokens: 32\n")
    settings = cfg.probe_for(cfg.endpoints[0])
    assert settings.stream is False and settings.max_tokens == 32 and cfg.probe.max_tokens == 256


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config("/nonexistent/tokwatch.yml")


def test_check_config_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yml"
    good.write_text(BASE)
    assert main(["check-config", str(good)]) == 0
    assert "ok (1 endpoint, 1 enabled)" in capsys.readouterr().out  # not "1 endpoints"
    bad = tmp_path / "bad.yml"
    bad.write_text(BASE + "    timeout: soon\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:7: endpoints[0].timeout: invalid duration 'soon'" in err
    assert "Traceback" not in err


def test_check_config_reports_missing_key_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "k.yml"
    f.write_text(BASE + "    api_key_env: TW_NOT_SET_ANYWHERE\n")
    assert main(["check-config", str(f)]) == 2
    assert "environment variable TW_NOT_SET_ANYWHERE is not set" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        ("schedule: {interval: .nan}", "interval", "must be finite"),
        ("schedule: {interval: .inf}", "interval", "must be finite"),
        ("schedule: {window: 0}", "window", "above zero"),
        ("schedule: {window: 0s}", "window", "above zero"),
        ("storage: {write_timeout: -1}", "write_timeout", "cannot be negative"),
    ],
)
def test_durations_must_be_finite_and_above_zero(section: str, value: str, message: str) -> None:
    text = section + "\nendpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}]\n"
    err = errors_of(text)
    assert "t.yml:1" in err and value in err and message in err


def test_an_endpoint_timeout_of_zero_is_refused_with_its_line() -> None:
    text = (
        "endpoints:\n  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m, timeout: 0}\n"
    )
    err = errors_of(text)
    assert "t.yml:2" in err and "timeout" in err and "above zero" in err


def test_an_offset_of_zero_is_fine() -> None:
    text = "schedule: {offset: 0s}\nendpoints: []\n"
    assert load_config_text(text, "t.yml").schedule.offset == 0


def test_metrics_export_one_window_and_no_opt_ins_by_default() -> None:
    config = load_config_text("")
    assert config.exported_windows == (86400.0,)
    assert not config.metrics.histograms and not config.metrics.diagnostics
    # the primary window follows schedule.window when metrics.windows is not given
    assert load_config_text("schedule: {window: 7d}").exported_windows == (604800.0,)
    assert load_config_text("metrics: {windows: [7d, 30m]}").exported_windows == (1800.0, 604800.0)


def test_metrics_windows_must_be_configured_windows() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("schedule: {windows: [30m, 7d]}\nmetrics: {windows: [24h, 1h]}\n")
    assert "metrics.windows: 1h is not a configured window" in str(info.value)
    assert "30m, 24h, 7d" in str(info.value)
    with pytest.raises(ConfigError, match="histogram"):
        load_config_text("metrics: {histogram: true}\n")  # a misspelt knob is an error, not ignored


EDGE_ENDPOINT = "endpoints:\n  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schedule: {interval: 99999999999999999999h}\n", "t.yml:1: schedule.interval: duration"),
        ("schedule: {interval: 31d}\n", "longer than the longest taken here (30 days)"),
        ("probe: {max_tokens: true}\n", "t.yml:1: probe.max_tokens: expected a number, not the boolean true"),
        ("probe: {max_plausible_tokens_per_second: .inf}\n", "must be a finite number, not inf"),
        ("probe: {max_plausible_tokens_per_second: .nan}\n", "must be a finite number, not nan"),
        ("storage: {queue_size: 1.0e+23}\n", "t.yml:1: storage.queue_size: expected a whole number"),
        ("storage: {queue_size: 1e23}\n", "t.yml:1: storage.queue_size:"),
        ("storage: {queue_size: 100000000000}\n", "storage.queue_size: Input should be less than or equal"),
    ],
)
def test_edges_are_refused_with_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(text + EDGE_ENDPOINT, "t.yml")
    assert expected in str(err.value)


def test_horizons_may_be_long_but_not_endless() -> None:
    cfg = load_config_text(
        "storage: {retention: 800d}\nschedule: {windows: [90d]}\n" + EDGE_ENDPOINT, "t.yml"
    )
    assert cfg.storage.retention == 800 * 86400 and cfg.schedule.windows == (90 * 86400,)
    with pytest.raises(ConfigError, match=r"storage\.retention: duration"):
        load_config_text("storage: {retention: 99999999999999999999h}\n" + EDGE_ENDPOINT, "t.yml")


def test_a_yaml_alias_bomb_is_refused_before_it_is_built() -> None:
    """Six levels of ten aliases would be 10**6 leaves; refused at the line of the node that passes the
    bound, in well under a second of counting (each node counted once)."""
    lines = ["a: &a [" + ",".join(["x"] * 10) + "]"]
    for prev, name in zip("abcde", "bcdef", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(ConfigError, match=r"t.yml:\d+: YAML aliases expand this document to more than"):
        load_config_text("\n".join(lines) + "\n", "t.yml")
    # A few aliases are fine.
    cfg = load_config_text(
        "endpoints:\n  - {name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: &m m}\n"
        "  - {name: b, kind: openai, base_url: 'http://127.0.0.1:2/v1', model: *m}\n",
        "t.yml",
    )
    assert [e.model for e in cfg.endpoints] == ["m", "m"]


async def test_a_reload_parses_the_config_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import tokwatch.service.app
    from tokwatch.service.app import App

    path = tmp_path / "t.yml"
    path.write_text("storage: {enabled: false}\n" + EDGE_ENDPOINT)
    app = App(load_config(str(path)), str(path))
    threads: list[str] = []

    def recording(p: str) -> object:
        threads.append(threading.current_thread().name)
        return load_config(p)

    monkeypatch.setattr(tokwatch.service.app, "load_config", recording)
    path.write_text("storage: {enabled: false}\nprobe: {max_tokens: 16}\n" + EDGE_ENDPOINT)
    ok, _ = await app.reload()
    assert ok and threads and threads[0] != threading.current_thread().name
