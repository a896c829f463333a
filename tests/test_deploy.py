"""Deploy files that cannot run here (no Docker engine, no Kubernetes) are checked another honest way."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


COMPOSE = ROOT / "docker-compose.yml"
STATEFUL = {
    "tokwatch": "/var/lib/tokwatch",
    "timescaledb": "/var/lib/postgresql/data",
    "prometheus": "/prometheus",
    "alertmanager": "/alertmanager",
    "grafana": "/var/lib/grafana",
}


def _compose() -> dict[str, object]:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_follows_the_compose_spec() -> None:
    """Validated offline against the Compose Specification's JSON schema (tests/data/schemas)."""
    tool = shutil.which("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema not installed (pip install -e '.[test]')")
    schema = ROOT / "tests" / "data" / "schemas" / "compose-spec.json"
    proc = subprocess.run(
        [tool, "--schemafile", str(schema), str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_images_healthchecks_volumes_and_secrets() -> None:
    services: dict[str, dict[str, object]] = _compose()["services"]  # type: ignore[assignment]
    assert {"tokwatch", "sim", "timescaledb", "prometheus", "alertmanager", "alert-sink", "grafana"} <= set(
        services
    )
    for name, svc in services.items():
        image = str(svc.get("image", ""))
        assert image and not image.endswith(":latest") and ":" in image, (
            f"{name}: pin the image tag ({image})"
        )
        if name != "alert-sink":
            assert "healthcheck" in svc, f"{name}: no healthcheck"
        for dep, cond in (svc.get("depends_on") or {}).items():  # type: ignore[union-attr]
            assert cond["condition"] in ("service_healthy", "service_started"), f"{name} -> {dep}"
            if "healthcheck" in services[dep]:
                assert cond["condition"] == "service_healthy", f"{name} waits for {dep} to be healthy"
    volumes = _compose()["volumes"]
    for name, path in STATEFUL.items():
        mounts = [str(v) for v in services[name]["volumes"]]  # type: ignore[union-attr]
        named = [m for m in mounts if not m.startswith(".") and m.endswith(":" + path)]
        assert named and named[0].split(":")[0] in volumes, f"{name}: {path} needs a named volume"
    # secrets come from .env (never committed), never from the compose file
    text = COMPOSE.read_text()
    assert "POSTGRES_PASSWORD: tokwatch" not in text and "TOKWATCH_PG_PASSWORD:?" in text
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    example = (ROOT / ".env.example").read_text()
    for var in ("TOKWATCH_PG_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "TOKWATCH_CONFIG"):
        assert f"{var}=" in example and "${" + var in text
    assert services["sim"]["profiles"] == ["demo"]
    assert "host.docker.internal:host-gateway" in services["tokwatch"]["extra_hosts"]  # type: ignore[operator]


def test_compose_mounts_exist_and_are_the_tested_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokwatch.config import load_config
    from tokwatch.demo import DEMO_SIM, demo_exporter_config
    from tokwatch.sim.config import load_sim_config

    services: dict[str, dict[str, object]] = _compose()["services"]  # type: ignore[assignment]
    assert (ROOT / services["tokwatch"]["build"]["dockerfile"]).is_file()  # type: ignore[index]
    for name, svc in services.items():
        for volume in svc.get("volumes", []):  # type: ignore[union-attr]
            host = str(volume).split(":")[0]
            if host.startswith("."):
                assert (ROOT / host).exists(), f"{name}: mounted path {host} is missing"
    compose_dir = ROOT / "deploy" / "compose"
    # the tokwatch configs the service can run, with the variables compose provides
    monkeypatch.setenv("TOKWATCH_DSN", "postgresql://tokwatch@timescaledb:5432/tokwatch")
    real = load_config(compose_dir / "tokwatch.yml")
    assert all("127.0.0.1" not in e.base_url and "localhost" not in e.base_url for e in real.endpoints)
    demo = load_config(compose_dir / "tokwatch-demo.yml")
    expected = demo_exporter_config("http://sim:8900", "0.0.0.0:9477", tmp_path)
    assert [(e.name, e.kind, e.base_url, e.model) for e in demo.endpoints] == [
        (e.name, e.kind, e.base_url, e.model) for e in expected.endpoints
    ]
    assert demo.schedule.interval == expected.schedule.interval
    # the sim the demo profile starts is the demo's own simulated fleet
    sim = load_sim_config(compose_dir / "sim.yml")
    assert sim.listen == "0.0.0.0:8900"
    assert (compose_dir / "sim.yml").read_text().endswith(DEMO_SIM.lstrip("\n"))
    # Alertmanager: the tested example, with receivers inside compose
    shipped = (ROOT / "prometheus" / "alertmanager.yml").read_text()
    mounted = (compose_dir / "alertmanager.yml").read_text()
    body = mounted.split("\nglobal:", 1)[1]
    assert body == shipped.split("\nglobal:", 1)[1].replace(
        "http://127.0.0.1:5001/", "http://alert-sink:8080/"
    )
    assert "127.0.0.1" not in body
    prom = yaml.safe_load((compose_dir / "prometheus.yml").read_text())
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == ["tokwatch:9477"]


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool not installed")
def test_compose_alertmanager_config_is_valid() -> None:
    proc = subprocess.run(
        ["amtool", "check-config", str(ROOT / "deploy" / "compose" / "alertmanager.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_compose_prometheus_config_is_valid(tmp_path: Path) -> None:
    shutil.copy(ROOT / "deploy" / "compose" / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(ROOT / "prometheus" / "rules", tmp_path / "rules")
    proc = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


KUBE = ROOT / "deploy" / "kubernetes"


def _kustomize_build() -> list[dict[str, object]]:
    """The resources `kubectl apply -k deploy/kubernetes/` applies (no kustomize binary here: read them)."""
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    docs: list[dict[str, object]] = []
    for resource in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((KUBE / resource).read_text()) if d)
    return docs


def test_kubernetes_resources_validate_against_their_schemas() -> None:
    """Built-in kinds with kubernetes-validate; the Prometheus Operator CRDs with their vendored schemas."""
    import json

    import jsonschema

    tool = shutil.which("kubernetes-validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed (pip install -e '.[test]')")
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    builtin = [
        str(KUBE / r)
        for r in kustomization["resources"]
        if r not in ("servicemonitor.yaml", "prometheusrule.yaml")
    ]
    builtin.append(str(KUBE / "sharded" / "statefulset.yaml"))
    proc = subprocess.run(
        [tool, "--strict", *builtin], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dashboards = len(list((ROOT / "dashboards" / "json").glob("*.json")))
    # ConfigMap, StatefulSet, Service, the dashboards; the sharded ConfigMap, Service, StatefulSet
    assert proc.stdout.count(" passed ") == 3 + dashboards + 3, proc.stdout
    schemas = ROOT / "tests" / "data" / "schemas"
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")):
        schema = json.loads((schemas / f"{plural}.monitoring.coreos.com-v1.json").read_text())
        (doc,) = [d for d in _kustomize_build() if d["kind"] == kind]
        jsonschema.Draft7Validator(schema).validate(doc)


def test_kubernetes_stack_is_wired_and_hardened() -> None:
    from tokwatch.config import load_config_text

    docs = _kustomize_build()
    by_kind: dict[str, list[dict[str, object]]] = {}
    for d in docs:
        by_kind.setdefault(str(d["kind"]), []).append(d)
    assert set(by_kind) == {"ConfigMap", "StatefulSet", "Service", "ServiceMonitor", "PrometheusRule"}
    (config_map,) = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"] == "tokwatch"]  # type: ignore[index]
    cfg = load_config_text(config_map["data"]["tokwatch.yml"], "ConfigMap tokwatch")  # type: ignore[index]
    assert cfg.listen == "0.0.0.0:9477" and str(cfg.storage.sqlite_path).startswith("/var/lib/tokwatch/")
    (sts,) = by_kind["StatefulSet"]
    spec = sts["spec"]  # type: ignore[index]
    pod = spec["template"]["spec"]  # type: ignore[index]
    (container,) = pod["containers"]
    # history survives restarts: the state directory is a PersistentVolumeClaim, not an emptyDir
    assert [c["metadata"]["name"] for c in spec["volumeClaimTemplates"]] == ["state"]  # type: ignore[index]
    assert {"name": "state", "mountPath": "/var/lib/tokwatch"} in container["volumeMounts"]
    assert all("emptyDir" not in v or v["name"] == "tmp" for v in pod["volumes"])
    sec = container["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"] == {"drop": ["ALL"]} and sec["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    # the scrape job is named `tokwatch` (the Service's name), as the self-monitoring alerts expect
    (service,) = by_kind["Service"]
    (monitor,) = by_kind["ServiceMonitor"]
    assert service["metadata"]["name"] == "tokwatch" and "jobLabel" not in monitor["spec"]  # type: ignore[index,operator]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()  # type: ignore[index]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]  # type: ignore[index]
    alerts = (ROOT / "prometheus" / "rules" / "tokwatch-alerts.yml").read_text()
    assert 'job="tokwatch"' in alerts
    dashboards = [c for c in by_kind["ConfigMap"] if c["metadata"]["labels"].get("grafana_dashboard") == "1"]  # type: ignore[index,union-attr]
    assert len(dashboards) == len(list((ROOT / "dashboards" / "json").glob("*.json")))


def test_kubernetes_generated_manifests_match_the_tested_rules_and_dashboards(tmp_path: Path) -> None:
    """prometheusrule.yaml holds exactly prometheus/rules/*.yml (promtool-checked again from it), and
    grafana-dashboards.yaml exactly dashboards/json/*.json."""
    import json

    proc = subprocess.run(
        [sys.executable, str(KUBE / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    docs = _kustomize_build()
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    groups = [
        g
        for p in sorted((ROOT / "prometheus" / "rules").glob("*.yml"))
        for g in yaml.safe_load(p.read_text())["groups"]
    ]
    assert rule["spec"]["groups"] == groups  # type: ignore[index]
    if shutil.which("promtool"):
        extracted = tmp_path / "rules.yml"
        extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))  # type: ignore[index]
        check = subprocess.run(
            ["promtool", "check", "rules", str(extracted)], capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr
    for cm in (
        d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ):  # type: ignore[index,operator]
        ((name, text),) = cm["data"].items()  # type: ignore[union-attr]
        assert json.loads(text) == json.loads((ROOT / "dashboards" / "json" / name).read_text())


def test_systemd_unit_runs_serve_and_reloads_with_sighup() -> None:
    unit = (ROOT / "deploy" / "systemd" / "tokwatch.service").read_text()
    assert "ExecStart=/usr/local/bin/tokwatch serve --config /etc/tokwatch/tokwatch.yml" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit


def test_example_configs_validate() -> None:
    from tokwatch.config import load_config

    cfg = load_config(ROOT / "examples" / "tokwatch.yml")
    assert {e.kind for e in cfg.endpoints} == {"vllm", "ollama", "llamacpp", "openai"}


def test_systemd_unit_is_hardened() -> None:
    """`systemd-analyze security` rates the unit's exposure at most 3.0 (it rated 8.5 before hardening)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit = ROOT / "deploy" / "systemd" / "tokwatch.service"
    out = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
    if match is None:
        pytest.skip(f"systemd-analyze cannot analyze units offline here: {out.stderr.strip()[:200]}")
    assert float(match.group(1)) <= 3.0, out.stdout
    text = unit.read_text()
    assert "StateDirectory=tokwatch" in text and "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" in text
