"""Prices from the config, a price table and OpenRouter's models list: which wins, field by field, and every
bad value a one-line error naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokwatch.settings.pricing import (
    Pricing,
    PricingSettings,
    read_openrouter_models,
    read_price_table,
    resolve_pricing,
)
from tokwatch.settings.strict_yaml import ConfigError, validate_yaml

# A slice of OpenRouter's GET /api/v1/models answer in its published shape (USD per token as decimal
# strings; "-1" marks a router whose price varies), trimmed to the fields tokwatch reads.
OPENROUTER = {
    "data": [
        {"id": "openai/gpt-4o", "pricing": {"prompt": "0.0000025", "completion": "0.00001",
                                             "input_cache_read": "0.00000125"}},
        {"id": "meta-llama/llama-3.1-8b-instruct",
         "pricing": {"prompt": "0.00000002", "completion": "0.00000005"}},
        {"id": "openrouter/auto", "pricing": {"prompt": "-1", "completion": "-1"}},
        {"id": "broken", "pricing": {"prompt": "n/a", "completion": "0.1"}},
        {"name": "no id"},
    ]
}


def test_openrouter_prices_per_token_become_prices_per_million_tokens() -> None:
    prices = read_openrouter_models(json.dumps(OPENROUTER), "models.json")
    assert set(prices) == {"openai/gpt-4o", "meta-llama/llama-3.1-8b-instruct"}
    gpt = prices["openai/gpt-4o"]
    assert (gpt.input_per_mtok, gpt.output_per_mtok, gpt.cached_input_per_mtok) == (2.5, 10.0, 1.25)
    assert prices["meta-llama/llama-3.1-8b-instruct"].cached_input_per_mtok is None


def test_a_file_that_is_not_a_models_list_is_one_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^models.json: expected OpenRouter's models list"):
        read_openrouter_models('{"models": []}', "models.json")
    with pytest.raises(ConfigError, match=r"^models.json: not JSON"):
        read_openrouter_models("<html>", "models.json")


def test_a_price_table_names_the_line_and_field_of_a_bad_price(tmp_path: Path) -> None:
    table = read_price_table("llama-70b:\n  gpu_hour: 2.0\n  gpus: 4\n  kwh: 0.12\n", "prices.yml")
    assert table["llama-70b"].hourly == 8.0
    with pytest.raises(ConfigError) as bad:
        read_price_table("a:\n  input_per_mtok: 1\nb:\n  output_per_mtok: -3\n", "prices.yml")
    assert str(bad.value).startswith("prices.yml:4: b.output_per_mtok:")
    with pytest.raises(ConfigError, match=r"prices.yml:2: a.gpus: expected a number, not the boolean true"):
        read_price_table("a:\n  gpus: true\n  gpu_hour: 1\n", "prices.yml")
    with pytest.raises(ConfigError, match=r"prices.yml:2: a.kwh: .*finite"):
        read_price_table("a:\n  kwh: .inf\n", "prices.yml")
    with pytest.raises(ConfigError, match=r"prices.yml:2: a.input_per_mtok: .*not true/false"):
        read_price_table("a:\n  input_per_mtok: true\n", "prices.yml")


def test_the_endpoints_own_prices_win_field_by_field_then_models_then_each_source() -> None:
    settings = PricingSettings(models={"m": Pricing(input_per_mtok=1.0, output_per_mtok=2.0, kwh=0.2)})
    table = {"m": Pricing(cached_input_per_mtok=0.5, input_per_mtok=9.0)}
    own = Pricing(output_per_mtok=3.0)
    found = resolve_pricing(own, "m", settings, table)
    assert found is not None
    assert (found.input_per_mtok, found.output_per_mtok, found.cached_input_per_mtok, found.kwh) == (
        1.0, 3.0, 0.5, 0.2)
    assert resolve_pricing(None, "unknown", settings, table) is None


def test_prices_in_another_currency_are_not_mixed_into_an_endpoints_own() -> None:
    own = Pricing(input_per_mtok=1.0, currency="EUR")
    other = Pricing(output_per_mtok=2.0, currency="USD")
    found = resolve_pricing(own, "m", PricingSettings(), {"m": other})
    assert found is not None and found.currency == "EUR" and found.output_per_mtok is None


def test_the_pricing_block_checks_its_blend_and_self_hosted_fields() -> None:
    assert validate_yaml("blend: '10:1'\n", "t.yml", PricingSettings).blend_parts == (10.0, 1.0)
    with pytest.raises(ConfigError, match=r"^t.yml:1: blend: must be INPUT:OUTPUT"):
        validate_yaml("blend: three\n", "t.yml", PricingSettings)
    with pytest.raises(ConfigError, match=r"gpu_hour .* or node_hour, not both"):
        validate_yaml("models:\n  m:\n    gpu_hour: 1\n    node_hour: 2\n", "t.yml", PricingSettings)
    with pytest.raises(ConfigError, match="gpus needs gpu_hour"):
        validate_yaml("models:\n  m:\n    gpus: 2\n", "t.yml", PricingSettings)
    with pytest.raises(ConfigError, match="three-letter"):
        validate_yaml("models:\n  m:\n    currency: dollars\n", "t.yml", PricingSettings)


def _endpoint_config(extra: str, top: str = "") -> str:
    return (
        f"{top}endpoints:\n"
        "  - name: a\n    kind: openai\n    base_url: http://127.0.0.1:1\n    model: m\n"
        f"{extra}"
    )


def test_endpoint_pricing_and_power_settings_are_one_line_errors_naming_file_line_and_field() -> None:
    from tokwatch.settings.config import load_config_text

    cfg = load_config_text(
        _endpoint_config(
            "    pricing: {gpu_hour: 2.5, gpus: 2, kwh: 0.1}\n"
            "    power_metrics_url: http://127.0.0.1:9400/metrics\n    power_scrape_interval: 200ms\n",
            "pricing: {openrouter_url: 'http://127.0.0.1:8/api/v1/models', refresh: 6h, blend: '2:1'}\n",
        ),
        "t.yml",
    )
    ep = cfg.endpoints[0]
    assert ep.pricing is not None and ep.pricing.hourly == 5.0 and ep.power_scrape_interval == 0.2
    assert cfg.pricing.refresh == 6 * 3600 and cfg.pricing.blend_parts == (2.0, 1.0)
    assert cfg.pricing.sources == ("openrouter",)
    bad = {
        "    power_metrics_url: 127.0.0.1:9400\n": r"^t.yml:6: endpoints\[0\].power_metrics_url: .*http://",
        "    power_scrape_interval: 11s\n": r"^t.yml:6: endpoints\[0\].power_scrape_interval: .*between",
        "    pricing: {gpus: 2}\n": r"^t.yml:6: endpoints\[0\].pricing: .*gpus needs gpu_hour",
    }
    for extra, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_config_text(_endpoint_config(extra), "t.yml")
    both = "pricing:\n  openrouter_file: m.json\n  openrouter_url: http://127.0.0.1:8/m\n"
    with pytest.raises(ConfigError, match=r"^t.yml:1: pricing: .*not both"):
        load_config_text(_endpoint_config("", both), "t.yml")
    with pytest.raises(ConfigError, match=r"^t.yml:2: pricing.refresh: .*at least 1m"):
        load_config_text(_endpoint_config("", "pricing:\n  refresh: 10s\n"), "t.yml")


def test_a_missing_or_bad_price_file_stops_the_exporter_with_one_line_naming_it(tmp_path: Path) -> None:
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config_text

    missing = tmp_path / "none.yml"
    with pytest.raises(ConfigError, match=rf"^{missing}: no such file$"):
        App(load_config_text(_endpoint_config("", f"pricing: {{table: '{missing}'}}\n")))
    bad = tmp_path / "models.json"
    bad.write_text("<html>", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{bad}: not JSON"):
        App(load_config_text(_endpoint_config("", f"pricing: {{openrouter_file: '{bad}'}}\n")))
    table = tmp_path / "prices.yml"
    table.write_text("m:\n  input_per_mtok: 1\n  output_per_mtok: 2\n", encoding="utf-8")
    app = App(load_config_text(_endpoint_config("", f"pricing: {{table: '{table}'}}\n")))
    priced = app.probes.pricing("a")
    assert priced is not None and priced[1] == "table" and priced[0].output_per_mtok == 2.0


def test_an_endpoint_priced_by_the_hour_first_takes_no_per_token_price_from_below() -> None:
    from tokwatch.settings.pricing import resolve_priced

    settings = PricingSettings.model_validate({"models": {"m": {"input_per_mtok": 2, "output_per_mtok": 8}}})
    own = Pricing(gpu_hour=2.0, gpus=4)
    priced = resolve_priced(own, "m", settings, {"m": Pricing(kwh=0.1)}, {})
    assert priced is not None and priced[1] == "config"
    assert priced[0].token_price() is None and priced[0].hourly == 8.0 and priced[0].kwh == 0.1
    hosted = resolve_priced(None, "m", settings, {}, {})
    assert hosted is not None and hosted[0].token_price() is not None


def test_check_config_reads_the_price_files_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokwatch.cli import main

    table = tmp_path / "prices.yml"
    table.write_text("m:\n  input_per_mtok: 1\n  output_per_mtok: -2\n", encoding="utf-8")
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(_endpoint_config("", f"pricing: {{table: '{table}'}}\n"), encoding="utf-8")
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{table}:3: m.output_per_mtok:" in err and "Traceback" not in err
    table.write_text("m:\n  input_per_mtok: 1\n  output_per_mtok: 2\n", encoding="utf-8")
    assert main(["check-config", str(cfg)]) == 0


async def test_a_reload_reads_the_prices_again_and_keeps_them_on_a_bad_table(tmp_path: Path) -> None:
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config

    table = tmp_path / "prices.yml"
    table.write_text("m:\n  input_per_mtok: 1\n  output_per_mtok: 2\n", encoding="utf-8")
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(_endpoint_config("", f"storage: {{enabled: false}}\npricing: {{table: '{table}'}}\n"))
    app = App(load_config(cfg), str(cfg))
    first = app.probes.pricing("a")
    assert first is not None and first[0].output_per_mtok == 2.0
    table.write_text("m:\n  input_per_mtok: 1\n  output_per_mtok: 3\n", encoding="utf-8")
    cfg.write_text(cfg.read_text() + "\n# edited\n")  # a reload re-reads a changed config file
    assert (await app.reload())[0] is True
    priced = app.probes.pricing("a")
    assert priced is not None and priced[0].output_per_mtok == 3.0
    table.write_text("m:\n  output_per_mtok: nope\n", encoding="utf-8")
    cfg.write_text(cfg.read_text() + "# again\n")
    ok, message = await app.reload()
    assert not ok and f"{table}:2: m.output_per_mtok:" in message
    kept = app.probes.pricing("a")
    assert kept is not None and kept[0].output_per_mtok == 3.0  # the previous prices stay
