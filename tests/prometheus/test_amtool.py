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
    assert "6 inhibit rules" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=TokwatchEndpointDown", "severity=critical", "endpoint=a"], "tokwatch-critical"),
        (["alertname=TokwatchProbeTimeout", "severity=warning", "endpoint=a"], "tokwatch-warning"),
        (["alertname=TokwatchHighVariance", "severity=info", "endpoint=a"], "tokwatch-info"),
        (["alertname=TokwatchUptimeBurnSlow", "severity=warning", "endpoint=a"], "tokwatch-warning"),
        (["alertname=TokwatchDown", "severity=critical", "instance=tw:9477"], "tokwatch-critical"),
        (["alertname=TokwatchStorageDown", "severity=warning", "instance=tw:9477"], "tokwatch-warning"),
        (["alertname=TokwatchWatchdog", "severity=none"], "tokwatch-watchdog"),
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


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [route, *(r for child in route.get("routes", []) for r in _routes(child))]


def test_every_alert_severity_has_a_route(kit: SimpleNamespace) -> None:
    config = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))
    routed = {m for r in _routes(config["route"]) for m in r.get("matchers", [])}
    rules = yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))
    severities = {r["labels"]["severity"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert severities == {"critical", "warning", "info", "none"}
    for severity in severities - {"none"}:  # none: the watchdog, routed by its name
        assert f'severity="{severity}"' in routed
    assert 'alertname="TokwatchWatchdog"' in routed


def test_endpoint_alerts_group_by_endpoint_and_the_rest_by_instance(kit: SimpleNamespace) -> None:
    """Alerts on recording rules carry no instance: grouping an endpoint's alerts by endpoint alone puts
    them with those read from tokwatch's metrics (and merges HA replicas); tokwatch's own alerts, which
    have no endpoint label, group per instance."""
    config = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))
    route = config["route"]
    assert route["group_by"] == ["instance"]
    (by_endpoint,) = [r for r in route["routes"] if r.get("matchers") == ['endpoint=~".+"']]
    assert by_endpoint["group_by"] == ["endpoint"]
    for rule in config["inhibit_rules"]:  # every rule about endpoints compares the endpoint alone
        if any("endpoint" in m for m in rule["target_matchers"]) or "TokwatchEndpointDown" in str(rule):
            assert rule["equal"] == ["endpoint"], rule


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
async def test_endpoint_down_inhibits_the_endpoints_other_alerts(
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
    add("alertname=TokwatchStorageDown", "severity=warning", "instance=tw:9477")

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
            key = (labels["alertname"], labels.get("endpoint", labels.get("instance")))
            found[key] = (status["state"], status["inhibitedBy"])
        return found if len(found) == 7 else None

    await kit.wait_until(states, 20, "all seven alerts in alertmanager")
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
        ("TokwatchRateLimited", "a"): ("suppressed", [down]),  # every other alert of the endpoint
        ("TokwatchStorageDown", "tw:9477"): ("active", []),  # no endpoint: tokwatch's own
    }
