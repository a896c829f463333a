"""One incident, one page: prometheus/tests/incidents_test.yml's scenarios (an endpoint that goes dark, one
that flaps, one that flaps with timeouts, a tokwatch instance that goes down) checked minute by minute with
promtool, then replayed into a real Alertmanager running prometheus/alertmanager.yml (only its timers
shortened and its webhooks pointed here), which notifies a webhook sink on 127.0.0.1 that counts the
notifications per receiver."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

INCIDENTS = "incidents_test.yml"
WATCHDOG = "TokwatchWatchdog"
# Alertmanager's timers divided by this (5m -> 1s), except the reminders (repeat_interval), which stay
# as shipped so that only the incidents' own notifications arrive while a scenario is replayed.
TIME_SCALE = 300
STEP_S = 2.5  # wall time per scenario step: more than the scaled group_interval (1 s) plus margin
Alert = tuple[str, tuple[tuple[str, str], ...]]  # (alertname, sorted labels without alertname)


def _minutes(duration: str) -> int:
    units = {"d": 1440, "h": 60, "m": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([dhm])", duration))


@dataclass
class Scenario:
    """One test group of incidents_test.yml: its input and the firing set from each eval_time on."""

    name: str
    group: dict[str, Any]
    steps: list[tuple[int, dict[Alert, dict[str, str]]]] = field(default_factory=list)


def _scenarios(kit: SimpleNamespace) -> tuple[dict[str, Any], list[Scenario]]:
    doc = yaml.safe_load((kit.prom_dir / "tests" / INCIDENTS).read_text(encoding="utf-8"))
    scenarios = []
    for group in doc["tests"]:
        at: dict[int, dict[Alert, dict[str, str]]] = {}
        for case in group["alert_rule_test"]:
            current = at.setdefault(_minutes(case["eval_time"]), {})
            for exp in case["exp_alerts"]:
                key = (case["alertname"], tuple(sorted(exp["exp_labels"].items())))
                current[key] = exp["exp_annotations"]
        scenarios.append(Scenario(group["name"], group, sorted(at.items())))
    return doc, scenarios


def _watchdog(kit: SimpleNamespace) -> Alert:
    rules = yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == WATCHDOG]
    return WATCHDOG, tuple(sorted(rule["labels"].items()))


def _alert_names(kit: SimpleNamespace) -> list[str]:
    rules = yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.slow
def test_scenarios_are_complete_minute_by_minute(promtool: str, kit: SimpleNamespace, tmp_path: Path) -> None:
    """At every minute from a group's first eval_time to its last, the firing alerts are exactly the set
    listed at the latest eval_time (every alert checked, TokwatchWatchdog included): the listed times are
    all the transitions, so the replay below misses none. Annotations change from minute to minute (the
    time since the last ok run): this check runs the shipped expressions with the annotations left out."""
    doc, scenarios = _scenarios(kit)
    assert [s.name for s in scenarios] == ["dark", "flapping", "flapping timeouts", "tokwatch down"]
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    for path in kit.rule_files:
        rules = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        (rules_dir / path.name).write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    names, watchdog = _alert_names(kit), _watchdog(kit)
    groups = []
    for scenario in scenarios:
        cases = []
        first, last = scenario.steps[0][0], scenario.steps[-1][0]
        for minute in range(first, last + 1):
            firing = {**next(s for m, s in reversed(scenario.steps) if m <= minute), watchdog: {}}
            for name in names:
                exp = [{"exp_labels": dict(labels)} for alert, labels in firing if alert == name]
                cases.append({"eval_time": f"{minute}m", "alertname": name, "exp_alerts": exp})
        groups.append({**scenario.group, "alert_rule_test": cases})
    test = {
        "rule_files": [str(rules_dir / p.name) for p in kit.rule_files],
        "evaluation_interval": doc["evaluation_interval"],
        "group_eval_order": doc["group_eval_order"],
        "tests": groups,
    }
    path = tmp_path / "minutes_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    out = kit.run_tool([promtool, "test", "rules", str(path)], timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]


def _scaled(duration: str) -> str:
    seconds = sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", duration))
    return f"{max(1, round(seconds * 1000 / TIME_SCALE))}ms" if seconds else "0s"


def test_alertmanager_config(kit: SimpleNamespace, dest: Path, webhook: str) -> Path:
    """The shipped alertmanager.yml with its timers scaled down and every webhook pointed at `webhook`:
    routes, grouping and inhibition unchanged."""
    doc = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))

    def scale(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = _scaled(route[key])
        if route.get("receiver") == "tokwatch-watchdog":
            route["repeat_interval"] = _scaled(route["repeat_interval"])
        for child in route.get("routes", []):
            scale(child)

    scale(doc["route"])
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{webhook}/{receiver['name']}"
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


test_alertmanager_config.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@dataclass(frozen=True)
class Notification:
    """One webhook call from Alertmanager."""

    receiver: str
    status: str
    group_key: str
    group_labels: tuple[tuple[str, str], ...]
    firing: tuple[str, ...]  # alertnames of the firing alerts, sorted


class Sink:
    """A webhook receiver on 127.0.0.1 that keeps every notification, by the path's first segment (one per
    Alertmanager posting to it)."""

    def __init__(self) -> None:
        self.received: dict[str, list[Notification]] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen on an ephemeral port."""
        app = web.Application()
        app.router.add_post("/{source}/{receiver}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        firing = sorted(a["labels"]["alertname"] for a in body["alerts"] if a["status"] == "firing")
        self.received.setdefault(request.match_info["source"], []).append(
            Notification(
                request.match_info["receiver"], body["status"], body["groupKey"],
                tuple(sorted(body["groupLabels"].items())), tuple(firing),
            )
        )  # fmt: skip
        return web.Response(text="ok")


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


async def _replay(session: aiohttp.ClientSession, am: str, scenario: Scenario, watchdog: Alert) -> None:
    """Post each step's firing alerts (and resolve those that left) as Prometheus would, then let
    Alertmanager flush before the next step; finally wait until the resolutions are delivered."""
    previous: dict[Alert, dict[str, str]] = {}
    for _, firing in scenario.steps:
        now = dt.datetime.now(dt.UTC)
        current = {**firing, watchdog: {}}
        posts = [
            {"labels": {"alertname": name, **dict(labels)}, "annotations": ann,
             "startsAt": _iso(now - dt.timedelta(minutes=1)), "endsAt": _iso(now + dt.timedelta(hours=1))}
            for (name, labels), ann in current.items()
        ] + [
            {"labels": {"alertname": name, **dict(labels)}, "annotations": ann,
             "startsAt": _iso(now - dt.timedelta(minutes=1)), "endsAt": _iso(now)}
            for (name, labels), ann in previous.items() if (name, labels) not in current
        ]  # fmt: skip
        async with session.post(f"{am}/api/v2/alerts", json=posts) as resp:
            assert resp.status == 200, await resp.text()
        previous = current
        await asyncio.sleep(STEP_S)
    await asyncio.sleep(STEP_S)


@pytest.mark.e2e
@pytest.mark.timeout(400)
async def test_one_incident_one_page(
    alertmanager_bin: str, kit: SimpleNamespace, processes: Any, tmp_path: Path
) -> None:
    _, scenarios = _scenarios(kit)
    watchdog = _watchdog(kit)
    sink = Sink()
    await sink.start()

    async def replayed(i: int, scenario: Scenario, session: aiohttp.ClientSession) -> list[Notification]:
        """The scenario replayed into an Alertmanager of its own; the notifications it sent meanwhile."""
        port = kit.free_port()
        config = test_alertmanager_config(kit, tmp_path / f"am{i}.yml", f"{sink.url}/{i}")
        proc = processes.start(f"alertmanager{i}", [
            alertmanager_bin, f"--config.file={config}", f"--storage.path={tmp_path / f'am{i}'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
        ])  # fmt: skip
        am = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            assert proc.poll() is None, processes.log(f"alertmanager{i}")
            return bool(await kit.http_ok(session, f"{am}/-/ready"))

        await kit.wait_until(ready, 30, "alertmanager ready")
        await _replay(session, am, scenario, watchdog)
        return list(sink.received.get(str(i), []))

    try:
        # The scenarios run side by side, each with its own Alertmanager and its own path on the sink.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            notes = await asyncio.gather(*(replayed(i, s, session) for i, s in enumerate(scenarios)))
        got = {s.name: n for s, n in zip(scenarios, notes, strict=True)}
    finally:
        processes.stop_all()
        await sink.stop()

    def firing(name: str) -> list[tuple[str, tuple[str, ...]]]:
        return [(n.receiver, n.firing) for n in got[name] if n.receiver != "tokwatch-watchdog" and n.firing]

    def resolved(name: str) -> list[str]:
        return [n.receiver for n in got[name] if n.receiver != "tokwatch-watchdog" and n.status == "resolved"]

    # Dark: Unreachable, EndpointDown, UptimeBurnFast and UptimeBurnSlow all fire (promtool above); one
    # page names the cause, and the recovery resolves it. Nothing reaches the warning or info receivers.
    assert firing("dark") == [("tokwatch-critical", ("TokwatchUnreachable",))]
    assert resolved("dark") == ["tokwatch-critical"]
    # Flapping: one notification for the whole episode, not one per failed run.
    assert firing("flapping") == [("tokwatch-critical", ("TokwatchUnreachable",))]
    assert resolved("flapping") == ["tokwatch-critical"]
    # Flapping with timeouts: the warning comes first, then one page; nothing new after the recovery.
    assert firing("flapping timeouts") == [
        ("tokwatch-warning", ("TokwatchProbeTimeout",)),
        ("tokwatch-critical", ("TokwatchUptimeBurnFast",)),
    ]
    assert resolved("flapping timeouts") == ["tokwatch-critical"]
    # tokwatch down: one page, for that instance.
    (down,) = [n for n in got["tokwatch down"] if n.receiver != "tokwatch-watchdog"]
    assert (down.receiver, down.firing, down.group_labels) == (
        "tokwatch-critical", ("TokwatchDown",), (("instance", "tokwatch-0:9477"),)
    )  # fmt: skip
    # Each page is one notification group; the dead man's switch got its heartbeats all along.
    for name, notes in got.items():
        pages = [n for n in notes if n.receiver == "tokwatch-critical"]
        assert len({n.group_key for n in pages}) == 1, (name, pages)
        beats = [n for n in notes if n.receiver == "tokwatch-watchdog"]
        assert len(beats) >= 2 and all(n.firing == (WATCHDOG,) for n in beats), (name, beats)


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    name, op, value = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', matcher).groups()  # type: ignore[union-attr]
    have = labels.get(name, "")
    if op in ("=~", "!~"):
        return bool(re.fullmatch(value, have)) == (op == "=~")
    return (have == value) == (op == "=")


def test_an_inhibiting_alert_outlives_those_it_inhibits(kit: SimpleNamespace) -> None:
    """keep_firing_for: when a recovered endpoint's alerts end, one that inhibits others ends last, so an
    alert that was inhibited all along (never notified) is never uncovered and sent on its way out."""
    rules = yaml.safe_load(kit.alert_rules.read_text(encoding="utf-8"))
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]

    def static_labels(rule: dict[str, Any]) -> dict[str, str]:
        # per-endpoint alerts name the endpoint in their summary (a test in test_promtool.py)
        endpoint = {"endpoint": "e"} if "$labels.endpoint" in rule["annotations"]["summary"] else {}
        return {"alertname": rule["alert"], **rule["labels"], **endpoint}

    def keep(rule: dict[str, Any]) -> int:
        return _minutes(str(rule.get("keep_firing_for", "0m")))

    config = yaml.safe_load(kit.alertmanager_yml.read_text(encoding="utf-8"))
    pairs = 0
    for inhibit in config["inhibit_rules"]:
        for source in alerts:
            if not all(_matches(m, static_labels(source)) for m in inhibit["source_matchers"]):
                continue
            for target in alerts:
                inhibited = all(_matches(m, static_labels(target)) for m in inhibit["target_matchers"])
                if target is source or not inhibited or keep(target) == 0:
                    continue
                pairs += 1
                assert keep(source) > keep(target), f"{source['alert']} must outlive {target['alert']}"
    assert pairs >= 10
