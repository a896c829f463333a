"""The shipped alertmanager.yml: valid, routes by severity, and inhibits as documented (real Alertmanager)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml


def test_alertmanager_config_is_valid(amtool: str, kit: SimpleNamespace) -> None:
    out = kit.run_tool([amtool, "check-config", str(kit.alertmanager_yml)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 inhibit rules" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=TokwatchEndpointDown", "severity=critical", "endpoint=a"], "tokwatch-critical"),
        (["alertname=TokwatchProbeTimeout", "severity=warning", "endpoint=a"], "tokwatch-warning"),
        (["alertname=TokwatchHighVariance", "severity=info", "endpoint=a"], "tokwatch-info"),
        (["alertname=SomethingElse"], "tokwatch-default"),
    ],
)
def test_routes_by_severity(amtool: str, kit: SimpleNamespace, labels: list[str], receiver: str) -> None:
    out = kit.run_tool(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={kit.alertmanager_yml}",
            f"--verify.receivers={receiver}",
            *labels,
        ]
    )
    assert out.returncode == 0, f"{labels} did not route to {receiver}: {out.stdout}{out.stderr}"
    assert out.stdout.strip() == receiver


def test_every_alert_severity_has_a_route(kit: SimpleNamespace) -> None:
    config = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))
    routed = {m for r in config["route"]["routes"] for m in r["matchers"]}
    rules = yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))
    severities = {r["labels"]["severity"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert severities == {"critical", "warning", "info"}
    for severity in severities:
        assert f'severity="{severity}"' in routed
    assert "endpoint" in config["route"]["group_by"]


def _test_config(kit: SimpleNamespace, tmp_path: Path, webhook_port: int) -> Path:
    """The shipped config with every webhook pointed at a port of this test (nothing else changed)."""
    config = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{webhook_port}/{receiver['name']}"
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.e2e
async def test_endpoint_down_inhibits_its_timeout_and_regression(
    amtool: str, alertmanager_bin: str, kit: SimpleNamespace, processes: Any, tmp_path: Path
) -> None:
    port = kit.free_port()
    config = _test_config(kit, tmp_path, kit.free_port())
    processes.start(
        "alertmanager",
        [
            alertmanager_bin,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        await kit.wait_until(lambda: kit.http_ok(session, f"{url}/-/ready"), 20, "alertmanager ready")

    def add(*labels: str) -> None:
        out = kit.run_tool([amtool, "alert", "add", f"--alertmanager.url={url}", *labels])
        assert out.returncode == 0, out.stderr

    add("alertname=TokwatchEndpointDown", "severity=critical", "endpoint=a")
    add("alertname=TokwatchProbeTimeout", "severity=warning", "endpoint=a")
    add("alertname=TokwatchDecodeRegression", "severity=warning", "endpoint=a")
    add("alertname=TokwatchPrefillRegression", "severity=warning", "endpoint=a", "workload=long")
    add("alertname=TokwatchProbeTimeout", "severity=warning", "endpoint=b")
    add("alertname=TokwatchRateLimited", "severity=warning", "endpoint=a")

    def query(*flags: str) -> list[dict[str, Any]]:
        out = kit.run_tool([amtool, "alert", "query", f"--alertmanager.url={url}", "--output=json", *flags])
        assert out.returncode == 0, out.stderr
        return list(json.loads(out.stdout))

    def states() -> dict[tuple[str, str], tuple[str, list[str]]] | None:
        """(alertname, endpoint) -> (state, inhibiting fingerprints), active and inhibited alerts."""
        found = {}
        for a in [*query(), *query("--inhibited")]:
            labels, status = a["labels"], a["status"]
            assert isinstance(labels, dict) and isinstance(status, dict)
            found[(labels["alertname"], labels["endpoint"])] = (status["state"], status["inhibitedBy"])
        return found if len(found) == 6 else None

    await kit.wait_until(states, 20, "all six alerts in alertmanager")
    await kit.wait_until(
        lambda: all(
            (states() or {}).get((name, "a"), ("",))[0] == "suppressed"
            for name in ("TokwatchDecodeRegression", "TokwatchPrefillRegression")
        ),
        20,
        "inhibition",
    )
    got = states()
    assert got is not None
    down = next(a["fingerprint"] for a in query() if a["labels"]["alertname"] == "TokwatchEndpointDown")
    assert got == {
        ("TokwatchEndpointDown", "a"): ("active", []),
        ("TokwatchProbeTimeout", "a"): ("suppressed", [down]),
        ("TokwatchDecodeRegression", "a"): ("suppressed", [down]),
        ("TokwatchPrefillRegression", "a"): ("suppressed", [down]),
        ("TokwatchProbeTimeout", "b"): ("active", []),  # another endpoint: not inhibited
        ("TokwatchRateLimited", "a"): ("active", []),  # not a target of the inhibit rule
    }
