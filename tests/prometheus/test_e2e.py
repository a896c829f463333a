"""End to end: simulator -> tokwatch -> Prometheus (shipped rules) -> Alertmanager (shipped routing and
inhibition) -> a webhook served by this test. All real processes on 127.0.0.1, stopped at the end.

Endpoints: "healthy" (fast, no faults), "stuck" (every request stalls; tokwatch gives up after 1 s) and
"busy" (vLLM dialect, a KV cache of 256 tokens under background load, so it preempts requests).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

# The shipped `for:` durations are minutes; the test divides them by 300 (5m -> 1s, 1h -> 12s) so the
# same expressions fire within seconds. TokwatchEndpointDown gets 8 s so that the timeout alert it
# inhibits has reached the webhook first.
FOR_SCALE = 300
FOR_OVERRIDES = {"TokwatchEndpointDown": "8s"}


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration))


def _test_alert_rules(shipped: Path, dest: Path) -> Path:
    """The shipped alert rules with the same expressions and labels and shortened `for:`."""
    doc = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                original = _seconds(str(rule.get("for", "0s")))
                short = f"{max(1, round(original / FOR_SCALE))}s" if original else "0s"
                rule["for"] = FOR_OVERRIDES.get(rule["alert"], short)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


def _test_alertmanager_config(shipped: Path, dest: Path, webhook_url: str) -> Path:
    """The shipped routing and inhibition, with second-scale timers and every receiver posting to us."""
    doc = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    routes = [doc["route"]]
    for route in routes:
        routes.extend(route.get("routes", []))
        route.update({"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"})
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{webhook_url}/{receiver['name']}"
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


class Webhook:
    """Alertmanager webhook receiver: keeps every (receiver, status, labels) it is sent."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        """Listen on an ephemeral 127.0.0.1 port."""
        app = web.Application()
        app.router.add_post("/{receiver}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        for alert in payload["alerts"]:
            self.received.append((request.match_info["receiver"], alert["status"], alert["labels"]))
        return web.Response(text="ok")

    def firing(self, alertname: str, endpoint: str) -> list[str]:
        """Receivers that got this alert firing."""
        return [
            r
            for r, status, labels in self.received
            if status == "firing"
            and labels.get("alertname") == alertname
            and labels.get("endpoint") == endpoint
        ]


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        resp.raise_for_status()
        return await resp.json()


async def test_timeout_and_preemption_alerts_reach_the_webhook(
    prometheus_bin: str,
    alertmanager_bin: str,
    kit: SimpleNamespace,
    stack: Any,
    tmp_path: Path,
) -> None:
    webhook = Webhook()
    await webhook.start()
    try:
        await _run(prometheus_bin, alertmanager_bin, kit, stack, tmp_path, webhook)
    finally:
        await webhook.stop()


async def _run(
    prometheus_bin: str,
    alertmanager_bin: str,
    kit: SimpleNamespace,
    stack: Any,
    tmp_path: Path,
    webhook: Webhook,
) -> None:
    fast = {"name": "m", "decode_tps": 400, "prefill_tps": 20000}
    sim = {
        "seed": 11,
        "servers": [
            {"name": "healthy", "dialect": "openai", "models": [fast]},
            {
                "name": "stuck",
                "dialect": "openai",
                "models": [{**fast, "faults": {"stall": 1.0}, "stall_seconds": 20}],
            },
            {
                "name": "busy",
                "dialect": "vllm",
                "kv_capacity_tokens": 256,
                "background_rps": 8,
                "background_prompt_tokens": 64,
                "background_max_tokens": 96,
                "models": [fast],
            },
        ],
    }
    endpoints = [
        stack.endpoint("healthy", "healthy", "openai", "m", timeout="5s"),
        stack.endpoint("stuck", "stuck", "openai", "m", timeout="1s"),
        stack.endpoint("busy", "busy", "vllm", "m", timeout="10s", scrape_interval="1s"),
    ]
    await stack.start(sim, endpoints, interval="2s")

    am_port, prom_port = kit.free_port(), kit.free_port()
    am_config = _test_alertmanager_config(kit.alertmanager_yml, tmp_path / "alertmanager.yml", webhook.url)
    stack.processes.start(
        "alertmanager",
        [
            alertmanager_bin,
            f"--config.file={am_config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
    )
    rules = _test_alert_rules(kit.alert_rules, tmp_path / "tokwatch-alerts.yml")
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules), str(kit.recording_rules)],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [
                    {
                        "job_name": "tokwatch",
                        "static_configs": [{"targets": [f"127.0.0.1:{stack.tokwatch_port}"]}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    stack.processes.start(
        "prometheus",
        [
            prometheus_bin,
            f"--config.file={prom_config}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            # Alerts that fire at the first evaluation (TokwatchWatchdog) are sent before Prometheus has
            # found Alertmanager; the resend delay (1m by default) brings them within the test's time.
            "--rules.alert.resend-delay=2s",
        ],
    )
    prom, am = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}"

    async with aiohttp.ClientSession() as session:

        async def ready(url: str) -> bool:
            stack.processes.check_alive()
            return bool(await kit.http_ok(session, url))

        await kit.wait_until(lambda: ready(f"{am}/-/ready"), 20, "alertmanager ready")
        await kit.wait_until(lambda: ready(f"{prom}/-/ready"), 20, "prometheus ready")

        def both_arrived() -> bool:
            stack.processes.check_alive()
            return bool(
                webhook.firing("TokwatchProbeTimeout", "stuck")
                and webhook.firing("TokwatchServerPreemptions", "busy")
            )

        await kit.wait_until(
            both_arrived, 60, f"timeout and preemption alerts at the webhook: {webhook.received}"
        )
        assert webhook.firing("TokwatchProbeTimeout", "stuck")[0] == "tokwatch-warning"
        assert webhook.firing("TokwatchServerPreemptions", "busy")[0] == "tokwatch-warning"

        # Later the stuck endpoint counts as down: that alert pages, and inhibits its timeout alert.
        await kit.wait_until(
            lambda: webhook.firing("TokwatchEndpointDown", "stuck"), 30, "TokwatchEndpointDown at the webhook"
        )
        assert webhook.firing("TokwatchEndpointDown", "stuck")[0] == "tokwatch-critical"

        async def timeout_inhibited() -> bool:
            alerts = await _get_json(session, f"{am}/api/v2/alerts?inhibited=true&active=true")
            return any(
                a["labels"].get("alertname") == "TokwatchProbeTimeout"
                and a["labels"].get("endpoint") == "stuck"
                and a["status"]["state"] == "suppressed"
                and a["status"]["inhibitedBy"]
                for a in alerts
            )

        await kit.wait_until(timeout_inhibited, 15, "TokwatchProbeTimeout of stuck inhibited in alertmanager")

        # The healthy endpoint was measured (ok runs reached Prometheus) and raised nothing, not even pending.
        ok = await _get_json(
            session, f'{prom}/api/v1/query?query=tokwatch_probe_success{{endpoint="healthy"}}'
        )
        assert [r["value"][1] for r in ok["data"]["result"]] == ["1"]
        pending_or_firing = (await _get_json(session, f"{prom}/api/v1/alerts"))["data"]["alerts"]
        healthy = [a for a in pending_or_firing if a["labels"].get("endpoint") == "healthy"]
        assert healthy == []
        assert [labels for _, _, labels in webhook.received if labels.get("endpoint") == "healthy"] == []
        # tokwatch's own health alerts stay silent too; only the heartbeat fires, and reaches its receiver.
        own = {a["labels"]["alertname"] for a in pending_or_firing if "endpoint" not in a["labels"]}
        assert own == {"TokwatchWatchdog"}, own
        await kit.wait_until(
            lambda: [r for r, status, labels in webhook.received
                     if labels.get("alertname") == "TokwatchWatchdog" and status == "firing"],
            15, "TokwatchWatchdog at the webhook",
        )  # fmt: skip
        assert {r for r, _, labels in webhook.received if labels.get("alertname") == "TokwatchWatchdog"} == {
            "tokwatch-watchdog"
        }
