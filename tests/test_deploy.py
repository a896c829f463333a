"""Deploy files that cannot run here (no Docker engine, no Kubernetes) are checked another honest way."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.tools import python_module

ROOT = Path(__file__).resolve().parents[1]


COMPOSE = ROOT / "docker-compose.yml"
STATEFUL = {
    "tokwatch": "/var/lib/tokwatch",
    "tokwatch-demo": "/var/lib/tokwatch",
    "timescaledb": "/var/lib/postgresql/data",
    "prometheus": "/prometheus",
    "alertmanager": "/alertmanager",
    "grafana": "/var/lib/grafana",
}


def _compose() -> dict[str, object]:
    return yaml.safe_load(COMPOSE.read_text())


DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# An exact release: MAJOR.MINOR.PATCH (a leading v allowed), then optional variant parts (-pg17, -bookworm).
EXACT_TAG = re.compile(r"^v?\d+\.\d+\.\d+(?:-[a-z0-9.]+)*$")
# Projects whose releases are single integers (each number is one release, e.g. http-https-echo 34).
INTEGER_RELEASES = {"mendhak/http-https-echo"}
# Variants that follow the newest distribution release: the tag must name the release (slim-bookworm).
FLOATING_VARIANTS = {"slim", "alpine"}


def _image_refs() -> list[tuple[str, str]]:
    """(where, image) for every image the stack pulls: compose services' `image` unless the service
    builds it itself (then the Dockerfile's base image counts), and every FROM of the Dockerfile."""
    refs: list[tuple[str, str]] = []
    services: dict[str, dict[str, object]] = _compose()["services"]  # type: ignore[assignment]
    for name, svc in services.items():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).resolve() == DOCKERFILE  # type: ignore[index]
            assert ":" in str(svc["image"]) and not str(svc["image"]).endswith(":latest"), name
            continue
        refs.append((f"docker-compose.yml: {name}", str(svc["image"])))
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            refs.append(("deploy/Dockerfile", next(w for w in words[1:] if not w.startswith("--"))))
    for manifest in sorted(KUBE.rglob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            pod = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                refs.append((str(manifest.relative_to(ROOT)), str(container["image"])))
    return refs


def _is_exact(image: str) -> bool:
    if "@sha256:" in image:
        return True  # a digest is exact whatever the tag says
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag:
        return False  # no tag at all: latest
    if repo in INTEGER_RELEASES:
        return tag.isdigit()
    variant = tag.split("-", 1)[1] if "-" in tag else ""
    return bool(EXACT_TAG.match(tag)) and variant not in FLOATING_VARIANTS


@pytest.mark.parametrize(
    ("image", "exact"),
    [
        ("python:3.11.10-slim-bookworm", True),
        ("python:3.11-slim", False),
        ("python:3.11.10-slim", False),
        ("python:3.11", False),
        ("prom/prometheus:v2.55.1", True),
        ("prom/prometheus:latest", False),
        ("prom/prometheus", False),
        ("timescale/timescaledb:2.17.2-pg17", True),
        ("timescale/timescaledb:latest-pg17", False),
        ("grafana/grafana:11", False),
        ("mendhak/http-https-echo:34", True),
        ("mendhak/http-https-echo:latest", False),
        ("localhost:5000/tokwatch", False),
        ("python@sha256:" + "0" * 64, True),
    ],
)
def test_exact_version_rule(image: str, exact: bool) -> None:
    assert _is_exact(image) is exact


def test_every_image_reference_carries_an_exact_version() -> None:
    """Compose images, the Dockerfile's base and the Kubernetes pods: a rebuild, `compose pull` or rollout
    gets the release it was tested with, never whatever a floating tag (latest, 3.11-slim, 11) points at."""
    refs = _image_refs()
    assert {
        "deploy/Dockerfile", "docker-compose.yml: prometheus", "deploy/kubernetes/statefulset.yaml"
    } <= {where for where, _ in refs}  # fmt: skip
    floating = [f"{where}: {image}" for where, image in refs if not _is_exact(image)]
    assert not floating, f"pin an exact version: {floating}"


def test_compose_file_follows_the_compose_spec() -> None:
    """Validated offline against the Compose Specification's JSON schema (tests/data/schemas)."""
    tool = python_module("check_jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema not installed (pip install -e '.[test]')")
    schema = ROOT / "tests" / "data" / "schemas" / "compose-spec.json"
    proc = subprocess.run(
        [*tool, "--schemafile", str(schema), str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_images_healthchecks_volumes_and_secrets() -> None:
    services: dict[str, dict[str, object]] = _compose()["services"]  # type: ignore[assignment]
    stack = {"tokwatch", "timescaledb", "prometheus", "alertmanager", "alert-sink", "grafana"}
    assert stack | {"sim", "tokwatch-demo"} <= set(services)
    for name, svc in services.items():
        check = svc.get("healthcheck") or {}
        assert check.get("test", [""])[0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"  # type: ignore[union-attr]
        for dep, cond in (svc.get("depends_on") or {}).items():  # type: ignore[union-attr]
            # the exporters wait for what they need to be healthy; the monitoring only for services to
            # have started, never for their health (tests/test_compose_stack.py)
            assert cond["condition"] in ("service_healthy", "service_started"), f"{name} -> {dep}"
            # a service of the default stack never waits for one that only a profile starts
            assert not services[dep].get("profiles") or svc.get("profiles"), f"{name} -> {dep}"
    assert services["alertmanager"]["depends_on"] == {"alert-sink": {"condition": "service_started"}}
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
    used = set(re.findall(r"\$\{(\w+)", text))
    assert {"TOKWATCH_PG_PASSWORD", "GRAFANA_ADMIN_PASSWORD"} <= used
    assert all(f"\n{var}=" in example for var in used), f"compose reads {used}: each in .env.example"
    assert "host.docker.internal:host-gateway" in services["tokwatch"]["extra_hosts"]  # type: ignore[operator]


def test_compose_demo_profile_adds_the_simulator_and_its_own_exporter() -> None:
    """`docker compose --profile demo up` fills the dashboards by itself: the sim, an exporter probing it
    (own SQLite volume, own port), scraped by Prometheus; without the profile nothing of it exists."""
    services: dict[str, dict[str, object]] = _compose()["services"]  # type: ignore[assignment]
    demo = {name for name, svc in services.items() if svc.get("profiles")}
    assert demo == {"sim", "tokwatch-demo"}
    assert all(services[name]["profiles"] == ["demo"] for name in demo)
    exporter, real = services["tokwatch-demo"], services["tokwatch"]
    assert exporter["command"][:3] == ["serve", "--config", "/etc/tokwatch/demo.yml"]  # type: ignore[index]
    assert "./deploy/compose/tokwatch-demo.yml:/etc/tokwatch/demo.yml:ro" in exporter["volumes"]  # type: ignore[operator]
    assert exporter["depends_on"] == {"sim": {"condition": "service_healthy"}}
    # the stack you deploy knows nothing of the demo: its own config only, no variable to switch it
    assert real["command"][:3] == ["serve", "--config", "/etc/tokwatch/tokwatch.yml"]  # type: ignore[index]
    assert not any("demo" in str(v) for v in real["volumes"])  # type: ignore[union-attr]
    assert "environment" not in exporter and "env_file" not in exporter  # no database password, no API keys
    ports = [str(p) for svc in services.values() for p in svc.get("ports", [])]  # type: ignore[union-attr]
    assert "127.0.0.1:9479:9477" in ports and len({p.rsplit(":", 1)[0] for p in ports}) == len(ports)


def test_compose_mounts_exist_and_are_the_tested_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokwatch.commands.demo import DEMO_SIM, demo_exporter_config
    from tokwatch.settings.config import load_config
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
    assert [(e.name, e.kind, e.base_url, e.model, e.timeout, dict(e.labels)) for e in demo.endpoints] == [
        (e.name, e.kind, e.base_url, e.model, e.timeout, dict(e.labels)) for e in expected.endpoints
    ]
    assert demo.schedule == expected.schedule and demo.probe == expected.probe
    # the demo keeps its runs in SQLite, with the demo's file names, on the tokwatch-demo volume
    state = STATEFUL["tokwatch-demo"]
    assert demo.storage.dsn is None and demo.storage.sqlite_path and demo.storage.outbox_path
    for mine, theirs in (
        (demo.storage.sqlite_path, expected.storage.sqlite_path),
        (demo.storage.outbox_path, expected.storage.outbox_path),
    ):
        assert Path(mine).parent == Path(state) and Path(mine).name == Path(str(theirs)).name
    names = {e.name for e in real.endpoints}
    assert not names & {e.name for e in demo.endpoints}  # no endpoint counted twice
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
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert set(jobs) == {"tokwatch", "tokwatch-demo"}
    assert jobs["tokwatch"]["static_configs"][0]["targets"] == ["tokwatch:9477"]
    # the demo exporter is found by DNS (A records of the compose service name, at its container port), so
    # the target exists only while the service does
    (sd,) = jobs["tokwatch-demo"]["dns_sd_configs"]
    assert "static_configs" not in jobs["tokwatch-demo"]
    assert sd["names"] == ["tokwatch-demo"] and sd["type"] == "A" and sd["port"] == 9477
    assert services["tokwatch-demo"]["ports"] == [f"127.0.0.1:9479:{sd['port']}"]
    assert demo.listen == f"0.0.0.0:{sd['port']}"


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


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_the_demo_exporter_never_trips_the_self_monitoring_alerts(tmp_path: Path) -> None:
    """promtool on the shipped rules with compose's job names: the demo's target down (or, as when its
    service is gone, absent) fires neither TokwatchDown nor TokwatchTargetMissing while the deployed
    exporter is up; with the deployed exporter down, TokwatchDown names it and only it."""
    prom = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    jobs = [j["job_name"] for j in prom["scrape_configs"]]
    (demo_job,) = [j for j in jobs if j != "tokwatch"]
    rules = ROOT / "prometheus" / "rules"
    real, demo = 'up{job="tokwatch",instance="tokwatch:9477"}', f'up{{job="{demo_job}",instance="d:9477"}}'
    self_alerts = ("TokwatchDown", "TokwatchTargetMissing")
    silent = [{"eval_time": "40m", "alertname": a, "exp_alerts": []} for a in self_alerts]
    tests = {
        "rule_files": [str(rules / "tokwatch-recording.yml"), str(rules / "tokwatch-alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            # the demo exporter down for 40 minutes, then its series gone: nothing fires
            {"interval": "1m", "input_series": [{"series": real, "values": "1x60"},
                                                {"series": demo, "values": "0x40 _x20"}],
             "alert_rule_test": [*silent, *({**t, "eval_time": "55m"} for t in silent)]},
            # the deployed exporter down, the demo up: TokwatchDown for tokwatch only
            {"interval": "1m", "input_series": [{"series": real, "values": "0x40"},
                                                {"series": demo, "values": "1x40"}],
             "alert_rule_test": [
                 {"eval_time": "10m", "alertname": "TokwatchDown", "exp_alerts": [{
                     "exp_labels": {"severity": "critical", "job": "tokwatch", "instance": "tokwatch:9477"},
                     "exp_annotations": {
                         "summary": "tokwatch tokwatch:9477 is down",
                         "description": "Prometheus cannot scrape tokwatch at tokwatch:9477: no endpoint is "
                         "being measured and every per-endpoint alert is blind.",
                         "runbook_url": "https://github.com/tokwatch/tokwatch/blob/main/docs/alerts.md#tokwatchdown",
                     }}]},
                 {"eval_time": "10m", "alertname": "TokwatchTargetMissing", "exp_alerts": []},
             ]},
        ],
    }  # fmt: skip
    path = tmp_path / "demo_job_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
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

    tool = python_module("kubernetes_validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed (pip install -e '.[test]')")
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    builtin = [
        str(KUBE / r)
        for r in kustomization["resources"]
        if r not in ("servicemonitor.yaml", "prometheusrule.yaml")
    ]
    sharded = yaml.safe_load((KUBE / "sharded" / "kustomization.yaml").read_text())["resources"]
    assert sharded == ["statefulset.yaml", "servicemonitor.yaml", "networkpolicy.yaml"]
    builtin += [str(KUBE / "sharded" / "statefulset.yaml"), str(KUBE / "sharded" / "networkpolicy.yaml")]
    proc = subprocess.run(
        [*tool, "--strict", *builtin], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dashboards = len(list((ROOT / "dashboards" / "json").glob("*.json")))
    # ConfigMap, StatefulSet, Service, the dashboards, NetworkPolicy; the sharded ConfigMap, Service,
    # StatefulSet and NetworkPolicy
    assert proc.stdout.count(" passed ") == 3 + dashboards + 1 + 4, proc.stdout
    schemas = ROOT / "tests" / "data" / "schemas"
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")):
        schema = json.loads((schemas / f"{plural}.monitoring.coreos.com-v1.json").read_text())
        (doc,) = [d for d in _kustomize_build() if d["kind"] == kind]
        jsonschema.Draft7Validator(schema).validate(doc)
        if kind == "ServiceMonitor":  # the sharded set's own
            (monitor,) = yaml.safe_load_all((KUBE / "sharded" / "servicemonitor.yaml").read_text())
            jsonschema.Draft7Validator(schema).validate(monitor)


def test_kubernetes_kustomizations_build() -> None:
    """`kubectl kustomize` (offline) builds both stacks into the resources the tests read from the files."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    for directory, expected in (
        (KUBE, {(str(d["kind"]), d["metadata"]["name"]) for d in _kustomize_build()}),  # type: ignore[index]
        (
            KUBE / "sharded",
            {("ConfigMap", "tokwatch-sharded"), ("Service", "tokwatch-sharded")}
            | {("StatefulSet", "tokwatch-sharded"), ("ServiceMonitor", "tokwatch-sharded")}
            | {("NetworkPolicy", "tokwatch-sharded")},
        ),
    ):
        proc = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(proc.stdout) if d}
        assert built == expected, directory


def test_kubernetes_stack_is_wired_and_hardened() -> None:
    from tokwatch.settings.config import load_config_text

    docs = _kustomize_build()
    by_kind: dict[str, list[dict[str, object]]] = {}
    for d in docs:
        by_kind.setdefault(str(d["kind"]), []).append(d)
    assert set(by_kind) == {
        "ConfigMap", "StatefulSet", "Service", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"
    }  # fmt: skip
    (config_map,) = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"] == "tokwatch"]  # type: ignore[index]
    cfg = load_config_text(config_map["data"]["tokwatch.yml"], "ConfigMap tokwatch")  # type: ignore[index]
    assert cfg.listen == "0.0.0.0:9477" and str(cfg.storage.sqlite_path).startswith("/var/lib/tokwatch/")
    # the example endpoint ships disabled, as compose's: an unedited install probes nothing, pages nobody
    assert cfg.endpoints and cfg.enabled_endpoints == ()
    sharded = next(
        d
        for d in yaml.safe_load_all((KUBE / "sharded" / "statefulset.yaml").read_text())
        if d["kind"] == "ConfigMap"
    )
    shard_cfg = load_config_text(sharded["data"]["tokwatch.yml"], "ConfigMap tokwatch-sharded")
    assert len(shard_cfg.endpoints) == 3 and shard_cfg.enabled_endpoints == ()
    # no offset set: sites take turns (tokwatch.settings.site_offset) once an operator adds `site:`
    assert (
        "offset" not in cfg.schedule.model_fields_set and "offset" not in shard_cfg.schedule.model_fields_set
    )
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
    assert container["readinessProbe"]["exec"]["command"] == ["tokwatch", "healthcheck", "--url", "/-/ready"]
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
    # the console script of the virtual environment docs/configuration.md installs into (PEP 668-safe)
    assert "ExecStart=/opt/tokwatch/bin/tokwatch serve --config /etc/tokwatch/tokwatch.yml" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert "python3 -m venv /opt/tokwatch" in doc and "/opt/tokwatch/bin/pip install" in doc
    assert "pip install tokwatch" not in doc  # not on PyPI


def test_systemd_unit_documentation_exists() -> None:
    """Documentation= points at this repository's docs: the file and the section exist."""
    unit = (ROOT / "deploy" / "systemd" / "tokwatch.service").read_text()
    urls = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("Documentation=")]
    assert urls
    for url in " ".join(urls).split():
        prefix = "https://github.com/tokwatch/tokwatch/blob/main/"
        assert url.startswith(prefix), url
        path, _, anchor = url[len(prefix):].partition("#")
        text = (ROOT / path).read_text()
        headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
        slugs = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in headings}
        assert not anchor or anchor in slugs, url


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the unit, its ExecStart pointed at a stand-in executable (the venv's
    console script does not exist on this machine: docs/configuration.md says how the install was tried)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    stand_in = tmp_path / "tokwatch"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    unit = (ROOT / "deploy" / "systemd" / "tokwatch.service").read_text()
    copy = tmp_path / "tokwatch.service"
    copy.write_text(unit.replace("/opt/tokwatch/bin/tokwatch", str(stand_in)))
    out = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    if "Failed to connect" in out.stderr or "System has not been booted" in out.stderr:
        pytest.skip(f"systemd-analyze verify cannot run here: {out.stderr.strip()[:200]}")
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_example_configs_validate() -> None:
    from tokwatch.settings.config import load_config

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


BENCH_JOB = KUBE / "bench-job.yaml"


def test_bench_job_validates_against_the_kubernetes_schemas() -> None:
    """The Indexed Job and its ConfigMap with kubernetes-validate --strict (built-in kinds only)."""
    tool = python_module("kubernetes_validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed (pip install -e '.[test]')")
    # backoffLimitPerIndex: beta (on by default) from Kubernetes 1.29, the oldest version docs/bench.md names
    for version in ("1.29.0", None):
        argv = [*tool, "--strict", *(["-k", version] if version else []), str(BENCH_JOB)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count(" passed ") == 2, proc.stdout


def test_bench_job_runs_one_schedule_over_its_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod is a valid `tokwatch bench` segment run as Kubernetes starts it (index from
    JOB_COMPLETION_INDEX, the run id from the Job's uid, the DSN from the Secret), N segments for N pods."""
    import argparse

    from tokwatch.bench.commands import add_commands, options_from_args
    from tokwatch.settings.config import load_config_text

    config_map, job = yaml.safe_load_all(BENCH_JOB.read_text())
    assert (config_map["kind"], job["kind"]) == ("ConfigMap", "Job")
    spec = job["spec"]
    n = spec["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == n
    assert spec["backoffLimitPerIndex"] == 0 and spec["maxFailedIndexes"] == n  # no retry, no fail-all
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sec = container["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True and sec["capabilities"] == {"drop": ["ALL"]}
    assert "cpu" not in container["resources"]["limits"]  # no CFS throttling of the client's stamps
    env = {e["name"]: e for e in container["env"]}
    assert env["TOKWATCH_DSN"]["valueFrom"] == {"secretKeyRef": {"name": "tokwatch-db", "key": "dsn"}}
    assert env["RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"
    )
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/tokwatch"]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    cfg_text = config_map["data"]["tokwatch.yml"]
    cfg = load_config_text(cfg_text, "ConfigMap tokwatch-bench")
    assert cfg.storage.enabled and cfg.storage.dsn is None  # the DSN only from the Secret
    (tmp_path / "tokwatch.yml").write_text(cfg_text)
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    uid = "0b8e2a1c-6f1d-4c1e-9d0a-3c5b7e9f1a2b"
    segments = []
    for k in range(n):  # as Kubernetes expands $(RUN_ID) and sets JOB_COMPLETION_INDEX in pod k
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(k))
        args = [
            a.replace("$(RUN_ID)", uid).replace("/etc/tokwatch/tokwatch.yml", str(tmp_path / "tokwatch.yml"))
            for a in container["args"]
        ]
        opts = options_from_args(parser.parse_args(args))
        assert opts.run_id == uid and opts.endpoint == "target" and cfg.endpoint("target") is not None
        assert opts.rate is not None and opts.start_at is None and not opts.server_metrics
        assert opts.output_dir is not None and opts.output_dir.startswith("/tmp/")
        segments.append(opts.segment)
    assert segments == [f"{k}/{n}" for k in range(n)]
