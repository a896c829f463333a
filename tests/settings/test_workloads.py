"""Workloads and sites in tokwatch.yml: presets, overrides per endpoint, own schedules, and the errors a
workload that cannot fit, a clashing site label or a bad name get (file, line, field)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tokwatch.cli import main
from tokwatch.figures.series import DEFAULT_WORKLOAD
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.settings.workloads import PRESETS

EP = "{name: %s, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m%s}"


def _config(probe: str = "", endpoints: tuple[str, ...] = ("a",), extra: str = "", top: str = "") -> str:
    eps = "\n".join(f"  - {EP % (name, extra)}" for name in endpoints)
    return f"{top}\nprobe: {{{probe}}}\nendpoints:\n{eps}\n"


def errors_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "t.yml")
    return str(info.value)


def test_seed000_alone_is_the_default_so_existing_configs_measure_what_they_did() -> None:
    cfg = load_config_text(_config())
    (w,) = cfg.workloads_for(cfg.endpoints[0])
    assert w.name == DEFAULT_WORKLOAD == "seed000" and not w.sized
    assert w.max_tokens(cfg.probe.max_tokens) == 256  # the configured prompt and max_tokens
    assert cfg.site is None and cfg.site_name == ""


def test_presets_match_the_public_tiers() -> None:
    sizes = {name: (w.input_tokens, w.output_tokens) for name, w in PRESETS.items()}
    assert sizes == {
        "seed000": (None, None),
        "short": (100, 300),
        "medium": (1000, 1000),
        "long": (10000, 1500),
    }


def test_a_preset_by_name_and_with_fields_changed_and_an_own_workload() -> None:
    text = _config(
        "workloads: [seed000, short, {name: long, input_tokens: 1500, interval: 6h},"
        " {name: rag, input_tokens: 4000, output_tokens: 200, timeout: 5m}]"
    )
    cfg = load_config_text(text)
    by = {w.name: w for w in cfg.probe.workloads}
    assert list(by) == ["seed000", "short", "long", "rag"]
    assert (by["long"].input_tokens, by["long"].output_tokens) == (1500, 1500)  # the preset's output kept
    assert by["long"].schedule(3600, 1800) == (21600, 1800)  # own interval, the main offset
    assert by["short"].schedule(3600, 1800) == (3600, 1800)  # the main schedule
    assert by["rag"].timeout_for(30.0, 256) == 300.0
    # without its own timeout, the endpoint's (meant for 256 tokens) grows with the output asked for
    assert by["long"].timeout_for(30.0, 256) == pytest.approx(30.0 * 1500 / 256)
    assert by["seed000"].timeout_for(30.0, 256) == 30.0


def test_an_endpoint_overrides_the_workloads() -> None:
    cfg = load_config_text(
        "probe: {workloads: [short, medium]}\nendpoints:\n"
        f"  - {EP % ('a', '')}\n"
        f"  - {EP % ('b', ', workloads: [seed000, long]')}\n"
    )
    a, b = cfg.endpoints
    assert [w.name for w in cfg.workloads_for(a)] == ["short", "medium"]
    assert [w.name for w in cfg.workloads_for(b)] == ["seed000", "long"]
    assert cfg.workload_for(b, "long") is not None and cfg.workload_for(b, "short") is None


@pytest.mark.parametrize(
    ("probe", "message"),
    [
        ("workloads: [huge]", "probe.workloads[0]: workload 'huge' is not a preset (seed000, short, medium"),
        ("workloads: [{name: seed000, input_tokens: 10}]", "workload seed000 sends the configured prompt"),
        ("workloads: [short, short]", "probe.workloads: workload 'short' appears twice"),
        ("workloads: []", "probe.workloads: needs at least one workload"),
        ("workloads: [{name: Long-Prompt, input_tokens: 5, output_tokens: 5}]", "a workload name is 1-32"),
        ("workloads: [{name: x, input_tokens: 5, output_tokens: 5, offset: 1m}]", "offset needs the"),
        ("workloads: [{name: long, interval: 1h, offset: 2h}]", "offset (7200s) must be shorter than"),
        ("workloads: [{name: short, colour: red}]", "probe.workloads[0].colour: unknown setting"),
    ],
)
def test_bad_workloads_name_the_setting(probe: str, message: str) -> None:
    assert message in errors_of(_config(probe)), errors_of(_config(probe))


def test_a_workload_that_cannot_fit_a_known_context_is_a_config_error() -> None:
    text = _config("workloads: [seed000, long]", extra=", context_tokens: 8192")
    error = errors_of(text)
    assert "endpoints[0] (a): workload long needs 10000 input + 1500 output tokens" in error
    assert "more than its context_tokens 8192" in error
    # shrunk to fit, or given its own workloads, the endpoint is fine
    load_config_text(_config("workloads: [{name: long, input_tokens: 6000}]", extra=", context_tokens: 8192"))
    load_config_text(_config("workloads: [long]", extra=", context_tokens: 8192, workloads: [short]"))
    assert "workload seed000 needs 256 output tokens" in errors_of(_config(extra=", context_tokens: 100"))


def test_site_labels_every_series_and_must_not_clash_with_a_static_label() -> None:
    cfg = load_config_text(_config(top="site: eu-west"))
    assert cfg.site_name == "eu-west"
    assert "site: must be 1-64 characters" in errors_of(_config(top="site: 'eu west'"))
    clash = _config(top="site: eu-west", extra=", labels: {site: lab}")
    assert "endpoints[0] (a): labels.site clashes with the top-level site 'eu-west'" in errors_of(clash)
    # without a top-level site, a static `site` label stays what it was
    assert load_config_text(_config(extra=", labels: {site: lab}")).endpoints[0].labels == {"site": "lab"}
    assert "label name 'workload' is reserved" in errors_of(_config(extra=", labels: {workload: x}"))


def test_cache_preamble_and_tolerance_settings() -> None:
    cfg = load_config_text(_config("cache_preamble_tokens: 32", extra=", cache_preamble_tokens: 96"))
    assert cfg.probe.prompt_tolerance == 0.10
    assert cfg.probe_for(cfg.endpoints[0]).cache_preamble_tokens == 96
    assert "prompt_tolerance: Input should be less than 1" in errors_of(_config("prompt_tolerance: 1.5"))


def test_a_tokenizer_that_cannot_load_is_a_config_error_at_check_and_reload(
    tmp_path: Path, tokenizer_json: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _config("workloads: [short]", extra=f", tokenizer: '{tokenizer_json}'")
    bad = _config("workloads: [short]", extra=f", tokenizer: '{tmp_path / 'missing.json'}'")
    path = tmp_path / "tokwatch.yml"
    path.write_text(bad)
    assert main(["check-config", str(path)]) == 2
    assert "endpoint a: tokenizer:" in capsys.readouterr().err
    path.write_text(good)
    assert main(["check-config", str(path)]) == 0

    async def reload_to_bad() -> tuple[bool, str]:
        app = App(load_config_text(good), str(path))
        path.write_text(bad)
        try:
            return await app.reload()
        finally:
            assert [w.name for w in app.config.workloads_for(app.config.endpoints[0])] == ["short"]
            assert app.config.endpoints[0].tokenizer == tokenizer_json  # the running config stays

    ok, message = asyncio.run(reload_to_bad())
    assert not ok and "endpoint a: tokenizer:" in message and "missing.json" in message
