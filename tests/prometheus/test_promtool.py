"""The shipped Prometheus config and rules: valid for promtool, unit-tested, and the unit tests really test.

Beyond `promtool test rules`, every alert is mutated up to four ways (never fires, fires when it should not,
`for:` removed, `keep_firing_for:` removed) and the unit tests must catch each mutation: that proves each
alert has a "fires", a "stays silent", a "`for:` respected" and a "kept firing over an ok run" case.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

SEVERITIES = {"critical", "warning", "info", "none"}  # none: TokwatchWatchdog, the heartbeat
RECORD_NAME_RE = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def _alerts(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", str(text)))


def test_prometheus_config_is_valid(promtool: str, kit: SimpleNamespace) -> None:
    for config in (kit.prometheus_yml, kit.prom_dir / "prometheus-probe.yml"):
        out = kit.run_tool([promtool, "check", "config", str(config)])
        assert out.returncode == 0, out.stdout + out.stderr
        assert "2 rule files found" in out.stdout


def test_scheduled_job_by_default_and_probe_job_as_the_alternative(kit: SimpleNamespace) -> None:
    default = yaml.safe_load(kit.prometheus_yml.read_text(encoding="utf-8"))
    assert [j["job_name"] for j in default["scrape_configs"]] == ["tokwatch"]
    probe = yaml.safe_load((kit.prom_dir / "prometheus-probe.yml").read_text(encoding="utf-8"))
    jobs = {j["job_name"]: j for j in probe["scrape_configs"]}
    assert set(jobs) == {"tokwatch", "tokwatch-probe"} and jobs["tokwatch-probe"]["metrics_path"] == "/probe"
    # every per-endpoint gauge a rule reads is the scheduled series, so a /probe scrape of the same
    # endpoint (trigger="on_demand") can neither double an alert nor move a recorded figure
    gauges = ("tokwatch_probe_status", "tokwatch_probe_success", "tokwatch_probe_duration_seconds",
              "tokwatch_probe_decode_tokens_per_second")  # fmt: skip
    for path in kit.rule_files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                for name, selector in re.findall(r"(?<![\w:])(tokwatch_probe_\w+)(\{[^}]*\})?", rule["expr"]):
                    if name in gauges:
                        assert 'trigger=""' in selector, f"{rule.get('alert') or rule['record']}: {name}"


def test_rule_files_are_valid(promtool: str, kit: SimpleNamespace) -> None:
    out = kit.run_tool([promtool, "check", "rules", *map(str, kit.rule_files)])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_rule_unit_tests_pass(promtool: str, kit: SimpleNamespace) -> None:
    tests = sorted((kit.prom_dir / "tests").glob("*.yml"))
    assert len(tests) >= 4
    out = kit.run_tool([promtool, "test", "rules", *map(str, tests)], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(tests)


def test_every_alert_has_labels_annotations_and_runbook(kit: SimpleNamespace) -> None:
    base = '{{ with query "tokwatch:runbook:base_url" }}{{ (. | first).Labels.url }}{{ end }}'
    recording = yaml.safe_load(kit.recording_rules.read_text(encoding="utf-8"))
    rules = [r for g in recording["groups"] for r in g["rules"]]
    (url_rule,) = [r for r in rules if r.get("record") == "tokwatch:runbook:base_url"]
    assert "docs/alerts.md" in url_rule["expr"]
    docs = (kit.root / "docs" / "alerts.md").read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^a-z0-9_ -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", docs, re.MULTILINE)
    }
    alerts = _alerts(kit.alert_rules)
    assert len(alerts) >= 15
    for rule in alerts:
        name = rule["alert"]
        assert "for" in rule, f"{name}: no for:"
        assert rule["labels"]["severity"] in SEVERITIES, name
        ann = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        assert (
            "$labels.endpoint" in ann["summary"]
            or "$labels.instance" in ann["summary"]
            or (name in ("TokwatchTargetMissing", "TokwatchWatchdog"))
        ), f"{name}: summary names neither endpoint nor instance"
        anchor = ann["runbook_url"].rpartition("#")[2]
        # the base comes from the recording rule tokwatch:runbook:base_url (one place to point it elsewhere)
        assert ann["runbook_url"].split("#")[0] == base, name
        assert anchor == name.lower(), f"{name}: runbook anchor {anchor}"
        assert anchor in anchors, f"{name}: docs/alerts.md has no section #{anchor}"


def test_recording_rule_names_follow_level_metric_operations(kit: SimpleNamespace) -> None:
    doc = yaml.safe_load(kit.recording_rules.read_text(encoding="utf-8"))
    names = [r["record"] for g in doc["groups"] for r in g["rules"]]
    assert len(names) == len(set(names))
    assert {"endpoint:tokwatch_ttft_seconds:p99_1h", "endpoint:tokwatch_probe_runs:ok_ratio_7d"} <= set(names)
    for name in names:
        assert RECORD_NAME_RE.match(name), name


def _mutants(alerts_path: Path) -> list[tuple[str, str, str]]:
    """(alert, mutation, mutated rule-file text) for every alert and applicable mutation."""
    doc = yaml.safe_load(alerts_path.read_text(encoding="utf-8"))
    out = []
    for gi, group in enumerate(doc["groups"]):
        for ri, rule in enumerate(group["rules"]):
            if "alert" not in rule:
                continue
            mutations: dict[str, dict[str, Any]] = {"never fires": {"expr": "vector(0) > 1"}}
            if rule["expr"].strip() != "vector(1)":  # TokwatchWatchdog fires without cause by design
                # A label-less extra series, present whatever the input: caught only by a "stays
                # silent" expectation evaluated after the alert's `for:` has elapsed.
                mutations["fires without cause"] = {"expr": f"({rule['expr'].strip()}) or vector(1)"}
            if _duration_s(rule.get("for", "0s")) > 0:
                mutations["for: removed"] = {"for": "0s"}
            if _duration_s(rule.get("keep_firing_for", "0s")) > 0:
                mutations["keep_firing_for: removed"] = {"keep_firing_for": "0s"}
            for label, change in mutations.items():
                mutated = yaml.safe_load(alerts_path.read_text(encoding="utf-8"))
                mutated["groups"][gi]["rules"][ri].update(change)
                out.append((rule["alert"], label, yaml.safe_dump(mutated, sort_keys=False)))
    return out


def _references(text: str, names: list[str]) -> set[str]:
    return {n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", text)}


def _rules_for(alert: str, alerts_text: str, recording_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recording rules, alert rules) holding `alert` alone and the recording rules it reads, directly or
    through other recording rules (its expression, labels and annotations): each kept in its group, in its
    order, so every kept rule is evaluated as in the shipped files."""
    alerts = yaml.safe_load(alerts_text)
    recording = yaml.safe_load(recording_path.read_text(encoding="utf-8"))
    exprs = {r["record"]: r["expr"] for g in recording["groups"] for r in g["rules"]}
    # One alert may have several rules (a warning and a critical severity of one condition): all are kept.
    rules = [r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == alert]
    text = " ".join(
        part
        for rule in rules
        for part in [rule["expr"], *rule.get("labels", {}).values(), *rule.get("annotations", {}).values()]
    )
    needed, todo = set(), _references(text, list(exprs))
    while todo:
        name = todo.pop()
        needed.add(name)
        todo |= _references(exprs[name], list(exprs)) - needed
    kept_alerts = [
        {**g, "rules": [r for r in g["rules"] if r in rules]}
        for g in alerts["groups"]
        if any(r in rules for r in g["rules"])
    ]
    kept_records = [
        {**g, "rules": [r for r in g["rules"] if r["record"] in needed]}
        for g in recording["groups"]
        if any(r["record"] in needed for r in g["rules"])
    ]
    return {"groups": kept_records}, {"groups": kept_alerts}


def _tests_for(alert: str, test_files: list[Path]) -> dict[str, Any]:
    """A promtool test file holding only the test groups that check `alert`, each with only its checks of
    `alert` (the other alerts and recorded series are left out of the rule files). The whole-incident
    scenarios (incidents_test.yml, checked minute by minute in test_incidents.py) are left out: their hours
    of minute-by-minute data would make each mutant's run many times slower, and the unit tests alone must
    catch every mutation."""
    groups: list[dict[str, Any]] = []
    base: dict[str, Any] = {}
    for path in test_files:
        if path.name == "incidents_test.yml":
            continue
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for test in doc["tests"]:
            mine = [a for a in test.get("alert_rule_test", []) if a["alertname"] == alert]
            if mine:
                base = doc
                kept = {k: v for k, v in test.items() if k not in ("alert_rule_test", "promql_expr_test")}
                groups.append({**kept, "alert_rule_test": mine})
    return {**base, "tests": groups}


def _passing(promtool: str, kit: SimpleNamespace, files: list[Path]) -> set[Path]:
    """The promtool test files that pass, from one `promtool test rules` run over all of them."""
    out = kit.run_tool([promtool, "test", "rules", *map(str, files)], timeout=170)
    status: dict[Path, bool] = {}
    for block in re.split(r"^Unit Testing:\s+", out.stdout, flags=re.MULTILINE)[1:]:
        name, _, report = block.partition("\n")
        status[Path(name.strip())] = report.lstrip().startswith("SUCCESS")
    assert set(status) == set(files), out.stdout[-3000:] + out.stderr[-3000:]
    return {f for f, ok in status.items() if ok}


@pytest.mark.slow
def test_unit_tests_catch_every_mutated_alert(promtool: str, kit: SimpleNamespace, tmp_path: Path) -> None:
    test_files = sorted((kit.prom_dir / "tests").glob("*.yml"))
    mutants = _mutants(kit.alert_rules)
    assert len(mutants) >= 45
    original = kit.alert_rules.read_text(encoding="utf-8")
    alerts = list(dict.fromkeys(a["alert"] for a in _alerts(kit.alert_rules)))
    # The harness must pass every unmutated alert, or every mutant would be "caught" trivially.
    jobs = [(alert, "unmutated", original) for alert in alerts] + mutants

    def write(index: int, alert: str, text: str) -> Path:
        work = tmp_path / f"m{index}"
        work.mkdir()
        recording, alerting = _rules_for(alert, text, kit.recording_rules)
        (work / kit.recording_rules.name).write_text(yaml.safe_dump(recording, sort_keys=False), "utf-8")
        (work / kit.alert_rules.name).write_text(yaml.safe_dump(alerting, sort_keys=False), "utf-8")
        tests = _tests_for(alert, test_files)
        assert tests["tests"], f"no promtool unit test checks {alert}"
        tests["rule_files"] = [kit.recording_rules.name, kit.alert_rules.name]
        test_file = work / "only_test.yml"
        test_file.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
        return test_file

    files = [write(i, alert, text) for i, (alert, _, text) in enumerate(jobs)]
    # Two promtool processes (a 2-core machine), each testing half the files in one run.
    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = pool.map(lambda half: _passing(promtool, kit, half), (files[::2], files[1::2]))
        passing = set().union(*halves)
    results = [f in passing for f in files]
    failing_originals = [
        a for (a, label, _), ok in zip(jobs, results, strict=True) if label == "unmutated" and not ok
    ]
    assert not failing_originals, f"unmutated alerts fail in the mutation harness: {failing_originals}"
    survivors = [
        f"{alert}: {label}"
        for (alert, label, _), ok in zip(jobs, results, strict=True)
        if label != "unmutated" and ok
    ]
    assert not survivors, "mutations the promtool unit tests did not catch:\n" + "\n".join(survivors)
