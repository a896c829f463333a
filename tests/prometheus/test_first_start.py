"""A first `docker compose up` pages nobody: the exporter running the shipped deploy/compose/tokwatch.yml
(every example endpoint disabled) probes nothing, is ready, and what it exposes trips no alert of the shipped
rules over a day and more (promtool), TokwatchWatchdog aside."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tokwatch.settings.config import load_config_text

HOURS = 26  # past the 24 h windows
INSTANCE = "tokwatch:9477"


def _compose_config(kit: SimpleNamespace, tmp_path: Path) -> Path:
    """deploy/compose/tokwatch.yml as shipped, its TimescaleDB swapped for SQLite in tmp_path."""
    doc = yaml.safe_load((kit.root / "deploy" / "compose" / "tokwatch.yml").read_text(encoding="utf-8"))
    doc["storage"] = {"sqlite_path": str(tmp_path / "tw.db"), "outbox_path": str(tmp_path / "outbox")}
    path = tmp_path / "tokwatch.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _series_name(name: str, labels: dict[str, str]) -> str:
    pairs = {"job": "tokwatch", "instance": INSTANCE, **labels}
    body = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                    for k, v in sorted(pairs.items()))  # fmt: skip
    return f"{name}{{{body}}}"


def _schedule(minute: int, interval_s: int, offset_s: int) -> tuple[int, int, int]:
    """(last round, next round, rounds so far) at `minute` for rounds at offset_s + k * interval_s."""
    now = minute * 60
    done = max(0, (now - offset_s) // interval_s + 1)
    last = offset_s + (done - 1) * interval_s if done else 0
    return last, offset_s + done * interval_s, done + 1  # tokwatch runs one round at start


def _input_series(exposition: str, interval_s: int, offset_s: int) -> list[dict[str, str]]:
    """The scraped samples as promtool input, one sample a minute for HOURS: values as scraped, the
    scheduler's round timestamps and count advancing as they would, other timestamps at the start."""
    minutes = range(HOURS * 60)
    moving = {
        "tokwatch_scheduler_last_round_timestamp_seconds": 0,
        "tokwatch_scheduler_next_round_timestamp_seconds": 1,
        "tokwatch_scheduler_rounds_total": 2,
    }
    out = [{"series": _series_name("up", {}), "values": f"1x{len(minutes) - 1}"}]
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in moving:
                index = moving[sample.name]
                values = " ".join(str(_schedule(m, interval_s, offset_s)[index]) for m in minutes)
            elif sample.name.endswith("_timestamp_seconds"):
                values = f"0x{len(minutes) - 1}"
            else:
                values = f"{sample.value!r}x{len(minutes) - 1}".replace("inf", "Inf")
            out.append({"series": _series_name(sample.name, sample.labels), "values": values})
    return out


@pytest.mark.slow
async def test_the_shipped_compose_config_probes_nothing_and_pages_nobody(
    promtool: str, kit: SimpleNamespace, processes: Any, tmp_path: Path
) -> None:
    config = _compose_config(kit, tmp_path)
    parsed = load_config_text(config.read_text(encoding="utf-8"), str(config))
    assert parsed.endpoints and not parsed.enabled_endpoints  # examples shipped, all disabled
    port = kit.free_port()
    proc = processes.start("tokwatch", [sys.executable, "-m", "tokwatch", "serve", "--config", str(config),
                                        "--listen", f"127.0.0.1:{port}"])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

        async def ready() -> bool:
            assert proc.poll() is None, processes.log("tokwatch")
            return bool(await kit.http_ok(session, f"{url}/-/ready"))

        await kit.wait_until(ready, 30, "tokwatch ready")
        async with session.get(f"{url}/metrics") as resp:
            exposition = await resp.text()
    assert "round 1: 0 probes on 0 servers" in processes.log("tokwatch")
    # nothing probed: no status, no success, no run counted
    assert "tokwatch_probe_status{" not in exposition and "tokwatch_probe_success{" not in exposition
    # (a status has a run counter from its first run on: none without a run)
    assert "tokwatch_probe_runs_total{" not in exposition and "tokwatch_endpoint_info{" in exposition

    alerts = [
        r["alert"]
        for g in yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    cases = []
    for hour in (1, 2, 6, 12, 25):
        for name in alerts:
            exp = [{"exp_labels": {"severity": "none"}}] if name == "TokwatchWatchdog" else []
            cases.append({"eval_time": f"{hour}h", "alertname": name, "exp_alerts": exp})
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in kit.rule_files:  # annotations aside (the Watchdog's are tested elsewhere), as shipped
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        (rules / path.name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    schedule = parsed.schedule
    test = {
        "rule_files": [str(rules / p.name) for p in kit.rule_files],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": _input_series(exposition, int(schedule.interval), int(schedule.offset)),
            "alert_rule_test": cases,
        }],
    }  # fmt: skip
    path = tmp_path / "first_start_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    out = kit.run_tool([promtool, "test", "rules", str(path)], timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert re.search(r"SUCCESS", out.stdout)
